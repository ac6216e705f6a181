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
//! once every worker has delivered its predictions and dead letters, and
//! offsets are committed only once it is checkpointed; after a send or
//! delivery fails nothing more is either. A restart resumes from the newest
//! checkpoint, so no epoch is applied twice and no record or dead letter is
//! lost (records after the checkpoint are scored again; docs/OPERATIONS.md,
//! "At least once, and how much again", bounds how many).
//! Inputs (and a regression target) are standardised with the first epoch's
//! statistics, kept beside the checkpoints.
//!
//! A cluster (`--processes`): the workers of every process share the
//! partitions and coordinate only through the dataflow: process 0 tells every
//! worker where to start ([`opening`]), positions go to worker 0 once
//! delivered ([`commits`]), and a stop reaches every worker ([`signals`]). A
//! process that dies takes the cluster down (timely's failure model); every
//! process restarted resumes from process 0's newest checkpoint.

mod commits;
mod kafka_ends;
mod opening;
mod signals;
mod telling;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::kafka::{
    create_topic, dlq_topic, topic_partitions, topic_partitions_noting, Waiting, MAX_RECORD_BYTES,
};
use dualgp_connectors::{
    DeadLetterProducer, KafkaConnection, KafkaError, KafkaPosition, KafkaSource, KafkaSourceConfig, PredictionProducer,
    StartOffset, WorkerShare,
};
use dualgp_operators::dataflow::{Checkpoint, CheckpointStore, GpOptions, Record, Scoring};
use dualgp_operators::model::Likelihood;
use serde::Serialize;
use timely::worker::Worker;

use crate::cluster::ClusterArgs;
use crate::column_args::ColumnArgs;
use crate::kafka_tools::key_value;
use crate::likelihood_args::LikelihoodArgs;
use crate::metrics::{serve_http, Metrics};
use crate::model_args::{ModelArgs, Settings};
use crate::protocol::Standardizer;
use crate::saved_model::{read_scaling, write_scaling, SavedModel};
use crate::wiring::{self, fresh_learner, shards_on_own_cores, Start};
use crate::wording::counted;
use kafka_ends::{Equipment, KafkaEnds, Serving, WorkerOutcome};
use opening::{share_opening, Opening, Word};
use telling::{say, Epochs, ModelFrom, PeerWait, Progress, StartLine, Tally};

/// `--epochs-in-flight`'s default. One update learns every epoch in flight,
/// so a learner that falls behind catches up in fewer, larger updates. (64
/// gave a lower p99 than 16 over 10 and 20 s at 10 000 records/s, a higher
/// one over 60 s: docs/PERFORMANCE.md, "Serving latency"; 16 bounds the lag and the state
/// more tightly.)
pub const EPOCHS_IN_FLIGHT: u64 = 16;

/// `--peer-timeout`'s default: seconds a process waits for the others at start.
pub const PEER_TIMEOUT_SECONDS: f64 = 120.0;

/// `--progress`'s default: seconds between progress lines.
pub const PROGRESS_SECONDS: f64 = 10.0;

/// `dualgp serve`'s flags.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// `host:port[,host:port…]`
    #[arg(long)]
    pub brokers: String,
    /// The topic records are read from.
    #[arg(long)]
    pub input_topic: String,
    /// The topic predictions are written to.
    #[arg(long)]
    pub output_topic: String,
    /// Which JSON fields (or Arrow IPC columns) are the id, the features, the target and the output.
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// The likelihood of each output.
    #[command(flatten)]
    pub likelihood: LikelihoodArgs,
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
    /// Dataflow worker threads (per process).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// A timely cluster: every process serves its workers' share of the partitions.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Stop cleanly once no worker (of any process) has had input for this many seconds.
    #[arg(long)]
    pub idle_exit: Option<f64>,
    /// How the model learns.
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
    /// The longest wait, at start, for the cluster's other processes before a clear error.
    #[arg(long, value_name = "SECONDS", default_value_t = PEER_TIMEOUT_SECONDS)]
    pub peer_timeout: f64,
    /// A message larger than this is a `too_large` dead letter, never parsed.
    #[arg(long, value_name = "BYTES", default_value_t = MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,
    /// Epochs read ahead of the learner at most: with on-arrival scoring,
    /// the most epochs a record's model can lag behind it.
    #[arg(long, default_value_t = EPOCHS_IN_FLIGHT)]
    pub epochs_in_flight: u64,
    /// Scoring on arrival, hold a record's model to about this many epochs
    /// behind it: a learner that cannot keep up learns a sample of each
    /// update's records (counted as shed), not every one. Below
    /// --epochs-in-flight. Unset: every record is learned, and reading
    /// waits for the learner once it is --epochs-in-flight behind.
    #[arg(long, value_name = "EPOCHS")]
    pub max_staleness: Option<u64>,
    /// on-arrival: each record scored at once with the newest model its
    /// worker holds; prequential: once every earlier epoch is learned.
    #[arg(long, default_value_t = Scoring::OnArrival)]
    pub scoring: Scoring,
    /// Scoring on arrival, the learner's threads run only on cores nothing
    /// else wants (Linux's SCHED_IDLE), so a record never waits for a core;
    /// for a machine with cores to spare. Where the cores are busy (a broker
    /// beside serve) such a learner falls behind until reading waits for it.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub learn_in_background: bool,
    /// Serve Prometheus metrics over HTTP on this port.
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// The address the metrics endpoint binds to.
    #[arg(long, default_value = "127.0.0.1")]
    pub metrics_host: std::net::IpAddr,
    /// Start from this model instead of the prior: a file `replay` or `eval`
    /// wrote with `--save-model`, or a checkpoint (file or directory). A
    /// checkpoint in `--checkpoint-dir` is newer and wins.
    #[arg(long = "model", value_name = "FILE")]
    pub warm_start: Option<PathBuf>,
    /// Create the input topic if it does not exist (one partition per
    /// worker of the cluster), instead of waiting for it.
    #[arg(long)]
    pub create_topics: bool,
    /// Seconds between progress lines on stderr.
    #[arg(long, value_name = "SECONDS", default_value_t = PROGRESS_SECONDS)]
    pub progress: f64,
    /// No start line and no progress lines on stderr (waits and errors are still said).
    #[arg(long)]
    pub quiet: bool,
}

/// What a run did, when it stopped (this process's counts).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServeSummary {
    /// Records read and scored.
    pub records: u64,
    /// Predictions delivered to the output topic.
    pub predictions: u64,
    /// Messages and records sent to the dead-letter topic.
    pub dead_letters: u64,
    /// Epochs read, empty ones included (an epoch also ends after
    /// `--batch-timeout-ms`, records or not).
    pub epochs: u64,
    /// Updates applied in this run.
    pub updates: u64,
    /// Updates that failed in this run (the model stayed as it was).
    pub failed_updates: u64,
    /// Labelled records scored but not learned, to hold the models within
    /// `--max-staleness` (process 0).
    pub shed: u64,
    /// The newest epoch checkpointed (process 0).
    pub last_checkpoint: Option<u64>,
    /// The newest epoch whose offsets commit the broker acknowledged (process 0).
    pub committed_epoch: Option<u64>,
    /// The first and last epoch this run read.
    pub epochs_read: Option<(u64, u64)>,
    /// The first and last epoch that brought records (or dead letters): the
    /// epochs the predictions carry.
    pub epochs_with_records: Option<(u64, u64)>,
    /// The newest epoch an update of this run learned (process 0).
    pub learned_through: Option<u64>,
}

impl ServeSummary {
    /// The line serve ends with, on process `cluster.process` of the cluster.
    pub fn line(&self, cluster: &ClusterArgs) -> String {
        let alone = cluster.processes == 1;
        let scored = match self.epochs_with_records {
            Some((a, b)) if a == b => format!(" in epoch {a}"),
            Some((a, b)) => format!(" in epochs {a}–{b}"),
            None => String::new(),
        };
        let learned = match self.learned_through {
            Some(e) => format!(", the model learned through epoch {e}"),
            None => String::new(),
        };
        let shed = match self.shed {
            0 => String::new(),
            n => format!(" ({} shed by --max-staleness)", counted(n, "labelled record")),
        };
        let committed = match (cluster.writes_outputs(), self.committed_epoch) {
            (true, Some(c)) => {
                // The first epoch of those after the last that brought records.
                let quiet_from = match (self.epochs_with_records, self.epochs_read) {
                    (Some((_, b)), _) => Some(b + 1),
                    (None, read) => read.map(|(a, _)| a),
                };
                let note = match (self.epochs_with_records, quiet_from) {
                    (Some((_, b)), _) if c < b => "; records read after it are read again on a restart".into(),
                    (_, Some(f)) if alone && f == c => format!(" (epoch {c} brought no records)"),
                    (_, Some(f)) if alone && f < c => format!(" (epochs {f}–{c} brought no records)"),
                    _ => String::new(),
                };
                format!("offsets committed through epoch {c}{note}")
            }
            (true, None) => "no offsets committed".into(),
            (false, _) => format!(
                "process {} of {}: process 0 checkpoints and commits",
                cluster.process, cluster.processes
            ),
        };
        format!(
            "{} scored{scored}, {} sent, {}; {} ({} failed){learned}{shed}; {committed}",
            counted(self.records, "record"),
            counted(self.predictions, "prediction"),
            counted(self.dead_letters, "dead letter"),
            counted(self.updates, "update"),
            self.failed_updates
        )
    }
}

/// Serves until `stop` is set (SIGINT/SIGTERM), `--idle-exit`, or an error.
/// In a cluster every process serves its workers' share of the partitions;
/// process 0 decides where the cluster starts and writes the checkpoints.
pub fn run(args: &ServeArgs, stop: Arc<AtomicBool>) -> Result<ServeSummary> {
    let timely_config = args.cluster.timely_config(args.workers)?;
    let likelihood = args.likelihood.parse()?;
    let settings = args.model.settings_for_stream(args.columns.time_column.is_some())?;
    if args.batch_size == 0 || args.batch_timeout_ms == 0 {
        bail!("--batch-size and --batch-timeout-ms must be above 0");
    }
    if !args.peer_timeout.is_finite() || args.peer_timeout <= 0.0 {
        bail!(
            "--peer-timeout {} must be a positive number of seconds",
            args.peer_timeout
        );
    }
    if !args.broker_timeout.is_finite() || args.broker_timeout <= 0.0 {
        bail!("--broker-timeout must be above 0 seconds");
    }
    if args.epochs_in_flight == 0 {
        bail!("--epochs-in-flight 0: allow at least one epoch in flight");
    }
    if let Some(bound) = args.max_staleness {
        if bound == 0 || bound >= args.epochs_in_flight {
            bail!(
                "--max-staleness {bound} must be at least 1 and below --epochs-in-flight ({}), which stops reading first",
                args.epochs_in_flight
            );
        }
        if args.scoring == Scoring::Prequential {
            bail!("--max-staleness bounds on-arrival scoring; prequential scoring waits for every earlier epoch");
        }
    }
    if args.max_record_bytes == 0 {
        bail!("--max-record-bytes 0: a record needs at least one byte");
    }
    if !args.progress.is_finite() || args.progress <= 0.0 {
        bail!("--progress must be above 0 seconds (--quiet for no progress lines)");
    }
    // The metrics answer from the start, before any wait for the broker, the
    // topic or the first record.
    let serving = Serving {
        metrics: Metrics::default(),
        stop,
        idle_exit: args.idle_exit,
        tally: Arc::new(Tally::new(&args.brokers, args.broker_timeout)),
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
    let mut conn = KafkaConnection::new(&args.brokers).with_timeout(Duration::from_secs_f64(args.broker_timeout));
    for (k, v) in &args.kafka_options {
        conn = conn.with_option(k, v);
    }
    let partitions = find_input(&conn, args)?;
    let leads = args.cluster.writes_outputs();
    if leads {
        create_topic(&conn, &args.output_topic, 1)?;
        create_topic(&conn, &dlq_topic(&args.input_topic), 1)?;
    }
    let config = KafkaSourceConfig {
        connection: conn.clone(),
        topic: args.input_topic.clone(),
        group_id: args.group_id.clone(),
        mapping: args.columns.mapping(&likelihood)?,
        epoch_records: args.batch_size,
        epoch_ms: args.batch_timeout_ms,
        start: StartOffset::Committed,
        max_record_bytes: args.max_record_bytes,
        ..KafkaSourceConfig::default()
    };
    // Process 0 alone reads the checkpoint directory; the others hear from it.
    let beginning = match leads {
        true => Some(Beginning::read(args, &likelihood)?),
        false => None,
    };
    let addresses = match &timely_config.communication {
        timely::CommunicationConfig::Cluster { addresses, .. } => addresses.clone(),
        _ => Vec::new(),
    };
    if !args.quiet {
        say(StartLine {
            brokers: &args.brokers,
            input: &args.input_topic,
            output: &args.output_topic,
            dead_letters: &dlq_topic(&args.input_topic),
            partitions: &partitions,
            workers: (args.cluster.process * args.workers, args.workers),
            peers: args.cluster.processes * args.workers,
            checkpoint_dir: args.checkpoint_dir.as_deref(),
            model: beginning
                .as_ref()
                .map_or(ModelFrom::ProcessZero, |b| b.model_from(args)),
            metrics: endpoint.as_ref().map(|e| e.addr()),
            progress: Some(args.progress),
        });
    }
    let progress = (!args.quiet).then(|| {
        let every = Duration::from_secs_f64(args.progress);
        Progress::start(every, serving.metrics.clone(), Arc::clone(&serving.tally))
    });
    // Worker 0 of process 0 opens the stream once the cluster has formed: a
    // fresh start waits there for its first records, which must not keep the
    // peers from connecting (they would time out on a live process 0).
    let leader = beginning.map(|beginning| {
        let (args, config, stop) = (args.clone(), config.clone(), Arc::clone(&serving.stop));
        Box::new(move || beginning.opening(&args, &config, &settings, likelihood, &stop)) as Leader
    });
    // This process's producers, opened before the cluster so that a failure
    // is an error here, not one worker missing from the dataflow.
    let mut producers = Vec::with_capacity(args.workers);
    for _ in 0..args.workers {
        let predictions = PredictionProducer::new(&conn, &args.output_topic)?;
        let dead = DeadLetterProducer::new(&conn, &args.input_topic)?;
        producers.push(Some((predictions, dead)));
    }
    let plan = Plan {
        config,
        scoring: args.scoring,
        learn_in_background: args.learn_in_background && args.scoring == Scoring::OnArrival,
        predict_all_outputs: args.predict_all_outputs,
        epochs_in_flight: args.epochs_in_flight,
        max_staleness: args.max_staleness,
        workers: args.workers,
        serving: serving.clone(),
        leader: Mutex::new(leader),
        producers: Mutex::new(producers),
    };
    let peers = PeerWait::start(
        args.cluster.process,
        &addresses,
        Duration::from_secs_f64(args.peer_timeout),
    );
    let formed = peers.formed();
    let joined = wiring::execute(timely_config, move |worker| {
        formed.store(true, Ordering::SeqCst);
        serve_worker(worker, &plan)
    });
    drop((peers, progress));
    if let Some(endpoint) = endpoint {
        endpoint.stop();
    }
    let outcomes = joined?;
    if let Some(e) = outcomes.iter().find_map(|o| o.error.clone()) {
        bail!("{e}");
    }
    let metrics = &serving.metrics;
    let Epochs {
        read,
        with_records,
        learned_through,
    } = serving.tally.epochs();
    Ok(ServeSummary {
        records: metrics.records_in.get(),
        predictions: metrics.predictions_out.get(),
        dead_letters: metrics.dead_letters.get(),
        epochs: read.map_or(0, |(a, b)| b - a + 1),
        updates: metrics.updates.get(),
        failed_updates: metrics.updates_failed.get(),
        shed: metrics.records_shed.get(),
        last_checkpoint: outcomes.iter().filter_map(|o| o.checkpointed).max(),
        committed_epoch: outcomes.iter().filter_map(|o| o.committed).max(),
        epochs_read: read,
        epochs_with_records: with_records,
        learned_through,
    })
}

/// The input topic's partitions, saying at once what the wait is for while
/// the broker does not answer or the topic does not exist; with
/// `--create-topics`, a missing topic is created (one partition per worker
/// of the cluster).
fn find_input(conn: &KafkaConnection, args: &ServeArgs) -> Result<Vec<i32>> {
    let topic = &args.input_topic;
    let giving_up = format!("giving up after {} s (--broker-timeout)", args.broker_timeout);
    // What the last line said: the broker (false) or the topic (true).
    let mut said: Option<bool> = None;
    let found = topic_partitions_noting(conn, topic, |waiting| {
        match waiting {
            Waiting::Topic if args.create_topics => return ControlFlow::Break(()),
            Waiting::Topic if said != Some(true) => {
                say(format_args!(
                    "waiting for topic `{topic}` on {}: it does not exist; create it, or restart with --create-topics; {giving_up}",
                    args.brokers
                ));
                said = Some(true);
            }
            Waiting::Broker { detail } if said != Some(false) => {
                say(format_args!(
                    "waiting for the broker at {}, which does not answer ({detail}); {giving_up}",
                    args.brokers
                ));
                said = Some(false);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    });
    match found {
        Err(KafkaError::TopicMissing { .. }) if args.create_topics => {
            let partitions = args.cluster.processes * args.workers;
            create_topic(conn, topic, i32::try_from(partitions).unwrap_or(i32::MAX))?;
            say(format_args!(
                "created topic `{topic}` of {partitions} partition{} (--create-topics)",
                if partitions == 1 { "" } else { "s" }
            ));
            Ok(topic_partitions(conn, topic)?)
        }
        found => Ok(found?),
    }
}

/// A mutex's contents even if a worker panicked holding it: that worker's
/// failure is reported when it is joined, not as a panic in every other.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the workers of this process are handed.
struct Plan {
    config: KafkaSourceConfig,
    scoring: Scoring,
    learn_in_background: bool,
    predict_all_outputs: bool,
    epochs_in_flight: u64,
    max_staleness: Option<u64>,
    /// Workers in this process.
    workers: usize,
    serving: Serving,
    /// How process 0 opens the stream: worker 0's.
    leader: Mutex<Option<Leader>>,
    /// Each worker's producers, by its index in this process.
    producers: Mutex<Vec<Option<(PredictionProducer, DeadLetterProducer)>>>,
}

/// Process 0's opening of the stream: its word to the cluster and its
/// checkpoint store.
type Leader = Box<dyn FnOnce() -> Result<(Word, Option<CheckpointStore>)> + Send>;

/// One worker: hears where the cluster starts, opens its share of the
/// partitions there, and serves until the cluster stops.
fn serve_worker(worker: &mut Worker, plan: &Plan) -> WorkerOutcome {
    let leader = match worker.index() {
        0 => locked(&plan.leader).take(),
        _ => None,
    };
    let (word, store) = match leader.map(|open| open()).transpose() {
        Ok(opened) => opened.map_or((None, None), |(word, store)| (Some(word), store)),
        // The others hear no word and stop; this worker says why.
        Err(error) => {
            let _ = share_opening(worker, None);
            return WorkerOutcome::failed(format!("{error:#}"));
        }
    };
    let opening = match share_opening(worker, word.as_ref()) {
        Ok(Word(Some(opening))) => opening,
        Ok(Word(None)) => return WorkerOutcome::default(),
        Err(error) => return WorkerOutcome::failed(error),
    };
    let (predictions, dead) = locked(&plan.producers)[worker.index() % plan.workers]
        .take()
        .expect("opened for every worker of this process");
    let d = opening.scaling.x_mean.len();
    let mut config = plan.config.clone();
    config.mapping = config.mapping.with_dimension(d);
    let share = WorkerShare::new(worker.index(), worker.peers());
    let source = KafkaSource::open(&config, share, opening.resume.as_ref()).map_err(|e| e.to_string());
    let start = Start {
        options: GpOptions {
            scoring: plan.scoring,
            learned_through: opening.learned_through,
            predict_all_outputs: plan.predict_all_outputs,
            // serve's workers park when idle, as a background learner needs.
            learn_in_background: plan.learn_in_background,
            max_staleness: plan.max_staleness,
            shards_on_own_cores: shards_on_own_cores(plan.workers),
            ..GpOptions::new(d)
        },
        learner: opening.learner,
        epochs_in_flight: plan.epochs_in_flight,
    };
    let kit = Equipment {
        source,
        predictions,
        dead,
        store,
        checkpointing: opening.checkpointing,
        scaling: opening.scaling,
    };
    let mut ends = KafkaEnds::new(worker, plan.serving.clone(), kit);
    wiring::run_worker(worker, &start, &mut ends);
    ends.outcome()
}

/// What process 0 finds before it serves: the checkpoint store, its newest
/// checkpoint and the scaling kept beside it, and `--model`'s model when no
/// checkpoint is newer.
struct Beginning {
    store: Option<CheckpointStore>,
    resumed: Option<Checkpoint<KafkaPosition>>,
    saved_scaling: Option<Standardizer>,
    warm: Option<SavedModel>,
}

impl Beginning {
    fn read(args: &ServeArgs, likelihood: &Likelihood) -> Result<Beginning> {
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
        if let (Some(path), true) = (&args.warm_start, args.model.any_given()) {
            bail!(
                "--model {} runs with the saved model's settings: drop the model flags",
                path.display()
            );
        }
        // A checkpoint is newer than any model it started from.
        let warm = match (&resumed, &args.warm_start) {
            (None, Some(path)) => {
                let model = SavedModel::load(path)?;
                model.check_fits(path, likelihood, None)?;
                Some(model)
            }
            _ => None,
        };
        Ok(Beginning {
            store,
            resumed,
            saved_scaling,
            warm,
        })
    }

    /// What the start line says of the model.
    fn model_from<'a>(&self, args: &'a ServeArgs) -> ModelFrom<'a> {
        match (&self.resumed, &self.warm, &args.warm_start) {
            (Some(c), _, given) => ModelFrom::Checkpoint {
                epoch: c.epoch,
                over_model: given.is_some(),
            },
            (None, Some(model), Some(path)) => ModelFrom::Saved {
                path,
                epoch: model.epoch,
            },
            _ => ModelFrom::Prior {
                scaling_known: self.saved_scaling.is_some(),
            },
        }
    }

    /// Where the cluster starts: the newest checkpoint that reads back, else
    /// `--model`'s model, else a fresh model on the first records'
    /// standardisation (read here); and the checkpoint store.
    fn opening(
        self,
        args: &ServeArgs,
        config: &KafkaSourceConfig,
        settings: &Settings,
        likelihood: Likelihood,
        stop: &AtomicBool,
    ) -> Result<(Word, Option<CheckpointStore>)> {
        let Beginning {
            store,
            resumed,
            saved_scaling,
            warm,
        } = self;
        if let Some(model) = warm {
            // Nothing was checkpointed under another standardisation: the model's is the stream's.
            if let Some(dir) = &args.checkpoint_dir {
                write_scaling(dir, &model.scaling)?;
            }
            let opening = Opening {
                learned_through: Some(model.epoch),
                learner: model.learner,
                // The epochs go on from the model's; the offsets are the group's, as on any first start.
                resume: Some(KafkaPosition {
                    topic: config.topic.clone(),
                    next_epoch: model.epoch + 1,
                    offsets: Default::default(),
                }),
                scaling: model.scaling,
                checkpointing: store.is_some(),
            };
            return Ok((Word(Some(opening)), store));
        }
        let resume = resumed.as_ref().and_then(|c| KafkaPosition::merge(&c.positions));
        let scaling = match saved_scaling {
            Some(s) => s,
            None => {
                let Some(first) = first_records(config, resume.as_ref(), args, stop)? else {
                    return Ok((Word(None), store));
                };
                let d = first[0].features.len();
                let s = Standardizer::fit_records(&first, d, &likelihood);
                if let Some(dir) = &args.checkpoint_dir {
                    write_scaling(dir, &s)?;
                }
                s
            }
        };
        let opening = Opening {
            learned_through: resumed.as_ref().map(|c| c.epoch),
            // Serve's inducing inputs are the learner's choice (no first rows).
            learner: match resumed {
                Some(c) => c.learner,
                None => fresh_learner(settings, likelihood, &[], &scaling)?,
            },
            resume,
            scaling,
            checkpointing: store.is_some(),
        };
        Ok((Word(Some(opening)), store))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary names the epochs the predictions carry, and says of
    /// epochs read after them that they brought nothing.
    #[test]
    fn the_summary_names_the_epochs_of_the_records_and_what_came_after() {
        let summary = ServeSummary {
            records: 300,
            predictions: 300,
            updates: 4,
            epochs: 19,
            epochs_read: Some((0, 18)),
            epochs_with_records: Some((0, 8)),
            learned_through: Some(8),
            committed_epoch: Some(8),
            ..ServeSummary::default()
        };
        let alone = ClusterArgs::default();
        assert_eq!(
            summary.line(&alone),
            "300 records scored in epochs 0–8, 300 predictions sent, 0 dead letters; 4 updates (0 failed), \
             the model learned through epoch 8; offsets committed through epoch 8"
        );
        // Without checkpoints, the empty epochs' positions are committed too.
        let uncheckpointed = ServeSummary {
            committed_epoch: Some(18),
            ..summary.clone()
        };
        assert!(uncheckpointed
            .line(&alone)
            .ends_with("offsets committed through epoch 18 (epochs 9–18 brought no records)"));
        let behind = ServeSummary {
            committed_epoch: Some(6),
            ..summary.clone()
        };
        assert!(behind.line(&alone).ends_with("read again on a restart"));
        let second = ClusterArgs {
            processes: 2,
            process: 1,
            hostfile: None,
        };
        assert!(summary
            .line(&second)
            .ends_with("; process 1 of 2: process 0 checkpoints and commits"));
    }
}
