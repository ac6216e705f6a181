//! The single-worker reduction: merges the workers' answers in worker order
//! and drives the learner's update, one query per round, until the update is
//! done and the new model flows on.
//!
//! An update that fails leaves the model as it was before the epoch: the
//! learner's error, a panic inside the update or in a worker's answer, and
//! a new model with non-finite numbers all take that path (see [`health`]),
//! and the stream goes on with the next epoch.
//!
//! [`health`]: super::health

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use serde::{Deserialize, Serialize};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::StreamVec;

use super::health::{panic_message, unusable};
use super::options::Round;
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
/// `inbox`; a new model that cannot be used is held back with the reason in
/// `refused`, and the update waits for good.
#[derive(Default)]
struct Mailbox {
    arrivals: Option<Answer>,
    outbox: Option<Query>,
    inbox: Option<Answer>,
    refused: Option<String>,
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
            // The workers take up the new model with Finish: it must be usable.
            let refused = match &query {
                Query::Finish { model, .. } => unusable(model),
                _ => None,
            };
            match refused {
                Some(why) => mailbox.borrow_mut().refused = Some(format!("the new model cannot be used: {why}")),
                None => mailbox.borrow_mut().outbox = Some(query),
            }
            std::future::poll_fn(|_| match mailbox.borrow_mut().inbox.take() {
                Some(answer) => Poll::Ready(answer),
                None => Poll::Pending,
            })
            .await
        }
    }
}

/// A worker's answer to the learner, or why it could not answer.
pub(super) type WorkerAnswer = Result<Answer, String>;

/// The answers of one round, under the capability to reply.
type Answers = (Capability<Round>, Vec<(usize, WorkerAnswer)>);

type Update = Pin<Box<dyn Future<Output = (SequentialLearner, Result<UpdateReport, ModelError>)>>>;

/// One update in progress, and the state to return to if it fails.
struct Running {
    from_epoch: u64,
    epoch: u64,
    update: Update,
    before: SequentialLearner,
}

/// Where an update stands after the operator has moved it on.
enum Step {
    Asks(Box<Query>),
    Learned(Box<SequentialLearner>, UpdateReport),
    Failed(String),
}

impl Running {
    /// Polls the update once: its next question, or how it ended. A panic
    /// inside it is a failure of this update, not of the worker.
    fn step(&mut self, mailbox: &RefCell<Mailbox>) -> Step {
        let polled = catch_unwind(AssertUnwindSafe(|| {
            self.update.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        }));
        match polled {
            Ok(Poll::Ready((state, Ok(report)))) => Step::Learned(Box::new(state), report),
            Ok(Poll::Ready((_, Err(e)))) => Step::Failed(e.to_string()),
            Ok(Poll::Pending) => {
                let mut mailbox = mailbox.borrow_mut();
                match (mailbox.outbox.take(), mailbox.refused.take()) {
                    (_, Some(why)) => Step::Failed(why),
                    (Some(query), None) => Step::Asks(Box::new(query)),
                    (None, None) => Step::Failed("the update waits without a question".into()),
                }
            }
            Err(panic) => Step::Failed(format!("the update panicked: {}", panic_message(&*panic))),
        }
    }
}

/// `max_epochs`: the most epochs one update learns.
pub(super) fn reduce_stage<'scope>(
    answers: StreamVec<'scope, Round, (usize, WorkerAnswer)>,
    learner: SequentialLearner,
    max_epochs: usize,
) -> StreamVec<'scope, Round, ReduceOutput> {
    let reducer = answers.scope().index() == 0;
    let peers = answers.scope().peers();
    answers.unary_frontier(Exchange::new(|_: &(usize, WorkerAnswer)| 0), "GpReduce", move |_, _| {
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
                let merged = answers.into_iter().try_fold(Answer::Nothing, |all, (worker, a)| {
                    a.map(|a| all.merge(a)).map_err(|why| format!("worker {worker}: {why}"))
                });
                let epoch = cap.time().0;
                if cap.time().1 == 0 && matches!(merged, Ok(Answer::Nothing)) {
                    continue; // no worker had a labelled record
                }
                if cap.time().1 == 0 {
                    let mut state = learner.take().expect("one update at a time, on the reducing worker");
                    let before = state.clone();
                    *mailbox.borrow_mut() = Mailbox::default();
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
                }
                let run = running.as_mut().expect("answers arrive only while an update runs");
                debug_assert_eq!(run.epoch, epoch);
                let step = match merged {
                    Ok(merged) if cap.time().1 == 0 => {
                        mailbox.borrow_mut().arrivals = Some(merged);
                        run.step(&mailbox)
                    }
                    Ok(merged) => {
                        mailbox.borrow_mut().inbox = Some(merged);
                        run.step(&mailbox)
                    }
                    Err(why) => Step::Failed(why),
                };
                let learned = match step {
                    Step::Asks(query) => {
                        output.session(&cap).give(ReduceOutput::Query(query));
                        continue;
                    }
                    Step::Learned(state, report) => Ok((*state, report)),
                    Step::Failed(why) => Err(why),
                };
                let Running { from_epoch, before, .. } = running.take().expect("polled above");
                let (state, outcome) = match learned {
                    Ok((state, report)) => (state, Ok(report)),
                    Err(why) => (before, Err(why)),
                };
                output.session(&cap).give(ReduceOutput::Update(Box::new(ModelUpdate {
                    epoch,
                    from_epoch,
                    outcome,
                    learner: state.clone(),
                })));
                learner = Some(state);
            }
        }
    })
}
