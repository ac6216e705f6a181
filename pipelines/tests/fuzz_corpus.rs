//! The fuzz corpus replayed on stable (CI): every file in
//! `fuzz/corpus/TARGET/` through the body of the fuzz target TARGET,
//! compiled here from the fuzz crate's own source. Seeds, inputs libFuzzer
//! found new paths with, and every input that once crashed a target are
//! there; each must decode to usable records or dead letters, read as a
//! checkpoint or an error of one line, and so on (`fuzz/src/bodies.rs`).
//!
//! `cargo test -p dualgp-pipelines --test fuzz_corpus -- --ignored` writes
//! the seeds again: real messages, a real checkpoint, real flag lists.

#[path = "../../fuzz/src/bodies.rs"]
mod bodies;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array};
use arrow::datatypes::{Field, Schema};
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use dualgp_connectors::kafka::KafkaPosition;
use dualgp_operators::dataflow::{Checkpoint, CheckpointStore};
use dualgp_operators::model::{
    Data, Family, Kernel, Likelihood, MemoryPolicy, SequentialConfig, SequentialLearner, StreamingLearner,
};
use nalgebra::{DMatrix, DVector};

/// A fuzz target's body: bytes in, a panic on what it must not do.
type Body = fn(&[u8]);

/// The fuzz targets and their bodies.
const TARGETS: [(&str, Body); 5] = [
    ("json_record", bodies::json_record),
    ("arrow_record", bodies::arrow_record),
    ("checkpoint", bodies::checkpoint),
    ("hostfile", bodies::hostfile),
    ("cli_flags", bodies::cli_flags),
];

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

#[test]
fn every_corpus_input_runs_through_its_target_without_a_panic() {
    for (target, body) in TARGETS {
        let mut inputs: Vec<PathBuf> = std::fs::read_dir(corpus(target))
            .unwrap_or_else(|e| panic!("{}: {e}", corpus(target).display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        inputs.sort();
        assert!(
            inputs.len() >= 2,
            "{target}: {} inputs, the seeds are missing",
            inputs.len()
        );
        for input in inputs {
            let bytes = std::fs::read(&input).unwrap();
            // A panic names the input: `cargo +nightly fuzz run TARGET INPUT` replays it alone.
            eprintln!("{target}: {}", input.display());
            body(&bytes);
        }
    }
}

// ---- the seeds ----------------------------------------------------------

#[test]
#[ignore = "writes the seeds into fuzz/corpus; run by hand"]
fn write_the_seeds() {
    let mut seeds: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    for (name, which, json) in [
        ("serve", 0u8, r#"{"id": 7, "x0": -1, "x1": 2.5, "y": 0.3}"#),
        ("class", 1, r#"{"id": 8, "x0": 0, "x1": 0.25, "y": 2}"#),
        ("unlabelled", 4, r#"{"id": 1000, "x0": 0.5, "x1": 0.0}"#),
        (
            "own_fields",
            5,
            r#"{"key": 1, "f10": 3, "f2": 2, "y": 0.5, "other": "x"}"#,
        ),
        ("two_outputs", 6, r#"{"id": 1, "x0": 0.5, "y": 1, "output": 1}"#),
    ] {
        seeds.push(("json_record", name, [&[which], json.as_bytes()].concat()));
    }
    for (name, which, ipc) in [("serve", 0u8, ipc_message()), ("two_outputs", 6, ipc_two_outputs())] {
        seeds.push(("arrow_record", name, [&[which][..], &ipc].concat()));
    }
    seeds.push(("checkpoint", "learned", checkpoint_file(true)));
    seeds.push(("checkpoint", "prior", checkpoint_file(false)));
    for (name, text) in [
        (
            "commented",
            "# the cluster\nnode-a:4000\n\n  node-b:4001  \nnode-c:4002\n",
        ),
        ("loopback", "127.0.0.1:2101\n127.0.0.1:2102\n"),
        ("ipv6", "[::1]:2101\r\n[::1]:2102\r\n"),
    ] {
        seeds.push(("hostfile", name, text.as_bytes().to_vec()));
    }
    for (name, args) in flag_lists() {
        seeds.push(("cli_flags", name, args.join("\0").into_bytes()));
    }
    for (target, name, bytes) in seeds {
        let dir = corpus(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
    let dictionary = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/cli_flags.dict");
    std::fs::write(dictionary, flag_dictionary()).unwrap();
}

/// libFuzzer's dictionary for `cli_flags`: every subcommand, flag and
/// value clap knows, so that mutations splice whole words.
fn flag_dictionary() -> String {
    let command = dualgp_pipelines::cli::command();
    let mut words = std::collections::BTreeSet::new();
    for sub in command.get_subcommands() {
        words.insert(sub.get_name().to_owned());
        for arg in sub.get_arguments() {
            words.extend(arg.get_long().map(|long| format!("--{long}")));
            words.extend(arg.get_possible_values().iter().map(|v| v.get_name().to_owned()));
        }
    }
    words.iter().map(|w| format!("{w:?}\n")).collect()
}

/// Arrow IPC messages as a producer writes them: two batches, a null label.
fn ipc_message() -> Vec<u8> {
    ipc(vec![
        ("id", Arc::new(Int64Array::from(vec![1, 2, 3]))),
        ("x0", Arc::new(Float64Array::from(vec![0.5, -1.0, 2.0]))),
        ("x1", Arc::new(Float32Array::from(vec![1.0, 0.0, -0.5]))),
        ("y", Arc::new(Float64Array::from(vec![Some(0.1), None, Some(-0.3)]))),
    ])
}

fn ipc_two_outputs() -> Vec<u8> {
    ipc(vec![
        ("id", Arc::new(Int32Array::from(vec![1, 2]))),
        ("x0", Arc::new(Float64Array::from(vec![0.1, 0.2]))),
        ("y", Arc::new(Float64Array::from(vec![0.5, 1.0]))),
        ("output", Arc::new(Int64Array::from(vec![0, 1]))),
    ])
}

fn ipc(columns: Vec<(&str, ArrayRef)>) -> Vec<u8> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect()).unwrap();
    let mut writer = StreamWriter::try_new(Vec::new(), &schema).unwrap();
    writer.write(&batch).unwrap();
    writer.write(&batch.slice(1, 1)).unwrap();
    writer.into_inner().unwrap()
}

/// A checkpoint as `serve` writes it: a small learner (after two batches
/// with a memory, or the prior) and a Kafka position.
fn checkpoint_file(learned: bool) -> Vec<u8> {
    let config = SequentialConfig {
        inducing: 4,
        m_steps: 2,
        memory: MemoryPolicy::PerBatch { k: 2, capacity: None },
        ..SequentialConfig::default()
    };
    let kernel = Kernel::stationary(Family::SquaredExponential, 1.0, vec![0.7]);
    let mut learner = SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap();
    if learned {
        for batch in 0..2 {
            let x = DMatrix::from_fn(6, 2, |i, j| ((i * 7 + j * 3 + batch) % 5) as f64 - 2.0);
            let y = DVector::from_fn(6, |i, _| x[(i, 0)].sin() + 0.5 * x[(i, 1)]);
            learner.learn_batch(&Data::new(x, y).unwrap()).unwrap();
        }
    }
    let position = KafkaPosition {
        topic: "in".into(),
        next_epoch: 2,
        offsets: [(0, 12), (1, 9)].into(),
    };
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path(), 1).unwrap();
    let checkpoint = Checkpoint::new(1, learner, vec![position]);
    std::fs::read(store.save(&checkpoint).unwrap()).unwrap()
}

/// Command lines of the README and the docs, without `dualgp`.
fn flag_lists() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "replay",
            vec![
                "replay",
                "--data",
                "../shared/data/elevators.parquet",
                "--likelihood",
                "gaussian",
                "--output",
                "predictions.parquet",
                "--report",
                "replay.json",
                "--workers",
                "2",
            ],
        ),
        (
            "serve",
            vec![
                "serve",
                "--brokers",
                "127.0.0.1:9092",
                "--input-topic",
                "in",
                "--output-topic",
                "out",
                "--likelihood",
                "gaussian",
                "--checkpoint-dir",
                "state/",
                "--id",
                "key",
                "--features",
                "feat_*",
                "--target",
                "target",
            ],
        ),
        (
            "eval",
            vec![
                "eval",
                "--data",
                "../shared/data/bank.parquet",
                "--fold",
                "0",
                "--likelihood",
                "bernoulli",
                "--report",
                "bank.json",
                "--inducing",
                "50",
                "--kernel",
                "matern52",
            ],
        ),
        (
            "run",
            vec![
                "run",
                "--config",
                "docs/pipeline.toml",
                "--workers",
                "2",
                "--processes",
                "2",
                "--process",
                "1",
                "--hostfile",
                "hosts.txt",
            ],
        ),
        (
            "suggest",
            vec![
                "suggest",
                "--data",
                "../shared/data/banana_train.parquet",
                "--likelihood",
                "bernoulli",
                "--bounds",
                "-2,2;-2,2",
                "--batch",
                "5",
                "--acquisition",
                "entropy",
            ],
        ),
        ("inspect", vec!["inspect", "state/", "--json"]),
        ("demo", vec!["demo", "--plots", "dualgp-demo", "--n", "300"]),
    ]
}
