//! The built `dualgp` as a timely cluster of two processes on 127.0.0.1:
//! `replay` and `run` on 2 processes × 1 worker write, bit for bit, the
//! predictions and dead letters of 1 process × 2 workers (and of 1 × 1:
//! prequential scoring does not depend on the workers); only process 0
//! writes; `serve` on 2 processes × 1 worker sends the predictions and
//! checkpoints the model of 1 process × 2 workers, bit for bit, against a
//! real Kafka-protocol broker (tansu); wrong cluster flags are one line each.

#[allow(dead_code)] // only the in-memory broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;
mod common;
#[path = "../../connectors/tests/common/mod.rs"]
mod parquet_files;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use arrow::array::{ArrayRef, Float64Array};
use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;
use broker::Broker;
use common::{
    assert_fails_with, create_topics, dualgp, hostfile, newest_checkpoint, output_within, produce, read_topic,
    terminate, words,
};
use parquet_files::{data, f64s, read_parquet, write_batch};

/// The longest a cluster run may take before its processes are killed.
const DEADLINE: Duration = Duration::from_secs(300);

/// Flags every run of a comparison shares.
const FLAGS: [&str; 6] = ["--likelihood", "gaussian", "--batch-size", "300", "--inducing", "20"];

/// Elevators' first 1200 rows in row groups of 250, so that each of two
/// workers reads row groups of its own, with three unusable rows: one in
/// worker 1's share (row 300), two in worker 0's.
fn stream_with_bad_rows(dir: &Path) -> PathBuf {
    let all = read_parquet(&data("elevators.parquet")).slice(0, 1200);
    let mut x0 = f64s(&all, "x0");
    let mut y = f64s(&all, "y");
    x0[5] = f64::NAN;
    x0[300] = f64::NEG_INFINITY;
    y[1100] = f64::INFINITY;
    let schema = all.schema();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .zip(all.columns())
        .map(|(field, column)| match field.name().as_str() {
            "x0" => Arc::new(Float64Array::from(x0.clone())) as ArrayRef,
            "y" => Arc::new(Float64Array::from(y.clone())) as ArrayRef,
            _ => Arc::clone(column),
        })
        .collect();
    let fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let path = dir.join("elevators-bad.parquet");
    write_batch(&path, &batch, 250);
    path
}

/// What one run wrote: the predictions' and dead letters' bytes, and the report.
struct Written {
    predictions: Vec<u8>,
    dead_letters: Vec<u8>,
    report: serde_json::Value,
}

/// Where a run with `tag` writes.
fn outputs(dir: &Path, tag: &str) -> [PathBuf; 2] {
    [dir.join(format!("{tag}.parquet")), dir.join(format!("{tag}.json"))]
}

fn written(dir: &Path, tag: &str) -> Written {
    let [predictions, report] = outputs(dir, tag);
    let read = |path: &Path| std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Written {
        predictions: read(&predictions),
        dead_letters: read(&dir.join(format!("{tag}.dead-letters.parquet"))),
        report: serde_json::from_slice(&read(&report)).unwrap(),
    }
}

fn replay_args(data: &Path, dir: &Path, tag: &str) -> Vec<String> {
    let [predictions, report] = outputs(dir, tag);
    let mut args: Vec<String> = ["replay", "--data", path(data), "--output", path(&predictions)]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--report".into(), path(&report).into()]);
    args.extend(FLAGS.iter().map(|s| s.to_string()));
    args
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// One process, `workers` threads.
fn replay_in_one_process(data: &Path, dir: &Path, workers: usize) -> Written {
    let tag = format!("1x{workers}");
    let mut args = replay_args(data, dir, &tag);
    args.extend(["--workers".into(), workers.to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = dualgp(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    written(dir, &tag)
}

/// The processes of one cluster run, killed if the test fails or they hang.
struct Cluster {
    children: Vec<Child>,
    logs: Vec<PathBuf>,
}

impl Cluster {
    /// Starts process `i` of two with `args_of(i)` plus the cluster flags;
    /// each process logs stdout and stderr to `dir/process-I.log`.
    fn start(dir: &Path, args_of: impl Fn(usize) -> Vec<String>) -> Cluster {
        let hosts = hostfile(dir);
        let mut cluster = Cluster {
            children: Vec::new(),
            logs: Vec::new(),
        };
        for process in 0..2 {
            let log = dir.join(format!("process-{process}.log"));
            let stdout = File::create(&log).unwrap();
            let stderr = stdout.try_clone().unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_dualgp"))
                .args(args_of(process))
                .args(["--processes", "2", "--process", &process.to_string()])
                .args(["--hostfile", path(&hosts)])
                .stdout(Stdio::from(stdout))
                .stderr(Stdio::from(stderr))
                .spawn()
                .unwrap();
            cluster.children.push(child);
            cluster.logs.push(log);
        }
        cluster
    }

    /// Waits for every process to exit successfully, within [`DEADLINE`].
    fn wait(mut self) -> Vec<String> {
        let started = Instant::now();
        for process in 0..self.children.len() {
            loop {
                if let Some(status) = self.children[process].try_wait().unwrap() {
                    assert!(
                        status.success(),
                        "process {process} failed ({status}):\n{}",
                        self.log(process)
                    );
                    break;
                }
                assert!(
                    started.elapsed() < DEADLINE,
                    "process {process} did not finish in {DEADLINE:?}:\n{}",
                    self.log(process)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        (0..self.children.len()).map(|p| self.log(p)).collect()
    }

    fn log(&self, process: usize) -> String {
        std::fs::read_to_string(&self.logs[process]).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn assert_same(a: &Written, b: &Written, what: &str) {
    assert!(a.predictions == b.predictions, "{what}: the predictions differ");
    assert!(a.dead_letters == b.dead_letters, "{what}: the dead letters differ");
    for key in [
        "records",
        "dead_letters",
        "dead_letter_reasons",
        "prequential_nlpd",
        "prequential_rmse",
        "epoch_scores",
    ] {
        assert_eq!(a.report[key], b.report[key], "{what}: the reports' {key} differ");
    }
}

#[test]
fn replay_on_two_processes_writes_what_one_process_of_two_workers_writes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let data = stream_with_bad_rows(dir.path());
    let one_by_one = replay_in_one_process(&data, dir.path(), 1);
    let one_by_two = replay_in_one_process(&data, dir.path(), 2);

    // Process 1 is given an output of its own, to show that it writes none.
    let logs = Cluster::start(dir.path(), |process| {
        let tag = if process == 0 { "2x1" } else { "2x1-process-1" };
        replay_args(&data, dir.path(), tag)
    })
    .wait();
    let two_by_one = written(dir.path(), "2x1");
    for file in outputs(dir.path(), "2x1-process-1") {
        assert!(!file.exists(), "process 1 wrote {}", file.display());
    }
    assert!(logs[1].contains("process 0 writes the predictions"), "{}", logs[1]);

    assert_eq!(one_by_two.report["records"], 1197);
    assert_eq!(
        one_by_two.report["dead_letter_reasons"],
        serde_json::json!({"non_finite": 2, "invalid_label": 1})
    );
    assert_eq!(two_by_one.report["processes"], 2);
    assert_same(&two_by_one, &one_by_two, "2 processes × 1 worker against 1 × 2");
    assert_same(&one_by_one, &one_by_two, "1 × 1 against 1 × 2");
}

#[test]
fn run_with_a_pipeline_file_on_two_processes_writes_what_replay_writes() {
    let dir = tempfile::tempdir().unwrap();
    let data = stream_with_bad_rows(dir.path());
    let alone = replay_in_one_process(&data, dir.path(), 2);
    let config = dir.path().join("pipeline.toml");
    let [predictions, report] = outputs(dir.path(), "run");
    let toml = format!(
        "likelihood = \"gaussian\"\n[source.parquet]\npath = {:?}\nbatch_size = 300\n\
         [model]\ninducing = 20\n[sinks]\npredictions = {:?}\nreport = {:?}\n",
        path(&data),
        path(&predictions),
        path(&report)
    );
    std::fs::write(&config, toml).unwrap();
    let logs = Cluster::start(dir.path(), |_| {
        ["run", "--config", path(&config), "--workers", "1"]
            .map(String::from)
            .to_vec()
    })
    .wait();
    assert!(logs[1].contains("process 1 of 2"), "{}", logs[1]);
    assert_same(
        &written(dir.path(), "run"),
        &alone,
        "run on 2 processes against replay on 1 × 2",
    );
}

#[test]
fn wrong_cluster_flags_are_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let banana = data("banana_train.parquet");
    let out = dir.path().join("p.parquet");
    let mut base = common::replay_args(&banana, &out);
    base.extend(["--likelihood", "bernoulli"]);
    fn joined<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [base, extra].concat()
    }
    let short = dir.path().join("short");
    std::fs::write(&short, "127.0.0.1:4000\n").unwrap();
    let garbled = dir.path().join("garbled");
    std::fs::write(&garbled, "127.0.0.1:4000\n127.0.0.1\n").unwrap();
    let absent = dir.path().join("absent");

    assert_fails_with(
        &joined(&base, &["--processes", "2", "--process", "2"]),
        "--process 2 is not below --processes 2",
    );
    assert_fails_with(
        &joined(&base, &["--process", "1"]),
        "--process 1 is not below --processes 1",
    );
    assert_fails_with(&joined(&base, &["--processes", "0"]), "--processes 0");
    assert_fails_with(
        &joined(&base, &["--processes", "2", "--hostfile", path(&short)]),
        "has 1 address(es)",
    );
    assert_fails_with(
        &joined(&base, &["--processes", "2", "--hostfile", path(&absent)]),
        "cannot read the hostfile",
    );
    assert_fails_with(
        &joined(&base, &["--processes", "2", "--hostfile", path(&garbled)]),
        "line 2: `127.0.0.1` is not host:port",
    );
    let config = dir.path().join("pipeline.toml");
    let toml = format!(
        "likelihood = \"bernoulli\"\n[source.parquet]\npath = {:?}\n[sinks]\npredictions = {:?}\n",
        path(&banana),
        path(&out)
    );
    std::fs::write(&config, toml).unwrap();
    assert_fails_with(
        &["run", "--config", path(&config), "--processes", "2", "--process", "5"],
        "--process 5 is not below --processes 2",
    );
    // serve checks the cluster flags before it looks for a broker.
    let mut serve = common::serve_args("127.0.0.1:1", "in", "out");
    serve.extend(words("--likelihood gaussian --processes 2 --process 2"));
    assert_fails_with(&serve, "--process 2 is not below --processes 2");
    assert!(!out.exists(), "a refused run left an output file");
}

/// Regression records `y = sin(3 x0) + x1² + noise`, keyed by id.
fn regression_messages(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|id| {
            let t = id as f64;
            let (x0, x1) = ((t * 0.37).sin() * 2.0, (t * 0.11).cos() * 2.0);
            let y = (3.0 * x0).sin() + x1 * x1 + 0.05 * (t * 1.7).sin();
            (id.to_string(), format!(r#"{{"id":{id},"x0":{x0},"x1":{x1},"y":{y}}}"#))
        })
        .collect()
}

/// Every message of the one-partition `topic`, as id → payloads, read until
/// `expected` have come and then nothing new for two seconds (at most a minute).
fn payloads_by_id(address: &str, topic: &str, expected: usize) -> BTreeMap<i64, Vec<String>> {
    let mut seen: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for text in read_topic(address, topic, expected) {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        seen.entry(v["id"].as_i64().unwrap()).or_default().push(text);
    }
    seen
}

/// `serve` flags of the comparison: prequential scoring (the same on any
/// number of workers), epochs of 100 records per worker, to its idle exit.
fn serve_args(address: &str, input: &str, output: &str, checkpoints: Option<&Path>) -> Vec<String> {
    let mut args = common::serve_args(address, input, output);
    // Epochs must be cut by count alone (every partition holds a multiple of
    // 100): a fetch slowed by a loaded machine must not close one early.
    args.extend(words("--likelihood gaussian --batch-size 100 --batch-timeout-ms 30000"));
    args.extend(words("--inducing 20 --scoring prequential"));
    // Kept last: a test without it removes it.
    args.extend(["--idle-exit", "3"]);
    let mut args: Vec<String> = args.into_iter().map(String::from).collect();
    if let Some(dir) = checkpoints {
        args.extend(["--checkpoint-dir".into(), path(dir).into()]);
    }
    args
}

#[test]
fn serve_on_two_processes_sends_and_learns_what_one_process_of_two_workers_does_bit_for_bit() {
    let (_broker, address) = Broker::with_topics(2, &["one-in", "two-in"]);
    // Made here, not by the first send of one of several producers, so
    // that the readers below know their partitions.
    create_topics(&address, 1, &["one-out", "two-out", "one-in.dlq", "two-in.dlq"]);
    let messages = regression_messages(1400);
    let dir = tempfile::tempdir().unwrap();
    let (one_dir, two_dir) = (dir.path().join("one"), dir.path().join("two"));

    // A first run, then a restart from the checkpoints with new records:
    // each ends with every record scored once and the same model.
    for (round, (range, newest_epoch)) in [(0..1000, 4), (1000..1400, 6)].into_iter().enumerate() {
        let (per_process, records) = (range.len() / 2, range.end);
        for topic in ["one-in", "two-in"] {
            produce(&address, topic, &messages[range.clone()], 2);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_dualgp"))
            .args(serve_args(&address, "one-in", "one-out", Some(&one_dir)))
            .args(["--workers", "2"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        if round == 0 {
            // The standardisation is fitted on the records the first fetch
            // brings, whichever partition they come from: the cluster starts
            // from the same.
            std::fs::create_dir_all(&two_dir).unwrap();
            std::fs::copy(one_dir.join("scaling.json"), two_dir.join("scaling.json")).unwrap();
        }

        // Process 1 has no checkpoint directory: process 0 tells it where to start.
        let logs = Cluster::start(dir.path(), |process| {
            let checkpoints = (process == 0).then_some(two_dir.as_path());
            let mut args = serve_args(&address, "two-in", "two-out", checkpoints);
            args.extend(["--workers".into(), "1".into()]);
            args
        })
        .wait();
        assert!(logs[0].contains("offsets committed through epoch"), "{}", logs[0]);
        for log in &logs {
            assert!(log.contains(&format!("{per_process} records scored")), "{log}");
        }

        let (one, two) = (
            payloads_by_id(&address, "one-out", records),
            payloads_by_id(&address, "two-out", records),
        );
        assert_eq!(one.len(), records);
        assert!(one.values().all(|p| p.len() == 1), "1 × 2 scored a record twice");
        assert!(
            one == two,
            "round {round}: 2 processes × 1 worker sent other predictions than 1 × 2"
        );

        let (a, b) = (newest_checkpoint(&one_dir), newest_checkpoint(&two_dir));
        assert_eq!((a.epoch, a.learner.n_seen), (newest_epoch, records as u64));
        assert_eq!(b.epoch, a.epoch);
        assert_eq!(
            serde_json::to_string(&a.learner).unwrap(),
            serde_json::to_string(&b.learner).unwrap(),
            "round {round}: the models differ"
        );
    }
}

#[test]
fn a_serve_process_whose_peer_never_starts_says_which_within_the_peer_timeout_before_any_record() {
    let (_broker, address) = Broker::with_topics(1, &["lonely-in"]);
    let dir = tempfile::tempdir().unwrap();
    let hosts = hostfile(dir.path());
    let mut args = serve_args(&address, "lonely-in", "lonely-out", None);
    // No --idle-exit, and the topic stays empty: a fresh start's wait for its
    // first records must not hold up the cluster's forming (nor its timeout).
    args.truncate(args.len() - 2);
    args.extend(["--processes", "2", "--process", "0", "--peer-timeout", "2"].map(String::from));
    args.extend(["--hostfile".into(), path(&hosts).into()]);
    let serve = Command::new(env!("CARGO_BIN_EXE_dualgp"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = output_within(serve, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let peer = std::fs::read_to_string(&hosts)
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("dualgp: the cluster did not form within 2 s (--peer-timeout)")
            && last.contains(&format!("process 1 at {peer}")),
        "{stderr}"
    );
    // It said what it waited for at once, too.
    assert!(stderr.contains("waiting for the cluster's other processes"), "{stderr}");
}

#[test]
fn sigterm_to_process_1_of_a_serve_cluster_stops_both_after_checkpointing() {
    let (_broker, address) = Broker::with_topics(2, &["in"]);
    create_topics(&address, 1, &["out", "in.dlq"]);
    produce(&address, "in", &regression_messages(400), 2);
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    // No --idle-exit: only the signal, to process 1 alone, stops the cluster.
    let cluster = Cluster::start(dir.path(), |process| {
        let mut args = serve_args(&address, "in", "out", None);
        args.truncate(args.len() - 2); // --idle-exit 3
        if process == 0 {
            args.extend(["--checkpoint-dir".into(), path(&checkpoints).into()]);
        }
        args
    });
    assert_eq!(payloads_by_id(&address, "out", 400).len(), 400);
    terminate(&cluster.children[1]);
    let logs = cluster.wait();
    assert!(logs[0].contains("offsets committed through epoch"), "{}", logs[0]);
    assert!(logs[1].contains("process 1 of 2"), "{}", logs[1]);
    assert_eq!(newest_checkpoint(&checkpoints).learner.n_seen, 400);
}
