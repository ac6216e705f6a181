//! `dualgp demo`: the main job on an embedded default, with no files or
//! services: a generated two-input regression problem, fitted offline and
//! scored on held-out points.

use dualgp_operators::model::{evaluate, fit_offline, Data, Family, Kernel, Likelihood, OfflineConfig, OfflineModel};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The latent field of the generated data: smooth bumps on the unit square.
fn field(x0: f64, x1: f64) -> f64 {
    (3.0 * x0).sin() * (2.0 * x1).cos() + 0.5 * (-((x0 - 0.5).powi(2) + (x1 + 0.5).powi(2)) * 4.0).exp()
}

/// `n` points uniform on [−1.5, 1.5]², targets `field + N(0, noise²)`.
pub fn generate(n: usize, noise: f64, rng: &mut ChaCha8Rng) -> Data {
    let x = DMatrix::from_fn(n, 2, |_, _| rng.random_range(-1.5..1.5));
    let y = DVector::from_fn(n, |i, _| {
        let eps: f64 = rand_distr::Distribution::sample(&rand_distr::StandardNormal, rng);
        field(x[(i, 0)], x[(i, 1)]) + noise * eps
    });
    Data::new(x, y).expect("generated data are finite")
}

pub struct DemoReport {
    pub model: OfflineModel,
    pub train: usize,
    pub test_nlpd: f64,
    pub test_rmse: f64,
    pub seconds: f64,
}

/// Fits `m` inducing points to `n` generated points and scores 1000 more.
pub fn run(n: usize, m: usize, seed: u64) -> anyhow::Result<DemoReport> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let train = generate(n, 0.1, &mut rng);
    let test = generate(1000, 0.1, &mut rng);
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![1.0, 1.0]);
    let started = std::time::Instant::now();
    let model = fit_offline(
        kernel,
        Likelihood::Gaussian { variance: 0.5 },
        &train,
        m,
        &OfflineConfig::default(),
    )?;
    let seconds = started.elapsed().as_secs_f64();
    let metrics = evaluate(&model.posterior, &model.likelihood, &test)?;
    Ok(DemoReport {
        model,
        train: n,
        test_nlpd: metrics.nlpd,
        test_rmse: metrics.rmse.unwrap_or(f64::NAN),
        seconds,
    })
}
