//! The single-worker reduction: merges the workers' answers in worker order
//! and drives the learner's update, one query per round, until the update is
//! done and the new model flows on. The update runs on a thread beside the
//! worker's (see [`beside`](super::beside)), which goes on scoring meanwhile.
//!
//! An update that fails leaves the model as it was before the epoch: the
//! learner's error, a panic inside the update or in a worker's answer, and
//! a new model with non-finite numbers all take that path (see [`health`]),
//! and the stream goes on with the next epoch.
//!
//! [`health`]: super::health

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::StreamVec;
use timely::scheduling::SyncActivator;

use super::beside::{Beside, Jobs, Placement, Polled, Results};
use super::direct::{Line, LineId, OnLine};
use super::health::{panic_message, unusable};
use super::options::{GpOptions, Round, Scoring};
use super::sample::{Pace, Sample, UpdateBatch};
use crate::model::{Answer, Arrivals, Query, SequentialLearner, Shards, UpdateReport};

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
    /// The learner after the epoch (as before it when the update failed).
    pub learner: SequentialLearner,
    /// The share of its epochs' labelled records the update learned: all of
    /// them unless the learner fell behind a bound of staleness
    /// ([`GpOptions::max_staleness`]).
    pub sample: Sample,
    /// Labelled records scored since the update before and not learned, to
    /// hold the models within that bound.
    pub shed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum ReduceOutput {
    Query(Box<Question>),
    Update(Box<ModelUpdate>),
}

/// The learner's next question to every worker, which records its update
/// learns, and the line its thread may also ask this process's shards by.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Question {
    pub query: Query,
    pub batch: UpdateBatch,
    pub line: LineId,
}

/// What the operator hands the learner's thread: an update to begin, with
/// the batch's arrivals (the answer to its first question), or one that
/// cannot begin; the merged answer to the question it asked last, or why
/// there is none.
enum Job {
    Begin {
        arrivals: Answer,
    },
    /// The update fails before it began, with this reason.
    Refuse(String),
    Answer(Answer),
    /// A worker could not answer: the update fails with this reason.
    Abort(String),
}

/// Where an update stands: its next question, or how it ended.
enum Step {
    Asks(Box<Query>),
    /// A copy of the learner after the update (as before it, if it failed),
    /// to send on. The thread keeps the learner and makes its copies, so the
    /// worker's own thread only scores meanwhile.
    Ended {
        learner: Box<SequentialLearner>,
        outcome: Result<UpdateReport, String>,
    },
}

/// Why the learner's thread stops an update midway (unwound to its top).
enum Stop {
    /// The update fails with this reason.
    Fails(String),
    /// The operator is gone: nothing to report to.
    Abandoned,
}

/// The workers, as the learner sees them from its thread: a question goes
/// to the operator, which sends it to every worker and hands back the
/// merged answer, or once the update's records are with every shard, by
/// the line straight to the shards' threads when they are all in this process.
struct Workers<'a> {
    arrivals: Option<Answer>,
    jobs: &'a Jobs<Job>,
    steps: &'a Results<Step>,
    line: &'a Line,
    /// Whether a question of this update went through the dataflow: its
    /// first hands every shard the records the update learns.
    shards_hold_update: bool,
    /// The question on the line, its answers not yet in.
    on_line: Option<OnLine>,
    /// Questions the workers answered, how many of them on the line, and
    /// how long the learner waited for them: beside the shards' own time
    /// (their debug line) this tells the trips from the work.
    questions: usize,
    on_the_line: usize,
    waited: Duration,
    asked_at: Option<Instant>,
}

impl Workers<'_> {
    fn answer(&mut self, query: Query) -> Answer {
        self.send(query).unwrap_or_else(|| self.receive())
    }

    /// Hands `query` to the operator, or answers it at once (`Some`).
    fn send(&mut self, query: Query) -> Option<Answer> {
        // The round that announced the batch has already answered this one.
        if matches!(query, Query::Arrivals) {
            if let Some(arrivals) = self.arrivals.take() {
                return Some(arrivals);
            }
        }
        // The workers take up the new model with Finish: it must be usable.
        if let Query::Finish { model, .. } = &query {
            if let Some(why) = unusable(model) {
                resume_unwind(Box::new(Stop::Fails(format!("the new model cannot be used: {why}"))));
            }
        }
        self.asked_at = Some(Instant::now());
        if self.shards_hold_update && Line::carries(&query) {
            self.on_line = self.line.ask(&query);
            if self.on_line.is_some() {
                return None;
            }
        }
        if !self.steps.send(Step::Asks(Box::new(query))) {
            resume_unwind(Box::new(Stop::Abandoned));
        }
        None
    }

    /// The merged answer to the question sent last.
    fn receive(&mut self) -> Answer {
        let answer = match self.on_line.take() {
            Some(on_line) => {
                self.on_the_line += 1;
                on_line.answer()
            }
            None => {
                self.shards_hold_update = true;
                match self.jobs.next() {
                    Some(Job::Answer(answer)) => Ok(answer),
                    Some(Job::Abort(why)) => Err(why),
                    Some(Job::Begin { .. } | Job::Refuse(_)) => Err("a new update began before this one ended".into()),
                    None => resume_unwind(Box::new(Stop::Abandoned)),
                }
            }
        };
        if let Some(asked_at) = self.asked_at.take() {
            self.waited += asked_at.elapsed();
            self.questions += 1;
        }
        answer.unwrap_or_else(|why| resume_unwind(Box::new(Stop::Fails(why))))
    }
}

impl Shards for Workers<'_> {
    fn ask(&mut self, query: Query) -> impl Future<Output = Answer> {
        std::future::ready(self.answer(query))
    }

    fn ask_beside<T>(&mut self, query: Query, work: impl FnOnce() -> T) -> impl Future<Output = (Answer, T)> {
        let sent = self.send(query);
        let done = work();
        std::future::ready((sent.unwrap_or_else(|| self.receive()), done))
    }
}

/// The learner's thread: holds the learner and runs each update to its
/// end, one question at a time. A panic inside an update is a failure of
/// that update, not of the worker.
fn run_updates(mut learner: SequentialLearner, line: Arc<Line>, jobs: Jobs<Job>, steps: Results<Step>) {
    while let Some(job) = jobs.next() {
        let arrivals = match job {
            Job::Begin { arrivals } => arrivals,
            Job::Refuse(why) => {
                let ended = Step::Ended {
                    learner: Box::new(learner.clone()),
                    outcome: Err(why),
                };
                if !steps.send(ended) {
                    return;
                }
                continue;
            }
            _ => continue, // an answer to an update that has already ended
        };
        let before = learner.clone();
        let mut workers = Workers {
            arrivals: Some(arrivals),
            jobs: &jobs,
            steps: &steps,
            line: &line,
            shards_hold_update: false,
            on_line: None,
            questions: 0,
            on_the_line: 0,
            waited: Duration::ZERO,
            asked_at: None,
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            // Every question is answered before `ask` returns: one poll runs the update through.
            let update = std::pin::pin!(learner.learn(&mut workers));
            match update.poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(outcome) => outcome.map_err(|e| e.to_string()),
                Poll::Pending => Err("the update waits without a question".into()),
            }
        }));
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(stop) => match stop.downcast::<Stop>() {
                Ok(stop) => match *stop {
                    Stop::Fails(why) => Err(why),
                    Stop::Abandoned => return,
                },
                Err(panic) => Err(format!("the update panicked: {}", panic_message(&*panic))),
            },
        };
        tracing::debug!(
            questions = workers.questions,
            on_the_line = workers.on_the_line,
            waiting = workers.waited.as_secs_f64(),
            "the update's questions to the workers"
        );
        if outcome.is_err() {
            learner = before;
        }
        let ended = Step::Ended {
            learner: Box::new(learner.clone()),
            outcome,
        };
        if !steps.send(ended) {
            return;
        }
    }
}

/// A worker's answer to the learner, or why it could not answer.
pub(super) type WorkerAnswer = Result<Answer, String>;

/// The workers' answers to one question as one: merged in worker order, so
/// that the sums do not depend on which worker answered first.
pub(super) fn merged_in_worker_order(mut answers: Vec<(usize, WorkerAnswer)>) -> WorkerAnswer {
    answers.sort_by_key(|a| a.0);
    answers.into_iter().try_fold(Answer::Nothing, |all, (worker, a)| {
        a.map(|a| all.merge(a)).map_err(|why| format!("worker {worker}: {why}"))
    })
}

/// The answers of one round, under the capability to reply.
type Answers = (Capability<Round>, Vec<(usize, WorkerAnswer)>);

/// One update in progress: the records it learns, the records it sheds,
/// and the round whose answers the learner's thread is working on.
struct Running {
    batch: UpdateBatch,
    shed: u64,
    waiting: Option<Capability<Round>>,
}

pub(super) fn reduce_stage<'scope>(
    answers: StreamVec<'scope, Round, (usize, WorkerAnswer)>,
    learner: SequentialLearner,
    options: GpOptions,
) -> StreamVec<'scope, Round, ReduceOutput> {
    let scope = answers.scope();
    let is_reducer = scope.index() == 0;
    let peers = scope.peers();
    answers.unary_frontier(
        Exchange::new(|_: &(usize, WorkerAnswer)| 0),
        "GpReduce",
        move |_, info| {
            // The learner lives on its thread, on the reducing worker only.
            let mut reducer = is_reducer.then(|| {
                let wake = scope.worker().sync_activator_for(info.address.to_vec());
                Reducer::new(learner, &options, peers, wake)
            });
            move |(input, frontier), output| {
                input.for_each_stamp(|cap, data| {
                    // Answers go to the reducing worker only.
                    let (Some(reducer), Some(cap)) = (reducer.as_mut(), cap.retain_least(output.output_index())) else {
                        return;
                    };
                    reducer.answered(cap, data.flat_map(|d| d.drain(..)));
                });
                if let Some(reducer) = reducer.as_mut() {
                    for (cap, out) in reducer.outputs(|round| !frontier.less_equal(round)) {
                        output.session(&cap).give(out);
                    }
                }
            }
        },
    )
}

/// The reducing worker's part: the learner's thread, the update it runs,
/// and the workers' answers not yet handed to it, by round.
struct Reducer {
    thread: Beside<Job, Step>,
    line: Arc<Line>,
    running: Option<Running>,
    stash: BTreeMap<Round, Answers>,
    max_epochs: usize,
    peers: usize,
    pace: Pace,
    /// Records shed by updates that kept none of their batch, and so were
    /// not run: the next update reports them.
    shed_unreported: u64,
}

impl Reducer {
    fn new(learner: SequentialLearner, options: &GpOptions, peers: usize, wake: SyncActivator) -> Self {
        let line = Line::open(peers);
        let on_thread = Arc::clone(&line);
        let placement = Placement {
            background: options.learn_in_background,
            core: None,
        };
        let thread = Beside::spawn("dualgp-learner".into(), placement, wake, move |jobs, steps| {
            run_updates(learner, on_thread, jobs, steps)
        });
        Reducer {
            thread,
            line,
            running: None,
            stash: BTreeMap::new(),
            max_epochs: options.max_epochs_per_update,
            peers,
            pace: Pace::new(match options.scoring {
                Scoring::OnArrival => options.max_staleness,
                Scoring::Prequential => None,
            }),
            shed_unreported: 0,
        }
    }

    /// Holds workers' answers of the round at `cap`.
    fn answered(&mut self, cap: Capability<Round>, answers: impl Iterator<Item = (usize, WorkerAnswer)>) {
        let entry = self.stash.entry(*cap.time()).or_insert_with(|| (cap, Vec::new()));
        entry.1.extend(answers);
    }

    /// What to send on (the learner's next question, or its update), each
    /// under its round's capability; hands the learner's thread every round
    /// that is `complete` meanwhile.
    fn outputs(&mut self, complete: impl Fn(&Round) -> bool) -> Vec<(Capability<Round>, ReduceOutput)> {
        let mut out = Vec::new();
        loop {
            match self.learner_moved() {
                Moved::Not => break,
                Moved::Sent(cap, sent) => {
                    out.push((cap, sent));
                    continue;
                }
                Moved::Idle => {}
            }
            let Some(entry) = self.stash.first_entry() else { break };
            if !complete(entry.key()) {
                break;
            }
            let (cap, answers) = entry.remove();
            self.hand_over(cap, answers);
        }
        out
    }

    /// Where the learner's thread stands: working, idle, or with something to send on.
    fn learner_moved(&mut self) -> Moved {
        let Some(run) = self.running.as_mut() else {
            return Moved::Idle;
        };
        let Some(cap) = run.waiting.take() else {
            return Moved::Idle;
        };
        let step = match self.thread.poll() {
            Polled::Ready(step) => step,
            Polled::Pending => {
                run.waiting = Some(cap);
                return Moved::Not;
            }
            // It catches every panic of an update, so this is a bug.
            Polled::Gone => panic!("the learner's thread stopped outside an update"),
        };
        match step {
            Step::Asks(query) => {
                let question = Question {
                    query: *query,
                    batch: run.batch,
                    line: self.line.id(),
                };
                Moved::Sent(cap, ReduceOutput::Query(Box::new(question)))
            }
            Step::Ended { learner, outcome } => {
                let (batch, shed) = (run.batch, run.shed);
                self.running = None;
                let update = ModelUpdate {
                    epoch: cap.time().0,
                    from_epoch: batch.from_epoch,
                    outcome,
                    learner: *learner,
                    sample: batch.sample,
                    shed,
                };
                Moved::Sent(cap, ReduceOutput::Update(Box::new(update)))
            }
        }
    }

    /// Hands the learner's thread a complete round: an update's first (its
    /// batch), or the answer to its last question.
    fn hand_over(&mut self, mut cap: Capability<Round>, mut answers: Vec<(usize, WorkerAnswer)>) {
        let from_epoch = cap.time().0;
        let begins = cap.time().1 == 0;
        if begins {
            // Epochs that every worker has handed over meanwhile are learned
            // with this one, at the last one's time. (The frontier cannot say
            // they are complete: this stage's own capabilities hold it back.)
            for _ in 1..self.max_epochs {
                let Some(next) = self.stash.first_entry() else { break };
                if next.key().1 != 0 || next.get().1.len() < self.peers {
                    break;
                }
                let (next_cap, more) = next.remove();
                answers.extend(more);
                cap = next_cap;
            }
        }
        // Worker order, then epoch order (the sort is stable).
        let mut merged = merged_in_worker_order(answers);
        let begun = begins.then(|| self.sample(&mut merged, from_epoch, cap.time().0));
        if begins && matches!(merged, Ok(Answer::Nothing)) {
            return; // no worker had a labelled record, or the sample kept none
        }
        let job = match (begins, merged) {
            (true, Ok(arrivals)) => Job::Begin { arrivals },
            (true, Err(why)) => Job::Refuse(why),
            (false, Ok(merged)) => Job::Answer(merged),
            // Its thread, waiting for this answer, ends the update with the reason.
            (false, Err(why)) => Job::Abort(why),
        };
        let run = match (begun, self.running.as_mut()) {
            (None, Some(run)) => run,
            (Some((batch, shed)), _) => self.running.insert(Running {
                batch,
                shed,
                waiting: None,
            }),
            (None, None) => unreachable!("answers arrive only to an update's questions"),
        };
        // Refused only by a thread that is gone, which the next poll reports.
        let _ = self.thread.send(job);
        run.waiting = Some(cap);
    }

    /// Picks the records an update of epochs `from_epoch..=to_epoch` learns
    /// and keeps only theirs of the batch's `arrivals`: the update's batch,
    /// and the records it sheds (with those of updates that kept none).
    fn sample(&mut self, arrivals: &mut WorkerAnswer, from_epoch: u64, to_epoch: u64) -> (UpdateBatch, u64) {
        let sample = self.pace.sample_for(to_epoch + 1 - from_epoch);
        let mut shed = std::mem::take(&mut self.shed_unreported);
        // The span stays: the epochs' time passed whatever the sample keeps.
        if let Ok(Answer::Arrivals(Arrivals { rows, .. })) = arrivals {
            let arrived = rows.len();
            rows.retain(|(point, _)| sample.keeps(point.id));
            shed += (arrived - rows.len()) as u64;
            if rows.is_empty() {
                *arrivals = Ok(Answer::Nothing);
                self.shed_unreported = shed;
            }
        }
        (UpdateBatch { from_epoch, sample }, shed)
    }
}

/// [`Reducer::learner_moved`]'s finding.
enum Moved {
    /// Still working on the round it was given.
    Not,
    /// Waiting for the next complete round.
    Idle,
    /// Its next question or its update, to send on under this capability.
    Sent(Capability<Round>, ReduceOutput),
}
