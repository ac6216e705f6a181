//! `dualgp eval --epoch-column COL` through the built binary: the training
//! rows are cut where the column changes value (a robot's paths in the
//! magnetometer data, a value that comes back later), and a missing or
//! non-numeric column is one line naming the flag.

mod common;
#[path = "../../connectors/tests/common/mod.rs"]
mod parquet_files;

use arrow::array::AsArray;
use arrow::datatypes::{Int32Type, Int8Type};
use common::{assert_fails_with, json_report_of, words};
use parquet_files::{data, read_parquet, write_batch};
use serde_json::Value;

/// The report's batch sizes (from `n_seen`) and each batch's column value.
fn sizes_and_values(report: &Value) -> (Vec<u64>, Vec<f64>) {
    let batches = report["batches"].as_array().unwrap();
    let seen: Vec<u64> = batches.iter().map(|b| b["n_seen"].as_u64().unwrap()).collect();
    let sizes = seen
        .iter()
        .scan(0, |before, &n| {
            let size = n - *before;
            *before = n;
            Some(size)
        })
        .collect();
    let values = batches.iter().map(|b| b["epoch_value"].as_f64().unwrap()).collect();
    (sizes, values)
}

/// Rows across the end of the magnetometer's path 1 and the start of path 2:
/// two batches, as many training rows (fold ≠ 0) as each path has there.
#[test]
fn the_magnetometers_paths_are_one_batch_each() {
    let rows = read_parquet(&data("magnetometer.parquet")).slice(8_795, 160);
    let paths = rows.column_by_name("path").unwrap().as_primitive::<Int32Type>().clone();
    let folds = rows.column_by_name("fold").unwrap().as_primitive::<Int8Type>().clone();
    let train_rows_of = |path: i32| {
        (0..rows.num_rows())
            .filter(|&i| paths.value(i) == path && folds.value(i) != 0)
            .count() as u64
    };
    let expected = vec![train_rows_of(1), train_rows_of(2)];
    assert!(
        expected.iter().all(|&n| n > 20),
        "both paths are in the slice: {expected:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (file, report) = (dir.path().join("two_paths.parquet"), dir.path().join("r.json"));
    write_batch(&file, &rows, 64);
    let mut args = words("eval --fold 0 --likelihood gaussian --epoch-column path --inducing 10");
    args.extend(["--data", file.to_str().unwrap(), "--report", report.to_str().unwrap()]);
    let report = json_report_of(&args, &report);
    assert_eq!(report["epoch_column"], "path");
    assert_eq!(sizes_and_values(&report), (expected, vec![1.0, 2.0]));
}

/// A small CSV whose `path` goes 1, 2, 1, 3 along the file: four batches (a
/// value that comes back starts a new one), the held-out rows left out.
fn small_csv(dir: &std::path::Path) -> std::path::PathBuf {
    let runs = [(1, 12), (2, 9), (1, 15), (3, 10)];
    let mut text = String::from("id,fold,x0,x1,y,path,name\n");
    let mut id = 0;
    for (path, n) in runs {
        for _ in 0..n {
            let (x0, x1) = (id as f64 * 0.1, (id as f64 * 0.37).sin());
            // Every fifth row is held out.
            let fold = i32::from(id % 5 == 0);
            let y = x0.sin() + x1;
            text.push_str(&format!("{id},{fold},{x0},{x1},{y},{path},row{id}\n"));
            id += 1;
        }
    }
    let file = dir.join("runs.csv");
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_value_that_comes_back_starts_a_new_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (file, report) = (small_csv(dir.path()), dir.path().join("r.json"));
    let file = file.to_str().unwrap();
    let common = ["eval", "--data", file, "--fold", "1", "--likelihood", "gaussian"];
    let args: Vec<&str> = common
        .iter()
        .copied()
        .chain([
            "--epoch-column",
            "path",
            "--inducing",
            "8",
            "--report",
            report.to_str().unwrap(),
        ])
        .collect();
    let report = json_report_of(&args, &report);
    // Rows 0, 5, 10, … are fold 1 (held out): 12 → 9, 9 → 7, 15 → 12, 10 → 8 learned.
    assert_eq!(sizes_and_values(&report), (vec![9, 7, 12, 8], vec![1.0, 2.0, 1.0, 3.0]));

    let with = |extra: &[&'static str]| -> Vec<&str> { common.iter().chain(extra).copied().collect() };
    assert_fails_with(
        &with(&["--epoch-column", "nosuch", "--report", "/dev/null"]),
        "--epoch-column nosuch: the data has no column `nosuch`",
    );
    assert_fails_with(
        &with(&["--epoch-column", "name", "--report", "/dev/null"]),
        "column `name` has type Utf8, not numbers",
    );
    assert_fails_with(
        &with(&["--epoch-column", "path", "--batches", "3", "--report", "/dev/null"]),
        "--batches",
    );
}
