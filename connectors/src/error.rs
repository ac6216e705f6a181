//! Errors that stop a source or a sink (bad records never do: they become dead letters).

use std::path::PathBuf;

use crate::columns::SchemaError;
use crate::data_file::FileError;

/// Why a source cannot go on. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The file cannot be read as data.
    #[error(transparent)]
    File(#[from] FileError),
    /// A row group cannot be read.
    #[error("{}: cannot read row group {row_group} (corrupt or truncated file?): {detail}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The row group.
        row_group: usize,
        /// What the reader said.
        detail: String,
    },
    /// The columns cannot make up records; the message names the flag that
    /// chooses the column (`--id`, `--features`, `--target`, `--output-column`).
    #[error("{input}: {source}; {}", .source.hint())]
    Schema {
        /// The file or topic.
        input: String,
        /// What is wrong with the columns.
        source: SchemaError,
    },
    /// Settings that cannot work, in a sentence.
    #[error("invalid source configuration: {0}")]
    Config(String),
    /// A saved position that does not fit the input (another file, fewer rows).
    #[error("cannot resume {input} from {position}: {why}")]
    Position {
        /// The file or topic.
        input: String,
        /// The position, as text.
        position: String,
        /// Why it does not fit.
        why: String,
    },
    /// The Kafka client failed.
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(Box<crate::kafka::KafkaError>),
}

/// Why a sink cannot write.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The file cannot be created, written or renamed.
    #[error("cannot write {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The Parquet writer failed.
    #[error("cannot write Parquet to {}: {source}", .path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What the writer said.
        source: parquet::errors::ParquetError,
    },
    /// A prediction of another kind than the file's columns (moments against classes).
    #[error("prediction for id {id} is {found}, but the sink writes {expected}")]
    Layout {
        /// The record's id.
        id: i64,
        /// The prediction's kind.
        found: String,
        /// The kind the columns hold.
        expected: String,
    },
    /// Settings that cannot work, in a sentence.
    #[error("invalid sink configuration: {0}")]
    Config(String),
    /// The Kafka client failed.
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(Box<crate::kafka::KafkaError>),
}

#[cfg(feature = "kafka")]
impl From<crate::kafka::KafkaError> for SourceError {
    fn from(e: crate::kafka::KafkaError) -> Self {
        SourceError::Kafka(Box::new(e))
    }
}

#[cfg(feature = "kafka")]
impl From<crate::kafka::KafkaError> for SinkError {
    fn from(e: crate::kafka::KafkaError) -> Self {
        SinkError::Kafka(Box::new(e))
    }
}
