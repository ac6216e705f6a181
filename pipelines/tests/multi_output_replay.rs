//! `dualgp replay` of a two-output Parquet stream (the heterogeneous
//! toy: a Gaussian output and a probit Bernoulli one): rows carry `output`,
//! predictions are of that output (every output's with
//! `--predict-all-outputs`), and they are what the model library predicts
//! with the replay's final model; bad output indices are dead letters, and
//! a file without the `output` column is one error line.

mod common;
#[path = "../../connectors/tests/common/mod.rs"]
mod parquet_files;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array};
use arrow::datatypes::{Float64Type, Int64Type, UInt64Type};
use arrow::record_batch::RecordBatch;
use common::{assert_fails_with, replay_args};
use dualgp_operators::model::{predict_outputs, Predictive, StreamingLearner};
use dualgp_pipelines::likelihood_args::LikelihoodArgs;
use dualgp_pipelines::model_args::ModelArgs;
use dualgp_pipelines::replay::{self, ReplayArgs, ReplayOutcome};
use dualgp_pipelines::toys::heterogeneous;
use nalgebra::DMatrix;
use parquet_files::{read_parquet, write_parquet};

/// Labelled rows per epoch, and the labelled epochs before the query epoch.
const EPOCH: usize = 100;
const LABELLED_EPOCHS: usize = 3;

/// One row of the stream: x, its label (`None`: only scored) and its output.
type Row = (f64, Option<f64>, i64);

/// Three labelled epochs of the heterogeneous toy, then an epoch of unlabelled
/// queries alternating between the outputs: those are scored by the model
/// of all three labelled epochs, the model the replay ends with.
fn stream() -> Vec<Row> {
    let toy = heterogeneous(EPOCH * LABELLED_EPOCHS, 7);
    let mut rows: Vec<Row> = (0..toy.x.len())
        .map(|i| (toy.x[i], Some(toy.y[i]), toy.output[i]))
        .collect();
    rows.extend((0..EPOCH).map(|i| (i as f64 / EPOCH as f64, None, (i % 2) as i64)));
    rows
}

fn write_rows(path: &Path, rows: &[Row], with_output: bool) {
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from_iter_values(0..rows.len() as i64))),
        ("x0", Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.0)))),
        ("y", Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.1)))),
    ];
    if with_output {
        columns.push((
            "output",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ));
    }
    write_parquet(path, columns, rows.len());
}

fn args(data: &Path, output: &Path) -> ReplayArgs {
    let likelihood = LikelihoodArgs {
        spec: "gaussian,bernoulli".into(),
        latents: Some(2),
    };
    ReplayArgs {
        predict_all_outputs: true,
        batch_size: EPOCH as u64,
        workers: 2,
        model: ModelArgs {
            inducing: Some(12),
            ..ModelArgs::default()
        },
        ..ReplayArgs::new(data.to_owned(), output.to_owned(), likelihood)
    }
}

/// Where a test writes its stream and where the replay writes predictions.
fn stream_and_predictions(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("stream.parquet"), dir.join("predictions.parquet"))
}

fn column(batch: &RecordBatch, name: &str) -> Vec<Option<f64>> {
    let c = batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_primitive::<Float64Type>();
    (0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i))).collect()
}

/// Output `d`'s predictive at `x` (data scale) from the final model, by the
/// model library: the oracle the replay's query rows must equal.
fn library_predictive(outcome: &ReplayOutcome, x: &[f64], d: usize) -> Vec<Predictive> {
    let learner = outcome.learner.as_ref().expect("the replay learned");
    let scaling = &outcome.scaling;
    let raw = DMatrix::from_column_slice(x.len(), 1, x);
    let standardised = scaling.transform_x(&raw);
    let posterior = learner.posterior().expect("a fitted posterior");
    let (y_mean, y_std) = scaling.y_scaling(d);
    predict_outputs(posterior, learner.likelihood(), &standardised, |_| d)
        .into_iter()
        .map(|p| match p {
            Predictive::Moments { mean, var } => Predictive::Moments {
                mean: mean * y_std + y_mean,
                var: var * y_std * y_std,
            },
            classes => classes,
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + b.abs())
}

#[test]
fn replayed_predictions_of_each_output_are_the_final_models_by_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let (data, output) = stream_and_predictions(dir.path());
    let rows = stream();
    write_rows(&data, &rows, true);
    let outcome = replay::run(&args(&data, &output), |_, _| {}).unwrap().unwrap();
    assert_eq!(outcome.report.records, rows.len() as u64);
    assert_eq!(outcome.report.dead_letters, 0);
    // Each output's prequential NLPD, pooled into the report's one by row counts.
    let report = &outcome.report;
    let by_output = &report.prequential_nlpd_by_output;
    assert_eq!(by_output.keys().collect::<Vec<_>>(), ["0", "1"]);
    let labelled = |d: i64| rows.iter().filter(|r| r.1.is_some() && r.2 == d).count() as f64;
    let pooled = (by_output["0"] * labelled(0) + by_output["1"] * labelled(1)) / (labelled(0) + labelled(1));
    assert!(
        close(pooled, report.prequential_nlpd),
        "{pooled} vs {}",
        report.prequential_nlpd
    );
    // The last update is that of the last labelled epoch: the query epoch
    // (no labels) is scored by the model the replay ends with.
    let last_update = outcome.hyperparameters.last().map(|(epoch, _)| *epoch);
    assert_eq!(last_update, Some(LABELLED_EPOCHS as u64 - 1));

    // Output 0 (Gaussian) is scaled by the first epoch's output-0 labels.
    let first: Vec<f64> = rows[..EPOCH]
        .iter()
        .filter(|r| r.2 == 0)
        .map(|r| r.1.unwrap())
        .collect();
    let mean = first.iter().sum::<f64>() / first.len() as f64;
    let sd = (first.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / first.len() as f64).sqrt();
    let (y_mean, y_std) = outcome.scaling.y_scaling(0);
    assert!(
        close(y_mean, mean) && close(y_std, sd),
        "{y_mean} {y_std} vs {mean} {sd}"
    );
    assert_eq!(outcome.scaling.y_scaling(1), (0.0, 1.0));

    let batch = read_parquet(&output);
    let outputs = batch.column_by_name("output").unwrap().as_primitive::<Int64Type>();
    let expected: Vec<i64> = rows.iter().map(|r| r.2).collect();
    assert_eq!(
        outputs.values().to_vec(),
        expected,
        "rows come back in id order with their outputs"
    );

    let queries = LABELLED_EPOCHS * EPOCH..rows.len();
    let model_epochs = batch
        .column_by_name("model_epoch")
        .unwrap()
        .as_primitive::<UInt64Type>();
    assert!(queries
        .clone()
        .all(|i| model_epochs.value(i) == LABELLED_EPOCHS as u64 - 1));
    let x: Vec<f64> = rows[queries.clone()].iter().map(|r| r.0).collect();
    let (gaussian, bernoulli) = (library_predictive(&outcome, &x, 0), library_predictive(&outcome, &x, 1));
    let (mean, var, p1) = (column(&batch, "mean"), column(&batch, "var"), column(&batch, "p1"));
    let (all_mean, all_var, all_p1) = (
        column(&batch, "output0_mean"),
        column(&batch, "output0_var"),
        column(&batch, "output1_p1"),
    );
    for (k, i) in queries.enumerate() {
        let Predictive::Moments { mean: m, var: v } = gaussian[k] else {
            panic!("output 0 is Gaussian")
        };
        let Predictive::Classes(ref p) = bernoulli[k] else {
            panic!("output 1 is Bernoulli")
        };
        assert!(
            close(all_mean[i].unwrap(), m) && close(all_var[i].unwrap(), v),
            "row {i}"
        );
        assert!(close(all_p1[i].unwrap(), p[1]), "row {i}");
        // The row's own output's columns are filled, the other output's null.
        match rows[i].2 {
            0 => assert!(close(mean[i].unwrap(), m) && close(var[i].unwrap(), v) && p1[i].is_none()),
            _ => assert!(close(p1[i].unwrap(), p[1]) && mean[i].is_none() && var[i].is_none()),
        }
    }
    // The two outputs differ: a file that wrote output 0's columns for every row would fail above.
    assert!(gaussian.iter().zip(&bernoulli).any(|(g, b)| g != b));
}

/// One worker and two write the same predictions, own and every output's,
/// to the bit: the coregional kernel's sums are added per block of ids, as
/// a single output's are.
#[test]
fn one_worker_and_two_predict_every_output_alike() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("stream.parquet");
    write_rows(&data, &stream(), true);
    let predictions = |workers: usize| {
        let output = dir.path().join(format!("predictions_{workers}.parquet"));
        let args = ReplayArgs {
            workers,
            ..args(&data, &output)
        };
        replay::run(&args, |_, _| {}).unwrap().unwrap();
        read_parquet(&output)
    };
    let (one, two) = (predictions(1), predictions(2));
    for name in ["mean", "var", "p1", "output0_mean", "output0_var", "output1_p1"] {
        assert_eq!(column(&one, name), column(&two, name), "{name}: workers differ");
    }
}

#[test]
fn bad_output_indices_are_dead_letters_by_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (data, output) = stream_and_predictions(dir.path());
    let mut rows = stream();
    rows[5].2 = 2; // beyond the two outputs
    rows[150].2 = -1;
    // A label outside the Bernoulli output's classes: refused by the learner.
    rows[200] = (0.5, Some(0.3), 1);
    write_rows(&data, &rows, true);
    let mut a = args(&data, &output);
    a.predict_all_outputs = false;
    let outcome = replay::run(&a, |_, _| {}).unwrap().unwrap();
    let reasons = serde_json::to_value(&outcome.report.dead_letter_reasons).unwrap();
    assert_eq!(reasons, serde_json::json!({"invalid_output": 2, "refused": 1}));
    assert_eq!(outcome.report.records, rows.len() as u64 - 3);
    let dead = read_parquet(&dir.path().join("predictions.dead-letters.parquet"));
    let reason = dead.column_by_name("reason").unwrap().as_string::<i32>();
    assert!(
        reason.value(0).contains("output 2") && reason.value(0).contains("0..2"),
        "{}",
        reason.value(0)
    );
    // Without --predict-all-outputs only the rows' own outputs' columns.
    let names: Vec<String> = read_parquet(&output)
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["id", "epoch", "output", "mean", "var", "p1", "model_epoch"]);
}

#[test]
fn a_multi_output_replay_of_a_file_without_outputs_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("no-output.parquet");
    write_rows(&data, &stream(), false);
    let output = dir.path().join("p.parquet");
    let mut args = replay_args(&data, &output);
    args.extend(["--likelihood", "gaussian,bernoulli", "--latents", "2"]);
    assert_fails_with(&args, "no column `output`");
}
