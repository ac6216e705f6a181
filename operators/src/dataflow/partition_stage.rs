//! The partitioned stage: every worker scores its own records with the latest
//! model (score first, then learn) and answers the learner's queries for its
//! share of the batch and the memory.

use std::collections::BTreeMap;

use nalgebra::{DMatrix, DVector};
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::StreamVec;

use super::learn::Round;
use super::record::{Prediction, Record, Rejected};
use super::{GpOptions, Scoring};
use crate::model::dual::point::PointId;
use crate::model::{Answer, Data, Kernel, Likelihood, Partition, Predictive, Query, Shard, Snapshot};

/// What a worker sends on: its answer to the learner, a prediction, or a record it refused.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) enum StageOutput {
    Answer { worker: usize, answer: Box<Answer> },
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
}

impl Scorer {
    /// Each record's predictive distribution and, when it has a label, that
    /// label's log predictive density (its prequential score).
    fn score(&self, records: &[&Record], features: usize) -> Vec<(Predictive, Option<f64>)> {
        let x = DMatrix::from_fn(records.len(), features, |i, j| records[i].features[j]);
        let scored = |likelihood: &Likelihood, i: usize, mean: &[f64], var: &[f64]| {
            let density = records[i].label.map(|y| likelihood.log_predictive(mean, var, y));
            (likelihood.predict(mean, var), density)
        };
        let mut out = Vec::with_capacity(records.len());
        match &self.model {
            Model::Learned(model) => model
                .posterior
                .predict_f(&x)
                .for_each_point(|i, mean, var| out.push(scored(&model.likelihood, i, mean, var))),
            Model::Prior { kernel, likelihood } => {
                let mean = vec![0.0; likelihood.n_latent()];
                for (i, &v) in kernel.diag(&x).iter().enumerate() {
                    out.push(scored(likelihood, i, &mean, &vec![v; mean.len()]));
                }
            }
        }
        out
    }

    /// Refuses the records that cannot be used and scores those that ask to
    /// be: what to send on, and the accepted records.
    fn check_and_score(
        &self,
        arrivals: Vec<Arrival>,
        epoch: u64,
        features: usize,
        likelihood: &Likelihood,
    ) -> (Vec<StageOutput>, Vec<Record>) {
        let mut out = Vec::new();
        let mut accepted = Vec::with_capacity(arrivals.len());
        for Arrival { record, score } in arrivals {
            match check(&record, features, likelihood) {
                Ok(()) => accepted.push((record, score)),
                Err(reason) => out.push(StageOutput::Rejected(Rejected { epoch, record, reason })),
            }
        }
        let scored: Vec<&Record> = accepted.iter().filter(|a| a.1).map(|a| &a.0).collect();
        for (record, (predictive, log_density)) in scored.iter().zip(self.score(&scored, features)) {
            out.push(StageOutput::Prediction(Prediction {
                id: record.id,
                epoch,
                model_epoch: self.learned_through,
                predictive,
                log_density,
            }));
        }
        (out, accepted.into_iter().map(|a| a.0).collect())
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
        ..
    } = options;
    let by_owner = Exchange::new(|a: &Arrival| crate::model::dual::shard::route(a.record.id));
    records.binary_frontier(queries, by_owner, Pipeline, "GpPartition", move |_, _| {
        let likelihood = prior.1.clone();
        let model = match initial {
            Some(model) => Model::Learned(Box::new(model)),
            None => Model::Prior {
                kernel: prior.0,
                likelihood: prior.1,
            },
        };
        let mut scorer = Scorer { model, learned_through };
        let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
        let mut asked: Vec<(Capability<Round>, Vec<Query>)> = Vec::new();
        // Labelled records handed to the learner and not yet learned, by epoch.
        let mut ready: BTreeMap<u64, Vec<Record>> = BTreeMap::new();
        let mut shard: Option<(u64, Shard)> = None;

        move |(records, record_frontier), (queries, query_frontier), output| {
            queries.for_each_stamp(|cap, data| {
                if let Some(cap) = cap.retain_least(output.output_index()) {
                    asked.push((cap, data.flat_map(|d| d.drain(..)).collect()));
                }
            });

            // The learner asks one question at a time, so answering in time order is answering in turn.
            asked.sort_by(|a, b| a.0.time().cmp(b.0.time()));
            for (cap, batch) in asked.drain(..) {
                let epoch = cap.time().0;
                let mut session = output.session(&cap);
                for query in batch {
                    if shard.as_ref().is_none_or(|s| s.0 != epoch) {
                        // An update runs at the time of the last epoch it learns.
                        let rest = ready.split_off(&(epoch + 1));
                        let learned = std::mem::replace(&mut ready, rest);
                        shard = Some((epoch, shard_of(partition, learned, features)));
                    }
                    let finished = match &query {
                        Query::Finish { model, .. } => {
                            let mut model = model.clone();
                            model
                                .ensure_factors()
                                .expect("the learner factorised this posterior before sending it");
                            Some(model)
                        }
                        _ => None,
                    };
                    let answer = shard.as_mut().expect("made above").1.answer(query);
                    session.give(StageOutput::Answer {
                        worker,
                        answer: Box::new(answer),
                    });
                    if let Some(model) = finished {
                        scorer = Scorer {
                            model: Model::Learned(Box::new(model)),
                            learned_through: Some(epoch),
                        };
                        shard = None;
                    }
                }
            }

            records.for_each_stamp(|cap, data| {
                let Some(cap) = cap.retain_least(output.output_index()) else {
                    return;
                };
                let epoch = cap.time().0;
                let mut arrivals: Vec<Arrival> = data.flat_map(|d| d.drain(..)).collect();
                if scoring == Scoring::OnArrival {
                    let (out, accepted) = scorer.check_and_score(arrivals, epoch, features, &likelihood);
                    output.session(&cap).give_iterator(out.into_iter());
                    arrivals = accepted
                        .into_iter()
                        .map(|record| Arrival { record, score: false })
                        .collect();
                }
                let entry = pending.entry(epoch).or_insert_with(|| Pending {
                    capability: cap,
                    arrivals: Vec::new(),
                });
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
                let Pending { capability, arrivals } = entry.remove();
                let epoch = start.0;
                let (out, accepted) = scorer.check_and_score(arrivals, epoch, features, &likelihood);
                let mut session = output.session(&capability);
                session.give_iterator(out.into_iter());
                // Every worker answers for every epoch (`Nothing` without
                // labels), so the learner can tell when an epoch is complete.
                let labelled: Vec<Record> = accepted.into_iter().filter(|r| r.label.is_some()).collect();
                let answer = if labelled.is_empty() {
                    Answer::Nothing
                } else {
                    // The learner's first question, answered as a shard of
                    // these records would: their inputs in id order.
                    let mut rows: Vec<(PointId, Vec<f64>)> = labelled
                        .iter()
                        .map(|r| (PointId { batch: epoch, id: r.id }, r.features.clone()))
                        .collect();
                    rows.sort_unstable_by_key(|row| row.0);
                    ready.insert(epoch, labelled);
                    Answer::Arrivals(rows)
                };
                session.give(StageOutput::Answer {
                    worker,
                    answer: Box::new(answer),
                });
            }
        }
    })
}

/// A shard of the labelled records of some epochs, each keeping its epoch as
/// its batch.
fn shard_of(partition: Partition, epochs: BTreeMap<u64, Vec<Record>>, features: usize) -> Shard {
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
    let x = DMatrix::from_fn(records.len(), features, |i, j| records[i].1.features[j]);
    let y = DVector::from_iterator(records.len(), records.iter().map(|(_, r)| r.label.unwrap_or(0.0)));
    let data = Data::new(x, y).expect("checked on arrival");
    Shard::of_points(partition, &ids, data)
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
    match record.label {
        Some(y) => likelihood.check_label(0, y).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}
