//! Serve's ends on one worker: its share of the input topic's partitions
//! in; predictions and dead letters out to Kafka; its source positions, once
//! delivered, to worker 0 (checkpoints and offset commits). Nothing here is
//! shared with the other workers but through the dataflow, so a worker runs
//! the same whether its peers are threads of its process or other processes.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dualgp_connectors::{
    DeadLetter, DeadLetterProducer, EpochPart, KafkaError, KafkaPosition, KafkaSource, PredictionProducer,
};
use dualgp_operators::dataflow::{CheckpointStore, GpStreams, Record, WriteCheckpoints};
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle, Scope};
use timely::worker::Worker;

use super::commits::{track_commits, Commits};
use super::signals::Signals;
use super::telling::Tally;
use crate::metrics::Metrics;
use crate::protocol::Standardizer;
use crate::wiring::Ends;

/// What every worker of one process shares: its metrics, and what tells it to stop.
#[derive(Clone)]
pub(crate) struct Serving {
    pub metrics: Metrics,
    /// Set by SIGINT/SIGTERM: the cluster finishes what it read.
    pub stop: Arc<AtomicBool>,
    pub idle_exit: Option<f64>,
    /// The epochs seen, for the progress lines and the summary.
    pub tally: Arc<Tally>,
}

/// How a worker's run ended.
#[derive(Debug, Default)]
pub(crate) struct WorkerOutcome {
    pub error: Option<String>,
    /// Worker 0: the newest epoch checkpointed and the newest whose offsets
    /// commit the broker acknowledged.
    pub checkpointed: Option<u64>,
    pub committed: Option<u64>,
}

impl WorkerOutcome {
    /// A worker that stopped for `error`, having served nothing.
    pub fn failed(error: String) -> Self {
        WorkerOutcome {
            error: Some(error),
            ..WorkerOutcome::default()
        }
    }
}

pub(crate) struct KafkaEnds {
    serving: Serving,
    scaling: Standardizer,
    /// `None` where the source could not be opened: the worker reads nothing
    /// and halts the cluster, but takes part in the dataflow to its end.
    source: Option<KafkaSource>,
    predictions: Rc<PredictionProducer>,
    dead: Rc<DeadLetterProducer>,
    /// Worker 0's checkpoint directory (process 0 only).
    store: Option<CheckpointStore>,
    checkpointing: bool,
    positions: DeliveredPositions,
    /// Passes an epoch once every worker has handed its predictions and
    /// dead letters to its producers.
    delivery: ProbeHandle<u64>,
    /// Every epoch before this one is delivered by this worker.
    delivered: u64,
    /// When this worker started reading each epoch not yet delivered.
    read_at: BTreeMap<u64, Instant>,
    last_input: Instant,
    signals: Signals,
    commits: Rc<RefCell<Commits>>,
    /// This worker's first error.
    failure: Rc<RefCell<Option<String>>>,
    /// A prediction or dead letter could not be queued: it is in no flush.
    unsent: Rc<Cell<bool>>,
    index: usize,
}

/// What a worker is given to serve with.
pub(crate) struct Equipment {
    pub source: Result<KafkaSource, String>,
    pub predictions: PredictionProducer,
    pub dead: DeadLetterProducer,
    pub store: Option<CheckpointStore>,
    pub checkpointing: bool,
    pub scaling: Standardizer,
}

impl KafkaEnds {
    pub fn new(worker: &Worker, serving: Serving, kit: Equipment) -> Self {
        let failure = Rc::new(RefCell::new(kit.source.as_ref().err().cloned()));
        KafkaEnds {
            serving,
            scaling: kit.scaling,
            source: kit.source.ok(),
            predictions: Rc::new(kit.predictions),
            dead: Rc::new(kit.dead),
            store: kit.store,
            checkpointing: kit.checkpointing,
            positions: DeliveredPositions::new(worker.index()),
            delivery: ProbeHandle::new(),
            delivered: 0,
            read_at: BTreeMap::new(),
            last_input: Instant::now(),
            signals: Signals::new(worker.index(), worker.peers()),
            commits: Rc::default(),
            failure,
            unsent: Rc::default(),
            index: worker.index(),
        }
    }

    /// How the run ended, once the dataflow has; worker 0 first waits for
    /// the broker to answer its last commits (at most the broker timeout).
    pub fn outcome(self) -> WorkerOutcome {
        let committed = match &self.source {
            Some(source) if self.index == 0 => source.settle_commits(),
            _ => None,
        };
        WorkerOutcome {
            error: self.failure.take(),
            checkpointed: self.commits.borrow().checkpointed,
            committed,
        }
    }

    /// Every epoch before this one is handed to the producers by every worker.
    fn finished(&self) -> u64 {
        self.delivery.with_frontier(|f| f.first().copied()).unwrap_or(u64::MAX)
    }

    /// Without waiting: whether the broker acknowledged every prediction and
    /// dead letter of the epochs before `epoch`.
    fn acknowledged_before(&self, epoch: u64) -> Result<bool, KafkaError> {
        Ok(self.predictions.delivered_before(epoch)? && self.dead.delivered_before(epoch)?)
    }

    /// Keeps the first error; the next read halts the cluster.
    fn fail(&self, why: String) {
        self.failure.borrow_mut().get_or_insert(why);
    }

    /// Counts what an epoch's read brought and says whether this worker's
    /// input has been idle for `--idle-exit`.
    fn note_read(&mut self, part: &EpochPart<KafkaPosition>, streamed: usize) {
        let m = &self.serving.metrics;
        m.records_in.inc_by((streamed + part.records.len()) as u64);
        m.dead_letters.count(&part.dead_letters);
        m.saw_epochs(part.epoch + 1);
        let brought = streamed > 0 || !part.records.is_empty() || !part.dead_letters.is_empty();
        self.serving.tally.read(part.epoch, brought);
        if brought {
            self.last_input = Instant::now();
        }
        say_if_idle(&mut self.signals, self.serving.idle_exit, self.last_input);
    }

    /// Worker 0: commits the newest positions the checkpoints (or, without,
    /// every worker's delivery) allow.
    fn commit(&mut self) {
        let (ready, error) = {
            let mut c = self.commits.borrow_mut();
            (c.ready.take(), c.error.take())
        };
        if let Some(why) = error {
            self.fail(why);
        }
        let (Some((epoch, at)), Some(source)) = (ready, self.source.as_mut()) else {
            return;
        };
        if let Err(e) = source.commit(epoch, &at) {
            tracing::error!("{e}");
        }
    }
}

impl Ends for KafkaEnds {
    const PARK: Option<Duration> = Some(Duration::from_millis(50));

    /// The broker's acknowledgements come in only when asked for: while a
    /// finished epoch waits for them, look often.
    fn park(&self) -> Option<Duration> {
        match self.finished() > self.delivered && self.positions.is_open() {
            true => Some(Duration::from_millis(2)),
            false => Self::PARK,
        }
    }

    fn wire<'scope>(&mut self, scope: Scope<'scope, u64>, gp: GpStreams<'scope>, probe: &ProbeHandle<u64>) {
        self.signals.wire(scope);
        let (m1, m2, m3) = (
            self.serving.metrics.clone(),
            self.serving.metrics.clone(),
            self.serving.metrics.clone(),
        );
        let (t1, t3) = (Arc::clone(&self.serving.tally), Arc::clone(&self.serving.tally));
        let (f1, f2) = (Rc::clone(&self.failure), Rc::clone(&self.failure));
        let (u1, u2) = (Rc::clone(&self.unsent), Rc::clone(&self.unsent));
        let (p1, d1, scale) = (
            Rc::clone(&self.predictions),
            Rc::clone(&self.dead),
            self.scaling.clone(),
        );
        gp.predictions
            .inspect_core(move |event| {
                let Ok((epoch, batch)) = event else { return };
                let out: Vec<_> = batch.iter().map(|p| scale.prediction(p.clone())).collect();
                match p1.send(&out) {
                    Ok(()) => {
                        m1.predictions_out.inc_by(out.len() as u64);
                        for p in &out {
                            m1.observe_staleness(p.staleness());
                            m1.observe_prediction(p);
                            t1.predicted(p);
                        }
                    }
                    Err(e) => {
                        u1.set(true);
                        let epoch = epoch.least().copied().unwrap_or_default();
                        f1.borrow_mut().get_or_insert(undelivered("predictions", epoch, e));
                    }
                }
            })
            .probe_with(&self.delivery)
            .probe_with(probe);
        gp.rejected
            .inspect_core(move |event| {
                let Ok((epoch, batch)) = event else { return };
                let epoch = epoch.least().copied().unwrap_or_default();
                let letters: Vec<DeadLetter> = batch.iter().map(DeadLetter::refused).collect();
                if let Err(e) = d1.send(&letters, epoch) {
                    u2.set(true);
                    f2.borrow_mut().get_or_insert(undelivered("dead letters", epoch, e));
                }
                m2.dead_letters.count(&letters);
            })
            .probe_with(&self.delivery)
            .probe_with(probe);
        let updates = gp.updates.inspect(move |u| {
            m3.records_shed.inc_by(u.shed);
            match &u.outcome {
                Ok(report) => {
                    m3.updates.inc();
                    m3.forgetting_discount.set(report.discount);
                    t3.learned(u.epoch);
                }
                Err(why) => {
                    m3.updates_failed.inc();
                    tracing::error!(
                        "epoch {} could not be learned, the model stays as it was: {why}",
                        u.epoch
                    );
                }
            }
        });
        let positions = scope.input_from(self.positions.handle());
        let saved = match self.checkpointing {
            true => Some(
                updates
                    .write_checkpoints(positions.clone(), self.store.take())
                    .probe_with(probe),
            ),
            false => {
                updates.probe_with(probe);
                None
            }
        };
        track_commits(positions, saved, Rc::clone(&self.commits));
    }

    fn stopping(&self) -> bool {
        self.serving.stop.load(Ordering::SeqCst) || self.failure.borrow().is_some() || self.signals.stop_reading()
    }

    fn read(&mut self, worker: &mut Worker, records: &mut InputHandleVec<u64, Record>) -> Option<u64> {
        if self.serving.stop.load(Ordering::SeqCst) || self.failure.borrow().is_some() {
            self.signals.halt();
            return None;
        }
        if self.signals.stop_reading() {
            return None;
        }
        let source = self.source.as_mut()?;
        // A resumed source starts at its checkpoint's epoch, not at 0.
        records.advance_to(source.epoch());
        self.read_at.entry(source.epoch()).or_insert_with(Instant::now);
        // Records go into the dataflow as they are read, so scoring on
        // arrival does not wait for the epoch to fill.
        let mut streamed = 0;
        let (scaling, signals, last_input) = (&self.scaling, &mut self.signals, &mut self.last_input);
        let (serving, failure) = (&self.serving, &self.failure);
        let read = source.next_epoch_streaming(|arrived| {
            streamed += arrived.len();
            if !arrived.is_empty() {
                *last_input = Instant::now();
            }
            for record in arrived.drain(..) {
                records.send(scaling.record(record));
            }
            records.flush();
            worker.step();
            // A stop, an error or a cluster gone idle ends the epoch with
            // what it has, rather than after --batch-timeout-ms.
            let stop = serving.stop.load(Ordering::SeqCst) || failure.borrow().is_some();
            say_if_idle(signals, serving.idle_exit, *last_input);
            match stop || signals.stop_reading() {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        });
        let trouble = source.broker_trouble();
        self.serving.tally.broker_trouble(trouble);
        let part = match read {
            Ok(part) => part,
            Err(e) => {
                self.fail(e.to_string());
                self.signals.halt();
                return None;
            }
        };
        if let Err(e) = self.dead.send(&part.dead_letters, part.epoch) {
            self.unsent.set(true);
            self.fail(undelivered("dead letters", part.epoch, e));
        }
        self.note_read(&part, streamed);
        for record in part.records {
            records.send(self.scaling.record(record));
        }
        self.positions.read(part.epoch, part.position);
        Some(part.epoch)
    }

    /// Hands worker 0 the positions of the finished epochs the broker has
    /// acknowledged all of (without waiting for it: reading and scoring go
    /// on meanwhile); worker 0 then commits.
    fn settle(&mut self, _: &ProbeHandle<u64>, _: bool) {
        // A prediction or dead letter that could not be queued is in no
        // flush: a flush that works after it must not let a checkpoint or
        // commit pass it. (Other failures, a broker gone, still release
        // what a flush delivers, so a restart reads less again.)
        if self.unsent.get() {
            self.positions.close();
        }
        let done = self.finished();
        // After a failed delivery nothing more is checkpointed or committed.
        if done > self.delivered && self.positions.is_open() {
            match self.acknowledged_before(done) {
                Ok(true) => {
                    self.positions.release_before(done);
                    while let Some(entry) = self.read_at.first_entry().filter(|e| *e.key() < done) {
                        let latency = entry.remove().elapsed().as_secs_f64();
                        self.serving.metrics.observe_epoch_latency(latency);
                    }
                    self.delivered = done;
                }
                Ok(false) => {}
                // What failed to go out may be lost even if a later delivery works.
                Err(e) => {
                    self.positions.close();
                    self.fail(undelivered("predictions and dead letters", self.delivered, e));
                }
            }
        }
        if self.index == 0 {
            self.commit();
        }
    }

    /// Delivers what was read, then ends the positions (epochs not released
    /// by then get no checkpoint) and this worker's signals.
    fn close(&mut self, worker: &mut Worker, probe: &ProbeHandle<u64>) {
        if self.failure.borrow().is_some() {
            self.signals.halt();
        }
        while !self.delivery.done() {
            worker.step_or_park(self.park());
            self.settle(probe, true);
        }
        // The last epochs' acknowledgements, waited for, so that they are
        // checkpointed and committed too.
        if self.failure.borrow().is_none() {
            match self.predictions.flush().and_then(|()| self.dead.flush()) {
                Ok(()) => self.settle(probe, true),
                Err(e) => self.fail(e.to_string()),
            }
        }
        self.positions.close();
        self.signals.close();
    }
}

/// One worker's source positions after each epoch it read, sent on only
/// once the epoch's predictions and dead letters are delivered: a checkpoint
/// or a commit never covers an epoch a restart would not score.
struct DeliveredPositions {
    handle: Option<InputHandleVec<u64, (usize, KafkaPosition)>>,
    worker: usize,
    read: VecDeque<(u64, KafkaPosition)>,
}

impl DeliveredPositions {
    fn new(worker: usize) -> Self {
        DeliveredPositions {
            handle: Some(InputHandleVec::new()),
            worker,
            read: VecDeque::new(),
        }
    }

    fn handle(&mut self) -> &mut InputHandleVec<u64, (usize, KafkaPosition)> {
        self.handle.get_or_insert_with(InputHandleVec::new)
    }

    fn read(&mut self, epoch: u64, position: KafkaPosition) {
        self.read.push_back((epoch, position));
    }

    /// Sends the positions of every epoch before `delivered` and holds the
    /// stream at the oldest epoch still undelivered.
    fn release_before(&mut self, delivered: u64) {
        let Some(handle) = self.handle.as_mut() else { return };
        while let Some((epoch, position)) = self.read.pop_front_if(|(e, _)| *e < delivered) {
            handle.advance_to(epoch);
            handle.send((self.worker, position));
        }
        let hold = self.read.front().map_or(delivered, |(e, _)| *e);
        if hold > *handle.time() {
            handle.advance_to(hold);
        }
    }

    /// Ends the stream; epochs not released by then get no checkpoint.
    fn close(&mut self) {
        self.handle = None;
    }

    fn is_open(&self) -> bool {
        self.handle.is_some()
    }
}

/// The one line a failed send or delivery ends serve with: what was not
/// delivered, why, and that nothing from its epoch on is committed.
fn undelivered(what: &str, epoch: u64, why: impl std::fmt::Display) -> String {
    format!(
        "{what} of epoch {epoch} could not be delivered: {why}; nothing from epoch {epoch} on is checkpointed or committed, so a restart reads it again"
    )
}

/// Tells the cluster whether this worker's input, last seen at `last_input`,
/// has been idle for `idle_exit` seconds.
fn say_if_idle(signals: &mut Signals, idle_exit: Option<f64>, last_input: Instant) {
    signals.idle(idle_exit.is_some_and(|limit| last_input.elapsed().as_secs_f64() >= limit));
}
