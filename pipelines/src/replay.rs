//! `dualgp replay`: a backtest. A Parquet file is streamed in row order, cut
//! into epochs of `--batch-size` rows, and every record is scored by the
//! model of the epochs before it, then learned from (prequential). The
//! flags, the output columns and the report are a contract
//! (docs/EVALUATION.md): extend, never rename.
//!
//! Inputs (and the target, for regression) are standardised with the first
//! epoch's statistics, fixed from then on, so nothing is learned from rows
//! that have not arrived yet; predictions are written on the data's own scale.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::{
    ColumnMapping, Counters, DeadLetter, DeadLetterWriter, EpochRule, ParquetSource, ParquetSourceConfig,
    PredictionLayout, PredictionWriter, ReasonKind, WorkerShare,
};
use dualgp_operators::dataflow::{GpOptions, LearnGp, Prediction, Record, Scoring};
use dualgp_operators::model::{Likelihood, Predictive, SequentialLearner, StreamingLearner};
use nalgebra::DMatrix;
use serde::Serialize;
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle};

use crate::model_args::{check_workers, ModelArgs};
use crate::protocol::Standardizer;

#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    #[arg(long)]
    pub data: PathBuf,
    /// Predictions: one row per input row (`id`, `epoch`, `mean`/`var` or class probabilities).
    #[arg(long)]
    pub output: PathBuf,
    /// gaussian | bernoulli[:logit] | poisson | student-t | softmax:C
    #[arg(long)]
    pub likelihood: String,
    /// Rows per epoch: the model learns after each.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: u64,
    /// Dataflow worker threads; the output is the same for any count.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
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
    #[arg(long, default_value_t = 2)]
    pub epochs_in_flight: u64,
    /// prequential: epoch e scored by the model of the epochs before it, the
    /// same on any number of workers; on-arrival: as `serve` scores (timing-dependent).
    #[arg(long, default_value_t = Scoring::Prequential)]
    pub scoring: Scoring,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub data: String,
    pub likelihood: String,
    pub workers: usize,
    pub epochs: u64,
    /// Rows scored (one output row each).
    pub records: u64,
    pub dead_letters: u64,
    /// Dead letters by reason (`non_finite`, `invalid_label`, …).
    pub dead_letter_reasons: BTreeMap<ReasonKind, u64>,
    pub seconds: f64,
    pub records_per_second: f64,
    /// Mean negative log predictive density of the labelled rows, each scored before it was learned.
    pub prequential_nlpd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequential_rmse: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequential_accuracy: Option<f64>,
    /// Epochs whose batch could not be learned, with the reason (the model stayed as it was).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_updates: Vec<(u64, String)>,
    /// The prequential figures of each epoch.
    pub epoch_scores: Vec<EpochScore>,
}

/// One epoch's labelled rows, each scored before the model learned from it.
#[derive(Debug, Clone, Serialize)]
pub struct EpochScore {
    pub epoch: u64,
    pub labelled: u64,
    pub nlpd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rmse: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
}

/// A replay's report, the model after the last epoch (on standardised data)
/// and the standardisation between the two.
pub struct ReplayOutcome {
    pub report: ReplayReport,
    pub learner: Option<SequentialLearner>,
    pub scaling: Standardizer,
    /// Kernel and likelihood hyperparameters after each update, by name.
    pub hyperparameters: Vec<(u64, Vec<(String, f64)>)>,
}

/// What the workers hand to the writer (worker 0), by epoch.
#[derive(Default)]
struct Collected {
    predictions: BTreeMap<u64, Vec<Prediction>>,
    dead_letters: BTreeMap<u64, Vec<DeadLetter>>,
    labels: BTreeMap<i64, f64>,
    failed_updates: Vec<(u64, String)>,
    last_model: Option<SequentialLearner>,
    hyperparameters: Vec<(u64, Vec<(String, f64)>)>,
    counters: Counters,
    error: Option<String>,
}

/// Streams `args.data` through the learner and writes predictions; `progress`
/// is told `(epochs done, epochs)`.
pub fn run(args: &ReplayArgs, progress: impl FnMut(u64, u64) + Send + 'static) -> Result<ReplayOutcome> {
    let likelihood = Likelihood::parse(&args.likelihood).map_err(|e| anyhow::anyhow!("--likelihood: {e}"))?;
    let settings = args.model.settings()?;
    check_workers(args.workers)?;
    if args.batch_size == 0 {
        bail!("--batch-size 0: give at least one row per epoch");
    }
    if args.epochs_in_flight == 0 {
        bail!("--epochs-in-flight 0: allow at least one epoch in flight");
    }
    let config = ParquetSourceConfig {
        mapping: ColumnMapping::for_likelihood(&likelihood),
        epochs: EpochRule::Rows(args.batch_size),
        ..ParquetSourceConfig::default()
    };
    let (first, d, n_epochs) = first_epoch(&args.data, &config)?;
    let scaling = Standardizer::fit_records(&first, d, &likelihood);
    let mut learner = SequentialLearner::new(
        settings.kernel(d),
        settings.likelihood(likelihood.clone()),
        settings.sequential.clone(),
    )?;
    if settings.z_first_rows && !first.is_empty() {
        let m = settings.sequential.inducing.min(first.len());
        let z = DMatrix::from_fn(m, d, |i, j| scaling.record(first[i].clone()).features[j]);
        learner = learner.with_inducing(z)?;
    }

    let layout = PredictionLayout::for_likelihood(&likelihood);
    let writer = PredictionWriter::create(&args.output, layout)
        .with_context(|| format!("cannot write predictions to {}", args.output.display()))?;
    let dead_path = args
        .dead_letters
        .clone()
        .unwrap_or_else(|| dead_letter_path(&args.output));
    let sinks = Arc::new(Mutex::new(Some(Sinks {
        predictions: writer,
        dead: None,
        dead_path,
        scores: Scores::default(),
        progress: Box::new(progress),
        n_epochs,
    })));
    let collected = Arc::new(Mutex::new(Collected::default()));

    let started = Instant::now();
    let (path, in_flight, scoring) = (args.data.clone(), args.epochs_in_flight, args.scoring);
    let shared = (Arc::clone(&collected), Arc::clone(&sinks), scaling.clone());
    let workers = timely::execute(timely::Config::process(args.workers), move |worker| {
        let (collected, sinks, scaling) = (&shared.0, &shared.1, &shared.2);
        let share = WorkerShare::new(worker.index(), worker.peers());
        let mut input = InputHandleVec::new();
        let probe = ProbeHandle::new();
        let (c1, c2, c3) = (Arc::clone(collected), Arc::clone(collected), Arc::clone(collected));
        worker.dataflow::<u64, _, _>(|scope| {
            let options = GpOptions {
                scoring,
                ..GpOptions::new(d)
            };
            let gp = scope
                .input_from(&mut input)
                .learn_gp_with(None, learner.clone(), options);
            gp.predictions
                .inspect(move |p| {
                    c1.lock()
                        .unwrap()
                        .predictions
                        .entry(p.epoch)
                        .or_default()
                        .push(p.clone())
                })
                .probe_with(&probe);
            gp.rejected
                .inspect(move |r| {
                    let mut c = c2.lock().unwrap();
                    c.labels.remove(&r.record.id);
                    let dead = DeadLetter::refused(r);
                    c.counters.add(0, std::slice::from_ref(&dead));
                    c.dead_letters.entry(r.epoch).or_default().push(dead);
                })
                .probe_with(&probe);
            gp.updates
                .inspect(move |u| {
                    let mut c = c3.lock().unwrap();
                    if let Err(why) = &u.outcome {
                        c.failed_updates.push((u.epoch, why.clone()));
                    }
                    c.hyperparameters.push((u.epoch, u.learner.hyperparameters()));
                    c.last_model = Some(u.learner.clone());
                })
                .probe_with(&probe);
        });

        let writer = worker.index() == 0;
        let flush = |probe: &ProbeHandle<u64>| {
            if writer {
                let done = probe.with_frontier(|f| f.first().copied()).unwrap_or(u64::MAX);
                write_done_epochs(collected, sinks, scaling, done);
            }
        };
        match ParquetSource::open(&path, &config, share, None) {
            Err(e) => {
                collected.lock().unwrap().error.get_or_insert(e.to_string());
            }
            Ok(mut source) => loop {
                match source.next_epoch() {
                    Ok(Some(part)) => {
                        let mut c = collected.lock().unwrap();
                        c.counters.add(part.records.len(), &part.dead_letters);
                        c.dead_letters.entry(part.epoch).or_default().extend(part.dead_letters);
                        for record in part.records {
                            if let Some(y) = record.label {
                                c.labels.insert(record.id, y);
                            }
                            input.send(scaling.record(record));
                        }
                        drop(c);
                        input.advance_to(part.epoch + 1);
                        while probe.less_than(&(part.epoch + 1).saturating_sub(in_flight)) {
                            worker.step_or_park(None);
                            flush(&probe);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        collected.lock().unwrap().error.get_or_insert(e.to_string());
                        break;
                    }
                }
            },
        };
        drop(input);
        while worker.step_or_park(None) {
            flush(&probe);
        }
        flush(&probe);
    })
    .map_err(|e| anyhow::anyhow!("cannot start {} workers: {e}", args.workers))?;
    for result in workers.join() {
        result.map_err(|e| anyhow::anyhow!("a worker failed: {e}"))?;
    }
    let seconds = started.elapsed().as_secs_f64();

    let collected = std::mem::take(&mut *collected.lock().unwrap());
    if let Some(error) = collected.error {
        bail!("{error}");
    }
    let sinks = sinks.lock().unwrap().take().context("the writer was lost")?;
    if let Some(error) = sinks.scores.error {
        bail!("{error}");
    }
    let (scores, dead_rows) = sinks.finish()?;
    let report = ReplayReport {
        data: args.data.display().to_string(),
        likelihood: likelihood.name(),
        workers: args.workers,
        epochs: n_epochs,
        records: scores.records,
        dead_letters: dead_rows,
        dead_letter_reasons: collected.counters.dead_letters,
        seconds,
        records_per_second: scores.records as f64 / seconds.max(1e-9),
        prequential_nlpd: scores.nlpd(),
        prequential_rmse: scores.rmse(),
        prequential_accuracy: scores.accuracy(),
        failed_updates: collected.failed_updates,
        epoch_scores: scores.epochs,
    };
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    Ok(ReplayOutcome {
        report,
        learner: collected.last_model,
        scaling,
        hyperparameters: collected.hyperparameters,
    })
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
    fn finish(self) -> Result<(Scores, u64)> {
        self.predictions.finish()?;
        let dead = match self.dead {
            Some(w) => w.finish()?,
            None => 0,
        };
        Ok((self.scores, dead))
    }
}

/// Writes every epoch before `done`: predictions sorted by id, on the data's
/// scale, and dead letters; scores the labelled ones.
fn write_done_epochs(collected: &Mutex<Collected>, sinks: &Mutex<Option<Sinks>>, scaling: &Standardizer, done: u64) {
    let mut c = collected.lock().unwrap();
    let mut guard = sinks.lock().unwrap();
    let Some(s) = guard.as_mut() else { return };
    let epochs: Vec<u64> = c.predictions.range(..done).map(|(e, _)| *e).collect();
    for epoch in epochs {
        let mut predictions = c.predictions.remove(&epoch).unwrap_or_default();
        predictions.sort_by_key(|p| p.id);
        let predictions: Vec<Prediction> = predictions.into_iter().map(|p| scaling.prediction(p)).collect();
        let mut epoch_scores = Scores::default();
        for p in &predictions {
            if let Some(y) = c.labels.remove(&p.id) {
                epoch_scores.add(p, y);
            }
        }
        s.scores.merge(epoch_scores, epoch);
        if let Err(e) = s.predictions.write(&predictions) {
            s.scores.error.get_or_insert(format!("cannot write predictions: {e}"));
        }
        s.scores.records += predictions.len() as u64;
        (s.progress)(epoch + 1, s.n_epochs);
    }
    let dead: Vec<DeadLetter> = {
        let epochs: Vec<u64> = c.dead_letters.range(..done).map(|(e, _)| *e).collect();
        epochs
            .into_iter()
            .flat_map(|e| c.dead_letters.remove(&e).unwrap_or_default())
            .collect()
    };
    if !dead.is_empty() {
        let result = match &mut s.dead {
            Some(w) => w.write(&dead),
            None => DeadLetterWriter::create(&s.dead_path).and_then(|mut w| {
                let r = w.write(&dead);
                s.dead = Some(w);
                r
            }),
        };
        if let Err(e) = result {
            s.scores.error.get_or_insert(format!("cannot write dead letters: {e}"));
        }
    }
}

/// Prequential sums over labelled rows.
#[derive(Default)]
struct Scores {
    records: u64,
    labelled: u64,
    neg_log_density: f64,
    squared_error: f64,
    hits: u64,
    classes: bool,
    epochs: Vec<EpochScore>,
    error: Option<String>,
}

impl Scores {
    fn add(&mut self, p: &Prediction, y: f64) {
        let Some(log_density) = p.log_density else { return };
        self.labelled += 1;
        self.neg_log_density -= log_density;
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
            });
        }
        self.labelled += epoch.labelled;
        self.neg_log_density += epoch.neg_log_density;
        self.squared_error += epoch.squared_error;
        self.hits += epoch.hits;
        self.classes |= epoch.classes;
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
