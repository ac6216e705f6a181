//! Timely-dataflow operators built on [`crate::model`].
//!
//! [`LearnGp::learn_gp`] turns a stream of records whose timestamps are batch
//! indices (epochs) into predictions, model updates and rejected records.
//! Inside, each epoch is a sequence of rounds `(epoch, round)`: the learner on
//! worker 0 asks a question, every worker answers for its own records and
//! memory points, the answers are merged in worker order, and so on until the
//! update is done. Results do not depend on the number of workers beyond
//! floating-point rounding.

pub mod checkpoint;
mod learn;
mod partition_stage;
pub mod record;
mod reduce_stage;

pub use checkpoint::{Checkpoint, CheckpointError, CheckpointStore, WriteCheckpoints, CHECKPOINT_VERSION};
pub use learn::{GpStreams, LearnGp};
pub use record::{Prediction, Record, Rejected};
pub use reduce_stage::ModelUpdate;

/// A time inside the learner: (epoch, round), ordered lexicographically.
type Round = (u64, u32);
