//! The partitioned stage: every worker scores its own records with the latest
//! model (score first, then learn) and answers the learner's queries for its
//! share of the batch and the memory, on a thread beside its own (see
//! [`beside`](super::beside)).

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use nalgebra::{DMatrix, DVector};
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::StreamVec;

use super::beside::{score_promptly, Beside, Jobs, Polled, Results};
use super::health::panic_message;
use super::options::Round;
use super::options::{GpOptions, Scoring};
use super::record::{Prediction, Record, Rejected};
use super::repeats::{once_per_id, ArrivedIds};
use crate::model::data::model_inputs;
use crate::model::dual::blocks::route;
use crate::model::dual::point::PointId;
use crate::model::posterior::Marginals;
use crate::model::{Answer, Data, Kernel, Likelihood, Partition, Predictive, Query, Shard, Snapshot};

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

/// The model records are scored with: the prior until the first update.
enum Model {
    Prior { kernel: Kernel, likelihood: Likelihood },
    Learned(Box<Snapshot>),
}

/// The newest model this worker holds, and the epoch whose update made it.
struct Scorer {
    model: Model,
    learned_through: Option<u64>,
    /// Whether predictions carry every output's predictive too.
    all_outputs: bool,
}

/// One record's score: its output's predictive, its label's log density, and
/// (when asked for) every output's predictive.
type Scored = (Predictive, Option<f64>, Vec<Predictive>);

impl Scorer {
    /// Each record's predictive distribution and, when it has a label, that
    /// label's log predictive density (its prequential score).
    fn score(&self, records: &[&Record], features: usize) -> Vec<Scored> {
        let x = DMatrix::from_fn(records.len(), features, |i, j| records[i].features[j]);
        let likelihood = self.likelihood();
        // Every output's predictive needs each output's own latent marginal.
        let mut every: Vec<Vec<Predictive>> = vec![Vec::new(); records.len()];
        if self.all_outputs {
            for o in 0..likelihood.n_outputs() {
                self.marginals(&x, |_| o)
                    .for_each_point(|i, mean, var| every[i].push(likelihood.predict_of(o, mean, var)));
            }
        }
        let mut out = Vec::with_capacity(records.len());
        self.marginals(&x, |i| records[i].output)
            .for_each_point(|i, mean, var| {
                let d = records[i].output;
                let density = records[i].label.map(|y| likelihood.log_predictive_of(d, mean, var, y));
                out.push((
                    likelihood.predict_of(d, mean, var),
                    density,
                    std::mem::take(&mut every[i]),
                ));
            });
        out
    }

    fn likelihood(&self) -> &Likelihood {
        match &self.model {
            Model::Learned(model) => &model.likelihood,
            Model::Prior { likelihood, .. } => likelihood,
        }
    }

    /// The latent marginals at the rows of `x`, row `i` as output `output(i)`
    /// (a multi-output model reads the index as its last input).
    fn marginals(&self, x: &DMatrix<f64>, output: impl Fn(usize) -> usize) -> Marginals {
        let likelihood = self.likelihood();
        let x = model_inputs(likelihood, x, output);
        match &self.model {
            Model::Learned(model) => model.posterior.predict_f(&x),
            Model::Prior { kernel, .. } => {
                let prior = kernel.diag(&x);
                let q = likelihood.n_latent();
                Marginals {
                    mean: DMatrix::zeros(x.nrows(), q),
                    var: DMatrix::from_fn(x.nrows(), q, |i, _| prior[i]),
                }
            }
        }
    }

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
        let scored: Vec<&Record> = to_score.iter().collect();
        let multi = matches!(likelihood, Likelihood::MultiOutput(_));
        for (record, (predictive, log_density, all_outputs)) in scored.iter().zip(self.score(&scored, features)) {
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
    queries: StreamVec<'scope, Round, Query>,
    start: Start,
) -> StreamVec<'scope, Round, StageOutput> {
    let scope = records.scope();
    let worker = scope.index();
    let partition = Partition {
        index: worker,
        peers: scope.peers(),
    };
    let Start {
        initial,
        prior,
        options,
    } = start;
    let GpOptions {
        features,
        scoring,
        learned_through,
        predict_all_outputs,
        learn_in_background,
        ..
    } = options;
    let peers = scope.peers();
    let by_owner = Exchange::new(move |a: &Arrival| Partition::owner(route(a.record.id), peers) as u64);
    records.binary_frontier(queries, by_owner, Pipeline, "GpPartition", move |_, info| {
        let likelihood = prior.1.clone();
        let model = match initial {
            Some(model) => Model::Learned(Box::new(model)),
            None => Model::Prior {
                kernel: prior.0,
                likelihood: prior.1,
            },
        };
        // Only a multi-output model has other outputs to predict.
        let all_outputs = predict_all_outputs && matches!(likelihood, Likelihood::MultiOutput(_));
        let mut scorer = Scorer {
            model,
            learned_through,
            all_outputs,
        };
        let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
        let mut asked: Vec<(Capability<Round>, Query)> = Vec::new();
        // Labelled records handed to the learner and not yet learned, by epoch.
        let mut ready: BTreeMap<u64, Vec<Record>> = BTreeMap::new();
        // The query the shard's thread is answering, and the epoch of the shard it holds.
        let mut answering: Option<Capability<Round>> = None;
        let mut shard_epoch: Option<u64> = None;
        // A background learner yields the cores anyway.
        if scoring == Scoring::OnArrival && !learn_in_background {
            score_promptly();
        }
        let wake = scope.worker().sync_activator_for(info.address.to_vec());
        let maker = ShardMaker {
            partition,
            features,
            likelihood: likelihood.clone(),
        };
        let shard_thread = Beside::spawn(
            format!("dualgp-shard-{worker}"),
            learn_in_background,
            wake,
            move |jobs, done| answer_jobs(maker, jobs, done),
        );

        move |(records, record_frontier), (queries, query_frontier), output| {
            queries.for_each_stamp(|cap, data| {
                if let Some(cap) = cap.retain_least(output.output_index()) {
                    asked.extend(data.flat_map(|d| d.drain(..)).map(|q| (cap.clone(), q)));
                }
            });
            // The learner asks one question at a time, so answering in time order is answering in turn.
            asked.sort_by(|a, b| a.0.time().cmp(b.0.time()));
            loop {
                if let Some(cap) = &answering {
                    let done = match shard_thread.poll() {
                        Polled::Ready(done) => done,
                        Polled::Pending => break,
                        Polled::Gone => ShardDone::failed("the shard's thread stopped"),
                    };
                    output.session(cap).give(StageOutput::Answer {
                        worker,
                        answer: done.answer.map(Box::new),
                    });
                    if let Some(model) = done.finished {
                        scorer = Scorer {
                            model: Model::Learned(model),
                            learned_through: Some(cap.time().0),
                            all_outputs,
                        };
                        shard_epoch = None;
                    }
                    answering = None;
                }
                if asked.is_empty() {
                    break;
                }
                let (cap, query) = asked.remove(0);
                let epoch = cap.time().0;
                // An update runs at the time of the last epoch it learns.
                let records = (shard_epoch != Some(epoch)).then(|| {
                    let rest = ready.split_off(&(epoch + 1));
                    std::mem::replace(&mut ready, rest)
                });
                shard_epoch = Some(epoch);
                // Refused only by a thread that is gone, which the next poll reports.
                let _ = shard_thread.send(ShardJob { records, query });
                answering = Some(cap);
            }

            records.for_each_stamp(|cap, data| {
                let Some(cap) = cap.retain_least(output.output_index()) else {
                    return;
                };
                let epoch = cap.time().0;
                let mut arrivals: Vec<Arrival> = data.flat_map(|d| d.drain(..)).collect();
                let entry = pending.entry(epoch).or_insert_with(|| Pending {
                    capability: cap.clone(),
                    arrivals: Vec::new(),
                    ids: ArrivedIds::default(),
                });
                if scoring == Scoring::OnArrival {
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
                    let (out, accepted) = scorer.check_and_score(arrivals, epoch, features, &likelihood, once);
                    output.session(&cap).give_iterator(out.into_iter());
                    arrivals = accepted
                        .into_iter()
                        .map(|record| Arrival { record, score: false })
                        .collect();
                }
                entry.arrivals.extend(arrivals);
            });

            // Hand an epoch to the learner (prequential: score it first) once
            // all its records are in and, prequential, every earlier update is done.
            while let Some(entry) = pending.first_entry() {
                let start = (*entry.key(), 0);
                let earlier_update_running = query_frontier.frontier().iter().any(|t| *t < start);
                let wait = scoring == Scoring::Prequential && earlier_update_running;
                if record_frontier.less_equal(&start) || wait {
                    break;
                }
                let Pending {
                    capability,
                    arrivals,
                    ids,
                } = entry.remove();
                let epoch = start.0;
                // Prequential: the whole epoch at once; on arrival: scored
                // (and repeats refused) already, only learned from here.
                let once = |records| match scoring {
                    Scoring::Prequential => once_per_id(records, epoch),
                    Scoring::OnArrival => (records, Vec::new()),
                };
                let (out, mut accepted) = scorer.check_and_score(arrivals, epoch, features, &likelihood, once);
                accepted.retain(|r| ids.learnable(r));
                let mut session = output.session(&capability);
                session.give_iterator(out.into_iter());
                // Every worker answers for every epoch (`Nothing` without
                // labels), so the learner can tell when an epoch is complete.
                let labelled: Vec<Record> = accepted.into_iter().filter(|r| r.label.is_some()).collect();
                let answer = if labelled.is_empty() {
                    Answer::Nothing
                } else {
                    // The learner's first question, answered as a shard of
                    // these records would: their inputs in id order (a
                    // multi-output model's with the output index).
                    let with_output = likelihood.reads_output_index();
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
                    ready.insert(epoch, labelled);
                    Answer::Arrivals(rows)
                };
                session.give(StageOutput::Answer {
                    worker,
                    answer: Ok(Box::new(answer)),
                });
            }
        }
    })
}

/// A query for the shard's thread, with the records (by epoch) of the shard
/// to answer from when an update begins: the thread builds the shard, so the
/// worker's own thread goes back to scoring at once.
struct ShardJob {
    records: Option<BTreeMap<u64, Vec<Record>>>,
    query: Query,
}

/// What the shard's thread needs to build a shard of records.
struct ShardMaker {
    partition: Partition,
    features: usize,
    likelihood: Likelihood,
}

impl ShardMaker {
    /// A shard of the labelled records of some epochs, each keeping its epoch as its batch.
    fn shard_of(&self, epochs: BTreeMap<u64, Vec<Record>>) -> Shard {
        let records: Vec<(u64, Record)> = epochs
            .into_iter()
            .flat_map(|(epoch, records)| records.into_iter().map(move |r| (epoch, r)))
            .collect();
        let ids: Vec<PointId> = records
            .iter()
            .map(|(batch, r)| PointId {
                batch: *batch,
                id: r.id,
            })
            .collect();
        let x = DMatrix::from_fn(records.len(), self.features, |i, j| records[i].1.features[j]);
        let y = DVector::from_iterator(records.len(), records.iter().map(|(_, r)| r.label.unwrap_or(0.0)));
        let outputs = records.iter().map(|(_, r)| r.output).collect();
        let data = Data::for_model(&self.likelihood, x, y, outputs).expect("checked on arrival");
        Shard::of_points(self.partition, &ids, data)
    }
}

/// The shard's answer, and after a Finish the new model, factorised for scoring.
struct ShardDone {
    answer: Result<Answer, String>,
    finished: Option<Box<Snapshot>>,
}

impl ShardDone {
    fn failed(why: &str) -> Self {
        ShardDone {
            answer: Err(why.into()),
            finished: None,
        }
    }
}

/// The shard's thread: answers each query from the shard it holds, which
/// it drops once the workers have taken up the update's model.
fn answer_jobs(maker: ShardMaker, jobs: Jobs<ShardJob>, done: Results<ShardDone>) {
    let mut shard: Option<Shard> = None;
    while let Some(ShardJob { records, query }) = jobs.next() {
        if let Some(records) = records {
            // Without a shard every answer of this update is its failure.
            shard = catch_unwind(AssertUnwindSafe(|| maker.shard_of(records))).ok();
        }
        let finished = match &query {
            Query::Finish { model, .. } => Some(usable(model)),
            _ => None,
        };
        let mut answer = answer_caught(&mut shard, query);
        let finished = match finished {
            Some(Err(why)) => {
                answer = answer.and(Err(why));
                None
            }
            Some(Ok(model)) if answer.is_ok() => Some(Box::new(model)),
            _ => None,
        };
        if finished.is_some() {
            shard = None;
        }
        if !done.send(ShardDone { answer, finished }) {
            return;
        }
    }
}

/// The new model of a Finish query, factorised for scoring, or why it cannot be.
fn usable(model: &Snapshot) -> Result<Snapshot, String> {
    let mut model = model.clone();
    model
        .ensure_factors()
        .map_err(|e| format!("cannot take up the new model: {e}"))?;
    Ok(model)
}

/// The shard's answer to `query`; a panic while answering is this update's
/// failure (the shard, left half-changed, is dropped), not this worker's.
fn answer_caught(shard: &mut Option<Shard>, query: Query) -> Result<Answer, String> {
    let Some(held) = shard.as_mut() else {
        return Err("no records held for this update".into());
    };
    match catch_unwind(AssertUnwindSafe(|| held.answer(query))) {
        Ok(answer) => Ok(answer),
        Err(panic) => {
            *shard = None;
            Err(format!("answering panicked: {}", panic_message(&*panic)))
        }
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
    }
}
