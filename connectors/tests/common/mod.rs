//! Helpers shared by the connector tests: real data files, small Parquet writers.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatchReader};
use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;
use dualgp_connectors::{shared_data, EpochPart, ParquetPosition, ParquetSource, ParquetSourceConfig, WorkerShare};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
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

/// Copy `src` to `dst` with row groups of `rows_per_group` rows (the shared
/// files have one row group each; workers share row groups out).
pub fn rewrite_with_row_groups(src: &Path, dst: &Path, rows_per_group: usize) {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(src).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let schema = reader.schema();
    let mut w = ArrowWriter::try_new(File::create(dst).unwrap(), schema, Some(props(rows_per_group))).unwrap();
    for batch in reader {
        w.write(&batch.unwrap()).unwrap();
    }
    w.close().unwrap();
}

/// Write `columns` (all nullable) to `path` in row groups of `rows_per_group`.
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>, rows_per_group: usize) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect()).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(props(rows_per_group))).unwrap();
    w.write(&batch).unwrap();
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
