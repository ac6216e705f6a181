//! `dualgp eval` on a multi-output file: the contract's flags and report
//! keys (`--likelihood a,b`, `--latents Q`, `test_*_by_output`), and a file
//! whose output indices exceed the `--likelihood` list as one error line.

mod common;

use common::{assert_fails_with, eval_args, json_report_of, words};
use dualgp_pipelines::toys::{heterogeneous, only_output, write};

fn files(dir: &std::path::Path) -> (String, String) {
    let (train, test) = (dir.join("train.parquet"), dir.join("test.parquet"));
    write(&train, &heterogeneous(400, 1)).unwrap();
    write(&test, &heterogeneous(200, 2)).unwrap();
    (train.display().to_string(), test.display().to_string())
}

/// Every batch entry and `final` hold per-output NLPD, RMSE for the
/// Gaussian output 0 and accuracy for the Bernoulli output 1, and the
/// mixing matrix is among the learned hyperparameters.
#[test]
fn eval_reports_metrics_by_output() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = files(dir.path());
    let report = dir.path().join("report.json");
    for method in ["dual-memory", "offline"] {
        let mut args = eval_args(&train, &test, "gaussian,bernoulli");
        args.extend(words("--latents 2 --order sorted:x0 --batches 4 --inducing 15"));
        args.extend(["--method", method, "--report", report.to_str().unwrap()]);
        let json = json_report_of(&args, &report);
        assert_eq!(json["likelihood"], "gaussian,bernoulli");
        let entries = json["batches"].as_array().unwrap().iter().chain([&json["final"]]);
        for entry in entries {
            for key in ["0", "1"] {
                let nlpd = entry["test_nlpd_by_output"][key].as_f64().unwrap();
                assert!(nlpd.is_finite(), "{method}: {entry}");
            }
            assert!(entry["test_rmse_by_output"]["0"].as_f64().unwrap() > 0.0);
            assert!(entry["test_rmse_by_output"].get("1").is_none());
            let accuracy = entry["test_accuracy_by_output"]["1"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&accuracy));
        }
        let hyper = json["final"]["hyperparameters"].as_object().unwrap();
        assert!(hyper.contains_key("mixing.latent1.output0"), "{hyper:?}");
        assert!(hyper.contains_key("output0.gaussian.variance"), "{hyper:?}");
    }
}

#[test]
fn output_indices_beyond_the_likelihood_list_are_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = files(dir.path());
    let report = dir.path().join("report.json");
    let mut args = eval_args(&train, &test, "gaussian");
    args.extend(["--report", report.to_str().unwrap()]);
    assert_fails_with(&args, "has output 1 but --likelihood lists 1 output");
}

/// Batches of five records start with five inducing inputs, and the past
/// message's products then run through nalgebra's loops for small
/// matrices, where a transposed view on the left wrote out of bounds
/// (heap corruption in release, an abort under debug assertions). The
/// sparse output alone, 10 batches: every batch learns and scores.
#[test]
fn batches_of_five_records_learn() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.parquet"), dir.path().join("test.parquet"));
    write(&train, &only_output(&heterogeneous(250, 0), 1)).unwrap();
    write(&test, &only_output(&heterogeneous(400, 1), 1)).unwrap();
    let report = dir.path().join("report.json");
    let mut args = eval_args(train.to_str().unwrap(), test.to_str().unwrap(), "bernoulli");
    args.extend([
        "--batches",
        "10",
        "--order",
        "sorted:x0",
        "--report",
        report.to_str().unwrap(),
    ]);
    let json = json_report_of(&args, &report);
    let batches = json["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 10);
    assert!(batches.iter().all(|b| b["test_nlpd"].as_f64().unwrap().is_finite()));
}
