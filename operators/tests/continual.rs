//! A class-incremental stream (tasks of two new classes each, one softmax over
//! all of them) through the sequential learner with θ fixed: which update
//! steps keep what the batch posterior knows, and that a new class is learned.

use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::{
    Data, DualPosterior, EStepConfig, Family, InducingPolicy, Kernel, Likelihood, MemoryPolicy, OsgprConfig,
    OsgprInducing, OsgprLearner, PointSites, SequentialConfig, SequentialLearner, StreamingLearner,
};
use nalgebra::{DMatrix, DVector};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

const D: usize = 6;
const TASKS: usize = 3;
const CLASSES: usize = 2 * TASKS;

fn kernel() -> Kernel {
    Kernel::stationary(Family::Matern52, 1.0, vec![(D as f64).sqrt()])
}

fn softmax() -> Likelihood {
    Likelihood::parse(&format!("softmax:{CLASSES}")).unwrap()
}

/// Train and test rows, `per_class` of each class per set, every class around
/// its own random centre; rows in task order (classes 0 and 1, then 2 and 3, …).
fn tasks(per_class: usize, seed: u64) -> (Data, Data) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut normal = || -> f64 { StandardNormal.sample(&mut rng) };
    let centres: Vec<Vec<f64>> = (0..CLASSES).map(|_| (0..D).map(|_| 1.5 * normal()).collect()).collect();
    let n = per_class * CLASSES;
    // Row i: task i / (2 per_class), alternating its two classes.
    let class = |i: usize| 2 * (i / (2 * per_class)) + i % 2;
    let mut draw = || {
        let x = DMatrix::from_fn(n, D, |i, j| centres[class(i)][j] + normal());
        Data::new(x, DVector::from_fn(n, |i, _| class(i) as f64)).unwrap()
    };
    (draw(), draw())
}

fn task(data: &Data, t: usize) -> Data {
    let per_task = data.n() / TASKS;
    data.select(&(t * per_task..(t + 1) * per_task).collect::<Vec<_>>())
}

fn learner(
    kernel: Kernel,
    e_step: EStepConfig,
    inducing_policy: InducingPolicy,
    memory: MemoryPolicy,
    z: DMatrix<f64>,
) -> SequentialLearner {
    let config = SequentialConfig {
        inducing: z.nrows(),
        inducing_policy,
        e_step,
        m_steps: 0,
        memory,
        ..SequentialConfig::default()
    };
    SequentialLearner::new(kernel, softmax(), config)
        .unwrap()
        .with_inducing(z)
        .unwrap()
}

fn max_abs(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    (a - b).abs().max()
}

/// `got` predicts the latent functions at `test` as `want` does, to 1e-6.
fn assert_predicts_as(got: &DualPosterior, want: &DualPosterior, test: &Data, what: &str) {
    let (got, want) = (got.predict_f(test.x()), want.predict_f(test.x()));
    let (e_mean, e_var) = (max_abs(&got.mean, &want.mean), max_abs(&got.var, &want.var));
    assert!(
        e_mean < 1e-6 && e_var < 1e-6,
        "{what}mean error {e_mean:e}, variance error {e_var:e}"
    );
}

#[test]
fn with_all_past_data_in_memory_the_class_incremental_stream_equals_batch_training() {
    // The inducing inputs move to each new task (pivoted Cholesky, the sites
    // projected) and the memory is re-learned at every update: with every past
    // point in memory, neither step may lose anything.
    let (train, test) = tasks(25, 3);
    let converged = EStepConfig { steps: 150, rho: 0.6 };
    let z0 = task(&train, 0).x().rows(0, 12).into_owned();
    let mut learner = learner(
        kernel(),
        converged,
        InducingPolicy::Pivoted,
        MemoryPolicy::PerBatch { k: 1000 },
        z0,
    );
    for t in 0..TASKS {
        learner.update(&task(&train, t)).unwrap();
        let seen = train.select(&(0..(t + 1) * train.n() / TASKS).collect::<Vec<_>>());
        let post = learner.posterior().unwrap();
        let mut batch = DualPosterior::new(kernel(), post.z.clone(), CLASSES).unwrap();
        e_step(
            &mut batch,
            &softmax(),
            &seen,
            &mut PointSites::zeros(seen.n(), CLASSES),
            &converged,
        )
        .unwrap();
        assert_predicts_as(post, &batch, &test, &format!("task {t}: "));
        assert_eq!(learner.memory.len(), seen.n());
    }
}

/// The E-step's bound after `steps` damped steps from zero sites.
fn bound_after(steps: usize, kernel: &Kernel, data: &Data, z: &DMatrix<f64>) -> f64 {
    let mut post = DualPosterior::new(kernel.clone(), z.clone(), CLASSES).unwrap();
    let mut sites = PointSites::zeros(data.n(), CLASSES);
    e_step(
        &mut post,
        &softmax(),
        data,
        &mut sites,
        &EStepConfig { steps, rho: 0.9 },
    )
    .unwrap();
    dualgp_operators::model::dual::objective::m_step_objective(&post, &softmax(), data, None)
        .unwrap()
        .value
}

/// The cycling setting: the first task alone, where four of the six latents
/// see no point of their class and every point pushes them down; a large
/// prior variance (where the M-step takes a softmax); `Z` its first 40 rows.
struct Cycling {
    first: Data,
    test: Data,
    kernel: Kernel,
    z: DMatrix<f64>,
}

fn cycling() -> Cycling {
    let (train, test) = tasks(50, 11);
    let first = task(&train, 0);
    let z = first.x().rows(0, 40).into_owned();
    let kernel = Kernel::stationary(Family::Matern52, 150.0, vec![20.0]);
    Cycling { first, test, kernel, z }
}

/// The bound after 30 to 36 steps stays within 0.1, above the bound after 3.
fn assert_settles(bound_after: impl Fn(usize) -> f64) {
    let bounds: Vec<f64> = (30..=36).map(&bound_after).collect();
    let spread =
        bounds.iter().copied().fold(f64::NEG_INFINITY, f64::max) - bounds.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(spread < 0.1, "the bound after 30..36 steps: {bounds:?}");
    assert!(bound_after(3) < bounds[0], "later steps raised the bound");
}

#[test]
fn the_e_step_settles_while_later_classes_have_no_data() {
    // In the cycling setting, undamped-enough steps let the sites of the
    // latents without data collapse and rebuild in a cycle; the bound must
    // settle instead.
    let Cycling { first, kernel, z, .. } = cycling();
    assert_settles(|steps| bound_after(steps, &kernel, &first, &z));
}

#[test]
fn osgpr_settles_q_while_later_classes_have_no_data() {
    // The cycling setting above through Bui et al.'s learner, whose q(b) runs
    // undamped natural-gradient steps to convergence: they too must keep the
    // steps that raise the bound and undo the others across the whole run.
    let Cycling { first, kernel, z, .. } = cycling();
    assert_settles(|q_steps| {
        let config = OsgprConfig {
            inducing: z.nrows(),
            inducing_policy: OsgprInducing::Fixed,
            max_iter: 0,
            q_steps,
            ..OsgprConfig::default()
        };
        let mut learner = OsgprLearner::new(kernel.clone(), softmax(), config)
            .unwrap()
            .with_inducing(z.clone())
            .unwrap();
        learner.update(&first).unwrap().bound
    });
}

#[test]
fn the_learner_backs_off_across_its_shards_as_one_process_does() {
    // The cycling setting of the test above through the sequential learner,
    // whose E-step runs on shards: steps it undoes must be undone on every
    // shard (the Restore query), or its posterior leaves the single-process one.
    let Cycling { first, test, kernel, z } = cycling();
    let e_step_config = EStepConfig { steps: 30, rho: 0.9 };
    let mut learner = learner(
        kernel.clone(),
        e_step_config,
        InducingPolicy::Fixed,
        MemoryPolicy::None,
        z.clone(),
    );
    learner.update(&first).unwrap();
    let mut one = DualPosterior::new(kernel, z, CLASSES).unwrap();
    let mut sites = PointSites::zeros(first.n(), CLASSES);
    e_step(&mut one, &softmax(), &first, &mut sites, &e_step_config).unwrap();
    assert_predicts_as(learner.posterior().unwrap(), &one, &test, "");
}
