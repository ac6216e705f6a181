//! Offline training (t-SVGP, Adam et al. 2021): E-steps and M-steps
//! alternating over a whole data set, the gold standard the sequential
//! learner is measured against.

use nalgebra::DVector;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::model::data::Data;
use crate::model::dual::ask::{at_once, e_steps_beside, totals, unexpected, Local};
use crate::model::dual::blocks::{minibatches, Blocks};
use crate::model::dual::estep::{without, EStepConfig};
use crate::model::dual::objective::{hyperparameters, set_hyperparameters, with_inducing_inputs, Objective};
use crate::model::dual::shard::{route, Answer, Partition, Query, Shard, BLOCKS};
use crate::model::dual::snapshot::Snapshot;
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;
use crate::model::math::inducing::{select_inducing, Pivot};
use crate::model::math::kernel::Kernel;
use crate::model::math::optim::{Adam, Lbfgs, Optimizer};
use crate::model::posterior::{DualPosterior, Sites};

/// How the offline trainer's inducing inputs move as it trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InducingUpdate {
    /// Where pivoted Cholesky put them at the start.
    Fixed,
    /// Pivoted Cholesky again after every M-step, under the new kernel.
    Pivoted,
    /// Moved by the M-step's optimiser together with the hyperparameters.
    Optimized,
}

/// How [`fit_offline`] trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OfflineConfig {
    /// Rounds of one E-step then one M-step.
    pub rounds: usize,
    /// Each round's E-step.
    pub e_step: EStepConfig,
    /// Optimiser steps (Adam) or iterations (L-BFGS) per M-step.
    pub m_steps: usize,
    /// The M-step's optimiser.
    pub optimizer: Optimizer,
    /// Points per E-step and Adam step; `None` is full batch.
    pub minibatch: Option<usize>,
    /// How the inducing inputs move after the pivoted-Cholesky start.
    pub inducing: InducingUpdate,
    /// How pivoted Cholesky picks the starting inducing inputs.
    #[serde(default)]
    pub pivot: Pivot,
    /// The seed of the minibatches' order.
    pub seed: u64,
    /// Threads that answer the points' blocks (the fit does not depend on it).
    #[serde(default = "one_thread")]
    pub threads: usize,
}

fn one_thread() -> usize {
    1
}

impl Default for OfflineConfig {
    fn default() -> Self {
        OfflineConfig {
            // One round: every evaluation of L-BFGS's profile runs the E-steps
            // itself, so a second round only restarts the search without its
            // curvature (docs/RESULTS.md, "The offline fit as one search", 2026-11-26).
            rounds: 1,
            e_step: EStepConfig { steps: 5, rho: 0.9 },
            m_steps: 120,
            optimizer: Optimizer::Lbfgs { history: 10 },
            minibatch: None,
            inducing: InducingUpdate::Optimized,
            pivot: Pivot::Variance,
            seed: 0,
            threads: 1,
        }
    }
}

/// What training leaves behind: the posterior and the fitted likelihood.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OfflineModel {
    /// The fitted posterior (its kernel the learned one).
    pub posterior: DualPosterior,
    /// The likelihood with its learned parameters.
    pub likelihood: Likelihood,
    /// `F(θ)` after every round's M-step.
    pub objective: Vec<f64>,
}

/// Trains from the prior: `Z` by pivoted Cholesky on `data` (`m` points),
/// then `config.rounds` of E-step and M-step.
///
/// The points are a [`Shard`] of fixed blocks, as an update's are, answered
/// on `config.threads` threads: sums are made per block and added in block
/// order, so the fit is the same, bit for bit, on any number of threads.
pub fn fit_offline(
    kernel: Kernel,
    likelihood: Likelihood,
    data: &Data,
    m: usize,
    config: &OfflineConfig,
) -> Result<OfflineModel> {
    if m == 0 {
        return Err(ModelError::Config("need at least one inducing input (m = 0)".into()));
    }
    kernel.validate(data.d())?;
    data.check(data.d(), &likelihood)?;
    config.e_step.validate()?;
    let z = select_inducing(&kernel, data.x(), m, config.pivot);
    let posterior = DualPosterior::new(kernel, z, likelihood.n_latent())?;
    let n = data.n() as i64;
    let ids: Vec<i64> = (0..n).collect();
    let shard = Shard::new(Partition::WHOLE, 0, &ids, data.clone()).answered_on(config.threads);
    let mut block_sizes = vec![0; BLOCKS as usize];
    for &id in &ids {
        block_sizes[route(id) as usize] += 1;
    }
    let mut trainer = Trainer {
        posterior,
        likelihood,
        shard,
        n,
        block_sizes,
        config,
        rng: ChaCha8Rng::seed_from_u64(config.seed),
        adam: match config.optimizer {
            Optimizer::Adam { lr } => Some(Adam::new(lr)),
            Optimizer::Lbfgs { .. } => None,
        },
    };
    trainer.shard.answer(Query::Begin {
        model: trainer.snapshot(),
        memory: Vec::new(),
        pending: Vec::new(),
    });
    let mut objective = Vec::new();
    for round in 0..config.rounds {
        let started = std::time::Instant::now();
        trainer.refit()?;
        trainer.e_step()?;
        let e_seconds = started.elapsed().as_secs_f64();
        let (value, evaluations) = trainer.m_step()?;
        tracing::debug!(
            round,
            e_seconds,
            m_seconds = started.elapsed().as_secs_f64() - e_seconds,
            evaluations,
            objective = value,
            log_theta = ?trainer.params(false).as_slice(),
            "offline round"
        );
        objective.push(value);
        if config.inducing == InducingUpdate::Pivoted {
            let post = &mut trainer.posterior;
            post.z = select_inducing(&post.kernel, data.x(), post.m(), config.pivot);
        }
    }
    trainer.refit()?;
    trainer.e_step()?;
    Ok(OfflineModel {
        posterior: trainer.posterior,
        likelihood: trainer.likelihood,
        objective,
    })
}

/// The model being trained and the shard that holds the training points and their sites.
struct Trainer<'a> {
    posterior: DualPosterior,
    likelihood: Likelihood,
    shard: Shard,
    /// How many points: their ids are their row numbers, `0..n`.
    n: i64,
    /// How many points each block holds: what a minibatch of blocks stands for.
    block_sizes: Vec<usize>,
    config: &'a OfflineConfig,
    rng: ChaCha8Rng,
    /// Adam's moments, for an M-step by Adam steps.
    adam: Option<Adam>,
}

impl Trainer<'_> {
    fn snapshot(&self) -> Snapshot {
        Snapshot::of(&self.posterior, &self.likelihood)
    }

    /// Sets the totals to the points' sites under the current kernel and `Z`
    /// (a conjugate likelihood's sites made exact under it): the E-step's
    /// precondition after an M-step or a move of `Z`.
    fn refit(&mut self) -> Result<()> {
        self.posterior.refresh()?;
        let query = Query::Refit { model: self.snapshot() };
        self.posterior.whitened = at_once(totals(&mut Local(&mut self.shard), &self.posterior, query))?;
        self.posterior.refresh_sites()
    }

    /// E-steps on all points, or on each minibatch in turn with the others'
    /// sites held; nothing to do for a conjugate likelihood, whose sites
    /// [`refit`](Self::refit) made exact.
    fn e_step(&mut self) -> Result<()> {
        if self.likelihood.is_conjugate() {
            return Ok(());
        }
        let (m, n_latent) = (self.posterior.m(), self.posterior.n_latent());
        let Some(size) = self.config.minibatch else {
            let nothing_else = vec![Sites::zeros(m); n_latent];
            return self.e_steps_beside(&nothing_else);
        };
        for set in minibatches(0..self.n, size, self.rng.random()) {
            self.shard.answer(Query::Focus { blocks: set });
            let query = Query::Contribution { model: self.snapshot() };
            let here = at_once(totals(&mut Local(&mut self.shard), &self.posterior, query))?;
            self.e_steps_beside(&without(&self.posterior.whitened, &here))?;
        }
        self.shard.answer(Query::Focus { blocks: Blocks::ALL });
        Ok(())
    }

    fn e_steps_beside(&mut self, others: &[Sites]) -> Result<()> {
        let shards = &mut Local(&mut self.shard);
        at_once(e_steps_beside(
            shards,
            &mut self.posterior,
            &self.likelihood,
            self.config.e_step,
            others,
        ))
    }

    /// Maximises `F(θ)`; returns the final `F(θ)` on all data and how many
    /// times the objective was evaluated.
    fn m_step(&mut self) -> Result<(f64, usize)> {
        let with_z = self.config.inducing == InducingUpdate::Optimized;
        let mut params = self.params(with_z);
        let mut evaluations = 0;
        match self.config.optimizer {
            // L-BFGS climbs the profile `θ ↦ F(θ, sites*(θ))`: every evaluation
            // first brings the sites to their E-step fixed point (warm-started), where
            // the gradient at fixed sites is the gradient of the profile (envelope
            // theorem; exact for a Gaussian likelihood, whose sites are exact).
            Optimizer::Lbfgs { history } => {
                let mut search = Lbfgs::new(params, self.config.m_steps, history);
                while let Some(p) = search.next_point() {
                    evaluations += 1;
                    let p = p.clone();
                    let profile = |trainer: &mut Self| {
                        trainer.set_params(&p, with_z)?;
                        trainer.refit()?;
                        trainer.e_step()?;
                        let o = trainer.objective(Blocks::ALL, with_z)?;
                        tracing::trace!(evaluation = evaluations, objective = o.value, "offline profile");
                        Ok((o.value, o.stacked_grad()))
                    };
                    search.tell(profile(self))?;
                }
                params = search.best().0;
            }
            // Adam steps on the bound with the sites held, on all points or a minibatch.
            Optimizer::Adam { lr } => {
                let mut adam = self.adam.take().unwrap_or_else(|| Adam::new(lr));
                for _ in 0..self.config.m_steps {
                    evaluations += 1;
                    let points = match self.config.minibatch {
                        None => Blocks::ALL,
                        Some(size) => minibatches(0..self.n, size, self.rng.random())[0],
                    };
                    let grad = self.objective(points, with_z)?.stacked_grad();
                    adam.step(&mut params, &grad);
                    self.set_params(&params, with_z)?;
                }
                self.adam = Some(adam);
            }
        }
        self.set_params(&params, with_z)?;
        if matches!(self.config.optimizer, Optimizer::Lbfgs { .. }) {
            // The line search may have ended on a rejected point's sites.
            self.refit()?;
            self.e_step()?;
        }
        Ok((self.objective(Blocks::ALL, false)?.value, evaluations))
    }

    /// `F(θ)` with the points of `points` standing for all (their terms
    /// weighted by how many they stand for); `∂F/∂Z` only `with_z`.
    fn objective(&mut self, points: Blocks, with_z: bool) -> Result<Objective> {
        self.posterior.prepare_gradients();
        let query = Query::Gradient {
            model: self.snapshot(),
            memory_weight: 1.0,
            with_z,
        };
        let sample = points != Blocks::ALL;
        if sample {
            self.shard.answer(Query::Focus { blocks: points });
        }
        let answer = self.shard.answer(query);
        if sample {
            self.shard.answer(Query::Focus { blocks: Blocks::ALL });
        }
        let mut terms = match answer {
            Answer::Terms(terms) => terms.total(),
            other => return Err(unexpected("M-step terms", &other)),
        };
        if sample {
            let held: usize = (0..BLOCKS)
                .filter(|&block| points.contains(block))
                .map(|block| self.block_sizes[block as usize])
                .sum();
            terms.scale(self.n as f64 / held as f64);
        }
        Ok(terms.finish(&self.posterior, &self.likelihood, None))
    }

    /// The optimised parameters: hyperparameters, then `Z` column by column.
    fn params(&self, with_z: bool) -> DVector<f64> {
        let theta = hyperparameters(&self.posterior.kernel, &self.likelihood);
        match with_z {
            true => with_inducing_inputs(theta, &self.posterior.z),
            false => theta,
        }
    }

    fn set_params(&mut self, p: &DVector<f64>, with_z: bool) -> Result<()> {
        let n_theta = self.posterior.kernel.n_params() + self.likelihood.n_params();
        let scale = self.posterior.kernel.prior_variance();
        set_hyperparameters(
            &mut self.posterior.kernel,
            &mut self.likelihood,
            &p.rows(0, n_theta).into_owned(),
        );
        self.posterior.follow_kernel_scale(scale);
        if with_z {
            self.posterior.z.copy_from_slice(&p.as_slice()[n_theta..]);
        }
        self.posterior.refresh()
    }
}
