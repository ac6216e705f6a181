//! Helpers shared by the connector tests (and the pipelines' replay test):
//! real data files, small Parquet writers and readers.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatchReader};
use arrow::datatypes::{DataType, Field, Float64Type, Schema};
use arrow::record_batch::RecordBatch;
use dualgp_connectors::{shared_data, EpochPart, ParquetPosition, ParquetSource, ParquetSourceConfig, WorkerShare};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

/// A data file in `shared/data`; fails the test (never skips it) when `shared/` is missing.
pub fn data(name: &str) -> PathBuf {
    shared_data(name).unwrap_or_else(|e| panic!("{e}"))
}

fn props(rows_per_group: usize) -> WriterProperties {
    WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows_per_group))
        .build()
}

fn reader(path: &Path) -> ParquetRecordBatchReader {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
}

/// Every row of the Parquet file at `path`, in one batch.
pub fn read_parquet(path: &Path) -> RecordBatch {
    let reader = reader(path);
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    arrow::compute::concat_batches(&schema, &batches).unwrap()
}

/// The float64 column `name` of `batch`.
pub fn f64s(batch: &RecordBatch, name: &str) -> Vec<f64> {
    let column = batch.column_by_name(name).unwrap_or_else(|| panic!("no column {name}"));
    column.as_primitive::<Float64Type>().values().to_vec()
}

/// Copy `src` to `dst` with row groups of `rows_per_group` rows (the shared
/// files have one row group each; workers share row groups out).
pub fn rewrite_with_row_groups(src: &Path, dst: &Path, rows_per_group: usize) {
    let reader = reader(src);
    let schema = reader.schema();
    let mut w = ArrowWriter::try_new(File::create(dst).unwrap(), schema, Some(props(rows_per_group))).unwrap();
    for batch in reader {
        w.write(&batch.unwrap()).unwrap();
    }
    w.close().unwrap();
}

/// The shared data set `name` (`name.parquet`) copied to `name_groups.parquet`
/// in a fresh temporary directory, in row groups of `rows_per_group` rows; the
/// directory lasts as long as the returned guard.
pub fn regrouped(name: &str, rows_per_group: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}_groups.parquet"));
    rewrite_with_row_groups(&data(&format!("{name}.parquet")), &path, rows_per_group);
    (dir, path)
}

/// Write `columns` (all nullable) to `path` in row groups of `rows_per_group`.
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>, rows_per_group: usize) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema, columns.into_iter().map(|c| c.1).collect()).unwrap();
    write_batch(path, &batch, rows_per_group);
}

/// `columns` written to `name` in a fresh temporary directory, in row groups
/// of `rows_per_group`; the directory lasts as long as the returned guard.
pub fn temp_parquet(name: &str, rows_per_group: usize, columns: Vec<(&str, ArrayRef)>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    write_parquet(&path, columns, rows_per_group);
    (dir, path)
}

/// Write `batch` to `path` in row groups of `rows_per_group`.
pub fn write_batch(path: &Path, batch: &RecordBatch, rows_per_group: usize) {
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props(rows_per_group))).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Every epoch part of one worker, from `resume` on.
pub fn read_parts(
    path: &Path,
    config: &ParquetSourceConfig,
    share: WorkerShare,
    resume: Option<ParquetPosition>,
) -> Vec<EpochPart<ParquetPosition>> {
    let mut source = ParquetSource::open(path, config, share, resume).unwrap();
    let mut parts = Vec::new();
    while let Some(part) = source.next_epoch().unwrap() {
        parts.push(part);
    }
    parts
}

/// Every Arrow numeric type.
pub fn numeric_types() -> Vec<DataType> {
    vec![
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Decimal32(9, 2),
        DataType::Decimal64(18, 2),
        DataType::Decimal128(38, 2),
        DataType::Decimal256(76, 2),
    ]
}
