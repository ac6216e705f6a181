//! Classification with the project's default settings: a softmax over C
//! classes learns what a Bernoulli model learns from the same two-class rows,
//! at input dimensions in the hundreds.

use dualgp_operators::model::{Data, Likelihood, Metrics, SequentialLearner};
use dualgp_pipelines::model_args::ModelArgs;
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
