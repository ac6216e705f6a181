//! The model flags `eval`, `replay` and `serve` share, and the settings they
//! resolve to ([`ModelArgs::settings`]): the learner's preset from the model
//! crate ([`SequentialConfig::tuned`], or `reference`), the kernel's
//! defaults, and every flag given over them.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use dualgp_operators::model::dual::forgetting::Forgetting;
use dualgp_operators::model::dual::presets::{LBFGS_HISTORY, MEMORY_BOUND};
use dualgp_operators::model::{
    fit_offline, Data, EStepConfig, Family, InducingPolicy, Kernel, Likelihood, MemoryPolicy, MemoryShare,
    OfflineConfig, OfflineModel, Optimizer, OsgprConfig, OsgprInducing, OsgprLearner, PastInMStep, Pivot,
    SequentialConfig, SequentialLearner, StreamingLearner, ThetaConfig, VarGpConfig, VarGpLearner, VarGpTheta,
    VarGpVariant,
};
use nalgebra::DMatrix;
use serde::Deserialize;

/// Named sets of model settings, under the flags given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// The reference implementation's settings (AaltoML/sequential-gp).
    Reference,
}

/// The learners `--method` chooses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// The memory-based dual sparse GP (Chang et al. 2023).
    DualMemory,
    /// Bui et al.'s streaming sparse GP (2017).
    Osgpr,
    /// Kapoor et al.'s variational auto-regressive GP (2021): `--inducing`
    /// new inducing inputs a batch (a task), the earlier ones frozen.
    VarGp,
    /// All training data at once (t-SVGP): the gold standard, not a streaming learner.
    Offline,
}

impl Method {
    /// The name `--method` takes and reports carry.
    pub fn name(self) -> &'static str {
        match self {
            Method::DualMemory => "dual-memory",
            Method::Osgpr => "osgpr",
            Method::VarGp => "var-gp",
            Method::Offline => "offline",
        }
    }
}

/// `--kernel`: the stationary kernel, or a linear one alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelName {
    /// Matérn 5/2: twice differentiable functions.
    Matern52,
    /// Matérn 3/2: once differentiable functions.
    Matern32,
    /// Matérn 1/2: continuous, rough functions.
    Matern12,
    /// Squared exponential: infinitely smooth functions.
    Rbf,
    /// `σ² xᵀx` alone: Bayesian linear regression (with softmax, multinomial logistic).
    Linear,
}

/// `--inducing-policy`: where the inducing inputs come from as batches arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InducingPolicyName {
    /// Chosen from the first batch, then kept.
    Fixed,
    /// Pivoted Cholesky over the current ones and each new batch.
    Pivoted,
}

/// `--inducing-pivot`: how pivoted Cholesky picks inducing inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PivotName {
    /// The point of largest residual variance.
    Variance,
    /// The point that most reduces the residual variance summed over the data.
    Trace,
}

/// `--var-gp-variant`: seed 004's model or one of its Appendix B ablations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VarGpVariantName {
    /// Each task's block conditioned on the frozen earlier ones (VAR-GP).
    Ar,
    /// No auto-regressive term: each block against its own prior N(0, K(Z_t, Z_t)).
    Global,
    /// Re-VAR-GP: every block re-learned with each task.
    Retrain,
}

/// `--var-gp-theta`: where VAR-GP's hyperparameters come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VarGpThetaName {
    /// The starting kernel throughout.
    Held,
    /// Fitted on the first task (`--m-rounds`, `--m-steps`), then held.
    FirstTask,
    /// The seed's log-normal posterior, re-learned with each task, averaged over in predictions.
    Posterior,
}

/// `--m-optimizer`: the M-step's optimiser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerName {
    /// Adam, a fixed number of steps.
    Adam,
    /// L-BFGS, to convergence or the iteration budget.
    Lbfgs,
}

/// `--m-past`: how the M-step stands for past data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PastName {
    /// The memory's terms scaled by n_old/|M| (the paper).
    ScaledMemory,
    /// Past data's message about f(Z) held, the memory's terms as they are.
    Message,
}

/// `--memory-share`: a fixed share of the past in `[0, 1]`, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "String")]
pub struct MemoryShareName(pub MemoryShare);

impl std::str::FromStr for MemoryShareName {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let share = match s {
            "auto" => MemoryShare::Estimated,
            _ => MemoryShare::Fixed(s.parse().map_err(|_| format!("{s}: give a number in [0, 1] or auto"))?),
        };
        if share.is_valid() {
            Ok(MemoryShareName(share))
        } else {
            Err(format!("{s}: the share of the past lies in [0, 1]"))
        }
    }
}

impl TryFrom<String> for MemoryShareName {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

/// `--forget-half-life`: records after which a record's weight halves, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "NumberOrWord")]
pub struct ForgettingName(pub Forgetting);

/// A pipeline file's value that is a number or a word (`500` or `"auto"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrWord {
    Number(f64),
    Word(String),
}

impl std::str::FromStr for ForgettingName {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let forgetting = match s {
            "auto" => Forgetting::Auto,
            _ => Forgetting::HalfLife(
                s.parse()
                    .map_err(|_| format!("{s}: give a number of records or auto"))?,
            ),
        };
        forgetting.validate().map_err(|e| format!("{s}: {e}"))?;
        Ok(ForgettingName(forgetting))
    }
}

impl TryFrom<NumberOrWord> for ForgettingName {
    type Error = String;

    fn try_from(value: NumberOrWord) -> std::result::Result<Self, String> {
        match value {
            NumberOrWord::Number(n) => n.to_string().parse(),
            NumberOrWord::Word(s) => s.parse(),
        }
    }
}

/// `--m-sample`: how many points of the batch and memory the M-step works on, or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "String")]
pub struct SampleName(pub Option<usize>);

impl std::str::FromStr for SampleName {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "all" => Ok(SampleName(None)),
            _ => match s.parse() {
                Ok(n) if n > 0 => Ok(SampleName(Some(n))),
                _ => Err(format!("{s}: give a number of points (at least 1) or all")),
            },
        }
    }
}

impl TryFrom<String> for SampleName {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

/// `--memory-policy`: which points the memory keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryPolicyName {
    /// By Bayesian leverage score: the points the model is least sure of.
    Bls,
    /// Uniformly at random.
    Random,
    /// No memory.
    None,
}

/// Every model flag is optional: unset flags take the defaults or the preset's.
/// In a pipeline file (`dualgp run`) the same names form the `[model]` table.
#[derive(Debug, Clone, Default, PartialEq, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelArgs {
    /// Start from a named set of settings; other flags override it.
    #[arg(long)]
    pub preset: Option<Preset>,
    /// The stationary kernel (default matern52).
    #[arg(long)]
    pub kernel: Option<KernelName>,
    /// One lengthscale per input (`--ard`, `--ard true`) or one for all (`--ard
    /// false`); by default one per input up to 32 inputs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub ard: Option<bool>,
    /// Add a constant kernel (a bias shared by all inputs, one per latent function).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub bias: Option<bool>,
    /// Add a linear kernel (Bayesian linear regression on the inputs), which
    /// a stationary kernel reaches only as its variance and lengthscale run off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub linear: Option<bool>,
    /// The stationary kernel's variance to start from (default 1).
    #[arg(long)]
    pub kernel_variance: Option<f64>,
    /// The lengthscale(s) to start from (default √d, or 1 with the reference preset).
    #[arg(long)]
    pub lengthscale: Option<f64>,
    /// Inducing inputs (default 100; VAR-GP: each task's).
    #[arg(long)]
    pub inducing: Option<usize>,
    /// Where the inducing inputs come from as batches arrive.
    #[arg(long)]
    pub inducing_policy: Option<InducingPolicyName>,
    /// How pivoted Cholesky picks inducing inputs: largest residual variance
    /// (default), or largest reduction of the residual variance summed over
    /// the data, past inducing inputs standing for the points seen (docs/MODEL.md).
    #[arg(long)]
    pub inducing_pivot: Option<PivotName>,
    /// The M-step moves the inducing inputs with the hyperparameters, from
    /// where the inducing policy put them (dual-memory; true|false).
    #[arg(long)]
    pub learn_inducing: Option<bool>,
    /// Points of each batch that join the memory.
    #[arg(long)]
    pub memory_per_batch: Option<usize>,
    /// Which points the memory keeps.
    #[arg(long)]
    pub memory_policy: Option<MemoryPolicyName>,
    /// Bound the memory: alone, a reservoir over the whole stream, uniform
    /// (BLS-weighted with --memory-policy bls); with --memory-per-batch, the
    /// bound of the per-batch memory (default 1000; the reference preset: none).
    #[arg(long)]
    pub memory_capacity: Option<usize>,
    /// The memory as a control variate for all past data: its re-learned
    /// terms count `n_old / |M|` times beside every past point's first sites (true|false).
    #[arg(long)]
    pub memory_control_variate: Option<bool>,
    /// How much of the past the memory stands for: past points' frozen sites
    /// keep `1 − γ` of their weight and the memory's terms count `1 + γ(n_old/|M| − 1)`
    /// times; 0 is the paper's memory, 1 the memory as a sample of all past
    /// data, `auto` (default) chooses γ at each update from the bias the
    /// memory shows in the frozen sites.
    #[arg(long)]
    pub memory_share: Option<MemoryShareName>,
    /// E-step iterations (osgpr: at most this many natural-gradient steps for a non-Gaussian q(b), default 50;
    /// var-gp: at most this many for each task's block, default 50).
    #[arg(long)]
    pub e_steps: Option<usize>,
    /// E-step damping ρ (osgpr and var-gp default 1).
    #[arg(long)]
    pub e_lr: Option<f64>,
    /// The M-step's optimiser (dual-memory).
    #[arg(long)]
    pub m_optimizer: Option<OptimizerName>,
    /// Adam steps or L-BFGS iterations per M-step round (osgpr: L-BFGS iterations per batch, default 100;
    /// var-gp: L-BFGS iterations of each task's step on q(θ), default 20, or of the first task's fit
    /// with --var-gp-theta first-task; offline: L-BFGS iterations of the whole fit, default 120).
    #[arg(long)]
    pub m_steps: Option<usize>,
    /// Adam's learning rate.
    #[arg(long)]
    pub m_lr: Option<f64>,
    /// Re-learn the batch and memory at every hyperparameter value the M-step tries (true|false).
    #[arg(long)]
    pub m_relearn: Option<bool>,
    /// How the M-step stands for past data no longer at hand (dual-memory).
    #[arg(long)]
    pub m_past: Option<PastName>,
    /// M-step rounds per batch, the batch and memory re-learned between them.
    #[arg(long)]
    pub m_rounds: Option<usize>,
    /// Records between M-steps (fewer early on: as many as came before; an
    /// epoch of half as many, or on new ground, takes its own): the epochs
    /// between are learned by E-steps alone, and the next M-step re-learns
    /// their records with its own (0: an M-step every epoch).
    #[arg(long)]
    pub m_every: Option<usize>,
    /// An L-BFGS iteration that gains less (nats) ends an M-step round (dual-memory, default 0.1; 0: none).
    #[arg(long)]
    pub m_tolerance: Option<f64>,
    /// The M-step works on about this many points of the batch and memory,
    /// drawn anew each update, the others held in past data's message; `all`: every point.
    #[arg(long)]
    pub m_sample: Option<SampleName>,
    /// Past records lose weight with age: a record's weight halves every this
    /// many records that arrive after it (this much time with
    /// `--time-column`), or `auto`: an update discounts the past only when
    /// its batch, scored first, is significantly more probable so
    /// (dual-memory; default: none, the past keeps its weight; `auto` with
    /// `--time-column`). For streams that drift.
    #[arg(long, value_name = "RECORDS|auto")]
    pub forget_half_life: Option<ForgettingName>,
    /// Seed of every random choice (memory sampling, Monte Carlo): runs are reproducible (default 0).
    #[arg(long)]
    pub seed: Option<u64>,
    /// var-gp: the model, default ar (VAR-GP); global and retrain are the seed's ablations.
    #[arg(long)]
    pub var_gp_variant: Option<VarGpVariantName>,
    /// var-gp: the hyperparameters held at the start, fitted on the first task,
    /// or given the seed's posterior (the default for ar; the ablations hold θ,
    /// or fit it on the first task when --m-steps is given).
    #[arg(long)]
    pub var_gp_theta: Option<VarGpThetaName>,
    /// var-gp, posterior: the weight β of KL[q_t(θ) ‖ q_{t−1}(θ)] (default 1).
    #[arg(long)]
    pub var_gp_beta: Option<f64>,
    /// var-gp, posterior: the first task's prior sd of each log-hyperparameter (default 1).
    #[arg(long)]
    pub var_gp_prior_sd: Option<f64>,
    /// var-gp, posterior: draws of θ per Monte Carlo average, in learning and predicting (default 4).
    #[arg(long)]
    pub var_gp_samples: Option<usize>,
}

/// Inputs up to which the defaults learn one lengthscale per input. Beyond,
/// the M-step on one batch switches inputs off at will: on split
/// Fashion-MNIST (784 pixels) ARD lengthscales ran to 10⁴–10¹⁴ and the kernel
/// variance to 10⁵, final NLPD 2.75 against 0.78 with one lengthscale
/// (docs/RESULTS.md). Every paper-uci set has at most 18 inputs.
pub const ARD_MAX_INPUTS: usize = 32;

/// The settings after defaults, preset and flags are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The stationary part's family; `None`: no stationary part (`--kernel linear`).
    pub family: Option<Family>,
    /// One lengthscale per input; `None`: up to [`ARD_MAX_INPUTS`] inputs.
    pub ard: Option<bool>,
    /// Add a constant kernel.
    pub bias: bool,
    /// Add a linear kernel.
    pub linear: bool,
    /// The Gaussian noise variance to start from.
    pub noise: f64,
    /// `--method dual-memory`'s settings.
    pub sequential: SequentialConfig,
    /// `--method osgpr`: `--m-steps` are L-BFGS iterations, `--e-steps` and
    /// `--e-lr` bound the natural-gradient steps for a non-Gaussian `q(b)`.
    pub osgpr: OsgprConfig,
    /// `--method var-gp`: `--inducing` a task, `--e-steps`/`--e-lr` each
    /// task's E-step, `--m-steps`/`--m-rounds` its learning of `θ`.
    pub var_gp: VarGpConfig,
    /// `--method offline`: `--m-steps` are the fit's L-BFGS iterations.
    pub offline: OfflineConfig,
    /// A conjugate likelihood's M-step runs [`CONJUGATE_M_STEPS`](dualgp_operators::model::dual::presets::CONJUGATE_M_STEPS) iterations
    /// with no gain tolerance (see [`Settings::sequential_for`]); off once
    /// `--m-steps` or `--m-tolerance` is given, and in the reference preset.
    pub conjugate_m_step: bool,
    /// The reference keeps `Z` at the first `m` train rows.
    pub z_first_rows: bool,
    /// The stationary part's starting variance.
    pub kernel_variance: f64,
    /// The stationary part's starting lengthscale; `None`: √d, the scale of
    /// distances between standardised inputs.
    pub lengthscale: Option<f64>,
}

impl ModelArgs {
    /// These settings with every flag `over` gives taking precedence.
    pub fn overridden_by(&self, over: &ModelArgs) -> ModelArgs {
        ModelArgs {
            preset: over.preset.or(self.preset),
            kernel: over.kernel.or(self.kernel),
            ard: over.ard.or(self.ard),
            bias: over.bias.or(self.bias),
            linear: over.linear.or(self.linear),
            kernel_variance: over.kernel_variance.or(self.kernel_variance),
            lengthscale: over.lengthscale.or(self.lengthscale),
            inducing: over.inducing.or(self.inducing),
            inducing_policy: over.inducing_policy.or(self.inducing_policy),
            inducing_pivot: over.inducing_pivot.or(self.inducing_pivot),
            learn_inducing: over.learn_inducing.or(self.learn_inducing),
            memory_per_batch: over.memory_per_batch.or(self.memory_per_batch),
            memory_policy: over.memory_policy.or(self.memory_policy),
            memory_capacity: over.memory_capacity.or(self.memory_capacity),
            memory_control_variate: over.memory_control_variate.or(self.memory_control_variate),
            memory_share: over.memory_share.or(self.memory_share),
            e_steps: over.e_steps.or(self.e_steps),
            e_lr: over.e_lr.or(self.e_lr),
            m_optimizer: over.m_optimizer.or(self.m_optimizer),
            m_steps: over.m_steps.or(self.m_steps),
            m_lr: over.m_lr.or(self.m_lr),
            m_relearn: over.m_relearn.or(self.m_relearn),
            m_past: over.m_past.or(self.m_past),
            m_rounds: over.m_rounds.or(self.m_rounds),
            m_every: over.m_every.or(self.m_every),
            m_tolerance: over.m_tolerance.or(self.m_tolerance),
            m_sample: over.m_sample.or(self.m_sample),
            forget_half_life: over.forget_half_life.or(self.forget_half_life),
            seed: over.seed.or(self.seed),
            var_gp_variant: over.var_gp_variant.or(self.var_gp_variant),
            var_gp_theta: over.var_gp_theta.or(self.var_gp_theta),
            var_gp_beta: over.var_gp_beta.or(self.var_gp_beta),
            var_gp_prior_sd: over.var_gp_prior_sd.or(self.var_gp_prior_sd),
            var_gp_samples: over.var_gp_samples.or(self.var_gp_samples),
        }
    }
}

/// Adam's learning rate when `--m-lr` is not given.
const ADAM_LR: f64 = 0.05;
/// L-BFGS iterations per batch for `--method osgpr` when `--m-steps` is not given.
const OSGPR_ITERATIONS: usize = 100;

impl ModelArgs {
    /// Whether any model flag is given (`--seed` aside): a model read from a
    /// file (`--model`) runs with its own settings, which these would not change.
    pub fn any_given(&self) -> bool {
        ModelArgs {
            seed: None,
            ..self.clone()
        } != ModelArgs::default()
    }
}

impl ModelArgs {
    /// [`settings`](Self::settings) for a stream whose records carry times
    /// (`--time-column`): there forgetting is `auto` unless the flag says
    /// otherwise, since a time column is given for a level that moves (a
    /// wandering level with its date column dropped: mean absolute error
    /// 0.76 without forgetting, 0.32 with `auto`; docs/RESULTS.md).
    pub fn settings_for_stream(&self, timed: bool) -> Result<Settings> {
        let mut settings = self.settings()?;
        if timed && self.forget_half_life.is_none() {
            settings.sequential.forgetting = Some(Forgetting::Auto);
        }
        Ok(settings)
    }

    /// Defaults are the project's best settings (docs/MODEL.md, "Defaults"); `--preset reference`
    /// replaces them with the reference code's; given flags override both.
    pub fn settings(&self) -> Result<Settings> {
        let reference = self.preset == Some(Preset::Reference);
        let mut s = if reference {
            Settings {
                family: Some(Family::Matern52),
                ard: Some(false),
                bias: false,
                linear: false,
                noise: 0.1,
                sequential: SequentialConfig::reference(self.seed.unwrap_or(0)),
                osgpr: OsgprConfig::default(),
                var_gp: VarGpConfig::default(),
                offline: OfflineConfig::default(),
                conjugate_m_step: false,
                z_first_rows: true,
                kernel_variance: 1.0,
                lengthscale: Some(1.0),
            }
        } else {
            Settings {
                family: Some(Family::Matern52),
                ard: None,
                bias: false,
                linear: false,
                noise: 0.1,
                sequential: SequentialConfig::tuned(self.seed.unwrap_or(0)),
                osgpr: OsgprConfig::default(),
                var_gp: VarGpConfig::default(),
                offline: OfflineConfig::default(),
                conjugate_m_step: true,
                z_first_rows: false,
                kernel_variance: 1.0,
                lengthscale: None,
            }
        };
        if let Some(k) = self.kernel {
            s.family = match k {
                KernelName::Matern52 => Some(Family::Matern52),
                KernelName::Matern32 => Some(Family::Matern32),
                KernelName::Matern12 => Some(Family::Matern12),
                KernelName::Rbf => Some(Family::SquaredExponential),
                KernelName::Linear => None,
            };
        }
        if self.ard.is_some() {
            s.ard = self.ard;
        }
        for (flag, value) in [
            ("--kernel-variance", self.kernel_variance),
            ("--lengthscale", self.lengthscale),
        ] {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
                bail!("{flag} {v}: give a positive, finite value");
            }
        }
        s.kernel_variance = self.kernel_variance.unwrap_or(s.kernel_variance);
        s.lengthscale = self.lengthscale.or(s.lengthscale);
        if let Some(bias) = self.bias {
            s.bias = bias;
        }
        if let Some(linear) = self.linear {
            s.linear = linear;
        }
        let q = &mut s.sequential;
        if let Some(m) = self.inducing {
            if m == 0 {
                bail!("--inducing 0: the model needs at least one inducing input");
            }
            q.inducing = m;
        }
        if let Some(p) = self.inducing_pivot {
            q.pivot = match p {
                PivotName::Variance => Pivot::Variance,
                PivotName::Trace => Pivot::Trace,
            };
        }
        if let Some(p) = self.inducing_policy {
            q.inducing_policy = match p {
                InducingPolicyName::Fixed => InducingPolicy::Fixed,
                InducingPolicyName::Pivoted => InducingPolicy::Pivoted,
            };
            s.z_first_rows &= p == InducingPolicyName::Fixed;
        }
        if let Some(learn) = self.learn_inducing {
            q.learn_inducing = learn;
        }
        if let Some(n) = self.e_steps {
            q.e_step.steps = n;
        }
        if let Some(rho) = self.e_lr {
            q.e_step.rho = rho;
        }
        if let Some(n) = self.m_steps {
            q.m_steps = n;
            s.offline.m_steps = n;
        }
        if let Some(tolerance) = self.m_tolerance {
            q.m_tolerance = tolerance;
        }
        s.conjugate_m_step &= self.m_steps.is_none() && self.m_tolerance.is_none();
        q.optimizer = match (self.m_optimizer, self.m_lr, q.optimizer) {
            (Some(OptimizerName::Lbfgs), Some(_), _) => bail!("--m-lr is Adam's: drop it or use --m-optimizer adam"),
            (Some(OptimizerName::Lbfgs), None, _) => Optimizer::Lbfgs { history: LBFGS_HISTORY },
            (Some(OptimizerName::Adam), lr, _) => Optimizer::Adam {
                lr: lr.unwrap_or(ADAM_LR),
            },
            (None, Some(_), Optimizer::Lbfgs { .. }) => {
                bail!("--m-lr is Adam's: add --m-optimizer adam or drop it")
            }
            (None, Some(lr), Optimizer::Adam { .. }) => Optimizer::Adam { lr },
            (None, None, current) => current,
        };
        if let Some(relearn) = self.m_relearn {
            q.relearn_in_m_step = relearn;
        }
        if let Some(control_variate) = self.memory_control_variate {
            q.memory_control_variate = control_variate;
        }
        if let Some(MemoryShareName(share)) = self.memory_share {
            q.memory_share = share;
        }
        if q.memory_control_variate && self.memory_share.is_none() {
            // The control variate replaces the share; it is not added to it.
            q.memory_share = MemoryShare::OWN;
        }
        if let Some(past) = self.m_past {
            q.past_in_m_step = match past {
                PastName::ScaledMemory => PastInMStep::ScaledMemory,
                PastName::Message => PastInMStep::Message,
            };
        }
        if q.past_in_m_step == PastInMStep::Message && !q.relearn_in_m_step {
            bail!(
                "--m-relearn false needs --m-past scaled-memory: past data as a message (the default) \
                 needs the batch re-learned at every θ"
            );
        }
        if let Some(r) = self.m_rounds {
            q.m_rounds = r;
        }
        q.m_every = self.m_every.unwrap_or(q.m_every);
        if let Some(ForgettingName(forgetting)) = self.forget_half_life {
            q.forgetting = Some(forgetting);
        }
        if let Some(SampleName(bound)) = self.m_sample {
            q.m_sample = bound;
        }
        if q.past_in_m_step != PastInMStep::Message {
            if matches!(self.m_sample, Some(SampleName(Some(_)))) {
                bail!("--m-sample needs --m-past message: the points left out join past data's message");
            }
            q.m_sample = None;
        }
        let (k, bound) = match q.memory {
            MemoryPolicy::PerBatch { k, capacity } | MemoryPolicy::Random { k, capacity } => (k, capacity),
            _ => (20, Some(MEMORY_BOUND)),
        };
        let k = self.memory_per_batch.unwrap_or(k);
        // Without --memory-policy, the preset's kind of memory: uniform by default, BLS for the reference.
        let policy = self.memory_policy.unwrap_or(match q.memory {
            MemoryPolicy::PerBatch { .. } | MemoryPolicy::Reservoir { .. } => MemoryPolicyName::Bls,
            MemoryPolicy::Random { .. } | MemoryPolicy::RandomReservoir { .. } => MemoryPolicyName::Random,
            MemoryPolicy::None => MemoryPolicyName::None,
        });
        // A capacity alone is a reservoir; beside a per-batch count, its bound.
        let reservoir = self.memory_capacity.filter(|_| self.memory_per_batch.is_none());
        let capacity = self.memory_capacity.or(bound);
        q.memory = match (policy, reservoir) {
            (MemoryPolicyName::None, _) => MemoryPolicy::None,
            (MemoryPolicyName::Random, Some(capacity)) => MemoryPolicy::RandomReservoir { capacity },
            (MemoryPolicyName::Random, None) => MemoryPolicy::Random { k, capacity },
            (MemoryPolicyName::Bls, Some(capacity)) => MemoryPolicy::Reservoir { capacity },
            (MemoryPolicyName::Bls, None) => MemoryPolicy::PerBatch { k, capacity },
        };
        q.validate()
            .map_err(|e| anyhow::anyhow!("{e}; change --e-lr, --m-lr or --m-tolerance"))?;
        s.osgpr = self.osgpr_config(&s.sequential)?;
        s.var_gp = self.var_gp_config(&s.sequential)?;
        Ok(s)
    }

    /// VAR-GP takes `m` (a task) and the step flags; its pivot is its own
    /// (trace) unless `--inducing-pivot` is given; `θ` is as
    /// `--var-gp-theta` says. By default VAR-GP (`ar`) learns the seed's
    /// posterior, `--m-steps` and `--m-rounds` its θ step's iterations and
    /// rounds; the ablations, for which that posterior is not built, hold `θ`
    /// at the starting kernel unless `--m-steps N` fits it on the first task.
    fn var_gp_config(&self, q: &SequentialConfig) -> Result<VarGpConfig> {
        let defaults = VarGpConfig::default();
        let variant = match self.var_gp_variant {
            None | Some(VarGpVariantName::Ar) => VarGpVariant::Ar,
            Some(VarGpVariantName::Global) => VarGpVariant::Global,
            Some(VarGpVariantName::Retrain) => VarGpVariant::Retrain,
        };
        let held_or_first_task = |rounds: usize, m_steps: usize| {
            if rounds == 0 || m_steps == 0 {
                VarGpTheta::Fixed
            } else {
                VarGpTheta::FirstTask { rounds, m_steps }
            }
        };
        let rounds = self.m_rounds.unwrap_or(1);
        let config = VarGpConfig {
            inducing: q.inducing,
            pivot: if self.inducing_pivot.is_some() {
                q.pivot
            } else {
                defaults.pivot
            },
            e_step: EStepConfig {
                steps: self.e_steps.unwrap_or(defaults.e_step.steps),
                rho: self.e_lr.unwrap_or(defaults.e_step.rho),
            },
            theta: match self.var_gp_theta {
                None if variant != VarGpVariant::Ar => held_or_first_task(rounds, self.m_steps.unwrap_or(0)),
                Some(VarGpThetaName::Held) => VarGpTheta::Fixed,
                Some(VarGpThetaName::FirstTask) => held_or_first_task(rounds, self.m_steps.unwrap_or(20)),
                None | Some(VarGpThetaName::Posterior) => {
                    let defaults = ThetaConfig::default();
                    VarGpTheta::Posterior(ThetaConfig {
                        prior_sd: self.var_gp_prior_sd.unwrap_or(defaults.prior_sd),
                        beta: self.var_gp_beta.unwrap_or(defaults.beta),
                        samples: self.var_gp_samples.unwrap_or(defaults.samples),
                        rounds,
                        m_steps: self.m_steps.unwrap_or(defaults.m_steps),
                        seed: self.seed.unwrap_or(defaults.seed),
                    })
                }
            },
            variant,
            ..defaults
        };
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("--method var-gp: {e}; change --e-steps, --e-lr or the --var-gp-* flags"))?;
        Ok(config)
    }

    /// Bui et al.'s learner shares `m`, the inducing policy and the seed with
    /// the sequential settings; its own schedule comes from the step flags.
    fn osgpr_config(&self, q: &SequentialConfig) -> Result<OsgprConfig> {
        let defaults = OsgprConfig::default();
        let config = OsgprConfig {
            inducing: q.inducing,
            inducing_policy: match q.inducing_policy {
                InducingPolicy::Fixed => OsgprInducing::Fixed,
                InducingPolicy::Pivoted => defaults.inducing_policy,
            },
            max_iter: self.m_steps.unwrap_or(OSGPR_ITERATIONS),
            q_steps: self.e_steps.unwrap_or(defaults.q_steps),
            q_rho: self.e_lr.unwrap_or(defaults.q_rho),
            seed: self.seed.unwrap_or(0),
            ..defaults
        };
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("--method osgpr: {e}; change --e-steps or --e-lr"))?;
        Ok(config)
    }
}

impl Settings {
    /// The starting kernel of `likelihood`'s model over `features`
    /// (standardised) inputs: for a multi-output model, `Q` copies of
    /// [`kernel`](Self::kernel)'s mixed over the outputs (read from the
    /// inputs' last column, the output index).
    pub fn model_kernel(&self, features: usize, likelihood: &Likelihood) -> Kernel {
        let base = self.kernel(features);
        match likelihood {
            Likelihood::MultiOutput(multi) => Kernel::coregional(base, multi.latents, multi.n_outputs()),
            _ => base,
        }
    }

    /// The starting kernel for `d` (standardised) inputs.
    pub fn kernel(&self, d: usize) -> Kernel {
        let lengthscale = self.lengthscale.unwrap_or((d as f64).sqrt());
        let ard = self.ard.unwrap_or(d <= ARD_MAX_INPUTS);
        let mut parts: Vec<Kernel> = self
            .family
            .map(|family| Kernel::stationary(family, self.kernel_variance, vec![lengthscale; if ard { d } else { 1 }]))
            .into_iter()
            .collect();
        if self.bias {
            parts.push(Kernel::Constant { variance: 1.0 });
        }
        if self.linear || self.family.is_none() {
            // k(x, x) = 1 on average over standardised inputs, as the others.
            parts.push(Kernel::Linear {
                variance: 1.0 / d.max(1) as f64,
            });
        }
        if parts.len() == 1 {
            parts.swap_remove(0)
        } else {
            Kernel::Sum(parts)
        }
    }

    /// Dual-memory's settings for `likelihood`: [`CONJUGATE_M_STEPS`](dualgp_operators::model::dual::presets::CONJUGATE_M_STEPS)
    /// iterations and no tolerance for a conjugate one, by default.
    pub fn sequential_for(&self, likelihood: &Likelihood) -> SequentialConfig {
        let q = self.sequential.clone();
        match self.conjugate_m_step {
            true => q.for_likelihood(likelihood),
            false => q,
        }
    }

    /// The streaming learner `method` names, from `kernel` and `likelihood`
    /// (and inducing inputs `z`, if given): the one registry of `--method`.
    /// Dual-memory answers its updates on `threads` threads; the others use one.
    pub fn streaming_learner(
        &self,
        method: Method,
        kernel: Kernel,
        likelihood: Likelihood,
        z: Option<DMatrix<f64>>,
        threads: usize,
    ) -> Result<Box<dyn StreamingLearner>> {
        if method != Method::DualMemory {
            self.refuse_forgetting(method)?;
        }
        Ok(match method {
            Method::DualMemory => Box::new(self.sequential_learner(kernel, likelihood, z, threads)?),
            Method::Osgpr => {
                let learner = OsgprLearner::new(kernel, likelihood, self.osgpr.clone())?;
                Box::new(match z {
                    Some(z) => learner.with_inducing(z)?,
                    None => learner,
                })
            }
            Method::VarGp => {
                if z.is_some() {
                    bail!("--method var-gp chooses each task's inducing inputs: drop --preset reference or --inducing-policy fixed");
                }
                Box::new(VarGpLearner::new(kernel, likelihood, self.var_gp.clone())?)
            }
            Method::Offline => bail!("--method offline learns all data at once, not a stream"),
        })
    }

    /// Only dual-memory forgets: the others would run as if the flag were not given.
    fn refuse_forgetting(&self, method: Method) -> Result<()> {
        if self.sequential.forgetting.is_some() {
            bail!(
                "--forget-half-life is dual-memory's: --method {} keeps the past whole",
                method.name()
            );
        }
        Ok(())
    }

    /// `--method dual-memory`'s learner, as [`streaming_learner`](Self::streaming_learner) makes it.
    pub fn sequential_learner(
        &self,
        kernel: Kernel,
        likelihood: Likelihood,
        z: Option<DMatrix<f64>>,
        threads: usize,
    ) -> Result<SequentialLearner> {
        let config = self.sequential_for(&likelihood);
        let learner = SequentialLearner::new(kernel, likelihood, config)?.on_threads(threads);
        Ok(match z {
            Some(z) => learner.with_inducing(z)?,
            None => learner,
        })
    }

    /// `--method offline`: the offline trainer on all of `data`, with the
    /// learners' number of inducing inputs and pivot, on `threads` threads.
    pub fn fit_offline(
        &self,
        kernel: Kernel,
        likelihood: Likelihood,
        data: &Data,
        threads: usize,
    ) -> Result<OfflineModel> {
        self.refuse_forgetting(Method::Offline)?;
        let config = OfflineConfig {
            pivot: self.sequential.pivot,
            threads,
            ..self.offline.clone()
        };
        Ok(fit_offline(
            kernel,
            likelihood,
            data,
            self.sequential.inducing,
            &config,
        )?)
    }

    /// The inducing inputs a learner starts from: the first `m` rows of `x`
    /// with the reference preset (as its reference code keeps them), else
    /// none (the learner chooses).
    pub fn first_inducing(&self, x: &DMatrix<f64>) -> Option<DMatrix<f64>> {
        self.z_first_rows
            .then(|| x.rows(0, self.sequential.inducing.min(x.nrows())).into_owned())
    }

    /// The likelihood to learn with: a Gaussian starts at the settings'
    /// noise (each Gaussian output of a multi-output model too).
    pub fn likelihood(&self, likelihood: Likelihood) -> Likelihood {
        match likelihood {
            Likelihood::Gaussian { .. } => Likelihood::Gaussian { variance: self.noise },
            Likelihood::MultiOutput(mut multi) => {
                for output in &mut multi.outputs {
                    *output = self.likelihood(output.clone());
                }
                Likelihood::MultiOutput(multi)
            }
            other => other,
        }
    }
}

/// `--workers W`, refused when zero.
pub fn check_workers(workers: usize) -> Result<()> {
    if workers == 0 {
        bail!("--workers 0: give at least one worker");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use dualgp_operators::model::dual::presets::CONJUGATE_M_STEPS;
    use dualgp_operators::model::Link;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    fn settings(args: &[&str]) -> Settings {
        let cli = Cli::try_parse_from(std::iter::once("dualgp").chain(args.iter().copied())).expect("flags parse");
        cli.model.settings().expect("settings")
    }

    /// With `--model`, a model flag would be silently ignored: it is refused
    /// instead, so none may be taken as given when the user gave none.
    #[test]
    fn only_a_flag_the_user_gave_counts_as_given() {
        let given = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("dualgp").chain(args.iter().copied())).expect("flags parse");
            cli.model.any_given()
        };
        assert!(!given(&[]));
        assert!(
            !given(&["--seed", "3"]),
            "the seed moves no learned setting of a saved model"
        );
        assert!(given(&["--inducing", "5"]));
        assert!(given(&["--kernel", "rbf"]));
    }

    #[test]
    fn forgetting_is_off_by_default_dual_memorys_alone_and_refuses_a_half_life_of_no_records() {
        assert_eq!(settings(&[]).sequential.forgetting, None);
        let forgetful = settings(&["--forget-half-life", "500"]);
        assert_eq!(forgetful.sequential.forgetting, Some(Forgetting::HalfLife(500.0)));
        let auto = settings(&["--forget-half-life", "auto"]);
        assert_eq!(auto.sequential.forgetting, Some(Forgetting::Auto));
        // A stream with a time column forgets by default, and as told when told.
        let stream = |args: &[&str], timed| {
            let cli = Cli::try_parse_from(std::iter::once("dualgp").chain(args.iter().copied())).unwrap();
            cli.model.settings_for_stream(timed).unwrap().sequential.forgetting
        };
        assert_eq!(stream(&[], true), Some(Forgetting::Auto));
        assert_eq!(
            stream(&["--forget-half-life", "500"], true),
            Some(Forgetting::HalfLife(500.0))
        );
        assert_eq!(stream(&[], false), None);
        let gaussian = Likelihood::Gaussian { variance: 0.1 };
        for method in [Method::Osgpr, Method::VarGp] {
            let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![1.0]);
            let refused = forgetful.streaming_learner(method, kernel, gaussian.clone(), None, 1);
            let message = refused.err().expect("refused").to_string();
            assert!(
                message.contains("--forget-half-life") && message.contains(method.name()),
                "{message}"
            );
        }
        for refused in ["0", "-3", "never"] {
            assert!(
                Cli::try_parse_from(["dualgp", "--forget-half-life", refused]).is_err(),
                "{refused}"
            );
        }
        // A pipeline file's [model] table takes a number or the word.
        for (toml_line, want) in [
            ("forget_half_life = 500", Forgetting::HalfLife(500.0)),
            ("forget_half_life = \"auto\"", Forgetting::Auto),
        ] {
            let args: ModelArgs = toml::from_str(toml_line).unwrap();
            assert_eq!(args.forget_half_life, Some(ForgettingName(want)));
        }
        assert!(toml::from_str::<ModelArgs>("forget_half_life = 0").is_err());
    }

    #[test]
    fn the_memory_share_is_estimated_by_default_and_can_be_fixed() {
        assert_eq!(settings(&[]).sequential.memory_share, MemoryShare::Estimated);
        assert_eq!(
            settings(&["--memory-share", "0.25"]).sequential.memory_share,
            MemoryShare::Fixed(0.25)
        );
        assert_eq!(
            settings(&["--preset", "reference"]).sequential.memory_share,
            MemoryShare::OWN
        );
        // The control variate replaces the share unless both are asked for, which is refused.
        let control = settings(&["--memory-control-variate", "true"]).sequential;
        assert!(control.memory_control_variate && control.memory_share == MemoryShare::OWN);
        let both = ["dualgp", "--memory-control-variate", "true", "--memory-share", "auto"];
        assert!(Cli::try_parse_from(both).unwrap().model.settings().is_err());
        for bad in ["1.5", "-0.1", "half"] {
            assert!(Cli::try_parse_from(["dualgp", "--memory-share", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_memory_capacity_bounds_the_random_memory_too() {
        let memory = |args: &[&str]| settings(args).sequential.memory;
        assert_eq!(
            memory(&[]),
            MemoryPolicy::Random {
                k: 20,
                capacity: Some(MEMORY_BOUND)
            }
        );
        assert_eq!(
            memory(&["--memory-capacity", "50"]),
            MemoryPolicy::RandomReservoir { capacity: 50 }
        );
        assert_eq!(
            memory(&["--memory-policy", "bls", "--memory-capacity", "50"]),
            MemoryPolicy::Reservoir { capacity: 50 }
        );
        assert_eq!(
            memory(&["--preset", "reference"]),
            MemoryPolicy::PerBatch { k: 10, capacity: None }
        );
        assert_eq!(
            memory(&["--preset", "reference", "--memory-capacity", "50"]),
            MemoryPolicy::Reservoir { capacity: 50 }
        );
        assert_eq!(
            memory(&["--memory-policy", "random", "--memory-capacity", "50"]),
            MemoryPolicy::RandomReservoir { capacity: 50 }
        );
        assert_eq!(
            memory(&["--memory-policy", "random", "--memory-per-batch", "7"]),
            MemoryPolicy::Random {
                k: 7,
                capacity: Some(MEMORY_BOUND)
            }
        );
        assert_eq!(
            memory(&["--memory-per-batch", "7", "--memory-capacity", "50"]),
            MemoryPolicy::Random {
                k: 7,
                capacity: Some(50)
            }
        );
        assert_eq!(
            memory(&[
                "--preset",
                "reference",
                "--memory-per-batch",
                "7",
                "--memory-capacity",
                "50"
            ]),
            MemoryPolicy::PerBatch {
                k: 7,
                capacity: Some(50)
            }
        );
        assert_eq!(
            memory(&["--memory-policy", "none", "--memory-capacity", "50"]),
            MemoryPolicy::None
        );
    }

    #[test]
    fn var_gp_learns_the_seeds_posterior_over_theta_unless_told_otherwise() {
        let theta = |args: &[&str]| settings(args).var_gp.theta;
        assert_eq!(theta(&[]), VarGpTheta::Posterior(ThetaConfig::default()));
        assert_eq!(
            theta(&[
                "--var-gp-beta",
                "3",
                "--var-gp-prior-sd",
                "0.5",
                "--var-gp-samples",
                "6",
                "--m-steps",
                "7",
                "--m-rounds",
                "2",
                "--seed",
                "9"
            ]),
            VarGpTheta::Posterior(ThetaConfig {
                prior_sd: 0.5,
                beta: 3.0,
                samples: 6,
                rounds: 2,
                m_steps: 7,
                seed: 9
            })
        );
        assert_eq!(theta(&["--var-gp-theta", "held"]), VarGpTheta::Fixed);
        assert_eq!(
            theta(&["--var-gp-theta", "first-task"]),
            VarGpTheta::FirstTask { rounds: 1, m_steps: 20 }
        );
        // The ablations hold θ, or fit it on the first task, as before.
        assert_eq!(theta(&["--var-gp-variant", "global"]), VarGpTheta::Fixed);
        assert_eq!(
            theta(&["--var-gp-variant", "retrain", "--m-steps", "5"]),
            VarGpTheta::FirstTask { rounds: 1, m_steps: 5 }
        );
    }

    #[test]
    fn a_conjugate_m_step_searches_longer_unless_the_flags_say_otherwise() {
        let gaussian = Likelihood::Gaussian { variance: 0.1 };
        let bernoulli = Likelihood::Bernoulli { link: Link::Probit };
        let m_step = |args: &[&str], lik: &Likelihood| {
            let q = settings(args).sequential_for(lik);
            (q.m_steps, q.m_tolerance)
        };
        let noisy = (settings(&[]).sequential.m_steps, settings(&[]).sequential.m_tolerance);
        assert!(noisy.1 > 0.0);
        assert_eq!(m_step(&[], &bernoulli), noisy);
        assert_eq!(m_step(&[], &gaussian), (CONJUGATE_M_STEPS, 0.0));
        assert_eq!(m_step(&["--m-steps", "7"], &gaussian), (7, noisy.1));
        assert_eq!(
            settings(&["--m-steps", "7"]).offline.m_steps,
            7,
            "offline's iterations too"
        );
        assert_eq!(settings(&[]).offline, OfflineConfig::default());
        assert_eq!(m_step(&["--m-tolerance", "0.5"], &gaussian), (noisy.0, 0.5));
        assert_eq!(m_step(&["--m-steps", "0"], &gaussian).0, 0);
        let reference = settings(&["--preset", "reference"]);
        assert_eq!(reference.sequential_for(&gaussian), reference.sequential);
        let cli = Cli::try_parse_from(["dualgp", "--m-tolerance=-1"]).expect("flags parse");
        let refused = cli.model.settings().expect_err("a negative tolerance").to_string();
        assert!(
            refused.contains("tolerance -1") && refused.contains("--m-tolerance"),
            "{refused}"
        );
    }

    #[test]
    fn ard_can_be_switched_either_way_and_defaults_by_the_input_count() {
        let lengthscales = |args: &[&str], d: usize| settings(args).kernel(d).n_params() - 1;
        assert_eq!(lengthscales(&[], ARD_MAX_INPUTS), ARD_MAX_INPUTS);
        assert_eq!(lengthscales(&[], ARD_MAX_INPUTS + 1), 1);
        assert_eq!(lengthscales(&["--ard"], 784), 784);
        assert_eq!(lengthscales(&["--ard", "false"], 8), 1);
        assert_eq!(lengthscales(&["--preset", "reference"], 8), 1);
        assert_eq!(lengthscales(&["--preset", "reference", "--ard", "true"], 8), 8);
    }

    #[test]
    fn a_linear_kernel_alone_is_one_variance_per_input_scale() {
        assert_eq!(
            settings(&["--kernel", "linear"]).kernel(4),
            Kernel::Linear { variance: 0.25 }
        );
        let Kernel::Sum(parts) = settings(&["--kernel", "linear", "--bias"]).kernel(4) else {
            panic!("a sum")
        };
        assert_eq!(
            parts,
            vec![Kernel::Constant { variance: 1.0 }, Kernel::Linear { variance: 0.25 }]
        );
    }

    #[test]
    fn the_starting_kernel_variance_and_lengthscale_can_be_given() {
        let ard = settings(&["--kernel-variance", "30", "--lengthscale", "150"]).kernel(3);
        assert_eq!(ard, Kernel::stationary(Family::Matern52, 30.0, vec![150.0; 3]));
        assert_eq!(
            settings(&[]).kernel(4),
            Kernel::stationary(Family::Matern52, 1.0, vec![2.0; 4])
        );
        let cli = |args: &[&str]| Cli::try_parse_from(std::iter::once("dualgp").chain(args.iter().copied())).unwrap();
        for bad in ["0", "inf", "NaN"] {
            assert!(
                cli(&["--lengthscale", bad]).model.settings().is_err(),
                "--lengthscale {bad}"
            );
            assert!(
                cli(&["--kernel-variance", bad]).model.settings().is_err(),
                "--kernel-variance {bad}"
            );
        }
    }

    #[test]
    fn bias_and_linear_parts_join_the_stationary_kernel() {
        let kernel = settings(&["--bias", "--linear"]).kernel(4);
        let Kernel::Sum(parts) = kernel else {
            panic!("{kernel:?}")
        };
        assert!(matches!(parts[0], Kernel::Stationary(_)));
        assert_eq!(parts[1], Kernel::Constant { variance: 1.0 });
        // Standardised inputs have ‖x‖² ≈ d: k(x, x) ≈ 1, as for the other parts.
        assert_eq!(parts[2], Kernel::Linear { variance: 0.25 });
        assert!(matches!(settings(&[]).kernel(4), Kernel::Stationary(_)));
    }
}
