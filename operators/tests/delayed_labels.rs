//! Delayed labels: features scored when they come, learned from when their
//! label comes (a differential join by id); the model equals the one learned
//! with each record labelled from the start at the epoch its label came.

mod common;

use std::sync::{Arc, Mutex};

use common::small_config;
use dualgp_operators::dataflow::{delayed_labels, LearnGp, ModelUpdate, Record};
use dualgp_operators::model::{
    Family, Kernel, Likelihood, Link, MemoryPolicy, Predictive, SequentialConfig, SequentialLearner, StreamingLearner,
};
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle};

const FEATURE_EPOCHS: u64 = 6;
const LAST_EPOCH: u64 = FEATURE_EPOCHS + 6;
const TTL: u64 = 3;

/// A record with the epoch its features come and the epoch its label comes (if ever).
struct Arrival {
    record: Record,
    features_at: u64,
    label_at: Option<u64>,
}

fn arrivals() -> Vec<Arrival> {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut out = Vec::new();
    for epoch in 0..FEATURE_EPOCHS {
        for _ in 0..40 {
            let id = out.len() as i64;
            let x: Vec<f64> = (0..2).map(|_| rng.random_range(-2.0..2.0)).collect();
            let y = f64::from(x[0] * x[1] + 0.3 * rng.random::<f64>() > 0.0);
            let label_at = match id % 13 {
                0 => None,                       // never labelled
                1 => Some(epoch + 5),            // too late: after the features expired
                k => Some(epoch + k as u64 % 3), // 0 to 2 epochs late
            };
            out.push(Arrival {
                record: Record::new(id, x, Some(y)),
                features_at: epoch,
                label_at,
            });
        }
    }
    out
}

fn learner() -> SequentialLearner {
    let config = SequentialConfig {
        memory: MemoryPolicy::PerBatch { k: 5, capacity: None },
        seed: 1,
        ..small_config()
    };
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.8, 0.8]);
    SequentialLearner::new(kernel, Likelihood::Bernoulli { link: Link::Probit }, config).unwrap()
}

#[derive(Default)]
struct Outputs {
    scored: usize,
    updates: Vec<ModelUpdate>,
}

/// Two workers; `delayed`: features then labels on their own inputs, else
/// each record labelled at the epoch its label comes.
fn run(delayed: bool) -> Outputs {
    let outputs = Arc::new(Mutex::new(Outputs::default()));
    let out = Arc::clone(&outputs);
    timely::execute(timely::Config::process(2), move |worker| {
        let (mut records, mut labels) = (InputHandleVec::new(), InputHandleVec::new());
        let probe = ProbeHandle::new();
        let (o1, o2) = (Arc::clone(&out), Arc::clone(&out));
        worker.dataflow::<u64, _, _>(|scope| {
            let records = scope.input_from(&mut records);
            let gp = if delayed {
                let late = delayed_labels(records.clone(), scope.input_from(&mut labels), TTL);
                records.learn_gp_late(late, learner(), 2)
            } else {
                records.learn_gp(learner(), 2)
            };
            gp.predictions
                .inspect(move |_| o1.lock().unwrap().scored += 1)
                .probe_with(&probe);
            gp.updates
                .inspect(move |u| o2.lock().unwrap().updates.push(u.clone()))
                .probe_with(&probe);
        });
        let all = arrivals();
        for epoch in 0..=LAST_EPOCH {
            for a in all
                .iter()
                .filter(|a| worker.index() == 0 && a.record.id % 2 == 0 || worker.index() == 1 && a.record.id % 2 == 1)
            {
                let kept = a.label_at.filter(|&at| at < a.features_at + TTL);
                if delayed {
                    if a.features_at == epoch {
                        records.send(Record {
                            label: None,
                            ..a.record.clone()
                        });
                    }
                    if a.label_at == Some(epoch) {
                        labels.send((a.record.id, a.record.label.unwrap()));
                    }
                } else if kept == Some(epoch) {
                    records.send(a.record.clone());
                }
            }
            records.advance_to(epoch + 1);
            labels.advance_to(epoch + 1);
            while probe.less_than(&(epoch + 1)) {
                worker.step_or_park(Some(std::time::Duration::from_millis(1)));
            }
        }
    })
    .unwrap();
    Arc::try_unwrap(outputs).ok().unwrap().into_inner().unwrap()
}

#[test]
fn labels_that_come_late_teach_the_model_what_labels_present_from_the_start_do() {
    let (late, early) = (run(true), run(false));
    let all = arrivals();
    assert_eq!(
        late.scored,
        all.len(),
        "every record is scored once, when its features come"
    );

    let epochs = |o: &Outputs| {
        let mut e: Vec<u64> = o.updates.iter().map(|u| u.epoch).collect();
        e.sort_unstable();
        e
    };
    assert_eq!(epochs(&late), epochs(&early), "the same epochs learn");
    let last = |o: &Outputs| {
        let mut l = o.updates.iter().max_by_key(|u| u.epoch).unwrap().learner.clone();
        l.ensure_factors().unwrap();
        l
    };
    let (a, b) = (last(&late), last(&early));
    let within_ttl = all
        .iter()
        .filter(|x| x.label_at.is_some_and(|at| at < x.features_at + TTL))
        .count();
    assert_eq!(
        a.n_seen, within_ttl as u64,
        "labels after the TTL and missing labels are not learned"
    );
    assert_eq!((a.n_seen, a.batches), (b.n_seen, b.batches));
    let grid = DMatrix::from_fn(25, 2, |i, j| -2.0 + 0.16 * (i + j) as f64);
    for (p, q) in a.predict(&grid).unwrap().iter().zip(&b.predict(&grid).unwrap()) {
        let (Predictive::Classes(p), Predictive::Classes(q)) = (p, q) else {
            panic!("class probabilities expected");
        };
        assert!((p[1] - q[1]).abs() < 1e-10, "{} vs {}", p[1], q[1]);
    }
}
