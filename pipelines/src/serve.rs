//! `dualgp serve`: real-time scoring from Kafka. Every worker reads its share
//! of the input topic's partitions; each record is scored on arrival with the
//! newest model its worker holds (or, `--scoring prequential`, by the model of
//! the epochs before it) and sent to the output topic keyed by id, then
//! learned from if it has a label. Bad messages go to `IN.dlq` with the
//! reason. The flags and messages are a contract
//! (`../shared/docs/EVALUATION.md`, beside the repository): extend, never
//! rename. The wiring is `wiring.rs`'s; here are its Kafka ends.
//!
//! Delivery: an epoch's update is checkpointed (with `--checkpoint-dir`) only
//! once every worker has delivered its predictions, and offsets are committed
//! only once it is checkpointed; a restart resumes from the newest checkpoint,
//! so no epoch is applied twice and no record is lost (records after the
//! checkpoint are scored again).
//! Inputs (and a regression target) are standardised with the first epoch's
//! statistics, kept beside the checkpoints.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::kafka::{create_topic, dlq_topic, topic_partitions};
use dualgp_connectors::{
    ColumnMapping, DeadLetter, DeadLetterProducer, EpochPart, KafkaConnection, KafkaPosition, KafkaSource,
    KafkaSourceConfig, PredictionProducer, StartOffset, WorkerShare,
};
use dualgp_operators::dataflow::{
    Checkpoint, CheckpointStore, GpOptions, GpStreams, Record, Scoring, WriteCheckpoints,
};
use dualgp_operators::model::Likelihood;
use serde::Serialize;
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle, Scope};
use timely::worker::Worker;

use crate::cluster::ClusterArgs;
use crate::metrics::{serve_http, Metrics};
use crate::model_args::{check_workers, ModelArgs};
use crate::protocol::Standardizer;
use crate::wiring::{self, fresh_learner, Ends, Start};

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// `host:port[,host:port…]`
    #[arg(long)]
    pub brokers: String,
    #[arg(long)]
    pub input_topic: String,
    #[arg(long)]
    pub output_topic: String,
    /// gaussian | bernoulli[:logit] | poisson | student-t | softmax:C, or a
    /// comma-separated list, one per output (messages then carry `"output": d`)
    #[arg(long)]
    pub likelihood: String,
    /// Shared latent GPs of a multi-output model (default: one per output)
    #[arg(long)]
    pub latents: Option<usize>,
    /// A multi-output model's predictions also hold every output's
    /// predictive: `"outputs": [{"mean":…,"var":…}, {"p":[…]}, …]`.
    #[arg(long)]
    pub predict_all_outputs: bool,
    /// Records per epoch and worker: the model learns after each epoch.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// An epoch also ends after this long.
    #[arg(long, default_value_t = 1000)]
    pub batch_timeout_ms: u64,
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Accepted for the contract; `serve` refuses more than one process for now.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Stop cleanly after this many seconds without input.
    #[arg(long)]
    pub idle_exit: Option<f64>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Checkpoints after every update; a restart resumes from the newest.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// The consumer group offsets are committed under (never joined).
    #[arg(long, default_value = "dualgp")]
    pub group_id: String,
    /// A librdkafka setting passed through (TLS, SASL): `KEY=VALUE`, repeatable.
    #[arg(long = "kafka-option", value_parser = key_value)]
    pub kafka_options: Vec<(String, String)>,
    /// The longest wait for the broker (start-up, an outage) before a clear error.
    #[arg(long, default_value_t = 30.0)]
    pub broker_timeout: f64,
    /// Epochs read ahead of the learner at most: with on-arrival scoring,
    /// the most epochs a record's model can lag behind it.
    #[arg(long, default_value_t = 2)]
    pub epochs_in_flight: u64,
    /// on-arrival: each record scored at once with the newest model its
    /// worker holds; prequential: once every earlier epoch is learned.
    #[arg(long, default_value_t = Scoring::OnArrival)]
    pub scoring: Scoring,
    /// Serve Prometheus metrics over HTTP on this port.
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// The address the metrics endpoint binds to.
    #[arg(long, default_value = "127.0.0.1")]
    pub metrics_host: std::net::IpAddr,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

/// What a run did, when it stopped.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServeSummary {
    pub records: u64,
    pub predictions: u64,
    pub dead_letters: u64,
    pub epochs: u64,
    /// Updates applied in this run.
    pub updates: u64,
    /// Updates that failed in this run (the model stayed as it was).
    pub failed_updates: u64,
    pub last_checkpoint: Option<u64>,
    pub committed_epoch: Option<u64>,
}

/// Where the stream stands, shared by the workers of this process.
#[derive(Default)]
struct Shared {
    committed_epoch: Option<u64>,
    /// When each epoch not yet delivered everywhere was read.
    read_at: BTreeMap<u64, Instant>,
    /// Each worker's source position after an epoch, by epoch.
    positions: BTreeMap<u64, Vec<KafkaPosition>>,
    /// Per worker: every epoch before this one is delivered.
    delivered: Vec<u64>,
    checkpointed: Option<u64>,
    last_input: Option<Instant>,
    error: Option<String>,
}

/// The first epoch's standardisation, kept beside the checkpoints.
pub(crate) const SCALING_FILE: &str = "scaling.json";

/// Serves until `stop` is set (SIGINT/SIGTERM), `--idle-exit`, or an error.
pub fn run(args: &ServeArgs, stop: Arc<AtomicBool>) -> Result<ServeSummary> {
    let likelihood =
        Likelihood::parse_outputs(&args.likelihood, args.latents).map_err(|e| anyhow::anyhow!("--likelihood: {e}"))?;
    let settings = args.model.settings()?;
    check_workers(args.workers)?;
    args.cluster.require_one_process("serve")?;
    if args.batch_size == 0 || args.batch_timeout_ms == 0 {
        bail!("--batch-size and --batch-timeout-ms must be above 0");
    }
    if !args.broker_timeout.is_finite() || args.broker_timeout <= 0.0 {
        bail!("--broker-timeout must be above 0 seconds");
    }
    let mut conn = KafkaConnection::new(&args.brokers).with_timeout(Duration::from_secs_f64(args.broker_timeout));
    for (k, v) in &args.kafka_options {
        conn = conn.with_option(k, v);
    }
    topic_partitions(&conn, &args.input_topic)?;
    create_topic(&conn, &args.output_topic, 1)?;
    create_topic(&conn, &dlq_topic(&args.input_topic), 1)?;

    let mut config = KafkaSourceConfig {
        connection: conn.clone(),
        topic: args.input_topic.clone(),
        group_id: args.group_id.clone(),
        mapping: ColumnMapping::for_likelihood(&likelihood),
        epoch_records: args.batch_size,
        epoch_ms: args.batch_timeout_ms,
        start: StartOffset::Committed,
        ..KafkaSourceConfig::default()
    };
    let store = match &args.checkpoint_dir {
        Some(dir) => Some(CheckpointStore::new(dir, 3)?),
        None => None,
    };
    let resumed: Option<Checkpoint<KafkaPosition>> = match &store {
        Some(s) => s.latest()?,
        None => None,
    };
    let saved_scaling = match &args.checkpoint_dir {
        Some(dir) => read_scaling(dir)?,
        None => None,
    };
    let resume = resumed.as_ref().and_then(|c| KafkaPosition::merge(&c.positions));
    let scaling = match saved_scaling {
        Some(s) => s,
        None => {
            let Some(first) = first_records(&config, resume.as_ref(), args, &stop)? else {
                return Ok(ServeSummary::default());
            };
            let d = first[0].features.len();
            let s = Standardizer::fit_records(&first, d, &likelihood);
            if let Some(dir) = &args.checkpoint_dir {
                write_scaling(dir, &s)?;
            }
            s
        }
    };
    let d = scaling.x_mean.len();
    config.mapping = config.mapping.with_dimension(d);
    let start = Start {
        options: GpOptions {
            scoring: args.scoring,
            learned_through: resumed.as_ref().map(|c| c.epoch),
            predict_all_outputs: args.predict_all_outputs,
            ..GpOptions::new(d)
        },
        // Serve's inducing inputs are the learner's choice (no first rows).
        learner: match resumed {
            Some(c) => c.learner,
            None => fresh_learner(&settings, likelihood, &[], &scaling)?,
        },
        epochs_in_flight: args.epochs_in_flight,
    };

    let serving = Serving {
        state: Arc::new(Mutex::new(Shared {
            delivered: vec![0; args.workers],
            last_input: Some(Instant::now()),
            ..Shared::default()
        })),
        metrics: Metrics::default(),
        stop,
        scaling,
        store,
        idle_exit: args.idle_exit,
    };
    let endpoint = match args.metrics_port {
        Some(port) => {
            let addr = std::net::SocketAddr::new(args.metrics_host, port);
            let endpoint = serve_http(addr, serving.metrics.clone())
                .with_context(|| format!("cannot serve metrics on {addr}; choose another --metrics-port"))?;
            Some(endpoint)
        }
        None => None,
    };
    // Every worker's connections, opened before the dataflow so that a failure
    // is an error here, not one worker missing from the dataflow.
    let mut opened = Vec::with_capacity(args.workers);
    for index in 0..args.workers {
        let source = KafkaSource::open(&config, WorkerShare::new(index, args.workers), resume.as_ref())?;
        let predictions = PredictionProducer::new(&conn, &args.output_topic)?;
        let dead = DeadLetterProducer::new(&conn, &args.input_topic)?;
        opened.push(Some((source, predictions, dead)));
    }
    let connections = Mutex::new(opened);
    let (state, metrics) = (Arc::clone(&serving.state), serving.metrics.clone());
    let joined = wiring::execute(timely::Config::process(args.workers), move |worker| {
        let (source, predictions, dead) = locked(&connections)[worker.index()]
            .take()
            .expect("opened for every worker");
        let mut ends = KafkaEnds::new(worker, serving.clone(), source, predictions, dead);
        wiring::run_worker(worker, &start, &mut ends);
    });
    if let Some(endpoint) = endpoint {
        endpoint.stop();
    }
    joined?;
    let s = std::mem::take(&mut *locked(&state));
    if let Some(e) = s.error {
        bail!("{e}");
    }
    Ok(ServeSummary {
        records: metrics.records_in.get(),
        predictions: metrics.predictions_out.get(),
        dead_letters: metrics.dead_letters.get(),
        epochs: metrics.epochs.get(),
        updates: metrics.updates.get(),
        failed_updates: metrics.updates_failed.get(),
        last_checkpoint: s.checkpointed,
        committed_epoch: s.committed_epoch,
    })
}

/// A mutex's contents even if a worker panicked holding it: that worker's
/// failure is reported when it is joined, not as a panic in every other.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What every worker of a serving process shares.
#[derive(Clone)]
struct Serving {
    state: Arc<Mutex<Shared>>,
    metrics: Metrics,
    /// Set by a signal, `--idle-exit` or an error: workers finish what they read.
    stop: Arc<AtomicBool>,
    scaling: Standardizer,
    store: Option<CheckpointStore>,
    idle_exit: Option<f64>,
}

impl Serving {
    /// Keeps the first error and stops every worker.
    fn fail(&self, e: String) {
        locked(&self.state).error.get_or_insert(e);
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Serve's ends on one worker: its share of the input topic's partitions
/// in, predictions and dead letters out to Kafka; after each step, the
/// offsets every worker has delivered (and checkpointed) are committed.
struct KafkaEnds {
    serving: Serving,
    source: KafkaSource,
    predictions: Rc<PredictionProducer>,
    dead: Rc<DeadLetterProducer>,
    positions: DeliveredPositions,
    /// Passes an epoch once this worker's predictions and dead letters are sent.
    delivery: ProbeHandle<u64>,
    /// Every epoch before this one is delivered by this worker.
    delivered: u64,
    /// Worker 0: the newest epoch whose offsets are committed.
    committed: Option<u64>,
    index: usize,
    peers: usize,
}

impl KafkaEnds {
    fn new(
        worker: &Worker,
        serving: Serving,
        source: KafkaSource,
        predictions: PredictionProducer,
        dead: DeadLetterProducer,
    ) -> Self {
        KafkaEnds {
            serving,
            source,
            predictions: Rc::new(predictions),
            dead: Rc::new(dead),
            positions: DeliveredPositions::new(worker.index()),
            delivery: ProbeHandle::new(),
            delivered: 0,
            committed: None,
            index: worker.index(),
            peers: worker.peers(),
        }
    }

    fn checkpointing(&self) -> bool {
        self.serving.store.is_some()
    }

    /// Counts what an epoch's read brought, keeps its position, and stops
    /// after `--idle-exit` without input.
    fn note_read(&mut self, part: &EpochPart<KafkaPosition>, streamed: usize) {
        let mut s = locked(&self.serving.state);
        let m = &self.serving.metrics;
        m.records_in.inc_by((streamed + part.records.len()) as u64);
        m.dead_letters.inc_by(part.dead_letters.len() as u64);
        // Under the state's lock: one worker at a time raises it.
        m.saw_epochs(part.epoch + 1);
        s.positions.entry(part.epoch).or_default().push(part.position.clone());
        if streamed > 0 || !part.records.is_empty() || !part.dead_letters.is_empty() {
            s.last_input = Some(Instant::now());
        }
        if let (Some(limit), Some(last)) = (self.serving.idle_exit, s.last_input) {
            if last.elapsed().as_secs_f64() >= limit {
                self.serving.stop.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Worker 0: records epoch latencies and commits the offsets every
    /// worker has delivered (and, with checkpoints, the writer has saved).
    fn commit(&mut self, reading_done: bool) {
        let mut s = locked(&self.serving.state);
        let everyone = s.delivered.iter().copied().min().unwrap_or(0);
        while let Some(entry) = s.read_at.first_entry().filter(|e| *e.key() < everyone) {
            let latency = entry.remove().elapsed().as_secs_f64();
            self.serving.metrics.observe_epoch_latency(latency);
        }
        let safe = if self.checkpointing() {
            s.checkpointed.map_or(0, |e| e + 1)
        } else {
            everyone
        };
        let upto = safe.min(everyone);
        // The position after epoch `upto - 1`, once every worker has reported it.
        let target = upto.checked_sub(1).filter(|e| self.committed.is_none_or(|c| *e > c));
        if let Some(epoch) = target {
            if let Some(at) = s
                .positions
                .get(&epoch)
                .filter(|p| p.len() == self.peers || reading_done)
            {
                if let Some(merged) = KafkaPosition::merge(at) {
                    match self.source.commit(&merged) {
                        Ok(()) => {
                            self.committed = Some(epoch);
                            s.committed_epoch = Some(epoch);
                        }
                        Err(e) => tracing::error!("{e}"),
                    }
                }
            }
            s.positions.retain(|e, _| *e > epoch);
        }
    }
}

impl Ends for KafkaEnds {
    const PARK: Option<Duration> = Some(Duration::from_millis(50));

    fn wire<'scope>(&mut self, scope: Scope<'scope, u64>, gp: GpStreams<'scope>, probe: &ProbeHandle<u64>) {
        let Serving {
            state,
            metrics,
            scaling,
            store,
            ..
        } = &self.serving;
        let (s1, s2, s3) = (Arc::clone(state), Arc::clone(state), Arc::clone(state));
        let (m1, m2, m3) = (metrics.clone(), metrics.clone(), metrics.clone());
        let (p1, d1, scale) = (Rc::clone(&self.predictions), Rc::clone(&self.dead), scaling.clone());
        gp.predictions
            .inspect_core(move |event| {
                let Ok((_, batch)) = event else { return };
                let out: Vec<_> = batch.iter().map(|p| scale.prediction(p.clone())).collect();
                match p1.send(&out) {
                    Ok(()) => {
                        m1.predictions_out.inc_by(out.len() as u64);
                        out.iter().for_each(|p| m1.observe_staleness(p.staleness()));
                    }
                    Err(e) => drop(locked(&s1).error.get_or_insert(e.to_string())),
                }
            })
            .probe_with(&self.delivery)
            .probe_with(probe);
        gp.rejected
            .inspect_core(move |event| {
                let Ok((_, batch)) = event else { return };
                let letters: Vec<DeadLetter> = batch.iter().map(DeadLetter::refused).collect();
                if let Err(e) = d1.send(&letters) {
                    locked(&s2).error.get_or_insert(e.to_string());
                }
                m2.dead_letters.inc_by(letters.len() as u64);
            })
            .probe_with(&self.delivery)
            .probe_with(probe);
        let updates = gp.updates.inspect(move |u| match &u.outcome {
            Ok(_) => m3.updates.inc(),
            Err(why) => {
                m3.updates_failed.inc();
                tracing::error!(
                    "epoch {} could not be learned, the model stays as it was: {why}",
                    u.epoch
                );
            }
        });
        match store.clone() {
            Some(store) => {
                let at = scope.input_from(self.positions.handle());
                updates
                    .write_checkpoints(at, store)
                    .inspect(move |saved| {
                        let mut s = locked(&s3);
                        match saved {
                            Ok(epoch) => s.checkpointed = Some(*epoch),
                            Err(e) => drop(s.error.get_or_insert(format!("cannot checkpoint: {e}"))),
                        }
                    })
                    .probe_with(probe);
            }
            None => {
                updates.probe_with(probe);
            }
        }
    }

    fn read(&mut self, worker: &mut Worker, records: &mut InputHandleVec<u64, Record>) -> Option<u64> {
        if self.serving.stop.load(Ordering::SeqCst) {
            return None;
        }
        // A resumed source starts at its checkpoint's epoch, not at 0.
        records.advance_to(self.source.epoch());
        locked(&self.serving.state)
            .read_at
            .entry(self.source.epoch())
            .or_insert_with(Instant::now);
        // Records go into the dataflow as they are read, so scoring on
        // arrival does not wait for the epoch to fill.
        let mut streamed = 0;
        let scaling = &self.serving.scaling;
        let read = self.source.next_epoch_streaming(|arrived| {
            streamed += arrived.len();
            for record in arrived.drain(..) {
                records.send(scaling.record(record));
            }
            records.flush();
            worker.step();
        });
        let part = match read {
            Ok(part) => part,
            Err(e) => {
                self.serving.fail(e.to_string());
                return None;
            }
        };
        if let Err(e) = self.dead.send(&part.dead_letters) {
            self.serving.fail(e.to_string());
        }
        self.note_read(&part, streamed);
        for record in part.records {
            records.send(self.serving.scaling.record(record));
        }
        if self.checkpointing() {
            self.positions.read(part.epoch, part.position);
        }
        Some(part.epoch)
    }

    /// Flushes this worker's deliveries for finished epochs and hands their
    /// positions to the checkpoint writer; worker 0 then commits.
    fn settle(&mut self, _: &ProbeHandle<u64>, reading_done: bool) {
        let done = self.delivery.with_frontier(|f| f.first().copied()).unwrap_or(u64::MAX);
        if done > self.delivered {
            match self.predictions.flush().and_then(|()| self.dead.flush()) {
                Ok(()) => self.positions.release_before(done),
                // What failed to go out may be lost even if a later flush works.
                Err(e) => {
                    self.positions.close();
                    self.serving.fail(e.to_string());
                }
            }
            self.delivered = done;
            locked(&self.serving.state).delivered[self.index] = done;
        }
        if self.index == 0 {
            self.commit(reading_done);
        }
    }

    /// Delivers what was read, then ends the positions: epochs not released
    /// by then get no checkpoint.
    fn close(&mut self, worker: &mut Worker, probe: &ProbeHandle<u64>) {
        while !self.delivery.done() {
            worker.step_or_park(Self::PARK);
            self.settle(probe, true);
        }
        self.positions.close();
    }
}

/// One worker's source positions after each epoch it read, handed to the
/// checkpoint writer only once the epoch's predictions and dead letters are
/// delivered: a checkpoint never covers an epoch a restart would not score.
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
        self.handle.as_mut().expect("open until the end of the run")
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
}

/// The first epoch's worth of records (from the resume point), read without
/// committing anything, to fix the dimension and the standardisation. `None`
/// when told to stop (or idle too long) before any record came.
fn first_records(
    config: &KafkaSourceConfig,
    resume: Option<&KafkaPosition>,
    args: &ServeArgs,
    stop: &AtomicBool,
) -> Result<Option<Vec<Record>>> {
    let mut source = KafkaSource::open(config, WorkerShare::ALONE, resume)?;
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let part = source.next_epoch()?;
        if !part.records.is_empty() {
            return Ok(Some(part.records));
        }
        if args
            .idle_exit
            .is_some_and(|limit| started.elapsed().as_secs_f64() >= limit)
        {
            break;
        }
    }
    Ok(None)
}

/// The scaling kept beside the checkpoints in `dir`; `None` when there is none yet.
pub(crate) fn read_scaling(dir: &Path) -> Result<Option<Standardizer>> {
    let path = dir.join(SCALING_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                format!("{} is not a dualgp scaling", path.display())
            })?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Written once, atomically, before the first checkpoint.
fn write_scaling(dir: &Path, scaling: &Standardizer) -> Result<()> {
    let (path, temp) = (dir.join(SCALING_FILE), dir.join(format!(".{SCALING_FILE}.partial")));
    std::fs::write(&temp, serde_json::to_vec(scaling)?)
        .and_then(|()| std::fs::rename(&temp, &path))
        .with_context(|| format!("cannot write {}", path.display()))
}
