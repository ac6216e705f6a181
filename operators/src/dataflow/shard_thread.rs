//! A worker's shard on a thread of its own: it builds the shard of the
//! records an update learns and answers the learner's questions from it,
//! so the worker's thread goes on scoring meanwhile.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use nalgebra::{DMatrix, DVector};

use super::beside::{Jobs, Results};
use super::health::panic_message;
use super::record::Record;
use super::reduce_stage::WorkerAnswer;
use crate::model::dual::point::PointId;
use crate::model::{Answer, Data, Likelihood, Partition, Query, Shard, Snapshot};

/// A query for the shard's thread, with the records (by epoch) of the shard
/// to answer from when an update begins: the thread builds the shard, so the
/// worker's own thread goes back to scoring at once.
pub(super) struct ShardJob {
    pub records: Option<BTreeMap<u64, Vec<Record>>>,
    pub query: Query,
    /// Where a question that came by the learner's [`Line`](super::direct::Line)
    /// is answered, and as which worker; others go back to the worker.
    pub reply: Option<(usize, Sender<(usize, WorkerAnswer)>)>,
}

/// What the shard's thread needs to build a shard of records.
pub(super) struct ShardMaker {
    pub partition: Partition,
    pub features: usize,
    pub likelihood: Likelihood,
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
pub(super) struct ShardDone {
    pub answer: Result<Answer, String>,
    pub finished: Option<Box<Snapshot>>,
}

impl ShardDone {
    pub fn failed(why: &str) -> Self {
        ShardDone {
            answer: Err(why.into()),
            finished: None,
        }
    }
}

/// The shard's thread: answers each query from the shard it holds, which
/// it drops once the workers have taken up the update's model.
pub(super) fn answer_jobs(maker: ShardMaker, jobs: Jobs<ShardJob>, done: Results<ShardDone>) {
    let mut shard: Option<Shard> = None;
    let (mut answers, mut busy) = (0, Duration::ZERO);
    while let Some(ShardJob { records, query, reply }) = jobs.next() {
        let started = Instant::now();
        if let Some(records) = records {
            (answers, busy) = (0, Duration::ZERO);
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
        (answers, busy) = (answers + 1, busy + started.elapsed());
        if let Some((worker, to)) = reply {
            // The learner may have given up on the update: nobody to tell then.
            let _ = to.send((worker, answer));
            continue;
        }
        if finished.is_some() {
            shard = None;
            tracing::debug!(
                shard = maker.partition.index,
                answers,
                busy = busy.as_secs_f64(),
                "the update's answers from this shard"
            );
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
    model.posterior.prepare_predictions();
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
