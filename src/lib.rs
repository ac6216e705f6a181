//! **dualgp**: memory-based dual sparse Gaussian processes for sequential
//! learning (Chang et al., ICML 2023), as timely-dataflow operators.
//!
//! This facade re-exports the workspace's crates:
//! - [`operators`]: the GP model ([`operators::model`]) and its dataflow operators;
//! - [`connectors`]: Parquet and Kafka sources and sinks, as Arrow;
//! - [`pipelines`]: evaluation protocols and the `dualgp` command's building blocks.

pub use dualgp_connectors as connectors;
pub use dualgp_operators as operators;
pub use dualgp_operators::model;
/// The timely the operators are built on.
pub use dualgp_operators::timely;
pub use dualgp_pipelines as pipelines;
