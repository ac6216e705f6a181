//! The dual-parameter sparse GP and its memory-based sequential learner
//! (Chang et al. 2023), on the posterior of [`crate::model::posterior`]: the
//! E-step on per-point sites, the M-step objective, the past's message, the
//! memory and the shards that share the per-point work out among workers.

pub mod ask;
pub mod blocks;
pub mod estep;
pub mod forgetting;
pub mod memory;
pub mod objective;
pub mod past;
pub mod point;
pub mod presets;
pub mod sequential;
pub mod shard;
pub mod share;
pub mod snapshot;

/// The posterior's old path: it moved to [`crate::model::posterior`], which every learner shares.
pub use crate::model::posterior;
