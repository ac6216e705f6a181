//! One Algorithm 1 update: m = 100, batch 1000, memory 100 (reservoir), d = 8,
//! Gaussian likelihood, pivoted inducing inputs, 4 E-steps, 20 Adam steps.
//! Criterion times the whole update; the learner's own step timer splits it,
//! averaged over the measured updates, into `target/bench-sequential.json`.

use std::cell::RefCell;
use std::hint::black_box;
use std::path::Path;

use criterion::{BatchSize, Criterion, Throughput};
use dualgp::model::{Data, Family, Kernel, Likelihood, MemoryPolicy, SequentialConfig, SequentialLearner, StepSeconds};
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

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let config = SequentialConfig {
        inducing: 100,
        memory: MemoryPolicy::Reservoir { capacity: 100 },
        ..SequentialConfig::default()
    };
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![2.0]);
    let mut learner = SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap();
    // Warm up until the memory is full, as in a long-running stream.
    while learner.memory.len() < 100 {
        learner.update(&batch(&mut rng)).unwrap();
    }
    let next = batch(&mut rng);
    let splits = RefCell::new(Vec::<StepSeconds>::new());

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("sequential");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(20);
    group.bench_function("update_m100_batch1000_memory100", |b| {
        b.iter_batched(
            || learner.clone(),
            |mut l| splits.borrow_mut().push(black_box(l.update(&next).unwrap()).seconds),
            BatchSize::LargeInput,
        )
    });
    group.finish();
    c.final_summary();

    let splits = splits.into_inner();
    let n = splits.len().max(1) as f64;
    let mean = |f: fn(&StepSeconds) -> f64| splits.iter().map(f).sum::<f64>() / n;
    let (inducing, e_step, m_step, memory) = (
        mean(|s| s.inducing),
        mean(|s| s.e_step),
        mean(|s| s.m_step),
        mean(|s| s.memory),
    );
    let total = inducing + e_step + m_step + memory;
    println!("\n| step | seconds | share |\n|---|---|---|");
    for (name, t) in [
        ("inducing", inducing),
        ("e_step", e_step),
        ("m_step", m_step),
        ("memory", memory),
    ] {
        println!("| {name} | {t:.4} | {:.0} % |", 100.0 * t / total);
    }
    println!("| update | {total:.4} | {:.0} records/s |", BATCH as f64 / total);
    let json = serde_json::json!({
        "m": 100, "d": D, "batch": BATCH, "memory": 100, "updates_timed": splits.len(),
        "seconds": { "inducing": inducing, "e_step": e_step, "m_step": m_step, "memory": memory, "update": total },
        "records_per_second": BATCH as f64 / total,
    });
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../bench-sequential.json");
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("\nwritten to {}", out.display());
}
