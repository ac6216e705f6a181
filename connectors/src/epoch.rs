//! What a source hands a worker each epoch, and which share of the input is whose.

use dualgp_operators::dataflow::Record;
use serde::{Deserialize, Serialize};

use crate::dead_letter::DeadLetter;

/// One worker's share of the input: worker `index` of `peers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerShare {
    /// This worker.
    pub index: usize,
    /// How many workers share the input.
    pub peers: usize,
}

impl WorkerShare {
    /// The whole input, for a single reader.
    pub const ALONE: WorkerShare = WorkerShare { index: 0, peers: 1 };

    /// Worker `index` of `peers`.
    pub fn new(index: usize, peers: usize) -> Self {
        WorkerShare { index, peers }
    }

    /// Whether unit `unit` (a row group, a partition) is this worker's:
    /// units are dealt round-robin.
    pub fn owns(&self, unit: usize) -> bool {
        unit % self.peers == self.index
    }

    /// Why this share names no worker, if it does not.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self.peers > 0 && self.index < self.peers {
            true => Ok(()),
            false => Err(format!(
                "worker {} of {}: the index must be below the number of workers",
                self.index, self.peers
            )),
        }
    }
}

/// One worker's part of one epoch: its records (in input order), its dead
/// letters, and the position to resume from once this epoch is checkpointed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochPart<P> {
    /// The epoch.
    pub epoch: u64,
    /// Its records, in input order.
    pub records: Vec<Record>,
    /// Its rows that could not be records.
    pub dead_letters: Vec<DeadLetter>,
    /// Where to resume once this epoch is checkpointed.
    pub position: P,
}
