//! `dualgp suggest`: the next batch of points to evaluate (batch Bayesian
//! optimisation, or active learning for a classifier), chosen by Algorithm 2
//! of Chang et al. (2023): each point maximises the acquisition under a model
//! that has seen fantasy observations at the points chosen before it.
//!
//! The model is a checkpoint `dualgp serve` wrote (`--model`) or is learned
//! first from the evaluated points of a Parquet file (`--data`). It lives on
//! the standardised scale; bounds and points are in the data's own units.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{anyhow, bail, Context, Result};
use clap::{ArgGroup, Args, ValueEnum};
use dualgp_connectors::Table;
use dualgp_operators::dataflow::CheckpointStore;
use dualgp_operators::model::fantasy::{propose_batch, Acquisition, Conditioned, Fantasy, Search, Surrogate};
use dualgp_operators::model::{Data, DualPosterior, Likelihood, ModelError, SequentialLearner, StreamingLearner};
use nalgebra::{DMatrix, DVector};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::column_args::ColumnArgs;
use crate::model_args::{Method, ModelArgs, Settings};
use crate::protocol::Standardizer;
use crate::saved_model::{read_scaling, SCALING_FILE};
use crate::wording::plural;

/// `dualgp suggest`'s flags: a model to start from, the box, the acquisition.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["model", "data"])))]
pub struct SuggestArgs {
    /// A checkpoint directory as `dualgp serve --checkpoint-dir` writes it:
    /// its newest checkpoint and its scaling.json.
    #[arg(long, value_name = "CHECKPOINT_DIR")]
    pub model: Option<PathBuf>,
    /// Evaluated points to learn from first (Parquet, or CSV with a header
    /// row): columns id, x0, x1, … and y, or as the column flags name them.
    #[arg(long, value_name = "EVALUATED.parquet", requires = "likelihood")]
    pub data: Option<PathBuf>,
    /// With --data: which columns are the id, the features and the target.
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// With --data: gaussian | bernoulli[:logit] | poisson | student-t | softmax:C
    #[arg(long, conflicts_with = "model")]
    pub likelihood: Option<String>,
    /// With --data: the learner (offline trains on all rows at once).
    #[arg(long, value_enum, default_value = "dual-memory", conflicts_with = "model")]
    pub method: Method,
    /// With --data, how to learn; --seed also seeds the search.
    #[command(flatten)]
    pub learning: ModelArgs,
    /// The box to search, one `lo,hi` per input in column order.
    #[arg(long, value_name = "LO,HI;LO,HI;…", allow_hyphen_values = true)]
    pub bounds: Bounds,
    /// Points to propose.
    #[arg(long, value_name = "K", value_parser = at_least_one)]
    pub batch: usize,
    /// What a point is chosen for.
    #[arg(long, value_enum, default_value = "ei")]
    pub acquisition: AcquisitionName,
    /// Look for large outputs (ei, ucb); by default small ones.
    #[arg(long)]
    pub maximize: bool,
    /// ucb's weight on the predictive standard deviation (default 2).
    #[arg(long)]
    pub kappa: Option<f64>,
    /// The label a chosen point is fantasised with before the next is chosen.
    #[arg(long, value_enum, default_value = "mean")]
    pub fantasy: FantasyName,
    /// With --data: a column of 0/1 saying whether each evaluation succeeded
    /// (a safe landing, a feasible design). A Bernoulli model learned from
    /// it weighs ei or ucb by the probability of success, and each chosen
    /// point is fantasised in both models. A glob of --features never
    /// takes this column
    #[arg(long, value_name = "NAME", requires = "data")]
    pub success_target: Option<String>,
}

/// `--acquisition`: what a point is chosen for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AcquisitionName {
    /// Expected improvement over the best output seen.
    Ei,
    /// The upper confidence bound `±μ + κσ`.
    Ucb,
    /// The entropy of the predictive distribution (active learning; any likelihood).
    Entropy,
}

/// `--fantasy`: the label a chosen point is fantasised with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FantasyName {
    /// The predictive mean (Algorithm 2).
    Mean,
    /// One draw from the predictive distribution.
    Sample,
}

const DEFAULT_KAPPA: f64 = 2.0;

/// The search box in the data's units, one `(lo, hi)` per input, each
/// finite with `lo < hi`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds(pub Vec<(f64, f64)>);

impl FromStr for Bounds {
    type Err = String;

    /// `lo,hi;lo,hi;…` (a trailing `;` is allowed).
    fn from_str(text: &str) -> Result<Bounds, String> {
        let ranges = text.trim().trim_end_matches(';');
        ranges.split(';').enumerate().map(|(j, r)| range(j, r)).collect()
    }
}

impl FromIterator<(f64, f64)> for Bounds {
    fn from_iter<I: IntoIterator<Item = (f64, f64)>>(ranges: I) -> Self {
        Bounds(ranges.into_iter().collect())
    }
}

/// Input `j`'s `lo,hi`.
fn range(j: usize, text: &str) -> Result<(f64, f64), String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let [lo, hi] = parts[..] else {
        return Err(format!("x{j}: `{}` is not `lo,hi`", text.trim()));
    };
    let number = |s: &str| s.parse::<f64>().map_err(|_| format!("x{j}: `{s}` is not a number"));
    let (lo, hi) = (number(lo)?, number(hi)?);
    if !(lo.is_finite() && hi.is_finite()) {
        return Err(format!("x{j}: bounds {lo},{hi} must be finite"));
    }
    if lo >= hi {
        return Err(format!("x{j}: the lower bound {lo} is not below the upper bound {hi}"));
    }
    Ok((lo, hi))
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("ask for at least one point".into()),
        Ok(k) => Ok(k),
        Err(e) => Err(e.to_string()),
    }
}

/// What `dualgp suggest` prints: the batch, in the order it was chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suggestion {
    /// The points, one input vector each.
    pub points: Vec<Vec<f64>>,
}

/// A model on the standardised scale and the scaling between it and the data.
struct Fitted {
    posterior: DualPosterior,
    likelihood: Likelihood,
    scaling: Standardizer,
    /// Expected improvement's incumbent: the best output seen, standardised.
    incumbent: f64,
    /// The model of success (`--success-target`), on the same inputs.
    success: Option<(DualPosterior, Likelihood)>,
}

/// Learns or loads the model, then chooses the batch.
pub fn run(args: &SuggestArgs) -> Result<Suggestion> {
    check_acquisition_flags(args)?;
    let fitted = match (&args.model, &args.data) {
        (Some(dir), None) => from_checkpoint(dir, args)?,
        (None, Some(file)) => from_file(file, args)?,
        _ => bail!("give either --model CHECKPOINT_DIR or --data EVALUATED.parquet"),
    };
    propose(&fitted, args)
}

/// Flags that would be silently ignored with the chosen acquisition.
fn check_acquisition_flags(args: &SuggestArgs) -> Result<()> {
    if args.kappa.is_some() && args.acquisition != AcquisitionName::Ucb {
        bail!("--kappa is ucb's weight; drop it or use --acquisition ucb");
    }
    if args.maximize && args.acquisition == AcquisitionName::Entropy {
        bail!("--maximize applies to ei and ucb; entropy always seeks the most uncertain points");
    }
    if args.success_target.is_some() && args.acquisition == AcquisitionName::Entropy {
        bail!("--success-target weighs ei or ucb; entropy seeks uncertain points, feasible or not");
    }
    Ok(())
}

/// The acquisition the flags ask for: of the first model, times the
/// probability of success under the second with `--success-target`.
fn acquisition(args: &SuggestArgs, incumbent: f64) -> Acquisition {
    let of_the_target = target_acquisition(args, incumbent);
    match args.success_target {
        Some(_) => Acquisition::Product(vec![of_the_target, Acquisition::Feasibility { model: 1 }]),
        None => of_the_target,
    }
}

/// The acquisition of the target's model alone.
fn target_acquisition(args: &SuggestArgs, incumbent: f64) -> Acquisition {
    let (model, maximize) = (0, args.maximize);
    match args.acquisition {
        AcquisitionName::Ei => Acquisition::ExpectedImprovement {
            model,
            incumbent,
            maximize,
        },
        AcquisitionName::Ucb => Acquisition::UpperConfidenceBound {
            model,
            kappa: args.kappa.unwrap_or(DEFAULT_KAPPA),
            maximize,
        },
        AcquisitionName::Entropy => Acquisition::Entropy { model },
    }
}

/// Refuses an acquisition the model cannot serve, before anything is learned.
fn check_acquisition_fits(args: &SuggestArgs, likelihood: &Likelihood) -> Result<()> {
    let flag = format!("--acquisition {}", flag_name(args.acquisition));
    target_acquisition(args, 0.0).validate(&[likelihood]).map_err(|e| {
        let classes = matches!(likelihood, Likelihood::Bernoulli { .. } | Likelihood::Softmax { .. });
        let hint = if classes { "; entropy works with any model" } else { "" };
        anyhow!("{}{hint}", refusal(&flag, e))
    })
}

fn flag_name(value: impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_owned())
}

/// A library refusal under the flag it is about; a configuration error's
/// own message says it all ("invalid configuration" adds nothing here).
fn refusal(flag: &str, e: ModelError) -> anyhow::Error {
    match e {
        ModelError::Config(why) => anyhow!("{flag}: {why}"),
        other => anyhow!("{flag}: {other}"),
    }
}

fn check_dimension(bounds: &Bounds, d: usize) -> Result<()> {
    let given = bounds.0.len();
    if given != d {
        bail!(
            "--bounds gives {given} range{} for a model of {d} input{} (x0…x{}): give one `lo,hi` per input",
            plural(given as u64),
            plural(d as u64),
            d.saturating_sub(1)
        );
    }
    Ok(())
}

/// The newest checkpoint in `dir` and the scaling kept beside it.
fn from_checkpoint(dir: &Path, args: &SuggestArgs) -> Result<Fitted> {
    if args.learning.any_given() {
        bail!("--model uses the checkpoint's model as it is: drop the model flags (they apply with --data)");
    }
    // CheckpointStore::new would create a missing directory.
    if !dir.is_dir() {
        bail!(
            "--model {}: not a directory; give the checkpoint directory `dualgp serve --checkpoint-dir` wrote",
            dir.display()
        );
    }
    let store = CheckpointStore::new(dir, usize::MAX)?;
    let checkpoint = store
        .latest::<serde_json::Value>()?
        .with_context(|| format!("--model {}: the directory holds no checkpoint", dir.display()))?;
    let scaling = read_scaling(dir)?.with_context(|| {
        format!(
            "--model {}: no {SCALING_FILE} beside the checkpoints, so their scale is unknown",
            dir.display()
        )
    })?;
    let learner = checkpoint.learner;
    check_acquisition_fits(args, &learner.likelihood)?;
    let posterior = learner
        .fitted()
        .map_err(|e| refusal(&format!("--model {}", dir.display()), e))?
        .clone();
    if scaling.x_mean.len() != posterior.d() {
        bail!(
            "--model {}: {SCALING_FILE} has {} inputs, the model {}",
            dir.display(),
            scaling.x_mean.len(),
            posterior.d()
        );
    }
    check_dimension(&args.bounds, posterior.d())?;
    let incumbent = best(best_means_held(&learner, &posterior), args.maximize);
    Ok(Fitted {
        likelihood: learner.likelihood.clone(),
        posterior,
        scaling,
        incumbent,
        success: None,
    })
}

/// The posterior mean at the inputs a checkpoint still holds, its memory and
/// its inducing inputs: it keeps no other record of what was evaluated.
fn best_means_held(learner: &SequentialLearner, posterior: &DualPosterior) -> Vec<f64> {
    let memory = learner.memory.points.iter().map(|p| p.x.clone());
    let inducing = posterior.z.row_iter().map(|r| r.iter().copied().collect());
    let held: Vec<Vec<f64>> = memory.chain(inducing).collect();
    let x = DMatrix::from_fn(held.len(), posterior.d(), |i, j| held[i][j]);
    posterior.predict_f(&x).mean.column(0).iter().copied().collect()
}

/// The smallest finite value (the largest with `maximize`); 0, the
/// standardised mean, when there is none.
fn best(values: impl IntoIterator<Item = f64>, maximize: bool) -> f64 {
    let finite = values.into_iter().filter(|v| v.is_finite());
    let best = if maximize {
        finite.reduce(f64::max)
    } else {
        finite.reduce(f64::min)
    };
    best.unwrap_or(0.0)
}

/// The model learned from every row of `file` as one batch, on inputs (and,
/// for regression, targets) standardised over the file.
fn from_file(file: &Path, args: &SuggestArgs) -> Result<Fitted> {
    let Some(text) = args.likelihood.as_deref() else {
        bail!("--data needs --likelihood to say what the targets are");
    };
    let likelihood = Likelihood::parse(text).map_err(|e| refusal("--likelihood", e))?;
    let settings = args.learning.settings()?;
    check_acquisition_fits(args, &likelihood)?;
    let mut spec = args.columns.spec()?;
    spec.not_features.extend(args.success_target.clone());
    let table = Table::read(file, &spec)?;
    check_dimension(&args.bounds, table.d())?;
    if table.ids.is_empty() {
        bail!("{}: no rows to learn from", file.display());
    }
    let y = table.labels.as_deref().unwrap_or_default();
    let regression = matches!(likelihood, Likelihood::Gaussian { .. } | Likelihood::StudentT { .. });
    let scaling = Standardizer::fit(&table.features, regression.then_some(y));
    let data = Data::new(scaling.transform_x(&table.features), scaling.transform_y(y))
        .with_context(|| format!("{}", file.display()))?;
    data.check(data.d(), &likelihood).map_err(|e| {
        anyhow!(
            "{}: {e}: --likelihood {} does not fit these labels",
            file.display(),
            likelihood.name()
        )
    })?;
    let (posterior, likelihood) = learn(args.method, &settings, likelihood, &data)
        .with_context(|| format!("cannot learn from {}", file.display()))?;
    let (success, incumbent) = match &args.success_target {
        None => (None, best(data.y().iter().copied(), args.maximize)),
        Some(column) => {
            let outcomes = successes(file, args, column, table.ids.len())?;
            let outcome_data = Data::new(data.x().clone(), DVector::from_column_slice(&outcomes))?;
            let bernoulli = Likelihood::parse("bernoulli").map_err(|e| refusal("--success-target", e))?;
            let model = learn(args.method, &settings, bernoulli, &outcome_data)
                .with_context(|| format!("cannot learn --success-target {column} from {}", file.display()))?;
            // Improvement counts over the best success (Gardner et al. 2014);
            // over the best of all while none succeeded.
            let succeeded = data.y().iter().zip(&outcomes).filter(|(_, &s)| s == 1.0);
            let incumbent = match succeeded.clone().count() {
                0 => best(data.y().iter().copied(), args.maximize),
                _ => best(succeeded.map(|(&y, _)| y), args.maximize),
            };
            (Some(model), incumbent)
        }
    };
    Ok(Fitted {
        posterior,
        likelihood,
        scaling,
        incumbent,
        success,
    })
}

/// `column` of `file` (0 a failure, 1 a success), one per row the target was read from.
fn successes(file: &Path, args: &SuggestArgs, column: &str, rows: usize) -> Result<Vec<f64>> {
    let columns = ColumnArgs {
        target: Some(column.to_owned()),
        ..args.columns.clone()
    };
    let mut spec = columns.spec()?;
    // The reward is no feature here either (a glob of features would take it).
    let reward = args.columns.spec()?.label;
    spec.not_features.extend(reward.name().map(str::to_owned));
    let outcomes = Table::read(file, &spec)?;
    let labels = outcomes.labels.unwrap_or_default();
    if labels.len() != rows {
        bail!(
            "--success-target {column}: {} rows where the target has {rows}",
            labels.len()
        );
    }
    if let Some(bad) = labels.iter().find(|&&v| v != 0.0 && v != 1.0) {
        bail!("--success-target {column}: {bad} is neither 0 (a failure) nor 1 (a success)");
    }
    Ok(labels)
}

/// The posterior and likelihood `method` learns from `data` in one batch.
fn learn(
    method: Method,
    settings: &Settings,
    likelihood: Likelihood,
    data: &Data,
) -> Result<(DualPosterior, Likelihood)> {
    let (kernel, likelihood) = (settings.kernel(data.d()), settings.likelihood(likelihood));
    if method == Method::Offline {
        let model = settings.fit_offline(kernel, likelihood, data, 1)?;
        return Ok((model.posterior, model.likelihood));
    }
    let first_rows = settings.first_inducing(data.x());
    let mut learner = settings.streaming_learner(method, kernel, likelihood, first_rows, 1)?;
    learner.learn_batch(data)?;
    Ok((learner.fitted()?.clone(), learner.likelihood().clone()))
}

/// Algorithm 2 on the standardised scale, the points mapped back.
fn propose(fitted: &Fitted, args: &SuggestArgs) -> Result<Suggestion> {
    let surrogate = Conditioned::growing(&fitted.posterior, fitted.likelihood.clone())?;
    let mut models: Vec<Box<dyn Surrogate>> = vec![Box::new(surrogate)];
    if let Some((posterior, likelihood)) = &fitted.success {
        models.push(Box::new(Conditioned::growing(posterior, likelihood.clone())?));
    }
    let search = Search::in_box(standardised(&args.bounds, &fitted.scaling));
    let fantasy = match args.fantasy {
        FantasyName::Mean => Fantasy::Mean,
        FantasyName::Sample => Fantasy::Sample,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(args.learning.seed.unwrap_or(0));
    let acquisition = acquisition(args, fitted.incumbent);
    let batch = propose_batch(&mut models, &acquisition, args.batch, &search, fantasy, &mut rng)
        .map_err(|e| refusal("cannot choose a batch", e))?;
    let points = batch
        .iter()
        .map(|p| in_data_units(&p.x, &fitted.scaling, &args.bounds))
        .collect();
    Ok(Suggestion { points })
}

/// `lo' = (lo − mean) / std` per input: a positive std keeps `lo' < hi'`.
fn standardised(bounds: &Bounds, scaling: &Standardizer) -> Vec<(f64, f64)> {
    let to = |j: usize, v: f64| (v - scaling.x_mean[j]) / scaling.x_std[j];
    bounds
        .0
        .iter()
        .enumerate()
        .map(|(j, &(lo, hi))| (to(j, lo), to(j, hi)))
        .collect()
}

/// A standardised point in the data's units, kept inside the bounds that
/// rounding on the way there and back could leave by an ulp.
fn in_data_units(x: &[f64], scaling: &Standardizer, bounds: &Bounds) -> Vec<f64> {
    x.iter()
        .zip(&bounds.0)
        .enumerate()
        .map(|(j, (v, &(lo, hi)))| (v * scaling.x_std[j] + scaling.x_mean[j]).clamp(lo, hi))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_parse_one_range_per_input_and_refuse_bad_ones() {
        let parsed: Bounds = "100,300; -50,-10;".parse().unwrap();
        assert_eq!(parsed, Bounds(vec![(100.0, 300.0), (-50.0, -10.0)]));
        for (text, why) in [
            ("1,0", "not below"),
            ("0,1;2,2", "x1: the lower bound 2 is not below"),
            ("0,1;2", "x1: `2` is not `lo,hi`"),
            ("0,a", "`a` is not a number"),
            ("nan,1", "must be finite"),
            ("0,inf", "must be finite"),
            ("", "is not `lo,hi`"),
        ] {
            let err = text.parse::<Bounds>().unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn points_map_back_into_the_data_units_and_the_box() {
        let x = DMatrix::from_row_slice(3, 2, &[100.0, -50.0, 200.0, -30.0, 300.0, -10.0]);
        let scaling = Standardizer::fit(&x, None);
        let bounds: Bounds = "100,300;-50,-10".parse().unwrap();
        let standard = standardised(&bounds, &scaling);
        for (j, &(lo, hi)) in standard.iter().enumerate() {
            assert!(lo < 0.0 && 0.0 < hi, "x{j}: the data's mean lies inside, got {lo},{hi}");
        }
        let corner = in_data_units(&[standard[0].0, standard[1].1], &scaling, &bounds);
        assert_eq!(corner, vec![100.0, -10.0]);
        // Past the box by rounding or more: back on its face.
        assert_eq!(in_data_units(&[-1e9, 1e9], &scaling, &bounds), vec![100.0, -10.0]);
    }

    #[test]
    fn the_incumbent_is_the_best_finite_value() {
        assert_eq!(best([3.0, f64::NAN, -1.0, 2.0], false), -1.0);
        assert_eq!(best([3.0, f64::NAN, -1.0, 2.0], true), 3.0);
        assert_eq!(best([], true), 0.0);
    }
}
