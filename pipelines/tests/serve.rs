//! The built `dualgp serve` against a real Kafka-protocol broker (tansu) on
//! 127.0.0.1: every produced record comes out scored exactly once, across a
//! restart from the checkpoint too; malformed messages land in `IN.dlq` with
//! their reasons; an unreachable broker is one clear line, and so is one
//! that goes away while serve runs for longer than `--broker-timeout`; a
//! shorter outage is ridden out with nothing lost or doubled. Serve says what it waits for at once (a
//! missing topic, the broker), what it starts from, and how far it has come;
//! started from a model a backtest saved, it scores with that model at once.

#[path = "../../connectors/tests/common/broker.rs"]
mod broker;

mod common;
#[path = "../../connectors/tests/common/mod.rs"]
mod parquet_files;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Child;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use arrow::array::{Array, Int64Array, UInt64Array};
use arrow::record_batch::RecordBatch;
use broker::Broker;
use common::{
    create_topics, dualgp, exit_within, free_port, metrics_page, output_within, produce, read_topic, serve_command,
    terminate, SpawnPiped,
};
use dualgp_connectors::{shared_data, Table};
use parquet_files::{f64s, read_parquet};

/// Creates the input topic `in`, of two partitions, on the broker at `address`.
fn create_input(address: &str) {
    create_topics(address, 2, &["in"]);
    // Made here, not by the first send of one of several workers' producers,
    // so that the tests' readers know their partitions.
    create_topics(address, 1, &["out", "in.dlq"]);
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

/// A broker with the input topics made, a checkpoint directory, and
/// banana's messages.
fn a_broker_checkpoints_and_banana() -> (Broker, String, tempfile::TempDir, Vec<(i64, String)>) {
    let broker = Broker::start();
    let address = broker.address();
    create_input(&address);
    (broker, address, tempfile::tempdir().unwrap(), banana_messages())
}

/// Messages keyed by their id, as `produce` sends them.
fn keyed(messages: &[(i64, String)]) -> Vec<(String, String)> {
    messages.iter().map(|(id, m)| (id.to_string(), m.clone())).collect()
}

/// `dualgp serve` on banana messages from `in` (batches of 100, m = 20
/// unless `extra` names a saved `--model`, which has its own settings),
/// checkpointing into `checkpoints`, with `extra` flags; in the background.
fn spawn_serve(address: &str, checkpoints: &Path, extra: &[&str]) -> Child {
    let m: &[&str] = match extra.contains(&"--model") {
        true => &[],
        false => &["--inducing", "20"],
    };
    serve_command(address, "in", "out")
        .args([
            "--likelihood",
            "bernoulli",
            "--batch-size",
            "100",
            "--batch-timeout-ms",
            "300",
        ])
        .args(m)
        .args(["--checkpoint-dir", checkpoints.to_str().unwrap()])
        .args(extra)
        .spawn_piped()
}

/// The metrics page's counts once the first run has read everything.
const COUNTED: [&str; 2] = ["dualgp_predictions_out_total 300", "dualgp_records_in_total 300"];
/// And the dead letters among them, over their reasons.
const DEAD_LETTERS: u64 = 5;

/// The dead letters a metrics page counts, by reason.
fn dead_letters_on(page: &str) -> BTreeMap<String, u64> {
    page.lines()
        .filter_map(|line| line.strip_prefix("dualgp_dead_letters_total{reason=\""))
        .filter_map(|rest| rest.split_once("\"} "))
        .map(|(reason, n)| (reason.to_string(), n.parse().unwrap()))
        .collect()
}

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
        let counted = |page: &str| {
            COUNTED.iter().all(|line| page.lines().any(|l| l == *line))
                && dead_letters_on(page).values().sum::<u64>() == DEAD_LETTERS
        };
        while Instant::now() < deadline && !counted(&page) {
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
    predictions_in(&read_topic(address, "out", expected))
}

/// [`predictions`] of messages already read.
fn predictions_in(texts: &[String]) -> BTreeMap<i64, Vec<Option<u64>>> {
    let mut seen = BTreeMap::new();
    for text in texts {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
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
    let (_broker, address, checkpoints, messages) = a_broker_checkpoints_and_banana();
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
    let mut kinds = BTreeMap::<String, u64>::new();
    for d in &dlq {
        let v: serde_json::Value = serde_json::from_str(d).unwrap();
        *kinds.entry(v["kind"].as_str().unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(kinds.get("invalid_label"), Some(&1), "{dlq:?}");
    // The metrics counted each by its reason.
    assert_eq!(dead_letters_on(&page), kinds, "{page}");

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

/// The labelled records a summary line says were shed by `--max-staleness`.
fn shed_in(summary: &str) -> u64 {
    let Some((before, _)) = summary.split_once(" labelled record") else {
        return 0;
    };
    before.rsplit('(').next().unwrap().trim().parse().unwrap()
}

/// With `--max-staleness`, a learner too slow for the stream (epochs of ten
/// records read as fast as the broker gives them, M-steps of 100 iterations
/// that never stop early) learns a sample of what waits: every record is
/// scored once, and every label is learned or shed once, across a restart
/// from the checkpoint too.
#[test]
fn a_learner_held_to_a_staleness_bound_learns_or_sheds_each_label_once_across_a_restart() {
    let (_broker, address, checkpoints, messages) = a_broker_checkpoints_and_banana();
    let (first, second) = messages.split_at(300);
    let run = |records: &[(i64, String)]| {
        produce(&address, "in", &keyed(records), 2);
        let out = serve_command(&address, "in", "out")
            .args(["--likelihood", "bernoulli", "--inducing", "30", "--batch-size", "10"])
            .args(["--m-steps", "100", "--m-tolerance", "0", "--max-staleness", "2"])
            .args(["--workers", "2", "--idle-exit", "3"])
            .args(["--checkpoint-dir", checkpoints.path().to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let first_run = run(first);
    assert!(first_run.contains("300 records scored"), "{first_run}");
    let shed = shed_in(&first_run);
    assert!(shed > 0, "the learner kept up: {first_run}");
    let second_run = run(second);
    assert!(second_run.contains("100 records scored"), "{second_run}");
    let seen = predictions(&address, 400);
    assert_eq!(seen.len(), 400);
    assert!(seen.values().all(|p| p.len() == 1), "scored twice");

    let out = dualgp(&["inspect", checkpoints.path().to_str().unwrap(), "--json"]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let learned = summary["records_seen"].as_u64().unwrap();
    assert_eq!(
        learned + shed + shed_in(&second_run),
        400,
        "{first_run}{second_run}{summary}"
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
fn an_unreachable_broker_is_said_at_once_then_one_line_within_the_timeout() {
    let address = format!("127.0.0.1:{}", free_port());
    let stderr = refused(&address, &["--broker-timeout", "3"]);
    let lines: Vec<&str> = stderr.trim().lines().collect();
    assert_eq!(lines.len(), 2, "the wait, then the error: {stderr}");
    assert!(
        lines[0].starts_with(&format!("dualgp serve: waiting for the broker at {address}")),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("dualgp: ") && lines[1].contains(&address),
        "{stderr}"
    );
}

/// Standard error's lines as they come, each with when it came (read on a
/// thread of its own until the child closes it).
fn stderr_lines(child: &mut Child) -> Receiver<(Instant, String)> {
    let stderr = child.stderr.take().expect("stderr piped");
    let (send, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if send.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    lines
}

/// Waits (at most `limit`) for serve to exit successfully: its stderr lines and its stdout.
fn finished_within(child: &mut Child, limit: Duration) -> (Vec<String>, String) {
    let lines = stderr_lines(child);
    let status = exit_within(child, limit);
    let stderr: Vec<String> = lines.iter().map(|(_, line)| line).collect();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "{stderr:?}");
    (stderr, stdout)
}

#[test]
fn a_missing_topic_is_said_within_a_second_with_the_metrics_up_and_ends_in_one_clear_line() {
    let broker = Broker::start();
    let address = broker.address();
    let port = free_port();
    let started = Instant::now();
    let mut child = serve_command(&address, "absent", "out")
        .args(["--likelihood", "gaussian", "--broker-timeout", "4"])
        .args(["--metrics-port", &port.to_string()])
        .spawn_piped();
    let lines = stderr_lines(&mut child);
    let (at, first) = lines
        .recv_timeout(Duration::from_secs(10))
        .expect("serve says something while it waits");
    assert!(
        first.starts_with("dualgp serve: waiting for topic `absent`") && first.contains("--create-topics"),
        "{first}"
    );
    let said_after = at.duration_since(started);
    assert!(
        said_after < Duration::from_secs(1),
        "said after {said_after:?}: {first}"
    );
    // The metrics answer while it waits.
    let page = metrics_page(port).expect("the metrics endpoint answers during the wait");
    assert!(page.contains("dualgp_records_in_total 0"), "{page}");

    let status = exit_within(&mut child, Duration::from_secs(60));
    assert!(!status.success());
    let rest: Vec<String> = lines.iter().map(|(_, line)| line).collect();
    assert_eq!(rest.len(), 1, "one line after the wait: {rest:?}");
    assert!(
        rest[0].starts_with("dualgp: topic `absent` does not exist") && rest[0].contains(&address),
        "{rest:?}"
    );
}

/// `--create-topics` creates a missing input topic, one partition per
/// worker; serve says so, starts, says how far it has come, and ends.
#[test]
fn create_topics_creates_the_input_and_serve_says_what_it_does() {
    let broker = Broker::start();
    let address = broker.address();
    let checkpoints = tempfile::tempdir().unwrap();
    let mut child = serve_command(&address, "fresh", "out")
        .args(["--likelihood", "gaussian", "--workers", "2", "--create-topics"])
        .args(["--idle-exit", "2", "--progress", "0.5"])
        .args(["--checkpoint-dir", checkpoints.path().to_str().unwrap()])
        .spawn_piped();
    let (stderr, stdout) = finished_within(&mut child, Duration::from_secs(60));
    assert!(
        stderr[0].contains("created topic `fresh` of 2 partitions"),
        "{stderr:?}"
    );
    let start = &stderr[1];
    for part in [
        format!("brokers {address}"),
        "reading `fresh` (partitions 0, 1; 2 workers here take all of them)".into(),
        "dead letters to `fresh.dlq`".into(),
        "no checkpoint yet in".into(),
        "starting from the prior".into(),
        "no metrics".into(),
    ] {
        assert!(start.contains(&part), "no `{part}` in the start line: {start}");
    }
    assert!(
        stderr[2..]
            .iter()
            .any(|l| l.contains(": 0 records, 0 predictions, 0 updates")),
        "no progress line: {stderr:?}"
    );
    assert!(
        stdout.contains("0 records scored") && stdout.contains("no offsets committed"),
        "{stdout}"
    );

    // --quiet: nothing on stderr.
    let out = serve_command(&address, "fresh", "out")
        .args(["--likelihood", "gaussian", "--idle-exit", "1", "--quiet"])
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// No epoch in flight would leave nothing to learn: refused before any broker is asked.
#[test]
fn no_epochs_in_flight_is_refused_with_the_flag_named() {
    let stderr = refused(&format!("127.0.0.1:{}", free_port()), &["--epochs-in-flight", "0"]);
    assert!(stderr.contains("--epochs-in-flight 0"), "{stderr}");
}

/// A staleness bound that reading would reach first, or one on prequential
/// scoring (which waits for every update), is refused before any broker is asked.
#[test]
fn a_staleness_bound_that_cannot_act_is_refused_with_the_flags_named() {
    let address = format!("127.0.0.1:{}", free_port());
    let stderr = refused(&address, &["--max-staleness", "16"]);
    assert!(
        stderr.contains("--max-staleness 16") && stderr.contains("--epochs-in-flight (16)"),
        "{stderr}"
    );
    let stderr = refused(&address, &["--max-staleness", "4", "--scoring", "prequential"]);
    assert!(stderr.contains("prequential"), "{stderr}");
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
    terminate(&child);
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

/// serve on a broker whose topics live in a local S3 server (so they
/// outlive the broker process), with `--broker-timeout` as given and no
/// `--idle-exit`, once it has scored the first 200 of 300 banana messages.
struct Outage {
    broker: Broker,
    address: String,
    after: Vec<(String, String)>,
    checkpoints: tempfile::TempDir,
    metrics_port: u16,
    child: Child,
}

impl Outage {
    fn serving_200_of_300(broker_timeout: &str) -> Outage {
        let broker = Broker::start_durable();
        let address = broker.address();
        create_input(&address);
        let mut before = keyed(&banana_messages()[..300]);
        let after = before.split_off(200);
        produce(&address, "in", &before, 2);
        let checkpoints = tempfile::tempdir().unwrap();
        let metrics_port = free_port();
        let port = metrics_port.to_string();
        let child = spawn_serve(
            &address,
            checkpoints.path(),
            &["--metrics-port", &port, "--broker-timeout", broker_timeout],
        );
        wait_for_predictions(metrics_port, 200);
        Outage {
            broker,
            address,
            after,
            checkpoints,
            metrics_port,
            child,
        }
    }
}

/// How many records the newest checkpoint in `checkpoints` has learned.
fn records_seen(checkpoints: &Path) -> serde_json::Value {
    let out = dualgp(&["inspect", checkpoints.to_str().unwrap(), "--json"]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["records_seen"].clone()
}

#[test]
fn a_broker_outage_stops_serve_with_one_line_and_a_restart_learns_each_record_once() {
    let Outage {
        mut broker,
        address,
        after,
        checkpoints,
        child,
        ..
    } = Outage::serving_200_of_300("3");
    assert_eq!(predictions(&address, 200).len(), 200, "scored before the outage");

    broker.stop();
    let out = output_within(child, Duration::from_secs(90)); // serve must not go on without its broker
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("dualgp: ") && last.contains(&address), "{stderr}");
    // It said so while it waited.
    let waiting = format!("dualgp serve: waiting for the broker at {address}, which does not answer");
    assert!(stderr.contains(&waiting), "{stderr}");

    // With the broker back, a restart resumes from the checkpoint: the model
    // learns the new records, and none of the old ones a second time.
    broker.restart();
    produce(&address, "in", &after, 2);
    let (stdout, _) = serve(&address, checkpoints.path(), "1", None);
    assert!(stdout.contains("100 records scored"), "{stdout}");
    assert_eq!(predictions(&address, 300).len(), 300);
    assert_eq!(records_seen(checkpoints.path()), 300);
}

#[test]
fn a_broker_restart_within_the_broker_timeout_is_ridden_out_with_nothing_lost_or_scored_twice() {
    let Outage {
        mut broker,
        address,
        after,
        checkpoints,
        metrics_port,
        child,
    } = Outage::serving_200_of_300("60");

    broker.stop();
    std::thread::sleep(Duration::from_secs(3));
    broker.restart();
    produce(&address, "in", &after, 2);
    wait_for_predictions(metrics_port, 300);
    terminate(&child);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "serve did not ride out the outage: {stderr}");
    let waiting = format!("dualgp serve: waiting for the broker at {address}, which does not answer");
    assert!(stderr.contains(&waiting), "the outage went unnoticed: {stderr}");

    let texts = read_topic(&address, "out", 300);
    assert_eq!(predictions_in(&texts).len(), 300, "{stderr}");
    // Output is at least once: a batch of predictions the broker wrote but
    // had not acknowledged when it went down is sent again (librdkafka's
    // retry; about one run in eight here). A copy is the same message; a
    // record scored again would carry another epoch or model.
    let mut sent: BTreeMap<i64, BTreeSet<&String>> = BTreeMap::new();
    for text in &texts {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        sent.entry(v["id"].as_i64().unwrap()).or_default().insert(text);
    }
    let rescored: Vec<_> = sent.iter().filter(|(_, texts)| texts.len() > 1).collect();
    assert!(rescored.is_empty(), "scored twice: {rescored:?}");
    assert_eq!(records_seen(checkpoints.path()), 300);
}

/// Each prediction on `out` as `(id, epoch, model_epoch, p1)`, `expected` awaited.
fn scored(address: &str, expected: usize) -> Vec<(i64, u64, Option<u64>, f64)> {
    read_topic(address, "out", expected)
        .iter()
        .map(|text| {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            let p1 = v["p"][1].as_f64().unwrap_or_else(|| panic!("no p in {text}"));
            (
                v["id"].as_i64().unwrap(),
                v["epoch"].as_u64().unwrap(),
                v["model_epoch"].as_u64(),
                p1,
            )
        })
        .collect()
}

/// The mean negative log density of labels `y` (0 or 1) under `p1`.
fn nlpd(pairs: impl Iterator<Item = (f64, f64)>) -> f64 {
    let (n, sum) = pairs.fold((0, 0.0), |(n, sum), (p1, y)| {
        (n + 1, sum - if y == 1.0 { p1 } else { 1.0 - p1 }.ln())
    });
    sum / n as f64
}

/// Going live after a backtest: `replay --save-model` on banana, then
/// `serve --model` on the same stream scores its first records with the
/// saved model (`model_epoch` is the backtest's last epoch, and the epochs go
/// on from there), exactly as a replay from that model does, far better than
/// the prior; a checkpoint, once there, wins over `--model`.
#[test]
fn a_warm_started_serve_scores_its_first_records_with_the_saved_model() {
    let dir = tempfile::tempdir().unwrap();
    let banana = shared_data("banana_train.parquet").unwrap_or_else(|e| panic!("{e}"));
    let banana = banana.to_str().unwrap();
    let model = dir.path().join("model.json");
    let model = model.to_str().unwrap();
    let replay = |output: &str, extra: &[&str]| {
        let output = dir.path().join(output);
        let mut args = vec!["replay", "--data", banana, "--output", output.to_str().unwrap()];
        args.extend(["--likelihood", "bernoulli"]);
        args.extend(extra);
        let out = dualgp(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        read_parquet(&output)
    };
    // The backtest: four epochs of 100, the last learned through epoch 3.
    let backtest = replay(
        "backtest.parquet",
        &["--batch-size", "100", "--inducing", "20", "--save-model", model],
    );
    // Every row scored by the saved model (its settings its own): one epoch, after the model's.
    let saved = replay("saved.parquet", &["--batch-size", "1000", "--model", model]);
    assert_eq!(model_epochs(&saved), vec![Some(3); 400]);
    let saved_p1: BTreeMap<i64, f64> = i64s(&saved, "id").into_iter().zip(f64s(&saved, "p1")).collect();

    let table = Table::read(shared_data("banana_train.parquet").unwrap(), &Default::default()).unwrap();
    let labels: BTreeMap<i64, f64> = table.ids.iter().copied().zip(table.labels.clone().unwrap()).collect();
    // The prior's NLPD: the backtest's first epoch, scored before any update.
    let first: Vec<(f64, f64)> = i64s(&backtest, "id")
        .into_iter()
        .zip(f64s(&backtest, "p1"))
        .take(100)
        .map(|(id, p1)| (p1, labels[&id]))
        .collect();
    let prior = nlpd(first.into_iter());

    let broker = Broker::start();
    let address = broker.address();
    create_input(&address);
    produce(&address, "in", &keyed(&banana_messages()), 2);
    let checkpoints = tempfile::tempdir().unwrap();
    let warm = ["--model", model, "--workers", "1", "--idle-exit", "3"];
    let mut child = spawn_serve(&address, checkpoints.path(), &warm);
    let (stderr, stdout) = finished_within(&mut child, Duration::from_secs(120));
    assert!(
        stderr[0].contains(&format!("starting from the model in {model} (learned through epoch 3")),
        "{stderr:?}"
    );

    let predictions = scored(&address, 400);
    assert_eq!(predictions.len(), 400);
    let (_, first_epoch, first_model, _) = predictions[0];
    assert_eq!(
        (first_epoch, first_model),
        (4, Some(3)),
        "the first record, scored by the saved model"
    );
    assert!(
        predictions.iter().all(|p| p.1 >= 4 && p.2 >= Some(3)),
        "{predictions:?}"
    );
    // What the saved model scored, it scored as a replay from it does.
    let by_saved: Vec<&(i64, u64, Option<u64>, f64)> = predictions.iter().filter(|p| p.2 == Some(3)).collect();
    assert!(
        by_saved.len() >= 50,
        "only {} records scored by the saved model",
        by_saved.len()
    );
    for (id, _, _, p1) in &by_saved {
        assert!(
            (p1 - saved_p1[id]).abs() < 1e-9,
            "record {id}: {p1} against {}",
            saved_p1[id]
        );
    }
    let live = nlpd(by_saved.iter().map(|(id, _, _, p1)| (*p1, labels[id])));
    let offline = nlpd(by_saved.iter().map(|(id, _, _, _)| (saved_p1[id], labels[id])));
    assert!(
        (live - offline).abs() < 1e-9,
        "live NLPD {live}, the saved model's {offline}"
    );
    assert!(live < prior - 0.2, "live NLPD {live}, the prior's {prior}");

    // The summary names the epochs the predictions carry.
    let (low, high) = (
        predictions.iter().map(|p| p.1).min().unwrap(),
        predictions.iter().map(|p| p.1).max().unwrap(),
    );
    let epochs = match low == high {
        true => format!("400 records scored in epoch {low},"),
        false => format!("400 records scored in epochs {low}–{high},"),
    };
    assert!(stdout.contains(&epochs), "not `{epochs}`: {stdout}");

    // Restarted with --model, serve resumes from its newer checkpoint.
    let out = serve_command(&address, "in", "out")
        .args(["--likelihood", "bernoulli", "--idle-exit", "1"])
        .args([
            "--checkpoint-dir",
            checkpoints.path().to_str().unwrap(),
            "--model",
            model,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("starting from that checkpoint (newer than --model, which is not read)"),
        "{stderr}"
    );

    // A model flag beside --model would do nothing: refused in one line.
    let out = serve_command(&address, "in", "out")
        .args([
            "--likelihood",
            "bernoulli",
            "--idle-exit",
            "1",
            "--model",
            model,
            "--inducing",
            "5",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("drop the model flags"), "{stderr}");
}

/// The int64 column `name` of `batch`.
fn i64s(batch: &RecordBatch, name: &str) -> Vec<i64> {
    let column = batch.column_by_name(name).unwrap_or_else(|| panic!("no column {name}"));
    column.as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()
}

/// The `model_epoch` column (null: the prior).
fn model_epochs(batch: &RecordBatch) -> Vec<Option<u64>> {
    let column = batch.column_by_name("model_epoch").expect("a model_epoch column");
    column.as_any().downcast_ref::<UInt64Array>().unwrap().iter().collect()
}
