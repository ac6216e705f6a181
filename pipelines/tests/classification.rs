//! Classification with the project's default settings: a softmax over C
//! classes learns what a Bernoulli model learns from the same two-class rows,
//! at input dimensions in the hundreds.

use dualgp_connectors::{shared_data, ColumnSpec, Table};
use dualgp_operators::model::{Data, Likelihood, MemoryPolicy, Metrics, Pivot, SequentialLearner, StreamingLearner};
use dualgp_pipelines::model_args::ModelArgs;
use dualgp_pipelines::protocol::Standardizer;
use nalgebra::{DMatrix, DVector};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Two classes around random centres in `d` dimensions, unit noise: train and
/// test rows, labels 0 and 1. The centres are `√(2·spread)` apart per input,
/// so the classes separate through many inputs at once, as images do.
fn two_clusters(d: usize, n_train: usize, n_test: usize, seed: u64) -> (Data, Data) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut normal = || -> f64 { StandardNormal.sample(&mut rng) };
    let spread: f64 = 0.04;
    let centres: Vec<Vec<f64>> = (0..2)
        .map(|_| (0..d).map(|_| spread.sqrt() * normal()).collect())
        .collect();
    let mut draw = |n: usize| {
        let y = DVector::from_fn(n, |i, _| (i % 2) as f64);
        let x = DMatrix::from_fn(n, d, |i, j| centres[i % 2][j] + normal());
        Data::new(x, y).expect("finite rows")
    };
    (draw(n_train), draw(n_test))
}

/// The test metrics after learning `train` as one batch with the defaults.
fn learn_once(likelihood: &str, train: &Data, test: &Data) -> Metrics {
    let settings = ModelArgs::default().settings().expect("default settings");
    let likelihood = settings.likelihood(Likelihood::parse(likelihood).expect("likelihood"));
    let kernel = settings.kernel(train.d());
    let mut learner = SequentialLearner::new(kernel, likelihood, settings.sequential).expect("learner");
    learner.update(train).expect("update");
    learner.evaluate(test).expect("evaluate")
}

#[test]
fn softmax_learns_a_batch_as_well_as_bernoulli_at_high_dimension() {
    let (train, test) = two_clusters(200, 400, 400, 3);
    let bernoulli = learn_once("bernoulli", &train, &test);
    let acc = bernoulli.accuracy.expect("accuracy");
    assert!(acc > 0.9, "the rows are separable: bernoulli reaches {acc}");
    // Two classes, and ten of which eight never occur.
    for classes in [2, 10] {
        let softmax = learn_once(&format!("softmax:{classes}"), &train, &test);
        let (a, b) = (
            softmax.accuracy.expect("accuracy"),
            bernoulli.accuracy.expect("accuracy"),
        );
        assert!(a >= b - 0.02, "softmax:{classes} accuracy {a} against bernoulli's {b}");
        assert!(
            softmax.nlpd <= bernoulli.nlpd + 0.05,
            "softmax:{classes} NLPD {} against bernoulli's {}",
            softmax.nlpd,
            bernoulli.nlpd
        );
    }
}

/// The first `per_class` rows of each class of split Fashion-MNIST's first
/// `T` tasks (train and test), standardised with the train rows' statistics.
fn fashion_tasks<const T: usize>(per_class: usize) -> [(Data, Data); T] {
    let read = |name: &str| {
        let path = shared_data(name).unwrap_or_else(|e| panic!("{e}"));
        Table::read(path, &ColumnSpec::default()).expect("read data file")
    };
    let (train, test) = (read("split_fashion_train.parquet"), read("split_fashion_test.parquet"));
    let classes: [[f64; 2]; T] = std::array::from_fn(|t| [2.0 * t as f64, 2.0 * t as f64 + 1.0]);
    let rows = |table: &Table, classes: [f64; 2]| -> Vec<usize> {
        let labels = table.labels.as_ref().expect("labels");
        classes
            .iter()
            .flat_map(|&c| (0..table.n()).filter(move |&i| labels[i] == c).take(per_class))
            .collect()
    };
    let all: Vec<usize> = classes.iter().flat_map(|&c| rows(&train, c)).collect();
    let scaling = Standardizer::fit(&train.select(&all).features, None);
    let data = |table: &Table, rows: Vec<usize>| {
        let part = table.select(&rows);
        let labels = DVector::from_vec(part.labels.clone().expect("labels"));
        Data::new(scaling.transform_x(&part.features), labels).expect("finite rows")
    };
    classes.map(|c| (data(&train, rows(&train, c)), data(&test, rows(&test, c))))
}

#[test]
fn a_new_task_is_learned_with_hyperparameters_fixed() {
    // Task 1's classes start far below task 0's wherever the images look
    // alike (p ≈ 10⁻³: α̂ ≈ 1, β̂ ≈ p); summed over a batch, their sites once
    // moved the posterior by hundreds and the E-step diverged.
    let [(train0, _), (train1, test1)] = fashion_tasks::<2>(150);
    let mut settings = ModelArgs::default().settings().expect("default settings");
    settings.sequential.m_steps = 0;
    settings.sequential.inducing = 50;
    for steps in [4, 20] {
        settings.sequential.e_step.steps = steps;
        let likelihood = Likelihood::parse("softmax:10").expect("likelihood");
        let mut learner = SequentialLearner::new(settings.kernel(train0.d()), likelihood, settings.sequential.clone())
            .expect("learner");
        learner.update(&train0).expect("task 0");
        learner.update(&train1).expect("task 1");
        let metrics = learner.evaluate(&test1).expect("evaluate");
        let accuracy = metrics.accuracy.expect("accuracy");
        let largest = learner
            .posterior()
            .expect("learned")
            .predict_f(test1.x())
            .mean
            .abs()
            .max();
        assert!(accuracy > 0.85, "{steps} E-steps: task 1 accuracy {accuracy}");
        assert!(largest < 30.0, "{steps} E-steps: a latent mean reached {largest}");
    }
}

/// Three tasks, θ fixed, no memory: what the first task keeps rests on the
/// inducing inputs the later ones leave it. Pivots on the largest residual
/// variance (`Pivot::Variance`, the default) drift to the outlying images (a
/// pixel beyond 20 sd) and task 0 scores 0.01 after task 2; trace-reducing
/// pivots keep 0.61 (0.41 and 0.99 on tasks 1 and 2).
#[test]
fn inducing_inputs_that_move_keep_what_old_tasks_taught() {
    let tasks = fashion_tasks::<3>(150);
    let mut settings = ModelArgs::default().settings().expect("default settings");
    settings.sequential.m_steps = 0;
    settings.sequential.inducing = 50;
    settings.sequential.memory = MemoryPolicy::None;
    settings.sequential.pivot = Pivot::Trace;
    let likelihood = Likelihood::parse("softmax:10").expect("likelihood");
    let mut learner =
        SequentialLearner::new(settings.kernel(tasks[0].0.d()), likelihood, settings.sequential).expect("learner");
    for (train, _) in &tasks {
        learner.update(train).expect("task");
    }
    let accuracy = learner
        .evaluate(&tasks[0].1)
        .expect("evaluate")
        .accuracy
        .expect("accuracy");
    assert!(accuracy > 0.4, "task 0 accuracy {accuracy} after tasks 1 and 2");
}
