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
    /// `samples × classes` draws, row-major; each row is used as `+ε` and `−ε`.
    eps: Arc<[f64]>,
}

/// Floor on `v_c` inside `√v_c` so the reparameterised derivative stays finite.
pub(super) const SOFTMAX_VAR_FLOOR: f64 = 1e-12;

/// One antithetic draw `f = μ + √v ∘ (sign · ε)` and its softmax.
struct SoftmaxDraw<'a> {
    sign: f64,
    eps: &'a [f64],
    f: &'a [f64],
    /// `log Σ_c exp f_c`.
    log_norm: f64,
    probs: &'a [f64],
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

    /// Calls `visit` on every antithetic draw, using per-thread scratch so the
    /// E-step loop does not allocate. All draws' latents are made first, so
    /// that one vectorised `exp` runs over all of them.
    fn for_each_draw(&self, mean: &[f64], var: &[f64], mut visit: impl FnMut(&SoftmaxDraw)) {
        thread_local! {
            static SCRATCH: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
        }
        let c = self.classes;
        let draws = self.n_draws();
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.resize(c + 2 * draws * c + draws, 0.0);
            let (sd, rest) = scratch.split_at_mut(c);
            let (f, rest) = rest.split_at_mut(draws * c);
            let (probs, log_norm) = rest.split_at_mut(draws * c);
            for (s, v) in sd.iter_mut().zip(var) {
                *s = v.max(SOFTMAX_VAR_FLOOR).sqrt();
            }
            // Draw 2k is `μ + √v ∘ ε_k`, draw 2k + 1 its antithetic `μ − √v ∘ ε_k`.
            for (k, eps) in self.eps.chunks_exact(c).enumerate() {
                let (plus, minus) = f[2 * k * c..(2 * k + 2) * c].split_at_mut(c);
                for j in 0..c {
                    plus[j] = mean[j] + sd[j] * eps[j];
                    minus[j] = mean[j] - sd[j] * eps[j];
                }
            }
            for ((f, p), norm) in f
                .chunks_exact(c)
                .zip(probs.chunks_exact_mut(c))
                .zip(log_norm.iter_mut())
            {
                let max = f.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                p.iter_mut().zip(f).for_each(|(p, f)| *p = f - max);
                *norm = max;
            }
            exp_nonpositive_in_place(probs);
            for (p, norm) in probs.chunks_exact_mut(c).zip(log_norm.iter_mut()) {
                let total: f64 = p.iter().sum();
                let inv_total = total.recip();
                p.iter_mut().for_each(|p| *p *= inv_total);
                *norm += total.ln();
            }
            for (row, (eps, sign)) in self.eps.chunks_exact(c).flat_map(|e| [(e, 1.0), (e, -1.0)]).enumerate() {
                visit(&SoftmaxDraw {
                    sign,
                    eps,
                    f: &f[row * c..(row + 1) * c],
                    log_norm: log_norm[row],
                    probs: &probs[row * c..(row + 1) * c],
                });
            }
        });
    }

    /// Exact derivatives of the fixed-sample estimate
    /// `E = mean_s log softmax(μ + √v ∘ ε_s)_y`.
    pub(super) fn expectation(&self, mean: &[f64], var: &[f64], y: f64, out: &mut Expectation) {
        let label = self.label(y);
        let mut value = 0.0;
        out.d_mean.fill(0.0);
        out.d_var.fill(0.0);
        out.beta.fill(0.0);
        self.for_each_draw(mean, var, |d| {
            value += d.f[label] - d.log_norm;
            for (k, &p) in d.probs.iter().enumerate() {
                let g = if k == label { 1.0 - p } else { -p };
                out.d_mean[k] += g;
                // Divided by 2√v_k once at the end.
                out.d_var[k] += g * d.sign * d.eps[k];
                // −∂²/∂f_k² log softmax(f)_y.
                out.beta[k] += p * (1.0 - p);
            }
        });
        let n = self.n_draws() as f64;
        out.value = value / n;
        out.d_mean.iter_mut().for_each(|g| *g /= n);
        out.beta.iter_mut().for_each(|b| *b /= n);
        for (g, v) in out.d_var.iter_mut().zip(var) {
            *g /= n * 2.0 * v.max(SOFTMAX_VAR_FLOOR).sqrt();
        }
    }

    pub(super) fn log_predictive(&self, mean: &[f64], var: &[f64], y: f64) -> f64 {
        let label = self.label(y);
        let mut acc = LogSumExp::default();
        self.for_each_draw(mean, var, |d| acc.add(d.f[label] - d.log_norm));
        acc.value() - (self.n_draws() as f64).ln()
    }

    pub(super) fn predict(&self, mean: &[f64], var: &[f64]) -> Vec<f64> {
        let mut avg = vec![0.0; self.classes];
        self.for_each_draw(mean, var, |d| {
            avg.iter_mut().zip(d.probs).for_each(|(a, p)| *a += p);
        });
        let n = self.n_draws() as f64;
        avg.iter_mut().for_each(|a| *a /= n);
        avg
    }
}

/// The `samples × classes` standard-normal draws for `seed`, generated once
/// per process and shared: regenerating them per record would dominate the E-step.
pub(super) fn softmax_eps(classes: usize, samples: usize, seed: u64) -> Arc<[f64]> {
    type Key = (usize, usize, u64);
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<[f64]>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    cache
        .entry((classes, samples, seed))
        .or_insert_with(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..classes * samples)
                .map(|_| StandardNormal.sample(&mut rng))
                .collect()
        })
        .clone()
}
