//! Which source positions worker 0 may commit to the consumer group. Every
//! worker sends its position after an epoch once that epoch's predictions
//! and dead letters are delivered; they reach worker 0 through the dataflow
//! (from every process). With checkpoints, an epoch's positions are
//! committed once its checkpoint is saved; without, once every worker has
//! reported (the positions' frontier has passed the epoch).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use dualgp_connectors::KafkaPosition;
use dualgp_operators::dataflow::checkpoint::{Positions, Saved};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::operator::empty;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::StreamVec;

/// What worker 0 has learned about its commits.
#[derive(Debug, Default)]
pub(crate) struct Commits {
    /// The newest epoch whose positions may be committed, and them merged.
    pub ready: Option<(u64, KafkaPosition)>,
    /// The newest epoch checkpointed.
    pub checkpointed: Option<u64>,
    /// Why a checkpoint was not saved (the first time).
    pub error: Option<String>,
}

impl Commits {
    fn ready(&mut self, epoch: u64, at: &[KafkaPosition]) {
        if self.ready.as_ref().is_some_and(|(e, _)| *e >= epoch) {
            return;
        }
        if let Some(merged) = KafkaPosition::merge(at) {
            self.ready = Some((epoch, merged));
        }
    }
}

/// Gathers `positions` at worker 0 and, as `saved` (the checkpoint writer's
/// outcomes, `None` without checkpoints) says, keeps in `commits` what may
/// be committed.
pub(crate) fn track_commits<'scope>(
    positions: Positions<'scope, KafkaPosition>,
    saved: Option<Saved<'scope>>,
    commits: Rc<RefCell<Commits>>,
) {
    let checkpointing = saved.is_some();
    let saved = saved.unwrap_or_else(|| empty(positions.scope()));
    let to_first = Exchange::new(|_: &(usize, KafkaPosition)| 0);
    let _: StreamVec<'scope, u64, ()> = positions.binary_frontier::<_, CapacityContainerBuilder<Vec<()>>, _, _, _, _>(
        saved,
        to_first,
        Pipeline,
        "GpCommits",
        move |_, _| {
            let mut reported: BTreeMap<u64, Vec<KafkaPosition>> = BTreeMap::new();
            // Checkpointed epochs whose positions have not all come here yet
            // (they travel on a channel of their own).
            let mut saved_epochs: BTreeSet<u64> = BTreeSet::new();
            move |(positions_in, positions_frontier), (saved_in, saved_frontier), _| {
                positions_in.for_each_stamp(|cap, data| {
                    if let Some(time) = cap.least() {
                        reported
                            .entry(*time)
                            .or_default()
                            .extend(data.flat_map(|d| d.drain(..)).map(|(_, p)| p));
                    }
                });
                let mut c = commits.borrow_mut();
                saved_in.for_each_stamp(|_, data| {
                    for outcome in data.flat_map(|d| d.drain(..)) {
                        match outcome {
                            Ok(epoch) => {
                                c.checkpointed = c.checkpointed.max(Some(epoch));
                                saved_epochs.insert(epoch);
                            }
                            Err(why) => drop(c.error.get_or_insert(format!(
                                "cannot checkpoint: {why}; nothing after the last checkpoint is committed, so a restart resumes from it"
                            ))),
                        }
                    }
                });
                let complete = |t: &u64| !positions_frontier.less_equal(t);
                while let Some(epoch) = saved_epochs.first().copied().filter(complete) {
                    saved_epochs.remove(&epoch);
                    if let Some(at) = reported.get(&epoch) {
                        c.ready(epoch, at);
                    }
                }
                if !checkpointing {
                    if let Some((epoch, at)) = reported.iter().rev().find(|(t, _)| complete(t)) {
                        c.ready(*epoch, at);
                    }
                }
                // Positions no checkpoint will come for (or already committed).
                let newest = c.ready.as_ref().map(|(e, _)| *e);
                reported.retain(|t, _| newest.is_none_or(|e| *t > e) && (!complete(t) || saved_frontier.less_equal(t)));
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use timely::dataflow::operators::Input;
    use timely::dataflow::InputHandleVec;

    fn position(partition: i32, offset: i64, next_epoch: u64) -> KafkaPosition {
        KafkaPosition {
            topic: "in".into(),
            next_epoch,
            offsets: BTreeMap::from([(partition, offset)]),
        }
    }

    /// What worker 0 may commit after two workers (each with a partition of
    /// its own) report epochs 0, 1 and 2, and, with checkpoints, only
    /// epoch 1 is saved.
    fn ready_after_three_epochs(checkpointing: bool) -> Option<(u64, KafkaPosition)> {
        let guards = timely::execute(timely::Config::process(2), move |worker| {
            let mut positions = InputHandleVec::new();
            let mut saved = InputHandleVec::new();
            let commits = Rc::new(RefCell::new(Commits::default()));
            let kept = Rc::clone(&commits);
            worker.dataflow::<u64, _, _>(|scope| {
                let saved = checkpointing.then(|| scope.input_from(&mut saved));
                track_commits(scope.input_from(&mut positions), saved, kept);
            });
            let w = worker.index();
            for epoch in 0..3 {
                positions.advance_to(epoch);
                positions.send((w, position(w as i32, 10 * (epoch as i64 + 1), epoch + 1)));
            }
            if w == 0 {
                saved.advance_to(1);
                saved.send(Ok(1));
            }
            drop((positions, saved));
            while worker.step_or_park(None) {}
            let ready = commits.borrow_mut().ready.take();
            ready
        })
        .unwrap();
        guards.join().into_iter().next().unwrap().unwrap()
    }

    #[test]
    fn with_checkpoints_only_a_checkpointed_epoch_is_committed_and_without_the_newest_everyone_reported() {
        let both = |offset| BTreeMap::from([(0, offset), (1, offset)]);
        let (epoch, at) = ready_after_three_epochs(true).expect("epoch 1 is checkpointed");
        assert_eq!((epoch, at.next_epoch, at.offsets), (1, 2, both(20)));
        let (epoch, at) = ready_after_three_epochs(false).expect("every epoch is reported");
        assert_eq!((epoch, at.next_epoch, at.offsets), (2, 3, both(30)));
    }
}
