//! `dualgp eval`: a learner on the paper-uci protocol (or a given test file),
//! reporting test metrics after every batch as JSON. The flags and the report
//! are a contract (`../shared/docs/EVALUATION.md`, beside the repository): extend, never rename.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::Table;
use dualgp_operators::model::dual::objective::named_hyperparameters;
use dualgp_operators::model::{Data, Likelihood, Metrics, MultiOutput, StreamingLearner};
use nalgebra::DVector;
use serde::Serialize;

use crate::column_args::ColumnArgs;
use crate::likelihood_args::LikelihoodArgs;
use crate::model_args::{check_workers, Method, ModelArgs};
use crate::protocol::{fold_split, prepare, Order, Prepared, Split, Standardizer};
use crate::saved_model::SavedModel;

/// `dualgp eval`'s flags: the data and protocol here, the model in [`ModelArgs`].
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The data: a Parquet file, or CSV with a header row (a name ending in `.csv`).
    #[arg(long)]
    pub data: PathBuf,
    /// Which columns are the id, the features, the target and the output.
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// A separate test file (otherwise --fold).
    #[arg(long, conflicts_with = "fold")]
    pub test: Option<PathBuf>,
    /// Test on this fold of --data, train on the others.
    #[arg(long)]
    pub fold: Option<i8>,
    /// The likelihood of each output.
    #[command(flatten)]
    pub likelihood: LikelihoodArgs,
    /// The learner.
    #[arg(long, value_enum, default_value = "dual-memory")]
    pub method: Method,
    /// Batches the training rows are cut into, learned in turn.
    #[arg(long, default_value_t = 10)]
    pub batches: usize,
    /// id | shuffle:SEED | sorted:COLUMN
    #[arg(long, default_value = "id")]
    pub order: String,
    /// How the learner learns.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Threads dual-memory's updates and the offline fit run on (their
    /// blocks of points are shared out); the numbers are the same, bit for
    /// bit, for any count.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Where the JSON report goes.
    #[arg(long)]
    pub report: PathBuf,
    /// Save the learned model (dual-memory), with the training rows'
    /// standardisation, for `serve --model` or `replay --model`.
    #[arg(long, value_name = "FILE")]
    pub save_model: Option<PathBuf>,
}

/// The figures after one batch.
#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    /// The batch, from 1.
    pub batch: usize,
    /// Training rows learned so far.
    pub n_seen: u64,
    /// Seconds the batch's update took.
    pub seconds: f64,
    /// Inducing inputs after the batch (VAR-GP's grow by `--inducing` a task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inducing: Option<usize>,
    /// The test figures after the batch.
    #[serde(flatten)]
    pub scores: TestScores,
}

/// The model's figures on the test set, and on each of its tasks.
#[derive(Debug, Clone, Serialize)]
pub struct TestScores {
    /// Mean negative log predictive density.
    pub test_nlpd: f64,
    /// RMSE of the predictive mean (real labels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_rmse: Option<f64>,
    /// Accuracy (classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    /// The same per task.
    #[serde(flatten)]
    pub by_task: ByTask,
    /// The same per output.
    #[serde(flatten)]
    pub by_output: ByOutput,
}

impl TestScores {
    fn new(m: &Metrics, by_task: ByTask, by_output: ByOutput) -> Self {
        TestScores {
            test_nlpd: m.nlpd,
            test_rmse: m.rmse,
            test_accuracy: m.accuracy,
            by_task,
            by_output,
        }
    }
}

/// Test metrics of each output of a multi-output model on its own test rows
/// (keys are the output indices; an output without test rows is left out).
/// Empty for a single-output model.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ByOutput {
    /// NLPD per output.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_nlpd_by_output: BTreeMap<String, f64>,
    /// RMSE per output with real labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_rmse_by_output: BTreeMap<String, f64>,
    /// Accuracy per output with classes.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_accuracy_by_output: BTreeMap<String, f64>,
}

impl ByOutput {
    /// From [`evaluate_by_output`](dualgp_operators::model::evaluate_by_output)'s
    /// entries; nothing for a single-output `likelihood`.
    fn new(likelihood: &Likelihood, metrics: &[Option<Metrics>]) -> ByOutput {
        let mut out = ByOutput::default();
        if !matches!(likelihood, Likelihood::MultiOutput(_)) {
            return out;
        }
        for (d, m) in metrics.iter().enumerate() {
            let Some(m) = m else { continue };
            let key = d.to_string();
            out.test_nlpd_by_output.insert(key.clone(), m.nlpd);
            if let Some(rmse) = m.rmse {
                out.test_rmse_by_output.insert(key.clone(), rmse);
            }
            if let Some(accuracy) = m.accuracy {
                out.test_accuracy_by_output.insert(key, accuracy);
            }
        }
        out
    }
}

/// Test metrics for each task of a test file with a `task` column (keys are
/// the task numbers): the paper's Table 2, one row per batch. Empty without
/// such a column.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ByTask {
    /// NLPD per task.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_nlpd_by_task: BTreeMap<String, f64>,
    /// RMSE per task (real labels).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_rmse_by_task: BTreeMap<String, f64>,
    /// Accuracy per task (classes).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_accuracy_by_task: BTreeMap<String, f64>,
}

/// The figures after the last batch.
#[derive(Debug, Clone, Serialize)]
pub struct FinalReport {
    /// The test figures.
    #[serde(flatten)]
    pub scores: TestScores,
    /// Seconds of learning, all batches.
    pub seconds_total: f64,
    /// The learned kernel and likelihood hyperparameters by name.
    pub hyperparameters: BTreeMap<String, f64>,
}

/// `dualgp eval`'s JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The learner (`--method`).
    pub method: String,
    /// The data file.
    pub data: String,
    /// The test fold, when the test rows are a fold of the data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fold: Option<i8>,
    /// `--likelihood` as given.
    pub likelihood: String,
    /// `--order` as given.
    pub order: String,
    /// The figures after each batch.
    pub batches: Vec<BatchReport>,
    /// The figures at the end.
    #[serde(rename = "final")]
    pub final_: FinalReport,
}

/// Runs the evaluation and writes the report; `progress` is told after each batch.
pub fn run(args: &EvalArgs, mut progress: impl FnMut(usize, usize)) -> Result<Report> {
    let likelihood = args.likelihood.parse()?;
    let multi = matches!(likelihood, Likelihood::MultiOutput(_));
    let settings = args.model.settings()?;
    check_workers(args.workers)?;
    if args.save_model.is_some() && args.method != Method::DualMemory {
        bail!(
            "--save-model saves the dual-memory learner `serve` runs, not {}: drop --method or --save-model",
            args.method.name()
        );
    }
    let order: Order = args.order.parse()?;
    let spec = args.columns.spec()?;
    let table = Table::read(&args.data, &spec)?;
    let split = match (&args.test, args.fold) {
        (Some(test), None) => Split::new(table, Table::read(test, &spec)?)?,
        (None, Some(k)) => fold_split(&table, k)?,
        (None, None) => bail!("give either --fold K or --test FILE.parquet to say what to test on"),
        (Some(_), Some(_)) => unreachable!("clap refuses --test with --fold"),
    };
    let regression = matches!(likelihood, Likelihood::Gaussian { .. } | Likelihood::StudentT { .. });
    if args.batches == 0 || args.batches > split.train.n() {
        bail!(
            "--batches {}: choose between 1 and the {} training rows",
            args.batches,
            split.train.n()
        );
    }
    // A multi-output model's targets are standardised output by output (in `datasets`).
    let prepared = prepare(&split, &order, args.batches, regression && !multi)?;
    let (train, test, y_by_output) = datasets(&prepared, &likelihood)?;
    let tasks = TestTasks::new(split.test.tasks.as_deref(), &test);
    let likelihood = settings.likelihood(likelihood);
    let kernel = settings.model_kernel(prepared.x_train.ncols(), &likelihood);

    let mut batches = Vec::new();
    let mut total = 0.0;
    let (final_metrics, final_by_task, final_by_output, hyperparameters) = match args.method {
        streaming @ (Method::DualMemory | Method::Osgpr | Method::VarGp) => {
            // The learners share m (VAR-GP: m a task).
            let first_rows = settings.first_inducing(train.x());
            // Dual-memory's learner is kept as what it is, for --save-model.
            let (mut dual, mut other) = (None, None);
            let learner: &mut dyn StreamingLearner = match streaming {
                Method::DualMemory => {
                    dual.insert(settings.sequential_learner(kernel, likelihood.clone(), first_rows, args.workers)?)
                }
                _ => other
                    .insert(settings.streaming_learner(
                        streaming,
                        kernel,
                        likelihood.clone(),
                        first_rows,
                        args.workers,
                    )?)
                    .as_mut(),
            };
            let metrics = stream(
                learner,
                &prepared,
                &train,
                (&test, &tasks),
                &mut batches,
                &mut total,
                &mut progress,
            )?;
            let last = batches.last().map(|b| b.scores.clone());
            let (by_task, by_output) = last.map(|s| (s.by_task, s.by_output)).unwrap_or_default();
            let hyperparameters = learner.hyperparameters();
            if let (Some(path), Some(learner)) = (&args.save_model, dual) {
                let scaling = Standardizer {
                    y_by_output,
                    ..prepared.standardizer.clone()
                };
                let epoch = batches.len() as u64 - 1;
                SavedModel {
                    learner,
                    scaling,
                    epoch,
                }
                .save(path)?;
            }
            (metrics, by_task, by_output, hyperparameters)
        }
        Method::Offline => {
            let started = Instant::now();
            let model = settings.fit_offline(kernel, likelihood.clone(), &train, args.workers)?;
            total = started.elapsed().as_secs_f64();
            let score = |t: &Data| {
                Ok(dualgp_operators::model::evaluate(
                    &model.posterior,
                    &model.likelihood,
                    t,
                )?)
            };
            let metrics = score(&test)?;
            let by_task = tasks.score(score)?;
            let by_output = ByOutput::new(
                &model.likelihood,
                &dualgp_operators::model::evaluate_by_output(&model.posterior, &model.likelihood, &test)?,
            );
            batches.push(BatchReport {
                batch: 1,
                n_seen: train.n() as u64,
                seconds: total,
                inducing: Some(model.posterior.m()),
                scores: TestScores::new(&metrics, by_task.clone(), by_output.clone()),
            });
            progress(1, 1);
            (
                metrics,
                by_task,
                by_output,
                named_hyperparameters(&model.posterior.kernel, &model.likelihood),
            )
        }
    };
    let report = Report {
        method: args.method.name().into(),
        data: args.data.display().to_string(),
        fold: args.fold,
        likelihood: likelihood.name(),
        order: order.to_string(),
        batches,
        final_: FinalReport {
            scores: TestScores::new(&final_metrics, final_by_task, final_by_output),
            seconds_total: total,
            hyperparameters: hyperparameters.into_iter().collect(),
        },
    };
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&args.report, json)
        .with_context(|| format!("cannot write the report to {}", args.report.display()))?;
    Ok(report)
}

/// Feeds the batches in order, timing only the update, and scores the test
/// set after each; returns the last metrics.
fn stream(
    learner: &mut dyn StreamingLearner,
    prepared: &Prepared,
    train: &Data,
    (test, tasks): (&Data, &TestTasks),
    batches: &mut Vec<BatchReport>,
    total: &mut f64,
    progress: &mut impl FnMut(usize, usize),
) -> Result<Metrics> {
    let n_batches = prepared.batches.len();
    let mut last = None;
    for (b, rows) in prepared.batches.iter().enumerate() {
        let batch = train.select(&rows.clone().collect::<Vec<_>>());
        let started = Instant::now();
        let n_seen = learner.learn_batch(&batch)?.n_seen;
        let seconds = started.elapsed().as_secs_f64();
        *total += seconds;
        let metrics = learner.evaluate(test)?;
        let by_task = tasks.score(|t| Ok(learner.evaluate(t)?))?;
        let by_output = ByOutput::new(learner.likelihood(), &learner.evaluate_by_output(test)?);
        batches.push(BatchReport {
            batch: b + 1,
            n_seen,
            seconds,
            inducing: learner.posterior().map(|p| p.m()),
            scores: TestScores::new(&metrics, by_task, by_output),
        });
        last = Some(metrics);
        progress(b + 1, n_batches);
    }
    last.context("no batches to learn from")
}

/// Each output's target scaling `(mean, sd)`, in output order.
type OutputScaling = Vec<(f64, f64)>;

/// The training and test data, and a multi-output model's target scaling of
/// each output (empty for a single-output model: `prepare` scaled its target).
fn datasets(p: &Prepared, likelihood: &Likelihood) -> Result<(Data, Data, OutputScaling)> {
    let fits = |what: &str, data: &Data| {
        data.check(data.d(), likelihood).map_err(|e| {
            anyhow::anyhow!(
                "{what} {e}: --likelihood {} does not fit these labels; choose the likelihood that matches the target",
                likelihood.name()
            )
        })
    };
    let outputs = |what: &str, given: &Option<Vec<i64>>, n: usize| {
        output_indices(given.as_deref(), n, likelihood.n_outputs()).map_err(|e| anyhow::anyhow!("{what} data: {e}"))
    };
    let (train_outputs, test_outputs) = (
        outputs("training", &p.train_outputs, p.y_train.len())?,
        outputs("test", &p.test_outputs, p.y_test.len())?,
    );
    let (mut y_train, mut y_test) = (p.y_train.clone(), p.y_test.clone());
    let mut y_by_output = Vec::new();
    if let Likelihood::MultiOutput(multi) = likelihood {
        y_by_output = standardise_by_output(multi, (&mut y_train, &train_outputs), (&mut y_test, &test_outputs));
    }
    let train = Data::for_model(likelihood, p.x_train.clone(), y_train, train_outputs).context("training data")?;
    let test = Data::for_model(likelihood, p.x_test.clone(), y_test, test_outputs).context("test data")?;
    fits("training", &train)?;
    fits("test", &test)?;
    Ok((train, test, y_by_output))
}

/// The `output` column as indices `0..D`: all 0 without the column; a
/// negative index or one beyond the `--likelihood` list is one clear error.
fn output_indices(given: Option<&[i64]>, n: usize, outputs: usize) -> Result<Vec<usize>> {
    let Some(given) = given else {
        return Ok(vec![0; n]);
    };
    match given.iter().position(|&o| o < 0 || o >= outputs as i64) {
        Some(row) => bail!(
            "row {row} has output {} but --likelihood lists {outputs} output(s) (0..{}); give one likelihood per output",
            given[row],
            outputs.saturating_sub(1)
        ),
        None => Ok(given.iter().map(|&o| o as usize).collect()),
    }
}

/// Standardises the targets of each Gaussian or Student-t output with the
/// training rows' mean and standard deviation of that output (counts and
/// classes stay as they are), as the single-output protocol does for its
/// one regression target; each output's `(mean, sd)`, `(0, 1)` where unscaled.
fn standardise_by_output(
    multi: &MultiOutput,
    (train, train_outputs): (&mut DVector<f64>, &[usize]),
    (test, test_outputs): (&mut DVector<f64>, &[usize]),
) -> OutputScaling {
    let mut scaling = vec![(0.0, 1.0); multi.n_outputs()];
    for (d, lik) in multi.outputs.iter().enumerate() {
        if !matches!(lik, Likelihood::Gaussian { .. } | Likelihood::StudentT { .. }) {
            continue;
        }
        let own: Vec<f64> = (0..train.len())
            .filter(|&i| train_outputs[i] == d)
            .map(|i| train[i])
            .collect();
        if own.is_empty() {
            continue;
        }
        let mean = own.iter().sum::<f64>() / own.len() as f64;
        let sd = (own.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / own.len() as f64).sqrt();
        let sd = if sd > 0.0 { sd } else { 1.0 };
        scaling[d] = (mean, sd);
        for (y, &o) in train
            .iter_mut()
            .zip(train_outputs)
            .chain(test.iter_mut().zip(test_outputs))
        {
            if o == d {
                *y = (*y - mean) / sd;
            }
        }
    }
    scaling
}

/// The test rows of each task, in task order (none without a `task` column).
struct TestTasks(Vec<(i64, Data)>);

impl TestTasks {
    fn new(tasks: Option<&[i64]>, test: &Data) -> TestTasks {
        let mut rows: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, &t) in tasks.unwrap_or_default().iter().enumerate() {
            rows.entry(t).or_default().push(i);
        }
        TestTasks(rows.into_iter().map(|(t, r)| (t, test.select(&r))).collect())
    }

    fn score(&self, mut score: impl FnMut(&Data) -> Result<Metrics>) -> Result<ByTask> {
        let mut out = ByTask::default();
        for (task, data) in &self.0 {
            let m = score(data)?;
            let key = task.to_string();
            out.test_nlpd_by_task.insert(key.clone(), m.nlpd);
            if let Some(rmse) = m.rmse {
                out.test_rmse_by_task.insert(key.clone(), rmse);
            }
            if let Some(accuracy) = m.accuracy {
                out.test_accuracy_by_task.insert(key, accuracy);
            }
        }
        Ok(out)
    }
}
