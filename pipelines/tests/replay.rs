//! The built `dualgp replay` on real data: every row scored once, in order,
//! the same with 1 and 2 workers; the first epoch is scored by the prior and
//! the report's prequential figures are those of the written predictions;
//! bad rows become dead letters and bad invocations one clear line.

mod common;
#[path = "../../connectors/tests/common/mod.rs"]
mod parquet_files;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, UInt64Array};
use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;
use common::{assert_fails_with, dualgp, json_report_of};
use parquet_files::{data, f64s, read_parquet, write_batch};

fn i64s(batch: &RecordBatch, name: &str) -> Vec<i64> {
    let column = batch.column_by_name(name).unwrap_or_else(|| panic!("no column {name}"));
    let as_i64 = column.as_any().downcast_ref::<Int64Array>();
    match as_i64 {
        Some(a) => a.values().to_vec(),
        None => column
            .as_any()
            .downcast_ref::<UInt64Array>()
            .unwrap()
            .values()
            .iter()
            .map(|&v| v as i64)
            .collect(),
    }
}

/// The first `n` rows of a shared data set, in row groups of `rows_per_group`.
fn head_of(name: &str, n: usize, rows_per_group: usize, dir: &Path) -> PathBuf {
    let all = read_parquet(&data(&format!("{name}.parquet")));
    let path = dir.join(format!("{name}-{n}.parquet"));
    write_batch(&path, &all.slice(0, n.min(all.num_rows())), rows_per_group);
    path
}

fn replay(data: &Path, dir: &Path, tag: &str, extra: &[&str]) -> (RecordBatch, serde_json::Value) {
    let output = dir.join(format!("{tag}.parquet"));
    let report = dir.join(format!("{tag}.json"));
    let mut args = common::replay_args(data, &output);
    args.extend(["--report", report.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let report = json_report_of(&args, &report);
    (read_parquet(&output), report)
}

fn model_epochs(batch: &RecordBatch) -> Vec<Option<u64>> {
    let column = batch.column_by_name("model_epoch").expect("a model_epoch column");
    column.as_any().downcast_ref::<UInt64Array>().unwrap().iter().collect()
}

fn population_mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n)
}

#[test]
fn regression_rows_are_scored_once_in_order_alike_on_one_and_two_workers() {
    let dir = tempfile::tempdir().unwrap();
    // Three row groups, so the second worker reads a share of the file too.
    let data = head_of("elevators", 2500, 900, dir.path());
    let flags = ["--likelihood", "gaussian", "--batch-size", "500", "--inducing", "30"];
    let (one, report) = replay(&data, dir.path(), "one", &[&flags[..], &["--workers", "1"]].concat());
    let (two, _) = replay(&data, dir.path(), "two", &[&flags[..], &["--workers", "2"]].concat());

    let ids = i64s(&one, "id");
    assert_eq!(ids, (0..2500).collect::<Vec<_>>());
    assert_eq!(i64s(&one, "epoch"), ids.iter().map(|i| i / 500).collect::<Vec<_>>());
    // Prequential: each epoch scored by the update of the epoch before.
    for (id, model_epoch) in ids.iter().zip(model_epochs(&one)) {
        assert_eq!(model_epoch, u64::try_from(id / 500 - 1).ok(), "row {id}");
    }
    assert_eq!(i64s(&two, "id"), ids);
    let y = f64s(&read_parquet(&data), "y");
    let (y_mean, y_var) = population_mean_var(&y[..500]);
    // Bit for bit: sums are added per block of ids, whatever the workers.
    for column in ["mean", "var"] {
        assert_eq!(f64s(&one, column), f64s(&two, column), "{column}: workers differ");
    }

    // Epoch 0 is scored by the prior on the first epoch's scale: mean ȳ, variance (1 + σ²₀)·s².
    let (mean, var) = (f64s(&one, "mean"), f64s(&one, "var"));
    for i in 0..500 {
        assert!((mean[i] - y_mean).abs() < 1e-12 * y_mean.abs().max(1.0));
        assert!(
            (var[i] / (1.1 * y_var) - 1.0).abs() < 1e-9,
            "row {i}: {} vs {}",
            var[i],
            1.1 * y_var
        );
    }
    // The report's prequential figures are those of the written predictions.
    let n = y.len() as f64;
    let nlpd = (0..y.len())
        .map(|i| 0.5 * (2.0 * std::f64::consts::PI * var[i]).ln() + (y[i] - mean[i]).powi(2) / (2.0 * var[i]))
        .sum::<f64>()
        / n;
    let rmse = ((0..y.len()).map(|i| (y[i] - mean[i]).powi(2)).sum::<f64>() / n).sqrt();
    assert!(
        (report["prequential_nlpd"].as_f64().unwrap() - nlpd).abs() < 1e-9,
        "{report}"
    );
    assert!(
        (report["prequential_rmse"].as_f64().unwrap() - rmse).abs() < 1e-9,
        "{report}"
    );
    assert_eq!(report["records"], 2500);
    assert_eq!(report["epochs"], 5);
    // It learns: later epochs beat the prior's error.
    let (_, later_var) = population_mean_var(&(2000..2500).map(|i| y[i] - mean[i]).collect::<Vec<_>>());
    assert!(
        later_var < 0.5 * y_var,
        "last epoch residual variance {later_var} vs {y_var}"
    );
}

#[test]
fn on_arrival_scoring_scores_every_row_once_with_an_earlier_update() {
    let dir = tempfile::tempdir().unwrap();
    let data = head_of("elevators", 2000, 700, dir.path());
    let flags = ["--likelihood", "gaussian", "--batch-size", "250", "--inducing", "20"];
    let (out, report) = replay(
        &data,
        dir.path(),
        "arrival",
        &[&flags[..], &["--scoring", "on-arrival", "--workers", "2"]].concat(),
    );
    assert_eq!(i64s(&out, "id"), (0..2000).collect::<Vec<_>>());
    assert_eq!(report["records"], 2000);
    // Which update scored a row depends on timing; that it came before the row's epoch does not.
    for (epoch, model_epoch) in i64s(&out, "epoch").into_iter().zip(model_epochs(&out)) {
        assert!(
            model_epoch.is_none_or(|m| (m as i64) < epoch),
            "{model_epoch:?} for epoch {epoch}"
        );
    }
    assert!(
        model_epochs(&out)[..250].iter().all(Option::is_none),
        "epoch 0 saw no update"
    );
}

#[test]
fn classification_writes_p1_and_reports_accuracy_of_those_probabilities() {
    let dir = tempfile::tempdir().unwrap();
    let data = data("mammographic.parquet");
    let flags = ["--likelihood", "bernoulli", "--batch-size", "200", "--workers", "2"];
    let (out, report) = replay(&data, dir.path(), "mammo", &flags);
    let y: Vec<f64> = i64s(&read_parquet(&data), "y").into_iter().map(|c| c as f64).collect();
    let p1 = f64s(&out, "p1");
    assert_eq!(p1.len(), y.len());
    assert!(out.column_by_name("mean").is_none());
    let nlpd = -y
        .iter()
        .zip(&p1)
        .map(|(y, p)| if *y == 1.0 { p.ln() } else { (1.0 - p).ln() })
        .sum::<f64>()
        / y.len() as f64;
    // A tie (the prior's 0.5) counts as class 1, as in `eval`.
    let hits = y.iter().zip(&p1).filter(|(y, p)| (**p >= 0.5) == (**y == 1.0)).count();
    assert!(
        (report["prequential_nlpd"].as_f64().unwrap() - nlpd).abs() < 1e-6,
        "{report} vs {nlpd}"
    );
    assert!((report["prequential_accuracy"].as_f64().unwrap() - hits as f64 / y.len() as f64).abs() < 1e-12);
    // After the first epoch (scored by the prior), the model must beat the best
    // constant predictor, whose NLPD is the labels' entropy (0.69 nats here),
    // by half the gap a GP closes on these data (10-fold NLPD 0.40, docs/RESULTS.md).
    let later = 200..y.len();
    let rate = y[later.clone()].iter().sum::<f64>() / later.len() as f64;
    let entropy = -(rate * rate.ln() + (1.0 - rate) * (1.0 - rate).ln());
    let learned = -later
        .clone()
        .map(|i| if y[i] == 1.0 { p1[i].ln() } else { (1.0 - p1[i]).ln() })
        .sum::<f64>()
        / later.len() as f64;
    assert!(
        learned < entropy - 0.5 * (entropy - 0.40),
        "prequential NLPD after the first epoch {learned}, label entropy {entropy}"
    );
}

#[test]
fn bad_rows_go_to_the_dead_letters_and_every_other_row_is_scored() {
    let dir = tempfile::tempdir().unwrap();
    let banana = read_parquet(&data("banana_train.parquet"));
    let mut x0 = f64s(&banana, "x0");
    let mut y: Vec<i64> = i64s(&banana, "y");
    x0[7] = f64::NAN;
    x0[250] = f64::INFINITY;
    y[100] = 3;
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(i64s(&banana, "id")))),
        ("x0", Arc::new(Float64Array::from(x0))),
        ("x1", Arc::new(Float64Array::from(f64s(&banana, "x1")))),
        ("y", Arc::new(Int64Array::from(y))),
    ];
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(schema, columns.into_iter().map(|c| c.1).collect()).unwrap();
    let data = dir.path().join("banana-bad.parquet");
    write_batch(&data, &batch, 150);

    let (out, report) = replay(
        &data,
        dir.path(),
        "banana",
        &["--likelihood", "bernoulli", "--batch-size", "100"],
    );
    let scored = i64s(&out, "id");
    assert_eq!(scored.len(), 397);
    assert!(![7, 100, 250].iter().any(|id| scored.contains(id)));
    assert_eq!(report["dead_letters"], 3);
    assert_eq!(
        report["dead_letter_reasons"],
        serde_json::json!({"non_finite": 2, "invalid_label": 1})
    );
    let dead = read_parquet(&dir.path().join("banana.dead-letters.parquet"));
    let kinds: HashMap<String, usize> = {
        let k = dead.column_by_name("reason_kind").unwrap();
        let k = k.as_any().downcast_ref::<arrow::array::StringArray>().unwrap();
        let mut m = HashMap::new();
        for i in 0..k.len() {
            *m.entry(k.value(i).to_owned()).or_default() += 1;
        }
        m
    };
    assert_eq!(kinds["non_finite"], 2, "{kinds:?}");
    assert_eq!(kinds["invalid_label"], 1, "{kinds:?}");
}

fn replay_args<'a>(data: &'a str, out: &'a str) -> Vec<&'a str> {
    let mut args = common::replay_args(Path::new(data), Path::new(out));
    args.extend(["--likelihood", "bernoulli"]);
    args
}

#[test]
fn bad_invocations_and_bad_files_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.parquet");
    let out = out.to_str().unwrap();
    let banana = data("banana_train.parquet");
    let banana = banana.to_str().unwrap();
    let base = |data| replay_args(data, out);

    assert_fails_with(&base("/nonexistent/stream.parquet"), "/nonexistent/stream.parquet");
    assert_fails_with(&[&base(banana)[..], &["--batch-size", "0"]].concat(), "--batch-size");
    assert_fails_with(&[&base(banana)[..], &["--workers", "0"]].concat(), "--workers");
    assert_fails_with(&[&base(banana)[..], &["--inducing", "0"]].concat(), "--inducing");

    // A truncated file: its footer is gone.
    let bytes = std::fs::read(banana).unwrap();
    let truncated = dir.path().join("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_fails_with(&base(truncated.to_str().unwrap()), "truncated.parquet");

    // No label column.
    let all = read_parquet(Path::new(banana));
    let no_y = all.project(&[0, 2, 3]).unwrap();
    let unlabelled = dir.path().join("no-y.parquet");
    write_batch(&unlabelled, &no_y, 1000);
    assert_says_once(&base(unlabelled.to_str().unwrap()), "no column `y`");

    // A text column where a feature should be.
    let text: ArrayRef = Arc::new(arrow::array::StringArray::from(vec!["a"; all.num_rows()]));
    let mut columns = all.columns().to_vec();
    columns[2] = text;
    let mut fields: Vec<Field> = all.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields[2] = Field::new(fields[2].name(), arrow::datatypes::DataType::Utf8, false);
    let texts = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let with_text = dir.path().join("text.parquet");
    write_batch(&with_text, &texts, 1000);
    assert_says_once(&base(with_text.to_str().unwrap()), "has type Utf8");
    assert!(!Path::new(out).exists(), "a failed replay left an output file");
}

/// Fails with one line that states `cause` once (not again as its own cause).
fn assert_says_once(args: &[&str], cause: &str) {
    assert_fails_with(args, cause);
    let stderr = String::from_utf8_lossy(&dualgp(args).stderr).into_owned();
    assert_eq!(stderr.matches(cause).count(), 1, "{stderr}");
}

#[test]
fn run_with_a_pipeline_file_is_a_replay_and_flags_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let banana = data("banana_train.parquet");
    let output = dir.path().join("out.parquet");
    let config = dir.path().join("pipeline.toml");
    let toml = format!(
        "likelihood = \"bernoulli\"\nworkers = 2\n[source.parquet]\npath = {:?}\nbatch_size = 100\n\
         [model]\ninducing = 20\n[sinks]\npredictions = {:?}\n",
        banana.display().to_string(),
        output.display().to_string()
    );
    std::fs::write(&config, toml).unwrap();
    let config = config.to_str().unwrap();
    let out = dualgp(&["run", "--config", config, "--workers", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(i64s(&read_parquet(&output), "id"), (0..400).collect::<Vec<_>>());
    assert_fails_with(&["run", "--config", config, "--inducing", "0"], "--inducing 0");
}

/// The prequential NLPD of the epochs that start at row `from` or later.
fn nlpd_from(report: &serde_json::Value, from: u64) -> f64 {
    let (mut start, mut sum, mut n) = (0, 0.0, 0);
    for epoch in report["epoch_scores"].as_array().unwrap() {
        let labelled = epoch["labelled"].as_u64().unwrap();
        if start >= from {
            sum += epoch["nlpd"].as_f64().unwrap() * labelled as f64;
            n += labelled;
        }
        start += labelled;
    }
    sum / n as f64
}

/// kin40k's first rows learned in epochs of 50 score as well as in epochs of
/// 1000. With an M-step every epoch the first, on 50 records, switched off
/// inputs that matter and no later one brought them back (NLPD 1.28 over
/// rows 1000–1999 against 0.80); M-steps that follow the records each see
/// as many new ones as came before, and undo the first one's mistakes.
#[test]
fn small_epochs_learn_as_well_as_large_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = head_of("kin40k", 2000, 2000, dir.path());
    let nlpd = |batch_size: &str| {
        let flags = ["--likelihood", "gaussian", "--batch-size", batch_size];
        nlpd_from(&replay(&data, dir.path(), batch_size, &flags).1, 1000)
    };
    let (small, large) = (nlpd("50"), nlpd("1000"));
    assert!(small < large + 0.1, "epochs of 50: {small}, of 1000: {large}");
}

/// A level that jumps by 2 at row 600 of 1 200: the epoch after the jump has
/// the report's largest drift, and with `--forget-half-life` the model
/// follows the new level where the learner without it keeps the old one.
#[test]
fn after_a_level_jumps_the_drift_shows_it_and_forgetting_follows_the_new_level() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("jump.csv");
    let mut text = String::from("id,x0,y\n");
    for i in 0..1200 {
        let x = ((i * 37) % 100) as f64 / 50.0 - 1.0;
        let wiggle = 0.05 * ((i * 13) % 7) as f64 / 7.0;
        let y = (2.0 * x).sin() + if i >= 600 { 2.0 } else { 0.0 } + wiggle;
        text.push_str(&format!("{i},{x},{y}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    let replayed = |forget: &[&str]| {
        let report = dir.path().join("report.json");
        let (csv, out, report_path) = (
            csv.to_str().unwrap(),
            dir.path().join("p.parquet"),
            report.to_str().unwrap(),
        );
        let mut args = vec![
            "replay",
            "--data",
            csv,
            "--likelihood",
            "gaussian",
            "--batch-size",
            "100",
        ];
        args.extend(["--output", out.to_str().unwrap(), "--report", report_path]);
        args.extend(forget);
        json_report_of(&args, &report)
    };
    let kept = replayed(&[]);
    let drift = |epoch: &serde_json::Value| epoch["drift"].as_f64().unwrap_or(f64::NEG_INFINITY);
    let epochs = kept["epoch_scores"].as_array().unwrap();
    let jumped = epochs.iter().max_by(|a, b| drift(a).total_cmp(&drift(b))).unwrap();
    assert_eq!(jumped["epoch"], 6, "the largest drift is the jump's: {epochs:?}");
    assert!(kept.get("discounts").is_none(), "no forgetting, no discounts: {kept}");
    let forgetful = replayed(&["--forget-half-life", "100"]);
    let (old_level, new_level) = (nlpd_from(&kept, 900), nlpd_from(&forgetful, 900));
    assert!(
        new_level < old_level - 1.0,
        "rows 900 on: NLPD {new_level} forgetting, {old_level} without"
    );
    // Automatic forgetting discounts the past where the level jumped, and only there.
    let auto = replayed(&["--forget-half-life", "auto"]);
    let discounted: Vec<u64> = auto["discounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d[0].as_u64().unwrap())
        .collect();
    assert_eq!(discounted, [6], "{auto}");
    assert!(
        nlpd_from(&auto, 700) < 0.0,
        "the level after the jump is learned: {}",
        nlpd_from(&auto, 700)
    );
}

/// With `--time-column t` a record ages by the time after it, not by the
/// records: rows 0.01 apart in time with a pause of 100 before row 600, in
/// epochs of 100 on 2 workers. Each update discounts the past by
/// `2^{-Δt/half-life}`, `Δt` the time from the latest record before it to
/// its own latest: 1 in every epoch but the pause's. `t` is no feature.
#[test]
fn with_a_time_column_the_past_ages_by_the_time_since_it() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("timed.csv");
    let time = |i: usize| 0.01 * i as f64 + if i >= 600 { 100.0 } else { 0.0 };
    let mut text = String::from("id,x0,t,y\n");
    for i in 0..1200 {
        let x = ((i * 37) % 100) as f64 / 50.0 - 1.0;
        text.push_str(&format!("{i},{x},{},{}\n", time(i), (2.0 * x).sin()));
    }
    std::fs::write(&csv, text).unwrap();
    let (report, out) = (dir.path().join("report.json"), dir.path().join("p.parquet"));
    let args = [
        "replay",
        "--data",
        csv.to_str().unwrap(),
        "--likelihood",
        "gaussian",
        "--batch-size",
        "100",
        "--workers",
        "2",
        "--time-column",
        "t",
        "--forget-half-life",
        "10",
        "--output",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    let report = json_report_of(&args, &report);
    let discounts = report["discounts"].as_array().unwrap();
    assert_eq!(discounts.len(), 11, "every update after the first: {discounts:?}");
    for d in discounts {
        let epoch = d[0].as_u64().unwrap() as usize;
        let elapsed = time(100 * epoch + 99) - time(100 * epoch - 1);
        let want = (-elapsed / 10.0).exp2();
        let got = d[1].as_f64().unwrap();
        assert!((got / want - 1.0).abs() < 1e-12, "epoch {epoch}: {got}, want {want}");
    }
    let read = dualgp(&[
        "replay",
        "--data",
        csv.to_str().unwrap(),
        "--likelihood",
        "gaussian",
        "--features",
        "t",
        "--time-column",
        "t",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(
        read.status.success(),
        "a time column named in --features is both: {read:?}"
    );
    let csv = csv.to_str().unwrap();
    let unknown = [
        "replay",
        "--data",
        csv,
        "--likelihood",
        "gaussian",
        "--time-column",
        "when",
    ];
    assert_fails_with(
        &[&unknown[..], &["--output", out.to_str().unwrap()]].concat(),
        "--time-column",
    );
}

/// `replay --plots DIR` draws the run as the demo does: prequential scores
/// and hyperparameters by epoch, and, the data having two inputs, the
/// posterior's map; it says where each plot went.
#[test]
fn replay_draws_its_plots_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (output, plots) = (dir.path().join("p.parquet"), dir.path().join("plots"));
    let banana = data("banana_train.parquet");
    let out = dualgp(&[
        "replay",
        "--data",
        banana.to_str().unwrap(),
        "--likelihood",
        "bernoulli",
        "--batch-size",
        "100",
        "--inducing",
        "20",
        "--output",
        output.to_str().unwrap(),
        "--plots",
        plots.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    for name in ["prequential.svg", "hyperparameters.svg", "posterior.svg"] {
        let svg = std::fs::read_to_string(plots.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(svg.contains("<svg") && svg.len() > 1000, "{name} is not a drawing");
        assert!(
            said.contains(&format!("plot: {}", plots.join(name).display())),
            "{said}"
        );
    }
}
