//! Reading the project's Parquet data sets into a `Table`, and refusing bad files.

mod common;

use std::fs;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, StringArray, UInt64Array};
use arrow::datatypes::DataType;
use common::{data, temp_parquet};
use dualgp_connectors::{shared_dir, Column, ColumnSpec, FileError, SchemaError, Table, TableError};
use parquet::file::properties::DEFAULT_MAX_ROW_GROUP_ROW_COUNT;

/// The writer's default row groups: every file here fits in one.
const ONE_GROUP: usize = DEFAULT_MAX_ROW_GROUP_ROW_COUNT;

fn check_common(t: &Table) {
    let n = t.n();
    assert_eq!(t.features.nrows(), n);
    assert_eq!(t.ids, (0..n as i64).collect::<Vec<_>>(), "ids 0..n in order");
    let folds = t.folds.as_ref().expect("fold column read");
    assert_eq!(folds.len(), n);
    assert!(folds.iter().all(|f| (0..=9).contains(f)), "folds in 0..=9");
    for k in 0..=9 {
        assert!(folds.contains(&k), "fold {k} is used");
    }
    let labels = t.labels.as_ref().expect("labels read");
    assert_eq!(labels.len(), n);
    assert!(labels.iter().all(|y| y.is_finite()));
    assert!(t.features.iter().all(|v| v.is_finite()));
    assert!(t.metadata.contains_key("source"), "{:?}", t.metadata);
    assert!(!t.metadata.contains_key("ARROW:schema"));
}

#[test]
fn banana_train() {
    let t = Table::read(data("banana_train.parquet"), &ColumnSpec::default()).unwrap();
    assert_eq!((t.n(), t.d()), (400, 2));
    assert_eq!(t.feature_names, ["x0", "x1"]);
    check_common(&t);
    let labels = t.labels.as_ref().unwrap();
    assert!(labels.iter().all(|&y| y == 0.0 || y == 1.0));
    assert!(labels.contains(&0.0) && labels.contains(&1.0));
    // Features are not all equal (the matrix is filled column by column, not scrambled).
    assert!(t.features.column(0) != t.features.column(1));
}

#[test]
fn elevators() {
    let t = Table::read(data("elevators.parquet"), &ColumnSpec::default()).unwrap();
    assert_eq!((t.n(), t.d()), (16599, 18));
    let expected: Vec<String> = (0..18).map(|i| format!("x{i}")).collect();
    assert_eq!(t.feature_names, expected, "numeric order: x2 before x10");
    check_common(&t);
    // Regression target: not just a handful of class values.
    let mut ys = t.labels.clone().unwrap();
    ys.sort_by(f64::total_cmp);
    ys.dedup();
    assert!(ys.len() > 10);
}

#[test]
fn magnetometer_prefix_skips_other_columns() {
    let t = Table::read(data("magnetometer.parquet"), &ColumnSpec::default()).unwrap();
    assert_eq!(t.feature_names, ["x0", "x1"], "mag_x etc. are not features");
    assert_eq!(t.n(), 76027);
    // Explicit features keep the given order and cast int32 to f64.
    let spec = ColumnSpec::default().with_features(["t", "path", "x0"]);
    let u = Table::read(data("magnetometer.parquet"), &spec).unwrap();
    assert_eq!(u.feature_names, ["t", "path", "x0"]);
    assert_eq!(u.features.column(2), t.features.column(0));
    assert!(u.features.column(1).iter().all(|p| p.fract() == 0.0));
}

#[test]
fn select_rows_in_order() {
    let t = Table::read(data("banana_train.parquet"), &ColumnSpec::default()).unwrap();
    let s = t.select(&[5, 2, 5, 399]);
    assert_eq!(s.n(), 4);
    assert_eq!(s.d(), 2);
    assert_eq!(s.ids, [5, 2, 5, 399]);
    for (i, &r) in [5usize, 2, 5, 399].iter().enumerate() {
        assert_eq!(s.features.row(i), t.features.row(r));
        assert_eq!(s.labels.as_ref().unwrap()[i], t.labels.as_ref().unwrap()[r]);
        assert_eq!(s.folds.as_ref().unwrap()[i], t.folds.as_ref().unwrap()[r]);
    }
    assert_eq!(s.feature_names, t.feature_names);
    assert_eq!(t.select(&[]).n(), 0);
}

#[test]
fn optional_columns() {
    let spec = ColumnSpec::default()
        .with_label(Column::IfPresent("target".into()))
        .with_fold(Column::Skip);
    let t = Table::read(data("banana_train.parquet"), &spec).unwrap();
    assert!(t.labels.is_none());
    assert!(t.folds.is_none());
    assert_eq!(t.n(), 400);
}

#[test]
fn missing_column_lists_the_columns() {
    let spec = ColumnSpec::default().with_label(Column::Required("target".into()));
    let err = Table::read(data("banana_train.parquet"), &spec).unwrap_err();
    assert!(
        matches!(&err, TableError::Schema { source: SchemaError::MissingColumn { column, .. }, .. } if column == "target"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("no column `target`"), "{msg}");
    assert!(msg.contains("id, fold, x0, x1, y"), "{msg}");
    assert!(msg.contains("banana_train.parquet"), "{msg}");
    assert!(msg.contains("name the target column with --target"), "{msg}");
    assert!(!msg.contains('\n'));

    let spec = ColumnSpec::default().with_features(["x0", "x7"]);
    let err = Table::read(data("banana_train.parquet"), &spec).unwrap_err();
    assert!(err.to_string().contains("no column `x7`"), "{err}");

    let spec = ColumnSpec::default().with_fold(Column::Required("split".into()));
    let err = Table::read(data("banana_train.parquet"), &spec).unwrap_err();
    assert!(err.to_string().contains("no column `split`"), "{err}");
}

#[test]
fn no_features() {
    let spec = ColumnSpec::default().with_feature_prefix("z");
    let err = Table::read(data("banana_train.parquet"), &spec).unwrap_err();
    assert!(
        matches!(
            err,
            TableError::Schema {
                source: SchemaError::NoFeatures { .. },
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("z0") && msg.contains("x0, x1"), "{msg}");
}

#[test]
fn truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = fs::read(data("banana_train.parquet")).unwrap();
    let path = dir.path().join("banana_truncated.parquet");
    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = Table::read(&path, &ColumnSpec::default()).unwrap_err();
    assert!(matches!(err, TableError::File(FileError::NotParquet { .. })), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("not a valid Parquet file"), "{msg}");
    assert!(msg.contains("banana_truncated.parquet"), "{msg}");
    assert!(!msg.contains('\n'));
}

#[test]
fn not_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.parquet");
    let garbage: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
    fs::write(&path, garbage).unwrap();
    let err = Table::read(&path, &ColumnSpec::default()).unwrap_err();
    assert!(matches!(err, TableError::File(FileError::NotParquet { .. })), "{err:?}");
    assert!(err.to_string().contains("garbage.parquet"), "{err}");

    let empty = dir.path().join("empty.parquet");
    fs::write(&empty, b"").unwrap();
    let err = Table::read(&empty, &ColumnSpec::default()).unwrap_err();
    assert!(matches!(err, TableError::File(FileError::NotParquet { .. })), "{err:?}");
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.parquet");
    let err = Table::read(&path, &ColumnSpec::default()).unwrap_err();
    assert!(matches!(err, TableError::File(FileError::Open { .. })), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("cannot open "), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
}

/// Why reading `columns`, written to a file, with the default columns fails.
fn refusal(columns: Vec<(&str, ArrayRef)>) -> TableError {
    let (_dir, path) = temp_parquet("refused.parquet", ONE_GROUP, columns);
    Table::read(&path, &ColumnSpec::default()).unwrap_err()
}

#[test]
fn nulls_are_refused_with_column_and_row() {
    // Enough rows for several reader batches, so the row number crosses batches.
    let n = 3000;
    let x0: Float64Array = (0..n).map(|i| if i == 2500 { None } else { Some(i as f64) }).collect();
    let err = refusal(vec![
        ("id", Arc::new(Int64Array::from_iter_values(0..n as i64))),
        ("x0", Arc::new(x0)),
        ("y", Arc::new(Float64Array::from(vec![1.0; n]))),
    ]);
    assert!(
        matches!(&err, TableError::Null { column, row: 2500, .. } if column == "x0"),
        "{err:?}"
    );
    assert!(err.to_string().contains("`x0` has a null at row 2500"), "{err}");

    // A null label is refused too.
    let err = refusal(vec![
        ("id", Arc::new(Int64Array::from(vec![0, 1, 2]))),
        ("x0", Arc::new(Float64Array::from(vec![0.0, 1.0, 2.0]))),
        ("y", Arc::new(Int64Array::from(vec![Some(0), None, Some(1)]))),
    ]);
    assert!(
        matches!(&err, TableError::Null { column, row: 1, .. } if column == "y"),
        "{err:?}"
    );
}

#[test]
fn numeric_types_are_cast_and_others_refused() {
    let (_dir, path) = temp_parquet(
        "types.parquet",
        ONE_GROUP,
        vec![
            ("id", Arc::new(Int32Array::from(vec![10, 11, 12]))),
            ("x10", Arc::new(Float32Array::from(vec![0.5f32, 1.5, 2.5]))),
            ("x2", Arc::new(Int32Array::from(vec![1, 2, 3]))),
            ("x0", Arc::new(Int64Array::from(vec![-1, -2, -3]))),
            ("xa", Arc::new(StringArray::from(vec!["a", "b", "c"]))),
            ("x", Arc::new(StringArray::from(vec!["a", "b", "c"]))),
            ("y", Arc::new(Int64Array::from(vec![2, 0, 1]))),
            ("name", Arc::new(StringArray::from(vec!["a", "b", "c"]))),
        ],
    );
    let t = Table::read(&path, &ColumnSpec::default()).unwrap();
    assert_eq!(t.feature_names, ["x0", "x2", "x10"]);
    assert_eq!(t.ids, [10, 11, 12]);
    assert!(t.folds.is_none(), "fold is read only if present");
    assert_eq!(t.features.row(1).iter().copied().collect::<Vec<_>>(), [-2.0, 2.0, 1.5]);
    assert_eq!(t.labels.as_deref(), Some(&[2.0, 0.0, 1.0][..]));

    let spec = ColumnSpec::default().with_features(["x0", "name"]);
    let err = Table::read(&path, &spec).unwrap_err();
    assert!(
        matches!(&err, TableError::Schema { source: SchemaError::WrongType { column, found: DataType::Utf8, .. }, .. } if column == "name"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("`name` has type Utf8"), "{msg}");
    assert!(msg.contains("expected a number") && msg.contains("--features"), "{msg}");

    let spec = ColumnSpec::default().with_label(Column::Required("name".into()));
    assert!(matches!(
        Table::read(&path, &spec),
        Err(TableError::Schema {
            source: SchemaError::WrongType { .. },
            ..
        })
    ));
}

#[test]
fn integers_beyond_their_role_are_refused_with_column_row_and_value() {
    let err = refusal(vec![
        ("id", Arc::new(UInt64Array::from(vec![0, 1, u64::MAX]))),
        ("x0", Arc::new(Float64Array::from(vec![0.0, 1.0, 2.0]))),
        ("y", Arc::new(Float64Array::from(vec![0.0, 1.0, 2.0]))),
    ]);
    assert!(
        matches!(&err, TableError::OutOfRange { column, row: 2, .. } if column == "id"),
        "{err:?}"
    );
    assert!(err.to_string().contains(&u64::MAX.to_string()), "{err}");
    let err = refusal(vec![
        ("id", Arc::new(Int64Array::from(vec![0, 1]))),
        ("fold", Arc::new(Int64Array::from(vec![3, 200]))),
        ("x0", Arc::new(Float64Array::from(vec![0.0, 1.0]))),
        ("y", Arc::new(Float64Array::from(vec![0.0, 1.0]))),
    ]);
    assert!(
        err.to_string().contains("value 200 at row 1") && err.to_string().contains("fold number"),
        "{err}"
    );
}

#[test]
fn shared_dir_has_data() {
    // Whatever way it was found, shared/ must hold the data folder.
    let dir = shared_dir().expect("cannot find shared/: set DUALGP_SHARED");
    assert!(dir.join("data").is_dir(), "{} has no data/", dir.display());
}
