//! Gauss–Hermite quadrature for expectations under a univariate Gaussian.
//!
//! Rules are for the *probabilists'* weight, so `Σ_k w_k g(x_k) ≈ E[g(x)]`
//! for `x ~ N(0, 1)` and the weights sum to one. Nodes are computed at runtime
//! (Golub–Welsch eigenvalues, polished by Newton on the orthonormal Hermite
//! recurrence; weights from the Christoffel numbers) and cached per size.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use nalgebra::DMatrix;

/// Node count used by the free functions of this module. An `n`-node rule is
/// exact for polynomials of degree `2n − 1`.
pub const DEFAULT_NODES: usize = 32;

/// Variance below which [`GaussHermite::expect_and_grads`] switches to
/// Price's `½ E h''` for `∂E/∂v`.
pub const PRICE_BELOW_VAR: f64 = 1e-6;

/// Largest supported rule; beyond this the orthonormal recurrence can overflow.
pub const MAX_NODES: usize = 256;

/// An `n`-node Gauss–Hermite rule for the standard normal.
#[derive(Debug, Clone, PartialEq)]
pub struct GaussHermite {
    nodes: Vec<f64>,
    weights: Vec<f64>,
}

impl GaussHermite {
    /// Computes the rule from scratch; prefer the cached [`rule`].
    ///
    /// # Panics
    /// If `n` is 0 or larger than [`MAX_NODES`].
    pub fn new(n: usize) -> Self {
        assert!(
            (1..=MAX_NODES).contains(&n),
            "Gauss–Hermite rule needs 1..={MAX_NODES} nodes, got {n}"
        );
        let mut nodes = golub_welsch_nodes(n);
        let mut weights = vec![0.0; n];
        for (x, w) in nodes.iter_mut().zip(&mut weights) {
            *x = newton_polish(n, *x);
            *w = christoffel_weight(n, *x);
        }
        symmetrise(&mut nodes, &mut weights);
        let total: f64 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= total);
        Self { nodes, weights }
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Standard-normal nodes, ascending.
    pub fn nodes(&self) -> &[f64] {
        &self.nodes
    }

    /// Weights, summing to one.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// `E_{N(f; mean, var)}[h(f)]`.
    pub fn expect(&self, mean: f64, var: f64, mut h: impl FnMut(f64) -> f64) -> f64 {
        let sd = var.max(0.0).sqrt();
        self.nodes
            .iter()
            .zip(&self.weights)
            .map(|(x, w)| w * h(mean + sd * x))
            .sum()
    }

    /// Several expectations sharing one evaluation per node, e.g.
    /// `h(f) = [g(f), g'(f), g''(f)]` gives `[E g, E g', E g'']`.
    pub fn expect_many<const K: usize>(&self, mean: f64, var: f64, mut h: impl FnMut(f64) -> [f64; K]) -> [f64; K] {
        let sd = var.max(0.0).sqrt();
        let mut acc = [0.0; K];
        for (x, w) in self.nodes.iter().zip(&self.weights) {
            for (a, v) in acc.iter_mut().zip(h(mean + sd * x)) {
                *a += w * v;
            }
        }
        acc
    }

    /// `[E, ∂E/∂μ, ∂E/∂v]` for `E(μ, v) = E_{N(f; μ, v)}[h(f)]` and
    /// `h3(f) = [h, h', h'']`, plus plain expectations of `K` extra values.
    ///
    /// `∂E/∂v` is the exact derivative of this rule's estimate of `E`,
    /// `Σ w h'(μ + σx) x / 2σ` (Stein's identity), rather than Price's
    /// `½ Σ w h''`: both equal `½ E h''` for the true integral, but the former
    /// is consistent with the returned value and far more accurate when `h''`
    /// is sharper than `σ` (Student-t with a small scale, probit with large
    /// `v`). Below [`PRICE_BELOW_VAR`], where dividing by `σ` would cancel,
    /// Price's form is used; there the two agree to rounding.
    pub fn expect_and_grads<const K: usize>(
        &self,
        mean: f64,
        var: f64,
        mut h: impl FnMut(f64) -> ([f64; 3], [f64; K]),
    ) -> ([f64; 3], [f64; K]) {
        let var = var.max(0.0);
        let sd = var.sqrt();
        let price = var < PRICE_BELOW_VAR;
        let (mut value, mut d_mean, mut d_var) = (0.0, 0.0, 0.0);
        let mut extra = [0.0; K];
        for (x, w) in self.nodes.iter().zip(&self.weights) {
            let ([h0, h1, h2], more) = h(mean + sd * x);
            value += w * h0;
            d_mean += w * h1;
            d_var += w * if price { h2 } else { h1 * x };
            for (a, v) in extra.iter_mut().zip(more) {
                *a += w * v;
            }
        }
        d_var *= if price { 0.5 } else { 0.5 / sd };
        ([value, d_mean, d_var], extra)
    }

    /// `log E_{N(f; mean, var)}[exp(log_h(f))]`, computed without leaving log
    /// space (an online log-sum-exp), so tiny densities do not underflow.
    pub fn log_expect_exp(&self, mean: f64, var: f64, mut log_h: impl FnMut(f64) -> f64) -> f64 {
        let sd = var.max(0.0).sqrt();
        let mut acc = LogSumExp::default();
        for (x, w) in self.nodes.iter().zip(&self.weights) {
            acc.add(w.ln() + log_h(mean + sd * x));
        }
        acc.value()
    }
}

/// Running `log Σ exp(a_i)`, rescaling whenever a new maximum arrives.
#[derive(Debug, Clone, Copy)]
pub struct LogSumExp {
    max: f64,
    sum: f64,
}

impl Default for LogSumExp {
    fn default() -> Self {
        Self {
            max: f64::NEG_INFINITY,
            sum: 0.0,
        }
    }
}

impl LogSumExp {
    /// Adds the term `exp(a)` to the sum.
    pub fn add(&mut self, a: f64) {
        if a.is_nan() {
            self.max = f64::NAN;
        } else if a > self.max {
            self.sum = self.sum * (self.max - a).exp() + 1.0;
            self.max = a;
        } else if a > f64::NEG_INFINITY {
            self.sum += (a - self.max).exp();
        }
    }

    /// The log of the sum so far (`-inf` when empty or all terms are zero).
    pub fn value(&self) -> f64 {
        if self.sum == 0.0 {
            f64::NEG_INFINITY
        } else {
            self.max + self.sum.ln()
        }
    }
}

/// The cached `n`-node rule (computed once per `n` per process).
pub fn rule(n: usize) -> &'static GaussHermite {
    static DEFAULT: OnceLock<GaussHermite> = OnceLock::new();
    static OTHERS: OnceLock<Mutex<HashMap<usize, &'static GaussHermite>>> = OnceLock::new();
    if n == DEFAULT_NODES {
        return DEFAULT.get_or_init(|| GaussHermite::new(DEFAULT_NODES));
    }
    let mut map = OTHERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Leaked on purpose: at most one small rule per distinct `n`, kept for the process.
    map.entry(n)
        .or_insert_with(|| Box::leak(Box::new(GaussHermite::new(n))))
}

/// `E_{N(f; mean, var)}[h(f)]` with the default rule.
pub fn expect(mean: f64, var: f64, h: impl FnMut(f64) -> f64) -> f64 {
    rule(DEFAULT_NODES).expect(mean, var, h)
}

/// [`GaussHermite::expect_many`] with the default rule.
pub fn expect_many<const K: usize>(mean: f64, var: f64, h: impl FnMut(f64) -> [f64; K]) -> [f64; K] {
    rule(DEFAULT_NODES).expect_many(mean, var, h)
}

/// `(E h, E h', E h'')` for `h` returning `(h(f), h'(f), h''(f))`, with the default rule.
pub fn expect_with_derivatives(mean: f64, var: f64, mut h: impl FnMut(f64) -> (f64, f64, f64)) -> (f64, f64, f64) {
    let [e0, e1, e2] = expect_many(mean, var, |f| {
        let (a, b, c) = h(f);
        [a, b, c]
    });
    (e0, e1, e2)
}

/// [`GaussHermite::expect_and_grads`] with the default rule and no extras.
pub fn expect_and_grads(mean: f64, var: f64, mut h3: impl FnMut(f64) -> [f64; 3]) -> [f64; 3] {
    rule(DEFAULT_NODES).expect_and_grads(mean, var, |f| (h3(f), [0.0; 0])).0
}

/// [`GaussHermite::log_expect_exp`] with the default rule.
pub fn log_expect_exp(mean: f64, var: f64, log_h: impl FnMut(f64) -> f64) -> f64 {
    rule(DEFAULT_NODES).log_expect_exp(mean, var, log_h)
}

/// Eigenvalues of the Jacobi matrix of the probabilists' Hermite polynomials
/// (zero diagonal, off-diagonal `√k`), ascending.
fn golub_welsch_nodes(n: usize) -> Vec<f64> {
    let jacobi = DMatrix::from_fn(n, n, |i, j| {
        if i + 1 == j || j + 1 == i {
            (i.max(j) as f64).sqrt()
        } else {
            0.0
        }
    });
    let mut nodes: Vec<f64> = jacobi.symmetric_eigenvalues().iter().copied().collect();
    nodes.sort_by(f64::total_cmp);
    nodes
}

/// Orthonormal probabilists' Hermite values `(p_n(x), p_{n-1}(x), Σ_{j<n} p_j(x)²)`.
fn orthonormal_hermite(n: usize, x: f64) -> (f64, f64, f64) {
    let (mut prev, mut cur) = (0.0, 1.0);
    let mut sum_sq = 0.0;
    for j in 0..n {
        sum_sq += cur * cur;
        let next = (x * cur - (j as f64).sqrt() * prev) / ((j + 1) as f64).sqrt();
        prev = cur;
        cur = next;
    }
    (cur, prev, sum_sq)
}

/// Newton on `p_n`, using `p_n' = √n p_{n-1}`; the eigen-solver start is
/// already close, so a few steps reach machine precision.
fn newton_polish(n: usize, mut x: f64) -> f64 {
    for _ in 0..4 {
        let (pn, pn1, _) = orthonormal_hermite(n, x);
        let deriv = (n as f64).sqrt() * pn1;
        if deriv == 0.0 {
            break;
        }
        let step = pn / deriv;
        x -= step;
        if step.abs() <= 1e-16 * x.abs().max(1.0) {
            break;
        }
    }
    x
}

/// Gauss weight at a node: `1 / Σ_{j<n} p_j(x)²` for orthonormal `p_j`.
fn christoffel_weight(n: usize, x: f64) -> f64 {
    1.0 / orthonormal_hermite(n, x).2
}

/// Makes the rule exactly symmetric, so odd moments about the mean vanish.
fn symmetrise(nodes: &mut [f64], weights: &mut [f64]) {
    let n = nodes.len();
    for i in 0..n / 2 {
        let j = n - 1 - i;
        let x = 0.5 * (nodes[j] - nodes[i]);
        let w = 0.5 * (weights[i] + weights[j]);
        (nodes[i], nodes[j]) = (-x, x);
        (weights[i], weights[j]) = (w, w);
    }
    if n % 2 == 1 {
        nodes[n / 2] = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-300)
    }

    #[test]
    fn weights_sum_to_one_and_nodes_are_symmetric() {
        for n in [1, 2, 5, 20, 32, 64] {
            let r = rule(n);
            assert_eq!(r.len(), n);
            let total: f64 = r.weights().iter().sum();
            assert!((total - 1.0).abs() < 1e-14, "n={n}: Σw = {total}");
            for i in 0..n {
                assert_eq!(r.nodes()[i], -r.nodes()[n - 1 - i]);
                assert!(r.weights()[i] > 0.0);
            }
        }
    }

    #[test]
    fn known_small_rules() {
        // Two nodes at ±1, three at 0, ±√3 with weights 2/3, 1/6.
        let r2 = GaussHermite::new(2);
        assert!((r2.nodes()[1] - 1.0).abs() < 1e-15);
        let r3 = GaussHermite::new(3);
        assert!((r3.nodes()[2] - 3f64.sqrt()).abs() < 1e-15);
        assert!((r3.weights()[1] - 2.0 / 3.0).abs() < 1e-15);
        assert!((r3.weights()[0] - 1.0 / 6.0).abs() < 1e-15);
    }

    #[test]
    fn integrates_polynomials_exactly() {
        for &(m, v) in &[(0.0, 1.0), (0.7, 0.3), (-2.5, 4.0), (3.0, 1e-6)] {
            let e2 = expect(m, v, |f| f * f);
            assert!(close(e2, m * m + v, 1e-13), "E f² at ({m}, {v}): {e2}");
            let e4 = expect(m, v, |f| f.powi(4));
            let want = m.powi(4) + 6.0 * m * m * v + 3.0 * v * v;
            assert!(close(e4, want, 1e-13), "E f⁴ at ({m}, {v}): {e4} vs {want}");
            let e3 = expect(m, v, |f| f.powi(3));
            assert!((e3 - (m.powi(3) + 3.0 * m * v)).abs() < 1e-12 * (1.0 + e3.abs()));
        }
        // Degree 2n − 1 = 63 is still exact: E x^62 = 61!! for the standard normal.
        let double_factorial: f64 = (1..=61).step_by(2).map(|k| k as f64).product();
        assert!(close(expect(0.0, 1.0, |f| f.powi(62)), double_factorial, 1e-10));
    }

    #[test]
    fn matches_closed_forms() {
        // E exp(f) = exp(μ + v/2); E cos(f) = cos(μ) exp(−v/2).
        for &(m, v) in &[(0.3, 0.5), (-1.0, 2.0), (2.0, 0.01)] {
            assert!(close(expect(m, v, f64::exp), (m + v / 2.0).exp(), 1e-12));
            assert!(close(expect(m, v, f64::cos), m.cos() * (-v / 2.0).exp(), 1e-10));
        }
    }

    #[test]
    fn expect_many_and_derivatives_agree_with_expect() {
        let (m, v) = (0.4, 1.7);
        let [a, b] = expect_many(m, v, |f| [f.sin(), f * f]);
        assert_eq!(a, expect(m, v, f64::sin));
        assert!(close(b, m * m + v, 1e-13));
        let (e0, e1, e2) = expect_with_derivatives(m, v, |f| (f.exp(), f.exp(), f.exp()));
        let want = (m + v / 2.0).exp();
        for e in [e0, e1, e2] {
            assert!(close(e, want, 1e-12));
        }
    }

    #[test]
    fn expect_and_grads_are_exact_derivatives_of_the_estimate() {
        // A sharp integrand, where the rule is far from exact, so only true
        // consistency with the returned value passes.
        let h3 = |f: f64| {
            let d = 0.01 + f * f;
            [-(d.ln()), -2.0 * f / d, (2.0 * f * f - 0.02) / (d * d)]
        };
        let value = |m: f64, v: f64| expect(m, v, |f| h3(f)[0]);
        for &(m, v) in &[(0.3, 4.0), (-1.0, 0.5), (2.0, 1e-3)] {
            let [e, dm, dv] = expect_and_grads(m, v, h3);
            assert_eq!(e, value(m, v));
            let h = 1e-4;
            let fd_m = (value(m + h, v) - value(m - h, v)) / (2.0 * h);
            let fd_v = (value(m, v * (1.0 + h)) - value(m, v * (1.0 - h))) / (2.0 * h * v);
            assert!(close(dm, fd_m, 1e-6), "∂μ at ({m}, {v}): {dm} vs {fd_m}");
            assert!(close(dv, fd_v, 1e-6), "∂v at ({m}, {v}): {dv} vs {fd_v}");
        }
    }

    #[test]
    fn expect_and_grads_price_branch_matches_closed_form() {
        // E exp(f) = exp(μ + v/2): ∂μ = E, ∂v = E/2, on both sides of the switch.
        for v in [0.5 * PRICE_BELOW_VAR, 2.0 * PRICE_BELOW_VAR, 0.3] {
            let [e, dm, dv] = expect_and_grads(0.4, v, |f| [f.exp(); 3]);
            let want = (0.4 + v / 2.0).exp();
            assert!(close(e, want, 1e-14) && close(dm, want, 1e-14));
            assert!(close(dv, want / 2.0, 1e-9), "v={v}: {dv}");
        }
        let (_, [extra]) = rule(DEFAULT_NODES).expect_and_grads(1.0, 2.0, |f| ([0.0; 3], [f * f]));
        assert!(close(extra, 3.0, 1e-14));
    }

    #[test]
    fn zero_variance_is_a_point_evaluation() {
        assert!(close(expect(1.3, 0.0, f64::exp), 1.3f64.exp(), 1e-14));
    }

    #[test]
    fn log_expect_exp_survives_underflow() {
        // log E[exp(−1000 + f)] = −1000 + μ + v/2, although exp(−1000) underflows.
        let got = log_expect_exp(0.5, 0.8, |f| -1000.0 + f);
        assert!(close(got, -1000.0 + 0.5 + 0.4, 1e-13), "{got}");
        assert_eq!(log_expect_exp(0.0, 1.0, |_| f64::NEG_INFINITY), f64::NEG_INFINITY);
    }

    #[test]
    fn log_sum_exp_accumulator() {
        let mut acc = LogSumExp::default();
        assert_eq!(acc.value(), f64::NEG_INFINITY);
        for a in [1.0, 3.0, 2.0] {
            acc.add(a);
        }
        let want = (1f64.exp() + 3f64.exp() + 2f64.exp()).ln();
        assert!(close(acc.value(), want, 1e-15));
    }
}
