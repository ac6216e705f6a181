//! Crash safety shown, not argued: `dualgp serve` killed with SIGKILL at
//! random moments, again and again, and restarted each time from its
//! checkpoints, against a real Kafka-protocol broker (tansu) on 127.0.0.1.
//! At the end every record has a prediction, no checkpoint is unreadable, and
//! the final model equals that of an uninterrupted run over the same records
//! (epochs cut by record count, so both learn the same batches): no epoch was
//! learned twice or lost.
//!
//! The same with a cluster of two processes (one worker each, a topic of two
//! partitions): one of the two, chosen at random, is killed each time; its
//! peer then fails (timely's failure model: a cluster does not outlive a
//! process) or waits for it, and whatever exited is restarted, as a
//! supervisor would. Every restart resumes from process 0's checkpoints.
//!
//! Ignored by the test suite (it takes minutes); `scripts/soak.sh` runs them.
//! `SOAK_KILLS` (default 20), `SOAK_RECORDS` (default 20 000),
//! `SOAK_SEED` (default 1) and `SOAK_WORKERS` (workers a process, default
//! 1; the one-process soak's topic has a partition each) change the runs; they write `soak.json` and
//! `soak-two-processes.json` into the target directory.

#[allow(dead_code)] // only the in-memory broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use broker::Broker;
use common::{create_topics, hostfile, newest_checkpoint, produce, read_topic_within, serve_command};
use dualgp_connectors::KafkaPosition;
use dualgp_operators::dataflow::{Checkpoint, CheckpointStore};
use dualgp_operators::model::{Predictive, StreamingLearner};
use dualgp_pipelines::serve::EPOCHS_IN_FLIGHT;
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Records per epoch. Every record is on the topic before serve starts, so
/// the count cuts every epoch; the timeout only ends the run (`--idle-exit`
/// is checked between epochs).
const BATCH: usize = 100;
const BATCH_TIMEOUT_MS: &str = "5000";

/// Workers a serve process runs (`SOAK_WORKERS`, default 1).
fn workers() -> usize {
    setting("SOAK_WORKERS", 1) as usize
}

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

/// A broker (stopped when dropped) and its address, the same `records`
/// messages of `seed` on both `topics`, each of `partitions` partitions.
fn broker_with_stream(records: usize, seed: u64, topics: [&str; 2], partitions: i32) -> (Broker, String) {
    let broker = Broker::start();
    let address = broker.address();
    let stream = messages(records, seed);
    for topic in topics {
        create_topics(&address, partitions, &[topic]);
        produce(&address, topic, &stream, partitions);
    }
    (broker, address)
}

/// The ids of every prediction on `topic`, read until `expected` have come
/// and then nothing new for three seconds, or for at most two minutes.
fn prediction_ids(address: &str, topic: &str, expected: usize) -> Vec<i64> {
    let payloads = read_topic_within(
        address,
        topic,
        expected,
        Duration::from_secs(3),
        Duration::from_secs(120),
    );
    payloads
        .iter()
        .map(|p| {
            serde_json::from_str::<serde_json::Value>(p).unwrap()["id"]
                .as_i64()
                .expect("an id")
        })
        .collect()
}

/// `dualgp serve` from `input` to `output`, checkpointing into `dir`, its
/// output appended to `log`.
fn spawn_serve(address: &str, input: &str, output: &str, dir: &Path, log: &Path) -> Child {
    spawn_member(address, input, output, Some(dir), log, &[])
}

/// [`spawn_serve`] with `extra` flags; without `dir`, no checkpoints.
fn spawn_member(address: &str, input: &str, output: &str, dir: Option<&Path>, log: &Path, extra: &[String]) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let checkpoints = dir
        .map(|d| vec!["--checkpoint-dir".to_string(), d.to_str().unwrap().to_string()])
        .unwrap_or_default();
    serve_command(address, input, output)
        .args(["--likelihood", "gaussian", "--batch-size", &BATCH.to_string()])
        .args([
            "--batch-timeout-ms",
            BATCH_TIMEOUT_MS,
            "--workers",
            &workers().to_string(),
            "--scoring",
            "prequential",
        ])
        .args(["--inducing", "30", "--idle-exit", "4"])
        .args(checkpoints)
        .args(extra)
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

#[test]
#[ignore = "minutes long; scripts/soak.sh runs it"]
fn serve_killed_with_sigkill_again_and_again_learns_every_epoch_once() {
    let (kills, records, seed) = (
        setting("SOAK_KILLS", 20),
        setting("SOAK_RECORDS", 20_000),
        setting("SOAK_SEED", 1),
    );
    let records = records as usize / BATCH * BATCH;
    let (_broker, address) = broker_with_stream(records, seed, ["soak-in", "calm-in"], workers() as i32);
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

    let end = end_of_soak(&address, "soak-out", (&soak_dir, &calm_dir), records, killed as usize);

    let mut figures = serde_json::json!({
        "workers": workers(),
        "kills": killed,
        "kills_during_a_checkpoint_write": during_write,
        "stream_finished_before_all_kills": finished_early,
        "records": records,
        "epochs": records / BATCH,
        "soak_seconds": soak_seconds,
        "seed": seed,
    });
    figures.as_object_mut().unwrap().extend(end);
    write_figures("soak.json", &figures);
    assert!(killed >= kills || finished_early, "{figures}");
}

/// The checks at the end of a soak, every record scored on `out`, no more
/// scored again than docs/OPERATIONS.md's bound for `restarts` restarts of
/// a process, and the model the uninterrupted run's
/// (`(soak_dir, calm_dir)`): the figures they give.
fn end_of_soak(
    address: &str,
    out: &str,
    (soak_dir, calm_dir): (&Path, &Path),
    records: usize,
    restarts: usize,
) -> serde_json::Map<String, serde_json::Value> {
    let (predictions, duplicates) = every_record_scored(address, out, records);
    // At most 2 x --epochs-in-flight x --batch-size per worker and restart.
    let bound = restarts * workers() * 2 * EPOCHS_IN_FLIGHT as usize * BATCH;
    assert!(
        duplicates <= bound,
        "{duplicates} predictions scored again over {restarts} restarts, more than {bound}"
    );
    let files = same_model_as_uninterrupted(soak_dir, calm_dir, records);
    let figures = serde_json::json!({
        "predictions": predictions,
        "predictions_repeated_after_restarts": duplicates,
        "bound_on_repeats": bound,
        "checkpoint_files_at_the_end": files,
    });
    figures.as_object().cloned().unwrap_or_default()
}

/// Every record scored, some more than once (those after the newest
/// checkpoint are scored again on restart): the predictions and the repeats.
fn every_record_scored(address: &str, topic: &str, records: usize) -> (usize, usize) {
    let ids = prediction_ids(address, topic, records);
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
    assert!(times.len() == records, "ids beyond the stream's were predicted");
    (ids.len(), ids.len() - records)
}

/// No checkpoint unreadable, no cut-short write left behind, and the last
/// model is the uninterrupted run's: every record learned once. Returns the
/// checkpoint files left.
fn same_model_as_uninterrupted(soak_dir: &Path, calm_dir: &Path, records: usize) -> usize {
    let files = all_readable(soak_dir);
    assert_eq!(partial_writes(soak_dir), BTreeSet::new());
    let (soak, calm) = (newest_checkpoint(soak_dir), newest_checkpoint(calm_dir));
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
    files
}

/// Prints the figures and keeps them in the target directory (`CARGO_TARGET_DIR`'s, if set).
fn write_figures(name: &str, figures: &serde_json::Value) {
    println!("{figures:#}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join(name), format!("{figures:#}\n")).unwrap();
}

/// Two `serve` processes of one worker as a timely cluster, each restarted
/// whenever it exits before the cluster's idle exit, as a supervisor would.
/// Process 0 checkpoints into `dir`; process 1 has no directory.
struct Pair<'a> {
    address: &'a str,
    input: &'a str,
    output: &'a str,
    dir: &'a Path,
    hosts: PathBuf,
    log: PathBuf,
    children: [Option<Child>; 2],
    /// Restarts of a process that exited by itself (its peer gone).
    peer_exits: usize,
    /// Set once both processes have exited with success.
    finished: [bool; 2],
}

impl<'a> Pair<'a> {
    fn new(address: &'a str, input: &'a str, output: &'a str, dir: &'a Path, work: &Path, tag: &str) -> Self {
        Pair {
            address,
            input,
            output,
            dir,
            hosts: hostfile(work),
            log: work.join(format!("{tag}.log")),
            children: [None, None],
            peer_exits: 0,
            finished: [false; 2],
        }
    }

    fn spawn(&mut self, process: usize) {
        let extra: Vec<String> = [
            "--processes",
            "2",
            "--process",
            &process.to_string(),
            "--hostfile",
            self.hosts.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        let dir = (process == 0).then_some(self.dir);
        let child = spawn_member(self.address, self.input, self.output, dir, &self.log, &extra);
        self.children[process] = Some(child);
        self.finished[process] = false;
    }

    /// Starts what is not running; restarts what failed. True once both
    /// processes have ended with success (the stream served to its end).
    fn supervise(&mut self) -> bool {
        for process in 0..2 {
            match self.children[process].as_mut().map(|c| c.try_wait().unwrap()) {
                None => self.spawn(process),
                Some(None) => {}
                Some(Some(status)) if status.success() => {
                    self.children[process] = None;
                    self.finished[process] = true;
                }
                Some(Some(_)) => {
                    self.peer_exits += 1;
                    self.spawn(process);
                }
            }
        }
        self.finished == [true; 2]
    }

    fn kill(&mut self, process: usize) {
        if let Some(mut child) = self.children[process].take() {
            let _ = child.kill(); // SIGKILL
            child.wait().unwrap();
        }
    }

    /// Supervises until both processes have ended with success.
    fn run_to_the_end(&mut self, limit: Duration) {
        let started = Instant::now();
        while !self.supervise() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().join("\n");
            assert!(
                started.elapsed() < limit,
                "the cluster did not finish in {limit:?}; the log's end, newest first:\n{tail}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Pair<'_> {
    fn drop(&mut self) {
        for process in 0..2 {
            self.kill(process);
        }
    }
}

#[test]
#[ignore = "minutes long; scripts/soak.sh runs it"]
fn a_two_process_serve_cluster_with_either_process_killed_again_and_again_learns_every_epoch_once() {
    let (kills, records, seed) = (
        setting("SOAK_KILLS", 20),
        setting("SOAK_RECORDS", 20_000),
        setting("SOAK_SEED", 1),
    );
    // Every worker's epochs are cut by count: each partition holds whole epochs.
    let records = records as usize / (2 * BATCH) * (2 * BATCH);
    let (_broker, address) = broker_with_stream(records, seed, ["soak2-in", "calm2-in"], 2);
    let work = tempfile::tempdir().unwrap();
    let (soak_dir, calm_dir) = (work.path().join("soak"), work.path().join("calm"));
    let limit = Duration::from_secs(600);

    // The uninterrupted run first: the standardisation is fitted on whichever
    // records the first fetch of the two partitions brings, so the soak starts
    // from the same (a fresh cluster would fit its own).
    Pair::new(&address, "calm2-in", "calm2-out", &calm_dir, work.path(), "calm").run_to_the_end(limit);
    std::fs::create_dir_all(&soak_dir).unwrap();
    std::fs::copy(calm_dir.join("scaling.json"), soak_dir.join("scaling.json")).unwrap();

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pair = Pair::new(&address, "soak2-in", "soak2-out", &soak_dir, work.path(), "soak");
    let (mut killed, mut victims, mut during_write, mut finished_early) = (0, [0usize; 2], 0, false);
    let started = Instant::now();
    while killed < kills {
        let left_over = partial_writes(&soak_dir);
        if pair.supervise() {
            finished_early = true;
            break;
        }
        let deadline = Instant::now() + Duration::from_secs_f64(rng.random_range(0.5..4.0));
        let victim = rng.random_range(0..2usize);
        let mut in_write = false;
        while Instant::now() < deadline {
            if pair.supervise() {
                finished_early = true;
                break;
            }
            // Only process 0 writes checkpoints: kill it then, half of the time.
            let writing = !partial_writes(&soak_dir).is_subset(&left_over);
            if victim == 0 && writing && rng.random_bool(0.5) {
                in_write = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if finished_early {
            break;
        }
        pair.kill(victim);
        killed += 1;
        victims[victim] += 1;
        during_write += usize::from(in_write);
    }
    pair.run_to_the_end(limit);
    let soak_seconds = started.elapsed().as_secs_f64();
    let peer_exits = pair.peer_exits;
    drop(pair);

    let end = end_of_soak(
        &address,
        "soak2-out",
        (&soak_dir, &calm_dir),
        records,
        killed as usize + peer_exits,
    );
    let mut figures = serde_json::json!({
        "processes": 2,
        "kills": killed,
        "kills_of_process_0": victims[0],
        "kills_of_process_1": victims[1],
        "kills_during_a_checkpoint_write": during_write,
        "peers_that_exited_after_a_kill_and_were_restarted": peer_exits,
        "stream_finished_before_all_kills": finished_early,
        "records": records,
        "epochs_per_worker": records / (2 * BATCH),
        "soak_seconds": soak_seconds,
        "seed": seed,
    });
    figures.as_object_mut().unwrap().extend(end);
    write_figures("soak-two-processes.json", &figures);
    assert!(killed >= kills || finished_early, "{figures}");
}
