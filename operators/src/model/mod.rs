//! The GP mathematics: kernels, likelihoods, the dual-parameter sparse
//! posterior, its E-step and M-step, and the offline (t-SVGP) trainer.
//!
//! Conventions: inputs are `n × d` matrices with one point per row; the
//! inducing inputs `Z` are `m × d`; hyperparameters are optimised in log space.

pub mod data;
pub mod error;
pub mod estep;
pub mod inducing;
pub mod kernel;
pub mod likelihood;
pub mod linalg;
pub mod memory;
pub mod objective;
pub mod optim;
pub mod osgpr;
pub mod past;
pub mod posterior;
pub mod predict;
pub mod quadrature;
pub mod sequential;
pub mod shard;
pub mod snapshot;
pub mod trainer;

pub use data::Data;
pub use error::ModelError;
pub use estep::{EStepConfig, PointSites};
pub use inducing::Pivot;
pub use kernel::{Family, Kernel};
pub use likelihood::{Likelihood, Link, Predictive};
pub use memory::{bayesian_leverage_scores, MemoryPolicy};
pub use optim::Optimizer;
pub use osgpr::{OsgprConfig, OsgprInducing, OsgprLearner, OsgprReport};
pub use posterior::DualPosterior;
pub use predict::{evaluate, predict, Metrics};
pub use sequential::{
    InducingPolicy, PastInMStep, SequentialConfig, SequentialLearner, Shards, StepSeconds, UpdateReport,
};
pub use shard::{Answer, BlockSums, Partition, PointId, Query, Shard, Summand, BLOCKS};
pub use snapshot::Snapshot;
pub use trainer::{fit_offline, InducingUpdate, OfflineConfig, OfflineModel};
