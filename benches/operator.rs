//! Operator throughput against the model-only learner on the same stream:
//! m = 100, d = 8, epochs of 1000 records, Gaussian likelihood, one E-step,
//! no M-step, fixed inducing inputs. Both score every record before learning
//! from it. Writes records/s, the overhead ratio (operator on 1 worker ÷
//! model-only) and the 1 → 2 worker speed-up to `target/bench-operator.json`.
//! Wall-clock medians of a few repetitions; run with `cargo bench --bench operator`.

use std::path::Path;
use std::time::Instant;

use dualgp::operators::dataflow::{LearnGp, Record};
use dualgp::operators::model::{
    Data, EStepConfig, Family, InducingPolicy, Kernel, Likelihood, SequentialConfig, SequentialLearner,
    StreamingLearner,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use timely::dataflow::operators::{Input, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle};

const D: usize = 8;
const BATCH: usize = 1000;
const EPOCHS: usize = 20;
const REPEATS: usize = 3;

fn stream() -> Vec<Vec<Record>> {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    (0..EPOCHS)
        .map(|e| {
            (0..BATCH)
                .map(|i| {
                    let x: Vec<f64> = (0..D).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let y = x[0].sin() + 0.5 * x[1] + 0.1 * rng.random::<f64>();
                    Record::new((e * BATCH + i) as i64, x, Some(y))
                })
                .collect()
        })
        .collect()
}

fn learner() -> SequentialLearner {
    let config = SequentialConfig {
        inducing_policy: InducingPolicy::Fixed,
        e_step: EStepConfig { steps: 1, rho: 1.0 },
        m_steps: 0,
        ..SequentialConfig::default()
    };
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![2.0]);
    SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap()
}

/// Seconds for the model-only learner to score and learn every epoch.
fn model_only(epochs: &[Vec<Record>]) -> f64 {
    let mut learner = learner();
    let start = Instant::now();
    for records in epochs {
        let x = DMatrix::from_fn(records.len(), D, |i, j| records[i].features[j]);
        if learner.posterior().is_some() {
            std::hint::black_box(learner.predict(&x).unwrap());
        }
        let y = DVector::from_iterator(records.len(), records.iter().map(|r| r.label.unwrap()));
        let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
        learner.update_with_ids(&ids, &Data::new(x, y).unwrap()).unwrap();
    }
    start.elapsed().as_secs_f64()
}

/// Seconds for the operator on `workers` threads; every worker feeds its share.
fn operator(epochs: &[Vec<Record>], workers: usize) -> f64 {
    let epochs = epochs.to_vec();
    let start = Instant::now();
    timely::execute(timely::Config::process(workers), move |worker| {
        let (mut input, probe) = (InputHandleVec::new(), ProbeHandle::new());
        worker.dataflow::<u64, _, _>(|scope| {
            let gp = scope.input_from(&mut input).learn_gp(learner(), D);
            gp.predictions.probe_with(&probe);
            gp.updates.probe_with(&probe);
        });
        for (e, records) in epochs.iter().enumerate() {
            for r in records.iter().skip(worker.index()).step_by(worker.peers()) {
                input.send(r.clone());
            }
            input.advance_to(e as u64 + 1);
            while probe.less_than(input.time()) {
                worker.step_or_park(None);
            }
        }
    })
    .unwrap();
    start.elapsed().as_secs_f64()
}

fn median(mut f: impl FnMut() -> f64) -> f64 {
    let mut times: Vec<f64> = (0..REPEATS).map(|_| f()).collect();
    times.sort_by(f64::total_cmp);
    times[REPEATS / 2]
}

fn main() {
    let epochs = stream();
    let records = (EPOCHS * BATCH) as f64;
    let t_model = median(|| model_only(&epochs));
    let t_one = median(|| operator(&epochs, 1));
    let t_two = median(|| operator(&epochs, 2));
    println!("| run | seconds | records/s |\n|---|---|---|");
    for (name, t) in [
        ("model-only", t_model),
        ("operator, 1 worker", t_one),
        ("operator, 2 workers", t_two),
    ] {
        println!("| {name} | {t:.3} | {:.0} |", records / t);
    }
    println!(
        "overhead ratio {:.3}, 1 → 2 worker speed-up {:.2}",
        t_one / t_model,
        t_one / t_two
    );
    let json = serde_json::json!({
        "m": 100, "d": D, "batch": BATCH, "epochs": EPOCHS,
        "records_per_second": {
            "model_only": records / t_model, "operator_1_worker": records / t_one, "operator_2_workers": records / t_two,
        },
        "overhead_ratio": t_one / t_model,
        "speedup_1_to_2_workers": t_one / t_two,
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-operator.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("wrote {}", path.display());
}
