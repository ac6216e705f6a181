//! Checkpoints: a run aborted after epoch k and restarted from its checkpoint
//! ends with the same model and the same predictions for later epochs as a run
//! that was never interrupted, and applies every epoch exactly once.

mod common;

use std::sync::{Arc, Mutex};

use common::small_config;
use dualgp_operators::dataflow::{
    Checkpoint, CheckpointStore, LearnGp, ModelUpdate, Prediction, Record, WriteCheckpoints,
};
use dualgp_operators::model::{
    Data, EStepConfig, Family, Kernel, Likelihood, MemoryPolicy, Predictive, SequentialConfig, SequentialLearner,
    StreamingLearner,
};
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use timely::dataflow::operators::Input;
use timely::dataflow::operators::{Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle};

const EPOCHS: u64 = 6;
const ABORT_AFTER: u64 = 2;
const WORKERS: usize = 2;

fn stream() -> Vec<Vec<Record>> {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let mut id = 0;
    (0..EPOCHS)
        .map(|_| {
            (0..50)
                .map(|_| {
                    let x: Vec<f64> = (0..2).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let y = (1.5 * x[0]).sin() * x[1].cos() + 0.1 * rng.random::<f64>();
                    id += 1;
                    Record::new(id, x, Some(y))
                })
                .collect()
        })
        .collect()
}

fn learner() -> SequentialLearner {
    let config = SequentialConfig {
        inducing: 15,
        e_step: EStepConfig { steps: 2, rho: 1.0 },
        m_rounds: 2,
        memory: MemoryPolicy::Reservoir { capacity: 30 },
        seed: 3,
        ..small_config()
    };
    let kernel = Kernel::stationary(Family::Matern32, 1.0, vec![0.8, 0.8]);
    SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.2 }, config).unwrap()
}

#[derive(Default)]
struct Outputs {
    predictions: Vec<Prediction>,
    updates: Vec<ModelUpdate>,
}

/// Runs the stream from the newest checkpoint in `dir` (or from the start),
/// one epoch in flight, checkpointing every update; with `abort_after`, the
/// process aborts right after that epoch's checkpoint is on disk; with
/// `silent_from`, worker 1 reports no position from that epoch on.
fn run(dir: &std::path::Path, abort_after: Option<u64>, silent_from: Option<u64>) -> Outputs {
    let store = CheckpointStore::new(dir, 3).unwrap();
    let resumed: Option<Checkpoint<u64>> = store.latest().unwrap();
    let outputs = Arc::new(Mutex::new(Outputs::default()));
    let out = Arc::clone(&outputs);
    timely::execute(timely::Config::process(WORKERS), move |worker| {
        let (learner, start) = match &resumed {
            Some(cp) => (cp.learner.clone(), cp.positions[worker.index()]),
            None => (learner(), 0),
        };
        let (mut records, mut positions) = (InputHandleVec::new(), InputHandleVec::new());
        let probe = ProbeHandle::new();
        let (o1, o2) = (Arc::clone(&out), Arc::clone(&out));
        let store = store.clone();
        worker.dataflow::<u64, _, _>(|scope| {
            let gp = scope.input_from(&mut records).learn_gp(learner, 2);
            gp.predictions
                .inspect(move |p| o1.lock().unwrap().predictions.push(p.clone()))
                .probe_with(&probe);
            gp.updates
                .inspect(move |u| o2.lock().unwrap().updates.push(u.clone()))
                .write_checkpoints(scope.input_from(&mut positions), store)
                .inspect(move |saved| {
                    let epoch = *saved.as_ref().expect("checkpoint saved");
                    if Some(epoch) == abort_after {
                        std::process::abort();
                    }
                })
                .probe_with(&probe);
        });
        records.advance_to(start);
        positions.advance_to(start);
        let epochs = stream();
        for epoch in start..EPOCHS {
            if worker.index() == 0 {
                for r in &epochs[epoch as usize] {
                    records.send(r.clone());
                }
            }
            if worker.index() != 1 || silent_from.is_none_or(|e| epoch < e) {
                positions.send((worker.index(), epoch + 1));
            }
            records.advance_to(epoch + 1);
            positions.advance_to(epoch + 1);
            while probe.less_than(&(epoch + 1)) {
                worker.step();
            }
        }
    })
    .unwrap();
    Arc::try_unwrap(outputs).ok().unwrap().into_inner().unwrap()
}

fn moments(p: &Predictive) -> (f64, f64) {
    match p {
        Predictive::Moments { mean, var } => (*mean, *var),
        Predictive::Classes(_) => unreachable!("a regression stream"),
    }
}

#[test]
fn a_run_aborted_after_an_epoch_resumes_from_its_checkpoint_as_if_never_stopped() {
    let whole = run(tempfile::tempdir().unwrap().path(), None, None);

    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["aborting_run", "--exact", "--ignored", "--nocapture"])
        .env("DUALGP_TEST_CHECKPOINTS", dir.path())
        .status()
        .unwrap();
    assert!(!status.success(), "the first run was meant to abort");
    let latest: Checkpoint<u64> = CheckpointStore::new(dir.path(), 3).unwrap().latest().unwrap().unwrap();
    assert_eq!(latest.epoch, ABORT_AFTER);
    assert_eq!(latest.positions, vec![ABORT_AFTER + 1; WORKERS]);

    let resumed = run(dir.path(), None, None);
    let mut applied: Vec<u64> = resumed.updates.iter().map(|u| u.epoch).collect();
    applied.sort_unstable();
    assert_eq!(
        applied,
        ((ABORT_AFTER + 1)..EPOCHS).collect::<Vec<_>>(),
        "each epoch after the checkpoint once"
    );

    let want: std::collections::HashMap<i64, (f64, f64)> = whole
        .predictions
        .iter()
        .map(|p| (p.id, moments(&p.predictive)))
        .collect();
    assert_eq!(resumed.predictions.len(), 50 * (EPOCHS - ABORT_AFTER - 1) as usize);
    // Bit for bit: the checkpoint's floats read back exactly.
    for p in &resumed.predictions {
        assert_eq!(moments(&p.predictive), want[&p.id], "record {}", p.id);
    }

    let final_of = |o: &Outputs| {
        let mut learner = o.updates.iter().max_by_key(|u| u.epoch).unwrap().learner.clone();
        learner.ensure_factors().unwrap();
        learner
    };
    let (a, b) = (final_of(&resumed), final_of(&whole));
    assert_eq!((a.batches, a.n_seen), (b.batches, b.n_seen));
    assert_eq!(a.batches, EPOCHS);
    let grid = DMatrix::from_fn(30, 2, |i, j| -2.0 + 0.13 * (i + 2 * j) as f64);
    assert_eq!(a.predict(&grid).unwrap(), b.predict(&grid).unwrap());
}

#[test]
#[ignore = "the aborted first half of a_run_aborted_after_an_epoch_resumes_from_its_checkpoint_as_if_never_stopped"]
fn aborting_run() {
    let dir = std::env::var("DUALGP_TEST_CHECKPOINTS").unwrap();
    run(std::path::Path::new(&dir), Some(ABORT_AFTER), None);
}

#[test]
fn an_epoch_a_worker_did_not_report_gets_no_checkpoint() {
    // As in `serve` when a worker cannot deliver its predictions: it reports
    // no position for that epoch, and resuming after it would skip them.
    let dir = tempfile::tempdir().unwrap();
    let outputs = run(dir.path(), None, Some(4));
    assert_eq!(outputs.updates.len(), EPOCHS as usize, "every epoch is still learned");
    let latest: Checkpoint<u64> = CheckpointStore::new(dir.path(), 3).unwrap().latest().unwrap().unwrap();
    assert_eq!(latest.epoch, 3);
    assert_eq!(latest.positions, vec![4; WORKERS]);
}

#[test]
fn a_checkpoint_of_another_format_version_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path(), 2).unwrap();
    let old = r#"{"version": 1, "epoch": 3, "learner": {}, "positions": []}"#;
    std::fs::write(dir.path().join("checkpoint-00000000000000000003.json"), old).unwrap();
    let err = store.latest::<u64>().unwrap_err().to_string();
    assert!(
        err.contains("format version 1") && err.contains("empty checkpoint directory"),
        "{err}"
    );
}

/// A store holding checkpoints of epochs 1, 2 and 3 (an unfitted learner;
/// the position says which epoch a checkpoint came from).
fn three_checkpoints() -> (tempfile::TempDir, CheckpointStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path(), 3).unwrap();
    for epoch in 1..=3 {
        let checkpoint = Checkpoint::new(epoch, learner(), vec![10 * epoch]);
        store.save(&checkpoint).unwrap();
    }
    (dir, store)
}

fn newest_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("checkpoint-00000000000000000003.json")
}

#[test]
fn a_damaged_newest_checkpoint_gives_way_to_the_one_before() {
    type Damage = fn(&mut Vec<u8>);
    let damages: [(&str, Damage); 4] = [
        ("garbage", |bytes| *bytes = b"\x00\x17not a checkpoint at all".to_vec()),
        ("truncated", |bytes| bytes.truncate(bytes.len() / 2)),
        ("its checksum line cut short", |bytes| bytes.truncate(bytes.len() - 3)),
        // Still valid JSON of the right shape: only the checksum can tell.
        ("a digit changed", |bytes| {
            let key = b"\"positions\":[3";
            let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() - 1;
            bytes[at] = b'4';
        }),
    ];
    for (what, damage) in damages {
        let (dir, store) = three_checkpoints();
        let mut bytes = std::fs::read(newest_file(dir.path())).unwrap();
        damage(&mut bytes);
        std::fs::write(newest_file(dir.path()), bytes).unwrap();
        let latest: Checkpoint<u64> = store.latest().unwrap().unwrap();
        assert_eq!((latest.epoch, latest.positions.clone()), (2, vec![20]), "newest {what}");
    }
}

#[test]
fn when_no_checkpoint_reads_back_the_newest_ones_error_is_told() {
    let (dir, store) = three_checkpoints();
    for epoch in 1..=3 {
        let path = dir.path().join(format!("checkpoint-{epoch:020}.json"));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(path, bytes).unwrap();
    }
    let err = store.latest::<u64>().unwrap_err().to_string();
    assert!(
        err.contains("00000000000000000003") && err.contains("checksum"),
        "{err}"
    );
}

#[test]
fn checkpoints_written_before_checksums_still_read() {
    let (dir, store) = three_checkpoints();
    let text = std::fs::read_to_string(newest_file(dir.path())).unwrap();
    let body = text.trim_end().rsplit_once('\n').unwrap().0;
    std::fs::write(newest_file(dir.path()), body).unwrap();
    let latest: Checkpoint<u64> = store.latest().unwrap().unwrap();
    assert_eq!(latest.epoch, 3);
}

/// What a restart does to the learner: written as JSON, read back, then
/// learning on. It must go on exactly as the learner that was never written,
/// or a long stream with many restarts drifts from the uninterrupted run
/// (`scripts/soak.sh` checks that end to end).
#[test]
fn a_learner_read_back_from_json_learns_on_bit_for_bit() {
    let config = SequentialConfig {
        inducing: 20,
        ..SequentialConfig::default()
    };
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.8, 0.8]);
    let mut live = SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.2 }, config).unwrap();
    let epochs = stream();
    let data = |records: &[Record]| {
        let rows: Vec<Vec<f64>> = records.iter().map(|r| r.features.clone()).collect();
        let y: Vec<f64> = records.iter().map(|r| r.label.unwrap()).collect();
        let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
        (ids, Data::from_rows(&rows, &y).unwrap())
    };
    let grid = DMatrix::from_fn(30, 2, |i, j| -2.0 + 0.13 * (i + 2 * j) as f64);
    for (i, records) in epochs.iter().enumerate() {
        let (ids, batch) = data(records);
        let mut restored: SequentialLearner = serde_json::from_str(&serde_json::to_string(&live).unwrap()).unwrap();
        live.update_with_ids(&ids, &batch).unwrap();
        restored.update_with_ids(&ids, &batch).unwrap();
        assert_eq!(
            restored.predict(&grid).unwrap(),
            live.predict(&grid).unwrap(),
            "after epoch {i}"
        );
        assert_eq!(
            serde_json::to_string(&restored).unwrap(),
            serde_json::to_string(&live).unwrap()
        );
    }
}

#[test]
fn the_next_save_removes_what_a_write_killed_midway_left() {
    let (dir, store) = three_checkpoints();
    let left = dir.path().join(".checkpoint-00000000000000000004.json.partial");
    std::fs::write(&left, b"{\"version\":").unwrap();
    let checkpoint = Checkpoint::new(5, learner(), vec![50]);
    store.save(&checkpoint).unwrap();
    assert!(!left.exists(), "a partial write outlived the next checkpoint");
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, 3, "the newest three checkpoints and nothing else");
}
