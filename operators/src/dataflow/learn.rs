//! The extension trait that puts a sequential GP learner into a stream.

use timely::dataflow::operators::vec::{Broadcast, Map};
use timely::dataflow::operators::{Concat, ConnectLoop, Enter, Feedback, Leave, OkErr};
use timely::dataflow::StreamVec;

use super::options::{GpOptions, Round};
use super::partition_stage::{partition_stage, Arrival, StageOutput, Start};
use super::record::{Prediction, Record, Rejected};
use super::reduce_stage::{reduce_stage, ModelUpdate, ReduceOutput};
use crate::model::{SequentialLearner, StreamingLearner};

/// The streams a learner produces, all timestamped by epoch.
pub struct GpStreams<'scope> {
    /// Every accepted record, scored as [`Scoring`](super::Scoring) says.
    pub predictions: StreamVec<'scope, u64, Prediction>,
    /// One per epoch with labelled records, from worker 0.
    pub updates: StreamVec<'scope, u64, ModelUpdate>,
    /// Records of the wrong dimension, with non-finite features or invalid labels.
    pub rejected: StreamVec<'scope, u64, Rejected>,
}

/// The learning operator, as methods on a stream of records.
pub trait LearnGp<'scope> {
    /// Scores each record, then learns from the labelled ones, one epoch at a
    /// time. `learner` is the starting state (fresh or a checkpoint), the same
    /// on every worker; records have `features` inputs.
    fn learn_gp(self, learner: SequentialLearner, features: usize) -> GpStreams<'scope>;

    /// [`learn_gp`](Self::learn_gp), and also learns from `late`: labelled
    /// records that were scored earlier, when their features came (see
    /// [`delayed_labels`](super::delayed_labels)).
    fn learn_gp_late(
        self,
        late: StreamVec<'scope, u64, Record>,
        learner: SequentialLearner,
        features: usize,
    ) -> GpStreams<'scope>;

    /// [`learn_gp`](Self::learn_gp), or with `late` labels
    /// [`learn_gp_late`](Self::learn_gp_late), with a choice of scoring (see [`GpOptions`]).
    fn learn_gp_with(
        self,
        late: Option<StreamVec<'scope, u64, Record>>,
        learner: SequentialLearner,
        options: GpOptions,
    ) -> GpStreams<'scope>;
}

impl<'scope> LearnGp<'scope> for StreamVec<'scope, u64, Record> {
    fn learn_gp(self, learner: SequentialLearner, features: usize) -> GpStreams<'scope> {
        self.learn_gp_with(None, learner, GpOptions::new(features))
    }

    fn learn_gp_late(
        self,
        late: StreamVec<'scope, u64, Record>,
        learner: SequentialLearner,
        features: usize,
    ) -> GpStreams<'scope> {
        self.learn_gp_with(Some(late), learner, GpOptions::new(features))
    }

    fn learn_gp_with(
        self,
        late: Option<StreamVec<'scope, u64, Record>>,
        learner: SequentialLearner,
        options: GpOptions,
    ) -> GpStreams<'scope> {
        let outer = self.scope();
        let scored = self.map(|record| Arrival { record, score: true });
        let late = late.unwrap_or_else(|| timely::dataflow::operators::generic::operator::empty(outer));
        let learned = late.map(|record| Arrival { record, score: false });
        let arrivals = scored.concat(learned);
        outer.scoped::<Round, _, _>("GpLearner", |inner| {
            let records = arrivals.enter(inner);
            let (next_round, queries) = inner.feedback((0, 1));
            let start = Start {
                initial: learner.snapshot(),
                prior: (learner.kernel().clone(), learner.likelihood.clone()),
                options,
            };
            let staged = partition_stage(records, queries.broadcast(), start);
            let (answers, others) = staged.ok_err::<Vec<_>, _, Vec<_>, _, _>(|out| match out {
                StageOutput::Answer { worker, answer } => Ok((worker, answer.map(|a| *a))),
                other => Err(other),
            });
            let (predictions, rejected) = others.ok_err::<Vec<_>, _, Vec<_>, _, _>(|out| match out {
                StageOutput::Prediction(p) => Ok(p),
                StageOutput::Rejected(r) => Err(r),
                StageOutput::Answer { .. } => unreachable!("split off above"),
            });
            let (queries, updates) =
                reduce_stage(answers, learner, options).ok_err::<Vec<_>, _, Vec<_>, _, _>(|out| match out {
                    ReduceOutput::Query(question) => Ok(*question),
                    ReduceOutput::Update(u) => Err(u),
                });
            queries.connect_loop(next_round);
            GpStreams {
                predictions: predictions.leave(outer),
                updates: updates.map(|u| *u).leave(outer),
                rejected: rejected.leave(outer),
            }
        })
    }
}
