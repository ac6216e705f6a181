//! The sequential learner (Chang et al. 2023, Algorithm 1): learns from a
//! stream of batches without revisiting past data. Each update moves the
//! inducing inputs (optionally), re-learns the new batch together with the
//! memory, takes M-steps on the hyperparameters and picks new memory points by
//! their Bayesian leverage score.

use std::collections::HashSet;
use std::time::Instant;

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::model::data::Data;
pub use crate::model::dual::ask::Shards;
use crate::model::dual::ask::{at_once, e_steps_beside, totals, totals_in, unexpected, Local};
use crate::model::dual::blocks::{m_step_sample, Blocks};
use crate::model::dual::estep::{without, EStepConfig};
use crate::model::dual::forgetting::{Age, Clock, Forgetting};
use crate::model::dual::memory::{full_weight, top_k, FirstSites, Memory, MemoryPoint, MemoryPolicy};
use crate::model::dual::objective::{hyperparameters, set_hyperparameters, with_inducing_inputs};
use crate::model::dual::past::{ConditionalTerm, PastMessage, Seen};
use crate::model::dual::point::PointId;
use crate::model::dual::shard::{Answer, Partition, Query, Shard};
use crate::model::dual::share::{estimated_share, ControlVariate, MemoryShare};
use crate::model::dual::snapshot::Snapshot;
use crate::model::error::{check_inducing, ModelError, Result};
use crate::model::learner::{field_accessors, Learned, StreamingLearner};
use crate::model::likelihood::Likelihood;
use crate::model::math::inducing::{past_and_batch_weights, pivoted_cholesky, select_inducing, Pivot};
use crate::model::math::kernel::Kernel;
use crate::model::math::optim::{Adam, Curvature, Lbfgs, Optimizer};
use crate::model::posterior::{keeping_message, keeping_totals, DualPosterior, Sites};

/// Where the sequential learner's inducing inputs come from as batches arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InducingPolicy {
    /// Chosen from the first batch, then kept.
    Fixed,
    /// Pivoted Cholesky over the current `Z` and each new batch, sites projected.
    Pivoted,
}

/// How the M-step stands for past data no longer at hand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PastInMStep {
    /// The memory's terms scaled by `n_old / |M|`, older sites held (the paper).
    #[default]
    ScaledMemory,
    /// Past data's message about `u = f(Z)` held in u-space and its expected
    /// log in `F` (Bui et al. 2017's old term; over the inducing inputs it was
    /// learned on, seen through the prior's conditional once `Z` moves), the
    /// memory's terms as they are.
    Message,
}

/// How [`SequentialLearner`] learns: Algorithm 1's settings and what we added to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequentialConfig {
    /// Number of inducing inputs `m`.
    pub inducing: usize,
    /// Where the inducing inputs come from.
    pub inducing_policy: InducingPolicy,
    /// How pivoted Cholesky picks the inducing inputs (checkpoints before it: variance).
    #[serde(default)]
    pub pivot: Pivot,
    /// The M-step moves the inducing inputs with the hyperparameters, from
    /// where the inducing policy put them (gradient of the same bound; past
    /// data's message follows through the prior's conditional). Off: `Z` is
    /// the policy's alone (the paper).
    #[serde(default)]
    pub learn_inducing: bool,
    /// The E-steps over the batch and the memory.
    pub e_step: EStepConfig,
    /// Adam steps or L-BFGS iterations on the hyperparameters per round
    /// (0: hyperparameters fixed).
    pub m_steps: usize,
    /// An L-BFGS iteration that gains less than this (nats of `F`) ends the
    /// M-step: θ's likelihood is flat to well within a tenth of a nat, and
    /// the tail of a search spends most of its evaluations on hundredths.
    /// 0: to the iteration budget or until the progress vanishes.
    #[serde(default = "tenth")]
    pub m_tolerance: f64,
    /// An update takes M-steps once this many records have been learned
    /// since the last that did, or as many as came before them if fewer (so
    /// early on each M-step sees as much new data as all before it), or when
    /// its own batch holds at least half this many or lies on new ground
    /// (see `reaches_beyond_z`). The updates between
    /// learn their batch by E-steps alone and hold its records pending: the
    /// next update with M-steps re-learns them with its own batch, as one
    /// batch. So an M-step's evidence and cost follow the records that
    /// arrived, not the epochs they came in. 0: every update takes M-steps.
    #[serde(default)]
    pub m_every: usize,
    /// M-step rounds per batch; between rounds the batch and the memory are
    /// re-learned under the new hyperparameters.
    #[serde(default = "one")]
    pub m_rounds: usize,
    /// After each M-step round, keep what past data said about `u = f(Z)`
    /// rather than its sites (see `reexpress_old_data`), then re-learn the batch
    /// and memory. Off: the totals stay as the M-step left them (the paper).
    /// Implied by [`PastInMStep::Message`], which holds that message throughout.
    #[serde(default)]
    pub reexpress_old_data: bool,
    /// Re-learn the batch and the memory at every `θ` the M-step tries, so
    /// that it climbs `F` with their sites at their optimum (a collapsed
    /// bound) rather than held from the E-step; old data keeps its sites.
    /// Off: their sites are held too (the paper).
    #[serde(default)]
    pub relearn_in_m_step: bool,
    /// How the M-step stands for past data.
    #[serde(default)]
    pub past_in_m_step: PastInMStep,
    /// The M-step works on about this many points of the batch and the memory
    /// (whole blocks, drawn anew each update); the others join past data's
    /// message until it ends. None: on all of them.
    #[serde(default)]
    pub m_sample: Option<usize>,
    /// The M-step's optimiser.
    pub optimizer: Optimizer,
    /// Which points enter and leave the memory.
    pub memory: MemoryPolicy,
    /// The memory as a control variate for all past data (see
    /// [`ControlVariate`]). Off: a memory point's re-learned sites replace
    /// its own (the paper).
    #[serde(default)]
    pub memory_control_variate: bool,
    /// How much of the past the memory stands for (see [`MemoryShare`]).
    /// Checkpoints from before it held each point for itself (the paper).
    #[serde(default = "own_share")]
    pub memory_share: MemoryShare,
    /// Past records lose weight with age (see [`Forgetting`]). None: the
    /// past keeps its weight (the paper).
    #[serde(default)]
    pub forgetting: Option<Forgetting>,
    /// The seed of every random choice (reservoir keys, M-step samples).
    pub seed: u64,
}

impl Default for SequentialConfig {
    fn default() -> Self {
        SequentialConfig {
            inducing: 100,
            inducing_policy: InducingPolicy::Pivoted,
            pivot: Pivot::Variance,
            learn_inducing: false,
            e_step: EStepConfig::default(),
            m_steps: 20,
            m_tolerance: tenth(),
            m_every: 0,
            m_rounds: 1,
            reexpress_old_data: false,
            relearn_in_m_step: false,
            past_in_m_step: PastInMStep::ScaledMemory,
            m_sample: None,
            optimizer: Optimizer::Adam { lr: 0.01 },
            memory: MemoryPolicy::PerBatch { k: 10, capacity: None },
            memory_control_variate: false,
            memory_share: MemoryShare::OWN,
            forgetting: None,
            seed: 0,
        }
    }
}

impl SequentialConfig {
    /// Refuses settings that cannot work (no inducing inputs, a bad step size, …).
    pub fn validate(&self) -> Result<()> {
        check_inducing(self.inducing)?;
        match self.optimizer {
            Optimizer::Adam { lr } if !(lr > 0.0 && lr.is_finite()) => {
                return Err(ModelError::Config(format!(
                    "M-step learning rate {lr} must be positive"
                )));
            }
            Optimizer::Lbfgs { history: 0 } => {
                return Err(ModelError::Config("L-BFGS needs a history of at least 1".into()));
            }
            _ => {}
        }
        if self.m_tolerance.is_nan() || self.m_tolerance < 0.0 {
            return Err(ModelError::Config(format!(
                "the M-step's tolerance {} must be 0 or more nats",
                self.m_tolerance
            )));
        }
        if !self.memory_share.is_valid() {
            return Err(ModelError::Config(format!(
                "the memory's share of the past {:?} must lie in [0, 1]",
                self.memory_share
            )));
        }
        if self.memory_control_variate && self.memory_share != MemoryShare::OWN {
            return Err(ModelError::Config(
                "the memory is a control variate or a share of the past, not both".into(),
            ));
        }
        if self.past_in_m_step == PastInMStep::Message && !self.relearn_in_m_step {
            // Its gradient holds q(u), which is right only where q is re-learned at each θ.
            return Err(ModelError::Config(
                "past data as a message in the M-step needs the batch and memory re-learned at every θ".into(),
            ));
        }
        match self.m_sample {
            Some(0) => {
                return Err(ModelError::Config(
                    "the M-step's sample must hold at least 1 point".into(),
                ))
            }
            Some(_) if self.past_in_m_step != PastInMStep::Message => {
                // The points left out join past data's message: there must be one.
                return Err(ModelError::Config(
                    "an M-step on a sample needs past data as a message in the M-step".into(),
                ));
            }
            _ => {}
        }
        if let Some(forgetting) = &self.forgetting {
            forgetting.validate()?;
        }
        self.e_step.validate()
    }
}

fn own_share() -> MemoryShare {
    MemoryShare::OWN
}

fn one() -> usize {
    1
}

fn tenth() -> f64 {
    0.1
}

/// What one update did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateReport {
    /// Batches learned, this one included.
    pub batch: u64,
    /// Records learned, this batch's included.
    pub n_seen: u64,
    /// Points in the memory after the update.
    pub memory: usize,
    /// Whether the inducing inputs moved.
    pub moved_inducing: bool,
    /// Objective evaluations the M-step took.
    pub m_evaluations: usize,
    /// What forgetting left of the weight of everything learned before this
    /// batch (1: nothing forgotten; see [`SequentialConfig::forgetting`]).
    #[serde(default = "full_weight")]
    pub discount: f64,
    /// Where the update's time went.
    pub seconds: StepSeconds,
}

/// Wall-clock time of each step of one update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSeconds {
    /// Pivoted Cholesky and projection.
    pub inducing: f64,
    /// E-steps over batch and memory, including re-learning between M-step rounds.
    pub e_step: f64,
    /// M-steps.
    pub m_step: f64,
    /// BLS and memory bookkeeping.
    pub memory: f64,
}

/// A model that learns from batches in turn; serialisable as a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SequentialLearner {
    /// How it learns.
    pub config: SequentialConfig,
    /// The likelihood, with its current parameters.
    pub likelihood: Likelihood,
    /// The kernel until the first batch brings the inducing inputs.
    kernel: Kernel,
    posterior: Option<DualPosterior>,
    /// The remembered points.
    pub memory: Memory,
    /// Records learned since the last M-step, held until the next (see
    /// [`SequentialConfig::m_every`]); their sites are in the totals.
    #[serde(default)]
    pub pending: Memory,
    /// The share of their prior variance that `Z` left unexplained, on
    /// average, in the records the last M-step learned (see `reaches_beyond_z`).
    #[serde(default)]
    unexplained: Option<f64>,
    adam: Adam,
    /// The last L-BFGS M-step's curvature, where the next one starts.
    #[serde(default)]
    curvature: Curvature,
    /// Records learned so far.
    pub n_seen: u64,
    /// Their weights summed, as forgetting has left them (see
    /// [`SequentialConfig::forgetting`]); None: `n_seen`, each record whole.
    #[serde(default)]
    weight_seen: Option<f64>,
    /// How forgetting counts age: records, or the records' times.
    #[serde(default)]
    clock: Clock,
    /// Batches learned so far.
    pub batches: u64,
    /// Threads this process's own updates answer their blocks on: a choice
    /// of the machine, not of the model, so a checkpoint does not keep it.
    #[serde(skip, default = "one_thread")]
    threads: usize,
}

fn one_thread() -> usize {
    1
}

impl SequentialLearner {
    /// A learner at the prior, `kernel` and `likelihood` its starting hyperparameters.
    pub fn new(kernel: Kernel, likelihood: Likelihood, config: SequentialConfig) -> Result<Self> {
        config.validate()?;
        // Adam's moments persist across updates; under L-BFGS it stays unused.
        let adam = Adam::new(match config.optimizer {
            Optimizer::Adam { lr } => lr,
            Optimizer::Lbfgs { .. } => 0.0,
        });
        Ok(SequentialLearner {
            config,
            likelihood,
            kernel,
            posterior: None,
            memory: Memory::default(),
            pending: Memory::default(),
            unexplained: None,
            adam,
            curvature: Curvature::default(),
            n_seen: 0,
            weight_seen: None,
            clock: Clock::default(),
            batches: 0,
            threads: 1,
        })
    }

    /// Answers this process's own updates on `threads` threads (the results
    /// do not change); a dataflow shares its updates out over its workers instead.
    pub fn on_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Starts from given inducing inputs instead of choosing them from the first batch.
    pub fn with_inducing(mut self, z: DMatrix<f64>) -> Result<Self> {
        self.init(z)?;
        Ok(self)
    }

    /// The posterior, which exists from the first batch (or given inducing inputs) on.
    fn require(&self) -> Result<&DualPosterior> {
        self.posterior
            .as_ref()
            .ok_or_else(|| ModelError::Config("the model has not seen a batch yet".into()))
    }

    fn init(&mut self, z: DMatrix<f64>) -> Result<()> {
        let post = DualPosterior::new(self.kernel.clone(), z, self.likelihood.n_latent())?;
        self.memory = Memory::default();
        self.pending = Memory::default();
        self.posterior = Some(post);
        Ok(())
    }

    /// Algorithm 1: learns from `batch` and forgets it but for the memory.
    /// Its records are known by their row index.
    pub fn update(&mut self, batch: &Data) -> Result<UpdateReport> {
        let ids: Vec<i64> = (0..batch.n() as i64).collect();
        self.update_with_ids(&ids, batch)
    }

    /// [`update`](Self::update) with the records' own ids, which order the
    /// batch and seed each record's memory draw (as in the dataflow operator).
    pub fn update_with_ids(&mut self, ids: &[i64], batch: &Data) -> Result<UpdateReport> {
        if ids.len() != batch.n() {
            return Err(ModelError::Dimension {
                what: "record ids".into(),
                expected: batch.n(),
                got: ids.len(),
            });
        }
        if batch.n() == 0 {
            return Err(ModelError::Config("an update needs at least one record".into()));
        }
        let d = self.posterior.as_ref().map_or(batch.d(), DualPosterior::d);
        batch.check(d, &self.likelihood)?;
        let mut shard = Shard::new(Partition::WHOLE, self.batches, ids, batch.clone()).answered_on(self.threads);
        at_once(self.learn(&mut Local(&mut shard)))
    }

    /// Algorithm 1 over a batch held by `shards` (validated records; the first
    /// query asks for their inputs). The shards may be this process's only one
    /// or every worker of a dataflow.
    pub async fn learn(&mut self, shards: &mut impl Shards) -> Result<UpdateReport> {
        // A learner read back from a checkpoint has no cached factors yet.
        self.ensure_factors()?;
        let (arrivals, time_span) = match shards.ask(Query::Arrivals).await {
            Answer::Arrivals(a) => (a.rows, a.time_span),
            other => return Err(unexpected("arrivals", &other)),
        };
        let x = DMatrix::from_fn(arrivals.len(), arrivals[0].1.len(), |i, j| arrivals[i].1[j]);
        if self.posterior.is_none() {
            self.kernel.validate(x.ncols())?;
            let z = select_inducing(&self.kernel, &x, self.config.inducing, self.config.pivot);
            self.init(z)?;
        }
        let age = self.clock.advance(x.nrows(), time_span);
        let discount = self.discount(shards, age).await?;
        self.forget(discount)?;
        // A strong discount is a stream that moved: its M-step comes at once.
        let drifted = discount < 0.5;
        if !self.m_step_due(x.nrows()) && !drifted && !self.reaches_beyond_z(&x) {
            let ids: Vec<PointId> = arrivals.iter().map(|a| a.0).collect();
            return self.hold(shards, x.nrows(), ids, discount).await;
        }
        let sample = self.m_step_sample(arrivals.iter().map(|a| a.0));

        let mut seconds = StepSeconds::default();
        let mut clock = Instant::now();
        let mut lap = |slot: &mut f64| {
            *slot += clock.elapsed().as_secs_f64();
            clock = Instant::now();
        };
        // Past data but the memory, over the inducing inputs it was learned on.
        let message = (self.config.past_in_m_step == PastInMStep::Message).then(|| {
            let post = self.require().expect("initialised");
            let mut past = post.whitened.clone();
            for held in [&self.memory, &self.pending] {
                for (past, held) in past.iter_mut().zip(&held.whitened_totals(post)) {
                    past.add(held, -1.0);
                }
            }
            PastMessage::of(post, &past)
        });
        let batch = self.with_pending(&x);
        let moved_inducing =
            self.config.inducing_policy == InducingPolicy::Pivoted && self.n_seen > 0 && self.move_inducing(&batch)?;
        lap(&mut seconds.inducing);
        self.learn_with_memory(shards).await?;
        let share = self.stand_for_past(shards).await?;
        lap(&mut seconds.e_step);
        // The message keeps the frozen sites' part; all of it is the memory's at a share of 1.
        let message = message.filter(|_| share < 1.0).map(|m| m.scaled(1.0 - share));
        let memory_weight = self.memory_weight(share, message.is_some());
        let rounds = if self.config.m_steps > 0 {
            self.config.m_rounds.max(1)
        } else {
            0
        };
        let mut m_evaluations = 0;
        for round in 0..rounds {
            let before = (self.config.reexpress_old_data && message.is_none() && share < 1.0)
                .then(|| self.require().cloned())
                .transpose()?;
            m_evaluations += self.m_step(shards, message.as_ref(), memory_weight, sample).await?;
            if let Some(before) = &before {
                self.reexpress_old_data(shards, before).await?;
            }
            lap(&mut seconds.m_step);
            // The M-step ends at its best θ, not the last it tried: re-learn
            // there unless the sites are held from the E-step (the paper).
            let moved_sites = before.is_some() || message.is_some() || share > 0.0;
            if moved_sites || round + 1 < rounds {
                self.relearn(shards).await?;
            }
            lap(&mut seconds.e_step);
        }
        self.correct_for_past(shards).await?;
        lap(&mut seconds.e_step);
        self.remember(shards).await?;
        self.unexplained = Some(self.unexplained_share(&batch));
        self.pending = Memory::default();
        lap(&mut seconds.memory);

        self.count_seen(x.nrows());
        tracing::debug!(
            batch = self.batches,
            inducing = seconds.inducing,
            e_step = seconds.e_step,
            m_step = seconds.m_step,
            m_evaluations,
            memory = seconds.memory,
            "update seconds"
        );
        Ok(UpdateReport {
            batch: self.batches,
            n_seen: self.n_seen,
            memory: self.memory.len(),
            moved_inducing,
            m_evaluations,
            discount,
            seconds,
        })
    }

    /// Whether an update of `n` new records takes M-steps (see [`SequentialConfig::m_every`]).
    fn m_step_due(&self, n: usize) -> bool {
        // A large batch may be new ground (a task of new classes): it is not held.
        let every = self.m_every();
        self.pending.len() + n >= every.min(self.n_past() as usize) || 2 * n >= every
    }

    /// Records between M-steps: [`SequentialConfig::m_every`], and at most a
    /// half-life when forgetting, since the evidence `θ` was fitted to has
    /// halved by then (a level that jumps: mean absolute error 0.96 with an
    /// M-step every 4 000 records at a half-life of 1 000, 0.63 with one
    /// every 1 000; docs/RESULTS.md).
    fn m_every(&self) -> usize {
        let every = self.config.m_every;
        match self.config.forgetting.and_then(|f| f.m_every_cap(&self.clock)) {
            Some(cap) if every > 0 => every.min(cap),
            _ => every,
        }
    }

    /// The pending records' inputs, then `x`'s: the batch an update with M-steps learns.
    fn with_pending(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        let pending = &self.pending.points;
        let n = pending.len();
        DMatrix::from_fn(n + x.nrows(), x.ncols(), |i, j| match i < n {
            true => pending[i].x[j],
            false => x[(i - n, j)],
        })
    }

    /// Whether `Z` explains much less of the prior variance at `x` than it
    /// did at the records the last M-step learned: new ground (inputs that
    /// drifted), which an update without M-steps would learn with inducing
    /// inputs placed elsewhere. Such an update takes its M-steps, and moves
    /// `Z`, at once.
    fn reaches_beyond_z(&self, x: &DMatrix<f64>) -> bool {
        let Some(before) = self.unexplained else { return false };
        let now = self.unexplained_share(x);
        tracing::debug!(before, now, "share of the prior variance Z leaves unexplained");
        now > NEW_GROUND * before.max(EXPLAINED)
    }

    /// The mean over the rows of `x` of `1 − k_iᵀK⁻¹k_i / k_ii`.
    fn unexplained_share(&self, x: &DMatrix<f64>) -> f64 {
        let Some(post) = &self.posterior else { return 1.0 };
        let prior = post.kernel.diag(x);
        let residual = post.cross(x).residual_var;
        let share: f64 = (residual.iter().zip(prior.iter()))
            .map(|(r, p)| (r / p).clamp(0.0, 1.0))
            .sum();
        share / x.nrows().max(1) as f64
    }

    /// Records learned before the pending ones: the past the memory stands for.
    fn n_past(&self) -> u64 {
        self.n_seen - self.pending.len() as u64
    }

    /// Their weights summed: [`n_past`](Self::n_past) as forgetting has left it.
    fn past_weight(&self) -> f64 {
        match self.weight_seen {
            Some(seen) => seen - self.pending.weight(),
            None => self.n_past() as f64,
        }
    }

    /// What is left of the weight of everything learned so far once it has
    /// aged `age` (see [`Forgetting`]): 1 without forgetting; the
    /// automatic mode asks the shards how probable the batch is under each
    /// candidate discount and takes the one [`Evidence::chosen`](crate::model::dual::forgetting::Evidence::chosen) picks.
    async fn discount(&self, shards: &mut impl Shards, age: Age) -> Result<f64> {
        let Some(forgetting) = self.config.forgetting else {
            return Ok(1.0);
        };
        let candidates = forgetting.candidates(age);
        if candidates.len() == 1 || self.n_seen == 0 {
            return Ok(candidates[0]);
        }
        let mut models = Vec::with_capacity(candidates.len());
        for &factor in &candidates {
            let mut post = self.require()?.clone();
            post.whitened.iter_mut().for_each(|totals| totals.scale(factor));
            post.refresh_sites()?;
            models.push(Snapshot::of(&post, &self.likelihood));
        }
        let evidence = match shards.ask(Query::Evidence { models }).await {
            Answer::Evidence(evidence) => evidence.total(),
            other => return Err(unexpected("the batch's evidence", &other)),
        };
        let chosen = candidates[evidence.chosen()];
        tracing::debug!(batch = self.batches, discount = chosen, gain = ?evidence.gain, "forgetting");
        Ok(chosen)
    }

    /// Everything learned so far keeps `factor` of its weight.
    fn forget(&mut self, factor: f64) -> Result<()> {
        if factor == 1.0 {
            return Ok(());
        }
        let post = self.posterior.as_mut().expect("initialised");
        for totals in &mut post.whitened {
            totals.scale(factor);
        }
        for held in [&mut self.memory, &mut self.pending] {
            held.discount(factor);
            // Points with next to no weight leave, their contribution with them
            // (a weight that underflowed would leave the memory standing for 0/0).
            let gone = held.take_below(NEGLIGIBLE_WEIGHT).whitened_totals(post);
            for (totals, gone) in post.whitened.iter_mut().zip(&gone) {
                totals.add(gone, -1.0);
            }
        }
        post.refresh_sites()?;
        self.weight_seen = Some(self.weight_seen.unwrap_or(self.n_seen as f64) * factor);
        Ok(())
    }

    /// An update learned `n` more records.
    fn count_seen(&mut self, n: usize) {
        self.n_seen += n as u64;
        self.batches += 1;
        if let Some(seen) = &mut self.weight_seen {
            *seen += n as f64;
        }
    }

    /// An update without M-steps: the batch is learned by E-steps alone
    /// (the memory and the pending records hold their sites) and its
    /// records join the pending ones.
    async fn hold(
        &mut self,
        shards: &mut impl Shards,
        n: usize,
        ids: Vec<PointId>,
        discount: f64,
    ) -> Result<UpdateReport> {
        let clock = Instant::now();
        // `Z` stays: the next M-step's update moves it with the pending
        // records among its candidates and re-learns them exactly under the
        // new `Z`, where a move here would project their sites, lossily, at
        // every epoch (kin40k in epochs of 50: prequential NLPD 0.93 with
        // moves here, 0.65 without, docs/RESULTS.md).
        let begin = Query::Begin {
            model: self.current(),
            memory: Vec::new(),
            pending: Vec::new(),
        };
        shards.ask(begin).await;
        // A conjugate likelihood's sites are exact after one full step.
        let e_step = match self.likelihood.is_conjugate() {
            true => EStepConfig { steps: 1, rho: 1.0 },
            false => self.config.e_step,
        };
        self.e_steps(shards, e_step).await?;
        let finish = Query::Finish {
            keep: ids,
            model: self.current(),
        };
        let mut points = match shards.ask(finish).await {
            Answer::Memory(points) => points,
            other => return Err(unexpected("the batch's points", &other)),
        };
        let pending = &mut self.pending.points;
        pending.append(&mut points);
        pending.sort_unstable_by_key(|p| p.id);
        self.count_seen(n);
        let seconds = StepSeconds {
            e_step: clock.elapsed().as_secs_f64(),
            ..StepSeconds::default()
        };
        tracing::debug!(
            batch = self.batches,
            pending = self.pending.len(),
            e_step = seconds.e_step,
            "held"
        );
        Ok(UpdateReport {
            batch: self.batches,
            n_seen: self.n_seen,
            memory: self.memory.len(),
            moved_inducing: false,
            m_evaluations: 0,
            discount,
            seconds,
        })
    }

    /// What the workers need of the current model.
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.posterior
            .as_ref()
            .map(|posterior| Snapshot::of(posterior, &self.likelihood))
    }

    fn current(&self) -> Snapshot {
        self.snapshot().expect("initialised")
    }

    /// Step 1: pivoted Cholesky over `[Z; X_D]` and projection of all site
    /// totals onto the new `Z`. Returns whether `Z` changed.
    fn move_inducing(&mut self, x: &DMatrix<f64>) -> Result<bool> {
        let past = self.past_weight();
        let post = self.posterior.as_mut().expect("initialised");
        let m = post.m();
        let candidates = DMatrix::from_fn(m + x.nrows(), x.ncols(), |i, j| {
            if i < m {
                post.z[(i, j)]
            } else {
                x[(i - m, j)]
            }
        });
        let weights = past_and_batch_weights(m, past, x.nrows());
        let mut chosen = pivoted_cholesky(
            &post.kernel,
            &candidates,
            &weights,
            self.config.inducing,
            self.config.pivot,
        );
        chosen.sort_unstable();
        if chosen.iter().copied().eq(0..m) {
            return Ok(false);
        }
        let p = post.move_inducing(candidates.select_rows(&chosen))?;
        self.memory.project(&p);
        self.pending.project(&p);
        Ok(true)
    }

    /// Steps 2–3: takes the memory's and the pending records' contribution
    /// out of the totals and runs the E-step over the batch (with the
    /// pending records) and the memory together from zero sites.
    async fn learn_with_memory(&mut self, shards: &mut impl Shards) -> Result<()> {
        let post = self.posterior.as_mut().expect("initialised");
        for held in [&self.memory, &self.pending] {
            let held = held.whitened_totals(post);
            for (totals, held) in post.whitened.iter_mut().zip(&held) {
                totals.add(held, -1.0);
            }
        }
        post.refresh_sites()?;
        let begin = Query::Begin {
            model: self.current(),
            memory: self.memory.points.clone(),
            pending: self.pending.points.clone(),
        };
        shards.ask(begin).await;
        self.e_steps(shards, self.config.e_step).await
    }

    /// How many past points each memory point stands for: `w = n_old / |M|`,
    /// by weight when forgetting has discounted both.
    fn past_per_memory_point(&self) -> f64 {
        self.past_weight() / self.memory.weight()
    }

    /// Step 3b: the memory takes a share `γ` of the past from the frozen
    /// sites (see [`MemoryShare`]): they keep `1 − γ` of their weight, the
    /// memory's terms count `1 + γ(w − 1)` times, and the batch and the
    /// memory are learned again under that estimate. Returns `γ`.
    async fn stand_for_past(&mut self, shards: &mut impl Shards) -> Result<f64> {
        if self.memory.is_empty() || self.config.memory_control_variate {
            return Ok(0.0);
        }
        let share = match self.config.memory_share {
            MemoryShare::Fixed(share) => share,
            MemoryShare::Estimated => match shards.ask(Query::Drift { model: self.current() }).await {
                // The memory samples the past by weight: its count stands for its weight.
                Answer::Drift(drift) => estimated_share(
                    &drift.total(),
                    self.past_weight() * self.memory.len() as f64 / self.memory.weight(),
                ),
                other => return Err(unexpected("the memory's drift", &other)),
            },
        };
        tracing::debug!(share, batch = self.batches, "the memory's share of the past");
        if share == 0.0 {
            return Ok(0.0);
        }
        let here = self
            .totals(shards, Query::Contribution { model: self.current() })
            .await?;
        let control = ControlVariate {
            weight: 1.0 + share * (self.past_per_memory_point() - 1.0),
            sample: true,
        };
        let reweighted = self.stand_for_past_as(shards, control).await?;
        let post = self.posterior.as_mut().expect("initialised");
        let past = without(&post.whitened, &here);
        for ((totals, past), change) in post.whitened.iter_mut().zip(&past).zip(&reweighted) {
            totals.add(past, -share);
            totals.add(change, 1.0);
        }
        post.refresh_sites()?;
        self.e_steps(shards, self.config.e_step).await?;
        Ok(share)
    }

    /// The weight of the memory's terms in the M-step: as in the E-step
    /// beside past data's message; `w` without it (the paper's scaled memory,
    /// or a memory that stands for all of the past).
    fn memory_weight(&self, share: f64, with_message: bool) -> f64 {
        match (self.memory.is_empty(), with_message) {
            (true, _) => 1.0,
            (false, true) => 1.0 + share * (self.past_per_memory_point() - 1.0),
            (false, false) => self.past_per_memory_point(),
        }
    }

    /// Step 4b, with the memory as a control variate: once `θ` is learned,
    /// the memory's terms count on behalf of all past data (see
    /// [`ControlVariate`]) and the E-step runs on under that bound.
    async fn correct_for_past(&mut self, shards: &mut impl Shards) -> Result<()> {
        if !self.config.memory_control_variate || self.memory.is_empty() {
            return Ok(());
        }
        let control = ControlVariate {
            weight: self.past_per_memory_point(),
            sample: false,
        };
        let change = self.stand_for_past_as(shards, control).await?;
        self.add_to_totals(&change)?;
        self.e_steps(shards, self.config.e_step).await
    }

    /// The memory's points stand for past data as `control` says from now
    /// on: the change of their contribution to the totals.
    async fn stand_for_past_as(&self, shards: &mut impl Shards, control: ControlVariate) -> Result<Vec<Sites>> {
        let query = Query::CorrectForPast {
            model: self.current(),
            control,
        };
        self.totals(shards, query).await
    }

    /// Damped site updates over the batch and the memory, none lowering the
    /// E-step's bound (see [`e_step_at`](crate::model::dual::estep::e_step_at)).
    async fn e_steps(&mut self, shards: &mut impl Shards, e_step: EStepConfig) -> Result<()> {
        let others = if self.likelihood.is_conjugate() {
            Vec::new()
        } else {
            let here = self
                .totals(shards, Query::Contribution { model: self.current() })
                .await?;
            without(&self.require()?.whitened, &here)
        };
        self.e_steps_beside(shards, e_step, &others).await
    }

    /// [`e_steps`](Self::e_steps) with `others`, the totals' part that the
    /// points that answer do not hold, already known (only a non-conjugate
    /// likelihood's bound uses it).
    async fn e_steps_beside(&mut self, shards: &mut impl Shards, e_step: EStepConfig, others: &[Sites]) -> Result<()> {
        let post = self.posterior.as_mut().expect("initialised");
        e_steps_beside(shards, post, &self.likelihood, e_step, others).await
    }

    async fn totals(&self, shards: &mut impl Shards, query: Query) -> Result<Vec<Sites>> {
        totals(shards, self.require()?, query).await
    }

    fn add_to_totals(&mut self, change: &[Sites]) -> Result<()> {
        let post = self.posterior.as_mut().expect("initialised");
        for (totals, change) in post.whitened.iter_mut().zip(change) {
            totals.add(change, 1.0);
        }
        post.refresh_sites()
    }

    /// After `θ` moved: data no longer at hand keeps what it said about the
    /// inducing values `u = f(Z)` (its likelihood in u-space, natural
    /// parameters `K⁻¹l`, `K⁻¹ΛK⁻¹`) rather than its sites: the M-step kept
    /// its totals from `before`; that is undone and its message kept instead.
    async fn reexpress_old_data(&mut self, shards: &mut impl Shards, before: &DualPosterior) -> Result<()> {
        let here = self
            .totals(shards, Query::Contribution { model: self.current() })
            .await?;
        let post = self.posterior.as_mut().expect("initialised");
        let (chol_before, chol_now) = (&before.factors().chol_k, &post.factors().chol_k);
        let undo = keeping_totals(&chol_now.l(), chol_before);
        let t = keeping_message(&chol_before.l(), &post.k_zz(), chol_now) * undo;
        for (totals, here) in post.whitened.iter_mut().zip(&here) {
            totals.add(here, -1.0);
            totals.transform(&t);
            totals.add(here, 1.0);
        }
        post.refresh_sites()
    }

    /// Between M-step rounds: re-expresses the batch's and the memory's sites
    /// with kernel columns under the new `θ`, then runs the E-step over them
    /// again (warm-started). Only older data keeps its earlier columns.
    async fn relearn(&mut self, shards: &mut impl Shards) -> Result<()> {
        self.relearn_with(shards, self.config.e_step).await
    }

    async fn relearn_with(&mut self, shards: &mut impl Shards, e_step: EStepConfig) -> Result<()> {
        let change = self.totals(shards, Query::Recolumn { model: self.current() }).await?;
        self.add_to_totals(&change)?;
        self.e_steps(shards, e_step).await
    }

    /// The blocks the M-step works on: a sample of the batch (these
    /// records) and the memory, drawn from the seed and the update's number.
    fn m_step_sample(&self, batch: impl Iterator<Item = PointId>) -> Blocks {
        match self.config.m_sample {
            None => Blocks::ALL,
            Some(bound) => {
                let held = self.memory.points.iter().chain(&self.pending.points);
                let ids = batch.chain(held.map(|p| p.id)).map(|p| p.id);
                m_step_sample(ids, bound, self.config.seed, self.batches)
            }
        }
    }

    /// Step 4: Adam steps or an L-BFGS search on `F(θ)` with older data's
    /// sites held (and the batch's and memory's too, unless re-learning); the
    /// memory's terms are scaled by `n_old / |M|` to stand for all past data,
    /// or past data keeps its message (see [`PastInMStep`]). Points outside
    /// `sample` join that message until the search ends. Returns the number
    /// of objective evaluations.
    async fn m_step(
        &mut self,
        shards: &mut impl Shards,
        message: Option<&PastMessage>,
        memory_weight: f64,
        sample: Blocks,
    ) -> Result<usize> {
        let left_out = match sample {
            Blocks::ALL => None,
            _ => Some(self.leave_out(shards, sample).await?),
        };
        let messages: Vec<PastMessage> = message.into_iter().chain(&left_out).cloned().collect();
        let mut past = match messages.is_empty() {
            true => None,
            false => Some(self.past(shards, messages).await?),
        };
        let theta = self.m_step_point();
        let mut evaluations = 0;
        match self.config.optimizer {
            Optimizer::Adam { .. } => {
                let mut theta = theta;
                for _ in 0..self.config.m_steps {
                    evaluations += 1;
                    let (_, grad) = self.objective(shards, memory_weight, past.as_mut()).await?;
                    self.adam.step(&mut theta, &grad);
                    self.set_hyperparameters(&theta, past.as_mut())?;
                }
            }
            Optimizer::Lbfgs { history } => {
                let scaling = self.search_scaling();
                let curvature = std::mem::take(&mut self.curvature).rescaled(&scaling.inverse());
                let mut search = Lbfgs::new(scaling.searched(theta), self.config.m_steps, history)
                    .with_tolerance(self.config.m_tolerance)
                    .with_curvature(curvature);
                // Each evaluation refits the totals from past data's sites.
                let refits = self.config.relearn_in_m_step && past.is_some();
                while let Some(searched) = search.next_point() {
                    evaluations += 1;
                    let theta = &scaling.point_of(searched);
                    let set = match refits {
                        true => self.set_hyperparameters_to_refit(theta),
                        false => self.set_hyperparameters(theta, past.as_mut()),
                    };
                    let outcome = match set {
                        Ok(()) => self
                            .objective(shards, memory_weight, past.as_mut())
                            .await
                            .map(|(value, grad)| (value, grad.component_mul(&scaling.0))),
                        Err(e) => Err(e),
                    };
                    if let Ok((value, _)) = &outcome {
                        tracing::trace!(value, theta = ?theta.as_slice(), "m-step evaluation");
                    }
                    search.tell(outcome)?;
                }
                self.curvature = search.curvature().rescaled(&scaling.0);
                self.set_hyperparameters(&scaling.point_of(&search.best().0), past.as_mut())?;
            }
        }
        if let Some(message) = left_out {
            self.take_back(shards, &message, sample).await?;
        }
        Ok(evaluations)
    }

    /// How the M-step's search sees its point: `θ` as it is, `Z` in units of
    /// the ARD lengthscales it starts from, each at most [`Z_SCALE_CAP`]
    /// times the spread of `Z` along its input. In the data's own units
    /// L-BFGS's few pairs do not learn how far `Z` may move along each
    /// input; so scaled, kin40k's test NLPD went from 0.544 to 0.393
    /// (docs/RESULTS.md). An input the kernel ignores (lengthscale far beyond
    /// the data) would let `Z` wander far along it and hold its lengthscale
    /// back (bike's test NLPD 0.2 worse): there the cap keeps the scale to
    /// the data's. One lengthscale for every input leaves nothing to
    /// equalise, and `Z` stays in the data's units (scaled, split
    /// Fashion-MNIST's NLPD was 0.09 worse).
    fn search_scaling(&self) -> SearchScaling {
        let theta = self.kernel().n_params() + self.likelihood.n_params();
        let mut scale = DVector::from_element(theta, 1.0);
        if let (true, Some(post)) = (self.config.learn_inducing, &self.posterior) {
            let by_input: Vec<f64> = (0..post.d())
                .map(|k| {
                    let spread = spread(post.z.column(k).iter().copied()).max(f64::EPSILON);
                    ard_lengthscale(self.kernel(), k).map_or(1.0, |l| l.min(Z_SCALE_CAP * spread))
                })
                .collect();
            scale = with_inducing_inputs(scale, &DMatrix::from_fn(post.m(), post.d(), |_, k| by_input[k]));
        }
        SearchScaling(scale)
    }

    /// Points outside `sample` leave the M-step: the message of their
    /// contribution, and only the sample's blocks answer from now on.
    async fn leave_out(&mut self, shards: &mut impl Shards, sample: Blocks) -> Result<PastMessage> {
        let all = self
            .totals(shards, Query::Contribution { model: self.current() })
            .await?;
        shards.ask(Query::Focus { blocks: sample }).await;
        let inside = self
            .totals(shards, Query::Contribution { model: self.current() })
            .await?;
        Ok(PastMessage::of(self.require()?, &without(&all, &inside)))
    }

    /// After the M-step, the points [`leave_out`](Self::leave_out) set
    /// aside hold their own sites in the totals again, instead of their message.
    async fn take_back(&mut self, shards: &mut impl Shards, message: &PastMessage, sample: Blocks) -> Result<()> {
        shards
            .ask(Query::Focus {
                blocks: sample.complement(),
            })
            .await;
        let own = self
            .totals(shards, Query::Contribution { model: self.current() })
            .await?;
        shards.ask(Query::Focus { blocks: Blocks::ALL }).await;
        let post = self.posterior.as_mut().expect("initialised");
        let held = message.whitened(post);
        for ((totals, held), own) in post.whitened.iter_mut().zip(&held).zip(&own) {
            totals.add(held, -1.0);
            totals.add(own, 1.0);
        }
        post.refresh_sites()
    }

    /// Past data's `messages` and their sites in the totals: all but the
    /// contribution of the points that answer.
    async fn past(&mut self, shards: &mut impl Shards, messages: Vec<PastMessage>) -> Result<Past> {
        let here = self
            .totals(shards, Query::Contribution { model: self.current() })
            .await?;
        let post = self.require()?;
        let mut sites = post.whitened.clone();
        for (sites, here) in sites.iter_mut().zip(&here) {
            sites.add(here, -1.0);
        }
        let seen = messages.iter().map(|m| m.seen_from(post)).collect();
        Ok(Past { messages, seen, sites })
    }

    /// Where the M-step stands: `θ`, then `Z` by columns if it learns them.
    fn m_step_point(&self) -> DVector<f64> {
        let theta = hyperparameters(self.kernel(), &self.likelihood);
        match (self.config.learn_inducing, &self.posterior) {
            (true, Some(post)) => with_inducing_inputs(theta, &post.z),
            _ => theta,
        }
    }

    /// `F(θ)` and its gradient at the current hyperparameters, with the batch
    /// and memory re-learned first if so configured.
    async fn objective(
        &mut self,
        shards: &mut impl Shards,
        memory_weight: f64,
        mut past: Option<&mut Past>,
    ) -> Result<(f64, DVector<f64>)> {
        if self.config.relearn_in_m_step {
            match past.as_deref_mut() {
                Some(past) => self.refit(shards, past).await?,
                None if self.likelihood.is_conjugate() => {
                    self.relearn_with(shards, EStepConfig { steps: 1, rho: 1.0 }).await?
                }
                None => self.relearn_with(shards, self.config.e_step).await?,
            }
        }
        let with_z = self.config.learn_inducing;
        self.require()?.prepare_gradients();
        let query = Query::Gradient {
            model: self.current(),
            memory_weight,
            with_z,
        };
        let (post, likelihood) = (self.require()?, &self.likelihood);
        let past = past.as_deref();
        // The messages' conditional terms need no answer: made while the shards work.
        let conditional = || -> Vec<ConditionalTerm> {
            let Some(past) = past else { return Vec::new() };
            (past.messages.iter().zip(&past.seen))
                .map(|(message, seen)| message.conditional_term(post, seen, with_z))
                .collect()
        };
        let (terms, conditional) = match shards.ask_beside(query, conditional).await {
            (Answer::Terms(terms), conditional) => (terms.total(), conditional),
            (other, _) => return Err(unexpected("M-step terms", &other)),
        };
        let mut objective = terms.finish(post, likelihood, past.map(|p| p.sites.as_slice()));
        for term in conditional {
            objective.value += term.value;
            let mut kernel_part = objective.grad.rows_mut(0, term.grad.len());
            kernel_part += &term.grad;
            if let (Some(total), Some(part)) = (objective.grad_z.as_mut(), &term.grad_z) {
                *total += part;
            }
        }
        Ok((objective.value, objective.stacked_grad()))
    }

    /// Re-learns the points that answer under the current `θ`: the totals
    /// are `past`'s sites and the points' contribution under new columns,
    /// with exact sites for a conjugate likelihood, else after E-steps.
    async fn refit(&mut self, shards: &mut impl Shards, past: &mut Past) -> Result<()> {
        let query = Query::Refit { model: self.current() };
        // Past data's sites under the new `θ` and `Z`, made while the shards refit.
        let post = self.require()?;
        let (answer, sites) = shards.ask_beside(query, || past.whitened(post)).await;
        past.sites = sites;
        let here = totals_in(answer, post)?;
        let post = self.posterior.as_mut().expect("initialised");
        for ((totals, past), here) in post.whitened.iter_mut().zip(&past.sites).zip(&here) {
            totals.clone_from(past);
            totals.add(here, 1.0);
        }
        post.refresh_sites()?;
        if self.likelihood.is_conjugate() {
            Ok(())
        } else {
            // The totals are past's sites and the points' own: no need to ask for the latter again.
            self.e_steps_beside(shards, self.config.e_step, &past.sites).await
        }
    }

    /// Sets `θ` (and `Z`, when the M-step learns it: see [`m_step_point`](Self::m_step_point))
    /// with the site totals held; past data's part follows its message
    /// instead, which stays put in u-space.
    fn set_hyperparameters(&mut self, point: &DVector<f64>, past: Option<&mut Past>) -> Result<()> {
        let post = self.posterior.as_mut().expect("initialised");
        let t = post.change_holding_totals(move_to(point, &mut self.likelihood))?;
        if let Some(past) = past {
            let sites = past.whitened(post);
            for ((totals, new), old) in post.whitened.iter_mut().zip(&sites).zip(&mut past.sites) {
                old.transform(&t);
                totals.add(new, 1.0);
                totals.add(old, -1.0);
            }
            past.sites = sites;
            post.refresh_sites()?;
        }
        Ok(())
    }

    /// [`set_hyperparameters`](Self::set_hyperparameters) before a
    /// [`refit`](Self::refit), which sets the totals anew from past data's
    /// sites (made there): only `K`'s factor follows `θ` here.
    fn set_hyperparameters_to_refit(&mut self, point: &DVector<f64>) -> Result<()> {
        let post = self.posterior.as_mut().expect("initialised");
        post.change_dropping_totals(move_to(point, &mut self.likelihood))
    }

    /// Step 5: new memory points by their reservoir keys (BLS-weighted at the
    /// current posterior, or uniform), each joining with the contribution it
    /// has inside the totals.
    async fn remember(&mut self, shards: &mut impl Shards) -> Result<()> {
        let (by_leverage, per_batch, capacity) = match self.config.memory {
            MemoryPolicy::None => (false, Some(0), None),
            MemoryPolicy::PerBatch { k, capacity } => (true, Some(k), capacity),
            MemoryPolicy::Random { k, capacity } => (false, Some(k), capacity),
            MemoryPolicy::Reservoir { capacity } => (true, None, Some(capacity)),
            MemoryPolicy::RandomReservoir { capacity } => (false, None, Some(capacity)),
        };
        let keys = if per_batch == Some(0) {
            Vec::new()
        } else {
            let query = Query::Keys {
                model: self.current(),
                seed: self.config.seed,
                by_leverage,
            };
            match shards.ask(query).await {
                Answer::Keys(keys) => keys,
                other => return Err(unexpected("memory keys", &other)),
            }
        };
        // A per-batch policy takes the batch's `k` best keys; the candidates
        // then compete with the old points on their keys for `capacity` places.
        let candidates: Vec<(PointId, f64)> = match per_batch {
            Some(k) => {
                let values: Vec<f64> = keys.iter().map(|k| k.1).collect();
                let mut best: Vec<(PointId, f64)> = top_k(&values, k).into_iter().map(|i| keys[i]).collect();
                best.sort_unstable_by_key(|c| c.0);
                best
            }
            None => keys,
        };
        let old = self.memory.points.iter().map(|p| (p.id, p.key));
        let all: Vec<(PointId, f64)> = old.chain(candidates.iter().copied()).collect();
        let places = capacity.unwrap_or(all.len());
        let values: Vec<f64> = all.iter().map(|p| p.1).collect();
        let is_new = |id: &PointId| candidates.binary_search_by_key(id, |c| c.0).is_ok();
        let (mut keep, stay): (Vec<PointId>, Vec<PointId>) =
            top_k(&values, places).into_iter().map(|i| all[i].0).partition(is_new);
        keep.sort_unstable();
        if self.config.memory_control_variate {
            // A point that leaves keeps its first sites, as every past point does.
            let staying: HashSet<PointId> = stay.iter().copied().collect();
            let leaving: Vec<PointId> = self
                .memory
                .points
                .iter()
                .map(|p| p.id)
                .filter(|id| !staying.contains(id))
                .collect();
            let beyond = self.totals(shards, Query::Leave { leaving }).await?;
            let post = self.posterior.as_mut().expect("initialised");
            for (totals, beyond) in post.whitened.iter_mut().zip(&beyond) {
                totals.add(beyond, -1.0);
            }
            post.refresh_sites()?;
        }
        let points = match shards
            .ask(Query::Finish {
                keep: keep.clone(),
                model: self.current(),
            })
            .await
        {
            Answer::Memory(points) => points,
            Answer::Nothing => Vec::new(),
            other => return Err(unexpected("memory points", &other)),
        };
        let members: HashSet<PointId> = keep.into_iter().chain(stay).collect();
        let mut kept: Vec<MemoryPoint> = points.into_iter().filter(|p| members.contains(&p.id)).collect();
        // A point keeps the sites it was first learned with: the frozen sites' bias shows against them.
        for p in &mut kept {
            let held = (&p.s1, &p.s2);
            p.first.get_or_insert_with(|| FirstSites {
                s1: held.0.clone(),
                s2: held.1.clone(),
            });
        }
        self.memory = Memory::of(kept);
        Ok(())
    }
}

/// The change that puts the kernel, the likelihood and (when the point holds
/// more than `θ`) the inducing inputs at an M-step's point (see
/// [`SequentialLearner::m_step_point`]).
fn move_to<'a>(
    point: &'a DVector<f64>,
    likelihood: &'a mut Likelihood,
) -> impl FnOnce(&mut Kernel, &mut DMatrix<f64>) + 'a {
    move |kernel, z| {
        let n_theta = kernel.n_params() + likelihood.n_params();
        set_hyperparameters(kernel, likelihood, &point.rows(0, n_theta).into_owned());
        if point.len() > n_theta {
            z.copy_from_slice(&point.as_slice()[n_theta..]);
        }
    }
}

/// An M-step's point as its search sees it: each entry divided by its scale.
struct SearchScaling(DVector<f64>);

impl SearchScaling {
    fn searched(&self, point: DVector<f64>) -> DVector<f64> {
        point.component_div(&self.0)
    }

    fn point_of(&self, point: &DVector<f64>) -> DVector<f64> {
        point.component_mul(&self.0)
    }

    fn inverse(&self) -> DVector<f64> {
        self.0.map(|s| 1.0 / s)
    }
}

/// How many times the share of the prior variance that `Z` left unexplained
/// at the last M-step's records a new batch's must reach to count as new
/// ground (see `reaches_beyond_z`) ...
const NEW_GROUND: f64 = 3.0;

/// ... and the share below which `Z` counts as explaining a batch in full.
const EXPLAINED: f64 = 0.02;

/// A remembered or held point whose weight forgetting has brought below this leaves.
const NEGLIGIBLE_WEIGHT: f64 = 1e-9;

/// How many spreads of `Z` along an input the M-step's search scale may reach.
const Z_SCALE_CAP: f64 = 10.0;

/// The standard deviation of `values`.
fn spread(values: impl ExactSizeIterator<Item = f64> + Clone) -> f64 {
    let n = values.len() as f64;
    let mean = values.clone().sum::<f64>() / n;
    (values.map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt()
}

/// The lengthscale of input `k` in `kernel`'s first stationary part, if that
/// part has one lengthscale per input (ARD).
fn ard_lengthscale(kernel: &Kernel, k: usize) -> Option<f64> {
    match kernel {
        Kernel::Stationary(s) => (s.lengthscales.len() > 1).then(|| s.lengthscales[k]),
        Kernel::Sum(parts) | Kernel::Product(parts) => parts.iter().find_map(|part| ard_lengthscale(part, k)),
        _ => None,
    }
}

/// Past data's messages during an M-step, how the current `θ` sees them,
/// and the (whitened) sites they have in the totals under it.
struct Past {
    messages: Vec<PastMessage>,
    seen: Vec<Seen>,
    sites: Vec<Sites>,
}

impl Past {
    /// The messages' sites under `post`'s kernel and `Z`, whitened; from now
    /// on the messages are seen from `post`.
    fn whitened(&mut self, post: &DualPosterior) -> Vec<Sites> {
        self.seen = self.messages.iter().map(|m| m.seen_from(post)).collect();
        let mut parts = self
            .messages
            .iter()
            .zip(&self.seen)
            .map(|(m, seen)| m.whitened_as(seen));
        let mut sum = parts.next().expect("a past holds at least one message");
        for part in parts {
            for (s, p) in sum.iter_mut().zip(&part) {
                s.add(p, 1.0);
            }
        }
        sum
    }
}

impl StreamingLearner for SequentialLearner {
    fn learn_batch(&mut self, batch: &Data) -> Result<Learned> {
        let report = self.update(batch)?;
        let s = report.seconds;
        Ok(Learned {
            batch: report.batch,
            n_seen: report.n_seen,
            seconds: s.inducing + s.e_step + s.m_step + s.memory,
            details: vec![
                ("memory", report.memory as f64),
                ("moved_inducing", f64::from(u8::from(report.moved_inducing))),
                ("m_evaluations", report.m_evaluations as f64),
                ("seconds_e_step", s.e_step),
                ("seconds_m_step", s.m_step),
            ],
        })
    }

    field_accessors!();
}
