//! Gradient ascent on hyperparameters: Adam and L-BFGS. Both maximise.

use nalgebra::DVector;
use serde::{Deserialize, Serialize};

use super::error::Result;

/// Adam (Kingma & Ba) with the usual bias correction; its moments persist
/// across calls so that a stream of M-steps behaves as one long run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Adam {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    m: DVector<f64>,
    v: DVector<f64>,
    t: u64,
}

impl Adam {
    pub fn new(lr: f64) -> Self {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            m: DVector::zeros(0),
            v: DVector::zeros(0),
            t: 0,
        }
    }

    /// One ascent step along `grad`.
    pub fn step(&mut self, params: &mut DVector<f64>, grad: &DVector<f64>) {
        if self.m.len() != params.len() {
            self.m = DVector::zeros(params.len());
            self.v = DVector::zeros(params.len());
            self.t = 0;
        }
        self.t += 1;
        let c1 = 1.0 - self.beta1.powi(self.t as i32);
        let c2 = 1.0 - self.beta2.powi(self.t as i32);
        for i in 0..params.len() {
            self.m[i] = self.beta1 * self.m[i] + (1.0 - self.beta1) * grad[i];
            self.v[i] = self.beta2 * self.v[i] + (1.0 - self.beta2) * grad[i] * grad[i];
            params[i] += self.lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + self.eps);
        }
    }
}

/// The largest change of one parameter in one L-BFGS step (log space: ×20).
const MAX_MOVE: f64 = 3.0;

/// Maximises `f` (returning value and gradient) by L-BFGS with a backtracking
/// Armijo line search, for at most `max_iter` iterations; `history` pairs are
/// kept. Stops early when the gradient or the progress vanishes. Returns the
/// best point and its value.
pub fn lbfgs_maximize<F>(mut f: F, x0: DVector<f64>, max_iter: usize, history: usize) -> Result<(DVector<f64>, f64)>
where
    F: FnMut(&DVector<f64>) -> Result<(f64, DVector<f64>)>,
{
    // Work on −f so that the textbook minimisation formulas apply.
    let (fx, gx) = f(&x0)?;
    let (mut x, mut fx, mut gx) = (x0, -fx, -gx);
    let mut pairs: Vec<(DVector<f64>, DVector<f64>, f64)> = Vec::new();
    for _ in 0..max_iter {
        if gx.amax() < 1e-9 {
            break;
        }
        let mut dir = -two_loop(&gx, &pairs);
        if dir.dot(&gx) >= 0.0 {
            dir = -gx.clone(); // not a descent direction: restart from steepest descent
            pairs.clear();
        }
        // The first step has no curvature information: keep it short. No step
        // moves a log-parameter by more than MAX_MOVE.
        let mut step = if pairs.is_empty() {
            (1.0 / gx.norm()).min(1.0)
        } else {
            1.0
        };
        step = step.min(MAX_MOVE / dir.amax().max(f64::MIN_POSITIVE));
        let slope = dir.dot(&gx);
        let mut accepted = None;
        for _ in 0..30 {
            let x_new = &x + step * &dir;
            if let Ok((f_new, g_new)) = f(&x_new) {
                let (f_new, g_new) = (-f_new, -g_new);
                if f_new.is_finite() && f_new <= fx + 1e-4 * step * slope {
                    accepted = Some((x_new, f_new, g_new));
                    break;
                }
            }
            step *= 0.5;
        }
        let Some((x_new, f_new, g_new)) = accepted else {
            break;
        };
        let s = &x_new - &x;
        let y = &g_new - &gx;
        let sy = s.dot(&y);
        if sy > 1e-12 {
            if pairs.len() == history.max(1) {
                pairs.remove(0);
            }
            pairs.push((s, y, 1.0 / sy));
        }
        let progress = fx - f_new;
        x = x_new;
        fx = f_new;
        gx = g_new;
        if progress.abs() <= 1e-10 * fx.abs().max(1.0) {
            break;
        }
    }
    Ok((x, -fx))
}

/// The L-BFGS two-loop recursion: an approximation of `H⁻¹ g`.
fn two_loop(g: &DVector<f64>, pairs: &[(DVector<f64>, DVector<f64>, f64)]) -> DVector<f64> {
    let mut q = g.clone();
    let mut alphas = vec![0.0; pairs.len()];
    for (k, (s, y, rho)) in pairs.iter().enumerate().rev() {
        alphas[k] = rho * s.dot(&q);
        q.axpy(-alphas[k], y, 1.0);
    }
    if let Some((s, y, _)) = pairs.last() {
        q *= s.dot(y) / y.dot(y);
    }
    for (k, (s, y, rho)) in pairs.iter().enumerate() {
        let beta = rho * y.dot(&q);
        q.axpy(alphas[k] - beta, s, 1.0);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A concave quadratic with a known maximiser.
    fn quadratic(x: &DVector<f64>) -> Result<(f64, DVector<f64>)> {
        let target = DVector::from_vec(vec![1.0, -2.0, 0.5]);
        let scales = DVector::from_vec(vec![1.0, 10.0, 100.0]);
        let d = x - &target;
        let value = -0.5 * d.component_mul(&scales).dot(&d);
        Ok((value, -d.component_mul(&scales)))
    }

    #[test]
    fn lbfgs_finds_the_maximum_of_an_ill_conditioned_quadratic() {
        let (x, fx) = lbfgs_maximize(quadratic, DVector::zeros(3), 100, 10).unwrap();
        assert!((&x - DVector::from_vec(vec![1.0, -2.0, 0.5])).amax() < 1e-6, "{x}");
        assert!(fx.abs() < 1e-10);
    }

    #[test]
    fn lbfgs_maximizes_rosenbrock() {
        let f = |x: &DVector<f64>| -> Result<(f64, DVector<f64>)> {
            let (a, b) = (x[0], x[1]);
            let v = (1.0 - a).powi(2) + 100.0 * (b - a * a).powi(2);
            let g = DVector::from_vec(vec![-2.0 * (1.0 - a) - 400.0 * a * (b - a * a), 200.0 * (b - a * a)]);
            Ok((-v, -g))
        };
        let (x, _) = lbfgs_maximize(f, DVector::from_vec(vec![-1.2, 1.0]), 500, 10).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-4 && (x[1] - 1.0).abs() < 1e-4, "{x}");
    }

    #[test]
    fn adam_climbs_to_the_maximum() {
        let mut adam = Adam::new(0.05);
        let mut x = DVector::zeros(3);
        for _ in 0..5000 {
            let (_, g) = quadratic(&x).unwrap();
            adam.step(&mut x, &g);
        }
        assert!((x - DVector::from_vec(vec![1.0, -2.0, 0.5])).amax() < 1e-3);
    }
}
