//! Parquet and Kafka sources and sinks for dualgp, as Arrow.
//!
//! - [`columns`] is the one column reader: which columns make up records,
//!   the type rules of each role, one [`SchemaError`] for every source.
//! - [`table`] reads a whole data set (Parquet, or CSV: [`csv_input`]) into a
//!   [`Table`] (for `dualgp eval`).
//! - [`mapping`] says which columns make a record; [`arrow_decode`] turns
//!   Arrow batches into records and bad rows into [`DeadLetter`]s.
//! - [`parquet_source`] streams a Parquet (or CSV) file epoch by epoch, one
//!   share of row groups per worker, resumable from a [`ParquetPosition`].
//! - [`parquet_sink`] writes predictions and dead letters to Parquet files
//!   that appear only when complete.
//! - [`kafka`] (feature `kafka`, on by default): a source of a worker's
//!   partitions with offsets per epoch, prediction and dead-letter producers.
//!
//! Nothing here knows about timely: a source operator drives a source per
//! worker with `next_epoch()` and uses the epoch as its timestamp.

#![warn(missing_docs)]

pub mod arrow_decode;
pub mod atomic_parquet;
pub mod columns;
pub mod csv_input;
mod data_file;
pub mod dead_letter;
pub mod epoch;
pub mod error;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod mapping;
mod parquet_check;
pub mod parquet_sink;
pub mod parquet_source;
pub mod prediction_columns;
pub mod table;

pub use arrow_decode::{ArrowDecoder, DecodedRow};
pub use atomic_parquet::partial_path;
pub use columns::{Features, Role, SchemaError, UnresolvedFeatures};
pub use csv_input::is_csv;
pub use data_file::FileError;
pub use dead_letter::{one_line, Counters, DeadLetter, Origin, Reason, ReasonKind};
pub use epoch::{EpochPart, WorkerShare};
pub use error::{SinkError, SourceError};
#[cfg(feature = "kafka")]
pub use kafka::{
    DeadLetterProducer, KafkaConnection, KafkaError, KafkaPosition, KafkaSource, KafkaSourceConfig, MessageFormat,
    PredictionProducer, StartOffset,
};
pub use mapping::{ColumnMapping, LabelKind};
pub use parquet_sink::{DeadLetterWriter, PredictionColumns, PredictionLayout, PredictionWriter};
pub use parquet_source::{EpochRule, ParquetPosition, ParquetSource, ParquetSourceConfig};
pub use table::{shared_data, shared_dir, Column, ColumnSpec, Table, TableError};
