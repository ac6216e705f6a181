//! Crash safety shown, not argued: `dualgp serve` killed with SIGKILL at
//! random moments, again and again, and restarted each time from its
//! checkpoints, against a real Kafka-protocol broker (tansu) on 127.0.0.1.
//! At the end every record has a prediction, no checkpoint is unreadable, and
//! the final model equals that of an uninterrupted run over the same records
//! (epochs cut by record count, so both learn the same batches): no epoch was
//! learned twice or lost.
//!
//! Ignored by the test suite (it takes minutes); `scripts/soak.sh` runs it.
//! `SOAK_KILLS` (default 20), `SOAK_RECORDS` (default 20 000) and
//! `SOAK_SEED` (default 1) change the run; it writes `target/soak.json`.

#[allow(dead_code)] // only the in-memory broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use broker::Broker;
use common::{produce, serve_command};
use dualgp_connectors::kafka::create_topic;
use dualgp_connectors::{KafkaConnection, KafkaPosition};
use dualgp_operators::dataflow::{Checkpoint, CheckpointStore};
use dualgp_operators::model::{Predictive, StreamingLearner};
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// Records per epoch. Every record is on the topic before serve starts, so
/// the count cuts every epoch; the timeout only ends the run (`--idle-exit`
/// is checked between epochs).
const BATCH: usize = 100;
const BATCH_TIMEOUT_MS: &str = "5000";

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Labelled regression records, `y = sin(3 x0) + x1² + noise`.
fn messages(n: usize, seed: u64) -> Vec<(String, String)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|id| {
            let (x0, x1): (f64, f64) = (rng.random_range(-2.0..2.0), rng.random_range(-2.0..2.0));
            let y = (3.0 * x0).sin() + x1 * x1 + 0.1 * rng.random::<f64>();
            (id.to_string(), format!(r#"{{"id":{id},"x0":{x0},"x1":{x1},"y":{y}}}"#))
        })
        .collect()
}

/// The ids of every prediction on `topic`, read until `expected` have come
/// and then nothing new for three seconds, or for at most two minutes.
fn prediction_ids(address: &str, topic: &str, expected: usize) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", address)
        .set("group.id", "soak-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&list).unwrap();
    let mut ids = Vec::new();
    let (start, mut last) = (Instant::now(), Instant::now());
    while (ids.len() < expected || last.elapsed() < Duration::from_secs(3))
        && start.elapsed() < Duration::from_secs(120)
    {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.unwrap();
            let v: serde_json::Value = serde_json::from_slice(message.payload().unwrap_or_default()).unwrap();
            ids.push(v["id"].as_i64().expect("an id"));
            last = Instant::now();
        }
    }
    ids
}

/// `dualgp serve` from `input` to `output`, checkpointing into `dir`, its
/// output appended to `log`.
fn spawn_serve(address: &str, input: &str, output: &str, dir: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    serve_command(address, input, output)
        .args(["--likelihood", "gaussian", "--batch-size", &BATCH.to_string()])
        .args([
            "--batch-timeout-ms",
            BATCH_TIMEOUT_MS,
            "--workers",
            "1",
            "--scoring",
            "prequential",
        ])
        .args(["--inducing", "30", "--idle-exit", "4"])
        .args(["--checkpoint-dir", dir.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(log.try_clone().unwrap())
        .spawn()
        .expect("the dualgp binary runs")
}

fn run_to_idle_exit(address: &str, input: &str, output: &str, dir: &Path, log: &Path) {
    let status = spawn_serve(address, input, output, dir, log).wait().unwrap();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "serve failed: {text}");
}

/// The temporary files of checkpoint writes in `dir`: under way, or left by a kill.
fn partial_writes(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".partial"))
                .collect()
        })
        .unwrap_or_default()
}

fn checkpoint_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("checkpoint-"))
        .collect();
    files.sort();
    files
}

/// Every checkpoint file reads back on its own.
fn all_readable(dir: &Path) -> usize {
    let files = checkpoint_files(dir);
    for file in &files {
        let alone = tempfile::tempdir().unwrap();
        std::fs::copy(file, alone.path().join(file.file_name().unwrap())).unwrap();
        let store = CheckpointStore::new(alone.path(), 3).unwrap();
        let read: Option<Checkpoint<KafkaPosition>> =
            store.latest().unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(read.is_some(), "{} did not read back", file.display());
    }
    files.len()
}

fn latest(dir: &Path) -> Checkpoint<KafkaPosition> {
    CheckpointStore::new(dir, 3)
        .unwrap()
        .latest()
        .unwrap()
        .expect("a checkpoint")
}

#[test]
#[ignore = "minutes long; scripts/soak.sh runs it"]
fn serve_killed_with_sigkill_again_and_again_learns_every_epoch_once() {
    let (kills, records, seed) = (
        setting("SOAK_KILLS", 20),
        setting("SOAK_RECORDS", 20_000),
        setting("SOAK_SEED", 1),
    );
    let records = records as usize / BATCH * BATCH;
    let broker = Broker::start();
    let address = broker.address();
    let conn = KafkaConnection::new(&address).with_timeout(Duration::from_secs(20));
    let stream = messages(records, seed);
    for topic in ["soak-in", "calm-in"] {
        create_topic(&conn, topic, 1).unwrap();
        produce(&address, topic, &stream, 1);
    }
    let work = tempfile::tempdir().unwrap();
    let (soak_dir, calm_dir) = (work.path().join("soak"), work.path().join("calm"));
    let log = work.path().join("soak.log");

    // Kill at a random moment of each run; when a checkpoint is being written,
    // kill then instead, half of the time.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut killed, mut during_write, mut finished_early) = (0, 0, false);
    let started = Instant::now();
    while killed < kills {
        // A write the last kill cut short stays until the next checkpoint.
        let left_over = partial_writes(&soak_dir);
        let mut serve = spawn_serve(&address, "soak-in", "soak-out", &soak_dir, &log);
        let deadline = Instant::now() + Duration::from_secs_f64(rng.random_range(0.5..4.0));
        let mut in_write = false;
        while Instant::now() < deadline {
            if serve.try_wait().unwrap().is_some() {
                finished_early = true;
                break;
            }
            let writing = !partial_writes(&soak_dir).is_subset(&left_over);
            if writing && rng.random_bool(0.5) {
                in_write = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if finished_early {
            break;
        }
        serve.kill().unwrap(); // SIGKILL
        serve.wait().unwrap();
        killed += 1;
        during_write += usize::from(in_write);
    }
    run_to_idle_exit(&address, "soak-in", "soak-out", &soak_dir, &log);
    let soak_seconds = started.elapsed().as_secs_f64();
    run_to_idle_exit(
        &address,
        "calm-in",
        "calm-out",
        &calm_dir,
        &work.path().join("calm.log"),
    );

    // Every record scored, some more than once (those after the newest
    // checkpoint are scored again on restart).
    let ids = prediction_ids(&address, "soak-out", records);
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for id in &ids {
        *times.entry(*id).or_default() += 1;
    }
    let missing: Vec<i64> = (0..records as i64).filter(|id| !times.contains_key(id)).collect();
    assert!(
        missing.is_empty(),
        "{} records never scored: {missing:?}",
        missing.len()
    );
    let duplicates = ids.len() - records;

    // No checkpoint unreadable, no cut-short write left behind, and the last
    // model is the uninterrupted run's.
    let files = all_readable(&soak_dir);
    assert_eq!(partial_writes(&soak_dir), BTreeSet::new());
    let (soak, calm) = (latest(&soak_dir), latest(&calm_dir));
    assert_eq!(soak.epoch, calm.epoch);
    assert_eq!(soak.learner.n_seen, records as u64);
    assert_eq!(calm.learner.n_seen, records as u64);
    let grid = DMatrix::from_fn(50, 2, |i, j| {
        if j == 0 {
            i as f64 / 12.5 - 2.0
        } else {
            1.0 - i as f64 / 25.0
        }
    });
    let (a, b) = (
        soak.learner.predict(&grid).unwrap(),
        calm.learner.predict(&grid).unwrap(),
    );
    for (i, pair) in a.iter().zip(&b).enumerate() {
        let (Predictive::Moments { mean: m1, var: v1 }, Predictive::Moments { mean: m2, var: v2 }) = pair else {
            panic!("Gaussian predictions are moments")
        };
        assert!(
            (m1 - m2).abs() < 1e-9 && (v1 - v2).abs() < 1e-9,
            "point {i}: {pair:?}: after the kills, then uninterrupted"
        );
    }

    let figures = serde_json::json!({
        "kills": killed,
        "kills_during_a_checkpoint_write": during_write,
        "stream_finished_before_all_kills": finished_early,
        "records": records,
        "epochs": records / BATCH,
        "predictions": ids.len(),
        "predictions_repeated_after_restarts": duplicates,
        "checkpoint_files_at_the_end": files,
        "soak_seconds": soak_seconds,
        "seed": seed,
    });
    println!("{figures:#}");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/soak.json");
    std::fs::write(target, format!("{figures:#}\n")).unwrap();
    assert!(killed >= kills || finished_early, "{figures}");
}
