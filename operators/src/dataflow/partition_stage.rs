//! The partitioned stage: every worker scores its own records with the latest
//! model (score first, then learn) and answers the learner's queries for its
//! share of the batch and the memory, on a thread beside its own (see
//! [`beside`](super::beside)).

use std::collections::BTreeMap;

use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::StreamVec;
use timely::scheduling::SyncActivator;

use super::beside::{score_promptly, Beside, Placement, Polled};
use super::direct::Line;
use super::options::Round;
use super::options::{GpOptions, Scoring};
use super::record::{Prediction, Record, Rejected};
use super::reduce_stage::Question;
use super::repeats::{once_per_id, ArrivedIds};
use super::sample::UpdateBatch;
use super::shard_thread::{answer_jobs, ShardDone, ShardJob, ShardMaker};
use crate::model::data::span;
use crate::model::dual::blocks::route;
use crate::model::dual::point::PointId;
use crate::model::scoring::{ScoringModel, ToScore};
use crate::model::{Answer, Arrivals, Kernel, Likelihood, Partition, Snapshot};

/// What a worker sends on: its answer to the learner, a prediction, or a record it refused.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) enum StageOutput {
    /// An answer, or why this worker could not give it (the update then fails).
    Answer {
        worker: usize,
        answer: Result<Box<Answer>, String>,
    },
    Prediction(Prediction),
    Rejected(Rejected),
}

/// The newest model this worker holds, and the epoch whose update made it.
struct Scorer {
    model: ScoringModel,
    learned_through: Option<u64>,
    /// Whether predictions carry every output's predictive too.
    all_outputs: bool,
}

impl Scorer {
    /// Refuses the records that cannot be used and scores those that ask to
    /// be: what to send on, and the accepted records. `once` passes the
    /// valid records that ask to be scored and refuses repeated ids among them.
    fn check_and_score(
        &self,
        arrivals: Vec<Arrival>,
        epoch: u64,
        features: usize,
        likelihood: &Likelihood,
        once: impl FnOnce(Vec<Record>) -> (Vec<Record>, Vec<Rejected>),
    ) -> (Vec<StageOutput>, Vec<Record>) {
        let mut out = Vec::new();
        let (mut to_score, mut learn_only) = (Vec::new(), Vec::new());
        for Arrival { record, score } in arrivals {
            match check(&record, features, likelihood) {
                Ok(()) if score => to_score.push(record),
                Ok(()) => learn_only.push(record),
                Err(reason) => out.push(StageOutput::Rejected(Rejected { epoch, record, reason })),
            }
        }
        let (mut to_score, refused) = once(to_score);
        out.extend(refused.into_iter().map(StageOutput::Rejected));
        let inputs: Vec<ToScore> = (to_score.iter())
            .map(|r| ToScore {
                features: &r.features,
                output: r.output,
                label: r.label,
            })
            .collect();
        let scored = self.model.score(&inputs, features, self.all_outputs);
        let multi = matches!(likelihood, Likelihood::MultiOutput(_));
        for (record, (predictive, log_density, all_outputs)) in to_score.iter().zip(scored) {
            out.push(StageOutput::Prediction(Prediction {
                id: record.id,
                epoch,
                model_epoch: self.learned_through,
                predictive,
                log_density,
                output: multi.then_some(record.output),
                all_outputs,
            }));
        }
        to_score.extend(learn_only);
        (out, to_score)
    }
}

/// A record entering the operator: scored (and learned from if labelled), or
/// only learned from (a label that came after its features were scored).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Arrival {
    pub record: Record,
    pub score: bool,
}

/// Records of one epoch, held until they can be learned from (and, in
/// prequential scoring, scored).
struct Pending {
    capability: Capability<Round>,
    arrivals: Vec<Arrival>,
    /// Scoring on arrival: the ids scored so far in this epoch.
    ids: ArrivedIds,
}

/// How the stage starts: the model it scores with before any update, and how it scores.
pub(super) struct Start {
    pub initial: Option<Snapshot>,
    pub prior: (Kernel, Likelihood),
    pub options: GpOptions,
}

pub(super) fn partition_stage<'scope>(
    records: StreamVec<'scope, Round, Arrival>,
    queries: StreamVec<'scope, Round, Question>,
    start: Start,
) -> StreamVec<'scope, Round, StageOutput> {
    let scope = records.scope();
    let peers = scope.peers();
    let by_owner = Exchange::new(move |a: &Arrival| Partition::owner(route(a.record.id), peers) as u64);
    records.binary_frontier(queries, by_owner, Pipeline, "GpPartition", move |_, info| {
        let wake = scope.worker().sync_activator_for(info.address.to_vec());
        let partition = Partition {
            index: scope.index(),
            peers,
        };
        let mut stage = PartitionWorker::new(partition, start, wake);
        move |(records, record_frontier), (queries, query_frontier), output| {
            queries.for_each_stamp(|cap, data| {
                if let Some(cap) = cap.retain_least(output.output_index()) {
                    stage.asked(cap, data.flat_map(|d| d.drain(..)));
                }
            });
            for (cap, answer) in stage.answers() {
                output.session(&cap).give(answer);
            }
            records.for_each_stamp(|cap, data| {
                if let Some(cap) = cap.retain_least(output.output_index()) {
                    let out = stage.arrived(&cap, data.flat_map(|d| d.drain(..)).collect());
                    output.session(&cap).give_iterator(out.into_iter());
                }
            });
            let complete = |start: &Round| !record_frontier.less_equal(start);
            let update_before = |start: &Round| query_frontier.frontier().iter().any(|t| t < start);
            while let Some((cap, out)) = stage.hand_over(complete, update_before) {
                output.session(&cap).give_iterator(out.into_iter());
            }
        }
    })
}

/// One worker's part of the stage: the records it scores and holds until
/// they are learned, and the shard's thread that answers the learner.
struct PartitionWorker {
    worker: usize,
    features: usize,
    scoring: Scoring,
    likelihood: Likelihood,
    scorer: Scorer,
    /// Epochs not yet handed to the learner.
    pending: BTreeMap<u64, Pending>,
    /// The learner's questions not yet sent to the shard's thread, each
    /// with the records its update learns.
    asked: Vec<(Capability<Round>, Question)>,
    /// Labelled records handed to the learner and not yet learned, by epoch.
    ready: BTreeMap<u64, Vec<Record>>,
    /// The question the shard's thread is answering.
    answering: Option<Capability<Round>>,
    /// The epoch of the update whose shard that thread holds.
    shard_epoch: Option<u64>,
    /// Whether the shard's thread has joined the learner's line (see [`Line`]).
    joined: bool,
    shard_thread: Beside<ShardJob, ShardDone>,
}

impl PartitionWorker {
    fn new(partition: Partition, start: Start, wake: SyncActivator) -> Self {
        let Start {
            initial,
            prior: (kernel, likelihood),
            options,
        } = start;
        let worker = partition.index;
        // A background learner yields the cores anyway.
        if options.scoring == Scoring::OnArrival && !options.learn_in_background {
            score_promptly();
        }
        let maker = ShardMaker {
            partition,
            features: options.features,
            likelihood: likelihood.clone(),
        };
        let placement = Placement {
            background: options.learn_in_background,
            core: options.shards_on_own_cores.then_some(worker),
        };
        let shard_thread = Beside::spawn(format!("dualgp-shard-{worker}"), placement, wake, move |jobs, done| {
            answer_jobs(maker, jobs, done)
        });
        let model = match initial {
            Some(model) => ScoringModel::Learned(Box::new(model)),
            None => ScoringModel::Prior {
                kernel,
                likelihood: likelihood.clone(),
            },
        };
        PartitionWorker {
            worker,
            features: options.features,
            scoring: options.scoring,
            scorer: Scorer {
                model,
                learned_through: options.learned_through,
                // Only a multi-output model has other outputs to predict.
                all_outputs: options.predict_all_outputs && matches!(likelihood, Likelihood::MultiOutput(_)),
            },
            likelihood,
            pending: BTreeMap::new(),
            asked: Vec::new(),
            ready: BTreeMap::new(),
            answering: None,
            shard_epoch: None,
            joined: false,
            shard_thread,
        }
    }

    /// Takes the learner's questions of one round.
    fn asked(&mut self, cap: Capability<Round>, questions: impl Iterator<Item = Question>) {
        for question in questions {
            if !self.joined {
                Line::join(question.line, self.worker, self.shard_thread.sender());
                self.joined = true;
            }
            self.asked.push((cap.clone(), question));
        }
        // The learner asks one question at a time, so answering in time order is answering in turn.
        self.asked.sort_by(|a, b| a.0.time().cmp(b.0.time()));
    }

    /// The shard's answers that are in, each under its question's
    /// capability; sends the shard's thread the next question meanwhile.
    /// After an update's last question the new model scores from here on.
    fn answers(&mut self) -> Vec<(Capability<Round>, StageOutput)> {
        let mut out = Vec::new();
        loop {
            if let Some(cap) = self.answering.take() {
                let done = match self.shard_thread.poll() {
                    Polled::Ready(done) => done,
                    Polled::Pending => {
                        self.answering = Some(cap);
                        break;
                    }
                    Polled::Gone => ShardDone::failed("the shard's thread stopped"),
                };
                if let Some(model) = done.finished {
                    self.scorer.model = ScoringModel::Learned(model);
                    self.scorer.learned_through = Some(cap.time().0);
                    self.shard_epoch = None;
                }
                let answer = StageOutput::Answer {
                    worker: self.worker,
                    answer: done.answer.map(Box::new),
                };
                out.push((cap, answer));
            }
            if self.asked.is_empty() {
                break;
            }
            let (cap, Question { query, batch, .. }) = self.asked.remove(0);
            let epoch = cap.time().0;
            // An update runs at the time of the last epoch it learns.
            let records = (self.shard_epoch != Some(epoch)).then(|| self.take_ready(epoch, batch));
            self.shard_epoch = Some(epoch);
            // Refused only by a thread that is gone, which the next poll reports.
            let _ = self.shard_thread.send(ShardJob {
                records,
                query,
                reply: None,
            });
            self.answering = Some(cap);
        }
        out
    }

    /// The held records an update through `epoch` learns; those it does not
    /// learn are let go.
    fn take_ready(&mut self, epoch: u64, batch: UpdateBatch) -> BTreeMap<u64, Vec<Record>> {
        let rest = self.ready.split_off(&(epoch + 1));
        let mut learned = std::mem::replace(&mut self.ready, rest).split_off(&batch.from_epoch);
        for records in learned.values_mut() {
            records.retain(|r| batch.sample.keeps(r.id));
        }
        learned
    }

    /// Holds arriving records for their epoch; scoring on arrival, scores
    /// them now and returns the predictions and refusals.
    fn arrived(&mut self, cap: &Capability<Round>, arrivals: Vec<Arrival>) -> Vec<StageOutput> {
        let epoch = cap.time().0;
        let entry = self.pending.entry(epoch).or_insert_with(|| Pending {
            capability: cap.clone(),
            arrivals: Vec::new(),
            ids: ArrivedIds::default(),
        });
        if self.scoring == Scoring::Prequential {
            entry.arrivals.extend(arrivals);
            return Vec::new();
        }
        let ids = &mut entry.ids;
        let once = |records: Vec<Record>| {
            let (mut admitted, mut refused) = (Vec::new(), Vec::new());
            for record in records {
                match ids.admit(record, epoch) {
                    Ok(record) => admitted.push(record),
                    Err(rejected) => refused.push(rejected),
                }
            }
            (admitted, refused)
        };
        let (out, accepted) = (self.scorer).check_and_score(arrivals, epoch, self.features, &self.likelihood, once);
        let learn_only = accepted.into_iter().map(|record| Arrival { record, score: false });
        entry.arrivals.extend(learn_only);
        out
    }

    /// The first held epoch, handed to the learner once all its records are
    /// in (`complete`) and, prequential, no earlier update runs: prequential,
    /// its records scored now; every worker's answer to the update's first
    /// question, `Nothing` without labels, so the learner can tell when an
    /// epoch is complete.
    fn hand_over(
        &mut self,
        complete: impl Fn(&Round) -> bool,
        update_before: impl Fn(&Round) -> bool,
    ) -> Option<(Capability<Round>, Vec<StageOutput>)> {
        let entry = self.pending.first_entry()?;
        let start = (*entry.key(), 0);
        let wait = self.scoring == Scoring::Prequential && update_before(&start);
        if !complete(&start) || wait {
            return None;
        }
        let Pending {
            capability,
            arrivals,
            ids,
        } = entry.remove();
        let epoch = start.0;
        // Prequential: the whole epoch at once; on arrival: scored (and
        // repeats refused) already, only learned from here.
        let once = |records| match self.scoring {
            Scoring::Prequential => once_per_id(records, epoch),
            Scoring::OnArrival => (records, Vec::new()),
        };
        let (mut out, mut accepted) =
            (self.scorer).check_and_score(arrivals, epoch, self.features, &self.likelihood, once);
        accepted.retain(|r| ids.learnable(r));
        let labelled: Vec<Record> = accepted.into_iter().filter(|r| r.label.is_some()).collect();
        let answer = match labelled.is_empty() {
            true => Answer::Nothing,
            false => {
                let arrivals = self.arrivals(epoch, &labelled);
                self.ready.insert(epoch, labelled);
                arrivals
            }
        };
        out.push(StageOutput::Answer {
            worker: self.worker,
            answer: Ok(Box::new(answer)),
        });
        Some((capability, out))
    }

    /// The learner's first question, answered as a shard of these records
    /// would: their inputs in id order (a multi-output model's with the output index).
    fn arrivals(&self, epoch: u64, labelled: &[Record]) -> Answer {
        let with_output = self.likelihood.reads_output_index();
        let mut rows: Vec<(PointId, Vec<f64>)> = labelled
            .iter()
            .map(|r| {
                let mut inputs = r.features.clone();
                if with_output {
                    inputs.push(r.output as f64);
                }
                (PointId { batch: epoch, id: r.id }, inputs)
            })
            .collect();
        rows.sort_unstable_by_key(|row| row.0);
        Answer::Arrivals(Arrivals {
            rows,
            time_span: span(labelled.iter().filter_map(|r| r.time)),
        })
    }
}

/// Why a record cannot be scored or learned from, if it cannot.
fn check(record: &Record, features: usize, likelihood: &Likelihood) -> Result<(), String> {
    if record.features.len() != features {
        return Err(format!(
            "{} features where the model has {features}",
            record.features.len()
        ));
    }
    if let Some(j) = record.features.iter().position(|v| !v.is_finite()) {
        return Err(format!("feature {j} is {}", record.features[j]));
    }
    if let Some(t) = record.time.filter(|t| !t.is_finite()) {
        return Err(format!("its time is {t}"));
    }
    let d = record.output;
    if d >= likelihood.n_outputs() {
        return Err(format!(
            "output {d} is outside 0..{n} (the model has {n} outputs, one per --likelihood entry)",
            n = likelihood.n_outputs()
        ));
    }
    match record.label {
        Some(y) => likelihood.check_label_of(0, d, y).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of an output the model lacks, or with a label outside its
    /// output's likelihood, is refused with the reason (a dead letter).
    #[test]
    fn a_record_of_an_output_the_model_lacks_is_refused_with_the_reason() {
        let lik = Likelihood::parse_outputs("gaussian,bernoulli", None).unwrap();
        let record = |output: usize, y: f64| Record::new(1, vec![0.5], Some(y)).with_output(output);
        assert_eq!(check(&record(1, 1.0), 1, &lik), Ok(()));
        assert_eq!(check(&record(0, 0.3), 1, &lik), Ok(()));
        let beyond = check(&record(2, 1.0), 1, &lik).unwrap_err();
        assert!(beyond.contains("output 2 is outside 0..2"), "{beyond}");
        let label = check(&record(1, 0.3), 1, &lik).unwrap_err();
        assert!(label.contains("0.3"), "{label}");
        let single = Likelihood::Gaussian { variance: 1.0 };
        assert!(check(&record(1, 0.3), 1, &single).is_err());
        let untimely = check(&record(0, 0.3).at_time(f64::NAN), 1, &lik).unwrap_err();
        assert!(untimely.contains("time is NaN"), "{untimely}");
    }
}
