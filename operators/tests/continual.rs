//! A class-incremental stream (tasks of two new classes each, one softmax over
//! all of them) through the sequential learner with θ fixed: which update
//! steps keep what the batch posterior knows, and that a new class is learned.

mod common;

use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::{
    Data, DualPosterior, EStepConfig, Family, InducingPolicy, Kernel, Likelihood, MemoryPolicy, MemoryShare,
    OsgprConfig, OsgprInducing, OsgprLearner, PointSites, SequentialConfig, SequentialLearner, StreamingLearner,
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
    common::assert_predicts_as((got, want), test.x(), (max_abs, 1e-6), what);
}

#[test]
fn with_all_past_data_in_memory_the_class_incremental_stream_equals_batch_training() {
    // The inducing inputs move to each new task (pivoted Cholesky, the sites
    // projected) and the memory is re-learned at every update: with every past
    // point in memory, neither step may lose anything. As a control variate
    // such a memory has weight 1 and must be the same.
    let (train, test) = tasks(25, 3);
    let converged = EStepConfig { steps: 150, rho: 0.6 };
    let z0 = task(&train, 0).x().rows(0, 12).into_owned();
    for control_variate in [false, true] {
        let mut learner = learner(
            kernel(),
            converged,
            InducingPolicy::Pivoted,
            MemoryPolicy::PerBatch {
                k: 1000,
                capacity: None,
            },
            z0.clone(),
        );
        learner.config.memory_control_variate = control_variate;
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
            let what = format!("task {t}, control variate {control_variate}: ");
            assert_predicts_as(post, &batch, &test, &what);
            assert_eq!(learner.memory.len(), seen.n());
        }
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

/// Test accuracy on each task's rows, by the largest latent mean.
fn accuracy_by_task(post: &DualPosterior, test: &Data) -> Vec<f64> {
    (0..TASKS)
        .map(|t| {
            let rows = task(test, t);
            let f = post.predict_f(rows.x());
            let predicted = |i: usize| (0..CLASSES).max_by(|&a, &b| f.mean[(i, a)].total_cmp(&f.mean[(i, b)]));
            let hits = (0..rows.n())
                .filter(|&i| predicted(i) == Some(rows.y()[i] as usize))
                .count();
            hits as f64 / rows.n() as f64
        })
        .collect()
}

/// What the memory's points stand for.
#[derive(Clone, Copy)]
enum Role {
    /// Themselves (the paper).
    Own,
    ControlVariate,
    /// All past data, as a weighted sample (a share of 1).
    Sample,
    /// The share of the past the memory's drift estimates.
    Estimated,
}

impl Role {
    fn configure(self, config: &mut SequentialConfig) {
        config.memory_control_variate = matches!(self, Role::ControlVariate);
        config.memory_share = match self {
            Role::Own | Role::ControlVariate => MemoryShare::OWN,
            Role::Sample => MemoryShare::Fixed(1.0),
            Role::Estimated => MemoryShare::Estimated,
        };
    }
}

#[test]
fn a_memory_of_a_tenth_that_stands_for_all_past_data_holds_old_tasks_as_all_past_data_does() {
    // A tenth of the stream in memory. As the paper's memory, whose points
    // stand for themselves, the first task is lost to the later ones: its
    // other points' sites were taken while the later classes had no data and
    // nothing revives them. As a control variate for all past data, as a
    // weighted sample of it, or with the share of the past its drift
    // estimates, the same memory keeps the first task within reach of the
    // memory holding every past point (the batch posterior).
    let e_step = EStepConfig { steps: 20, rho: 0.8 };
    for seed in [3, 4, 5] {
        let (train, test) = tasks(100, seed);
        let z0 = task(&train, 0).x().rows(0, 20).into_owned();
        let run = |memory: MemoryPolicy, role: Role| {
            let mut learner = learner(kernel(), e_step, InducingPolicy::Pivoted, memory, z0.clone());
            role.configure(&mut learner.config);
            for t in 0..TASKS {
                learner.update(&task(&train, t)).unwrap();
            }
            accuracy_by_task(learner.posterior().unwrap(), &test)
        };
        let tenth = MemoryPolicy::RandomReservoir {
            capacity: train.n() / 10,
        };
        let all = run(
            MemoryPolicy::PerBatch {
                k: train.n(),
                capacity: None,
            },
            Role::Own,
        );
        let paper = run(tenth, Role::Own);
        let mean = |a: &[f64]| a.iter().sum::<f64>() / a.len() as f64;
        let roles = [
            ("control variate", Role::ControlVariate),
            ("sample", Role::Sample),
            ("estimated share", Role::Estimated),
        ];
        for (what, role) in roles {
            let standing = run(tenth, role);
            let figures = format!("seed {seed}: all {all:.3?}, paper {paper:.3?}, {what} {standing:.3?}");
            assert!(all[0] - paper[0] > 0.1, "{figures}");
            assert!(all[0] - standing[0] < 0.06, "{figures}");
            assert!(mean(&all) - mean(&standing) < 0.03, "{figures}");
        }
    }
}

/// A Gaussian stream over the tasks' inputs, its test rows and a fixed `Z`.
struct GaussianStream {
    data: Data,
    test: Data,
    z: DMatrix<f64>,
}

const GAUSSIAN: Likelihood = Likelihood::Gaussian { variance: 0.3 };

fn gaussian_stream() -> GaussianStream {
    let (train, test) = tasks(20, 7);
    let data = Data::new(train.x().clone(), train.x().column(0).map(f64::sin)).unwrap();
    let z = train.x().rows_with_step(0, 15, 7).into_owned();
    GaussianStream { data, test, z }
}

impl GaussianStream {
    /// A learner with θ and `Z` fixed whose memory `memory` plays `role`.
    fn learner(&self, memory: MemoryPolicy, role: Role) -> SequentialLearner {
        let mut config = SequentialConfig {
            inducing: self.z.nrows(),
            inducing_policy: InducingPolicy::Fixed,
            e_step: EStepConfig { steps: 1, rho: 1.0 },
            m_steps: 0,
            memory,
            ..SequentialConfig::default()
        };
        role.configure(&mut config);
        SequentialLearner::new(kernel(), GAUSSIAN, config)
            .unwrap()
            .with_inducing(self.z.clone())
            .unwrap()
    }

    /// `learner` predicts as the exact sparse posterior on `rows` of the
    /// stream does (a row given twice counts twice).
    fn assert_learned_as_batch(&self, learner: &SequentialLearner, rows: &[usize]) {
        let data = self.data.select(rows);
        let mut batch = DualPosterior::new(kernel(), self.z.clone(), 1).unwrap();
        let mut sites = PointSites::zeros(data.n(), 1);
        e_step(
            &mut batch,
            &GAUSSIAN,
            &data,
            &mut sites,
            &EStepConfig { steps: 1, rho: 1.0 },
        )
        .unwrap();
        assert_predicts_as(learner.posterior().unwrap(), &batch, &self.test, "");
    }
}

#[test]
fn a_memory_as_a_sample_weights_its_points_as_copies_of_themselves() {
    // A uniform reservoir of a quarter of the points seen, the memory as a
    // sample of the past. At the third update 80 points have been seen and
    // 20 remain, so each counts 4 times: the posterior must be the batch
    // posterior on the third batch and four copies of each of those 20
    // points, whatever the sites the earlier points had.
    let stream = gaussian_stream();
    let mut learner = stream.learner(MemoryPolicy::RandomReservoir { capacity: 20 }, Role::Sample);
    let per_task = stream.data.n() / TASKS;
    for t in 0..2 {
        learner.update(&task(&stream.data, t)).unwrap();
    }
    assert_eq!((learner.n_seen, learner.memory.len()), (80, 20));
    // The memory's rows in the stream, found by their inputs.
    let remembered: Vec<usize> = learner
        .memory
        .points
        .iter()
        .map(|p| {
            (0..2 * per_task)
                .find(|&i| stream.data.x().row(i).iter().eq(p.x.iter()))
                .unwrap()
        })
        .collect();
    let rows: Vec<usize> = (2 * per_task..3 * per_task)
        .chain((0..4).flat_map(|_| remembered.iter().copied()))
        .collect();
    learner.update(&task(&stream.data, 2)).unwrap();
    stream.assert_learned_as_batch(&learner, &rows);
}

#[test]
fn with_a_gaussian_likelihood_neither_the_control_variate_nor_the_estimated_share_changes_anything() {
    // Gaussian sites do not depend on q: every first site still holds, the
    // memory's correction is zero, it shows no drift to take a share for,
    // and the stream stays the batch posterior (θ and Z fixed), whatever
    // the memory keeps and drops.
    let stream = gaussian_stream();
    for role in [Role::ControlVariate, Role::Estimated] {
        let mut learner = stream.learner(MemoryPolicy::RandomReservoir { capacity: 8 }, role);
        for t in 0..TASKS {
            learner.update(&task(&stream.data, t)).unwrap();
        }
        stream.assert_learned_as_batch(&learner, &(0..stream.data.n()).collect::<Vec<_>>());
    }
}

#[test]
fn the_e_step_reaches_its_fixed_point_when_a_new_task_must_rise_far() {
    // Under a large kernel variance (where the M-step takes a softmax) the
    // first task pushes the later classes' latents far down and the second
    // task must raise two of them over the learned ones. The E-step's fixed
    // point on both tasks' points (θ and Z fixed) is the optimum of its
    // concave bound: the batch posterior after 150 steps and the sequential
    // learner (every past point in memory) after 60 steps per update must
    // both be there. Before the step size adapted (a trust radius of 4
    // marginal sds, which the batch's own sites keep small, and a damping
    // that only ever halved) both were still 3–4 latent units away, on a
    // latent scale of 20.
    let (train, test) = tasks(50, 11);
    let kernel = Kernel::stationary(Family::Matern52, 150.0, vec![20.0]);
    let seen = train.select(&(0..2 * train.n() / TASKS).collect::<Vec<_>>());
    let z = seen.x().rows_with_step(0, 40, 4).into_owned();
    let batch_after = |steps| {
        let mut batch = DualPosterior::new(kernel.clone(), z.clone(), CLASSES).unwrap();
        let mut sites = PointSites::zeros(seen.n(), CLASSES);
        e_step(
            &mut batch,
            &softmax(),
            &seen,
            &mut sites,
            &EStepConfig { steps, rho: 0.8 },
        )
        .unwrap();
        batch
    };
    let fixed_point = batch_after(3000);
    let mut learner = learner(
        kernel.clone(),
        EStepConfig { steps: 60, rho: 0.8 },
        InducingPolicy::Fixed,
        MemoryPolicy::PerBatch {
            k: train.n(),
            capacity: None,
        },
        z.clone(),
    );
    for t in 0..2 {
        learner.update(&task(&train, t)).unwrap();
    }
    let want = fixed_point.predict_f(test.x());
    let scale = want.mean.abs().max();
    for (what, post) in [("batch", &batch_after(150)), ("learner", learner.posterior().unwrap())] {
        let error = max_abs(&post.predict_f(test.x()).mean, &want.mean);
        assert!(
            error < 1e-3 * scale,
            "{what}: latent means {error:.3e} from the fixed point (scale {scale:.1})"
        );
    }
}
