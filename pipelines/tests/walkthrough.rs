//! The README's real-time walkthrough, command by command, against a real
//! Kafka-protocol broker (tansu) on 127.0.0.1: `dualgp produce` puts a
//! file's labelled records on a topic, `dualgp serve` learns them, a record
//! without its label is produced, and `dualgp tail` reads its prediction
//! back: made by the learned model, near the true value.

#[allow(dead_code)] // only the in-memory broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;

mod common;
#[path = "../../connectors/tests/common/mod.rs"]
mod parquet_files;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Float64Array, Int64Array};
use broker::Broker;
use common::{dualgp, serve_command};
use parquet_files::write_parquet;

/// `ids` with inputs `x0`, `x1` and, if `labelled`, `y = sin(3 x0) + x1`
/// (plus a small deterministic wobble standing for noise).
fn write_records(path: &Path, ids: &[i64], x: &[(f64, f64)], labelled: bool) {
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(ids.to_vec()))),
        ("x0", Arc::new(Float64Array::from_iter_values(x.iter().map(|p| p.0)))),
        ("x1", Arc::new(Float64Array::from_iter_values(x.iter().map(|p| p.1)))),
    ];
    if labelled {
        let y = x
            .iter()
            .enumerate()
            .map(|(i, (x0, x1))| (3.0 * x0).sin() + x1 + 0.05 * (i as f64 * 1.7).sin());
        columns.push(("y", Arc::new(Float64Array::from_iter_values(y))));
    }
    write_parquet(path, columns, 1000);
}

fn succeeded(args: &[&str]) -> String {
    let out = dualgp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "dualgp {args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned() + &stderr
}

#[test]
fn produce_serve_and_tail_give_a_prediction_of_the_learned_model() {
    let broker = Broker::start();
    let address = broker.address();
    let dir = tempfile::tempdir().unwrap();
    let (train, ask, state) = (
        dir.path().join("train.parquet"),
        dir.path().join("ask.parquet"),
        dir.path().join("state"),
    );
    // A grid over [−1, 1]², visited in a scrambled order.
    let x: Vec<(f64, f64)> = (0..500)
        .map(|i| {
            let k = (i * 211) % 500;
            ((k % 25) as f64 / 12.0 - 1.0, (k / 25) as f64 / 9.5 - 1.0)
        })
        .collect();
    write_records(&train, &(0..500).collect::<Vec<i64>>(), &x, true);
    write_records(&ask, &[1000], &[(0.5, 0.0)], false);
    let (train, ask, state) = (train.to_str().unwrap(), ask.to_str().unwrap(), state.to_str().unwrap());

    let said = succeeded(&["produce", "--brokers", &address, "--topic", "in", "--data", train]);
    assert!(said.contains("produced 500 records to `in`"), "{said}");
    let mut serve = serve_command(&address, "in", "out")
        .args([
            "--likelihood",
            "gaussian",
            "--checkpoint-dir",
            state,
            // Idle from the last record read: the ask comes after the first
            // update's checkpoint, which took over 4 s on a 2-core machine
            // under load (serve had left before the ask: 500 of 501).
            "--idle-exit",
            "20",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // As the README says: once `inspect` shows the 500 records learned, ask.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = dualgp(&["inspect", state, "--json"]);
        let seen = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|v| v["records_seen"].as_u64().unwrap_or(0))
            .unwrap_or(0);
        if seen >= 500 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve learned no checkpoint of 500 records in 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    succeeded(&["produce", "--brokers", &address, "--topic", "in", "--data", ask]);
    assert!(serve.wait().unwrap().success(), "serve failed");

    let printed = succeeded(&["tail", "--brokers", &address, "--topic", "out", "--max", "501"]);
    let predictions: Vec<serde_json::Value> = printed
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(predictions.len(), 501, "{printed}");
    let mut ids: Vec<i64> = predictions.iter().map(|p| p["id"].as_i64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 501, "each record's prediction once");
    let asked = predictions.iter().find(|p| p["id"] == 1000).unwrap();
    assert!(asked["model_epoch"].is_u64(), "scored by the prior: {asked}");
    let (mean, var) = (asked["mean"].as_f64().unwrap(), asked["var"].as_f64().unwrap());
    // The truth is sin(1.5) = 0.997; the model's sd is about 0.05.
    assert!((mean - 1.5_f64.sin()).abs() < 0.2 && var < 0.05, "{asked}");
}
