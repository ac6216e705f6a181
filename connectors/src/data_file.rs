//! A data file opened as every reader opens it: CSV by its extension, its
//! schema inferred; anything else as Parquet, its footer read and checked
//! ([`check_chunks`]) before any row is.

use std::fs::File;
use std::path::Path;

use arrow::error::ArrowError;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::errors::ParquetError;

use crate::csv_input::{is_csv, CsvInput};
use crate::parquet_check::check_chunks;

/// A file opened, before its columns are chosen.
pub(crate) enum DataFile {
    Parquet { file: File, metadata: ArrowReaderMetadata },
    Csv(CsvInput),
}

/// Why a file could not be opened; each reader's error adds the path.
pub(crate) enum OpenFailure {
    /// The file system's reason.
    Open(std::io::Error),
    /// A `.csv` file the CSV reader refused.
    NotCsv(ArrowError),
    /// A `.csv` file with a header and no rows: no values to type its columns by.
    EmptyCsv,
    /// No valid Parquet footer (truncated, or another format).
    NotParquet(ParquetError),
}

impl DataFile {
    pub(crate) fn open(path: &Path) -> Result<DataFile, OpenFailure> {
        let file = File::open(path).map_err(OpenFailure::Open)?;
        if is_csv(path) {
            let csv = CsvInput::open(path, &file).map_err(OpenFailure::NotCsv)?;
            return match csv.rows() {
                0 => Err(OpenFailure::EmptyCsv),
                _ => Ok(DataFile::Csv(csv)),
            };
        }
        let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(OpenFailure::NotParquet)?;
        let file_len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
        check_chunks(metadata.metadata(), file_len).map_err(OpenFailure::NotParquet)?;
        Ok(DataFile::Parquet { file, metadata })
    }
}
