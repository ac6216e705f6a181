//! The softmax likelihood over C latent functions, by a fixed, seeded set of antithetic Monte Carlo draws.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use super::Expectation;
use crate::model::math::exp::exp_nonpositive_in_place;
use crate::model::math::quadrature::LogSumExp;

/// The softmax likelihood bound to its cached standard-normal sample.
pub(super) struct Softmax {
    classes: usize,
    /// `ε` class by class: `eps[k · S + s]` for sample `s < S`; each is used
    /// as `+ε` and `−ε`.
    eps: Arc<[f64]>,
}

/// Floor on `v_c` inside `√v_c` so the reparameterised derivative stays finite.
pub(super) const SOFTMAX_VAR_FLOOR: f64 = 1e-12;

/// One point's `2S` draws, class by class so that every loop runs along the
/// draws (vectorised, whatever the number of classes): draw `s < S` is
/// `f = μ + √v ∘ ε_s`, draw `S + s` its antithetic `μ − √v ∘ ε_s`.
struct Draws<'a> {
    /// Draws per class, `2S`.
    n: usize,
    /// `f[k · 2S + s]`.
    f: &'a [f64],
    /// `softmax(f)_k` of draw `s` at `p[k · 2S + s]`.
    p: &'a [f64],
    /// `log Σ_k exp f_k` per draw.
    log_norm: &'a [f64],
}

impl Draws<'_> {
    /// Class `k`'s latent over the draws.
    fn f(&self, k: usize) -> &[f64] {
        &self.f[k * self.n..(k + 1) * self.n]
    }

    /// Class `k`'s probability over the draws.
    fn p(&self, k: usize) -> &[f64] {
        &self.p[k * self.n..(k + 1) * self.n]
    }
}

impl Softmax {
    pub(super) fn new(classes: usize, samples: usize, seed: u64) -> Self {
        Self {
            classes,
            eps: softmax_eps(classes, samples.max(1), seed),
        }
    }

    fn label(&self, y: f64) -> usize {
        debug_assert!(
            y >= 0.0 && (y as usize) < self.classes,
            "class {y} not in 0..{}",
            self.classes
        );
        y as usize
    }

    fn n_draws(&self) -> usize {
        2 * self.eps.len() / self.classes
    }

    /// Calls `visit` with the point's draws, made in per-thread scratch so the
    /// E-step loop does not allocate.
    fn with_draws<T>(&self, mean: &[f64], var: &[f64], visit: impl FnOnce(&Draws) -> T) -> T {
        thread_local! {
            static SCRATCH: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
        }
        let (c, n) = (self.classes, self.n_draws());
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.resize(2 * c * n + 2 * n, 0.0);
            let (f, rest) = scratch.split_at_mut(c * n);
            let (p, rest) = rest.split_at_mut(c * n);
            let (max, log_norm) = rest.split_at_mut(n);
            make_draws(&self.eps, mean, var, (f, p, max, log_norm));
            visit(&Draws { n, f, p, log_norm })
        })
    }

    /// Exact derivatives of the fixed-sample estimate
    /// `E = mean_s log softmax(μ + √v ∘ ε_s)_y`.
    pub(super) fn expectation(&self, mean: &[f64], var: &[f64], y: f64, out: &mut Expectation) {
        let label = self.label(y);
        self.with_draws(mean, var, |d| {
            let n = d.n as f64;
            out.value = d.f(label).iter().zip(d.log_norm).map(|(f, l)| f - l).sum::<f64>() / n;
            for (k, eps) in self.eps.chunks_exact(d.n / 2).enumerate() {
                // ∂E/∂μ_k = [k = y] − mean p_k; β_k = mean p_k(1 − p_k), the
                // expected −∂²/∂f_k² log softmax(f)_y; ∂E/∂v_k = −Σ ±ε p_k / (2S · 2√v_k)
                // (the label's Σ ±ε is 0 over the antithetic pairs).
                let [p, pq, signed] = class_sums(eps, d.p(k));
                out.d_mean[k] = f64::from(u8::from(k == label)) - p / n;
                out.beta[k] = pq / n;
                out.d_var[k] = -signed / (n * 2.0 * var[k].max(SOFTMAX_VAR_FLOOR).sqrt());
            }
        });
    }

    pub(super) fn log_predictive(&self, mean: &[f64], var: &[f64], y: f64) -> f64 {
        let label = self.label(y);
        self.with_draws(mean, var, |d| {
            let mut acc = LogSumExp::default();
            d.f(label).iter().zip(d.log_norm).for_each(|(f, l)| acc.add(f - l));
            acc.value() - (d.n as f64).ln()
        })
    }

    pub(super) fn predict(&self, mean: &[f64], var: &[f64]) -> Vec<f64> {
        self.with_draws(mean, var, |d| {
            (0..self.classes)
                .map(|k| d.p(k).iter().sum::<f64>() / d.n as f64)
                .collect()
        })
    }
}

/// `[Σ p, Σ p(1 − p), Σ ±ε p]` over one class's draws `p` (the first half
/// drawn with `+ε`, the second with `−ε`), in four fixed lanes so that the
/// sums vectorise and do not depend on the CPU.
fn class_sums(eps: &[f64], p: &[f64]) -> [f64; 3] {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { class_sums_avx2(eps, p) };
    }
    class_sums_portable(eps, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn class_sums_avx2(eps: &[f64], p: &[f64]) -> [f64; 3] {
    class_sums_portable(eps, p)
}

#[inline(always)]
fn class_sums_portable(eps: &[f64], p: &[f64]) -> [f64; 3] {
    const LANES: usize = 4;
    let (plus, minus) = p.split_at(eps.len());
    let mut sums = [[0.0; LANES]; 3];
    let mut add = |lane: usize, e: f64, p: f64, q: f64| {
        sums[0][lane] += p + q;
        sums[1][lane] += p * (1.0 - p) + q * (1.0 - q);
        sums[2][lane] += e * (p - q);
    };
    let whole = eps.len() / LANES * LANES;
    for i in (0..whole).step_by(LANES) {
        for lane in 0..LANES {
            add(lane, eps[i + lane], plus[i + lane], minus[i + lane]);
        }
    }
    for i in whole..eps.len() {
        add(0, eps[i], plus[i], minus[i]);
    }
    sums.map(|lanes| lanes.iter().sum())
}

/// Where [`make_draws`] writes: `f`, `p`, `max` (scratch) and `log_norm`, as in [`Draws`].
type DrawsOut<'a> = (&'a mut [f64], &'a mut [f64], &'a mut [f64], &'a mut [f64]);

/// Fills `f`, `p = softmax(f)` and `log Σ exp f` for every draw (`max` is
/// scratch), compiled for four lanes where the CPU has them.
fn make_draws(eps: &[f64], mean: &[f64], var: &[f64], out: DrawsOut<'_>) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { make_draws_avx2(eps, mean, var, out) };
        return;
    }
    make_draws_portable(eps, mean, var, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn make_draws_avx2(eps: &[f64], mean: &[f64], var: &[f64], out: DrawsOut<'_>) {
    make_draws_portable(eps, mean, var, out);
}

#[inline(always)]
fn make_draws_portable(eps: &[f64], mean: &[f64], var: &[f64], (f, p, max, log_norm): DrawsOut) {
    let n = max.len();
    let half = n / 2;
    for (k, (f, eps)) in f.chunks_exact_mut(n).zip(eps.chunks_exact(half)).enumerate() {
        let sd = var[k].max(SOFTMAX_VAR_FLOOR).sqrt();
        let (plus, minus) = f.split_at_mut(half);
        for ((plus, minus), e) in plus.iter_mut().zip(minus.iter_mut()).zip(eps) {
            *plus = mean[k] + sd * e;
            *minus = mean[k] - sd * e;
        }
    }
    max.fill(f64::NEG_INFINITY);
    for f in f.chunks_exact(n) {
        max.iter_mut().zip(f).for_each(|(m, f)| *m = m.max(*f));
    }
    for (p, f) in p.chunks_exact_mut(n).zip(f.chunks_exact(n)) {
        p.iter_mut().zip(f).zip(max.iter()).for_each(|((p, f), m)| *p = f - m);
    }
    exp_nonpositive_in_place(p);
    // The normaliser per draw, summed class by class (along the draws).
    log_norm.fill(0.0);
    for p in p.chunks_exact(n) {
        log_norm.iter_mut().zip(p).for_each(|(t, p)| *t += p);
    }
    for p in p.chunks_exact_mut(n) {
        p.iter_mut().zip(log_norm.iter()).for_each(|(p, t)| *p /= t);
    }
    for (l, m) in log_norm.iter_mut().zip(max.iter()) {
        *l = m + l.ln();
    }
}

/// The draws' identity: classes, samples, seed.
type Key = (usize, usize, u64);

/// The `samples × classes` standard-normal draws for `seed` (drawn sample by
/// sample, stored class by class), generated once per process and shared:
/// regenerating them per record would dominate the E-step. Each thread keeps
/// the last ones it used, so that threads answering blocks side by side do
/// not meet on the process's lock once per point.
pub(super) fn softmax_eps(classes: usize, samples: usize, seed: u64) -> Arc<[f64]> {
    thread_local! {
        static LAST: RefCell<Option<(Key, Arc<[f64]>)>> = const { RefCell::new(None) };
    }
    let key = (classes, samples, seed);
    LAST.with_borrow_mut(|last| match last {
        Some((k, eps)) if *k == key => Arc::clone(eps),
        _ => {
            let eps = shared_eps(key);
            *last = Some((key, Arc::clone(&eps)));
            eps
        }
    })
}

fn shared_eps((classes, samples, seed): Key) -> Arc<[f64]> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<[f64]>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    cache
        .entry((classes, samples, seed))
        .or_insert_with(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let drawn: Vec<f64> = (0..classes * samples)
                .map(|_| StandardNormal.sample(&mut rng))
                .collect();
            (0..classes)
                .flat_map(|k| drawn.iter().skip(k).step_by(classes).copied())
                .collect()
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_gives_the_same_bits() {
        // Seven samples: the lanes' remainder is taken too.
        let (classes, samples) = (3, 7);
        let eps = softmax_eps(classes, samples, 5);
        let (mean, var) = ([0.3, -1.2, 2.0], [0.5, 1e-14, 3.0]);
        let n = 2 * samples;
        let draws = |make: fn(&[f64], &[f64], &[f64], DrawsOut<'_>)| {
            let (mut f, mut p, mut max, mut log_norm) = (
                vec![0.0; classes * n],
                vec![0.0; classes * n],
                vec![0.0; n],
                vec![0.0; n],
            );
            make(&eps, &mean, &var, (&mut f, &mut p, &mut max, &mut log_norm));
            (f, p, log_norm)
        };
        let (dispatched, portable) = (draws(make_draws), draws(make_draws_portable));
        assert_eq!(dispatched, portable);
        let p = &portable.1[..n];
        assert_eq!(class_sums(&eps[..samples], p), class_sums_portable(&eps[..samples], p));
    }
}
