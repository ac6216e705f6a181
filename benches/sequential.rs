//! One Algorithm 1 update: m = 100, batch 1000, memory 100 (reservoir), d = 8,
//! Gaussian likelihood, pivoted inducing inputs, 4 E-steps, under four M-step
//! schedules: the paper's 20 Adam steps with the sites held, L-BFGS searches
//! in θ that re-learn batch and memory at every θ they try (past data by the
//! scaled memory or as a message), and `dualgp`'s defaults (θ and `Z`); and
//! the defaults' update between M-steps (the batch learned by an E-step).
//! Criterion times the whole update; the learner's own step timer splits it,
//! averaged over the measured updates, into `target/bench-sequential.json`.

use std::cell::RefCell;
use std::hint::black_box;
use std::path::Path;

use criterion::{BatchSize, Criterion, Throughput};
use dualgp::model::{
    Data, Family, Kernel, Likelihood, MemoryPolicy, Optimizer, PastInMStep, SequentialConfig, SequentialLearner,
    StepSeconds,
};
use dualgp::pipelines::model_args::ModelArgs;
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const D: usize = 8;
const BATCH: usize = 1000;

fn batch(rng: &mut ChaCha8Rng) -> Data {
    let x = DMatrix::<f64>::from_fn(BATCH, D, |_, _| rng.random_range(-2.0..2.0));
    let y = DVector::from_fn(BATCH, |i, _| {
        x[(i, 0)].sin() + 0.5 * x[(i, 1)] + 0.1 * rng.random::<f64>()
    });
    Data::new(x, y).unwrap()
}

/// A learner under `config`, warmed up until its memory is full (as in a long
/// stream), and the batch to time it on.
fn warmed_up(config: SequentialConfig) -> (SequentialLearner, Data) {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![2.0]);
    let mut learner = SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap();
    // Two batches at least, so that the defaults' next update may be one between M-steps.
    while learner.memory.len() < 100 || learner.n_seen < 2 * BATCH as u64 {
        learner.update(&batch(&mut rng)).unwrap();
    }
    (learner, batch(&mut rng))
}

/// `dualgp`'s defaults for a Gaussian likelihood, with the bench's memory.
fn defaults() -> SequentialConfig {
    SequentialConfig {
        memory: MemoryPolicy::Reservoir { capacity: 100 },
        ..ModelArgs::default()
            .settings()
            .expect("the defaults are valid")
            .sequential_for(&Likelihood::Gaussian { variance: 0.1 })
    }
}

fn main() {
    let base = SequentialConfig {
        inducing: 100,
        memory: MemoryPolicy::Reservoir { capacity: 100 },
        ..SequentialConfig::default()
    };
    let schedules = [
        ("adam20", base.clone()),
        (
            "lbfgs30_relearn",
            SequentialConfig {
                m_steps: 30,
                optimizer: Optimizer::Lbfgs { history: 10 },
                relearn_in_m_step: true,
                reexpress_old_data: true,
                ..base.clone()
            },
        ),
        (
            "lbfgs30_message",
            SequentialConfig {
                m_steps: 30,
                optimizer: Optimizer::Lbfgs { history: 10 },
                relearn_in_m_step: true,
                past_in_m_step: PastInMStep::Message,
                ..base
            },
        ),
        // What `dualgp` runs in an update that takes M-steps: `Z` moved with
        // `θ`, 40 iterations for a Gaussian likelihood.
        (
            "defaults",
            SequentialConfig {
                m_every: 0,
                ..defaults()
            },
        ),
        // ... and in one between them (the batch learned by an E-step, held).
        (
            "defaults_between_m_steps",
            SequentialConfig {
                m_every: usize::MAX,
                ..defaults()
            },
        ),
    ];

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("sequential");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(10);
    let mut results = serde_json::Map::new();
    for (name, config) in schedules {
        let (learner, next) = warmed_up(config);
        let splits = RefCell::new(Vec::<StepSeconds>::new());
        group.bench_function(format!("update_m100_batch1000_memory100_{name}"), |b| {
            b.iter_batched(
                || learner.clone(),
                |mut l| splits.borrow_mut().push(black_box(l.update(&next).unwrap()).seconds),
                BatchSize::LargeInput,
            )
        });
        results.insert(name.into(), split_table(name, &splits.into_inner()));
    }
    group.finish();
    c.final_summary();

    let json = serde_json::json!({
        "m": 100, "d": D, "batch": BATCH, "memory": 100, "schedules": results,
    });
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../bench-sequential.json");
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("\nwritten to {}", out.display());
}

/// Prints the mean time of each step and returns it as JSON.
fn split_table(name: &str, splits: &[StepSeconds]) -> serde_json::Value {
    let n = splits.len().max(1) as f64;
    let mean = |f: fn(&StepSeconds) -> f64| splits.iter().map(f).sum::<f64>() / n;
    let steps = [
        ("inducing", mean(|s| s.inducing)),
        ("e_step", mean(|s| s.e_step)),
        ("m_step", mean(|s| s.m_step)),
        ("memory", mean(|s| s.memory)),
    ];
    let total: f64 = steps.iter().map(|s| s.1).sum();
    println!("\n{name}\n| step | seconds | share |\n|---|---|---|");
    for (step, t) in steps {
        println!("| {step} | {t:.4} | {:.0} % |", 100.0 * t / total);
    }
    println!("| update | {total:.4} | {:.0} records/s |", BATCH as f64 / total);
    let mut seconds: serde_json::Map<String, serde_json::Value> =
        steps.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
    seconds.insert("update".into(), total.into());
    serde_json::json!({
        "updates_timed": splits.len(),
        "seconds": seconds,
        "records_per_second": BATCH as f64 / total,
    })
}
