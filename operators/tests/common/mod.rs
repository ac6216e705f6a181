//! Helpers shared by the tests: for the closed-form ones a squared-exponential
//! kernel written out independently of the library and seeded data, for the
//! dataflow ones a small learner's settings and a run of the operator.
#![allow(dead_code)]

mod hostfile;
pub mod operator;

#[allow(unused_imports)] // not every test binary runs a cluster
pub use hostfile::hostfile;

use dualgp_operators::model::{Data, DualPosterior, EStepConfig, Family, Kernel, Optimizer, SequentialConfig};
use nalgebra::{DMatrix, DVector};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub const NOISE: f64 = 0.1;
pub const VARIANCE: f64 = 1.3;
pub const LENGTHSCALE: f64 = 0.7;

/// The squared-exponential kernel written out directly, independent of the library.
pub fn se(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    se_with(a, b, VARIANCE, LENGTHSCALE)
}

pub fn se_with(a: &DMatrix<f64>, b: &DMatrix<f64>, variance: f64, lengthscale: f64) -> DMatrix<f64> {
    DMatrix::from_fn(a.nrows(), b.nrows(), |i, j| {
        let r2: f64 = (0..a.ncols()).map(|k| (a[(i, k)] - b[(j, k)]).powi(2)).sum();
        variance * (-0.5 * r2 / (lengthscale * lengthscale)).exp()
    })
}

pub fn kernel() -> Kernel {
    Kernel::stationary(Family::SquaredExponential, VARIANCE, vec![LENGTHSCALE])
}

pub fn uniform(rng: &mut ChaCha8Rng, n: usize, d: usize, half_width: f64) -> DMatrix<f64> {
    DMatrix::from_fn(n, d, |_, _| rng.random_range(-half_width..half_width))
}

/// `n` points with `x0` uniform in `[lo, hi]` and `x1` in `[−1, 1]`: a task
/// in its own region.
pub fn task_inputs(rng: &mut ChaCha8Rng, n: usize, lo: f64, hi: f64) -> DMatrix<f64> {
    let mut x = uniform(rng, n, 2, 1.0);
    for i in 0..n {
        x[(i, 0)] = lo + (hi - lo) * rng.random::<f64>();
    }
    x
}

pub fn regression_data(rng: &mut ChaCha8Rng, n: usize) -> Data {
    let x = uniform(rng, n, 2, 3.0);
    let y = DVector::from_fn(n, |i, _| {
        (x[(i, 0)]).sin() + 0.5 * x[(i, 1)] + 0.3 * rng.random::<f64>()
    });
    Data::new(x, y).unwrap()
}

/// The largest difference of two matrices, absolute or relative.
pub type Difference = fn(&DMatrix<f64>, &DMatrix<f64>) -> f64;

/// `got` predicts the latent functions at `x` as `want` does: means and
/// variances within `tol` by `error`.
pub fn assert_predicts_as(
    (got, want): (&DualPosterior, &DualPosterior),
    x: &DMatrix<f64>,
    (error, tol): (Difference, f64),
    what: &str,
) {
    let (got, want) = (got.predict_f(x), want.predict_f(x));
    let (e_mean, e_var) = (error(&got.mean, &want.mean), error(&got.var, &want.var));
    assert!(
        e_mean < tol && e_var < tol,
        "{what}mean error {e_mean:e}, variance error {e_var:e}"
    );
}

/// Few inducing inputs and few steps, so that a stream of a few epochs runs
/// in moments; each dataflow test names what it sets otherwise.
pub fn small_config() -> SequentialConfig {
    SequentialConfig {
        inducing: 12,
        e_step: EStepConfig { steps: 3, rho: 0.8 },
        m_steps: 5,
        reexpress_old_data: true,
        optimizer: Optimizer::Adam { lr: 0.05 },
        ..SequentialConfig::default()
    }
}

/// `analytic` against central differences of `value_at` around `theta`.
pub fn assert_matches_finite_differences(
    analytic: &DVector<f64>,
    theta: &DVector<f64>,
    mut value_at: impl FnMut(&DVector<f64>) -> f64,
) {
    let h = 1e-5;
    for p in 0..theta.len() {
        let (mut plus, mut minus) = (theta.clone(), theta.clone());
        plus[p] += h;
        minus[p] -= h;
        let numeric = (value_at(&plus) - value_at(&minus)) / (2.0 * h);
        assert_near_difference(analytic[p], numeric, format_args!("parameter {p}"));
    }
}

/// `analytic` within 1e-5 of the finite difference `numeric`, relative to
/// `|numeric|` (at least 1e-3).
pub fn assert_near_difference(analytic: f64, numeric: f64, what: std::fmt::Arguments) {
    let err = (analytic - numeric).abs() / numeric.abs().max(1e-3);
    assert!(
        err < 1e-5,
        "{what}: analytic {analytic} vs finite difference {numeric} (rel. error {err:e})"
    );
}
