//! What a checkpoint write costs: serialising a learner with m = 100, d = 8
//! and a full memory of 1000 points, then the temporary file, fsync and
//! rename (`CheckpointStore::save`). `serve` writes one per update on a
//! thread of its own (operators/src/dataflow/checkpoint_writer.rs); this is
//! the pause that would otherwise stall the worker reducing every update.
//! Median of 5 writes into a directory under `target/`; writes
//! `target/bench-checkpoint.json`. Run with `cargo bench --bench checkpoint`.

use std::path::Path;
use std::time::Instant;

use dualgp::operators::dataflow::{Checkpoint, CheckpointStore};
use dualgp::operators::model::{
    Data, EStepConfig, Family, Kernel, Likelihood, MemoryPolicy, SequentialConfig, SequentialLearner,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const D: usize = 8;
const MEMORY: usize = 1000;
const WRITES: usize = 5;

/// A learner after ten batches of 1000 records, its memory full.
fn learner() -> SequentialLearner {
    let config = SequentialConfig {
        e_step: EStepConfig { steps: 1, rho: 1.0 },
        m_steps: 0,
        memory: MemoryPolicy::RandomReservoir { capacity: MEMORY },
        ..SequentialConfig::default()
    };
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![2.0; D]);
    let mut learner = SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for _ in 0..10 {
        let x: DMatrix<f64> = DMatrix::from_fn(1000, D, |_, _| rng.random_range(-2.0..2.0));
        let y = DVector::from_fn(1000, |i, _| x[(i, 0)].sin() + 0.1 * rng.random::<f64>());
        learner.update(&Data::new(x, y).unwrap()).unwrap();
    }
    assert_eq!(learner.memory.len(), MEMORY);
    learner
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test --all-targets` builds and runs benches once: nothing to time there
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-checkpoints");
    let _ = std::fs::remove_dir_all(&dir);
    let store = CheckpointStore::new(&dir, 2).unwrap();
    let learner = learner();
    let mut seconds: Vec<f64> = (0..WRITES as u64)
        .map(|epoch| {
            let checkpoint = Checkpoint::new(epoch, learner.clone(), vec![epoch]);
            let start = Instant::now();
            store.save(&checkpoint).unwrap();
            start.elapsed().as_secs_f64()
        })
        .collect();
    seconds.sort_by(f64::total_cmp);
    let bytes = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0);
    let json = serde_json::json!({
        "m": 100, "d": D, "memory": MEMORY,
        "bytes": bytes,
        "seconds_median": seconds[WRITES / 2],
        "seconds_max": seconds[WRITES - 1],
    });
    println!("{json:#}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-checkpoint.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
