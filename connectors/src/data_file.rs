//! A data file opened as every reader opens it: CSV by its extension, its
//! schema inferred; anything else as Parquet, its footer read and checked
//! ([`check_chunks`]) before any row is.

use std::fs::File;
use std::path::{Path, PathBuf};

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

/// Why a data file cannot be read as one: the same for a whole table
/// (`eval`) and a stream (`replay`). Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be opened.
    #[error("cannot open {}: {source}; check the path (data sets live in shared/data)", .path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The file is not Parquet, or its footer is missing (a truncated file).
    #[error("{} is not a valid Parquet file (truncated, or another format): {source}; re-copy or re-export it", .path.display())]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// What the Parquet reader said.
        source: ParquetError,
    },
    /// The file ends in `.csv` but cannot be read as CSV with a header row:
    /// a row with another number of fields than the header (a truncated
    /// file), text that is not UTF-8, ….
    #[error("{} is not a CSV file that can be read (truncated or malformed?): {source}; fix or re-export it", .path.display())]
    NotCsv {
        /// The file.
        path: PathBuf,
        /// What the CSV reader said.
        source: ArrowError,
    },
    /// A `.csv` file with a header and no rows: no values to type its columns by.
    #[error("{} has a header but no rows: nothing to read, and no values to tell its columns' types", .path.display())]
    EmptyCsv {
        /// The file.
        path: PathBuf,
    },
}

impl DataFile {
    pub(crate) fn open(path: &Path) -> Result<DataFile, FileError> {
        let path_buf = || path.to_owned();
        let file = File::open(path).map_err(|source| FileError::Open {
            path: path_buf(),
            source,
        })?;
        if is_csv(path) {
            let csv = CsvInput::open(path, &file).map_err(|source| FileError::NotCsv {
                path: path_buf(),
                source,
            })?;
            return match csv.rows() {
                0 => Err(FileError::EmptyCsv { path: path_buf() }),
                _ => Ok(DataFile::Csv(csv)),
            };
        }
        let not_parquet = |source| FileError::NotParquet {
            path: path_buf(),
            source,
        };
        let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(not_parquet)?;
        let file_len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
        check_chunks(metadata.metadata(), file_len).map_err(not_parquet)?;
        Ok(DataFile::Parquet { file, metadata })
    }
}
