//! Parquet and Kafka sources and sinks for dualgp, as Arrow.
//!
//! [`table`] reads a whole Parquet data set (ids, folds, features, labels)
//! into a small columnar [`Table`] for the evaluation protocols.

pub mod table;

pub use table::{shared_data, shared_dir, Column, ColumnSpec, Features, Table, TableError};
