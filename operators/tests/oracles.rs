//! The dual sparse posterior against closed forms computed independently here:
//! exact GP regression, Titsias' optimal SVGP and its collapsed bound.

mod common;

use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::dual::objective::m_step_objective;
use dualgp_operators::model::{Data, DualPosterior, EStepConfig, Family, Kernel, Likelihood, PointSites};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{kernel, regression_data, se, se_with, uniform, NOISE, VARIANCE};

fn max_rel_err(a: &DVector<f64>, b: &DVector<f64>) -> f64 {
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-3))
        .fold(0.0, f64::max)
}

/// One E-step with ρ = 1 from `sites` (zeros or anything else).
fn gaussian_e_step(post: &mut DualPosterior, data: &Data, sites: &mut PointSites) {
    let lik = Likelihood::Gaussian { variance: NOISE };
    e_step(post, &lik, data, sites, &EStepConfig { steps: 1, rho: 1.0 }).unwrap();
}

#[test]
fn inducing_at_the_training_inputs_recovers_exact_gp_regression() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let data = regression_data(&mut rng, 40);
    let test = uniform(&mut rng, 25, 2, 3.5);

    let mut post = DualPosterior::new(kernel(), data.x().clone(), 1).unwrap();
    post.jitter = 0.0; // the exact GP has no jitter
    post.refresh().unwrap();
    let mut sites = PointSites::zeros(data.n(), 1);
    gaussian_e_step(&mut post, &data, &mut sites);
    let f = post.predict_f(&test);

    // Exact GP: μ = K*x (Kxx + σ²I)⁻¹ y,  v = k** − K*x (Kxx + σ²I)⁻¹ Kx*.
    let kxx = se(data.x(), data.x()) + DMatrix::identity(data.n(), data.n()) * NOISE;
    let chol = kxx.cholesky().unwrap();
    let kxs = se(data.x(), &test);
    let mean = kxs.transpose() * chol.solve(data.y());
    let var = DVector::from_fn(test.nrows(), |j, _| {
        VARIANCE - kxs.column(j).dot(&chol.solve(&kxs.column(j)))
    });

    let (got_mean, got_var) = (f.mean.column(0).into_owned(), f.var.column(0).into_owned());
    assert!(
        max_rel_err(&got_mean, &mean) < 1e-8,
        "mean error {}",
        max_rel_err(&got_mean, &mean)
    );
    assert!(
        max_rel_err(&got_var, &var) < 1e-8,
        "variance error {}",
        max_rel_err(&got_var, &var)
    );
}

/// Titsias (2009): `q(u) = N(σ⁻² K Σ⁻¹ K_zx y, K Σ⁻¹ K)`, `Σ = K + σ⁻² K_zx K_xz`,
/// and the collapsed bound `log N(y | 0, Q + σ²I) − tr(K_xx − Q) / 2σ²`.
struct Titsias {
    m_u: DVector<f64>,
    s: DMatrix<f64>,
    bound: f64,
}

fn titsias(data: &Data, z: &DMatrix<f64>, jitter: f64) -> Titsias {
    let m = z.nrows();
    let n = data.n();
    let k = se(z, z) + DMatrix::identity(m, m) * jitter;
    let kzx = se(z, data.x());
    let sigma = &k + &kzx * kzx.transpose() / NOISE;
    let sigma_chol = sigma.cholesky().unwrap();
    let m_u = &k * sigma_chol.solve(&(&kzx * data.y())) / NOISE;
    let s = &k * sigma_chol.solve(&k);

    let q = kzx.transpose() * k.clone().cholesky().unwrap().solve(&kzx);
    let cov = &q + DMatrix::identity(n, n) * NOISE;
    let cov_chol = cov.clone().cholesky().unwrap();
    let log_det: f64 = 2.0 * cov_chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    let quad = data.y().dot(&cov_chol.solve(data.y()));
    let trace = (se(data.x(), data.x()) - &q).trace();
    let bound = -0.5 * (n as f64 * (2.0 * std::f64::consts::PI).ln() + log_det + quad) - 0.5 * trace / NOISE;
    Titsias { m_u, s, bound }
}

#[test]
fn one_e_step_gives_the_optimal_svgp_of_titsias_from_any_start() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let data = regression_data(&mut rng, 200);
    let z = uniform(&mut rng, 15, 2, 3.0);
    let mut post = DualPosterior::new(kernel(), z.clone(), 1).unwrap();

    // Start from arbitrary sites already in the totals: ρ = 1 must forget them.
    let mut sites = PointSites::zeros(data.n(), 1);
    sites.s1 = DMatrix::from_fn(data.n(), 1, |_, _| rng.random_range(-2.0..2.0));
    sites.s2 = DMatrix::from_fn(data.n(), 1, |_, _| rng.random_range(0.1..5.0));
    post.whitened = sites.totals(&post.cross(data.x()).a);
    post.refresh_sites().unwrap();
    gaussian_e_step(&mut post, &data, &mut sites);

    let oracle = titsias(&data, &z, post.jitter);
    let (m_u, s) = post.q_u(0);
    let mean_err = (&m_u - &oracle.m_u).amax() / oracle.m_u.amax();
    let cov_err = (&s - &oracle.s).amax() / oracle.s.amax();
    assert!(mean_err < 1e-9, "q(u) mean error {mean_err}");
    assert!(cov_err < 1e-9, "q(u) covariance error {cov_err}");
}

#[test]
fn m_step_objective_at_the_optimal_sites_is_the_collapsed_titsias_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let data = regression_data(&mut rng, 150);
    let z = uniform(&mut rng, 12, 2, 3.0);
    let lik = Likelihood::Gaussian { variance: NOISE };
    let mut post = DualPosterior::new(kernel(), z.clone(), 1).unwrap();
    let mut sites = PointSites::zeros(data.n(), 1);
    gaussian_e_step(&mut post, &data, &mut sites);

    let value = m_step_objective(&post, &lik, &data, None).unwrap().value;
    let bound = titsias(&data, &z, post.jitter).bound;
    assert!(
        (value - bound).abs() < 1e-8 * bound.abs(),
        "F = {value}, collapsed bound = {bound}"
    );
}

/// The long-lengthscale regime of the two tests below: `K(Z, Z)` nearly
/// singular (variance 10³, lengthscale 40, jitter 10⁻⁶), the posterior after
/// an exact Gaussian E-step, and the oracle's own whitening by nalgebra's
/// Cholesky factor of the same `K`.
struct LongLengthscales {
    data: Data,
    z: DMatrix<f64>,
    post: DualPosterior,
    l: DMatrix<f64>,
}

/// The regime's SE kernel: its variance and lengthscale.
const LONG: (f64, f64) = (1.0e3, 40.0);

impl LongLengthscales {
    fn fit(rng: &mut ChaCha8Rng) -> Self {
        let (variance, lengthscale) = LONG;
        let data = regression_data(rng, 300);
        let z = uniform(rng, 30, 2, 3.0);
        let kernel = Kernel::stationary(Family::SquaredExponential, variance, vec![lengthscale]);
        let mut post = DualPosterior::new(kernel, z.clone(), 1).unwrap();
        post.jitter = 1e-6;
        post.refresh().unwrap();
        gaussian_e_step(&mut post, &data, &mut PointSites::zeros(data.n(), 1));
        let k = se_with(&z, &z, variance, lengthscale) + DMatrix::identity(30, 30) * post.jitter;
        let l = k.cholesky().unwrap().l();
        LongLengthscales { data, z, post, l }
    }

    /// `L⁻¹K(Z, X)` as the oracle makes it.
    fn whitened(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        let (variance, lengthscale) = LONG;
        self.l
            .solve_lower_triangular(&se_with(&self.z, x, variance, lengthscale))
            .unwrap()
    }
}

/// Long lengthscales make `K(Z, Z)` nearly singular (condition number ~10¹¹
/// here; ARD lengthscales of e⁶–e⁹ do it on elevators). `F` must still be the
/// collapsed bound to rounding (site totals summed in `K`'s coordinates and
/// whitened afterwards put it 19 nats off here). The oracle works with `n × n` matrices, with
/// `Q = AᵀA`, `A = L⁻¹K_zx`, so that its own rounding stays small.
#[test]
fn under_long_lengthscales_f_is_still_the_collapsed_bound() {
    let variance = LONG.0;
    let fit = LongLengthscales::fit(&mut ChaCha8Rng::seed_from_u64(4));
    let (data, post) = (&fit.data, &fit.post);
    let lik = Likelihood::Gaussian { variance: NOISE };
    let value = m_step_objective(post, &lik, data, None).unwrap().value;

    let n = data.n();
    let a = fit.whitened(data.x());
    let q = a.transpose() * &a;
    let cov = (&q + DMatrix::identity(n, n) * NOISE).cholesky().unwrap();
    let log_det: f64 = 2.0 * cov.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    let quad = data.y().dot(&cov.solve(data.y()));
    let trace = n as f64 * variance - q.trace();
    let bound = -0.5 * (n as f64 * (2.0 * std::f64::consts::PI).ln() + log_det + quad) - 0.5 * trace / NOISE;
    assert!((value - bound).abs() < 1e-6, "F = {value}, collapsed bound = {bound}");
}

/// Prediction in the regime where `K(Z, Z)` is nearly singular (long
/// lengthscales, a large variance, jitter 1e-6) against Titsias' optimal
/// SVGP written out here in whitened coordinates with nalgebra's own
/// factorisations: `a = L⁻¹k`, `B = I + AAᵀ/σ²`, mean `aᵀB⁻¹Ay/σ²`,
/// variance `k** − aᵀa + aᵀB⁻¹a`. A form with `K⁻¹` in it loses the
/// variance's digits here (JOURNAL.md, 2026-11-29).
#[test]
fn under_long_lengthscales_predictions_are_titsias_optimal_svgp() {
    let variance = LONG.0;
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let fit = LongLengthscales::fit(&mut rng);
    let data = &fit.data;
    let x_star = uniform(&mut rng, 50, 2, 4.0);
    let got = fit.post.predict_f(&x_star);

    let a = fit.whitened(data.x());
    let a_star = fit.whitened(&x_star);
    let b = (DMatrix::identity(30, 30) + &a * a.transpose() / NOISE)
        .cholesky()
        .unwrap();
    let mean = a_star.transpose() * b.solve(&(&a * data.y())) / NOISE;
    let explained = a_star.transpose() * b.solve(&a_star);
    for i in 0..x_star.nrows() {
        let col = a_star.column(i);
        let want_var = variance - col.dot(&col) + explained[(i, i)];
        let (got_mean, got_var) = (got.mean[(i, 0)], got.var[(i, 0)]);
        assert!(
            (got_mean - mean[i]).abs() < 1e-6 * mean[i].abs().max(1.0),
            "mean {got_mean} against {}",
            mean[i]
        );
        assert!(
            (got_var - want_var).abs() < 1e-6 * want_var,
            "point {i}: variance {got_var} against {want_var}"
        );
    }
}
