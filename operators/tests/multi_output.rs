//! The multi-output (LMC) model against oracles computed here: independent
//! single-output learners (identity mixing), the exact multi-output SGPR in
//! closed form (Gaussian outputs), and finite differences of the M-step
//! objective in the kernel, the outputs' parameters and the mixing matrix.

use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::dual::objective::{hyperparameters, m_step_objective, set_hyperparameters};
use dualgp_operators::model::{
    Data, DualPosterior, EStepConfig, Family, InducingPolicy, Kernel, Likelihood, Link, MemoryPolicy, MultiOutput,
    PointSites, SequentialConfig, SequentialLearner, StreamingLearner,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn kernel() -> Kernel {
    Kernel::stationary(Family::SquaredExponential, 1.3, vec![0.6])
}

fn gaussian(variance: f64) -> Likelihood {
    Likelihood::Gaussian { variance }
}

fn probit() -> Likelihood {
    Likelihood::Bernoulli { link: Link::Probit }
}

fn multi(outputs: Vec<Likelihood>, mixing: DMatrix<f64>) -> Likelihood {
    Likelihood::MultiOutput(Box::new(MultiOutput::with_mixing(outputs, mixing).unwrap()))
}

/// A label of `lik` given the latent value `f`.
fn label(lik: &Likelihood, f: f64, rng: &mut ChaCha8Rng) -> f64 {
    let z: f64 = rng.random_range(-1.0..1.0);
    match lik {
        Likelihood::Bernoulli { .. } => f64::from(f + z > 0.0),
        Likelihood::Poisson => (f.exp() + 2.0 * z.abs()).floor(),
        _ => f + 0.4 * z,
    }
}

/// `n` records on `[0, 3]`, output `i mod D`, labels from two smooth latents
/// mixed by `truth` (`2 × D`).
fn records(outputs: &[Likelihood], truth: &DMatrix<f64>, n: usize, seed: u64) -> Data {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x: DMatrix<f64> = DMatrix::from_fn(n, 1, |_, _| rng.random_range(0.0..3.0));
    let out: Vec<usize> = (0..n).map(|i| i % outputs.len()).collect();
    let y = DVector::from_fn(n, |i, _| {
        let u = [(2.0 * x[(i, 0)]).sin(), 0.5 * x[(i, 0)] - 0.7];
        let d = out[i];
        let f = truth[(0, d)] * u[0] + truth[(1, d)] * u[1];
        label(&outputs[d], f, &mut rng)
    });
    Data::with_outputs(x, y, out).unwrap()
}

fn grid(n: usize) -> DMatrix<f64> {
    DMatrix::from_fn(n, 1, |i, _| -0.2 + 3.4 * i as f64 / (n - 1) as f64)
}

fn inducing(m: usize) -> DMatrix<f64> {
    DMatrix::from_fn(m, 1, |i, _| 3.0 * i as f64 / (m - 1) as f64)
}

/// A sequential learner with fixed `Z` and fixed hyperparameters.
fn fixed_learner(lik: Likelihood, memory: MemoryPolicy) -> SequentialLearner {
    let config = SequentialConfig {
        inducing: 10,
        inducing_policy: InducingPolicy::Fixed,
        e_step: EStepConfig { steps: 400, rho: 1.0 },
        m_steps: 0,
        memory,
        ..SequentialConfig::default()
    };
    SequentialLearner::new(kernel(), lik, config)
        .unwrap()
        .with_inducing(inducing(10))
        .unwrap()
}

fn max_abs_diff(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    (a - b).amax()
}

/// Q = D with the identity mixing matrix is D independent models: learned
/// batch by batch in the same sequential learner, each latent's predictive
/// equals the single-output learner's that saw only its output's rows.
#[test]
fn identity_mixing_equals_independent_single_output_learners() {
    let outputs = vec![gaussian(0.2), probit()];
    let truth = DMatrix::from_row_slice(2, 2, &[1.0, 0.4, 0.3, 1.5]);
    let lik = multi(outputs.clone(), DMatrix::identity(2, 2));
    let mut joint = fixed_learner(lik, MemoryPolicy::None);
    let mut alone: Vec<SequentialLearner> = outputs
        .iter()
        .map(|l| fixed_learner(l.clone(), MemoryPolicy::None))
        .collect();
    for batch in 0..3 {
        let data = records(&outputs, &truth, 90, 10 + batch);
        joint.update(&data).unwrap();
        for (d, learner) in alone.iter_mut().enumerate() {
            let rows: Vec<usize> = (0..data.n()).filter(|&i| data.output(i) == d).collect();
            let own = data.select(&rows);
            let own = Data::new(own.x().clone(), own.y().clone()).unwrap();
            learner.update(&own).unwrap();
        }
    }
    let test = grid(30);
    let f = joint.posterior().unwrap().predict_f(&test);
    for (d, learner) in alone.iter().enumerate() {
        let g = learner.posterior().unwrap().predict_f(&test);
        let mean_err = max_abs_diff(&f.mean.columns(d, 1).into_owned(), &g.mean);
        let var_err = max_abs_diff(&f.var.columns(d, 1).into_owned(), &g.var);
        assert!(mean_err < 1e-6, "output {d}: mean differs by {mean_err:e}");
        assert!(var_err < 1e-6, "output {d}: variance differs by {var_err:e}");
    }
    // And the M-step objective is the sum of the independent ones, gradient included.
    let data = records(&outputs, &truth, 60, 99);
    let joint_f = m_step_objective(joint.posterior().unwrap(), joint.likelihood(), &data, None).unwrap();
    let mut value = 0.0;
    let mut kernel_grad = DVector::zeros(kernel().n_params());
    for (d, learner) in alone.iter().enumerate() {
        let rows: Vec<usize> = (0..data.n()).filter(|&i| data.output(i) == d).collect();
        let own = data.select(&rows);
        let own = Data::new(own.x().clone(), own.y().clone()).unwrap();
        let f = m_step_objective(learner.posterior().unwrap(), learner.likelihood(), &own, None).unwrap();
        value += f.value;
        kernel_grad += f.grad.rows(0, kernel().n_params());
    }
    assert!(
        (joint_f.value - value).abs() < 1e-6 * value.abs(),
        "F {} vs {}",
        joint_f.value,
        value
    );
    let grad_err = (joint_f.grad.rows(0, kernel().n_params()) - &kernel_grad).amax();
    assert!(
        grad_err < 1e-6 * kernel_grad.amax(),
        "kernel gradient differs by {grad_err:e}"
    );
}

/// The exact multi-output SGPR with fixed `θ` and `Z`: the inducing values of
/// all latents stacked, `u ~ N(0, I_Q ⊗ K)`, record `i` of output `d` seeing
/// `φ_iᵀu` with `φ_i = a_{·,d} ⊗ K⁻¹k_i` plus noise `σ_d²`. Returns its
/// precision `P` and mean `P⁻¹b`.
fn exact_sgpr(data: &Data, lik: &MultiOutput, z: &DMatrix<f64>, jitter: f64) -> (DMatrix<f64>, DVector<f64>) {
    let (m, q_count) = (z.nrows(), lik.n_latent());
    let k = kernel().matrix(z, z) + DMatrix::identity(m, m) * jitter;
    let k_chol = k.clone().cholesky().unwrap();
    let k_inv = k_chol.inverse();
    let mut precision = DMatrix::zeros(q_count * m, q_count * m);
    for q in 0..q_count {
        precision.view_mut((q * m, q * m), (m, m)).copy_from(&k_inv);
    }
    let mut b = DVector::zeros(q_count * m);
    let kzx = kernel().matrix(z, data.x());
    for i in 0..data.n() {
        let d = data.output(i);
        let Likelihood::Gaussian { variance } = lik.outputs[d] else {
            panic!("Gaussian outputs only")
        };
        let base = k_chol.solve(&kzx.column(i).into_owned());
        let phi = DVector::from_fn(q_count * m, |r, _| lik.mixing[(r / m, d)] * base[r % m]);
        precision += &phi * phi.transpose() / variance;
        b += &phi * (data.y()[i] / variance);
    }
    let mean = precision.clone().cholesky().unwrap().solve(&b);
    (precision, mean)
}

/// Gaussian outputs, fixed hyperparameters and `Z`: the E-step's fixed point
/// has the exact multi-output SGPR's mean of `q(u)` (mean-field leaves the
/// mean exact for a Gaussian model) and, per latent, the covariance
/// `(P_qq)⁻¹` of the mean-field optimum.
#[test]
fn gaussian_outputs_reach_the_exact_multi_output_sgpr() {
    let outputs = vec![gaussian(0.1), gaussian(0.3), gaussian(0.05)];
    let mixing = DMatrix::from_row_slice(2, 3, &[1.0, 0.6, -0.4, 0.3, -0.8, 1.1]);
    let data = records(&outputs, &mixing, 120, 3);
    let lik = MultiOutput::with_mixing(outputs, mixing).unwrap();
    let z = inducing(8);
    let mut post = DualPosterior::new(kernel(), z.clone(), 2).unwrap();
    let mut sites = PointSites::zeros(data.n(), 2);
    let wrapped = Likelihood::MultiOutput(Box::new(lik.clone()));
    e_step(
        &mut post,
        &wrapped,
        &data,
        &mut sites,
        &EStepConfig { steps: 3000, rho: 1.0 },
    )
    .unwrap();

    let (precision, mean) = exact_sgpr(&data, &lik, &z, post.jitter);
    let m = z.nrows();
    for q in 0..2 {
        let (m_u, s) = post.q_u(q);
        let want_mean = mean.rows(q * m, m).into_owned();
        let mean_err = (&m_u - &want_mean).amax() / want_mean.amax();
        let want_cov = precision
            .view((q * m, q * m), (m, m))
            .into_owned()
            .cholesky()
            .unwrap()
            .inverse();
        let cov_err = (&s - &want_cov).amax() / want_cov.amax();
        assert!(mean_err < 1e-7, "latent {q}: mean error {mean_err:e}");
        assert!(cov_err < 1e-7, "latent {q}: covariance error {cov_err:e}");
    }
}

/// Streamed in batches with every past point kept in memory, fixed `θ` and
/// `Z`, the sequential learner ends at the same exact SGPR mean: stale
/// sites of other latents would be wrong here, since a latent's Gaussian
/// site depends on the others' means.
#[test]
fn streamed_gaussian_outputs_with_full_memory_reach_the_exact_sgpr_mean() {
    let outputs = vec![gaussian(0.1), gaussian(0.3)];
    let mixing = DMatrix::from_row_slice(2, 2, &[1.0, 0.6, 0.3, -0.8]);
    let lik = MultiOutput::with_mixing(outputs.clone(), mixing.clone()).unwrap();
    let wrapped = Likelihood::MultiOutput(Box::new(lik.clone()));
    let all_past = MemoryPolicy::PerBatch {
        k: 1000,
        capacity: None,
    };
    let mut learner = fixed_learner(wrapped, all_past);
    let batches: Vec<Data> = (0..3).map(|b| records(&outputs, &mixing, 40, 20 + b)).collect();
    for batch in &batches {
        learner.update(batch).unwrap();
    }
    let x = DMatrix::from_fn(120, 1, |i, _| batches[i / 40].x()[(i % 40, 0)]);
    let y = DVector::from_fn(120, |i, _| batches[i / 40].y()[i % 40]);
    let out = (0..120).map(|i| batches[i / 40].output(i % 40)).collect();
    let all = Data::with_outputs(x, y, out).unwrap();
    let post = learner.posterior().unwrap();
    let (_, mean) = exact_sgpr(&all, &lik, &post.z, post.jitter);
    let m = post.m();
    for q in 0..2 {
        let want = mean.rows(q * m, m).into_owned();
        let err = (&post.q_u(q).0 - &want).amax() / want.amax();
        assert!(err < 1e-6, "latent {q}: mean error {err:e}");
    }
}

/// `∂F/∂θ` of the M-step objective against central differences as `θ` moves
/// with the site totals held: the kernel's log-parameters, each output's
/// likelihood parameters and every loading of the mixing matrix.
#[test]
fn m_step_gradient_in_kernel_outputs_and_mixing_matches_finite_differences() {
    let outputs = vec![
        gaussian(0.3),
        probit(),
        Likelihood::Poisson,
        Likelihood::StudentT { df: 5.0, scale: 0.4 },
    ];
    let mixing = DMatrix::from_row_slice(2, 4, &[1.0, 0.5, 0.2, -0.7, -0.4, 0.9, 0.6, 0.3]);
    let data = records(&outputs, &mixing, 80, 5);
    let mut lik = multi(outputs, mixing);
    let k = Kernel::stationary(Family::Matern52, 0.9, vec![0.7]);
    let mut post = DualPosterior::new(k, inducing(7), 2).unwrap();
    let mut sites = PointSites::zeros(data.n(), 2);
    e_step(&mut post, &lik, &data, &mut sites, &EStepConfig { steps: 4, rho: 0.6 }).unwrap();

    let analytic = m_step_objective(&post, &lik, &data, None).unwrap().grad;
    let theta = hyperparameters(&post.kernel, &lik);
    assert_eq!(theta.len(), 2 + 1 + 2 + 8, "kernel, outputs' and mixing parameters");
    let h = 1e-5;
    for p in 0..theta.len() {
        let mut value_at = |delta: f64| {
            let mut t = theta.clone();
            t[p] += delta;
            post.change_holding_totals(|kernel, _| set_hyperparameters(kernel, &mut lik, &t))
                .unwrap();
            m_step_objective(&post, &lik, &data, None).unwrap().value
        };
        let numeric = (value_at(h) - value_at(-h)) / (2.0 * h);
        let err = (analytic[p] - numeric).abs() / numeric.abs().max(1e-3);
        assert!(
            err < 1e-5,
            "parameter {p}: analytic {} vs numeric {numeric} ({err:e})",
            analytic[p]
        );
    }
}

/// Bad input: an output index the model lacks, or a label outside its
/// output's likelihood, is an error that names the row.
#[test]
fn an_output_outside_the_model_is_refused_with_its_row() {
    let lik = multi(vec![gaussian(0.1), probit()], DMatrix::identity(2, 2));
    let x = DMatrix::from_fn(3, 1, |i, _| i as f64);
    let y = DVector::from_vec(vec![0.5, 1.0, 0.2]);
    let data = Data::with_outputs(x.clone(), y.clone(), vec![0, 1, 2]).unwrap();
    let err = data.check(1, &lik).unwrap_err().to_string();
    assert!(err.contains("row 2") && err.contains("output 2"), "{err}");
    // A label outside its own output's support: 0.5 is no Bernoulli label.
    let data = Data::with_outputs(x.clone(), y.clone(), vec![1, 1, 0]).unwrap();
    let err = data.check(1, &lik).unwrap_err().to_string();
    assert!(err.contains("row 0") && err.contains("0.5"), "{err}");
    // A single-output model has output 0 only.
    let data = Data::with_outputs(x, y, vec![0, 1, 0]).unwrap();
    assert!(data.check(1, &gaussian(0.1)).is_err());
}
