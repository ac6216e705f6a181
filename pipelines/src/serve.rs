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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::kafka::{create_topic, dlq_topic, topic_partitions};
use dualgp_connectors::{
    ColumnMapping, DeadLetterProducer, KafkaConnection, KafkaPosition, KafkaSource, KafkaSourceConfig,
    PredictionProducer, StartOffset, WorkerShare,
};
use dualgp_operators::dataflow::{Checkpoint, CheckpointStore, GpOptions, Record, Scoring};
use dualgp_operators::model::Likelihood;
use serde::Serialize;
use timely::worker::Worker;

use crate::cluster::ClusterArgs;
use crate::metrics::{serve_http, Metrics};
use crate::model_args::{ModelArgs, Settings};
use crate::protocol::Standardizer;
use crate::wiring::{self, fresh_learner, Start};
use kafka_ends::{Equipment, KafkaEnds, Serving, WorkerOutcome};
use opening::{share_opening, Opening, Word};

/// `--epochs-in-flight`'s default. One update learns every epoch in flight,
/// so a learner that falls behind catches up in fewer, larger updates. (64
/// gave a lower p99 than 16 over 10 and 20 s at 10 000 records/s, a higher
/// one over 60 s: docs/PERFORMANCE.md, "Serving latency"; 16 bounds the lag and the state
/// more tightly.)
pub const EPOCHS_IN_FLIGHT: u64 = 16;

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
    /// A timely cluster: every process serves its workers' share of the partitions.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Stop cleanly once no worker (of any process) has had input for this many seconds.
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
    #[arg(long, default_value_t = EPOCHS_IN_FLIGHT)]
    pub epochs_in_flight: u64,
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

/// The first epoch's standardisation, kept beside the checkpoints.
pub(crate) const SCALING_FILE: &str = "scaling.json";

/// Serves until `stop` is set (SIGINT/SIGTERM), `--idle-exit`, or an error.
/// In a cluster every process serves its workers' share of the partitions;
/// process 0 decides where the cluster starts and writes the checkpoints.
pub fn run(args: &ServeArgs, stop: Arc<AtomicBool>) -> Result<ServeSummary> {
    let timely_config = args.cluster.timely_config(args.workers)?;
    let likelihood =
        Likelihood::parse_outputs(&args.likelihood, args.latents).map_err(|e| anyhow::anyhow!("--likelihood: {e}"))?;
    let settings = args.model.settings()?;
    if args.batch_size == 0 || args.batch_timeout_ms == 0 {
        bail!("--batch-size and --batch-timeout-ms must be above 0");
    }
    if !args.broker_timeout.is_finite() || args.broker_timeout <= 0.0 {
        bail!("--broker-timeout must be above 0 seconds");
    }
    if args.epochs_in_flight == 0 {
        bail!("--epochs-in-flight 0: allow at least one epoch in flight");
    }
    let mut conn = KafkaConnection::new(&args.brokers).with_timeout(Duration::from_secs_f64(args.broker_timeout));
    for (k, v) in &args.kafka_options {
        conn = conn.with_option(k, v);
    }
    topic_partitions(&conn, &args.input_topic)?;
    let leads = args.cluster.writes_outputs();
    if leads {
        create_topic(&conn, &args.output_topic, 1)?;
        create_topic(&conn, &dlq_topic(&args.input_topic), 1)?;
    }
    let config = KafkaSourceConfig {
        connection: conn.clone(),
        topic: args.input_topic.clone(),
        group_id: args.group_id.clone(),
        mapping: ColumnMapping::for_likelihood(&likelihood),
        epoch_records: args.batch_size,
        epoch_ms: args.batch_timeout_ms,
        start: StartOffset::Committed,
        ..KafkaSourceConfig::default()
    };
    // Process 0 alone reads the checkpoint directory; the others hear from it.
    let (word, store) = match leads {
        true => {
            let (word, store) = decide_opening(args, &config, &settings, likelihood, &stop)?;
            (Some(word), store)
        }
        false => (None, None),
    };

    let serving = Serving {
        metrics: Metrics::default(),
        stop,
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
        workers: args.workers,
        serving: serving.clone(),
        leader: Mutex::new(Some((word, store))),
        producers: Mutex::new(producers),
    };
    let joined = wiring::execute(timely_config, move |worker| serve_worker(worker, &plan));
    if let Some(endpoint) = endpoint {
        endpoint.stop();
    }
    let outcomes = joined?;
    if let Some(e) = outcomes.iter().find_map(|o| o.error.clone()) {
        bail!("{e}");
    }
    let metrics = &serving.metrics;
    Ok(ServeSummary {
        records: metrics.records_in.get(),
        predictions: metrics.predictions_out.get(),
        dead_letters: metrics.dead_letters.get(),
        epochs: metrics.epochs.get(),
        updates: metrics.updates.get(),
        failed_updates: metrics.updates_failed.get(),
        last_checkpoint: outcomes.iter().filter_map(|o| o.checkpointed).max(),
        committed_epoch: outcomes.iter().filter_map(|o| o.committed).max(),
    })
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
    /// Workers in this process.
    workers: usize,
    serving: Serving,
    /// Process 0's word to the cluster and its checkpoint store: worker 0's.
    leader: Mutex<Option<(Option<Word>, Option<CheckpointStore>)>>,
    /// Each worker's producers, by its index in this process.
    producers: Mutex<Vec<Option<(PredictionProducer, DeadLetterProducer)>>>,
}

/// One worker: hears where the cluster starts, opens its share of the
/// partitions there, and serves until the cluster stops.
fn serve_worker(worker: &mut Worker, plan: &Plan) -> WorkerOutcome {
    let (word, store) = match worker.index() {
        0 => locked(&plan.leader).take().unwrap_or_default(),
        _ => (None, None),
    };
    let opening = match share_opening(worker, word.as_ref()) {
        Ok(Word(Some(opening))) => opening,
        Ok(Word(None)) => return WorkerOutcome::default(),
        Err(error) => {
            return WorkerOutcome {
                error: Some(error),
                ..WorkerOutcome::default()
            }
        }
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

/// Process 0: where the cluster starts (the newest checkpoint that reads
/// back, or a fresh model on the first records' standardisation) and the
/// checkpoint store.
fn decide_opening(
    args: &ServeArgs,
    config: &KafkaSourceConfig,
    settings: &Settings,
    likelihood: Likelihood,
    stop: &AtomicBool,
) -> Result<(Word, Option<CheckpointStore>)> {
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
