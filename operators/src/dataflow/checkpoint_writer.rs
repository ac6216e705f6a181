//! The operator that saves checkpoints ([`WriteCheckpoints`]'s one
//! implementation), and the thread of its own it writes them on. Serialising the learner and
//! the fsync take 12 ms here for a memory of 1000 points (`cargo bench
//! --bench checkpoint`; more on a slow disk), and the worker that saves
//! checkpoints is the one that reduces every update: on its thread, each
//! write would stall learning and that worker's scoring.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::Instant;

use serde::Serialize;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::StreamVec;
use timely::scheduling::SyncActivator;

use super::checkpoint::{Checkpoint, CheckpointStore, Position, Positions, Saved, WriteCheckpoints};
use super::reduce_stage::ModelUpdate;

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

impl<'scope> WriteCheckpoints<'scope> for StreamVec<'scope, u64, ModelUpdate> {
    fn write_checkpoints<P: Position>(
        self,
        positions: Positions<'scope, P>,
        store: impl Into<Option<CheckpointStore>>,
    ) -> Saved<'scope> {
        let store = store.into();
        let to_first = Exchange::new(|_: &(usize, P)| 0);
        let scope = self.scope();
        let peers = scope.peers();
        self.binary_frontier(positions, Pipeline, to_first, "GpCheckpoint", move |_, info| {
            let mut updates: BTreeMap<u64, (Capability<u64>, ModelUpdate)> = BTreeMap::new();
            let mut reported: BTreeMap<u64, Vec<(usize, P)>> = BTreeMap::new();
            // Checkpoints being written, each epoch's capability held until its write ends.
            let mut writing: BTreeMap<u64, Capability<u64>> = BTreeMap::new();
            // Started by the first checkpoint: only one worker gets any.
            let mut unstarted = store.map(|store| (store, scope.worker().sync_activator_for(info.address.to_vec())));
            let mut writer: Option<Result<Writer<P>, String>> = None;
            move |(updates_in, updates_frontier), (positions_in, positions_frontier), output| {
                updates_in.for_each_stamp(|cap, data| {
                    if let Some(cap) = cap.retain_least(output.output_index()) {
                        for update in data.flat_map(|d| d.drain(..)) {
                            updates.insert(*cap.time(), (cap.clone(), update));
                        }
                    }
                });
                positions_in.for_each_stamp(|cap, data| {
                    if let Some(time) = cap.least() {
                        reported
                            .entry(*time)
                            .or_default()
                            .extend(data.flat_map(|d| d.drain(..)));
                    }
                });
                while let Some(entry) = updates.first_entry() {
                    let epoch = *entry.key();
                    if updates_frontier.less_equal(&epoch) || positions_frontier.less_equal(&epoch) {
                        break;
                    }
                    let (cap, update) = entry.remove();
                    let mut at = reported.remove(&epoch).unwrap_or_default();
                    at.sort_by_key(|p| p.0);
                    at.dedup_by_key(|p| p.0);
                    if at.len() < peers {
                        continue;
                    }
                    let checkpoint = Checkpoint::new(epoch, update.learner, at.into_iter().map(|p| p.1).collect());
                    let w = writer.get_or_insert_with(|| match unstarted.take() {
                        Some((store, wake)) => {
                            Writer::start(store, wake).map_err(|e| format!("cannot start the checkpoint writer: {e}"))
                        }
                        None => Err("no checkpoint directory on the worker that writes checkpoints".into()),
                    });
                    let queued = match w {
                        Ok(w) => w.save(checkpoint),
                        Err(why) => Err(why.clone()),
                    };
                    match queued {
                        Ok(()) => drop(writing.insert(epoch, cap)),
                        Err(why) => output.session(&cap).give(Err(why)),
                    }
                }
                if let Some(Ok(w)) = &writer {
                    let (finished, stopped) = w.finished();
                    for (epoch, outcome) in finished {
                        if let Some(cap) = writing.remove(&epoch) {
                            output.session(&cap).give(outcome);
                        }
                    }
                    if stopped {
                        for (_, cap) in std::mem::take(&mut writing) {
                            output
                                .session(&cap)
                                .give(Err("the checkpoint writer has stopped".to_string()));
                        }
                    }
                }
                // Positions of epochs without an update are not needed.
                let done = |t: &u64| {
                    !updates_frontier.less_equal(t) && !positions_frontier.less_equal(t) && !updates.contains_key(t)
                };
                reported.retain(|t, _| !done(t));
            }
        })
    }
}
