//! The sequential learner (Algorithm 1) against batch training, closed forms
//! and the sampling law of its memory.

mod common;

use std::ops::Range;

use dualgp_operators::model::dual::blocks::m_step_sample;
use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::dual::memory::{reservoir_key, top_k};
use dualgp_operators::model::dual::point::point_uniform;
use dualgp_operators::model::dual::shard::route;
use dualgp_operators::model::{
    bayesian_leverage_scores, Data, DualPosterior, EStepConfig, Family, InducingPolicy, Kernel, Likelihood, Link,
    MemoryPolicy, Optimizer, PastInMStep, PointId, PointSites, SequentialConfig, SequentialLearner, StreamingLearner,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn kernel() -> Kernel {
    Kernel::stationary(Family::Matern52, 1.0, vec![0.8])
}

fn classification_stream(n: usize, rng: &mut ChaCha8Rng) -> Data {
    let x = DMatrix::<f64>::from_fn(n, 2, |_, _| rng.random_range(-2.0..2.0));
    let y = DVector::from_fn(n, |i, _| {
        f64::from((x[(i, 0)] * x[(i, 1)]).sin() + 0.3 * rng.random::<f64>() > 0.1)
    });
    Data::new(x, y).unwrap()
}

/// The rows `range` of `data`.
fn rows(data: &Data, range: Range<usize>) -> Data {
    data.select(&range.collect::<Vec<_>>())
}

/// A probit classifier on [`kernel`].
fn classifier(config: SequentialConfig) -> SequentialLearner {
    SequentialLearner::new(kernel(), Likelihood::Bernoulli { link: Link::Probit }, config).unwrap()
}

fn max_rel(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-6))
        .fold(0.0, f64::max)
}

const CONVERGED: EStepConfig = EStepConfig { steps: 60, rho: 1.0 };

#[test]
fn with_all_past_data_in_memory_the_stream_equals_batch_training() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let stream = classification_stream(240, &mut rng);
    let test = classification_stream(50, &mut rng).x().clone();
    let z = DMatrix::from_fn(15, 2, |_, _| rng.random_range(-2.0..2.0));
    let lik = Likelihood::Bernoulli { link: Link::Probit };
    let config = SequentialConfig {
        inducing: 15,
        inducing_policy: InducingPolicy::Fixed,
        e_step: CONVERGED,
        m_steps: 0,
        memory: MemoryPolicy::PerBatch {
            k: 1000,
            capacity: None,
        },
        ..SequentialConfig::default()
    };
    let mut learner = SequentialLearner::new(kernel(), lik.clone(), config)
        .unwrap()
        .with_inducing(z.clone())
        .unwrap();
    for (b, start) in (0..stream.n()).step_by(40).enumerate() {
        learner.update(&rows(&stream, start..start + 40)).unwrap();

        let seen = rows(&stream, 0..start + 40);
        let mut batch = DualPosterior::new(kernel(), z.clone(), 1).unwrap();
        e_step(&mut batch, &lik, &seen, &mut PointSites::zeros(seen.n(), 1), &CONVERGED).unwrap();

        let (got, want) = (learner.posterior().unwrap().predict_f(&test), batch.predict_f(&test));
        let (e_mean, e_var) = (max_rel(&got.mean, &want.mean), max_rel(&got.var, &want.var));
        assert!(
            e_mean < 1e-8 && e_var < 1e-8,
            "batch {b}: mean error {e_mean:e}, variance error {e_var:e}"
        );
        assert_eq!(learner.memory.len(), seen.n());
    }
}

/// A posterior over `m` random inducing inputs after an E-step on 100
/// classification points.
fn fitted_posterior(m: usize, rng: &mut ChaCha8Rng) -> DualPosterior {
    let data = classification_stream(100, rng);
    let z = DMatrix::from_fn(m, 2, |_, _| rng.random_range(-2.0..2.0));
    let lik = Likelihood::Bernoulli { link: Link::Logit };
    let mut post = DualPosterior::new(kernel(), z, 1).unwrap();
    e_step(
        &mut post,
        &lik,
        &data,
        &mut PointSites::zeros(100, 1),
        &EStepConfig::default(),
    )
    .unwrap();
    post
}

#[test]
fn projection_onto_unchanged_inducing_inputs_is_the_identity() {
    let post = fitted_posterior(12, &mut ChaCha8Rng::seed_from_u64(11));
    let z = post.z.clone();
    let mut moved = post.clone();
    let p = moved.move_inducing(z).unwrap();
    assert!(
        (&p - DMatrix::identity(12, 12)).amax() < 1e-8,
        "P − I = {:e}",
        (&p - DMatrix::identity(12, 12)).amax()
    );
    let (sites, before) = (&moved.whitened[0], &post.whitened[0]);
    let l_err = (&sites.l - &before.l).amax() / before.l.amax();
    let lambda_err = (&sites.lambda - &before.lambda).amax() / before.lambda.amax();
    assert!(l_err < 1e-8 && lambda_err < 1e-8, "l {l_err:e}, Λ {lambda_err:e}");
}

/// Past data speaks only about the old inducing values, which stay among the
/// new ones: adding inducing inputs must leave every prediction as it was.
#[test]
fn projection_onto_more_inducing_inputs_keeps_the_predictions() {
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    let post = fitted_posterior(8, &mut rng);
    let z = post.z.clone();
    let more = DMatrix::from_fn(
        13,
        2,
        |i, j| if i < 8 { z[(i, j)] } else { rng.random_range(-2.0..2.0) },
    );
    let mut moved = post.clone();
    moved.move_inducing(more).unwrap();
    assert_eq!(moved.m(), 13);
    let test = DMatrix::from_fn(40, 2, |_, _| rng.random_range(-3.0..3.0));
    common::assert_predicts_as((&moved, &post), &test, (max_rel, 1e-9), "");
}

#[test]
fn gaussian_bls_is_the_ridge_leverage_score() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let n = 30;
    let x = DMatrix::<f64>::from_fn(n, 2, |_, _| rng.random_range(-3.0..3.0));
    let y = DVector::from_fn(n, |i, _| x[(i, 0)].cos() + 0.1 * rng.random::<f64>());
    let data = Data::new(x.clone(), y).unwrap();
    let noise = 0.05;
    let (variance, lengthscale) = (1.0, 0.8);
    let se = Kernel::stationary(Family::SquaredExponential, variance, vec![lengthscale]);
    let lik = Likelihood::Gaussian { variance: noise };
    let mut post = DualPosterior::new(se, x.clone(), 1).unwrap();
    post.jitter = 0.0;
    post.refresh().unwrap();
    e_step(
        &mut post,
        &lik,
        &data,
        &mut PointSites::zeros(n, 1),
        &EStepConfig { steps: 1, rho: 1.0 },
    )
    .unwrap();
    let bls = bayesian_leverage_scores(&post, &lik, &data);

    // Ridge leverage scores diag(K (K + σ²I)⁻¹), with the kernel written out here.
    let k = DMatrix::from_fn(n, n, |i, j| {
        let r2 = (x[(i, 0)] - x[(j, 0)]).powi(2) + (x[(i, 1)] - x[(j, 1)]).powi(2);
        variance * (-0.5 * r2 / (lengthscale * lengthscale)).exp()
    });
    let ridge = (&k + DMatrix::identity(n, n) * noise).cholesky().unwrap().solve(&k);
    for i in 0..n {
        let err = (bls[i] - ridge[(i, i)]).abs() / ridge[(i, i)];
        assert!(
            err < 1e-7,
            "point {i}: BLS {} vs ridge leverage {}",
            bls[i],
            ridge[(i, i)]
        );
    }
}

/// With capacity 1, BLS-weighted reservoir sampling keeps item i with
/// probability w_i / Σw exactly, whatever the batching. A chi-square test at a
/// false-alarm rate of 0.1 % (4 degrees of freedom: critical value 18.47), on
/// fixed seeds; the uniform draws are the learner's own per-point ones.
#[test]
fn reservoir_keeps_points_in_proportion_to_their_scores() {
    let weights = [1.0, 2.0, 3.0, 4.0, 10.0];
    let batches: [&[usize]; 2] = [&[0, 1], &[2, 3, 4]];
    let trials = 20_000;
    let mut counts = [0usize; 5];
    for seed in 0..trials {
        let mut kept: Vec<(usize, f64)> = Vec::new();
        for (b, batch) in batches.iter().enumerate() {
            let mut all = kept.clone();
            all.extend(batch.iter().map(|&i| {
                let u = point_uniform(
                    seed,
                    PointId {
                        batch: b as u64,
                        id: i as i64,
                    },
                );
                (i, reservoir_key(weights[i], u))
            }));
            let keys: Vec<f64> = all.iter().map(|p| p.1).collect();
            kept = top_k(&keys, 1).into_iter().map(|j| all[j]).collect();
        }
        counts[kept[0].0] += 1;
    }
    let total: f64 = weights.iter().sum();
    let chi2: f64 = counts
        .iter()
        .zip(weights)
        .map(|(&c, w)| {
            let expected = trials as f64 * w / total;
            (c as f64 - expected).powi(2) / expected
        })
        .sum();
    assert!(chi2 < 18.47, "chi-square {chi2:.2} for counts {counts:?}");
}

#[test]
fn bounded_memory_keeps_its_capacity() {
    let stream = classification_stream(400, &mut ChaCha8Rng::seed_from_u64(14));
    let mut learner = classifier(SequentialConfig {
        inducing: 20,
        inducing_policy: InducingPolicy::Pivoted,
        e_step: EStepConfig { steps: 3, rho: 0.8 },
        m_steps: 5,
        memory: MemoryPolicy::Reservoir { capacity: 25 },
        ..SequentialConfig::default()
    });
    let mut moved = 0;
    for start in (0..400).step_by(50) {
        let report = learner.update(&rows(&stream, start..start + 50)).unwrap();
        moved += usize::from(report.moved_inducing);
        assert!(learner.memory.len() <= 25);
    }
    assert_eq!(learner.memory.len(), 25);
    assert!(moved > 0, "pivoted Cholesky never moved Z on a 2-D stream");
    assert_eq!(learner.n_seen, 400);
}

/// Over 40 seeds, 8 batches of 50 learned with `memory`, whose size after
/// batch `b` must be `size(b)`: how many memory points each batch holds at
/// the end, checked to be 25/8 on average by a chi-square test (7 degrees of
/// freedom, false-alarm rate 0.1 %: critical value 24.32).
fn assert_the_memory_samples_batches_uniformly(memory: MemoryPolicy, size: impl Fn(usize) -> usize) {
    let stream = classification_stream(400, &mut ChaCha8Rng::seed_from_u64(15));
    let mut counts = [0usize; 8];
    let seeds = 40;
    for seed in 0..seeds {
        let mut learner = classifier(SequentialConfig {
            inducing: 10,
            e_step: EStepConfig { steps: 1, rho: 0.8 },
            m_steps: 0,
            memory,
            seed,
            ..SequentialConfig::default()
        });
        for (b, start) in (0..400).step_by(50).enumerate() {
            learner.update(&rows(&stream, start..start + 50)).unwrap();
            assert_eq!(learner.memory.len(), size(b), "after batch {b}");
        }
        for p in &learner.memory.points {
            counts[p.id.batch as usize] += 1;
        }
    }
    let expected = (seeds * 25) as f64 / 8.0;
    let chi2: f64 = counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
    assert!(chi2 < 24.32, "chi-square {chi2:.2} for counts per batch {counts:?}");
}

/// A uniform reservoir of capacity c over N points keeps each point with
/// probability c/N whatever batch it came in; a per-batch memory would put
/// 25 in the last batch and fail the test.
#[test]
fn a_random_memory_of_bounded_capacity_samples_the_whole_stream_uniformly() {
    let memory = MemoryPolicy::RandomReservoir { capacity: 25 };
    assert_the_memory_samples_batches_uniformly(memory, |b| (50 * (b + 1)).min(25));
}

/// A per-batch memory with a bound stays a uniform sample of the stream once
/// full: 5 points of each batch of 50 compete on their keys with the old
/// ones for 25 places. Keeping the newest would leave the first three
/// batches empty and fail the test; the unbounded memory would hold 40.
#[test]
fn a_bounded_per_batch_memory_stays_a_uniform_sample_of_the_stream() {
    let memory = MemoryPolicy::Random {
        k: 5,
        capacity: Some(25),
    };
    assert_the_memory_samples_batches_uniformly(memory, |b| (5 * (b + 1)).min(25));
}

#[test]
fn a_checkpoint_round_trips_through_serde() {
    let stream = classification_stream(120, &mut ChaCha8Rng::seed_from_u64(15));
    let mut learner = classifier(SequentialConfig {
        inducing: 10,
        ..SequentialConfig::default()
    });
    learner.update(&rows(&stream, 0..60)).unwrap();
    let json = serde_json::to_string(&learner).unwrap();
    let mut restored: SequentialLearner = serde_json::from_str(&json).unwrap();
    restored.ensure_factors().unwrap();
    let next = rows(&stream, 60..120);
    learner.update(&next).unwrap();
    restored.update(&next).unwrap();
    let (a, b) = (learner.posterior().unwrap(), restored.posterior().unwrap());
    let x = stream.x();
    let err = max_rel(&a.predict_f(x).mean, &b.predict_f(x).mean);
    assert!(err < 1e-10, "restored learner diverged: {err:e}");
}

#[test]
fn an_update_gives_the_same_bits_on_any_number_of_threads() {
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    let x = DMatrix::<f64>::from_fn(300, 2, |_, _| rng.random_range(-2.0..2.0));
    let y = DVector::from_fn(300, |i, _| {
        f64::from(u8::from(x[(i, 0)] > 0.0) + u8::from(x[(i, 1)] > 0.5))
    });
    let stream = Data::new(x, y).unwrap();
    let learn = |threads: usize| {
        let config = SequentialConfig {
            inducing: 15,
            learn_inducing: true,
            m_steps: 5,
            optimizer: Optimizer::Lbfgs { history: 5 },
            memory: MemoryPolicy::PerBatch {
                k: 20,
                capacity: Some(40),
            },
            ..SequentialConfig::default()
        };
        let softmax = Likelihood::Softmax {
            classes: 3,
            samples: 8,
            seed: 1,
        };
        let mut learner = SequentialLearner::new(kernel(), softmax, config)
            .unwrap()
            .on_threads(threads);
        for batch in 0..3 {
            learner.update(&rows(&stream, 100 * batch..100 * (batch + 1))).unwrap();
        }
        let post = learner.posterior().unwrap().predict_f(stream.x());
        (learner.kernel().clone(), post.mean, post.var)
    };
    let one = learn(1);
    for threads in [2, 3] {
        assert!(learn(threads) == one, "{threads} threads changed the update");
    }
}

/// Titsias' (2009) collapsed bound for a squared-exponential kernel and
/// Gaussian noise, `log θ = [log variance, log ℓ, log σ²]`, written out densely.
/// The squared-exponential `K(a, b)` under log-hyperparameters `[variance, lengthscale, noise]`.
fn se(log_theta: &[f64], a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    let (variance, ell) = (log_theta[0].exp(), log_theta[1].exp());
    DMatrix::from_fn(a.nrows(), b.nrows(), |i, j| {
        let r2: f64 = (0..a.ncols()).map(|k| (a[(i, k)] - b[(j, k)]).powi(2)).sum();
        variance * (-0.5 * r2 / (ell * ell)).exp()
    })
}

fn collapsed_bound(data: &Data, z: &DMatrix<f64>, log_theta: &[f64], relative_jitter: f64) -> f64 {
    collapsed_bound_after(None, data, z, log_theta, relative_jitter)
}

/// Titsias's collapsed bound on `data` under `log_theta`, with `past` (data
/// and the hyperparameters it was learned under) standing as its exact
/// message about `u`: pseudo-observations `y_p = A_p u + ε`, `A_p = K_pz K₀⁻¹`,
/// `ε ~ N(0, σ₀²)`, all under `θ₀`. Dense linear algebra, independent of the
/// learner; up to a constant in `θ`.
fn collapsed_bound_after(
    past: Option<(&Data, &[f64])>,
    data: &Data,
    z: &DMatrix<f64>,
    log_theta: &[f64],
    relative_jitter: f64,
) -> f64 {
    let m = z.nrows();
    let noise = log_theta[2].exp();
    // The jitter is a fixed fraction of the kernel's variance, as the learner keeps it.
    let k_of = |t: &[f64]| se(t, z, z) + DMatrix::identity(m, m) * (relative_jitter * t[0].exp());
    let k = k_of(log_theta);
    // Rows of A (inputs to u), targets and noise of every observation, past first.
    let a_now = k
        .clone()
        .cholesky()
        .unwrap()
        .solve(&se(log_theta, z, data.x()))
        .transpose();
    let (a, y, noises) = match past {
        None => (a_now, data.y().clone_owned(), vec![noise; data.n()]),
        Some((old, theta0)) => {
            let a_old = k_of(theta0)
                .cholesky()
                .unwrap()
                .solve(&se(theta0, z, old.x()))
                .transpose();
            let mut a = DMatrix::zeros(old.n() + data.n(), m);
            a.rows_mut(0, old.n()).copy_from(&a_old);
            a.rows_mut(old.n(), data.n()).copy_from(&a_now);
            let y = DVector::from_iterator(old.n() + data.n(), old.y().iter().chain(data.y().iter()).copied());
            let noises = [vec![theta0[2].exp(); old.n()], vec![noise; data.n()]].concat();
            (a, y, noises)
        }
    };
    let n = y.len();
    let cov = (&a * &k * a.transpose() + DMatrix::from_diagonal(&DVector::from_vec(noises)))
        .cholesky()
        .unwrap();
    let log_det: f64 = 2.0 * cov.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    let quad = y.dot(&cov.solve(&y));
    let q_diag =
        (se(log_theta, z, data.x()).transpose() * k.cholesky().unwrap().solve(&se(log_theta, z, data.x()))).trace();
    let trace = data.n() as f64 * log_theta[0].exp() - q_diag;
    -0.5 * (n as f64 * (2.0 * std::f64::consts::PI).ln() + log_det + quad) - 0.5 * trace / noise
}

/// `|∇f|` at `t` by central differences.
fn gradient_norm(f: &impl Fn(&[f64]) -> f64, t: &[f64]) -> f64 {
    let h = 1e-5;
    (0..t.len())
        .map(|i| {
            let (mut up, mut down) = (t.to_vec(), t.to_vec());
            up[i] += h;
            down[i] -= h;
            ((f(&up) - f(&down)) / (2.0 * h)).powi(2)
        })
        .sum::<f64>()
        .sqrt()
}

/// `n` noisy draws of a smooth surface on `[-3, 3]²`.
fn wave(n: usize, seed: u64) -> Data {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = DMatrix::<f64>::from_fn(n, 2, |_, _| rng.random_range(-3.0..3.0));
    let y = DVector::from_fn(n, |i, _| {
        (1.5 * x[(i, 0)]).sin() * x[(i, 1)].cos() + 0.3 * rng.random::<f64>()
    });
    Data::new(x, y).unwrap()
}

/// Log-hyperparameters `[variance, lengthscale, noise]` the re-learning tests start from.
const START: [f64; 3] = [0.0, 0.0, -std::f64::consts::LN_2];

/// A squared-exponential learner at [`START`] on fixed `z`, with exact
/// Gaussian E-steps, the re-learning L-BFGS M-step and no memory.
fn relearning(z: &DMatrix<f64>, m_steps: usize, past_in_m_step: PastInMStep) -> SequentialLearner {
    let config = SequentialConfig {
        inducing: z.nrows(),
        inducing_policy: InducingPolicy::Fixed,
        e_step: EStepConfig { steps: 1, rho: 1.0 },
        m_steps,
        // To the stationary point, not a tenth of a nat short of it.
        m_tolerance: 0.0,
        relearn_in_m_step: true,
        past_in_m_step,
        optimizer: Optimizer::Lbfgs { history: 10 },
        memory: MemoryPolicy::None,
        ..SequentialConfig::default()
    };
    let kernel = Kernel::stationary(Family::SquaredExponential, START[0].exp(), vec![START[1].exp()]);
    let likelihood = Likelihood::Gaussian {
        variance: START[2].exp(),
    };
    SequentialLearner::new(kernel, likelihood, config)
        .unwrap()
        .with_inducing(z.clone())
        .unwrap()
}

/// The learner's jitter as a fraction of its kernel's variance.
fn relative_jitter(learner: &SequentialLearner) -> f64 {
    let post = learner.posterior().unwrap();
    post.jitter / post.kernel.prior_variance()
}

/// The learner's hyperparameters improve `bound` on [`START`] and sit at its stationary point.
fn assert_at_stationary_point(learner: &SequentialLearner, bound: impl Fn(&[f64]) -> f64) {
    let learned: Vec<f64> = learner.hyperparameters().iter().map(|(_, v)| v.ln()).collect();
    assert_climbs_to_flat(bound, &START, &learned, 1e-5);
}

/// `bound` is more than 1 higher at `learned` than at `start`, and its
/// gradient there is below `ratio` of the start's.
fn assert_climbs_to_flat(bound: impl Fn(&[f64]) -> f64, start: &[f64], learned: &[f64], ratio: f64) {
    assert!(bound(learned) > bound(start) + 1.0, "{learned:?}");
    let (at_start, at_learned) = (gradient_norm(&bound, start), gradient_norm(&bound, learned));
    assert!(
        at_learned < ratio * at_start,
        "|∇| {at_start:e} at the start, {at_learned:e} at {learned:?}"
    );
}

#[test]
fn a_relearning_m_step_reaches_a_stationary_point_of_the_collapsed_bound() {
    // Re-learning the batch at every θ the M-step tries makes it climb the
    // collapsed bound itself: one round ends at its stationary point.
    let data = wave(150, 16);
    let z = data.x().rows(0, 40).into_owned();
    let mut learner = relearning(&z, 100, PastInMStep::ScaledMemory);
    learner.update(&data).unwrap();
    let jitter = relative_jitter(&learner);
    assert_at_stationary_point(&learner, |t| collapsed_bound(&data, &z, t, jitter));
}

/// A first batch learned under θ₀ = START in message mode, and the learner
/// set for a 100-iteration M-step on the second: (learner, first, second, Z).
fn first_batch_as_a_message() -> (SequentialLearner, Data, Data, DMatrix<f64>) {
    let data = wave(300, 17);
    let (first, second) = (rows(&data, 0..150), rows(&data, 150..300));
    let z = first.x().rows(0, 40).into_owned();
    let mut learner = relearning(&z, 0, PastInMStep::Message);
    learner.update(&first).unwrap();
    learner.config.m_steps = 100;
    (learner, first, second, z)
}

#[test]
fn with_past_data_as_its_message_the_m_step_reaches_the_online_collapsed_bound() {
    // A first batch learned under θ₀ = START leaves its exact message about u;
    // the second batch's M-step, holding that message, must climb the
    // collapsed bound in which the first batch stands as pseudo-observations
    // of u (Bui et al. 2017), built here with dense algebra.
    let (mut learner, first, second, z) = first_batch_as_a_message();
    learner.update(&second).unwrap();
    let jitter = relative_jitter(&learner);
    assert_at_stationary_point(&learner, |t| {
        collapsed_bound_after(Some((&first, &START)), &second, &z, t, jitter)
    });
}

/// Bui et al.'s collapsed bound on `data` when past data's message was
/// formed over other inducing inputs `z_a`: past data are pseudo-observations
/// `y_p = A_p f(Z_a) + ε`, `A_p = K_pa K₀⁻¹` under `θ₀`, and `f(Z_a)` is seen
/// from `u = f(Z)` as Titsias sees any function values: the Gaussian of
/// `B Q Bᵀ + Σ` (`B` stacks `A_p` and the identity) less `½ tr(Σ⁻¹B(K − Q)Bᵀ)`.
/// Dense, independent of the learner; up to a constant in `θ` and `Z`.
fn collapsed_bound_over_moved_inputs(
    (old, theta0, z_a): (&Data, &[f64], &DMatrix<f64>),
    data: &Data,
    z: &DMatrix<f64>,
    log_theta: &[f64],
    relative_jitter: f64,
) -> f64 {
    let jittered = |t: &[f64], a: &DMatrix<f64>| {
        se(t, a, a) + DMatrix::identity(a.nrows(), a.nrows()) * (relative_jitter * t[0].exp())
    };
    let (noise, noise0) = (log_theta[2].exp(), theta0[2].exp());
    let a_p = jittered(theta0, z_a)
        .cholesky()
        .unwrap()
        .solve(&se(theta0, z_a, old.x()))
        .transpose();
    let k = jittered(log_theta, z).cholesky().unwrap();
    // Function values: f(Z_a), then the batch's.
    let inputs = DMatrix::from_fn(z_a.nrows() + data.n(), z.ncols(), |i, j| {
        if i < z_a.nrows() {
            z_a[(i, j)]
        } else {
            data.x()[(i - z_a.nrows(), j)]
        }
    });
    let k_fu = se(log_theta, &inputs, z);
    let q = &k_fu * k.solve(&k_fu.transpose());
    let mut residual = jittered(log_theta, &inputs) - &q;
    residual
        .view_mut((z_a.nrows(), z_a.nrows()), (data.n(), data.n()))
        .fill_diagonal(0.0);
    let (n_old, na) = (old.n(), z_a.nrows());
    let mut b = DMatrix::zeros(n_old + data.n(), na + data.n());
    b.view_mut((0, 0), (n_old, na)).copy_from(&a_p);
    b.view_mut((n_old, na), (data.n(), data.n())).fill_with_identity();
    let noises = DVector::from_iterator(
        n_old + data.n(),
        (0..n_old + data.n()).map(|i| if i < n_old { noise0 } else { noise }),
    );
    let y = DVector::from_iterator(n_old + data.n(), old.y().iter().chain(data.y().iter()).copied());
    let cov = (&b * &q * b.transpose() + DMatrix::from_diagonal(&noises))
        .cholesky()
        .unwrap();
    let log_det: f64 = 2.0 * cov.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    // The batch's own residual variances: K's diagonal less Q's.
    let batch_trace: f64 = (0..data.n()).map(|i| log_theta[0].exp() - q[(na + i, na + i)]).sum();
    let past = &a_p * residual.view((0, 0), (na, na)) * a_p.transpose();
    let y_part = y.dot(&cov.solve(&y));
    -0.5 * ((n_old + data.n()) as f64 * (2.0 * std::f64::consts::PI).ln() + log_det + y_part)
        - 0.5 * past.trace() / noise0
        - 0.5 * batch_trace / noise
}

#[test]
fn an_m_step_that_moves_z_reaches_a_stationary_point_of_the_online_bound_in_theta_and_z() {
    // With `learn_inducing` the second batch's M-step climbs Bui et al.'s
    // bound in θ and Z together, the first batch's message held over the
    // inputs it was formed on: at its end the dense bound is flat in both.
    let (mut learner, first, second, z_a) = first_batch_as_a_message();
    learner.config.learn_inducing = true;
    // 83 parameters rather than 3: a hundred iterations end at 4e-3 of the start's gradient.
    learner.config.m_steps = 300;
    learner.update(&second).unwrap();
    let jitter = relative_jitter(&learner);
    let n_theta = START.len();
    let bound = |p: &[f64]| {
        let z = DMatrix::from_column_slice(z_a.nrows(), z_a.ncols(), &p[n_theta..]);
        collapsed_bound_over_moved_inputs((&first, &START, &z_a), &second, &z, &p[..n_theta], jitter)
    };
    let start: Vec<f64> = START.iter().chain(z_a.iter()).copied().collect();
    let z = &learner.posterior().unwrap().z;
    assert!(z != &z_a, "the inducing inputs stayed where they were");
    let learned: Vec<f64> = learner
        .hyperparameters()
        .iter()
        .map(|(_, v)| v.ln())
        .chain(z.iter().copied())
        .collect();
    // The search ends once an iteration gains less than 1e-10 of F; how flat
    // the bound is there, rounding decides: 4e-5 and 1.2e-4 of the start's
    // gradient for two orders of the same sums.
    assert_climbs_to_flat(bound, &start, &learned, 3e-4);
}

#[test]
fn an_m_step_on_a_sample_climbs_the_bound_in_which_the_rest_stand_as_past_data() {
    // The points left out of the M-step's sample join past data's message:
    // the bound it climbs holds them as pseudo-observations under θ₀, as it
    // holds the first batch, and the sample as data.
    let (mut learner, first, second, z) = first_batch_as_a_message();
    learner.config.m_sample = Some(75);
    // `update` knows the second batch's records by their row index.
    let sample = m_step_sample(0..150, 75, learner.config.seed, 1);
    let (inside, outside): (Vec<usize>, Vec<usize>) = (0..150).partition(|&i| sample.contains(route(i as i64)));
    assert!(
        (75..120).contains(&inside.len()),
        "{} points in the sample",
        inside.len()
    );
    learner.update(&second).unwrap();
    // Past data: the first batch, then the second batch's points left out.
    let left_out = second.select(&outside);
    let x = DMatrix::from_fn(first.n() + left_out.n(), 2, |i, j| {
        if i < first.n() {
            first.x()[(i, j)]
        } else {
            left_out.x()[(i - first.n(), j)]
        }
    });
    let y = DVector::from_iterator(x.nrows(), first.y().iter().chain(left_out.y().iter()).copied());
    let past = Data::new(x, y).unwrap();
    let sampled = second.select(&inside);
    let jitter = relative_jitter(&learner);
    assert_at_stationary_point(&learner, |t| {
        collapsed_bound_after(Some((&past, &START)), &sampled, &z, t, jitter)
    });
}

/// A learner on fixed `z` whose M-steps (L-BFGS over `θ`, the batch
/// re-learned at each, past data as a message) wait for `m_every` records.
/// (A search over `Z` too would amplify rounding by about 10⁴ an iteration.)
fn waiting(z: &DMatrix<f64>, m_every: usize) -> SequentialLearner {
    let config = SequentialConfig {
        inducing: z.nrows(),
        inducing_policy: InducingPolicy::Fixed,
        e_step: EStepConfig { steps: 1, rho: 1.0 },
        m_steps: 8,
        m_tolerance: 0.0,
        m_every,
        relearn_in_m_step: true,
        past_in_m_step: PastInMStep::Message,
        optimizer: Optimizer::Lbfgs { history: 10 },
        memory: MemoryPolicy::None,
        ..SequentialConfig::default()
    };
    let likelihood = Likelihood::Gaussian { variance: 0.1 };
    SequentialLearner::new(kernel(), likelihood, config)
        .unwrap()
        .with_inducing(z.clone())
        .unwrap()
}

fn theta(learner: &SequentialLearner) -> DMatrix<f64> {
    DMatrix::from_iterator(1, 3, learner.hyperparameters().into_iter().map(|p| p.1))
}

#[test]
fn records_held_between_m_steps_are_learned_again_with_the_next_batch_as_one() {
    let stream = wave(400, 21);
    let z = DMatrix::from_fn(12, 2, |i, j| ((3 * i + 5 * j) % 7) as f64 - 3.0);
    let ids: Vec<i64> = (0..400).collect();
    let first = rows(&stream, 0..200);
    let mut held = waiting(&z, 200);
    let mut at_once = waiting(&z, 0);
    for learner in [&mut held, &mut at_once] {
        assert!(learner.update_with_ids(&ids[..200], &first).unwrap().m_evaluations > 0);
    }
    for start in (200..400).step_by(50) {
        let report = held
            .update_with_ids(&ids[start..start + 50], &rows(&stream, start..start + 50))
            .unwrap();
        assert_eq!(report.m_evaluations > 0, start == 350, "update from row {start}");
        assert_eq!(held.pending.len(), (start - 150) % 200);
    }
    at_once.update_with_ids(&ids[200..], &rows(&stream, 200..400)).unwrap();

    let err = max_rel(&theta(&held), &theta(&at_once));
    assert!(err < 1e-6, "hyperparameters differ by {err:e}");
    let test = wave(50, 22).x().clone();
    let (a, b) = (
        held.posterior().unwrap().predict_f(&test),
        at_once.posterior().unwrap().predict_f(&test),
    );
    let (e_mean, e_var) = (max_rel(&a.mean, &b.mean), max_rel(&a.var, &b.var));
    assert!(e_mean < 1e-6 && e_var < 1e-6, "mean {e_mean:e}, variance {e_var:e}");
}

#[test]
fn between_m_steps_a_batch_is_learned_exactly_and_held_through_a_checkpoint() {
    let stream = wave(300, 23);
    let z = DMatrix::from_fn(10, 2, |i, j| ((2 * i + 3 * j) % 7) as f64 - 3.0);
    let mut learner = waiting(&z, 1000);
    learner.update(&rows(&stream, 0..150)).unwrap();
    let learned = theta(&learner);
    for start in (150..250).step_by(50) {
        assert_eq!(
            learner.update(&rows(&stream, start..start + 50)).unwrap().m_evaluations,
            0
        );
    }
    assert_eq!(theta(&learner), learned, "no M-step since the first");
    // Fixed θ and Z, a Gaussian likelihood: the sites are exact, so the
    // posterior is the closed-form one of every record seen.
    let post = learner.posterior().unwrap();
    let mut exact = DualPosterior::new(post.kernel.clone(), z.clone(), 1).unwrap();
    let seen = rows(&stream, 0..250);
    let lik = learner.likelihood.clone();
    let one_step = EStepConfig { steps: 1, rho: 1.0 };
    e_step(&mut exact, &lik, &seen, &mut PointSites::zeros(250, 1), &one_step).unwrap();
    let test = stream.x();
    let (got, want) = (post.predict_f(test), exact.predict_f(test));
    let (e_mean, e_var) = (max_rel(&got.mean, &want.mean), max_rel(&got.var, &want.var));
    assert!(e_mean < 1e-9 && e_var < 1e-9, "mean {e_mean:e}, variance {e_var:e}");

    // The held records travel in a checkpoint and are learned again from it.
    let mut restored: SequentialLearner = serde_json::from_str(&serde_json::to_string(&learner).unwrap()).unwrap();
    restored.ensure_factors().unwrap();
    assert_eq!(restored.pending, learner.pending);
    let last = rows(&stream, 250..300);
    for l in [&mut learner, &mut restored] {
        assert!(l.update(&last).unwrap().m_evaluations > 0);
    }
    let (a, b) = (
        learner.posterior().unwrap().predict_f(test),
        restored.posterior().unwrap().predict_f(test),
    );
    assert!(a.mean == b.mean && a.var == b.var, "a restored learner diverged");
}

#[test]
fn m_steps_come_as_the_records_double_then_every_m_every_records() {
    let stream = wave(1200, 24);
    let z = DMatrix::from_fn(8, 2, |i, j| ((i + 3 * j) % 5) as f64 - 2.0);
    let config = SequentialConfig {
        m_every: 400,
        m_steps: 2,
        ..waiting(&z, 0).config
    };
    let mut learner = SequentialLearner::new(kernel(), Likelihood::Gaussian { variance: 0.1 }, config)
        .unwrap()
        .with_inducing(z)
        .unwrap();
    let mut with_m_steps = Vec::new();
    for (update, start) in (0..1200).step_by(30).enumerate() {
        if learner.update(&rows(&stream, start..start + 30)).unwrap().m_evaluations > 0 {
            with_m_steps.push((update + 1) * 30);
        }
    }
    // Each M-step once the records since the last match those before it,
    // then once they reach 400 (the first batch to: 900).
    assert_eq!(with_m_steps, [30, 60, 120, 240, 480, 900]);
}

#[test]
fn a_batch_on_new_ground_takes_its_m_steps_at_once() {
    // Records from the left of the plane, then from far to its right: Z,
    // placed on the left, explains little there.
    let stream = wave(600, 25);
    let shifted = |rows_of: Data, by: f64| {
        let x = rows_of.x().map(|v| v + by);
        Data::new(x, rows_of.y().clone()).unwrap()
    };
    let z = DMatrix::from_fn(10, 2, |i, j| ((2 * i + 3 * j) % 7) as f64 - 3.0);
    let mut learner = waiting(&z, 100_000);
    learner.config.inducing_policy = InducingPolicy::Pivoted;
    let mut with_m_steps = Vec::new();
    for (update, start) in (0..600).step_by(100).enumerate() {
        let batch = rows(&stream, start..start + 100);
        let batch = if start >= 400 { shifted(batch, 12.0) } else { batch };
        if learner.update(&batch).unwrap().m_evaluations > 0 {
            with_m_steps.push(update);
        }
    }
    // As the records double: the first, second and fourth (the third held).
    // The fifth, 100 records after 400, is on new ground: at once. The
    // sixth, there too, is held: the fifth's M-step moved Z there.
    assert_eq!(with_m_steps, [0, 1, 3, 4]);
}
