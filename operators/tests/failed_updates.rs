//! An update that fails leaves the model as it was before the epoch, and
//! the stream goes on: scored by the model before, and learning again from
//! the next epoch. Forced here with data: a label of 1e200, whose square
//! makes the M-step's objective non-finite (its step throws the kernel's
//! variance out of range), and without M-steps a label of 1e308, whose site
//! (y/σ²) is infinite (the new model is refused before the workers take it
//! up); and with a learner whose memory is broken so that its update panics.

mod common;

use common::operator::{run_operator, Feed, Outputs};
use common::small_config;
use dualgp_operators::dataflow::{GpOptions, Record};
use dualgp_operators::model::{
    Data, Family, Kernel, Likelihood, SequentialConfig, SequentialLearner, StreamingLearner,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const FEATURES: usize = 2;
const EPOCHS: u64 = 5;

/// Five epochs of 40 labelled records; in epoch `bad`, one label is `huge`.
fn stream(bad: Option<(u64, f64)>) -> Vec<Vec<Record>> {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    (0..EPOCHS)
        .map(|epoch| {
            (0..40)
                .map(|i| {
                    let x: Vec<f64> = (0..FEATURES).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let mut y = (1.5 * x[0]).sin() + 0.5 * x[1] + 0.1 * rng.random::<f64>();
                    if let Some((_, huge)) = bad.filter(|b| b.0 == epoch && i == 17) {
                        y = huge;
                    }
                    Record::new(epoch as i64 * 100 + i, x, Some(y))
                })
                .collect()
        })
        .collect()
}

fn learner(m_steps: usize) -> SequentialLearner {
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.7; FEATURES]);
    let config = SequentialConfig {
        m_steps,
        ..small_config()
    };
    SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap()
}

/// The operator on `workers` workers, worker 0 feeding every record.
fn run(workers: usize, epochs: Vec<Vec<Record>>, start: SequentialLearner) -> Outputs {
    let options = GpOptions::new(FEATURES);
    run_operator(
        timely::Config::process(workers),
        &epochs,
        start,
        options,
        Feed::WorkerZero,
    )
}

fn grid_predictions(learner: &SequentialLearner) -> Vec<String> {
    let mut learner = learner.clone();
    learner.ensure_factors().unwrap();
    let grid = DMatrix::from_fn(20, FEATURES, |i, j| -2.0 + 0.2 * (i + j) as f64);
    learner
        .predict(&grid)
        .unwrap()
        .iter()
        .map(|p| format!("{p:?}"))
        .collect()
}

/// The model-only learner on `epochs`.
fn reference(epochs: &[Vec<Record>], m_steps: usize) -> SequentialLearner {
    let mut learner = learner(m_steps);
    for records in epochs {
        let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
        let x = DMatrix::from_fn(records.len(), FEATURES, |i, j| records[i].features[j]);
        let y = DVector::from_iterator(records.len(), records.iter().map(|r| r.label.unwrap()));
        learner.update_with_ids(&ids, &Data::new(x, y).unwrap()).unwrap();
    }
    learner
}

#[test]
fn a_non_finite_objective_or_site_fails_the_update_and_the_model_reverts() {
    let m_steps = small_config().m_steps;
    for (huge, m_steps, why) in [(1e200, m_steps, "Cholesky"), (1e308, 0, "non-finite site totals")] {
        for workers in [1, 2] {
            let epochs = stream(Some((2, huge)));
            let outputs = run(workers, epochs.clone(), learner(m_steps));
            let outcomes: Vec<bool> = outputs.updates.iter().map(|u| u.outcome.is_ok()).collect();
            assert_eq!(outcomes, [true, true, false, true, true], "{huge}, {workers} workers");
            let failed = &outputs.updates[2];
            assert!(
                failed.outcome.as_ref().unwrap_err().contains(why),
                "{:?}",
                failed.outcome
            );
            // Reverted: the model after epoch 2 is the model after epoch 1.
            assert_eq!(failed.learner.n_seen, 80);
            assert_eq!(
                grid_predictions(&failed.learner),
                grid_predictions(&outputs.updates[1].learner)
            );
            // The stream went on: every record scored, epoch 3 by the model of
            // epoch 1, epoch 4 by that of epoch 3; and the last model is the
            // one of a stream whose epoch 2 brought nothing to learn.
            assert_eq!(outputs.predictions.len(), 200);
            let model_of = |epoch| {
                let of: Vec<Option<u64>> = outputs
                    .predictions
                    .iter()
                    .filter(|p| p.epoch == epoch)
                    .map(|p| p.model_epoch)
                    .collect();
                assert!(of.windows(2).all(|w| w[0] == w[1]));
                of[0]
            };
            assert_eq!((model_of(3), model_of(4)), (Some(1), Some(3)));
            let last = &outputs.updates[4].learner;
            assert_eq!(last.n_seen, 160);
            let mut unlabelled = epochs.clone();
            unlabelled[2].iter_mut().for_each(|r| r.label = None);
            let without = run(workers, unlabelled, learner(m_steps));
            assert_eq!(grid_predictions(last), grid_predictions(&without.updates[3].learner));
        }
    }
}

#[test]
fn a_panic_inside_the_update_fails_it_and_the_workers_go_on() {
    let m_steps = small_config().m_steps;
    let mut broken = reference(&stream(None)[..2], m_steps);
    assert!(!broken.memory.points.is_empty());
    // A memory point without its sites: the next update indexes past them.
    broken.memory.points[0].s1.clear();
    let outputs = run(2, stream(None), broken.clone());
    assert_eq!(outputs.updates.len(), EPOCHS as usize);
    for u in &outputs.updates {
        let why = u.outcome.as_ref().unwrap_err();
        assert!(why.contains("panicked"), "{why}");
        assert_eq!(u.learner.n_seen, broken.n_seen, "reverted");
    }
    assert_eq!(outputs.predictions.len(), 200, "every record scored");
}
