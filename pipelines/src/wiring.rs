//! The wiring `replay` and `serve` share: source → learner → sinks (and the
//! checkpoint writer). On every worker, records go into the learner an epoch
//! at a time, the learner's streams go to the sinks, and reading stays at
//! most `epochs_in_flight` epochs ahead of what the sinks have taken. What
//! differs is each command's [`Ends`]: `replay` reads a Parquet file's row
//! groups and gathers what it writes at worker 0; `serve` reads a Kafka
//! topic's partitions, sends to Kafka and commits what is checkpointed.

use std::time::Duration;

use anyhow::Result;
use dualgp_operators::dataflow::{GpOptions, GpStreams, LearnGp, Record};
use dualgp_operators::model::data::model_inputs;
use dualgp_operators::model::{Likelihood, SequentialLearner};
use nalgebra::DMatrix;
use timely::dataflow::operators::Input;
use timely::dataflow::{InputHandleVec, ProbeHandle, Scope};
use timely::worker::Worker;

use crate::model_args::Settings;
use crate::protocol::Standardizer;

/// What every worker starts from.
#[derive(Clone)]
pub(crate) struct Start {
    pub learner: SequentialLearner,
    pub options: GpOptions,
    /// Epochs read ahead of the sinks at most, and so the most one update learns.
    pub epochs_in_flight: u64,
}

impl Start {
    /// The operator's options: one update learns every epoch in flight.
    fn gp_options(&self) -> GpOptions {
        GpOptions {
            max_epochs_per_update: usize::try_from(self.epochs_in_flight).unwrap_or(usize::MAX),
            ..self.options
        }
    }
}

/// Whether a process of `workers` workers keeps each worker's shard thread
/// to a core of its own ([`GpOptions::shards_on_own_cores`]): two or more
/// workers, no more than the cores it may use.
pub(crate) fn shards_on_own_cores(workers: usize) -> bool {
    workers >= 2 && std::thread::available_parallelism().is_ok_and(|cores| workers <= cores.get())
}

/// A command's own ends of the pipeline on one worker: where its records
/// come from and where the learner's streams go.
pub(crate) trait Ends {
    /// How long a worker parks before it settles again (`None`: until there is news).
    const PARK: Option<Duration>;

    /// How long to park now: [`PARK`](Self::PARK) unless what the ends
    /// wait for wakes nobody.
    fn park(&self) -> Option<Duration> {
        Self::PARK
    }

    /// Connects the learner's streams to the sinks; an epoch passes `probe`
    /// once the sinks have taken all of it.
    fn wire<'scope>(&mut self, scope: Scope<'scope, u64>, gp: GpStreams<'scope>, probe: &ProbeHandle<u64>);

    /// Sends the next epoch's records (standardised) into `records` at that
    /// epoch and returns it; `None` once the input ends or reading stops (a
    /// stop asked for, or an error the ends keep).
    fn read(&mut self, worker: &mut Worker, records: &mut InputHandleVec<u64, Record>) -> Option<u64>;

    /// After a step: writes or delivers what `probe` has let through.
    /// `reading_done`: no more epochs come.
    fn settle(&mut self, probe: &ProbeHandle<u64>, reading_done: bool);

    /// Whether reading is to stop (asked to, failed, or the cluster idle):
    /// a worker waiting for the learner to catch up stops waiting then.
    fn stopping(&self) -> bool {
        false
    }

    /// The records' input is closed: ends the command's own inputs.
    fn close(&mut self, worker: &mut Worker, probe: &ProbeHandle<u64>);
}

/// One worker's pipeline: builds the dataflow, feeds it epoch by epoch,
/// then drains it.
pub(crate) fn run_worker<E: Ends>(worker: &mut Worker, start: &Start, ends: &mut E) {
    let mut records = InputHandleVec::new();
    let probe = ProbeHandle::new();
    worker.dataflow::<u64, _, _>(|scope| {
        let gp = scope
            .input_from(&mut records)
            .learn_gp_with(None, start.learner.clone(), start.gp_options());
        ends.wire(scope, gp, &probe);
    });
    while let Some(epoch) = ends.read(worker, &mut records) {
        records.advance_to(epoch + 1);
        while probe.less_than(&(epoch + 1).saturating_sub(start.epochs_in_flight)) && !ends.stopping() {
            worker.step_or_park(ends.park());
            ends.settle(&probe, false);
        }
        // One more step: the epoch starts on its way before the next read,
        // which may wait for input.
        worker.step();
        ends.settle(&probe, false);
    }
    drop(records);
    ends.close(worker, &probe);
    while worker.step_or_park(ends.park()) {
        ends.settle(&probe, true);
    }
    ends.settle(&probe, true);
}

/// Runs `each` on every worker of this process; what each returned.
pub(crate) fn execute<T, F>(config: timely::Config, each: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(&mut Worker) -> T + Send + Sync + 'static,
{
    let guards = timely::execute(config, each).map_err(|e| anyhow::anyhow!("cannot start the workers: {e}"))?;
    guards
        .join()
        .into_iter()
        .map(|joined| joined.map_err(|e| anyhow::anyhow!("a worker failed: {e}")))
        .collect()
}

/// A fresh learner for `d` inputs; with the settings' `z_first_rows`, its
/// inducing inputs are the first of `rows` (standardised).
pub(crate) fn fresh_learner(
    settings: &Settings,
    likelihood: Likelihood,
    rows: &[Record],
    scaling: &Standardizer,
) -> Result<SequentialLearner> {
    let d = scaling.x_mean.len();
    let likelihood = settings.likelihood(likelihood);
    let config = settings.sequential_for(&likelihood);
    let kernel = settings.model_kernel(d, &likelihood);
    let z = (settings.z_first_rows && !rows.is_empty()).then(|| {
        let m = settings.sequential.inducing.min(rows.len());
        let z = DMatrix::from_fn(m, d, |i, j| scaling.record(rows[i].clone()).features[j]);
        model_inputs(&likelihood, &z, |i| rows[i].output).into_owned()
    });
    let learner = SequentialLearner::new(kernel, likelihood, config)?;
    match z {
        Some(z) => Ok(learner.with_inducing(z)?),
        None => Ok(learner),
    }
}
