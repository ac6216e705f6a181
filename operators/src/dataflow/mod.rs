//! Timely-dataflow operators built on [`crate::model`].
//!
//! [`LearnGp::learn_gp`] turns a stream of records whose timestamps are batch
//! indices (epochs) into predictions, model updates and rejected records.
//! Inside, each epoch is a sequence of rounds `(epoch, round)`: the learner on
//! worker 0 asks a question, every worker answers for its own records and
//! memory points, the answers are merged, and so on until the update is
//! done. Sums are made per fixed block of ids and added in block order, so
//! results are the same, bit for bit, on any number of workers.
//!
//! ```
//! use dualgp_operators::dataflow::{LearnGp, Record};
//! use dualgp_operators::model::{Family, Kernel, Likelihood, SequentialConfig, SequentialLearner};
//! use dualgp_operators::timely::dataflow::operators::{Inspect, ToStream};
//! use dualgp_operators::timely::example;
//!
//! let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.5]);
//! let likelihood = Likelihood::Gaussian { variance: 0.1 };
//! let learner = SequentialLearner::new(kernel, likelihood, SequentialConfig::default()).unwrap();
//! // Runs the dataflow on one worker, in this thread.
//! example(move |scope| {
//!     // One epoch of 300 labelled records: scored with the prior, then learned.
//!     let records = (0..300).map(|i| Record::new(i, vec![i as f64 / 50.0], Some((i as f64 / 50.0).sin())));
//!     let gp = records.to_stream(scope).container::<Vec<_>>().learn_gp(learner, 1);
//!     gp.updates.inspect(|u| assert_eq!(u.learner.n_seen, 300));
//! });
//! ```
//!
//! A complete program, run on several workers, is `operators/examples/embed.rs`.

mod beside;
pub mod checkpoint;
mod checkpoint_writer;
mod delayed;
mod direct;
mod health;
mod learn;
mod options;
mod partition_stage;
pub mod record;
mod reduce_stage;
mod repeats;
mod sample;
mod shard_thread;

pub use checkpoint::{
    checkpoint_from_bytes, read_checkpoint, with_checksum, Checkpoint, CheckpointError, CheckpointStore,
    WriteCheckpoints, CHECKPOINT_VERSION,
};
pub use delayed::delayed_labels;
pub use health::panic_message;
pub use learn::{GpStreams, LearnGp};
pub use options::{GpOptions, Scoring};
pub use record::{Prediction, Record, Rejected};
pub use reduce_stage::ModelUpdate;
pub use sample::Sample;
