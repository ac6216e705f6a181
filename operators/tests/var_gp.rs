//! VAR-GP (seed 004) against oracles computed here with dense matrices and
//! the tests' own kernel: Titsias' SGPR for one Gaussian task, the offline
//! trainer's SVGP for one Bernoulli task, the closed-form optimal block of a
//! second Gaussian task, the seed's Eq. 22 joint, Monte Carlo by ancestral
//! sampling of `q(u_≤t)` for the KL and the predictive, and central finite
//! differences of a task's bound.

mod common;

use std::ops::Range;

use dualgp_operators::model::baselines::var_gp::task_bound;
use dualgp_operators::model::likelihood::Expectation;
use dualgp_operators::model::{
    fit_offline, Data, DualPosterior, EStepConfig, InducingUpdate, Likelihood, Link, OfflineConfig, Pivot,
    StreamingLearner, VarGpConfig, VarGpLearner, VarGpTheta, VarGpVariant,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use common::{kernel, se, task_inputs, uniform, NOISE, VARIANCE};

fn config(m: usize) -> VarGpConfig {
    VarGpConfig {
        inducing: m,
        pivot: Pivot::Variance,
        e_step: EStepConfig { steps: 5000, rho: 1.0 },
        tolerance: 1e-12,
        theta: VarGpTheta::Fixed,
        variant: VarGpVariant::Ar,
    }
}

fn gaussian() -> Likelihood {
    Likelihood::Gaussian { variance: NOISE }
}

fn probit() -> Likelihood {
    Likelihood::Bernoulli { link: Link::Probit }
}

/// Points with `x0` in `[lo, hi]` (and `x1` in `[−1, 1]`): tasks in their own regions.
fn task(rng: &mut ChaCha8Rng, n: usize, lo: f64, hi: f64, classes: bool) -> Data {
    let x = task_inputs(rng, n, lo, hi);
    let y = DVector::from_fn(n, |i, _| {
        let f = (1.5 * x[(i, 0)]).sin() + 0.5 * x[(i, 1)];
        if classes {
            f64::from(f + 0.4 * (rng.random::<f64>() - 0.5) > 0.0)
        } else {
            f + 0.3 * (rng.random::<f64>() - 0.5)
        }
    });
    Data::new(x, y).unwrap()
}

fn learner(lik: Likelihood, m: usize) -> VarGpLearner {
    variant_learner(lik, m, VarGpVariant::Ar)
}

fn variant_learner(lik: Likelihood, m: usize, variant: VarGpVariant) -> VarGpLearner {
    VarGpLearner::new(kernel(), lik, VarGpConfig { variant, ..config(m) }).unwrap()
}

/// A learner of `variant` with `m` inducing inputs, after learning `tasks` in turn.
fn learned_on(lik: Likelihood, m: usize, variant: VarGpVariant, tasks: &[&Data]) -> VarGpLearner {
    let mut l = variant_learner(lik, m, variant);
    for task in tasks {
        l.learn_batch(task).unwrap();
    }
    l
}

/// The posterior after two tasks and the two tasks' blocks of inducing inputs.
fn fitted_two_tasks(l: &VarGpLearner) -> (&DualPosterior, Range<usize>, Range<usize>) {
    let blocks = l.task_blocks();
    (l.fitted().unwrap(), blocks[0].clone(), blocks[1].clone())
}

fn max_rel(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    (a - b).abs().max() / b.abs().max().max(1e-300)
}

/// `q(u)`'s mean and covariance within `tol` of the oracle's, relative to the
/// oracle's largest entries.
fn assert_near_q_u(got: (&DVector<f64>, &DMatrix<f64>), want: (&DVector<f64>, &DMatrix<f64>), tol: f64) {
    let mean_error = max_rel(&as_col(got.0), &as_col(want.0));
    assert!(mean_error < tol, "mean error {mean_error}");
    let cov_error = max_rel(got.1, want.1);
    assert!(cov_error < tol, "covariance error {cov_error}");
}

fn k_zz(post: &DualPosterior) -> DMatrix<f64> {
    se(&post.z, &post.z) + DMatrix::identity(post.m(), post.m()) * post.jitter
}

/// Titsias' optimal `q(u) = N(σ⁻²KΣ⁻¹K_zx y, KΣ⁻¹K)`, `Σ = K + σ⁻²K_zxK_xz`.
fn titsias(data: &Data, z: &DMatrix<f64>, jitter: f64) -> (DVector<f64>, DMatrix<f64>) {
    let k = se(z, z) + DMatrix::identity(z.nrows(), z.nrows()) * jitter;
    let kzx = se(z, data.x());
    let sigma = (&k + &kzx * kzx.transpose() / NOISE).cholesky().unwrap();
    (&k * sigma.solve(&(&kzx * data.y())) / NOISE, &k * sigma.solve(&k))
}

#[test]
fn one_gaussian_task_with_theta_fixed_is_titsias_sgpr() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let data = task(&mut rng, 80, -3.0, 3.0, false);
    let l = learned_on(gaussian(), 15, VarGpVariant::Ar, &[&data]);
    let post = l.fitted().unwrap();
    let (m_u, s) = titsias(&data, &post.z, post.jitter);
    let (mean, cov) = post.q_u(0);
    assert_near_q_u((&mean, &cov), (&m_u, &s), 1e-8);
}

/// One Bernoulli task with `θ` fixed is the SVGP optimum on it: the bound
/// [`task_bound`] (its gradients checked by finite differences below, with no
/// frozen blocks it is the SVGP bound `Σ E_q[log p] − KL[q(u) ‖ p(u)]`) is
/// stationary there, and it is where the offline trainer's E-step settles on
/// the same `Z` and `θ`: the same bound and the same `q(u)`.
#[test]
fn one_bernoulli_task_with_theta_fixed_is_the_svgp_optimum() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let data = task(&mut rng, 120, -3.0, 3.0, true);
    let l = learned_on(probit(), 12, VarGpVariant::Ar, &[&data]);
    let offline = fit_offline(
        kernel(),
        probit(),
        &data,
        12,
        &OfflineConfig {
            rounds: 0,
            e_step: EStepConfig { steps: 300, rho: 1.0 },
            inducing: InducingUpdate::Fixed,
            pivot: Pivot::Variance,
            ..OfflineConfig::default()
        },
    )
    .unwrap();
    let post = l.fitted().unwrap();
    assert_eq!(post.z, offline.posterior.z, "both choose Z by pivoted Cholesky");
    let bound_at = |p: &DualPosterior| {
        let (mean, cov) = block_q(p, 0);
        task_bound(p, 0, &probit(), &data, &mean, &cov).unwrap()
    };
    let ours = bound_at(post);
    let (g_mean, g_cov) = (ours.grad_mean[0].amax(), ours.grad_cov[0].amax());
    assert!(g_mean < 1e-8 && g_cov < 1e-8, "∂F/∂m {g_mean}, ∂F/∂S {g_cov}");
    let (ours, theirs) = (ours.value, bound_at(&offline.posterior).value);
    assert!(
        (ours - theirs).abs() < 1e-8,
        "VAR-GP {ours}, the offline E-step {theirs}"
    );
    let ((mean, cov), (their_mean, their_cov)) = (post.q_u(0), offline.posterior.q_u(0));
    assert!((&mean - &their_mean).amax() < 1e-6 && (&cov - &their_cov).amax() < 1e-6);
}

/// Two Gaussian tasks in their own regions, learned with `θ` fixed.
fn two_tasks(lik: Likelihood, seed: u64) -> (VarGpLearner, Data, Data) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let classes = !matches!(lik, Likelihood::Gaussian { .. });
    let (first, second) = (
        task(&mut rng, 60, -3.0, 0.0, classes),
        task(&mut rng, 60, 0.0, 3.0, classes),
    );
    let l = learned_on(lik, 8, VarGpVariant::Ar, &[&first, &second]);
    (l, first, second)
}

#[test]
fn a_second_gaussian_task_is_the_closed_form_block_and_the_joint_is_eq_22() {
    let (l, first, second) = two_tasks(gaussian(), 3);
    let (post, b1, b2) = fitted_two_tasks(&l);
    assert_eq!(post.m(), b1.len() + b2.len());
    let z1 = post.z.rows(b1.start, b1.len()).into_owned();
    let z2 = post.z.rows(b2.start, b2.len()).into_owned();

    // Task 1: Titsias on Z_1, whitened by chol(K_11).
    let k = k_zz(post);
    let l_full = k.clone().cholesky().unwrap().l();
    let l1 = l_full.view((0, 0), (b1.len(), b1.len())).into_owned();
    let (m_u1, s1) = titsias(&first, &z1, post.jitter);
    let l1_inv = l1.clone().try_inverse().unwrap();
    let (m_v1, s_v1) = (&l1_inv * &m_u1, &l1_inv * &s1 * l1_inv.transpose());
    // Task 2: q(v_2) ∝ N(0, I) Π N(y_i; μ_<,i + a_iᵀv_2, σ²) (the variance terms do not involve v_2's mean).
    let a = l_full.clone().try_inverse().unwrap() * se(&post.z, second.x());
    let (a1, a2) = (
        a.rows(0, b1.len()).into_owned(),
        a.rows(b2.start, b2.len()).into_owned(),
    );
    let offset = a1.transpose() * &m_v1;
    let d = DMatrix::identity(b2.len(), b2.len()) + &a2 * a2.transpose() / NOISE;
    let s_v2 = d.clone().try_inverse().unwrap();
    let m_v2 = &s_v2 * (&a2 * (second.y() - offset)) / NOISE;
    let mut m_v = DVector::zeros(post.m());
    m_v.rows_mut(0, b1.len()).copy_from(&m_v1);
    m_v.rows_mut(b2.start, b2.len()).copy_from(&m_v2);
    let mut s_v = DMatrix::zeros(post.m(), post.m());
    s_v.view_mut((0, 0), (b1.len(), b1.len())).copy_from(&s_v1);
    s_v.view_mut((b2.start, b2.start), (b2.len(), b2.len()))
        .copy_from(&s_v2);
    let (mean, cov) = post.q_u(0);
    assert_near_q_u(
        (&mean, &cov),
        (&(&l_full * &m_v), &(&l_full * &s_v * l_full.transpose())),
        1e-8,
    );

    // Eq. 22 from the seed's parameters: (m_1, Σ_1), (m_2, Σ_2) and A_2 = K_21 K_11⁻¹.
    let (m1, sig1) = l.innovation(0, 0).unwrap();
    let (m2, sig2) = l.innovation(1, 0).unwrap();
    let k11 = se(&z1, &z1) + DMatrix::identity(z1.nrows(), z1.nrows()) * post.jitter;
    let a_2 = se(&z2, &z1) * k11.try_inverse().unwrap();
    let joint_mean = DVector::from_iterator(post.m(), m1.iter().copied().chain((&a_2 * &m1 + &m2).iter().copied()));
    let mut joint_cov = DMatrix::zeros(post.m(), post.m());
    joint_cov.view_mut((0, 0), (b1.len(), b1.len())).copy_from(&sig1);
    let cross = &sig1 * a_2.transpose();
    joint_cov
        .view_mut((0, b2.start), (b1.len(), b2.len()))
        .copy_from(&cross);
    joint_cov
        .view_mut((b2.start, 0), (b2.len(), b1.len()))
        .copy_from(&cross.transpose());
    joint_cov
        .view_mut((b2.start, b2.start), (b2.len(), b2.len()))
        .copy_from(&(&sig2 + &a_2 * &sig1 * a_2.transpose()));
    assert_near_q_u((&mean, &cov), (&joint_mean, &joint_cov), 1e-7);
}

fn log_normal(x: &DVector<f64>, mean: &DVector<f64>, chol: &nalgebra::Cholesky<f64, nalgebra::Dyn>) -> f64 {
    let r = x - mean;
    let log_det = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    -0.5 * (r.dot(&chol.solve(&r)) + log_det + x.len() as f64 * (2.0 * std::f64::consts::PI).ln())
}

#[test]
fn the_closed_form_kl_and_predictive_match_ancestral_sampling() {
    let (l, _, _) = two_tasks(probit(), 4);
    let (post, b1, b2) = fitted_two_tasks(&l);
    let z1 = post.z.rows(b1.start, b1.len()).into_owned();
    let z2 = post.z.rows(b2.start, b2.len()).into_owned();
    let k11 = se(&z1, &z1) + DMatrix::identity(z1.nrows(), z1.nrows()) * post.jitter;
    let a_2 = se(&z2, &z1) * k11.try_inverse().unwrap();
    let (m1, sig1) = l.innovation(0, 0).unwrap();
    let (m2, sig2) = l.innovation(1, 0).unwrap();
    let (c1, c2) = (sig1.cholesky().unwrap(), sig2.cholesky().unwrap());
    let k = k_zz(post);
    let prior = k.clone().cholesky().unwrap();
    let zero = DVector::zeros(post.m());
    let mut rng = ChaCha8Rng::seed_from_u64(40);
    let x_star = uniform(&mut rng, 5, 2, 3.0);
    let k_star = se(&post.z, &x_star);
    let proj = prior.solve(&k_star);
    let resid: Vec<f64> = (0..5)
        .map(|j| {
            se(&x_star.rows(j, 1).into_owned(), &x_star.rows(j, 1).into_owned())[(0, 0)]
                - k_star.column(j).dot(&proj.column(j))
        })
        .collect();
    let draws = 40_000;
    let (mut kl, mut kl_sq) = (0.0, 0.0);
    let (mut f_sum, mut f_sq) = (DVector::<f64>::zeros(5), DVector::<f64>::zeros(5));
    let mut normal = |n: usize| DVector::from_fn(n, |_, _| StandardNormal.sample(&mut rng));
    for _ in 0..draws {
        let u1 = &m1 + c1.l() * normal(b1.len());
        let u2 = &a_2 * &u1 + &m2 + c2.l() * normal(b2.len());
        let u = DVector::from_iterator(post.m(), u1.iter().chain(u2.iter()).copied());
        let term =
            log_normal(&u1, &m1, &c1) + log_normal(&u2, &(&a_2 * &u1 + &m2), &c2) - log_normal(&u, &zero, &prior);
        kl += term;
        kl_sq += term * term;
        let eps = normal(5);
        let f = proj.tr_mul(&u) + DVector::from_fn(5, |j, _| resid[j].sqrt() * eps[j]);
        f_sum += &f;
        f_sq += f.component_mul(&f);
    }
    let n = draws as f64;
    let (kl_mc, kl_se) = (kl / n, ((kl_sq / n - (kl / n).powi(2)) / n).sqrt());
    assert!(
        (kl_mc - post.kl()).abs() < 4.0 * kl_se + 1e-9,
        "KL {} against MC {kl_mc} ± {kl_se}",
        post.kl()
    );
    let marg = post.predict_f(&x_star);
    for j in 0..5 {
        let mean = f_sum[j] / n;
        let var = f_sq[j] / n - mean * mean;
        let (mean_se, var_se) = ((var / n).sqrt(), var * (2.0 / n).sqrt());
        assert!(
            (mean - marg.mean[(j, 0)]).abs() < 4.0 * mean_se,
            "mean {j}: {} against MC {mean}",
            marg.mean[(j, 0)]
        );
        assert!(
            (var - marg.var[(j, 0)]).abs() < 4.0 * var_se,
            "var {j}: {} against MC {var}",
            marg.var[(j, 0)]
        );
    }
}

#[test]
fn a_task_with_no_data_leaves_the_posterior_unchanged() {
    let (mut l, _, _) = two_tasks(probit(), 5);
    let before = l.fitted().unwrap().clone();
    let x = uniform(&mut ChaCha8Rng::seed_from_u64(50), 20, 2, 3.0);
    let predictions = l.predict(&x).unwrap();
    let empty = Data::new(DMatrix::zeros(0, 2), DVector::zeros(0)).unwrap();
    let learned = l.learn_batch(&empty).unwrap();
    assert_eq!(learned.batch, 3);
    let after = l.fitted().unwrap();
    assert_eq!(after.z, before.z);
    assert_eq!(after.whitened, before.whitened);
    assert_eq!(l.predict(&x).unwrap(), predictions);
    assert_eq!(l.task_blocks().len(), 2, "an empty task brings no inducing inputs");
}

/// The second task's block in whitened coordinates, per latent: `(m_v, S_v)`.
fn block_q(post: &DualPosterior, from: usize) -> (Vec<DVector<f64>>, Vec<DMatrix<f64>>) {
    let m_t = post.m() - from;
    post.whitened
        .iter()
        .map(|s| {
            let d = DMatrix::identity(m_t, m_t) + s.lambda.view((from, from), (m_t, m_t));
            let s_v = d.try_inverse().unwrap();
            (&s_v * s.l.rows(from, m_t), s_v)
        })
        .unzip()
}

/// `Σ_i E[log p(y_i|f_i)]` (probit) under `q(u) = N(m_u, S_u)` written out
/// densely with the tests' kernel: `f_i ~ N(w_iᵀm_u, k_ii − k_iᵀw_i + w_iᵀS_u w_i)`,
/// `w_i = K⁻¹k_i`.
fn dense_expected(post: &DualPosterior, data: &Data, m_u: &DVector<f64>, s_u: &DMatrix<f64>) -> f64 {
    let k_inv = k_zz(post).try_inverse().unwrap();
    let kzx = se(&post.z, data.x());
    let mut e = Expectation::default();
    let mut expected = 0.0;
    for i in 0..data.n() {
        let w = &k_inv * kzx.column(i);
        let var = VARIANCE - kzx.column(i).dot(&w) + (s_u * &w).dot(&w);
        probit().expectation(&[w.dot(m_u)], &[var], data.y()[i], &mut e);
        expected += e.value;
    }
    expected
}

/// The second task's bound from `q(u) = N(m_u, S_u)` written out densely with
/// the tests' kernel: `f_i ~ N(k_iᵀK⁻¹m_u, k_ii − k_iᵀK⁻¹k_i + k_iᵀK⁻¹S_uK⁻¹k_i)`,
/// less the block's `KL[N(mean, cov) ‖ N(0, I)]`.
fn dense_bound(post: &DualPosterior, data: &Data, mean: &DVector<f64>, cov: &DMatrix<f64>) -> f64 {
    let (m_u, s_u) = post.q_u(0);
    let expected = dense_expected(post, data, &m_u, &s_u);
    let log_det = cov
        .clone()
        .cholesky()
        .unwrap()
        .l()
        .diagonal()
        .iter()
        .map(|v| 2.0 * v.ln())
        .sum::<f64>();
    expected - 0.5 * (cov.trace() + mean.norm_squared() - mean.len() as f64 - log_det)
}

#[test]
fn a_task_bounds_gradients_match_finite_differences_and_vanish_where_it_learned() {
    let (l, _, second) = two_tasks(probit(), 6);
    let post = l.fitted().unwrap();
    let from = l.task_blocks()[1].start;
    let (mean, cov) = block_q(post, from);
    // Where the E-step stopped the bound is stationary.
    let at_rest = task_bound(post, from, &probit(), &second, &mean, &cov).unwrap();
    let dense = dense_bound(post, &second, &mean[0], &cov[0]);
    assert!(
        (at_rest.value - dense).abs() < 1e-8,
        "task bound {} against {dense}",
        at_rest.value
    );
    let (g_mean, g_cov) = (at_rest.grad_mean, at_rest.grad_cov);
    assert!(g_mean[0].amax() < 1e-6, "∂F/∂m = {}", g_mean[0].amax());
    assert!(g_cov[0].amax() < 1e-6, "∂F/∂S = {}", g_cov[0].amax());
    // Away from it, the analytic gradients are the bound's central differences.
    let mut rng = ChaCha8Rng::seed_from_u64(60);
    let m_t = mean[0].len();
    let moved_mean = vec![&mean[0] + DVector::from_fn(m_t, |_, _| 0.5 * (rng.random::<f64>() - 0.5))];
    let moved_cov = vec![&cov[0] * 0.7 + DMatrix::identity(m_t, m_t) * 0.05];
    let moved = task_bound(post, from, &probit(), &second, &moved_mean, &moved_cov).unwrap();
    let (g_mean, g_cov) = (moved.grad_mean, moved.grad_cov);
    let value = |m: &DVector<f64>, s: &DMatrix<f64>| {
        task_bound(
            post,
            from,
            &probit(),
            &second,
            std::slice::from_ref(m),
            std::slice::from_ref(s),
        )
        .unwrap()
        .value
    };
    let h = 1e-5;
    for k in 0..m_t {
        let (mut up, mut down) = (moved_mean[0].clone(), moved_mean[0].clone());
        up[k] += h;
        down[k] -= h;
        let fd = (value(&up, &moved_cov[0]) - value(&down, &moved_cov[0])) / (2.0 * h);
        assert!(
            (fd - g_mean[0][k]).abs() < 1e-5 * (1.0 + fd.abs()),
            "∂F/∂m[{k}]: {} against {fd}",
            g_mean[0][k]
        );
    }
    for (i, j) in [(0, 0), (1, 0), (2, 2), (3, 1)] {
        // A symmetric perturbation: the derivative is the sum of both entries.
        let bump = |sign: f64| {
            let mut s = moved_cov[0].clone();
            s[(i, j)] += sign * h;
            if i != j {
                s[(j, i)] += sign * h;
            }
            value(&moved_mean[0], &s)
        };
        let fd = (bump(1.0) - bump(-1.0)) / (2.0 * h);
        let analytic = if i == j {
            g_cov[0][(i, i)]
        } else {
            g_cov[0][(i, j)] + g_cov[0][(j, i)]
        };
        assert!(
            (fd - analytic).abs() < 1e-5 * (1.0 + fd.abs()),
            "∂F/∂S[{i},{j}]: {analytic} against {fd}"
        );
    }
}

/// The tasks' records as one data set.
fn pooled(tasks: &[&Data]) -> Data {
    let n: usize = tasks.iter().map(|t| t.n()).sum();
    let mut x = DMatrix::zeros(n, tasks[0].d());
    let mut y = DVector::zeros(n);
    let mut row = 0;
    for t in tasks {
        x.rows_mut(row, t.n()).copy_from(t.x());
        y.rows_mut(row, t.n()).copy_from(t.y());
        row += t.n();
    }
    Data::new(x, y).unwrap()
}

/// `x` as a one-column matrix, for [`max_rel`].
fn as_col(v: &DVector<f64>) -> DMatrix<f64> {
    DMatrix::from_column_slice(v.len(), 1, v.as_slice())
}

#[test]
fn global_with_one_task_is_var_gp() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let data = task(&mut rng, 60, -3.0, 3.0, true);
    let x = uniform(&mut rng, 10, 2, 3.0);
    let mut ar = learner(probit(), 8);
    let mut global = variant_learner(probit(), 8, VarGpVariant::Global);
    ar.learn_batch(&data).unwrap();
    global.learn_batch(&data).unwrap();
    assert_eq!(global.fitted().unwrap().z, ar.fitted().unwrap().z);
    assert_eq!(global.fitted().unwrap().whitened, ar.fitted().unwrap().whitened);
    assert_eq!(global.predict(&x).unwrap(), ar.predict(&x).unwrap());
}

/// The global variant on two Gaussian tasks against its closed form in `u`
/// written out densely: task 1 is Titsias on `Z_1`; task 2's block is
/// `q(u_2) ∝ N(0, K_22) Π N(y_i; w_1,iᵀm_1 + w_2,iᵀu_2, σ²)`, `w_i = K⁻¹k_i`
/// over all of `Z`; `q(u)` is block diagonal in `u` and predicts
/// `N(w_*ᵀm_u, k_** − k_*ᵀK⁻¹k_* + w_*ᵀS_u w_*)`.
#[test]
fn global_is_block_diagonal_in_u_and_predicts_as_the_dense_computation() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (first, second) = (
        task(&mut rng, 60, -3.0, 0.0, false),
        task(&mut rng, 60, 0.0, 3.0, false),
    );
    let l = learned_on(gaussian(), 8, VarGpVariant::Global, &[&first, &second]);
    let (post, b1, b2) = fitted_two_tasks(&l);
    let k = k_zz(post);
    let k_inv = k.clone().try_inverse().unwrap();
    let (m1, s1) = titsias(&first, &post.z.rows(b1.start, b1.len()).into_owned(), post.jitter);
    let w = &k_inv * se(&post.z, second.x());
    let (w1, w2) = (w.rows(b1.start, b1.len()), w.rows(b2.start, b2.len()));
    let k22 = k.view((b2.start, b2.start), (b2.len(), b2.len())).into_owned();
    let s2 = (k22.try_inverse().unwrap() + w2 * w2.transpose() / NOISE)
        .try_inverse()
        .unwrap();
    let m2 = &s2 * (w2 * (second.y() - w1.transpose() * &m1)) / NOISE;
    let mut m_u = DVector::zeros(post.m());
    m_u.rows_mut(b1.start, b1.len()).copy_from(&m1);
    m_u.rows_mut(b2.start, b2.len()).copy_from(&m2);
    let mut s_u = DMatrix::zeros(post.m(), post.m());
    s_u.view_mut((b1.start, b1.start), (b1.len(), b1.len())).copy_from(&s1);
    s_u.view_mut((b2.start, b2.start), (b2.len(), b2.len())).copy_from(&s2);

    let (mean, cov) = post.q_u(0);
    assert_near_q_u((&mean, &cov), (&m_u, &s_u), 1e-7);
    let across = cov.view((b2.start, b1.start), (b2.len(), b1.len())).amax();
    assert!(across < 1e-9 * cov.amax(), "blocks correlated in u: {across}");

    let x_star = uniform(&mut rng, 6, 2, 3.0);
    let w_star = &k_inv * se(&post.z, &x_star);
    let k_star = se(&post.z, &x_star);
    let predicted = post.predict_f(&x_star);
    for j in 0..x_star.nrows() {
        let (w_j, k_j) = (w_star.column(j), k_star.column(j));
        let mean_j = w_j.dot(&m_u);
        let var_j = VARIANCE - k_j.dot(&w_j) + (&s_u * w_j).dot(&w_j);
        assert!((predicted.mean[(j, 0)] - mean_j).abs() < 1e-7 * (1.0 + mean_j.abs()));
        assert!((predicted.var[(j, 0)] - var_j).abs() < 1e-7 * (1.0 + var_j));
    }
}

/// Re-VAR-GP on Gaussian tasks with `θ` fixed: the old posterior stands for
/// the first task's data as Titsias' sites on `u_1` (`N(y_i; k_1,iᵀK_11⁻¹u_1, σ²)`),
/// so `q(u)` is Gaussian regression of the pooled data on `u` with the first
/// task's records projected on `Z_1`. The first task here has no more records
/// than inducing inputs, so they are `Z_1` and their projections exact: that
/// is Titsias' SGPR on both tasks' records with all of `Z`. VAR-GP, its first
/// block frozen, is not.
#[test]
fn retrain_on_gaussian_tasks_is_titsias_sgpr_on_all_data() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (first, second) = (
        task(&mut rng, 8, -3.0, 0.0, false),
        task(&mut rng, 60, -1.0, 3.0, false),
    );
    let learned = |variant| learned_on(gaussian(), 8, variant, &[&first, &second]);
    let retrain = learned(VarGpVariant::Retrain);
    let post = retrain.fitted().unwrap();
    let is_inducing = |x: DMatrix<f64>| (0..8).any(|j| post.z.rows(j, 1) == x);
    assert!(
        (0..first.n()).all(|i| is_inducing(first.x().rows(i, 1).into_owned())),
        "the first task's records are its inducing inputs"
    );
    let (m_u, s_u) = titsias(&pooled(&[&first, &second]), &post.z, post.jitter);
    let (mean, cov) = post.q_u(0);
    // The jitter on `K` (10⁻⁶ of the variance) leaves the projections of
    // the first task's records on `Z_1` exact only to about that.
    assert_near_q_u((&mean, &cov), (&m_u, &s_u), 1e-5);

    let ar = learned(VarGpVariant::Ar);
    let (ar_mean, _) = ar.fitted().unwrap().q_u(0);
    assert!(
        max_rel(&as_col(&ar_mean), &as_col(&m_u)) > 1e-3,
        "VAR-GP too is the pooled SGPR"
    );
}

/// The global variant's second-task bound written out densely in `u`:
/// `Σ_i E[log p(y_i|f_i)] − KL[N(m_2, S_2) ‖ N(0, K_22)]`, `f_i ~ N(w_iᵀm_u,
/// k_ii − k_iᵀK⁻¹k_i + w_iᵀS_u w_i)` with `q(u)` block diagonal, the first
/// block `post`'s.
fn dense_global_bound(post: &DualPosterior, data: &Data, first: usize, m2: &DVector<f64>, s2: &DMatrix<f64>) -> f64 {
    let (m, m_t) = (post.m(), post.m() - first);
    let k = k_zz(post);
    let (m_post, s_post) = post.q_u(0);
    let mut m_u = m_post;
    m_u.rows_mut(first, m_t).copy_from(m2);
    let mut s_u = DMatrix::zeros(m, m);
    s_u.view_mut((0, 0), (first, first))
        .copy_from(&s_post.view((0, 0), (first, first)));
    s_u.view_mut((first, first), (m_t, m_t)).copy_from(s2);
    let expected = dense_expected(post, data, &m_u, &s_u);
    let k22 = k.view((first, first), (m_t, m_t)).into_owned().cholesky().unwrap();
    let log_det =
        |c: &nalgebra::Cholesky<f64, nalgebra::Dyn>| 2.0 * c.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    let kl = 0.5
        * ((k22.solve(s2)).trace() + m2.dot(&k22.solve(m2)) - m_t as f64 + log_det(&k22)
            - log_det(&s2.clone().cholesky().unwrap()));
    expected - kl
}

/// A Bernoulli second task under the global variant stops where the dense
/// bound in `u` is stationary: its central differences in the block's mean
/// and covariance vanish there (the frozen variances enter through the probit).
#[test]
fn global_bernoulli_block_is_stationary_for_the_dense_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let (first, second) = (task(&mut rng, 60, -3.0, 0.5, true), task(&mut rng, 60, -0.5, 3.0, true));
    let l = learned_on(probit(), 6, VarGpVariant::Global, &[&first, &second]);
    let post = l.fitted().unwrap();
    let block = l.task_blocks()[1].clone();
    let (m_u, s_u) = post.q_u(0);
    let m2 = m_u.rows(block.start, block.len()).into_owned();
    let s2 = s_u
        .view((block.start, block.start), (block.len(), block.len()))
        .into_owned();
    let bound = |m: &DVector<f64>, s: &DMatrix<f64>| dense_global_bound(post, &second, block.start, m, s);
    assert_stationary(bound, &m2, &s2, &[(0, 0), (1, 0), (3, 3), (4, 2)]);
}

/// `bound`'s central differences vanish at `(m, s)`: in every entry of the
/// mean (to 1e-5) and in the covariance's `entries`, each moved symmetrically (1e-4).
fn assert_stationary(
    bound: impl Fn(&DVector<f64>, &DMatrix<f64>) -> f64,
    m: &DVector<f64>,
    s: &DMatrix<f64>,
    entries: &[(usize, usize)],
) {
    let h = 1e-5;
    for k in 0..m.len() {
        let (mut up, mut down) = (m.clone(), m.clone());
        up[k] += h;
        down[k] -= h;
        let fd = (bound(&up, s) - bound(&down, s)) / (2.0 * h);
        assert!(fd.abs() < 1e-5, "∂F/∂m[{k}] = {fd}");
    }
    for &(i, j) in entries {
        let bump = |sign: f64| {
            let mut moved = s.clone();
            moved[(i, j)] += sign * h;
            if i != j {
                moved[(j, i)] += sign * h;
            }
            bound(m, &moved)
        };
        let fd = (bump(1.0) - bump(-1.0)) / (2.0 * h);
        assert!(fd.abs() < 1e-4, "∂F/∂S[{i},{j}] = {fd}");
    }
}

/// `E[log N(x; μ, Σ)]` under `x ~ N(m, S)`.
fn expected_log_normal(m: &DVector<f64>, s: &DMatrix<f64>, mu: &DVector<f64>, sigma: &DMatrix<f64>) -> f64 {
    let chol = sigma.clone().cholesky().unwrap();
    let r = m - mu;
    let log_det = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    -0.5 * (chol.solve(s).trace()
        + r.dot(&chol.solve(&r))
        + log_det
        + m.len() as f64 * (2.0 * std::f64::consts::PI).ln())
}

/// Re-VAR-GP's second-task bound (seed Eq. 19 with `Z̃ = Z`) written out
/// densely in `u`: `Σ_i E[log p(y_i|f_i)] − KL[N(m_u, S_u) ‖ N(0, K)] +
/// E_q[log q_old(u_1) − log p(u_1)]`, `q_old` the posterior after the first task.
fn dense_retrain_bound(
    post: &DualPosterior,
    old: &DualPosterior,
    data: &Data,
    m_u: &DVector<f64>,
    s_u: &DMatrix<f64>,
) -> f64 {
    let (m, m_old) = (post.m(), old.m());
    let k = k_zz(post);
    let expected = dense_expected(post, data, m_u, s_u);
    let zero = DVector::zeros(m);
    let entropy_less_kl = expected_log_normal(m_u, s_u, &zero, &k) - expected_log_normal(m_u, s_u, m_u, s_u);
    let (m1, s1) = (
        m_u.rows(0, m_old).into_owned(),
        s_u.view((0, 0), (m_old, m_old)).into_owned(),
    );
    let (m_old_u, s_old_u) = old.q_u(0);
    let old_factor = expected_log_normal(&m1, &s1, &m_old_u, &s_old_u)
        - expected_log_normal(
            &m1,
            &s1,
            &DVector::zeros(m_old),
            &k.view((0, 0), (m_old, m_old)).into_owned(),
        );
    expected + entropy_less_kl + old_factor
}

/// A Bernoulli second task under Re-VAR-GP stops where its bound written out
/// densely is stationary in all of `q(u)`, the old blocks included.
#[test]
fn retrain_bernoulli_posterior_is_stationary_for_the_dense_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (first, second) = (task(&mut rng, 60, -3.0, 0.5, true), task(&mut rng, 60, -0.5, 3.0, true));
    let mut l = variant_learner(probit(), 5, VarGpVariant::Retrain);
    l.learn_batch(&first).unwrap();
    let old = l.fitted().unwrap().clone();
    l.learn_batch(&second).unwrap();
    let post = l.fitted().unwrap();
    let (m_u, s_u) = post.q_u(0);
    let bound = |m: &DVector<f64>, s: &DMatrix<f64>| dense_retrain_bound(post, &old, &second, m, s);
    assert_stationary(bound, &m_u, &s_u, &[(0, 0), (2, 1), (6, 6), (8, 3)]);
}
