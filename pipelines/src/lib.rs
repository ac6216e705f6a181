//! The `dualgp` command's pipelines: evaluation, replay and serving.
//!
//! [`protocol`] turns a data [`Table`](dualgp_connectors::Table) into the
//! standardised, ordered, batched arrays an evaluation protocol feeds a learner.

#![warn(missing_docs)]

pub mod cli;
pub mod cluster;
pub mod column_args;
pub mod curves;
pub mod demo;
pub mod epoch_column;
pub mod eval;
pub mod inspect;
pub mod kafka_tools;
pub mod likelihood_args;
pub mod metrics;
pub mod model_args;
pub mod pipeline;
pub mod protocol;
pub mod replay;
pub mod report;
pub mod saved_model;
pub mod serve;
pub mod suggest;
pub mod toys;
mod wiring;
pub mod wording;
