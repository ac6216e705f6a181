//! `dualgp eval`: a learner on the paper-uci protocol (or a given test file),
//! reporting test metrics after every batch as JSON. The flags and the report
//! are a contract (`../shared/docs/EVALUATION.md`, beside the repository): extend, never rename.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::Table;
use dualgp_operators::model::dual::objective::named_hyperparameters;
use dualgp_operators::model::{Data, Likelihood, Metrics, MultiOutput, StreamingLearner};
use nalgebra::DVector;
use serde::Serialize;

use crate::column_args::ColumnArgs;
use crate::epoch_column::batches_by_column;
use crate::likelihood_args::LikelihoodArgs;
use crate::model_args::{check_workers, Method, ModelArgs};
use crate::protocol::{fold_split, prepare, Order, Prepared, Split, Standardizer};
use crate::report::{posterior_map, MapMarks};
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
    /// Cut the training rows (in --order) into one batch per run of equal
    /// values of this numeric column instead of --batches equal parts, e.g.
    /// `--epoch-column path`: one robot path a batch
    #[arg(long, value_name = "COLUMN", conflicts_with = "batches")]
    pub epoch_column: Option<String>,
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
    /// For two inputs: after every --maps-every-th batch (and the last),
    /// draw the predictive mean and sd over the inputs' range, with the
    /// inducing inputs and the batch's inputs, as DIR/batch_NNN.svg
    /// (streaming learners)
    #[arg(long, value_name = "DIR")]
    pub maps: Option<PathBuf>,
    /// How often --maps draws: every Nth batch
    #[arg(long, value_name = "N", default_value_t = 1, requires = "maps")]
    pub maps_every: usize,
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
    /// The `--epoch-column` value the batch's rows share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch_value: Option<f64>,
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

/// Test metrics of each group of test rows (each output of a multi-output
/// model, or each task of a test file with a `task` column), keyed by the
/// group's number; written as `test_nlpd_by_<group>`, `test_rmse_by_…`
/// (real labels) and `test_accuracy_by_…` (classes), each left out when
/// empty, as are groups without test rows.
#[derive(Debug, Clone, Default)]
pub struct ByGroup<G> {
    /// NLPD by group.
    pub nlpd: BTreeMap<String, f64>,
    /// RMSE by group with real labels.
    pub rmse: BTreeMap<String, f64>,
    /// Accuracy by group with classes.
    pub accuracy: BTreeMap<String, f64>,
    group: std::marker::PhantomData<G>,
}

/// What the rows of a [`ByGroup`] are grouped by.
pub trait Group {
    /// The keys' suffix: `output`, `task`.
    const NAME: &'static str;
}

/// Each output of a multi-output model (empty for a single output).
#[derive(Debug, Clone, Default)]
pub struct Outputs;

impl Group for Outputs {
    const NAME: &'static str = "output";
}

/// Each task of the test rows (the paper's Table 2, one row per batch; empty without a `task` column).
#[derive(Debug, Clone, Default)]
pub struct Tasks;

impl Group for Tasks {
    const NAME: &'static str = "task";
}

/// Test metrics per output.
pub type ByOutput = ByGroup<Outputs>;

/// Test metrics per task.
pub type ByTask = ByGroup<Tasks>;

impl<G> ByGroup<G> {
    /// Adds group `key`'s metrics.
    fn insert(&mut self, key: impl ToString, m: &Metrics) {
        let key = key.to_string();
        self.nlpd.insert(key.clone(), m.nlpd);
        if let Some(rmse) = m.rmse {
            self.rmse.insert(key.clone(), rmse);
        }
        if let Some(accuracy) = m.accuracy {
            self.accuracy.insert(key, accuracy);
        }
    }
}

impl<G: Group> Serialize for ByGroup<G> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (metric, values) in [("nlpd", &self.nlpd), ("rmse", &self.rmse), ("accuracy", &self.accuracy)] {
            if !values.is_empty() {
                map.serialize_entry(&format!("test_{metric}_by_{}", G::NAME), values)?;
            }
        }
        map.end()
    }
}

impl ByOutput {
    /// From [`evaluate_by_output`](dualgp_operators::model::evaluate_by_output)'s
    /// entries; nothing for a single-output `likelihood`.
    fn new(likelihood: &Likelihood, metrics: &[Option<Metrics>]) -> ByOutput {
        let mut out = ByOutput::default();
        if matches!(likelihood, Likelihood::MultiOutput(_)) {
            for (d, m) in metrics.iter().enumerate() {
                if let Some(m) = m {
                    out.insert(d, m);
                }
            }
        }
        out
    }
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
    /// `--epoch-column`, when batches are runs of its values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch_column: Option<String>,
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
    if args.maps_every == 0 {
        bail!("--maps-every 0: give how many batches apart the maps are drawn, at least 1");
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
    if args.epoch_column.is_none() && (args.batches == 0 || args.batches > split.train.n()) {
        bail!(
            "--batches {}: choose between 1 and the {} training rows",
            args.batches,
            split.train.n()
        );
    }
    // A multi-output model's targets are standardised output by output (in `datasets`).
    let n_batches = if args.epoch_column.is_some() { 1 } else { args.batches };
    let mut prepared = prepare(&split, &order, n_batches, regression && !multi)?;
    let mut epoch_values = Vec::new();
    if let Some(column) = &args.epoch_column {
        let runs = batches_by_column(&args.data, &args.columns, column, &prepared.train_ids)?;
        (prepared.batches, epoch_values) = runs.into_iter().unzip();
    }
    if args.maps.is_some() && prepared.x_train.ncols() != 2 {
        bail!(
            "--maps draws two inputs, and the data has {}: drop --maps",
            prepared.x_train.ncols()
        );
    }
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
            let mut after_batch = |b: usize, n: usize, learner: &dyn StreamingLearner| {
                progress(b, n);
                match &args.maps {
                    Some(dir) if b.is_multiple_of(args.maps_every) || b == n => draw_map(dir, b, learner, &prepared),
                    _ => Ok(()),
                }
            };
            let metrics = stream(
                learner,
                &prepared,
                &train,
                (&test, &tasks),
                &mut batches,
                &mut total,
                &mut after_batch,
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
                epoch_value: None,
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
    // The offline fit's one batch is all the runs together, unless there is one run.
    if batches.len() == epoch_values.len() {
        for (batch, value) in batches.iter_mut().zip(epoch_values) {
            batch.epoch_value = Some(value);
        }
    }
    let report = Report {
        method: args.method.name().into(),
        data: args.data.display().to_string(),
        fold: args.fold,
        likelihood: likelihood.name(),
        order: order.to_string(),
        epoch_column: args.epoch_column.clone(),
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
    after_batch: &mut impl FnMut(usize, usize, &dyn StreamingLearner) -> Result<()>,
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
            epoch_value: None,
            scores: TestScores::new(&metrics, by_task, by_output),
        });
        last = Some(metrics);
        after_batch(b + 1, n_batches, &*learner)?;
    }
    last.context("no batches to learn from")
}

/// `--maps`: the learner's map after batch `b` (from 1), the batch's inputs on it.
fn draw_map(dir: &Path, b: usize, learner: &dyn StreamingLearner, prepared: &Prepared) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--maps: cannot create {}", dir.display()))?;
    let rows = prepared.batches[b - 1].clone();
    let learned = prepared.x_train.rows_range(rows.clone()).into_owned();
    let marks = MapMarks {
        title: Some(format!(
            "after batch {b} of {} ({} rows learned)",
            prepared.batches.len(),
            rows.end
        )),
        learned: Some(&learned),
        // Coarser than replay's map: a map a batch, each about 0.3 MB of SVG.
        cells: Some(30),
        ..MapMarks::default()
    };
    posterior_map(
        &dir.join(format!("batch_{b:03}.svg")),
        learner,
        &prepared.standardizer,
        &marks,
    )
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
            out.insert(task, &score(data)?);
        }
        Ok(out)
    }
}
