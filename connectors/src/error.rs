//! Errors that stop a source or a sink (bad records never do: they become dead letters).

use std::path::PathBuf;

use crate::arrow_decode::SchemaError;

/// Why a source cannot go on. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot open {}: {source}", .path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{} is not a valid Parquet file (truncated, or another format): {source}", .path.display())]
    NotParquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[error("{}: cannot read row group {row_group} (corrupt or truncated file?): {detail}", .path.display())]
    Read {
        path: PathBuf,
        row_group: usize,
        detail: String,
    },
    #[error("{input}: {source}; fix the column mapping or the input")]
    Schema { input: String, source: SchemaError },
    #[error("invalid source configuration: {0}")]
    Config(String),
    #[error("cannot resume {input} from {position}: {why}")]
    Position {
        input: String,
        position: String,
        why: String,
    },
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(Box<crate::kafka::KafkaError>),
}

/// Why a sink cannot write.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("cannot write {}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot write Parquet to {}: {source}", .path.display())]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[error("prediction for id {id} is {found}, but the sink writes {expected}")]
    Layout { id: i64, found: String, expected: String },
    #[error("invalid sink configuration: {0}")]
    Config(String),
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
