//! Ids that come more than once: within an epoch a copy counts once and
//! records that share an id but differ are all refused (prequential), or the
//! first is scored and none learned (on arrival); across epochs an id that
//! comes again is a new observation. The outcome does not depend on the
//! order the records came in or the number of workers.

mod common;

use std::collections::BTreeMap;

use common::operator::{run_operator, Feed, Outputs};
use common::small_config;
use dualgp_operators::dataflow::{GpOptions, Record, Scoring};
use dualgp_operators::model::{Data, Family, Kernel, Likelihood, Predictive, SequentialLearner, StreamingLearner};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const FEATURES: usize = 2;

fn record(rng: &mut ChaCha8Rng, id: i64) -> Record {
    let x: Vec<f64> = (0..FEATURES).map(|_| rng.random_range(-2.0..2.0)).collect();
    let y = (1.5 * x[0]).sin() + 0.5 * x[1] + 0.1 * rng.random::<f64>();
    Record::new(id, x, Some(y))
}

/// Epoch 0: ids 1-40, a copy of record 3 and another record 7; epoch 1:
/// ids 1-10 again with new values, and 41-70; epoch 2: 71-100.
fn stream() -> Vec<Vec<Record>> {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut first: Vec<Record> = (1..=40).map(|id| record(&mut rng, id)).collect();
    first.insert(20, first[2].clone());
    let mut other_seven = first[6].clone();
    other_seven.label = Some(5.0);
    first.insert(30, other_seven);
    let second = (1..=10).chain(41..=70).map(|id| record(&mut rng, id)).collect();
    let third = (71..=100).map(|id| record(&mut rng, id)).collect();
    vec![first, second, third]
}

fn learner() -> SequentialLearner {
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.7; FEATURES]);
    SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, small_config()).unwrap()
}

/// The operator on `workers` workers; each worker sends every `peers`-th
/// record of each epoch, `reverse`d or not.
fn run(workers: usize, scoring: Scoring, reverse: bool) -> Outputs {
    let options = GpOptions {
        scoring,
        ..GpOptions::new(FEATURES)
    };
    run_operator(
        timely::Config::process(workers),
        &stream(),
        learner(),
        options,
        Feed::Shared { reverse },
    )
}

/// How often each `(epoch, id)` was scored.
fn scored(outputs: &Outputs) -> BTreeMap<(u64, i64), usize> {
    let mut seen = BTreeMap::new();
    for p in &outputs.predictions {
        *seen.entry((p.epoch, p.id)).or_default() += 1;
    }
    seen
}

/// `(epoch, id, is a copy)` of every refused record, sorted.
fn refused(outputs: &Outputs) -> Vec<(u64, i64, bool)> {
    let mut r: Vec<_> = outputs
        .rejected
        .iter()
        .map(|r| (r.epoch, r.record.id, r.reason.contains("a copy")))
        .collect();
    r.sort();
    r
}

fn last_learner(outputs: &Outputs) -> SequentialLearner {
    let last = outputs.updates.iter().max_by_key(|u| u.epoch).unwrap();
    assert!(outputs.updates.iter().all(|u| u.outcome.is_ok()));
    let mut learner = last.learner.clone();
    learner.ensure_factors().unwrap();
    learner
}

fn predictions_on_a_grid(learner: &SequentialLearner) -> Vec<Predictive> {
    let grid = DMatrix::from_fn(30, FEATURES, |i, j| -2.0 + 0.13 * (i + 2 * j) as f64);
    learner.predict(&grid).unwrap()
}

#[test]
fn prequentially_copies_count_once_and_differing_records_are_all_refused() {
    let outputs = run(1, Scoring::Prequential, false);
    let seen = scored(&outputs);
    assert_eq!(seen[&(0, 3)], 1, "a copy is scored once");
    assert!(
        !seen.contains_key(&(0, 7)),
        "differing records under one id are not scored"
    );
    assert!(
        (1..=10).all(|id| seen[&(1, id)] == 1),
        "an id again in a later epoch is scored again"
    );
    assert_eq!(seen.len(), 39 + 40 + 30);
    assert!(seen.values().all(|n| *n == 1));
    assert_eq!(refused(&outputs), [(0, 3, true), (0, 7, false), (0, 7, false)]);

    // The model learned exactly the records kept: as the model-only learner on them.
    let mut reference = learner();
    for (epoch, records) in stream().iter().enumerate() {
        let kept: Vec<&Record> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.id != 7 || epoch > 0)
            .filter(|(i, r)| !(epoch == 0 && r.id == 3 && *i == 20))
            .map(|(_, r)| r)
            .collect();
        let ids: Vec<i64> = kept.iter().map(|r| r.id).collect();
        let x = DMatrix::from_fn(kept.len(), FEATURES, |i, j| kept[i].features[j]);
        let y = DVector::from_iterator(kept.len(), kept.iter().map(|r| r.label.unwrap()));
        reference.update_with_ids(&ids, &Data::new(x, y).unwrap()).unwrap();
    }
    let learned = last_learner(&outputs);
    assert_eq!(learned.n_seen, 39 + 40 + 30);
    assert_eq!(predictions_on_a_grid(&learned), predictions_on_a_grid(&reference));
}

#[test]
fn prequentially_the_outcome_does_not_depend_on_order_or_workers() {
    let one = run(1, Scoring::Prequential, false);
    let three = run(3, Scoring::Prequential, true);
    assert_eq!(scored(&one), scored(&three));
    assert_eq!(refused(&one), refused(&three));
    let sorted = |o: &Outputs| {
        let mut p = o.predictions.clone();
        p.sort_by_key(|p| (p.epoch, p.id));
        p
    };
    assert_eq!(sorted(&one), sorted(&three));
    assert_eq!(
        predictions_on_a_grid(&last_learner(&one)),
        predictions_on_a_grid(&last_learner(&three))
    );
}

#[test]
fn on_arrival_the_first_is_scored_a_repeat_refused_and_a_differing_id_not_learned() {
    let outputs = run(1, Scoring::OnArrival, false);
    let seen = scored(&outputs);
    assert_eq!(seen[&(0, 3)], 1);
    assert_eq!(seen[&(0, 7)], 1, "the first record 7 was scored as it came");
    assert!((1..=10).all(|id| seen[&(1, id)] == 1));
    assert!(seen.values().all(|n| *n == 1));
    assert_eq!(refused(&outputs), [(0, 3, true), (0, 7, false)]);
    // Neither record 7 of epoch 0 is learned; the copy of 3 once.
    assert_eq!(last_learner(&outputs).n_seen, 39 + 40 + 30);
}
