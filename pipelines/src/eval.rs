//! `dualgp eval`: a learner on the paper-uci protocol (or a given test file),
//! reporting test metrics after every batch as JSON. The flags and the report
//! are a contract (docs/EVALUATION.md): extend, never rename.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dualgp_connectors::{ColumnSpec, Table};
use dualgp_operators::model::{
    fit_offline, Data, EStepConfig, Family, InducingPolicy, Kernel, Likelihood, MemoryPolicy, Metrics, OfflineConfig,
    SequentialConfig, SequentialLearner,
};
use serde::Serialize;

use crate::protocol::{fold_split, prepare, Order, Prepared, Split};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    DualMemory,
    Osgpr,
    Offline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// The reference implementation's settings (AaltoML/sequential-gp).
    Reference,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelName {
    Matern52,
    Matern32,
    Matern12,
    Rbf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InducingPolicyName {
    Fixed,
    Pivoted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MemoryPolicyName {
    Bls,
    Random,
    None,
}

/// Every model flag is optional: unset flags take the method's defaults or the preset's.
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
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    #[arg(long, default_value_t = 10)]
    pub batches: usize,
    /// id | shuffle:SEED | sorted:COLUMN
    #[arg(long, default_value = "id")]
    pub order: String,
    #[arg(long, value_enum)]
    pub kernel: Option<KernelName>,
    /// One lengthscale per input.
    #[arg(long)]
    pub ard: bool,
    #[arg(long)]
    pub inducing: Option<usize>,
    #[arg(long, value_enum)]
    pub inducing_policy: Option<InducingPolicyName>,
    #[arg(long)]
    pub memory_per_batch: Option<usize>,
    #[arg(long, value_enum)]
    pub memory_policy: Option<MemoryPolicyName>,
    /// Bound the memory: BLS-weighted reservoir over the whole stream.
    #[arg(long)]
    pub memory_capacity: Option<usize>,
    #[arg(long)]
    pub e_steps: Option<usize>,
    #[arg(long)]
    pub e_lr: Option<f64>,
    #[arg(long)]
    pub m_steps: Option<usize>,
    #[arg(long)]
    pub m_lr: Option<f64>,
    /// M-step rounds per batch, the batch and memory re-learned between them.
    #[arg(long)]
    pub m_rounds: Option<usize>,
    /// Dataflow workers; the model-only learner gives the same numbers for any count.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub report: PathBuf,
}

/// The settings after defaults, preset and flags are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub family: Family,
    pub ard: bool,
    pub noise: f64,
    pub sequential: SequentialConfig,
    /// The reference keeps `Z` at the first `m` train rows.
    pub z_first_rows: bool,
    /// Start the lengthscales at √d, the scale of distances between standardised inputs (else 1).
    pub median_lengthscale: bool,
}

impl EvalArgs {
    /// Defaults are the project's best settings (README); `--preset reference`
    /// replaces them with the reference code's; given flags override both.
    pub fn settings(&self) -> Result<Settings> {
        let reference = self.preset == Some(Preset::Reference);
        let mut s = if reference {
            Settings {
                family: Family::Matern52,
                ard: false,
                noise: 0.1,
                sequential: SequentialConfig {
                    inducing: 100,
                    inducing_policy: InducingPolicy::Fixed,
                    e_step: EStepConfig { steps: 4, rho: 0.8 },
                    m_steps: 20,
                    m_rounds: 1,
                    reexpress_old_data: false,
                    m_lr: 0.01,
                    memory: MemoryPolicy::PerBatch { k: 10 },
                    seed: self.seed,
                },
                z_first_rows: true,
                median_lengthscale: false,
            }
        } else {
            Settings {
                family: Family::Matern52,
                ard: true,
                noise: 0.1,
                sequential: SequentialConfig {
                    inducing: 100,
                    inducing_policy: InducingPolicy::Pivoted,
                    e_step: EStepConfig { steps: 4, rho: 0.8 },
                    m_steps: 20,
                    m_rounds: 5,
                    reexpress_old_data: true,
                    m_lr: 0.05,
                    memory: MemoryPolicy::PerBatch { k: 10 },
                    seed: self.seed,
                },
                z_first_rows: false,
                median_lengthscale: true,
            }
        };
        if let Some(k) = self.kernel {
            s.family = match k {
                KernelName::Matern52 => Family::Matern52,
                KernelName::Matern32 => Family::Matern32,
                KernelName::Matern12 => Family::Matern12,
                KernelName::Rbf => Family::SquaredExponential,
            };
        }
        s.ard |= self.ard;
        let q = &mut s.sequential;
        if let Some(m) = self.inducing {
            if m == 0 {
                bail!("--inducing 0: the model needs at least one inducing input");
            }
            q.inducing = m;
        }
        if let Some(p) = self.inducing_policy {
            q.inducing_policy = match p {
                InducingPolicyName::Fixed => InducingPolicy::Fixed,
                InducingPolicyName::Pivoted => InducingPolicy::Pivoted,
            };
            s.z_first_rows &= p == InducingPolicyName::Fixed;
        }
        if let Some(n) = self.e_steps {
            q.e_step.steps = n;
        }
        if let Some(rho) = self.e_lr {
            q.e_step.rho = rho;
        }
        if let Some(n) = self.m_steps {
            q.m_steps = n;
        }
        if let Some(lr) = self.m_lr {
            q.m_lr = lr;
        }
        if let Some(r) = self.m_rounds {
            q.m_rounds = r;
        }
        let k = self.memory_per_batch.unwrap_or(match q.memory {
            MemoryPolicy::PerBatch { k } | MemoryPolicy::Random { k } => k,
            _ => 10,
        });
        q.memory = match (self.memory_policy, self.memory_capacity) {
            (Some(MemoryPolicyName::None), _) => MemoryPolicy::None,
            (Some(MemoryPolicyName::Random), _) => MemoryPolicy::Random { k },
            (_, Some(capacity)) => MemoryPolicy::Reservoir { capacity },
            _ => MemoryPolicy::PerBatch { k },
        };
        q.validate()
            .map_err(|e| anyhow::anyhow!("{e}; change --e-lr or --m-lr"))?;
        if self.workers == 0 {
            bail!("--workers 0: give at least one worker");
        }
        Ok(s)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub batch: usize,
    pub n_seen: u64,
    pub seconds: f64,
    pub test_nlpd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_rmse: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FinalReport {
    pub test_nlpd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_rmse: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    pub seconds_total: f64,
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
    let settings = args.settings()?;
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
    let likelihood = match likelihood {
        Likelihood::Gaussian { .. } => Likelihood::Gaussian {
            variance: settings.noise,
        },
        other => other,
    };
    let lengthscale = if settings.median_lengthscale {
        (train.d() as f64).sqrt()
    } else {
        1.0
    };
    let kernel = Kernel::stationary(
        settings.family,
        1.0,
        vec![lengthscale; if settings.ard { train.d() } else { 1 }],
    );

    let mut batches = Vec::new();
    let mut total = 0.0;
    let n_batches = prepared.batches.len();
    let final_metrics = match args.method {
        Method::DualMemory => {
            let mut learner = SequentialLearner::new(kernel, likelihood.clone(), settings.sequential.clone())?;
            if settings.z_first_rows {
                let m = settings.sequential.inducing.min(train.n());
                learner = learner.with_inducing(train.x().rows(0, m).into_owned())?;
            }
            let mut last = None;
            for (b, rows) in prepared.batches.iter().enumerate() {
                let batch = train.select(&rows.clone().collect::<Vec<_>>());
                let started = Instant::now();
                let report = learner.update(&batch)?;
                let seconds = started.elapsed().as_secs_f64();
                total += seconds;
                let metrics = learner.evaluate(&test)?;
                batches.push(batch_report(b + 1, report.n_seen, seconds, &metrics));
                last = Some(metrics);
                progress(b + 1, n_batches);
            }
            last.expect("at least one batch")
        }
        Method::Offline => {
            let started = Instant::now();
            let m = settings.sequential.inducing;
            let model = fit_offline(kernel, likelihood.clone(), &train, m, &OfflineConfig::default())?;
            total = started.elapsed().as_secs_f64();
            let metrics = dualgp_operators::model::evaluate(&model.posterior, &model.likelihood, &test)?;
            batches.push(batch_report(1, train.n() as u64, total, &metrics));
            progress(1, 1);
            metrics
        }
        Method::Osgpr => bail!("--method osgpr (Bui et al. 2017) is not available yet; use dual-memory or offline"),
    };
    let report = Report {
        method: method_name(args.method).into(),
        data: args.data.display().to_string(),
        fold: args.fold,
        likelihood: likelihood.name(),
        order: order.to_string(),
        batches,
        final_: FinalReport {
            test_nlpd: final_metrics.nlpd,
            test_rmse: final_metrics.rmse,
            test_accuracy: final_metrics.accuracy,
            seconds_total: total,
        },
    };
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&args.report, json)
        .with_context(|| format!("cannot write the report to {}", args.report.display()))?;
    Ok(report)
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

fn batch_report(batch: usize, n_seen: u64, seconds: f64, m: &Metrics) -> BatchReport {
    BatchReport {
        batch,
        n_seen,
        seconds,
        test_nlpd: m.nlpd,
        test_rmse: m.rmse,
        test_accuracy: m.accuracy,
    }
}

fn method_name(m: Method) -> &'static str {
    match m {
        Method::DualMemory => "dual-memory",
        Method::Osgpr => "osgpr",
        Method::Offline => "offline",
    }
}
