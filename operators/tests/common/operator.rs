//! Runs the timely operator over epochs of records and gathers what it sends out.

use std::sync::{Arc, Mutex};

use dualgp_operators::dataflow::{GpOptions, LearnGp, ModelUpdate, Prediction, Record, Rejected};
use dualgp_operators::model::SequentialLearner;
use serde::{Deserialize, Serialize};
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle};

/// What the operator sent out on this process's workers.
#[derive(Default, Serialize, Deserialize)]
pub struct Outputs {
    pub predictions: Vec<Prediction>,
    pub updates: Vec<ModelUpdate>,
    pub rejected: Vec<Rejected>,
}

/// How each epoch's records reach the operator.
#[derive(Clone, Copy)]
pub enum Feed {
    /// Worker 0 sends them all, every epoch at once.
    WorkerZero,
    /// Worker `i` sends every `peers`-th record from the `i`-th (of the epoch
    /// reversed, if asked), and an epoch's outputs are out before the next
    /// epoch is sent.
    Shared { reverse: bool },
}

/// The operator on `config`'s workers from `learner`, epoch `i` at time `i`;
/// updates in epoch order.
pub fn run_operator(
    config: timely::Config,
    epochs: &[Vec<Record>],
    learner: SequentialLearner,
    options: GpOptions,
    feed: Feed,
) -> Outputs {
    let outputs = Arc::new(Mutex::new(Outputs::default()));
    let (epochs, out) = (epochs.to_vec(), Arc::clone(&outputs));
    timely::execute(config, move |worker| {
        let (index, peers) = (worker.index(), worker.peers());
        let mut input = InputHandleVec::new();
        let probe = ProbeHandle::new();
        let (o1, o2, o3) = (Arc::clone(&out), Arc::clone(&out), Arc::clone(&out));
        worker.dataflow::<u64, _, _>(|scope| {
            let gp = scope
                .input_from(&mut input)
                .learn_gp_with(None, learner.clone(), options);
            gp.predictions
                .inspect(move |p| o1.lock().unwrap().predictions.push(p.clone()))
                .probe_with(&probe);
            gp.updates
                .inspect(move |u| o2.lock().unwrap().updates.push(u.clone()))
                .probe_with(&probe);
            gp.rejected
                .inspect(move |r| o3.lock().unwrap().rejected.push(r.clone()))
                .probe_with(&probe);
        });
        for (epoch, records) in epochs.iter().enumerate() {
            match feed {
                Feed::WorkerZero if index == 0 => records.iter().for_each(|r| input.send(r.clone())),
                Feed::WorkerZero => {}
                Feed::Shared { reverse } => {
                    let mut all: Vec<&Record> = records.iter().collect();
                    if reverse {
                        all.reverse();
                    }
                    all.into_iter()
                        .skip(index)
                        .step_by(peers)
                        .for_each(|r| input.send(r.clone()));
                }
            }
            input.advance_to(epoch as u64 + 1);
            if matches!(feed, Feed::Shared { .. }) {
                while probe.less_than(input.time()) {
                    worker.step();
                }
            }
        }
        drop(input);
        while worker.step() {}
    })
    .expect("no worker fails");
    let mut outputs = Arc::try_unwrap(outputs)
        .ok()
        .expect("workers done")
        .into_inner()
        .unwrap();
    outputs.updates.sort_by_key(|u| u.epoch);
    outputs
}
