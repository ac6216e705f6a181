//! Bui et al.'s streaming sparse GP (osgpr) against oracles computed here:
//! Titsias' SGPR on one batch and on all batches together (the collapsed
//! online bound is exact with fixed `Z` and `θ`), central finite differences
//! of both bounds, the optimal `q(b)` as a stationary point of the explicit
//! bound, and a classification stream.

mod common;

use dualgp_operators::model::baselines::osgpr::{ExplicitQ, OldTerm, Online};
use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::dual::objective::{hyperparameters, set_hyperparameters};
use dualgp_operators::model::{
    Data, DualPosterior, EStepConfig, Family, Kernel, Likelihood, Link, ModelError, OsgprConfig, OsgprInducing,
    OsgprLearner, PointSites, StreamingLearner,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{kernel, regression_data, se, uniform, NOISE, VARIANCE};

fn classification_data(rng: &mut ChaCha8Rng, n: usize) -> Data {
    let x = uniform(rng, n, 2, 3.0);
    let y = DVector::from_fn(n, |i, _| {
        let f = 2.0 * (x[(i, 0)]).sin() + x[(i, 1)];
        f64::from(f + 0.6 * (rng.random::<f64>() - 0.5) > 0.0)
    });
    Data::new(x, y).unwrap()
}

/// The rows of the batches together.
fn concat(parts: &[Data]) -> Data {
    let n: usize = parts.iter().map(Data::n).sum();
    let d = parts[0].d();
    let rows: Vec<(usize, usize)> = parts
        .iter()
        .enumerate()
        .flat_map(|(p, data)| (0..data.n()).map(move |i| (p, i)))
        .collect();
    let x = DMatrix::from_fn(n, d, |r, j| parts[rows[r].0].x()[(rows[r].1, j)]);
    let y = DVector::from_fn(n, |r, _| parts[rows[r].0].y()[rows[r].1]);
    Data::new(x, y).unwrap()
}

/// Titsias (2009) written out with dense matrices: the optimal
/// `q(u) = N(σ⁻²KΣ⁻¹K_zx y, KΣ⁻¹K)`, `Σ = K + σ⁻²K_zxK_xz`, and the collapsed
/// bound `log N(y; 0, Q_ff + σ²I) − ½σ⁻² tr(K_ff − Q_ff)`.
struct Titsias {
    m_u: DVector<f64>,
    s: DMatrix<f64>,
    bound: f64,
}

fn titsias(data: &Data, z: &DMatrix<f64>, jitter: f64) -> Titsias {
    let (m, n) = (z.nrows(), data.n());
    let k = se(z, z) + DMatrix::identity(m, m) * jitter;
    let kzx = se(z, data.x());
    let sigma_chol = (&k + &kzx * kzx.transpose() / NOISE).cholesky().unwrap();
    let m_u = &k * sigma_chol.solve(&(&kzx * data.y())) / NOISE;
    let s = &k * sigma_chol.solve(&k);

    let q = kzx.transpose() * k.clone().cholesky().unwrap().solve(&kzx);
    let cov_chol = (&q + DMatrix::identity(n, n) * NOISE).cholesky().unwrap();
    let log_det: f64 = 2.0 * cov_chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    let quad = data.y().dot(&cov_chol.solve(data.y()));
    let trace = (se(data.x(), data.x()) - &q).trace();
    let bound = -0.5 * (n as f64 * (2.0 * std::f64::consts::PI).ln() + log_det + quad) - 0.5 * trace / NOISE;
    Titsias { m_u, s, bound }
}

/// A learner that keeps `θ` and the given `Z`.
fn fixed_learner(lik: Likelihood, z: &DMatrix<f64>) -> OsgprLearner {
    let config = OsgprConfig {
        inducing: z.nrows(),
        inducing_policy: OsgprInducing::Fixed,
        max_iter: 0,
        ..OsgprConfig::default()
    };
    OsgprLearner::new(kernel(), lik, config)
        .unwrap()
        .with_inducing(z.clone())
        .unwrap()
}

fn rel_err_vec(got: &DVector<f64>, want: &DVector<f64>) -> f64 {
    (got - want).amax() / want.amax()
}

fn rel_err_mat(got: &DMatrix<f64>, want: &DMatrix<f64>) -> f64 {
    (got - want).amax() / want.amax()
}

/// The learner's `q(u)` and bound against Titsias on `data`.
fn assert_matches_titsias(learner: &OsgprLearner, data: &Data, bound: f64, what: &str) {
    let post = learner.posterior().unwrap();
    let oracle = titsias(data, &post.z, post.jitter);
    let (m_u, s) = post.q_u(0);
    let (mean_err, cov_err) = (rel_err_vec(&m_u, &oracle.m_u), rel_err_mat(&s, &oracle.s));
    let bound_err = (bound - oracle.bound).abs() / oracle.bound.abs();
    assert!(mean_err < 1e-8, "{what}: q(u) mean error {mean_err:e}");
    assert!(cov_err < 1e-8, "{what}: q(u) covariance error {cov_err:e}");
    assert!(
        bound_err < 1e-8,
        "{what}: bound {bound} vs Titsias {} (error {bound_err:e})",
        oracle.bound
    );
}

#[test]
fn one_gaussian_batch_is_titsias_sgpr() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let data = regression_data(&mut rng, 150);
    let z = uniform(&mut rng, 15, 2, 3.0);
    let mut learner = fixed_learner(Likelihood::Gaussian { variance: NOISE }, &z);
    let report = learner.update(&data).unwrap();
    assert_matches_titsias(&learner, &data, report.bound, "one batch");

    // Predictions: the SGPR predictive mean and variance (plus noise) at new inputs.
    let test = uniform(&mut rng, 20, 2, 3.5);
    let oracle = titsias(&data, &z, learner.posterior().unwrap().jitter);
    let k = se(&z, &z) + DMatrix::identity(15, 15) * learner.posterior().unwrap().jitter;
    let k_chol = k.clone().cholesky().unwrap();
    let ksz = se(&z, &test);
    let a = k_chol.solve(&ksz);
    for (j, p) in learner.predict(&test).unwrap().iter().enumerate() {
        let aj = a.column(j);
        let mean = aj.dot(&oracle.m_u);
        let var = VARIANCE - ksz.column(j).dot(&aj) + aj.dot(&(&oracle.s * aj)) + NOISE;
        let dualgp_operators::model::Predictive::Moments { mean: m, var: v } = p else {
            panic!("a Gaussian likelihood predicts moments");
        };
        assert!((m - mean).abs() < 1e-8 * mean.abs().max(1.0), "mean {m} vs {mean}");
        assert!((v - var).abs() < 1e-8 * var, "variance {v} vs {var}");
    }
}

#[test]
fn gaussian_stream_with_fixed_z_and_theta_is_batch_sgpr_on_all_data() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let batches: Vec<Data> = (0..4).map(|b| regression_data(&mut rng, 40 + 25 * b)).collect();
    let z = uniform(&mut rng, 12, 2, 3.0);
    let mut learner = fixed_learner(Likelihood::Gaussian { variance: NOISE }, &z);
    let mut bounds = 0.0;
    for (b, batch) in batches.iter().enumerate() {
        bounds += learner.update(batch).unwrap().bound;
        // The online bounds add up to the batch bound: F_t = log Z(1..t) − log Z(1..t−1).
        assert_matches_titsias(
            &learner,
            &concat(&batches[..=b]),
            bounds,
            &format!("after batch {}", b + 1),
        );
    }
}

/// A nontrivial old term: one batch learned with moving `θ`, then `θ` moved on
/// and `b` = part of `a` and new points.
/// osgpr with `inducing` points and `max_iter` L-BFGS iterations per batch, defaults otherwise.
fn learner(kernel: Kernel, lik: Likelihood, inducing: usize, max_iter: usize) -> OsgprLearner {
    let config = OsgprConfig {
        inducing,
        max_iter,
        ..OsgprConfig::default()
    };
    OsgprLearner::new(kernel, lik, config).unwrap()
}

/// An old posterior's term and a new batch with moved `Z` and changed `θ`.
struct Case {
    old: OldTerm,
    kernel: Kernel,
    lik: Likelihood,
    z: DMatrix<f64>,
    data: Data,
    post: DualPosterior,
}

impl Case {
    fn online(&self) -> Online<'_> {
        Online {
            kernel: &self.kernel,
            likelihood: &self.lik,
            z: &self.z,
            jitter: 1e-6,
            old: Some(&self.old),
            data: &self.data,
        }
    }
}

fn old_and_new(lik: &Likelihood, seed: u64) -> Case {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let data = |rng: &mut ChaCha8Rng, n| match lik {
        Likelihood::Gaussian { .. } => regression_data(rng, n),
        _ => classification_data(rng, n),
    };
    let first = data(&mut rng, 60);
    let ard = Kernel::stationary(Family::Matern52, 1.1, vec![0.9, 1.4]);
    let mut learner = learner(ard, lik.clone(), 8, 5);
    learner.update(&first).unwrap();
    let post = learner.posterior().unwrap();
    let old = OldTerm::new(post).unwrap();

    let mut kernel = post.kernel.clone();
    let mut lik = learner.likelihood.clone();
    let theta = hyperparameters(&kernel, &lik).map(|t| t + 0.15);
    set_hyperparameters(&mut kernel, &mut lik, &theta);
    let fresh = uniform(&mut rng, 4, 2, 3.0);
    let z = DMatrix::from_fn(10, 2, |i, j| if i < 6 { post.z[(i, j)] } else { fresh[(i - 6, j)] });
    Case {
        old,
        kernel,
        lik,
        z,
        data: data(&mut rng, 50),
        post: post.clone(),
    }
}

/// `q(b)` maximising the explicit bound: the E-step's fixed point with the old term as a site.
fn optimal_q(online: &Online, steps: usize) -> (DualPosterior, Vec<ExplicitQ>) {
    let n_latent = online.likelihood.n_latent();
    let mut post = DualPosterior::new(online.kernel.clone(), online.z.clone(), n_latent).unwrap();
    post.jitter = online.jitter;
    post.whitened = online.old_sites().unwrap();
    post.refresh().unwrap();
    let mut sites = PointSites::zeros(online.data.n(), online.likelihood.n_latent());
    let config = EStepConfig { steps, rho: 1.0 };
    e_step(&mut post, online.likelihood, online.data, &mut sites, &config).unwrap();
    let q = (0..post.n_latent())
        .map(|c| ExplicitQ::from_posterior(&post, c).unwrap())
        .collect();
    (post, q)
}

/// Fourth-order central differences of `f` at `x` in every coordinate, against
/// `analytic` (second order needs steps so small that rounding shows).
fn assert_fd(mut f: impl FnMut(&[f64]) -> f64, x: &[f64], analytic: &[f64], what: &str) {
    // Large enough that rounding in the bound (≈1e-13 relative: P = K'⁻¹Λ_aK'⁻¹ is large) stays out.
    let h = 1e-3;
    for p in 0..x.len() {
        let mut at = |step: f64| {
            let mut moved = x.to_vec();
            moved[p] += step;
            f(&moved)
        };
        let numeric = (8.0 * (at(h) - at(-h)) - (at(2.0 * h) - at(-2.0 * h))) / (12.0 * h);
        let err = (analytic[p] - numeric).abs() / numeric.abs().max(1e-2);
        assert!(
            err < 1e-5,
            "{what}[{p}]: analytic {} vs finite difference {numeric} (rel. error {err:e})",
            analytic[p]
        );
    }
}

fn check_uncollapsed_gradients(lik: Likelihood) {
    let case = old_and_new(&lik, 3);
    let (kernel, lik, z) = (case.kernel.clone(), case.lik.clone(), case.z.clone());
    let online = case.online();
    // Away from the optimum, so that every gradient is non-zero.
    let (_, mut q) = optimal_q(&online, 2);
    q[0].mean.add_scalar_mut(0.1);
    q[0].sqrt *= 0.8;
    let bound = online.uncollapsed(&q).unwrap();
    let value = |kernel: &Kernel, lik: &Likelihood, z: &DMatrix<f64>, q: &[ExplicitQ]| {
        Online {
            kernel,
            likelihood: lik,
            z,
            ..online
        }
        .uncollapsed(q)
        .unwrap()
        .value
    };

    let theta = hyperparameters(&kernel, &lik);
    let at_theta = |t: &[f64]| {
        let (mut k, mut l) = (kernel.clone(), lik.clone());
        set_hyperparameters(&mut k, &mut l, &DVector::from_column_slice(t));
        value(&k, &l, &z, &q)
    };
    assert_fd(at_theta, theta.as_slice(), bound.grad.as_slice(), "θ");

    let at_mean = |m: &[f64]| {
        let mut q = q.clone();
        q[0].mean.copy_from_slice(m);
        value(&kernel, &lik, &z, &q)
    };
    assert_fd(at_mean, q[0].mean.as_slice(), bound.grad_mean[0].as_slice(), "m_b");

    let at_sqrt = |s: &[f64]| {
        let mut q = q.clone();
        q[0].sqrt.copy_from_slice(s);
        value(&kernel, &lik, &z, &q)
    };
    assert_fd(at_sqrt, q[0].sqrt.as_slice(), bound.grad_sqrt[0].as_slice(), "L");

    // b: the rows that are not old inputs (moving a kept one breaks its shared jitter).
    let new_rows = 6..z.nrows();
    let at_z = |zs: &[f64]| {
        let mut z2 = z.clone();
        for (k, i) in new_rows.clone().enumerate() {
            z2[(i, 0)] = zs[2 * k];
            z2[(i, 1)] = zs[2 * k + 1];
        }
        value(&kernel, &lik, &z2, &q)
    };
    let flat = |m: &DMatrix<f64>| -> Vec<f64> { new_rows.clone().flat_map(|i| [m[(i, 0)], m[(i, 1)]]).collect() };
    assert_fd(at_z, &flat(&z), &flat(&bound.grad_z), "b");
}

#[test]
fn uncollapsed_gaussian_gradient_matches_finite_differences() {
    check_uncollapsed_gradients(Likelihood::Gaussian { variance: NOISE });
}

#[test]
fn uncollapsed_bernoulli_gradient_matches_finite_differences() {
    check_uncollapsed_gradients(Likelihood::Bernoulli { link: Link::Probit });
}

#[test]
fn collapsed_gradient_matches_finite_differences() {
    let case = old_and_new(&Likelihood::Gaussian { variance: NOISE }, 4);
    let (kernel, lik, z) = (case.kernel.clone(), case.lik.clone(), case.z.clone());
    let online = case.online();
    let (bound, _) = online.collapsed_with_grad().unwrap();
    let theta = hyperparameters(&kernel, &lik);
    let at_theta = |t: &[f64]| {
        let (mut k, mut l) = (kernel.clone(), lik.clone());
        set_hyperparameters(&mut k, &mut l, &DVector::from_column_slice(t));
        let online = Online {
            kernel: &k,
            likelihood: &l,
            ..online
        };
        online.collapsed().unwrap().value
    };
    assert_fd(at_theta, theta.as_slice(), bound.grad.as_slice(), "θ");
    let at_z = |zs: &[f64]| {
        let mut z2 = z.clone();
        z2.rows_mut(6, 4).copy_from_slice(zs);
        Online { z: &z2, ..online }.collapsed().unwrap().value
    };
    let new_rows = |m: &DMatrix<f64>| m.rows(6, 4).iter().copied().collect::<Vec<_>>();
    assert_fd(at_z, &new_rows(&z), &new_rows(&bound.grad_z), "b");
}

#[test]
fn optimal_q_is_a_stationary_point_of_the_explicit_bound() {
    for lik in [
        Likelihood::Gaussian { variance: NOISE },
        Likelihood::Bernoulli { link: Link::Probit },
        Likelihood::Bernoulli { link: Link::Logit },
        Likelihood::Poisson,
    ] {
        let case = old_and_new(&lik, 5);
        let online = case.online();
        let (_, q) = optimal_q(&online, 30);
        let bound = online.uncollapsed(&q).unwrap();
        let (gm, gs) = (bound.grad_mean[0].amax(), bound.grad_sqrt[0].amax());
        assert!(gm < 1e-6 && gs < 1e-6, "{}: ∂F/∂m {gm:e}, ∂F/∂L {gs:e}", lik.name());
        if let Likelihood::Gaussian { .. } = lik {
            let collapsed = online.collapsed().unwrap().value;
            let err = (bound.value - collapsed).abs() / collapsed.abs();
            assert!(
                err < 1e-9,
                "explicit bound at q* {} vs collapsed {collapsed}",
                bound.value
            );
        }
    }
}

#[test]
fn the_old_term_keeps_q_old_and_k_aa() {
    let Case { old, post, .. } = old_and_new(&Likelihood::Bernoulli { link: Link::Probit }, 6);
    let (m_a, s_a) = old.q_old(0);
    let (m_u, s_u) = post.q_u(0);
    assert!(rel_err_vec(&m_a, &m_u) < 1e-10 && rel_err_mat(&s_a, &s_u) < 1e-10);
    assert_eq!(old.k_aa(), &post.k_zz());
    assert_eq!(old.z(), &post.z);
}

#[test]
fn a_classification_stream_learns_the_boundary() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let batches: Vec<Data> = (0..5).map(|_| classification_data(&mut rng, 120)).collect();
    let test = classification_data(&mut rng, 1000);
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![1.0, 1.0]);
    let mut learner = learner(kernel, Likelihood::Bernoulli { link: Link::Probit }, 25, 30);
    let mut accuracy = Vec::new();
    for batch in &batches {
        let report = learner.update(batch).unwrap();
        assert!(report.bound.is_finite());
        accuracy.push(learner.evaluate(&test).unwrap().accuracy.unwrap());
    }
    // The labels flip with probability ≈ 0.1 near the boundary: a good classifier reaches ≥ 0.9.
    assert!(accuracy[4] >= 0.9, "accuracy after each batch {accuracy:?}");
    assert!(
        accuracy[4] >= accuracy[0] - 0.01,
        "accuracy after each batch {accuracy:?}"
    );
}

#[test]
fn inducing_policies_keep_m_points_and_serde_round_trips() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let batches: Vec<Data> = (0..3).map(|_| regression_data(&mut rng, 50)).collect();
    for policy in [
        OsgprInducing::Fixed,
        OsgprInducing::Pivoted,
        OsgprInducing::Replace { fraction: 0.3 },
    ] {
        let config = OsgprConfig {
            inducing: 10,
            inducing_policy: policy,
            optimize_z: true,
            max_iter: 10,
            ..OsgprConfig::default()
        };
        let mut learner = OsgprLearner::new(kernel(), Likelihood::Gaussian { variance: 0.5 }, config).unwrap();
        for batch in &batches {
            learner.update(batch).unwrap();
            assert_eq!(learner.posterior().unwrap().m(), 10, "{policy:?}");
        }
        // A checkpoint restored from JSON (decimal floats: equal up to rounding) learns on alike.
        let json = serde_json::to_string(&learner).unwrap();
        let mut back: OsgprLearner = serde_json::from_str(&json).unwrap();
        back.ensure_factors().unwrap();
        let (next, test) = (regression_data(&mut rng, 50), regression_data(&mut rng, 30));
        let close = |learner: &OsgprLearner, back: &OsgprLearner, tol: f64| {
            let (a, b) = (learner.evaluate(&test).unwrap(), back.evaluate(&test).unwrap());
            assert!(
                (a.nlpd - b.nlpd).abs() < tol * a.nlpd.abs().max(1.0),
                "{policy:?}: {a:?} vs {b:?}"
            );
        };
        close(&learner, &back, 1e-9);
        learner.update(&next).unwrap();
        back.update(&next).unwrap();
        // Ten L-BFGS steps on Z amplify the last-digit differences (Z ends
        // 1e-4 apart for the pivoted policy); a lost field would differ at O(1).
        close(&learner, &back, 1e-4);
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let lik = Likelihood::Bernoulli { link: Link::Probit };
    let mut learner = OsgprLearner::new(kernel(), lik.clone(), OsgprConfig::default()).unwrap();
    let x = DMatrix::from_row_slice(2, 2, &[0.0, 1.0, 1.0, 0.0]);
    assert!(matches!(
        learner.evaluate(&Data::new(x.clone(), DVector::from_vec(vec![0.0, 1.0])).unwrap()),
        Err(ModelError::Config(_))
    ));
    let empty = Data::new(DMatrix::zeros(0, 2), DVector::zeros(0)).unwrap();
    assert!(matches!(learner.update(&empty), Err(ModelError::Config(_))));
    let bad_label = Data::new(x.clone(), DVector::from_vec(vec![0.0, 2.0])).unwrap();
    assert!(matches!(
        learner.update(&bad_label),
        Err(ModelError::InvalidLabel { row: 1, .. })
    ));
    learner
        .update(&Data::new(x, DVector::from_vec(vec![0.0, 1.0])).unwrap())
        .unwrap();
    let wrong_d = Data::new(DMatrix::zeros(3, 3), DVector::zeros(3)).unwrap();
    assert!(matches!(learner.update(&wrong_d), Err(ModelError::Dimension { .. })));
    assert!(matches!(
        learner.predict(&DMatrix::zeros(1, 3)),
        Err(ModelError::Dimension { .. })
    ));
    let bad = OsgprConfig {
        inducing_policy: OsgprInducing::Replace { fraction: 1.5 },
        ..OsgprConfig::default()
    };
    assert!(matches!(
        OsgprLearner::new(kernel(), lik, bad),
        Err(ModelError::Config(_))
    ));
}
