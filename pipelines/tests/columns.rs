//! Data in the user's own columns, through the built `dualgp`: a CSV file
//! with its own column names (`key`, `feat_*`, `target`, in another order)
//! replays to the same predictions, bit for bit, as the same data in Parquet
//! with ours (`id`, `x<N>`, `y`), by flags or by a pipeline file's
//! `[columns]`, and evaluates to the same figures; a file of every numeric
//! column type is taken by `replay` and `eval` alike; a bad CSV file or a
//! missing column is one line naming the column and the flag; `serve` reads
//! JSON messages by the same flags.

#[path = "../../connectors/tests/common/broker.rs"]
#[allow(dead_code)] // the durable broker is for other tests
mod broker;
mod common;
#[path = "../../connectors/tests/common/mod.rs"]
mod parquet_files;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use arrow::record_batch::RecordBatch;
use broker::Broker;
use common::{assert_fails_with, dualgp, eval_args, produce, read_topic, replay_args};
use parquet_files::{data, read_parquet, write_batch};

/// Rows `from..from + n` of elevators (id, fold, x0..x17, y).
fn elevators(from: usize, n: usize) -> RecordBatch {
    read_parquet(&data("elevators.parquet")).slice(from, n)
}

/// `batch` as CSV in the user's names: `target` first, then the features as
/// `feat_<k>` in reverse order, then `key`; `fold` left out.
fn their_csv(batch: &RecordBatch, path: &Path) {
    let d = (0..)
        .take_while(|k| batch.column_by_name(&format!("x{k}")).is_some())
        .count();
    let floats = |name: &str| {
        let column = cast(batch.column_by_name(name).unwrap(), &DataType::Float64).unwrap();
        column.as_primitive::<Float64Type>().values().to_vec()
    };
    let ids = cast(batch.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let ids = ids.as_primitive::<Int64Type>().values().to_vec();
    let y = floats("y");
    let x: Vec<Vec<f64>> = (0..d).map(|k| floats(&format!("x{k}"))).collect();
    let mut text = String::from("target");
    for k in (0..d).rev() {
        text.push_str(&format!(",feat_{k}"));
    }
    text.push_str(",key\n");
    for i in 0..batch.num_rows() {
        // `{:?}` writes the shortest text that reads back as the same f64.
        text.push_str(&format!("{:?}", y[i]));
        for k in (0..d).rev() {
            text.push_str(&format!(",{:?}", x[k][i]));
        }
        text.push_str(&format!(",{}\n", ids[i]));
    }
    std::fs::write(path, text).unwrap();
}

const THEIR_COLUMNS: [&str; 6] = ["--id", "key", "--features", "feat_*", "--target", "target"];

fn replay(data: &Path, output: &Path, extra: &[&str]) -> serde_json::Value {
    let report = output.with_extension("json");
    let mut args = replay_args(data, output);
    args.extend_from_slice(&["--report", report.to_str().unwrap()]);
    args.extend_from_slice(&["--likelihood", "gaussian", "--batch-size", "400", "--inducing", "20"]);
    args.extend_from_slice(extra);
    let out = dualgp(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap()
}

/// Every column of a predictions file, floats as their bits.
fn predictions(path: &Path) -> Vec<(String, Vec<Option<u64>>)> {
    let batch = read_parquet(path);
    let schema = batch.schema();
    schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, column)| {
            let bits: Vec<Option<u64>> = match column.data_type() {
                DataType::Float64 => column
                    .as_primitive::<Float64Type>()
                    .iter()
                    .map(|v| v.map(f64::to_bits))
                    .collect(),
                _ => {
                    let ints = cast(column, &DataType::Int64).unwrap();
                    ints.as_primitive::<Int64Type>()
                        .iter()
                        .map(|v| v.map(|v| v as u64))
                        .collect()
                }
            };
            (field.name().clone(), bits)
        })
        .collect()
}

#[test]
fn a_csv_file_in_its_own_names_replays_as_the_same_data_in_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let rows = elevators(0, 1200);
    let ours = dir.path().join("ours.parquet");
    write_batch(&ours, &rows, 500);
    let theirs = dir.path().join("theirs.csv");
    their_csv(&rows, &theirs);

    let reference = replay(&ours, &dir.path().join("ours-out.parquet"), &[]);
    let expected = predictions(&dir.path().join("ours-out.parquet"));
    assert_eq!(expected[0].1.len(), 1200);
    let by_flags = replay(&theirs, &dir.path().join("flags-out.parquet"), &THEIR_COLUMNS);
    assert_eq!(predictions(&dir.path().join("flags-out.parquet")), expected);
    assert_eq!(by_flags["prequential_nlpd"], reference["prequential_nlpd"]);
    assert_eq!(by_flags["hyperparameters"], reference["hyperparameters"]);

    // A pipeline file's [columns], and a flag overriding one of them.
    let output = dir.path().join("run-out.parquet");
    let config = dir.path().join("pipeline.toml");
    let toml = format!(
        "likelihood = \"gaussian\"\n[source.parquet]\npath = {:?}\nbatch_size = 400\n\
         [columns]\nid = \"key\"\nfeatures = [\"feat_*\"]\ntarget = \"nope\"\n\
         [model]\ninducing = 20\n[sinks]\npredictions = {:?}\n",
        theirs.display().to_string(),
        output.display().to_string()
    );
    std::fs::write(&config, toml).unwrap();
    let config = config.to_str().unwrap();
    assert_fails_with(&["run", "--config", config], "--target");
    let out = dualgp(&["run", "--config", config, "--target", "target"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(predictions(&output), expected);
}

fn eval(train: &Path, test: &Path, report: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = eval_args(train.to_str().unwrap(), test.to_str().unwrap(), "gaussian");
    args.extend_from_slice(&["--report", report.to_str().unwrap()]);
    args.extend_from_slice(&["--batches", "2", "--inducing", "10"]);
    args.extend_from_slice(extra);
    let out = dualgp(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap()
}

/// A report's figures without its timings and file names.
fn figures(report: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut out: Vec<serde_json::Value> = report["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| serde_json::json!([b["n_seen"], b["test_nlpd"], b["test_rmse"]]))
        .collect();
    out.push(report["final"]["hyperparameters"].clone());
    out
}

#[test]
fn a_csv_file_in_its_own_names_evaluates_as_the_same_data_in_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let files = |from: usize, n: usize, name: &str| {
        let rows = elevators(from, n);
        let parquet = dir.path().join(format!("{name}.parquet"));
        write_batch(&parquet, &rows, 1000);
        let csv = dir.path().join(format!("{name}.csv"));
        their_csv(&rows, &csv);
        (parquet, csv)
    };
    let (train, train_csv) = files(0, 600, "train");
    let (test, test_csv) = files(600, 200, "test");
    let ours = eval(&train, &test, &dir.path().join("ours.json"), &[]);
    let theirs = eval(&train_csv, &test_csv, &dir.path().join("theirs.json"), &THEIR_COLUMNS);
    assert_eq!(figures(&theirs), figures(&ours));
}

/// One feature column of every Arrow numeric type (integers, floats of
/// 16, 32 and 64 bits, decimals) and a uint64 id: `replay` takes the file,
/// and so does `eval`.
#[test]
fn replay_and_eval_take_a_file_of_every_numeric_column_type() {
    let dir = tempfile::tempdir().unwrap();
    let n = 300;
    let types = parquet_files::numeric_types();
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
    let mut fields = vec![Field::new("id", DataType::UInt64, false)];
    let mut columns = vec![cast(&ids, &DataType::UInt64).unwrap()];
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n).map(|i| (i * 37) % 101)));
    for (k, t) in types.iter().enumerate() {
        fields.push(Field::new(format!("x{k}"), t.clone(), false));
        columns.push(cast(&values, t).unwrap());
    }
    let labels: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n).map(|i| ((i * 37) % 101) % 7)));
    fields.push(Field::new("y", DataType::Int8, false));
    columns.push(cast(&labels, &DataType::Int8).unwrap());
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let path: PathBuf = dir.path().join("types.parquet");
    write_batch(&path, &batch, 1000);
    assert_eq!(
        read_parquet(&path).schema(),
        batch.schema(),
        "the file keeps every type"
    );

    let output = dir.path().join("out.parquet");
    let mut args = replay_args(&path, &output);
    args.extend_from_slice(&["--likelihood", "poisson", "--inducing", "10", "--batch-size", "100"]);
    let out = dualgp(&args);
    assert!(out.status.success(), "replay: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_parquet(&output).num_rows(), n as usize);

    let report = dir.path().join("eval.json");
    let file = path.to_str().unwrap();
    let mut args = eval_args(file, file, "poisson");
    args.extend_from_slice(&["--report", report.to_str().unwrap()]);
    args.extend_from_slice(&["--batches", "2", "--inducing", "10"]);
    let out = dualgp(&args);
    assert!(out.status.success(), "eval: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_bad_csv_file_or_a_missing_column_is_one_line_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs.csv");
    their_csv(&elevators(0, 100), &theirs);
    let output = dir.path().join("out.parquet");
    let report = dir.path().join("eval.json");
    let replay = |data: &Path, extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = replay_args(data, &output).into_iter().map(String::from).collect();
        args.extend(["--likelihood", "gaussian"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let fails = |args: Vec<String>, needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        for needle in needles {
            assert_fails_with(&args, needle);
        }
    };

    // Our default names are not in their file.
    fails(
        replay(&theirs, &[]),
        &["no column `id`", "--id", "target, feat_17, feat_16"],
    );
    fails(
        replay(&theirs, &["--id", "key"]),
        &["no feature columns named x<N>", "--features"],
    );
    fails(
        replay(&theirs, &["--id", "key", "--features", "feat_*"]),
        &["no column `y`", "--target"],
    );
    fails(
        replay(
            &theirs,
            &["--id", "key", "--features", "feat_1,feat_99", "--target", "target"],
        ),
        &["no column `feat_99`", "--features"],
    );
    fails(
        replay(&theirs, &["--id", "key", "--features", "size_*", "--target", "target"]),
        &["matching `size_*`", "--features"],
    );
    fails(replay(&theirs, &["--features", "a,,b"]), &["--features"]);
    let mut eval = eval_args(theirs.to_str().unwrap(), theirs.to_str().unwrap(), "gaussian");
    eval.extend_from_slice(&["--report", report.to_str().unwrap()]);
    eval.extend_from_slice(&["--id", "key", "--features", "feat_*"]);
    assert_fails_with(&eval, "--target");

    // A truncated file: a row cut short is named by its line.
    let whole = std::fs::read_to_string(&theirs).unwrap();
    let start = whole[..whole.len() / 2].rfind('\n').unwrap() + 1;
    let line = whole[..start].matches('\n').count() + 1;
    let truncated = dir.path().join("truncated.csv");
    std::fs::write(&truncated, &whole[..start + 5]).unwrap();
    let line = format!("line {line}");
    fails(replay(&truncated, &THEIR_COLUMNS), &["truncated.csv", &line]);
    assert!(!output.exists(), "a failed replay left an output file");
}

/// `serve --id key --features 'feat_*' --target target` reads messages in
/// those fields: every one is scored, labelled or not, none a dead letter.
#[test]
fn serve_reads_json_messages_by_the_column_flags() {
    let (_broker, address) = Broker::with_topics(1, &["in"]);
    let n = 300;
    let messages: Vec<(String, String)> = (0..n)
        .map(|i| {
            let (a, b) = ((i % 17) as f64 / 8.0 - 1.0, (i % 11) as f64 / 5.0 - 1.0);
            let target = match i % 10 {
                9 => String::new(),
                _ => format!(r#", "target": {:?}"#, (3.0 * a).sin() + b),
            };
            let payload = format!(r#"{{"key": {i}, "feat_b": {b:?}, "feat_a": {a:?}, "note": "n{i}"{target}}}"#);
            (i.to_string(), payload)
        })
        .collect();
    produce(&address, "in", &messages, 1);
    let mut args = vec!["serve", "--brokers", &address, "--input-topic", "in"];
    args.extend_from_slice(&["--output-topic", "out", "--likelihood", "gaussian"]);
    args.extend_from_slice(&["--inducing", "10", "--batch-size", "100"]);
    args.extend_from_slice(&["--idle-exit", "3"]);
    args.extend_from_slice(&THEIR_COLUMNS);
    let out = dualgp(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut ids: Vec<i64> = read_topic(&address, "out", n)
        .iter()
        .map(|p| {
            serde_json::from_str::<serde_json::Value>(p).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..n as i64).collect::<Vec<_>>());
    assert!(read_topic(&address, "in.dlq", 0).is_empty(), "no dead letters");
}
