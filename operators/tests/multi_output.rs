//! The multi-output (LMC) model against oracles computed here: independent
//! single-output learners (identity mixing), the exact multi-output SGPR in
//! closed form (Gaussian outputs), streamed or not, and finite differences of
//! the M-step objective in the latents' kernels, the outputs' parameters and
//! the mixing matrix.

use dualgp_operators::model::data::with_output_column;
use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::dual::objective::{hyperparameters, m_step_objective, set_hyperparameters};
use dualgp_operators::model::math::coregional::Coregional;
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

/// Q latents of their own kernels mixed by `mixing` (`Q × D`).
fn coregional(latents: Vec<Kernel>, mixing: DMatrix<f64>) -> Kernel {
    Kernel::Coregional(Coregional { latents, mixing })
}

fn gaussian(variance: f64) -> Likelihood {
    Likelihood::Gaussian { variance }
}

fn probit() -> Likelihood {
    Likelihood::Bernoulli { link: Link::Probit }
}

fn multi(outputs: Vec<Likelihood>, latents: usize) -> Likelihood {
    Likelihood::MultiOutput(Box::new(MultiOutput::new(outputs, latents).unwrap()))
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
/// mixed by `truth` (`2 × D`); inputs with the output index appended.
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
    Data::for_model(&multi(outputs.to_vec(), 2), x, y, out).unwrap()
}

/// Output `d`'s records of `data` as a single-output learner sees them.
fn own_rows(data: &Data, d: usize) -> Data {
    let rows: Vec<usize> = (0..data.n()).filter(|&i| data.output(i) == d).collect();
    let own = data.select(&rows);
    Data::new(own.x().columns(0, 1).into_owned(), own.y().clone()).unwrap()
}

fn grid(n: usize) -> DMatrix<f64> {
    DMatrix::from_fn(n, 1, |i, _| -0.2 + 3.4 * i as f64 / (n - 1) as f64)
}

fn inducing(m: usize) -> DMatrix<f64> {
    DMatrix::from_fn(m, 1, |i, _| 3.0 * i as f64 / (m - 1) as f64)
}

/// `m` inducing inputs on output `d`, shifted by `0.15 d`: several outputs
/// at one input would be linearly dependent once there are fewer latents.
fn inducing_of_output(m: usize, d: usize) -> DMatrix<f64> {
    inducing(m).add_scalar(0.15 * d as f64)
}

/// [`inducing_of_output`] on each of `outputs` outputs: `m · outputs` rows.
fn inducing_on_outputs(m: usize, outputs: usize) -> DMatrix<f64> {
    let z = DMatrix::from_fn(m * outputs, 1, |i, _| inducing_of_output(m, i / m)[(i % m, 0)]);
    with_output_column(&z, |i| i / m)
}

/// A sequential learner with fixed `Z` and fixed hyperparameters.
fn fixed_learner(kernel: Kernel, lik: Likelihood, z: DMatrix<f64>, memory: MemoryPolicy) -> SequentialLearner {
    let config = SequentialConfig {
        inducing: z.nrows(),
        inducing_policy: InducingPolicy::Fixed,
        e_step: EStepConfig { steps: 400, rho: 1.0 },
        m_steps: 0,
        memory,
        ..SequentialConfig::default()
    };
    SequentialLearner::new(kernel, lik, config)
        .unwrap()
        .with_inducing(z)
        .unwrap()
}

fn max_abs_diff(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    (a - b).amax()
}

/// Q = D with the identity mixing matrix is D independent models: learned
/// batch by batch in the same sequential learner, with each output's
/// inducing inputs those of a single-output learner that saw only its
/// output's rows, each output's predictive is that learner's.
#[test]
fn identity_mixing_equals_independent_single_output_learners() {
    let outputs = vec![gaussian(0.2), probit()];
    let truth = DMatrix::from_row_slice(2, 2, &[1.0, 0.4, 0.3, 1.5]);
    let joint_kernel = coregional(vec![kernel(), kernel()], DMatrix::identity(2, 2));
    let lik = multi(outputs.clone(), 2);
    let mut joint = fixed_learner(joint_kernel, lik, inducing_on_outputs(10, 2), MemoryPolicy::None);
    let mut alone: Vec<SequentialLearner> = outputs
        .iter()
        .enumerate()
        .map(|(d, l)| fixed_learner(kernel(), l.clone(), inducing_of_output(10, d), MemoryPolicy::None))
        .collect();
    for batch in 0..3 {
        let data = records(&outputs, &truth, 90, 10 + batch);
        joint.update(&data).unwrap();
        for (d, learner) in alone.iter_mut().enumerate() {
            learner.update(&own_rows(&data, d)).unwrap();
        }
    }
    let test = grid(30);
    for (d, learner) in alone.iter().enumerate() {
        let f = joint.posterior().unwrap().predict_f(&with_output_column(&test, |_| d));
        let g = learner.posterior().unwrap().predict_f(&test);
        let mean_err = max_abs_diff(&f.mean, &g.mean);
        let var_err = max_abs_diff(&f.var, &g.var);
        assert!(mean_err < 1e-6, "output {d}: mean differs by {mean_err:e}");
        assert!(var_err < 1e-6, "output {d}: variance differs by {var_err:e}");
    }
    // And the M-step objective is the sum of the independent ones; latent d's
    // kernel gradient is output d's learner's. The jitter (a fixed share of
    // the prior variance) follows the mean over the outputs in the joint
    // model and each output's own alone, so the variances' gradients differ
    // by the jitter's share (about 1e-5 of them here), the lengthscales' not.
    let data = records(&outputs, &truth, 60, 99);
    let joint_f = m_step_objective(joint.posterior().unwrap(), joint.likelihood(), &data, None).unwrap();
    let nk = kernel().n_params();
    let mut value = 0.0;
    for (d, learner) in alone.iter().enumerate() {
        let f = m_step_objective(
            learner.posterior().unwrap(),
            learner.likelihood(),
            &own_rows(&data, d),
            None,
        )
        .unwrap();
        value += f.value;
        for (p, tolerance) in [(0, 1e-4), (1, 1e-8)] {
            let (got, want) = (joint_f.grad[d * nk + p], f.grad[p]);
            let err = (got - want).abs() / want.abs();
            assert!(err < tolerance, "latent {d}, parameter {p}: {got} vs {want} ({err:e})");
        }
    }
    assert!(
        (joint_f.value - value).abs() < 1e-6 * value.abs(),
        "F {} vs {}",
        joint_f.value,
        value
    );
}

/// The coregional kernel's entry between two rows, from its definition:
/// `Σ_q w_q(a) w_q(b) k_q(ā, b̄)`, the last column an output index `d`
/// (weight `a_{q,d}`) or a latent's `−(q+1)` (weight 1 on that latent).
fn lmc_entry(latents: &[Kernel], mixing: &DMatrix<f64>, a: &[f64], b: &[f64]) -> f64 {
    let weight = |q: usize, index: f64| match index as i64 {
        d if d >= 0 => mixing[(q, d as usize)],
        l => f64::from(u8::from((-l - 1) as usize == q)),
    };
    let n = a.len() - 1;
    let row = |v: &[f64]| DMatrix::from_row_slice(1, n, &v[..n]);
    (0..latents.len())
        .map(|q| weight(q, a[n]) * weight(q, b[n]) * latents[q].matrix(&row(a), &row(b))[(0, 0)])
        .sum()
}

fn lmc_matrix(latents: &[Kernel], mixing: &DMatrix<f64>, a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    let rows = |m: &DMatrix<f64>| -> Vec<Vec<f64>> { m.row_iter().map(|r| r.iter().copied().collect()).collect() };
    let (ra, rb) = (rows(a), rows(b));
    DMatrix::from_fn(a.nrows(), b.nrows(), |i, j| lmc_entry(latents, mixing, &ra[i], &rb[j]))
}

/// The exact multi-output SGPR with fixed `θ` and `Z`, in closed form: the
/// inducing values `u = g(Z)` under the coregional prior `K + εI`, record
/// `i` of output `d` seeing `φ_iᵀu`, `φ_i = K⁻¹k_i`, plus noise `σ_d²`.
/// Returns the posterior's mean and covariance of `u`.
fn exact_sgpr(
    data: &Data,
    (latents, mixing): (&[Kernel], &DMatrix<f64>),
    outputs: &[Likelihood],
    z: &DMatrix<f64>,
    jitter: f64,
) -> (DVector<f64>, DMatrix<f64>) {
    let m = z.nrows();
    let k = lmc_matrix(latents, mixing, z, z) + DMatrix::identity(m, m) * jitter;
    let k_chol = k.clone().cholesky().unwrap();
    let mut precision = k_chol.inverse();
    let mut b = DVector::zeros(m);
    let kzx = lmc_matrix(latents, mixing, z, data.x());
    for i in 0..data.n() {
        let Likelihood::Gaussian { variance } = outputs[data.output(i)] else {
            panic!("Gaussian outputs only")
        };
        let phi = k_chol.solve(&kzx.column(i).into_owned());
        precision += &phi * phi.transpose() / variance;
        b += &phi * (data.y()[i] / variance);
    }
    let cov = precision.cholesky().unwrap().inverse();
    (&cov * b, cov)
}

/// Inducing inputs on every output (5 each) and on each latent itself (3 each).
fn mixed_inducing(outputs: usize, latents: usize) -> DMatrix<f64> {
    let on_outputs = inducing_on_outputs(5, outputs);
    let n = on_outputs.nrows();
    DMatrix::from_fn(n + 3 * latents, 2, |i, j| match (i.checked_sub(n), j) {
        (None, _) => on_outputs[(i, j)],
        (Some(k), 0) => 0.4 + 0.9 * (k % 3) as f64,
        (Some(k), _) => -1.0 - (k / 3) as f64,
    })
}

fn three_gaussian_outputs() -> (Vec<Likelihood>, Vec<Kernel>, DMatrix<f64>) {
    let outputs = vec![gaussian(0.1), gaussian(0.3), gaussian(0.05)];
    let latents = vec![kernel(), Kernel::stationary(Family::Matern52, 0.7, vec![1.4])];
    let mixing = DMatrix::from_row_slice(2, 3, &[1.0, 0.6, -0.4, 0.3, -0.8, 1.1]);
    (outputs, latents, mixing)
}

/// `post`'s `q(u)` (mean and covariance) within `tol` of the exact one,
/// relative to its largest entries.
fn assert_q_u_near(post: &DualPosterior, exact: (&DVector<f64>, &DMatrix<f64>), tol: f64) {
    let (m_u, s) = post.q_u(0);
    let mean_err = (&m_u - exact.0).amax() / exact.0.amax();
    let cov_err = (&s - exact.1).amax() / exact.1.amax();
    assert!(mean_err < tol, "mean error {mean_err:e}");
    assert!(cov_err < tol, "covariance error {cov_err:e}");
}

/// Gaussian outputs, fixed hyperparameters and `Z` (on the outputs and on
/// the latents): one E-step reaches the exact multi-output SGPR's `q(u)`,
/// mean and covariance, since each record's site is on its own output's
/// value and exact.
#[test]
fn gaussian_outputs_reach_the_exact_multi_output_sgpr() {
    let (outputs, latents, mixing) = three_gaussian_outputs();
    let data = records(&outputs, &mixing, 120, 3);
    let z = mixed_inducing(3, 2);
    let mut post = DualPosterior::new(coregional(latents.clone(), mixing.clone()), z.clone(), 1).unwrap();
    let mut sites = PointSites::zeros(data.n(), 1);
    let lik = multi(outputs.clone(), 2);
    e_step(&mut post, &lik, &data, &mut sites, &EStepConfig { steps: 1, rho: 1.0 }).unwrap();

    let (mean, cov) = exact_sgpr(&data, (&latents, &mixing), &outputs, &z, post.jitter);
    assert_q_u_near(&post, (&mean, &cov), 1e-7);
}

/// Streamed in batches with no memory at all, fixed `θ` and `Z`, the
/// sequential learner ends at the exact SGPR on all the data: a record's
/// Gaussian site does not depend on what the other latents learn later,
/// so nothing goes stale (mean-field sites over the latents would).
#[test]
fn streamed_gaussian_outputs_without_memory_reach_the_exact_sgpr() {
    let (outputs, latents, mixing) = three_gaussian_outputs();
    let z = mixed_inducing(3, 2);
    let lik = multi(outputs.clone(), 2);
    let mut learner = fixed_learner(
        coregional(latents.clone(), mixing.clone()),
        lik,
        z.clone(),
        MemoryPolicy::None,
    );
    let batches: Vec<Data> = (0..3).map(|b| records(&outputs, &mixing, 40, 20 + b)).collect();
    for batch in &batches {
        learner.update(batch).unwrap();
    }
    let x = DMatrix::from_fn(120, 2, |i, j| batches[i / 40].x()[(i % 40, j)]);
    let y = DVector::from_fn(120, |i, _| batches[i / 40].y()[i % 40]);
    let out = (0..120).map(|i| batches[i / 40].output(i % 40)).collect();
    let all = Data::with_outputs(x, y, out).unwrap();
    let post = learner.posterior().unwrap();
    let (mean, cov) = exact_sgpr(&all, (&latents, &mixing), &outputs, &post.z, post.jitter);
    assert_q_u_near(post, (&mean, &cov), 1e-6);
}

/// `∂F/∂θ` of the M-step objective against central differences as `θ` moves
/// with the site totals held: each latent kernel's log-parameters, every
/// loading of the mixing matrix and each output's likelihood parameters.
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
    let mut lik = multi(outputs, 2);
    let latents = vec![
        Kernel::stationary(Family::Matern52, 0.9, vec![0.7]),
        Kernel::stationary(Family::SquaredExponential, 1.1, vec![0.4]),
    ];
    let mut post = DualPosterior::new(coregional(latents, mixing), mixed_inducing(4, 2), 1).unwrap();
    let mut sites = PointSites::zeros(data.n(), 1);
    e_step(&mut post, &lik, &data, &mut sites, &EStepConfig { steps: 4, rho: 0.6 }).unwrap();

    let analytic = m_step_objective(&post, &lik, &data, None).unwrap().grad;
    let theta = hyperparameters(&post.kernel, &lik);
    assert_eq!(
        theta.len(),
        2 + 2 + 8 + 1 + 2,
        "latents', mixing and outputs' parameters"
    );
    // The loadings' third derivatives are large: the truncation error at
    // 1e-5 is a few 1e-5 of the loadings' gradients, at 1e-6 a few 1e-7.
    let h = 1e-6;
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
    let lik = multi(vec![gaussian(0.1), probit()], 2);
    let x = DMatrix::from_fn(3, 1, |i, _| i as f64);
    let y = DVector::from_vec(vec![0.5, 1.0, 0.2]);
    let data = Data::for_model(&lik, x.clone(), y.clone(), vec![0, 1, 2]).unwrap();
    let err = data.check(2, &lik).unwrap_err().to_string();
    assert!(err.contains("row 2") && err.contains("output 2"), "{err}");
    // A label outside its own output's support: 0.5 is no Bernoulli label.
    let data = Data::for_model(&lik, x.clone(), y.clone(), vec![1, 1, 0]).unwrap();
    let err = data.check(2, &lik).unwrap_err().to_string();
    assert!(err.contains("row 0") && err.contains("0.5"), "{err}");
    // A single-output model has output 0 only.
    let data = Data::with_outputs(x, y, vec![0, 1, 0]).unwrap();
    assert!(data.check(1, &gaussian(0.1)).is_err());
}
