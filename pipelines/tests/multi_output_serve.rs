//! The built `dualgp serve` with a two-output model (`--likelihood
//! gaussian,bernoulli --latents 2 --predict-all-outputs`) against a real
//! Kafka-protocol broker (tansu) on 127.0.0.1: messages carry `"output": d`,
//! predictions give that output's predictive and every output's, and a
//! restart that only scores is scored by the checkpointed model exactly as
//! the model library predicts with it; bad output indices are dead letters
//! with their reasons, counted.

#[allow(dead_code)] // only the in-memory broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;

mod common;

use std::path::Path;
use std::process::Stdio;

use broker::Broker;
use common::{newest_checkpoint, produce, read_topic, serve_command};
use dualgp_connectors::KafkaPosition;
use dualgp_operators::dataflow::Checkpoint;
use dualgp_operators::model::{predict_outputs, Predictive, StreamingLearner};
use dualgp_pipelines::protocol::Standardizer;
use dualgp_pipelines::toys::heterogeneous;
use nalgebra::DMatrix;

const LABELLED: usize = 200;
const QUERIES: usize = 40;

/// Every message of `topic`'s one partition: until `expected` have come and
/// then two quiet seconds (to catch duplicates), or 60 s at most.
fn consume_all(address: &str, topic: &str, expected: usize) -> Vec<serde_json::Value> {
    let payloads = read_topic(address, topic, expected);
    payloads.iter().map(|p| serde_json::from_str(p).unwrap()).collect()
}

/// Serve to its idle exit; its stdout.
fn serve(address: &str, checkpoints: &Path) -> String {
    let out = serve_command(address, "in", "out")
        .args([
            "--likelihood",
            "gaussian,bernoulli",
            "--latents",
            "2",
            "--predict-all-outputs",
        ])
        .args(["--batch-size", "50", "--batch-timeout-ms", "300", "--inducing", "10"])
        .args(["--idle-exit", "3", "--checkpoint-dir", checkpoints.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("the dualgp binary runs");
    assert!(
        out.status.success(),
        "serve failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn number(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// The JSON predictive (`mean`/`var` or `p`) equals `expected` to 1e-9.
fn assert_predictive(v: &serde_json::Value, expected: &Predictive) {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + b.abs());
    match expected {
        Predictive::Moments { mean, var } => {
            assert!(
                close(number(v, "mean"), *mean) && close(number(v, "var"), *var),
                "{v} vs {expected:?}"
            )
        }
        Predictive::Classes(p) => {
            let got: Vec<f64> = v["p"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            assert!(
                got.len() == p.len() && got.iter().zip(p).all(|(a, b)| close(*a, *b)),
                "{v} vs {expected:?}"
            );
        }
    }
}

/// Output `d`'s predictive at `x` (data scale) from `checkpoint`'s model, by the model library.
fn library_predictive(checkpoint: &Checkpoint<KafkaPosition>, scaling: &Standardizer, x: f64, d: usize) -> Predictive {
    let standardised = scaling.transform_x(&DMatrix::from_element(1, 1, x));
    let learner = &checkpoint.learner;
    let posterior = learner.posterior().expect("a fitted posterior");
    let (y_mean, y_std) = scaling.y_scaling(d);
    match predict_outputs(posterior, learner.likelihood(), &standardised, |_| d).remove(0) {
        Predictive::Moments { mean, var } => Predictive::Moments {
            mean: mean * y_std + y_mean,
            var: var * y_std * y_std,
        },
        classes => classes,
    }
}

#[test]
fn serve_scores_each_messages_output_and_every_output_as_the_checkpointed_model_does() {
    let (_broker, address) = Broker::with_topics(1, &["in"]);
    let checkpoints = tempfile::tempdir().unwrap();

    let toy = heterogeneous(LABELLED, 11);
    let mut messages: Vec<(String, String)> = (0..LABELLED)
        .map(|i| {
            let (x, y, d) = (toy.x[i], toy.y[i], toy.output[i]);
            (i.to_string(), format!(r#"{{"id":{i},"x0":{x},"y":{y},"output":{d}}}"#))
        })
        .collect();
    let bad = [
        (r#"{"id":9001,"x0":0.5,"y":1}"#, "missing_field"),
        (r#"{"id":9002,"x0":0.5,"y":1,"output":2}"#, "invalid_output"),
        (r#"{"id":9003,"x0":0.5,"y":1,"output":-1}"#, "invalid_output"),
        (r#"{"id":9004,"x0":0.5,"y":1,"output":"1"}"#, "wrong_type"),
        (r#"{"id":9005,"x0":0.5,"y":1,"output":1.5}"#, "wrong_type"),
        // A label outside the Bernoulli output's classes: the learner's refusal.
        (r#"{"id":9006,"x0":0.5,"y":0.3,"output":1}"#, "refused"),
    ];
    messages.extend(bad.iter().map(|(m, _)| ("bad".to_string(), m.to_string())));
    produce(&address, "in", &messages, 1);
    let stdout = serve(&address, checkpoints.path());
    // The refused label decodes (a multi-output model checks labels by output), so it counts as read.
    assert!(stdout.contains(&format!("{} records scored", LABELLED + 1)), "{stdout}");
    assert!(
        stdout.contains(&format!("{} dead letters", bad.len())),
        "counted: {stdout}"
    );

    let predictions = consume_all(&address, "out", LABELLED);
    assert_eq!(predictions.len(), LABELLED, "each good message scored once");
    for p in &predictions {
        let id = p["id"].as_u64().unwrap() as usize;
        let d = p["output"].as_u64().unwrap() as usize;
        assert_eq!(d as i64, toy.output[id], "{p}");
        let every = p["outputs"].as_array().unwrap_or_else(|| panic!("no outputs in {p}"));
        assert_eq!(every.len(), 2, "{p}");
        assert!(
            every[0]["mean"].is_f64() && every[0]["var"].as_f64().unwrap() > 0.0,
            "{p}"
        );
        assert!(every[1]["p"].as_array().is_some_and(|c| c.len() == 2), "{p}");
        // The record's own predictive is its output's entry among all.
        for key in ["mean", "var", "p"] {
            assert_eq!(p.get(key), every[d].get(key), "{p}");
        }
    }
    let dead = consume_all(&address, "in.dlq", bad.len());
    let mut kinds: Vec<&str> = dead.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    let mut expected: Vec<&str> = bad.iter().map(|b| b.1).collect();
    kinds.sort_unstable();
    expected.sort_unstable();
    assert_eq!(kinds, expected, "{dead:?}");
    let beyond = dead
        .iter()
        .find(|d| d["payload"].as_str().unwrap().contains("9002"))
        .unwrap();
    assert!(beyond["reason"].as_str().unwrap().contains("0..2"), "{beyond}");

    // A restart given only queries (no labels) scores them with the
    // checkpointed model: exactly what the library predicts with it.
    let checkpoint = newest_checkpoint(checkpoints.path());
    let scaling: Standardizer =
        serde_json::from_slice(&std::fs::read(checkpoints.path().join("scaling.json")).unwrap()).unwrap();
    let queries: Vec<(String, String)> = (0..QUERIES)
        .map(|k| {
            let (id, x, d) = (10_000 + k, k as f64 / QUERIES as f64, k % 2);
            (id.to_string(), format!(r#"{{"id":{id},"x0":{x},"output":{d}}}"#))
        })
        .collect();
    produce(&address, "in", &queries, 1);
    let stdout = serve(&address, checkpoints.path());
    // Messages after the checkpoint are read again (at least once), but only the queries are predictable.
    assert!(stdout.contains(&format!("{QUERIES} predictions sent")), "{stdout}");
    let all = consume_all(&address, "out", LABELLED + QUERIES);
    let scored: Vec<&serde_json::Value> = all.iter().filter(|p| p["id"].as_u64().unwrap() >= 10_000).collect();
    assert_eq!(scored.len(), QUERIES);
    for p in scored {
        let k = p["id"].as_u64().unwrap() as usize - 10_000;
        let x = k as f64 / QUERIES as f64;
        assert_eq!(p["model_epoch"].as_u64(), Some(checkpoint.epoch), "{p}");
        assert_eq!(p["output"].as_u64(), Some(k as u64 % 2), "{p}");
        for (d, entry) in p["outputs"].as_array().unwrap().iter().enumerate() {
            assert_predictive(entry, &library_predictive(&checkpoint, &scaling, x, d));
        }
        assert_predictive(p, &library_predictive(&checkpoint, &scaling, x, k % 2));
    }
}
