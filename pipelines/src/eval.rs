//! `dualgp eval`: a learner on the paper-uci protocol (or a given test file),
//! reporting test metrics after every batch as JSON. The flags and the report
//! are a contract (`../shared/docs/EVALUATION.md`, beside the repository): extend, never rename.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::{ColumnSpec, Table};
use dualgp_operators::model::dual::objective::named_hyperparameters;
use dualgp_operators::model::{Data, Likelihood, Metrics, StreamingLearner};
use serde::Serialize;

use crate::model_args::{check_workers, Method, ModelArgs};
use crate::protocol::{fold_split, prepare, Order, Prepared, Split};

/// `dualgp eval`'s flags: the data and protocol here, the model in [`ModelArgs`].
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    #[arg(long)]
    pub data: PathBuf,
    /// A separate test file (otherwise --fold).
    #[arg(long, conflicts_with = "fold")]
    pub test: Option<PathBuf>,
    /// Test on this fold of --data, train on the others.
    #[arg(long)]
    pub fold: Option<i8>,
    /// gaussian | bernoulli[:logit] | poisson | student-t | softmax:C
    #[arg(long)]
    pub likelihood: String,
    #[arg(long, value_enum, default_value = "dual-memory")]
    pub method: Method,
    #[arg(long, default_value_t = 10)]
    pub batches: usize,
    /// id | shuffle:SEED | sorted:COLUMN
    #[arg(long, default_value = "id")]
    pub order: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Dataflow workers; the model-only learner gives the same numbers for any count.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    #[arg(long)]
    pub report: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub batch: usize,
    pub n_seen: u64,
    pub seconds: f64,
    /// Inducing inputs after the batch (VAR-GP's grow by `--inducing` a task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inducing: Option<usize>,
    #[serde(flatten)]
    pub scores: TestScores,
}

/// The model's figures on the test set, and on each of its tasks.
#[derive(Debug, Clone, Serialize)]
pub struct TestScores {
    pub test_nlpd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_rmse: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    #[serde(flatten)]
    pub by_task: ByTask,
}

impl TestScores {
    fn new(m: &Metrics, by_task: ByTask) -> Self {
        TestScores {
            test_nlpd: m.nlpd,
            test_rmse: m.rmse,
            test_accuracy: m.accuracy,
            by_task,
        }
    }
}

/// Test metrics for each task of a test file with a `task` column (keys are
/// the task numbers): the paper's Table 2, one row per batch. Empty without
/// such a column.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ByTask {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_nlpd_by_task: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_rmse_by_task: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub test_accuracy_by_task: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FinalReport {
    #[serde(flatten)]
    pub scores: TestScores,
    pub seconds_total: f64,
    /// The learned kernel and likelihood hyperparameters by name.
    pub hyperparameters: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub method: String,
    pub data: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fold: Option<i8>,
    pub likelihood: String,
    pub order: String,
    pub batches: Vec<BatchReport>,
    #[serde(rename = "final")]
    pub final_: FinalReport,
}

/// Runs the evaluation and writes the report; `progress` is told after each batch.
pub fn run(args: &EvalArgs, mut progress: impl FnMut(usize, usize)) -> Result<Report> {
    let likelihood = Likelihood::parse(&args.likelihood).map_err(|e| anyhow::anyhow!("--likelihood: {e}"))?;
    let settings = args.model.settings()?;
    check_workers(args.workers)?;
    let order: Order = args.order.parse()?;
    let spec = ColumnSpec::default();
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
    let prepared = prepare(&split, &order, args.batches, regression)?;
    let (train, test) = datasets(&prepared, &likelihood)?;
    let tasks = TestTasks::new(split.test.tasks.as_deref(), &test);
    let likelihood = settings.likelihood(likelihood);
    let kernel = settings.kernel(train.d());

    let mut batches = Vec::new();
    let mut total = 0.0;
    let (final_metrics, final_by_task, hyperparameters) = match args.method {
        streaming @ (Method::DualMemory | Method::Osgpr | Method::VarGp) => {
            // The learners share m (VAR-GP: m a task).
            let first_rows = settings.first_inducing(train.x());
            let mut learner = settings.streaming_learner(streaming, kernel, likelihood.clone(), first_rows)?;
            let metrics = stream(
                learner.as_mut(),
                &prepared,
                &train,
                (&test, &tasks),
                &mut batches,
                &mut total,
                &mut progress,
            )?;
            let by_task = batches.last().map(|b| b.scores.by_task.clone()).unwrap_or_default();
            (metrics, by_task, learner.hyperparameters())
        }
        Method::Offline => {
            let started = Instant::now();
            let model = settings.fit_offline(kernel, likelihood.clone(), &train)?;
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
            batches.push(BatchReport {
                batch: 1,
                n_seen: train.n() as u64,
                seconds: total,
                inducing: Some(model.posterior.m()),
                scores: TestScores::new(&metrics, by_task.clone()),
            });
            progress(1, 1);
            (
                metrics,
                by_task,
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
            scores: TestScores::new(&final_metrics, final_by_task),
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
        batches.push(BatchReport {
            batch: b + 1,
            n_seen,
            seconds,
            inducing: learner.posterior().map(|p| p.m()),
            scores: TestScores::new(&metrics, by_task),
        });
        last = Some(metrics);
        progress(b + 1, n_batches);
    }
    last.context("no batches to learn from")
}

fn datasets(p: &Prepared, likelihood: &Likelihood) -> Result<(Data, Data)> {
    let fits = |what: &str, data: &Data| {
        data.check(data.d(), likelihood).map_err(|e| {
            anyhow::anyhow!(
                "{what} {e}: --likelihood {} does not fit these labels; choose the likelihood that matches the target",
                likelihood.name()
            )
        })
    };
    let train = Data::new(p.x_train.clone(), p.y_train.clone()).context("training data")?;
    let test = Data::new(p.x_test.clone(), p.y_test.clone()).context("test data")?;
    fits("training", &train)?;
    fits("test", &test)?;
    Ok((train, test))
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
