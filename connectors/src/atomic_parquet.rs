//! A Parquet file that appears under its name only when complete: it is
//! written to `NAME.partial` beside it and renamed on [`finish`](AtomicParquet::finish),
//! so a crash leaves a `.partial` file, never a truncated file that looks done.
//! It takes columns of its schema and counts the rows written.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::SinkError;

/// Rows per row group: readers stream a group at a time, so keep them modest.
pub const ROWS_PER_GROUP: usize = 64 * 1024;

pub(crate) struct AtomicParquet {
    path: PathBuf,
    partial: PathBuf,
    writer: ArrowWriter<File>,
    schema: SchemaRef,
    rows: u64,
}

/// `NAME.partial` beside `path`.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

impl AtomicParquet {
    pub(crate) fn create(path: &Path, schema: SchemaRef) -> Result<Self, SinkError> {
        if path.file_name().is_none() {
            return Err(SinkError::Config(format!("{} is not a file path", path.display())));
        }
        let partial = partial_path(path);
        let io = |source| SinkError::Io {
            path: partial.clone(),
            source,
        };
        let file = File::create(&partial).map_err(io)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(ROWS_PER_GROUP))
            .build();
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|source| SinkError::Parquet {
            path: partial.clone(),
            source,
        })?;
        Ok(AtomicParquet {
            path: path.to_owned(),
            partial,
            writer,
            schema,
            rows: 0,
        })
    }

    /// Appends rows: one array per column of the schema, all of one length.
    pub(crate) fn write(&mut self, columns: Vec<ArrayRef>) -> Result<(), SinkError> {
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| SinkError::Config(e.to_string()))?;
        self.writer.write(&batch).map_err(|source| SinkError::Parquet {
            path: self.partial.clone(),
            source,
        })?;
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Write the footer, sync, and rename into place; returns the rows written.
    pub(crate) fn finish(self) -> Result<u64, SinkError> {
        let AtomicParquet {
            path,
            partial,
            writer,
            rows,
            ..
        } = self;
        let file = writer.into_inner().map_err(|source| SinkError::Parquet {
            path: partial.clone(),
            source,
        })?;
        let io = |p: &Path| {
            let p = p.to_owned();
            move |source| SinkError::Io { path: p, source }
        };
        file.sync_all().map_err(io(&partial))?;
        drop(file);
        fs::rename(&partial, &path).map_err(io(&path))?;
        // Make the rename itself durable.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
        }
        Ok(rows)
    }
}
