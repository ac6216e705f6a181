//! The GP models, by role: `math` (kernels, linear algebra, quadrature,
//! optimisers), `likelihood` (the observation models), `posterior` (the
//! dual-parameter posterior every learner shares), `dual` (the memory-based
//! sequential learner) and `baselines` (Bui et al.'s streaming GP, the
//! offline trainer). A new likelihood goes in `likelihood`, a new learner in
//! its own folder.
//!
//! Conventions: inputs are `n × d` matrices with one point per row; the
//! inducing inputs `Z` are `m × d`; hyperparameters are optimised in log space.

pub mod baselines;
pub mod data;
pub mod dual;
pub mod error;
pub mod fantasy;
pub mod learner;
pub mod likelihood;
pub mod math;
pub mod multi;
pub mod posterior;
pub mod predict;
pub mod scoring;

pub use baselines::offline::{fit_offline, InducingUpdate, OfflineConfig, OfflineModel};
pub use baselines::osgpr::{OsgprConfig, OsgprInducing, OsgprLearner, OsgprReport};
pub use baselines::var_gp::{ThetaConfig, VarGpConfig, VarGpLearner, VarGpTheta, VarGpVariant};
pub use data::Data;
pub use dual::estep::{EStepConfig, PointSites};
pub use dual::memory::{bayesian_leverage_scores, MemoryPolicy};
pub use dual::point::PointId;
pub use dual::sequential::{
    InducingPolicy, PastInMStep, SequentialConfig, SequentialLearner, Shards, StepSeconds, UpdateReport,
};
pub use dual::shard::{Answer, Arrivals, BlockSums, Partition, Query, Shard, Summand, BLOCKS};
pub use dual::share::MemoryShare;
pub use dual::snapshot::Snapshot;
pub use error::ModelError;
pub use learner::{Learned, StreamingLearner};
pub use likelihood::{Likelihood, Link, Predictive};
pub use math::inducing::Pivot;
pub use math::kernel::{Family, Kernel};
pub use math::optim::Optimizer;
pub use multi::MultiOutput;
pub use posterior::DualPosterior;
pub use predict::{
    evaluate, evaluate_by_output, evaluate_mixture, evaluate_mixture_by_output, predict, predict_mixture,
    predict_outputs, Draws, Metrics,
};
