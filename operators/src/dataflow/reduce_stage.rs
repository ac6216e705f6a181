//! The single-worker reduction: merges the workers' answers in worker order
//! and drives the learner's update, one query per round, until the update is
//! done and the new model flows on.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use serde::{Deserialize, Serialize};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::StreamVec;

use super::learn::Round;
use crate::model::{Answer, ModelError, Query, SequentialLearner, Shards, UpdateReport};

/// The learner after an epoch's update: the new model and a checkpointable state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelUpdate {
    /// The last epoch learned.
    pub epoch: u64,
    /// The first: epochs that closed while the update before ran are learned
    /// together (scoring on arrival only).
    pub from_epoch: u64,
    /// What the update did, or why the batch could not be learned (the model
    /// then stays as it was before the epoch).
    pub outcome: Result<UpdateReport, String>,
    pub learner: SequentialLearner,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum ReduceOutput {
    Query(Box<Query>),
    Update(Box<ModelUpdate>),
}

/// Where the running update and the operator meet: the update leaves its
/// query in `outbox` and waits until the operator puts the merged answer in
/// `inbox`.
#[derive(Default)]
struct Mailbox {
    arrivals: Option<Answer>,
    outbox: Option<Query>,
    inbox: Option<Answer>,
}

/// The workers, as the learner sees them from the reducing worker.
struct Workers(Rc<RefCell<Mailbox>>);

impl Shards for Workers {
    fn ask(&mut self, query: Query) -> impl Future<Output = Answer> {
        let mailbox = Rc::clone(&self.0);
        async move {
            // The round that announced the batch has already answered this one.
            if matches!(query, Query::Arrivals) {
                if let Some(arrivals) = mailbox.borrow_mut().arrivals.take() {
                    return arrivals;
                }
            }
            mailbox.borrow_mut().outbox = Some(query);
            std::future::poll_fn(|_| match mailbox.borrow_mut().inbox.take() {
                Some(answer) => Poll::Ready(answer),
                None => Poll::Pending,
            })
            .await
        }
    }
}

/// The answers of one round, under the capability to reply.
type Answers = (Capability<Round>, Vec<(usize, Answer)>);

type Update = Pin<Box<dyn Future<Output = (SequentialLearner, Result<UpdateReport, ModelError>)>>>;

/// One update in progress, and the state to return to if it fails.
struct Running {
    from_epoch: u64,
    epoch: u64,
    update: Update,
    before: SequentialLearner,
}

/// `max_epochs`: the most epochs one update learns.
pub(super) fn reduce_stage<'scope>(
    answers: StreamVec<'scope, Round, (usize, Answer)>,
    learner: SequentialLearner,
    max_epochs: usize,
) -> StreamVec<'scope, Round, ReduceOutput> {
    let reducer = answers.scope().index() == 0;
    let peers = answers.scope().peers();
    answers.unary_frontier(Exchange::new(|_: &(usize, Answer)| 0), "GpReduce", move |_, _| {
        let mut learner = reducer.then_some(learner);
        let mailbox = Rc::new(RefCell::new(Mailbox::default()));
        let mut running: Option<Running> = None;
        let mut stash: BTreeMap<Round, Answers> = BTreeMap::new();

        move |(input, frontier), output| {
            input.for_each_stamp(|cap, data| {
                if let Some(cap) = cap.retain_least(output.output_index()) {
                    let entry = stash.entry(*cap.time()).or_insert_with(|| (cap, Vec::new()));
                    entry.1.extend(data.flat_map(|d| d.drain(..)));
                }
            });
            while let Some(entry) = stash.first_entry() {
                if frontier.less_equal(entry.key()) {
                    break;
                }
                let (mut cap, mut answers) = entry.remove();
                let from_epoch = cap.time().0;
                if cap.time().1 == 0 {
                    // Epochs that every worker has handed over meanwhile are
                    // learned with this one, at the last one's time. (The
                    // frontier cannot say they are complete: this stage's own
                    // capabilities hold it back.)
                    for _ in 1..max_epochs {
                        let Some(next) = stash.first_entry() else { break };
                        if next.key().1 != 0 || next.get().1.len() < peers {
                            break;
                        }
                        let (next_cap, more) = next.remove();
                        answers.extend(more);
                        cap = next_cap;
                    }
                }
                // Worker order (then epoch order): the sums do not depend on which worker answered first.
                answers.sort_by_key(|a| a.0);
                let merged = answers.into_iter().fold(Answer::Nothing, |all, (_, a)| all.merge(a));
                let epoch = cap.time().0;
                if cap.time().1 == 0 && matches!(merged, Answer::Nothing) {
                    continue; // no worker had a labelled record
                }
                if cap.time().1 == 0 {
                    let mut state = learner.take().expect("one update at a time, on the reducing worker");
                    let before = state.clone();
                    mailbox.borrow_mut().arrivals = Some(merged);
                    let mut workers = Workers(Rc::clone(&mailbox));
                    let update: Update = Box::pin(async move {
                        let outcome = state.learn(&mut workers).await;
                        (state, outcome)
                    });
                    running = Some(Running {
                        from_epoch,
                        epoch,
                        update,
                        before,
                    });
                } else {
                    mailbox.borrow_mut().inbox = Some(merged);
                }
                let run = running.as_mut().expect("answers arrive only while an update runs");
                debug_assert_eq!(run.epoch, epoch);
                match run.update.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                    Poll::Pending => {
                        let query = mailbox.borrow_mut().outbox.take().expect("a waiting update has asked");
                        output.session(&cap).give(ReduceOutput::Query(Box::new(query)));
                    }
                    Poll::Ready((state, outcome)) => {
                        let Running { before, from_epoch, .. } = running.take().expect("polled above");
                        let state = if outcome.is_ok() { state } else { before };
                        output.session(&cap).give(ReduceOutput::Update(Box::new(ModelUpdate {
                            epoch,
                            from_epoch,
                            outcome: outcome.map_err(|e| e.to_string()),
                            learner: state.clone(),
                        })));
                        learner = Some(state);
                    }
                }
            }
        }
    })
}
