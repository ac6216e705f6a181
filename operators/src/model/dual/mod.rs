//! The dual-parameter sparse GP and its memory-based sequential learner
//! (Chang et al. 2023): the posterior held as site totals, the E-step on
//! per-point sites, the M-step objective, the past's message, the memory and
//! the shards that share the per-point work out among workers.

pub mod ask;
pub mod blocks;
pub mod estep;
pub mod memory;
pub mod objective;
pub mod past;
pub mod point;
pub mod posterior;
pub mod sequential;
pub mod shard;
pub mod share;
pub mod snapshot;
