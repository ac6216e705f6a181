//! The sequential learner (Chang et al. 2023, Algorithm 1): learns from a
//! stream of batches without revisiting past data. Each update moves the
//! inducing inputs (optionally), re-learns the new batch together with the
//! memory, takes M-steps on the hyperparameters and picks new memory points by
//! their Bayesian leverage score.

use std::time::Instant;

use nalgebra::{DMatrix, DVector};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::data::Data;
use super::error::{ModelError, Result};
use super::estep::{e_step_at, EStepConfig, PointSites};
use super::inducing::{pivoted_cholesky, select_inducing};
use super::kernel::Kernel;
use super::likelihood::{Likelihood, Predictive};
use super::memory::{bayesian_leverage_scores, project_sites, reservoir_key, top_k, Memory, MemoryPoint, MemoryPolicy};
use super::objective::{hyperparameters, m_step_objective, set_hyperparameters};
use super::optim::Adam;
use super::posterior::DualPosterior;
use super::predict::{evaluate, predict, Metrics};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InducingPolicy {
    /// Chosen from the first batch, then kept.
    Fixed,
    /// Pivoted Cholesky over the current `Z` and each new batch, sites projected.
    Pivoted,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequentialConfig {
    /// Number of inducing inputs `m`.
    pub inducing: usize,
    pub inducing_policy: InducingPolicy,
    pub e_step: EStepConfig,
    /// Adam steps on the hyperparameters per round (0: hyperparameters fixed).
    pub m_steps: usize,
    /// M-step rounds per batch; between rounds the batch and the memory are
    /// re-learned under the new hyperparameters.
    #[serde(default = "one")]
    pub m_rounds: usize,
    /// After each M-step round, keep what past data said about `u = f(Z)`
    /// rather than its sites (see `reexpress_old_data`), then re-learn the batch
    /// and memory. Off: the totals stay as the M-step left them (the paper).
    #[serde(default)]
    pub reexpress_old_data: bool,
    pub m_lr: f64,
    pub memory: MemoryPolicy,
    pub seed: u64,
}

impl Default for SequentialConfig {
    fn default() -> Self {
        SequentialConfig {
            inducing: 100,
            inducing_policy: InducingPolicy::Pivoted,
            e_step: EStepConfig::default(),
            m_steps: 20,
            m_rounds: 1,
            reexpress_old_data: false,
            m_lr: 0.01,
            memory: MemoryPolicy::PerBatch { k: 10 },
            seed: 0,
        }
    }
}

impl SequentialConfig {
    pub fn validate(&self) -> Result<()> {
        if self.inducing == 0 {
            return Err(ModelError::Config(
                "the number of inducing inputs must be at least 1".into(),
            ));
        }
        if !(self.m_lr > 0.0 && self.m_lr.is_finite()) {
            return Err(ModelError::Config(format!(
                "M-step learning rate {} must be positive",
                self.m_lr
            )));
        }
        self.e_step.validate()
    }
}

fn one() -> usize {
    1
}

/// What one update did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateReport {
    pub batch: u64,
    pub n_seen: u64,
    pub memory: usize,
    /// Whether the inducing inputs moved.
    pub moved_inducing: bool,
    pub seconds: StepSeconds,
}

/// Wall-clock time of each step of one update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSeconds {
    /// Pivoted Cholesky and projection.
    pub inducing: f64,
    /// E-steps over batch and memory, including re-learning between M-step rounds.
    pub e_step: f64,
    pub m_step: f64,
    /// BLS and memory bookkeeping.
    pub memory: f64,
}

/// A model that learns from batches in turn; serialisable as a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SequentialLearner {
    pub config: SequentialConfig,
    pub likelihood: Likelihood,
    /// The kernel until the first batch brings the inducing inputs.
    kernel: Kernel,
    posterior: Option<DualPosterior>,
    pub memory: Memory,
    adam: Adam,
    pub n_seen: u64,
    pub batches: u64,
}

impl SequentialLearner {
    pub fn new(kernel: Kernel, likelihood: Likelihood, config: SequentialConfig) -> Result<Self> {
        config.validate()?;
        let adam = Adam::new(config.m_lr);
        let memory = Memory::new(0, likelihood.n_latent());
        Ok(SequentialLearner {
            config,
            likelihood,
            kernel,
            posterior: None,
            memory,
            adam,
            n_seen: 0,
            batches: 0,
        })
    }

    /// Starts from given inducing inputs instead of choosing them from the first batch.
    pub fn with_inducing(mut self, z: DMatrix<f64>) -> Result<Self> {
        self.init(z)?;
        Ok(self)
    }

    /// The current posterior; `None` before the first batch.
    pub fn posterior(&self) -> Option<&DualPosterior> {
        self.posterior.as_ref()
    }

    pub fn kernel(&self) -> &Kernel {
        self.posterior.as_ref().map_or(&self.kernel, |p| &p.kernel)
    }

    fn init(&mut self, z: DMatrix<f64>) -> Result<()> {
        let post = DualPosterior::new(self.kernel.clone(), z, self.likelihood.n_latent())?;
        self.memory = Memory::new(post.m(), post.n_latent());
        self.posterior = Some(post);
        Ok(())
    }

    /// Restores the cached factors after deserialisation.
    pub fn ensure_factors(&mut self) -> Result<()> {
        self.posterior.as_mut().map_or(Ok(()), DualPosterior::ensure_factors)
    }

    /// Predictions at `x` (the prior before the first batch is not available: an error).
    pub fn predict(&self, x: &DMatrix<f64>) -> Result<Vec<Predictive>> {
        Ok(predict(self.require()?, &self.likelihood, x))
    }

    pub fn evaluate(&self, data: &Data) -> Result<Metrics> {
        evaluate(self.require()?, &self.likelihood, data)
    }

    fn require(&self) -> Result<&DualPosterior> {
        self.posterior
            .as_ref()
            .ok_or_else(|| ModelError::Config("the model has not seen a batch yet".into()))
    }

    /// Algorithm 1: learns from `batch` and forgets it but for the memory.
    pub fn update(&mut self, batch: &Data) -> Result<UpdateReport> {
        if batch.n() == 0 {
            return Err(ModelError::Config("an update needs at least one record".into()));
        }
        let d = self.posterior.as_ref().map_or(batch.d(), DualPosterior::d);
        batch.check(d, &self.likelihood)?;
        if self.posterior.is_none() {
            self.kernel.validate(d)?;
            let z = select_inducing(&self.kernel, batch.x(), self.config.inducing);
            self.init(z)?;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed ^ self.batches.wrapping_mul(0x9E37_79B9_7F4A_7C15));

        let mut seconds = StepSeconds::default();
        let mut clock = Instant::now();
        let mut lap = |slot: &mut f64| {
            *slot += clock.elapsed().as_secs_f64();
            clock = Instant::now();
        };
        let moved_inducing = self.config.inducing_policy == InducingPolicy::Pivoted
            && self.n_seen > 0
            && self.move_inducing(batch.x())?;
        lap(&mut seconds.inducing);
        let (points, mut kzx, mut sites) = self.learn_with_memory(batch)?;
        lap(&mut seconds.e_step);
        let rounds = if self.config.m_steps > 0 {
            self.config.m_rounds.max(1)
        } else {
            0
        };
        for round in 0..rounds {
            let before = self
                .config
                .reexpress_old_data
                .then(|| self.require().cloned())
                .transpose()?;
            self.m_step(&points, batch.n())?;
            if let Some(before) = &before {
                self.reexpress_old_data(before, &kzx, &sites)?;
            }
            lap(&mut seconds.m_step);
            if before.is_some() || round + 1 < rounds {
                self.relearn(&points, batch.n(), &mut kzx, &mut sites)?;
            }
            lap(&mut seconds.e_step);
        }
        self.remember(batch, &kzx, &sites, &mut rng)?;
        lap(&mut seconds.memory);

        self.n_seen += batch.n() as u64;
        self.batches += 1;
        Ok(UpdateReport {
            batch: self.batches,
            n_seen: self.n_seen,
            memory: self.memory.len(),
            moved_inducing,
            seconds,
        })
    }

    /// Step 1: pivoted Cholesky over `[Z; X_D]` and projection of all site
    /// totals onto the new `Z`. Returns whether `Z` changed.
    fn move_inducing(&mut self, x: &DMatrix<f64>) -> Result<bool> {
        let post = self.posterior.as_mut().expect("initialised");
        let m = post.m();
        let candidates = DMatrix::from_fn(m + x.nrows(), x.ncols(), |i, j| {
            if i < m {
                post.z[(i, j)]
            } else {
                x[(i - m, j)]
            }
        });
        let mut chosen = pivoted_cholesky(&post.kernel, &candidates, self.config.inducing);
        chosen.sort_unstable();
        if chosen.iter().copied().eq(0..m) {
            return Ok(false);
        }
        let z_new = candidates.select_rows(&chosen);
        let p = projection(post, &z_new);
        for sites in &mut post.sites {
            project_sites(sites, &p);
        }
        self.memory.project(&p);
        post.z = z_new;
        post.refresh()?;
        Ok(true)
    }

    /// Steps 2–3: takes the memory's contribution out of the totals and runs
    /// the E-step over the batch and the memory together from zero sites.
    /// Returns the points, their kernel columns and their sites.
    fn learn_with_memory(&mut self, batch: &Data) -> Result<(Data, DMatrix<f64>, PointSites)> {
        let post = self.posterior.as_mut().expect("initialised");
        for (totals, mem) in post.sites.iter_mut().zip(&self.memory.totals) {
            totals.l -= &mem.l;
            totals.lambda -= &mem.lambda;
        }
        let points = concat(batch, &self.memory.data(post.d()));
        let cross = post.cross(points.x());
        let mut sites = PointSites::zeros(points.n(), post.n_latent());
        e_step_at(post, &self.likelihood, &points, &cross, &mut sites, &self.config.e_step)?;
        self.memory_from(&cross.kzx, &sites, batch.n());
        Ok((points, cross.kzx, sites))
    }

    /// After `θ` moved: data no longer at hand keeps what it said about the
    /// inducing values `u = f(Z)` (its likelihood in u-space, natural
    /// parameters `K⁻¹l`, `K⁻¹ΛK⁻¹`) rather than its sites, i.e. its part of
    /// the totals is projected with `P = K_before⁻¹ K_now`.
    fn reexpress_old_data(&mut self, before: &DualPosterior, kzx: &DMatrix<f64>, sites: &PointSites) -> Result<()> {
        let post = self.posterior.as_mut().expect("initialised");
        let p = before.factors().chol_k.solve(&post.k_zz());
        for (totals, here) in post.sites.iter_mut().zip(sites.totals(kzx)) {
            let mut old = super::posterior::Sites {
                l: &totals.l - &here.l,
                lambda: &totals.lambda - &here.lambda,
            };
            project_sites(&mut old, &p);
            totals.l = old.l + here.l;
            totals.lambda = old.lambda + here.lambda;
        }
        post.refresh()
    }

    /// The memory's contributions are the points after the batch's `n_batch`.
    fn memory_from(&mut self, kzx: &DMatrix<f64>, sites: &PointSites, n_batch: usize) {
        let in_memory: Vec<usize> = (n_batch..sites.n()).collect();
        self.memory
            .reset_contributions(&kzx.select_columns(&in_memory), &sites.select(&in_memory));
    }

    /// Between M-step rounds: re-expresses the batch's and the memory's sites
    /// with kernel columns under the new `θ`, then runs the E-step over them
    /// again (warm-started). Only older data keeps its earlier columns.
    fn relearn(&mut self, points: &Data, n_batch: usize, kzx: &mut DMatrix<f64>, sites: &mut PointSites) -> Result<()> {
        let post = self.posterior.as_mut().expect("initialised");
        let cross = post.cross(points.x());
        for ((totals, old), new) in post
            .sites
            .iter_mut()
            .zip(sites.totals(kzx))
            .zip(sites.totals(&cross.kzx))
        {
            totals.l += &new.l - &old.l;
            totals.lambda += &new.lambda - &old.lambda;
        }
        post.refresh()?;
        e_step_at(post, &self.likelihood, points, &cross, sites, &self.config.e_step)?;
        *kzx = cross.kzx;
        self.memory_from(kzx, sites, n_batch);
        Ok(())
    }

    /// Step 4: Adam on `F(θ)` with the totals fixed; the memory's terms are
    /// scaled by `n_old / |M|` to stand for all past data.
    fn m_step(&mut self, points: &Data, n_batch: usize) -> Result<()> {
        if self.config.m_steps == 0 {
            return Ok(());
        }
        let n_memory = points.n() - n_batch;
        let memory_weight = if n_memory > 0 {
            self.n_seen as f64 / n_memory as f64
        } else {
            1.0
        };
        let weights: Vec<f64> = (0..points.n())
            .map(|i| if i < n_batch { 1.0 } else { memory_weight })
            .collect();
        let post = self.posterior.as_mut().expect("initialised");
        let mut theta = hyperparameters(&post.kernel, &self.likelihood);
        for _ in 0..self.config.m_steps {
            let grad = m_step_objective(post, &self.likelihood, points, Some(&weights))?.grad;
            self.adam.step(&mut theta, &grad);
            set_hyperparameters(&mut post.kernel, &mut self.likelihood, &theta);
            post.refresh()?;
        }
        Ok(())
    }

    /// Step 5: new memory points by BLS at the current posterior, each added
    /// with the contribution it has inside the totals (step 2's column and sites).
    fn remember(&mut self, batch: &Data, kzx: &DMatrix<f64>, sites: &PointSites, rng: &mut ChaCha8Rng) -> Result<()> {
        let post = self.posterior.as_ref().expect("initialised");
        let (keys, keep) = match self.config.memory {
            MemoryPolicy::None => return Ok(()),
            MemoryPolicy::PerBatch { k } => {
                let scores = bayesian_leverage_scores(post, &self.likelihood, batch);
                let keys: Vec<f64> = scores.iter().map(|&h| reservoir_key(h, rng)).collect();
                let keep = top_k(&keys, k);
                (keys, keep)
            }
            MemoryPolicy::Random { k } => {
                let keys: Vec<f64> = (0..batch.n()).map(|_| reservoir_key(1.0, rng)).collect();
                let keep = top_k(&keys, k);
                (keys, keep)
            }
            MemoryPolicy::Reservoir { capacity } => {
                let scores = bayesian_leverage_scores(post, &self.likelihood, batch);
                let keys: Vec<f64> = scores.iter().map(|&h| reservoir_key(h, rng)).collect();
                // Old and new compete on their keys; the capacity largest stay.
                let all: Vec<f64> = self
                    .memory
                    .points
                    .iter()
                    .map(|p| p.key)
                    .chain(keys.iter().copied())
                    .collect();
                let winners = top_k(&all, capacity);
                let n_old = self.memory.len();
                let mut leaving: Vec<usize> = (0..n_old).filter(|i| !winners.contains(i)).collect();
                leaving.sort_unstable_by(|a, b| b.cmp(a)); // swap_remove from the back keeps indices valid
                for i in leaving {
                    self.memory.remove(i);
                }
                let keep = winners.into_iter().filter(|&i| i >= n_old).map(|i| i - n_old).collect();
                (keys, keep)
            }
        };
        for i in keep {
            self.memory.insert(MemoryPoint {
                x: batch.x().row(i).iter().copied().collect(),
                y: batch.y()[i],
                column: kzx.column(i).into_owned(),
                s1: sites.s1.row(i).iter().copied().collect(),
                s2: sites.s2.row(i).iter().copied().collect(),
                key: keys[i],
            });
        }
        Ok(())
    }
}

/// `P = K(Z_old, Z_old)⁻¹ K(Z_old, Z_new)`: re-expresses sites over `Z_old` over `Z_new`.
/// An inducing input kept in place is the same inducing variable, jitter
/// included, so that a kept point projects onto itself exactly.
pub fn projection(post: &DualPosterior, z_new: &DMatrix<f64>) -> DMatrix<f64> {
    let mut cross = post.kernel.matrix(&post.z, z_new);
    for i in 0..post.m() {
        for j in 0..z_new.nrows() {
            if post.z.row(i) == z_new.row(j) {
                cross[(i, j)] += post.jitter;
            }
        }
    }
    post.factors().chol_k.solve(&cross)
}

fn concat(a: &Data, b: &Data) -> Data {
    if b.n() == 0 {
        return a.clone();
    }
    let x = DMatrix::from_fn(a.n() + b.n(), a.d(), |i, j| {
        if i < a.n() {
            a.x()[(i, j)]
        } else {
            b.x()[(i - a.n(), j)]
        }
    });
    let y = DVector::from_iterator(a.n() + b.n(), a.y().iter().chain(b.y().iter()).copied());
    Data::new(x, y).expect("both parts were validated")
}
