//! `dualgp replay`: a backtest. A Parquet file is streamed in row order, cut
//! into epochs of `--batch-size` rows, and every record is scored by the
//! model of the epochs before it, then learned from (prequential). The
//! flags, the output columns and the report are a contract
//! (`../shared/docs/EVALUATION.md`, beside the repository): extend, never
//! rename. The wiring is `wiring.rs`'s; here are its Parquet ends.
//!
//! Inputs (and the target, for regression) are standardised with the first
//! epoch's statistics, fixed from then on, so nothing is learned from rows
//! that have not arrived yet; predictions are written on the data's own scale.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::{
    Counters, DeadLetter, DeadLetterWriter, EpochPart, EpochRule, Origin, ParquetPosition, ParquetSource,
    ParquetSourceConfig, PredictionColumns, PredictionWriter, ReasonKind, WorkerShare,
};
use dualgp_operators::dataflow::{GpOptions, GpStreams, ModelUpdate, Prediction, Record, Rejected, Scoring};
use dualgp_operators::model::{Likelihood, Predictive, SequentialLearner, StreamingLearner};
use serde::{Deserialize, Serialize};
use timely::dataflow::operators::{Exchange, Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle, Scope, StreamVec};
use timely::worker::Worker;

use crate::cluster::ClusterArgs;
use crate::column_args::ColumnArgs;
use crate::likelihood_args::LikelihoodArgs;
use crate::model_args::ModelArgs;
use crate::protocol::Standardizer;
use crate::saved_model::SavedModel;
use crate::wiring::{self, fresh_learner, shards_on_own_cores, Ends, Start};

/// `--epochs-in-flight`'s default: a backtest's records wait in the file,
/// so few epochs need to be held read ahead.
pub const EPOCHS_IN_FLIGHT: u64 = 2;

/// `dualgp replay`'s flags.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The rows to replay: a Parquet file, or CSV with a header row (a name ending in `.csv`).
    #[arg(long)]
    pub data: PathBuf,
    /// Which columns are the id, the features, the target and the output.
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// Predictions: one row per input row (`id`, `epoch`, `mean`/`var` or class probabilities).
    #[arg(long)]
    pub output: PathBuf,
    /// The likelihood of each output.
    #[command(flatten)]
    pub likelihood: LikelihoodArgs,
    /// A multi-output model's rows also hold every output's predictive
    /// (`output{d}_mean`, `output{d}_var`, `output{d}_p1`, …).
    #[arg(long)]
    pub predict_all_outputs: bool,
    /// Rows per epoch: the model learns after each.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: u64,
    /// Dataflow worker threads (per process); the output is the same for any count.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// The timely cluster this process is part of.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// How the model learns.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prequential metrics and throughput as JSON.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Rows that could not be used, with the reason (default: OUTPUT with `.dead-letters.parquet`,
    /// written only when there are some).
    #[arg(long)]
    pub dead_letters: Option<PathBuf>,
    /// Epochs read ahead of the learner at most (bounds memory).
    #[arg(long, default_value_t = EPOCHS_IN_FLIGHT)]
    pub epochs_in_flight: u64,
    /// prequential: epoch e scored by the model of the epochs before it, the
    /// same on any number of workers; on-arrival: as `serve` scores (timing-dependent).
    #[arg(long, default_value_t = Scoring::Prequential)]
    pub scoring: Scoring,
    /// Start from this model, and its standardisation, instead of the prior:
    /// a file `--save-model` wrote, or a checkpoint; the epochs go on from the model's.
    #[arg(long = "model", value_name = "FILE")]
    pub warm_start: Option<PathBuf>,
    /// Save the model after the last epoch, with its standardisation, for
    /// `serve --model` (going live after a backtest).
    #[arg(long, value_name = "FILE")]
    pub save_model: Option<PathBuf>,
    /// Draw the run as SVG in this directory, as the demo does: prequential
    /// NLPD and RMSE by epoch, the hyperparameters after each update, and
    /// with two inputs the posterior's map.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
}

impl ReplayArgs {
    /// `dualgp replay --data DATA --output OUTPUT --likelihood …` with every
    /// other flag at its default: for programs that replay a file.
    pub fn new(data: PathBuf, output: PathBuf, likelihood: LikelihoodArgs) -> Self {
        ReplayArgs {
            data,
            columns: ColumnArgs::default(),
            output,
            likelihood,
            predict_all_outputs: false,
            batch_size: 1000,
            workers: 1,
            cluster: ClusterArgs::default(),
            model: ModelArgs::default(),
            report: None,
            dead_letters: None,
            epochs_in_flight: EPOCHS_IN_FLIGHT,
            scoring: Scoring::Prequential,
            warm_start: None,
            save_model: None,
            plots: None,
        }
    }
}

/// `dualgp replay`'s JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The data file.
    pub data: String,
    /// `--likelihood` as given.
    pub likelihood: String,
    /// Worker threads per process.
    pub workers: usize,
    /// Processes of the timely cluster (1: one process).
    pub processes: usize,
    /// Epochs replayed.
    pub epochs: u64,
    /// Rows scored (one output row each).
    pub records: u64,
    /// Rows that could not be used.
    pub dead_letters: u64,
    /// Dead letters by reason (`non_finite`, `invalid_label`, …).
    pub dead_letter_reasons: BTreeMap<ReasonKind, u64>,
    /// Wall-clock seconds of the replay.
    pub seconds: f64,
    /// Rows scored per second.
    pub records_per_second: f64,
    /// Mean negative log predictive density of the labelled rows, each scored before it was learned.
    pub prequential_nlpd: f64,
    /// The same rows' RMSE (real labels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequential_rmse: Option<f64>,
    /// The same rows' accuracy (classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequential_accuracy: Option<f64>,
    /// A multi-output model's prequential NLPD of each output's labelled
    /// rows, keyed by output (`"0"`, `"1"`, …; outputs without labelled rows
    /// left out); absent for a single-output model.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prequential_nlpd_by_output: BTreeMap<String, f64>,
    /// Epochs whose batch could not be learned, with the reason (the model stayed as it was).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_updates: Vec<(u64, String)>,
    /// The prequential figures of each epoch.
    pub epoch_scores: Vec<EpochScore>,
    /// The updates that discounted the past (`--forget-half-life`), by epoch,
    /// with what each left of its weight; under `auto`, where the stream moved.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub discounts: Vec<(u64, f64)>,
    /// The kernel and likelihood hyperparameters after each update, on the
    /// standardised scale, by name.
    pub hyperparameters: Vec<EpochHyperparameters>,
}

/// The hyperparameters the update of `epoch` ended with.
#[derive(Debug, Clone, Serialize)]
pub struct EpochHyperparameters {
    /// The epoch.
    pub epoch: u64,
    /// The hyperparameters by name.
    pub values: BTreeMap<String, f64>,
}

/// One epoch's labelled rows, each scored before the model learned from it.
#[derive(Debug, Clone, Serialize)]
pub struct EpochScore {
    /// The epoch.
    pub epoch: u64,
    /// Its labelled rows.
    pub labelled: u64,
    /// Their mean negative log predictive density.
    pub nlpd: f64,
    /// Their RMSE (real labels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rmse: Option<f64>,
    /// Their accuracy (classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// How far their NLPD lies above that of every labelled row before
    /// them, in standard errors (`(nlpd − mean) / (sd / √labelled)`, the
    /// earlier rows' mean and spread): a stream that moves away from what
    /// the model learned shows here first. Absent for the first epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<f64>,
}

/// A replay's report, the model after the last epoch (on standardised data)
/// and the standardisation between the two.
pub struct ReplayOutcome {
    /// The report.
    pub report: ReplayReport,
    /// The model after the last update, if there was one.
    pub learner: Option<SequentialLearner>,
    /// Between the data's scale and the model's.
    pub scaling: Standardizer,
    /// Kernel and likelihood hyperparameters after each update, by name.
    pub hyperparameters: Vec<(u64, Vec<(String, f64)>)>,
}

/// What a reader sends worker 0 beside its records, timestamped by epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum ReaderNote {
    /// A labelled record's label on the data's scale: its prediction is scored against it.
    Label { epoch: u64, id: i64, y: f64 },
    /// A row the source could not use, as JSON: `DeadLetter`'s tagged enums
    /// do not pass through timely's bincode between processes.
    DeadLetter { epoch: u64, json: String },
    /// Why this reader stopped before the end of its share.
    Failed(String),
}

/// What worker 0 gathers from every worker, through the dataflow.
#[derive(Default)]
struct Gathered {
    predictions: BTreeMap<u64, Vec<Prediction>>,
    dead_letters: BTreeMap<u64, Vec<DeadLetter>>,
    /// Labels by epoch and id; `None` where copies under one id disagree
    /// (the learner refuses them all, and scores none, prequentially).
    labels: BTreeMap<(u64, i64), Option<f64>>,
    counters: Counters,
    failed_updates: Vec<(u64, String)>,
    last_model: Option<SequentialLearner>,
    hyperparameters: Vec<(u64, Vec<(String, f64)>)>,
    discounts: Vec<(u64, f64)>,
    error: Option<String>,
}

impl Gathered {
    fn predicted(&mut self, p: &Prediction) {
        self.predictions.entry(p.epoch).or_default().push(p.clone());
    }

    fn refused(&mut self, rejected: &Rejected) {
        self.dead(rejected.epoch, DeadLetter::refused(rejected));
    }

    fn updated(&mut self, update: &ModelUpdate) {
        match &update.outcome {
            Err(why) => self.failed_updates.push((update.epoch, why.clone())),
            Ok(report) if report.discount < 1.0 => self.discounts.push((update.epoch, report.discount)),
            Ok(_) => {}
        }
        self.hyperparameters
            .push((update.epoch, update.learner.hyperparameters()));
        self.last_model = Some(update.learner.clone());
    }

    fn noted(&mut self, note: &ReaderNote) {
        match note {
            ReaderNote::Label { epoch, id, y } => {
                let label = self.labels.entry((*epoch, *id)).or_insert(Some(*y));
                if label.is_some_and(|seen| seen.to_bits() != y.to_bits()) {
                    *label = None;
                }
            }
            ReaderNote::DeadLetter { epoch, json } => match serde_json::from_str(json) {
                Ok(letter) => self.dead(*epoch, letter),
                Err(e) => self.fail(format!("a dead letter did not read back: {e}")),
            },
            ReaderNote::Failed(why) => self.fail(why.clone()),
        }
    }

    fn dead(&mut self, epoch: u64, letter: DeadLetter) {
        self.counters.add(0, std::slice::from_ref(&letter));
        self.dead_letters.entry(epoch).or_default().push(letter);
    }

    fn fail(&mut self, why: String) {
        self.error.get_or_insert(why);
    }
}

/// What every worker of every process needs to replay its share.
struct Plan {
    data: PathBuf,
    source: ParquetSourceConfig,
    start: Start,
    scaling: Standardizer,
    /// The number of the file's first epoch (after a warm start's model's).
    first_epoch: u64,
}

/// What worker 0 ends with: what it gathered, and the sinks it wrote to.
type Written = (Gathered, Sinks);

/// Streams `args.data` through the learner and writes predictions; `progress`
/// is told `(epochs done, epochs)`. In a cluster every process reads and
/// learns its share, and process 0, which holds worker 0, writes the
/// predictions, the dead letters and the report: the others return `None`.
pub fn run(args: &ReplayArgs, progress: impl FnMut(u64, u64) + Send + 'static) -> Result<Option<ReplayOutcome>> {
    let timely_config = args.cluster.timely_config(args.workers)?;
    let likelihood = args.likelihood.parse()?;
    let settings = args.model.settings_for_stream(args.columns.time_column.is_some())?;
    if args.batch_size == 0 {
        bail!("--batch-size 0: give at least one row per epoch");
    }
    if args.epochs_in_flight == 0 {
        bail!("--epochs-in-flight 0: allow at least one epoch in flight");
    }
    let source = ParquetSourceConfig {
        mapping: args.columns.mapping(&likelihood)?,
        epochs: EpochRule::Rows(args.batch_size),
        ..ParquetSourceConfig::default()
    };
    let (first, d, n_epochs) = first_epoch(&args.data, &source)?;
    let (scaling, learner, learned_through) = match &args.warm_start {
        Some(path) => {
            if args.model.any_given() {
                bail!(
                    "--model {} runs with the saved model's settings: drop the model flags",
                    path.display()
                );
            }
            let model = SavedModel::load(path)?;
            model.check_fits(path, &likelihood, Some(d))?;
            (model.scaling, model.learner, Some(model.epoch))
        }
        None => {
            let scaling = Standardizer::fit_records(&first, d, &likelihood);
            let learner = fresh_learner(&settings, likelihood.clone(), &first, &scaling)?;
            (scaling, learner, None)
        }
    };
    // A warm start's epochs go on from the model's.
    let first_epoch = learned_through.map_or(0, |e| e + 1);
    let mut progress = progress;
    let progress = move |done: u64, total| progress(done - first_epoch, total);
    let sinks = match args.cluster.writes_outputs() {
        true => Some(Sinks::create(args, &likelihood, n_epochs, Box::new(progress))?),
        false => None,
    };
    let plan = Plan {
        data: args.data.clone(),
        source,
        start: Start {
            learner,
            options: GpOptions {
                scoring: args.scoring,
                predict_all_outputs: args.predict_all_outputs,
                learned_through,
                shards_on_own_cores: shards_on_own_cores(args.workers),
                ..GpOptions::new(d)
            },
            epochs_in_flight: args.epochs_in_flight,
        },
        scaling: scaling.clone(),
        first_epoch,
    };

    let started = Instant::now();
    let Some((gathered, sinks)) = execute(timely_config, plan, sinks)? else {
        return Ok(None);
    };
    let seconds = started.elapsed().as_secs_f64();
    if let Some(error) = gathered.error {
        bail!("{error}");
    }
    if let Some(error) = sinks.scores.error {
        bail!("{error}");
    }
    let (scores, dead_rows) = sinks.finish()?;
    let report = ReplayReport {
        data: args.data.display().to_string(),
        likelihood: likelihood.name(),
        workers: args.workers,
        processes: args.cluster.processes,
        epochs: n_epochs,
        records: scores.records,
        dead_letters: dead_rows,
        dead_letter_reasons: gathered.counters.dead_letters,
        seconds,
        records_per_second: scores.records as f64 / seconds.max(1e-9),
        prequential_nlpd: scores.nlpd(),
        prequential_rmse: scores.rmse(),
        prequential_accuracy: scores.accuracy(),
        prequential_nlpd_by_output: scores.nlpd_by_output(),
        failed_updates: gathered.failed_updates,
        epoch_scores: scores.epochs,
        discounts: gathered.discounts,
        hyperparameters: gathered
            .hyperparameters
            .iter()
            .map(|(epoch, named)| EpochHyperparameters {
                epoch: *epoch,
                values: named.iter().cloned().collect(),
            })
            .collect(),
    };
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    if let Some(path) = &args.save_model {
        let (Some(learner), Some((epoch, _))) = (&gathered.last_model, gathered.hyperparameters.last()) else {
            bail!(
                "--save-model {}: no epoch was learned (no labelled rows), so there is no model to save",
                path.display()
            );
        };
        let model = SavedModel {
            learner: learner.clone(),
            scaling: scaling.clone(),
            epoch: *epoch,
        };
        model.save(path)?;
    }
    Ok(Some(ReplayOutcome {
        report,
        learner: gathered.last_model,
        scaling,
        hyperparameters: gathered.hyperparameters,
    }))
}

/// What a process other than 0 says when its share is done.
pub fn elsewhere(args: &ReplayArgs) -> String {
    format!(
        "process {} of {} replayed its share; process 0 writes the predictions to {}",
        args.cluster.process,
        args.cluster.processes,
        args.output.display()
    )
}

/// Runs `plan` on every worker of this process. Worker 0 (in process 0)
/// takes `sinks` and hands them back with what it gathered; a worker that
/// could not read its share fails the run here too.
fn execute(config: timely::Config, plan: Plan, sinks: Option<Sinks>) -> Result<Option<Written>> {
    let handoff = Mutex::new(sinks);
    let ended = wiring::execute(config, move |worker| {
        let sinks = match worker.index() {
            0 => handoff.lock().unwrap_or_else(PoisonError::into_inner).take(),
            _ => None,
        };
        let mut ends = ParquetEnds::new(&plan, WorkerShare::new(worker.index(), worker.peers()), sinks);
        wiring::run_worker(worker, &plan.start, &mut ends);
        ends.finish()
    })?;
    let mut written = None;
    for w in ended {
        if let Some(w) = w.map_err(|why| anyhow::anyhow!("{why}"))? {
            written = Some(w);
        }
    }
    Ok(written)
}

/// Replay's ends on one worker: its share of the file (its row groups) in;
/// predictions, dead letters and labels to worker 0, which, given the sinks,
/// writes each epoch once all of it has reached it.
struct ParquetEnds<'p> {
    plan: &'p Plan,
    share: WorkerShare,
    source: Option<ParquetSource>,
    /// What worker 0 needs beside the records; `None` once closed.
    notes: Option<InputHandleVec<u64, ReaderNote>>,
    gathered: Rc<RefCell<Gathered>>,
    sinks: Option<Sinks>,
    /// Why this worker stopped reading before the end of its share.
    failure: Option<String>,
}

impl<'p> ParquetEnds<'p> {
    fn new(plan: &'p Plan, share: WorkerShare, sinks: Option<Sinks>) -> Self {
        ParquetEnds {
            plan,
            share,
            source: None,
            notes: Some(InputHandleVec::new()),
            gathered: Rc::default(),
            sinks,
            failure: None,
        }
    }

    fn notes(&mut self) -> &mut InputHandleVec<u64, ReaderNote> {
        self.notes.as_mut().expect("open until the records are")
    }

    /// The next epoch of this worker's share; the file is opened at the first.
    fn next_part(&mut self) -> Result<Option<EpochPart<ParquetPosition>>, String> {
        let source = match &mut self.source {
            Some(source) => source,
            None => {
                let opened = ParquetSource::open(&self.plan.data, &self.plan.source, self.share, None);
                self.source.insert(opened.map_err(|e| e.to_string())?)
            }
        };
        let first = self.plan.first_epoch;
        let part = source.next_epoch().map_err(|e| e.to_string())?;
        Ok(part.map(|part| EpochPart {
            epoch: part.epoch + first,
            ..part
        }))
    }

    /// Sends one epoch's part: records standardised, the rest as notes.
    fn send(&mut self, part: EpochPart<ParquetPosition>, records: &mut InputHandleVec<u64, Record>) {
        let notes = self.notes.as_mut().expect("open until the records are");
        // At their epoch already, but for a warm start's first.
        records.advance_to(part.epoch);
        notes.advance_to(part.epoch);
        for letter in &part.dead_letters {
            notes.send(match serde_json::to_string(letter) {
                Ok(json) => ReaderNote::DeadLetter {
                    epoch: part.epoch,
                    json,
                },
                Err(e) => ReaderNote::Failed(format!("cannot pass on a dead letter: {e}")),
            });
        }
        for record in part.records {
            if let Some(y) = record.label {
                notes.send(ReaderNote::Label {
                    epoch: part.epoch,
                    id: record.id,
                    y,
                });
            }
            records.send(self.plan.scaling.record(record));
        }
        notes.advance_to(part.epoch + 1);
    }

    /// Worker 0's gatherings and sinks, or why this worker failed.
    fn finish(self) -> Result<Option<Written>, String> {
        match self.failure {
            Some(why) => Err(why),
            None => Ok(self.sinks.map(|s| (self.gathered.take(), s))),
        }
    }
}

impl Ends for ParquetEnds<'_> {
    const PARK: Option<Duration> = None;

    fn wire<'scope>(&mut self, scope: Scope<'scope, u64>, gp: GpStreams<'scope>, probe: &ProbeHandle<u64>) {
        let notes = scope.input_from(self.notes());
        gather_at_worker_zero(gp, notes, &self.gathered, probe);
    }

    fn read(&mut self, _: &mut Worker, records: &mut InputHandleVec<u64, Record>) -> Option<u64> {
        let part = match self.next_part() {
            Ok(part) => part?,
            Err(why) => {
                self.notes().send(ReaderNote::Failed(why.clone()));
                self.failure = Some(why);
                return None;
            }
        };
        let epoch = part.epoch;
        self.send(part, records);
        Some(epoch)
    }

    fn settle(&mut self, probe: &ProbeHandle<u64>, _: bool) {
        if let Some(sinks) = self.sinks.as_mut() {
            let done = probe.with_frontier(|f| f.first().copied()).unwrap_or(u64::MAX);
            write_done_epochs(&mut self.gathered.borrow_mut(), sinks, &self.plan.scaling, done);
        }
    }

    fn close(&mut self, _: &mut Worker, _: &ProbeHandle<u64>) {
        self.notes = None;
    }
}

/// Sends worker 0 what it writes and scores, and gathers it there. `probe`
/// passes an epoch once all of it has reached worker 0, from every process.
fn gather_at_worker_zero<'scope>(
    gp: GpStreams<'scope>,
    notes: StreamVec<'scope, u64, ReaderNote>,
    gathered: &Rc<RefCell<Gathered>>,
    probe: &ProbeHandle<u64>,
) {
    let g = Rc::clone(gathered);
    gp.predictions
        .exchange(|_| 0)
        .inspect(move |p| g.borrow_mut().predicted(p))
        .probe_with(probe);
    let g = Rc::clone(gathered);
    gp.rejected
        .exchange(|_| 0)
        .inspect(move |r| g.borrow_mut().refused(r))
        .probe_with(probe);
    let g = Rc::clone(gathered);
    notes
        .exchange(|_| 0)
        .inspect(move |n| g.borrow_mut().noted(n))
        .probe_with(probe);
    // Updates come from worker 0 already: it runs the reduction.
    let g = Rc::clone(gathered);
    gp.updates.inspect(move |u| g.borrow_mut().updated(u)).probe_with(probe);
}

/// The first epoch's valid records, the feature count and the number of
/// epochs. Also where a missing file or column is reported, before any work.
fn first_epoch(path: &Path, config: &ParquetSourceConfig) -> Result<(Vec<Record>, usize, u64)> {
    let mut source = ParquetSource::open(path, config, WorkerShare::ALONE, None)?;
    let d = source.feature_names().len();
    let n_epochs = source.n_epochs().unwrap_or(0);
    if n_epochs == 0 {
        bail!("{} has no rows to replay", path.display());
    }
    let first = source.next_epoch()?.map(|p| p.records).unwrap_or_default();
    Ok((first, d, n_epochs))
}

fn dead_letter_path(output: &Path) -> PathBuf {
    let stem = output
        .file_stem()
        .map_or_else(|| "predictions".into(), |s| s.to_string_lossy().into_owned());
    output.with_file_name(format!("{stem}.dead-letters.parquet"))
}

/// The writer side, on worker 0.
struct Sinks {
    predictions: PredictionWriter,
    dead: Option<DeadLetterWriter>,
    dead_path: PathBuf,
    scores: Scores,
    progress: Box<dyn FnMut(u64, u64) + Send>,
    n_epochs: u64,
}

impl Sinks {
    /// Opens the predictions file (it appears under its name once finished);
    /// the dead-letter file is created with the first dead letter.
    fn create(
        args: &ReplayArgs,
        likelihood: &Likelihood,
        n_epochs: u64,
        progress: Box<dyn FnMut(u64, u64) + Send>,
    ) -> Result<Sinks> {
        let columns = PredictionColumns::for_likelihood(likelihood, args.predict_all_outputs);
        let predictions = PredictionWriter::create(&args.output, columns)
            .with_context(|| format!("cannot write predictions to {}", args.output.display()))?;
        let dead_path = args
            .dead_letters
            .clone()
            .unwrap_or_else(|| dead_letter_path(&args.output));
        Ok(Sinks {
            predictions,
            dead: None,
            dead_path,
            scores: Scores::default(),
            progress,
            n_epochs,
        })
    }

    fn finish(self) -> Result<(Scores, u64)> {
        self.predictions.finish()?;
        let dead = match self.dead {
            Some(w) => w.finish()?,
            None => 0,
        };
        Ok((self.scores, dead))
    }

    fn write_dead_letters(&mut self, dead: &[DeadLetter]) {
        if dead.is_empty() {
            return;
        }
        let result = match &mut self.dead {
            Some(w) => w.write(dead),
            None => DeadLetterWriter::create(&self.dead_path).and_then(|mut w| {
                let r = w.write(dead);
                self.dead = Some(w);
                r
            }),
        };
        if let Err(e) = result {
            self.scores
                .error
                .get_or_insert(format!("cannot write dead letters: {e}"));
        }
    }
}

/// Writes every epoch before `done`: predictions sorted by id, on the data's
/// scale, and dead letters in row order; scores the labelled ones. The
/// sorting makes the files the same whichever worker sent what first.
fn write_done_epochs(g: &mut Gathered, s: &mut Sinks, scaling: &Standardizer, done: u64) {
    let epochs: Vec<u64> = g.predictions.range(..done).map(|(e, _)| *e).collect();
    for epoch in epochs {
        let mut predictions = g.predictions.remove(&epoch).unwrap_or_default();
        predictions.sort_by_key(|p| p.id);
        let predictions: Vec<Prediction> = predictions.into_iter().map(|p| scaling.prediction(p)).collect();
        let mut epoch_scores = Scores::default();
        for p in &predictions {
            if let Some(Some(y)) = g.labels.get(&(epoch, p.id)) {
                epoch_scores.add(p, *y);
            }
        }
        s.scores.merge(epoch_scores, epoch);
        if let Err(e) = s.predictions.write(&predictions) {
            s.scores.error.get_or_insert(format!("cannot write predictions: {e}"));
        }
        s.scores.records += predictions.len() as u64;
        (s.progress)(epoch + 1, s.n_epochs);
    }
    // Labels of written epochs (and of records refused in them) are done with.
    g.labels = g.labels.split_off(&(done, i64::MIN));
    let epochs: Vec<u64> = g.dead_letters.range(..done).map(|(e, _)| *e).collect();
    for epoch in epochs {
        let mut dead = g.dead_letters.remove(&epoch).unwrap_or_default();
        dead.sort_by(|a, b| file_row(a).cmp(&file_row(b)).then_with(|| a.payload.cmp(&b.payload)));
        s.write_dead_letters(&dead);
    }
}

/// A dead letter's row in the file; `None` for those the learner refused.
fn file_row(letter: &DeadLetter) -> Option<u64> {
    match letter.origin {
        Origin::File { row, .. } => Some(row),
        _ => None,
    }
}

/// Prequential sums over labelled rows.
#[derive(Default)]
struct Scores {
    records: u64,
    labelled: u64,
    neg_log_density: f64,
    /// `Σ (log p)²`, for the spread of the rows' NLPD.
    squared_log_density: f64,
    squared_error: f64,
    hits: u64,
    classes: bool,
    /// A multi-output model's labelled rows and their summed negative log
    /// densities, by output.
    by_output: BTreeMap<usize, (u64, f64)>,
    epochs: Vec<EpochScore>,
    error: Option<String>,
}

impl Scores {
    fn add(&mut self, p: &Prediction, y: f64) {
        let Some(log_density) = p.log_density else { return };
        self.labelled += 1;
        self.neg_log_density -= log_density;
        self.squared_log_density += log_density * log_density;
        if let Some(d) = p.output {
            let (n, sum) = self.by_output.entry(d).or_default();
            *n += 1;
            *sum -= log_density;
        }
        match &p.predictive {
            Predictive::Moments { mean, .. } => self.squared_error += (mean - y).powi(2),
            Predictive::Classes(probs) => {
                self.classes = true;
                let best = (0..probs.len())
                    .max_by(|&a, &b| probs[a].total_cmp(&probs[b]))
                    .unwrap_or(0);
                self.hits += u64::from(best as f64 == y);
            }
        }
    }

    /// Adds one epoch's sums and keeps its figures.
    fn merge(&mut self, epoch: Scores, index: u64) {
        if epoch.labelled > 0 {
            self.epochs.push(EpochScore {
                epoch: index,
                labelled: epoch.labelled,
                nlpd: epoch.nlpd(),
                rmse: epoch.rmse(),
                accuracy: epoch.accuracy(),
                drift: self.drift_of(&epoch),
            });
        }
        self.labelled += epoch.labelled;
        self.neg_log_density += epoch.neg_log_density;
        self.squared_log_density += epoch.squared_log_density;
        self.squared_error += epoch.squared_error;
        self.hits += epoch.hits;
        self.classes |= epoch.classes;
        for (d, (n, sum)) in epoch.by_output {
            let (total_n, total_sum) = self.by_output.entry(d).or_default();
            *total_n += n;
            *total_sum += sum;
        }
    }

    /// `epoch`'s NLPD against these rows' (see [`EpochScore::drift`]).
    fn drift_of(&self, epoch: &Scores) -> Option<f64> {
        let n = self.labelled as f64;
        let mean = self.nlpd();
        let sd = (self.squared_log_density / n - mean * mean).max(0.0).sqrt();
        (self.labelled > 1 && sd > 0.0).then(|| (epoch.nlpd() - mean) / (sd / (epoch.labelled as f64).sqrt()))
    }

    fn nlpd_by_output(&self) -> BTreeMap<String, f64> {
        self.by_output
            .iter()
            .map(|(d, (n, sum))| (d.to_string(), sum / *n as f64))
            .collect()
    }

    fn nlpd(&self) -> f64 {
        self.neg_log_density / self.labelled.max(1) as f64
    }

    fn rmse(&self) -> Option<f64> {
        (!self.classes && self.labelled > 0).then(|| (self.squared_error / self.labelled as f64).sqrt())
    }

    fn accuracy(&self) -> Option<f64> {
        self.classes.then(|| self.hits as f64 / self.labelled as f64)
    }
}
