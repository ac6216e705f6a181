//! Checkpoints written on a thread of their own. Serialising the learner and
//! the fsync take 12 ms here for a memory of 1000 points (`cargo bench
//! --bench checkpoint`; more on a slow disk), and the worker that saves
//! checkpoints is the one that reduces every update: on its thread, each
//! write would stall learning and that worker's scoring.

use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::Instant;

use serde::Serialize;
use timely::scheduling::SyncActivator;

use super::checkpoint::{Checkpoint, CheckpointStore};

/// What became of one checkpoint: its epoch, or why it was not saved.
pub(super) type Outcome = Result<u64, String>;

/// Saves checkpoints in the order given, one at a time (so a store never
/// sees two writers), and wakes the operator when one is done.
pub(super) struct Writer<P> {
    jobs: Sender<Checkpoint<P>>,
    done: Receiver<(u64, Outcome)>,
}

impl<P: Serialize + Send + 'static> Writer<P> {
    pub fn start(store: CheckpointStore, wake: SyncActivator) -> std::io::Result<Self> {
        let (jobs, todo) = mpsc::channel::<Checkpoint<P>>();
        let (report, done) = mpsc::channel();
        // Detached: it ends when the operator drops its end of `jobs`.
        std::thread::Builder::new()
            .name("dualgp-checkpoints".into())
            .spawn(move || {
                for checkpoint in todo {
                    let (epoch, started) = (checkpoint.epoch, Instant::now());
                    let outcome = store.save(&checkpoint).map(|_| epoch).map_err(|e| e.to_string());
                    tracing::debug!(
                        "checkpoint of epoch {epoch} written in {:.3} s",
                        started.elapsed().as_secs_f64()
                    );
                    // The operator gone (the dataflow dropped): nobody waits for the rest.
                    if report.send((epoch, outcome)).is_err() || wake.activate().is_err() {
                        break;
                    }
                }
            })?;
        Ok(Writer { jobs, done })
    }

    /// Queues `checkpoint`, or says that the writer has stopped.
    pub fn save(&self, checkpoint: Checkpoint<P>) -> Result<(), String> {
        self.jobs
            .send(checkpoint)
            .map_err(|_| "the checkpoint writer has stopped".to_string())
    }

    /// The checkpoints finished since the last call, and whether the writer
    /// has stopped (its thread ended: no other will finish).
    pub fn finished(&self) -> (Vec<(u64, Outcome)>, bool) {
        let mut finished = Vec::new();
        loop {
            match self.done.try_recv() {
                Ok(outcome) => finished.push(outcome),
                Err(TryRecvError::Empty) => return (finished, false),
                Err(TryRecvError::Disconnected) => return (finished, true),
            }
        }
    }
}
