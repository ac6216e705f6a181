//! The built `dualgp serve` against a real Kafka-protocol broker (tansu) on
//! 127.0.0.1: every produced record comes out scored exactly once, across a
//! restart from the checkpoint too; malformed messages land in `IN.dlq` with
//! their reasons; an unreachable broker is one clear line, and so is one
//! that goes away while serve runs.

#[path = "../../connectors/tests/common/broker.rs"]
mod broker;

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use broker::Broker;
use common::{dualgp, metrics_page, produce, read_topic, serve_command};
use dualgp_connectors::kafka::create_topic;
use dualgp_connectors::{shared_data, KafkaConnection, Table};

/// Creates the input topic `in`, of two partitions, on the broker at `address`.
fn create_input(address: &str) {
    let conn = KafkaConnection::new(address).with_timeout(Duration::from_secs(20));
    create_topic(&conn, "in", 2).unwrap();
    // Made here, not by the first send of one of several workers' producers,
    // so that the tests' readers know their partitions.
    create_topic(&conn, "out", 1).unwrap();
    create_topic(&conn, "in.dlq", 1).unwrap();
}

/// A port that was free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// banana's rows as `serve` input messages: `(id, JSON)`.
fn banana_messages() -> Vec<(i64, String)> {
    let path = shared_data("banana_train.parquet").unwrap_or_else(|e| panic!("{e}"));
    let table = Table::read(path, &Default::default()).unwrap();
    let labels = table.labels.as_ref().unwrap();
    (0..table.n())
        .map(|i| {
            let id = table.ids[i];
            let (x0, x1) = (table.features[(i, 0)], table.features[(i, 1)]);
            (id, format!(r#"{{"id":{id},"x0":{x0},"x1":{x1},"y":{}}}"#, labels[i]))
        })
        .collect()
}

/// Messages keyed by their id, as `produce` sends them.
fn keyed(messages: &[(i64, String)]) -> Vec<(String, String)> {
    messages.iter().map(|(id, m)| (id.to_string(), m.clone())).collect()
}

/// `dualgp serve` on banana messages from `in` (batches of 100, m = 20),
/// checkpointing into `checkpoints`, with `extra` flags; in the background.
fn spawn_serve(address: &str, checkpoints: &Path, extra: &[&str]) -> Child {
    serve_command(address, "in", "out")
        .args([
            "--likelihood",
            "bernoulli",
            "--batch-size",
            "100",
            "--batch-timeout-ms",
            "300",
        ])
        .args(["--inducing", "20", "--checkpoint-dir", checkpoints.to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the dualgp binary runs")
}

/// The metrics page's counts once the first run has read everything.
const COUNTED: [&str; 3] = [
    "dualgp_predictions_out_total 300",
    "dualgp_records_in_total 300",
    "dualgp_dead_letters_total 5",
];

/// Runs serve to its idle exit; with `metrics_port`, also returns the last
/// metrics page read while it ran.
fn serve(address: &str, checkpoints: &Path, workers: &str, metrics_port: Option<u16>) -> (String, String) {
    let port = metrics_port.map(|p| p.to_string());
    let mut extra = vec!["--workers", workers, "--idle-exit", "3"];
    if let Some(port) = &port {
        extra.extend(["--metrics-port", port]);
    }
    let child = spawn_serve(address, checkpoints, &extra);
    let mut page = String::new();
    if let Some(port) = metrics_port {
        // Read the endpoint until every record is counted (bounded: the run
        // itself is); records scored on arrival may go out before their epoch's count.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && !COUNTED.iter().all(|line| page.lines().any(|l| l == *line)) {
            if let Some(p) = metrics_page(port) {
                page = p;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "serve failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), page)
}

/// Waits (at most a minute) until the metrics count `n` predictions out.
fn wait_for_predictions(metrics_port: u16, n: usize) {
    let line = format!("dualgp_predictions_out_total {n}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !metrics_page(metrics_port).is_some_and(|p| p.contains(&line)) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The model epochs of each id's predictions on `out` (`expected` messages
/// awaited), checking each message's shape: `model_epoch` is null (the prior)
/// or an update before the record's epoch.
fn predictions(address: &str, expected: usize) -> BTreeMap<i64, Vec<Option<u64>>> {
    let mut seen = BTreeMap::new();
    for text in read_topic(address, "out", expected) {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let p = v["p"]
            .as_array()
            .unwrap_or_else(|| panic!("no class probabilities in {text}"));
        let (p0, p1) = (p[0].as_f64().unwrap(), p[1].as_f64().unwrap());
        assert!((p0 + p1 - 1.0).abs() < 1e-9 && (0.0..=1.0).contains(&p1), "{text}");
        let (epoch, model_epoch) = (v["epoch"].as_u64(), v["model_epoch"].as_u64());
        assert!(epoch.is_some(), "{text}");
        assert!(v["model_epoch"].is_null() || model_epoch < epoch, "{text}");
        seen.entry(v["id"].as_i64().unwrap())
            .or_insert_with(Vec::new)
            .push(model_epoch);
    }
    seen
}

#[test]
fn every_record_is_scored_exactly_once_across_a_restart_and_bad_messages_are_dead_letters() {
    let broker = Broker::start();
    let address = broker.address();
    create_input(&address);
    let checkpoints = tempfile::tempdir().unwrap();

    let messages = banana_messages();
    let (first, second) = messages.split_at(300);
    let mut batch = keyed(first);
    let malformed = [
        "{not json",
        r#"{"id":9001,"x0":0.5}"#,
        r#"{"id":9002,"x0":0.5,"x1":"abc","y":1}"#,
        r#"{"id":9003,"x0":0.5,"x1":0.1,"y":7}"#,
        r#"{"id":9004,"x0":0.5,"x1":0.1,"x2":0.3,"y":1}"#,
    ];
    batch.extend(malformed.iter().map(|m| ("bad".to_string(), m.to_string())));
    produce(&address, "in", &batch, 2);

    let metrics_port = free_port();
    let (stdout, page) = serve(&address, checkpoints.path(), "2", Some(metrics_port));
    assert!(stdout.contains("300 records scored"), "{stdout}");
    assert!(stdout.contains("offsets committed through epoch"), "{stdout}");
    let seen = predictions(&address, 300);
    assert_eq!(seen.len(), 300, "{stdout}");
    assert!(seen.values().all(|p| p.len() == 1), "scored twice: {seen:?}");
    assert!(first.iter().all(|(id, _)| seen.contains_key(id)));

    // The metrics endpoint counted them while serve ran.
    for line in COUNTED {
        assert!(page.lines().any(|l| l == line), "no `{line}` in\n{page}");
    }
    assert!(page.contains("dualgp_epoch_latency_seconds_count"), "{page}");
    assert!(page.contains("dualgp_prediction_staleness_epochs_count 300"), "{page}");

    let dlq = read_topic(&address, "in.dlq", malformed.len());
    assert_eq!(dlq.len(), malformed.len(), "{dlq:?}");
    for d in &dlq {
        let v: serde_json::Value = serde_json::from_str(d).unwrap();
        assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()), "{d}");
        assert!(v["kind"].is_string() && v["payload"].is_string(), "{d}");
    }
    let kinds: Vec<&str> = dlq
        .iter()
        .map(|d| if d.contains("invalid_label") { "label" } else { "other" })
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "label").count(), 1, "{dlq:?}");

    // A restart resumes after the checkpoint: only the new records are scored.
    produce(&address, "in", &keyed(second), 2);
    let (stdout, _) = serve(&address, checkpoints.path(), "1", None);
    assert!(stdout.contains("100 records scored"), "{stdout}");
    assert!(stdout.contains("offsets committed through epoch"), "{stdout}");
    let seen = predictions(&address, 400);
    assert_eq!(seen.len(), 400);
    assert!(seen.values().all(|p| p.len() == 1), "scored twice after the restart");
    // Scored on arrival by the restored model at least, never by the prior.
    assert!(second.iter().all(|(id, _)| seen[id][0].is_some()), "{seen:?}");

    // The checkpoint holds a model that learned from every labelled record once.
    let out = dualgp(&["inspect", checkpoints.path().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["records_seen"], 400, "{summary}");
    assert_eq!(summary["inducing"], 20, "{summary}");
    assert_eq!(summary["features"], 2, "{summary}");
    let out = dualgp(&["inspect", checkpoints.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("matern52, ARD over 2 inputs") && text.contains("400 records"),
        "{text}"
    );
}

/// Serve with `flags` against `address`, where no broker listens: it must
/// fail; its standard error.
fn refused(address: &str, flags: &[&str]) -> String {
    let out = serve_command(address, "in", "out")
        .args(["--likelihood", "gaussian"])
        .args(flags)
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_unreachable_broker_is_one_line_within_the_timeout() {
    let address = format!("127.0.0.1:{}", free_port());
    let stderr = refused(&address, &["--broker-timeout", "3"]);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&address), "{stderr}");
}

/// No epoch in flight would leave nothing to learn: refused before any broker is asked.
#[test]
fn no_epochs_in_flight_is_refused_with_the_flag_named() {
    let stderr = refused(&format!("127.0.0.1:{}", free_port()), &["--epochs-in-flight", "0"]);
    assert!(stderr.contains("--epochs-in-flight 0"), "{stderr}");
}

#[test]
fn sigterm_finishes_the_epoch_checkpoints_commits_and_exits_zero() {
    let broker = Broker::start();
    let address = broker.address();
    create_input(&address);
    produce(&address, "in", &keyed(&banana_messages()[..200]), 2);
    let checkpoints = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    // No --idle-exit: only the signal stops it.
    let port = metrics_port.to_string();
    let child = spawn_serve(&address, checkpoints.path(), &["--metrics-port", &port]);
    wait_for_predictions(metrics_port, 200);
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("200 records scored") && stdout.contains("offsets committed through epoch"),
        "{stdout}"
    );
    assert_eq!(predictions(&address, 200).len(), 200);
}

#[test]
fn a_broker_outage_stops_serve_with_one_line_and_a_restart_learns_each_record_once() {
    // Topics live in a local S3 server, so they outlive the broker process.
    let mut broker = Broker::start_durable();
    let address = broker.address();
    create_input(&address);
    let messages = keyed(&banana_messages()[..300]);
    let (before, after) = messages.split_at(200);
    produce(&address, "in", before, 2);
    let checkpoints = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let port = metrics_port.to_string();
    let mut child = spawn_serve(
        &address,
        checkpoints.path(),
        &["--metrics-port", &port, "--broker-timeout", "3"],
    );
    wait_for_predictions(metrics_port, 200);
    assert_eq!(predictions(&address, 200).len(), 200, "scored before the outage");

    broker.stop();
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("serve went on without its broker");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("dualgp: ") && last.contains(&address), "{stderr}");

    // With the broker back, a restart resumes from the checkpoint: the model
    // learns the new records, and none of the old ones a second time.
    broker.restart();
    produce(&address, "in", after, 2);
    let (stdout, _) = serve(&address, checkpoints.path(), "1", None);
    assert!(stdout.contains("100 records scored"), "{stdout}");
    assert_eq!(predictions(&address, 300).len(), 300);
    let out = dualgp(&["inspect", checkpoints.path().to_str().unwrap(), "--json"]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["records_seen"], 300, "{summary}");
}
