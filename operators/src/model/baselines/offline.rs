//! Offline training (t-SVGP, Adam et al. 2021): E-steps and M-steps
//! alternating over a whole data set, the gold standard the sequential
//! learner is measured against.

use nalgebra::DVector;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::model::data::Data;
use crate::model::dual::estep::{e_step_at, EStepConfig, PointSites};
use crate::model::dual::objective::{
    hyperparameters, m_step_objective, set_hyperparameters, with_inducing_inputs, DataTerms, Objective,
};
use crate::model::dual::posterior::{Cross, DualPosterior};
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;
use crate::model::math::inducing::{select_inducing, Pivot};
use crate::model::math::optim::{lbfgs_maximize, Adam, Optimizer};

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OfflineConfig {
    /// Rounds of one E-step then one M-step.
    pub rounds: usize,
    pub e_step: EStepConfig,
    /// Optimiser steps (Adam) or iterations (L-BFGS) per M-step.
    pub m_steps: usize,
    pub optimizer: Optimizer,
    /// Points per E-step and Adam step; `None` is full batch.
    pub minibatch: Option<usize>,
    /// How the inducing inputs move after the pivoted-Cholesky start.
    pub inducing: InducingUpdate,
    /// How pivoted Cholesky picks the starting inducing inputs.
    #[serde(default)]
    pub pivot: Pivot,
    pub seed: u64,
}

impl Default for OfflineConfig {
    fn default() -> Self {
        OfflineConfig {
            rounds: 3,
            e_step: EStepConfig { steps: 5, rho: 0.9 },
            m_steps: 40,
            optimizer: Optimizer::Lbfgs { history: 10 },
            minibatch: None,
            inducing: InducingUpdate::Optimized,
            pivot: Pivot::Variance,
            seed: 0,
        }
    }
}

/// What training leaves behind: the posterior, the fitted likelihood, and the
/// per-point sites of the training data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OfflineModel {
    pub posterior: DualPosterior,
    pub likelihood: Likelihood,
    pub sites: PointSites,
    /// `F(θ)` after every round's M-step.
    pub objective: Vec<f64>,
}

/// Trains from the prior: `Z` by pivoted Cholesky on `data` (`m` points),
/// then `config.rounds` of E-step and M-step.
pub fn fit_offline(
    kernel: crate::model::math::kernel::Kernel,
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
    let sites = PointSites::zeros(data.n(), likelihood.n_latent());
    let mut model = OfflineModel {
        posterior,
        likelihood,
        sites,
        objective: Vec::new(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut adam = match config.optimizer {
        Optimizer::Adam { lr } => Some(Adam::new(lr)),
        Optimizer::Lbfgs { .. } => None,
    };
    for round in 0..config.rounds {
        let started = std::time::Instant::now();
        let cross = model.rebuild_totals(data)?;
        model.e_step(data, &cross, config, &mut rng)?;
        let e_seconds = started.elapsed().as_secs_f64();
        let (value, evaluations) = model.m_step(data, config, adam.as_mut(), &mut rng)?;
        tracing::debug!(
            round,
            e_seconds,
            m_seconds = started.elapsed().as_secs_f64() - e_seconds,
            evaluations,
            objective = value,
            "offline round"
        );
        model.objective.push(value);
        if config.inducing == InducingUpdate::Pivoted {
            let m = model.posterior.m();
            model.posterior.z = select_inducing(&model.posterior.kernel, data.x(), m, config.pivot);
        }
    }
    let cross = model.rebuild_totals(data)?;
    model.e_step(data, &cross, config, &mut rng)?;
    Ok(model)
}

impl OfflineModel {
    /// Sets the totals to the training points' sites under the current kernel
    /// and `Z` (the E-step's precondition after an M-step or a move of `Z`);
    /// returns the kernel quantities at the data, valid until `θ` or `Z` move.
    fn rebuild_totals(&mut self, data: &Data) -> Result<Cross> {
        self.posterior.refresh()?;
        let cross = self.posterior.cross(data.x());
        self.posterior.whitened = self.sites.totals(&cross.a);
        self.posterior.refresh_sites()?;
        Ok(cross)
    }

    fn e_step(&mut self, data: &Data, cross: &Cross, config: &OfflineConfig, rng: &mut ChaCha8Rng) -> Result<()> {
        let Some(size) = config.minibatch else {
            return e_step_at(
                &mut self.posterior,
                &self.likelihood,
                data,
                cross,
                &mut self.sites,
                &config.e_step,
                0.0,
            );
        };
        for rows in shuffled_batches(data.n(), size, rng) {
            let mut part = self.sites.select(&rows);
            e_step_at(
                &mut self.posterior,
                &self.likelihood,
                &data.select(&rows),
                &cross.select(&rows),
                &mut part,
                &config.e_step,
                0.0,
            )?;
            self.sites.scatter(&rows, &part);
        }
        Ok(())
    }

    /// Maximises `F(θ)` with the totals fixed; returns the final `F(θ)` on
    /// all data and how many times the objective was evaluated.
    fn m_step(
        &mut self,
        data: &Data,
        config: &OfflineConfig,
        adam: Option<&mut Adam>,
        rng: &mut ChaCha8Rng,
    ) -> Result<(f64, usize)> {
        let with_z = config.inducing == InducingUpdate::Optimized;
        let start = self.params(with_z);
        let mut evaluations = 0;
        let params = match (config.optimizer, adam) {
            // L-BFGS climbs the profile `θ ↦ F(θ, sites*(θ))`: every evaluation
            // first brings the sites to their E-step fixed point (warm-started), where
            // the gradient at fixed sites is the gradient of the profile (envelope
            // theorem; exact for a Gaussian likelihood, whose E-step is exact).
            (Optimizer::Lbfgs { history }, _) => {
                let f = |p: &DVector<f64>| {
                    evaluations += 1;
                    let warm = self.sites.clone();
                    let mut profile = |model: &mut Self| {
                        model.set_params(p, with_z)?;
                        let cross = model.rebuild_totals(data)?;
                        model.e_step(data, &cross, config, rng)?;
                        Ok(model.objective_at(data, &cross, with_z))
                    };
                    // A failed trial point must not leave its sites behind.
                    let o = profile(self).inspect_err(|_| self.sites = warm)?;
                    Ok((o.value, packed_grad(&o, with_z)))
                };
                lbfgs_maximize(f, start, config.m_steps, history)?.0
            }
            (Optimizer::Adam { .. }, Some(adam)) => {
                let mut p = start;
                for _ in 0..config.m_steps {
                    evaluations += 1;
                    let o = match config.minibatch {
                        None => m_step_objective(&self.posterior, &self.likelihood, data, None)?,
                        Some(size) => {
                            let rows = shuffled_batches(data.n(), size, rng).swap_remove(0);
                            let weights = vec![data.n() as f64 / rows.len() as f64; rows.len()];
                            m_step_objective(&self.posterior, &self.likelihood, &data.select(&rows), Some(&weights))?
                        }
                    };
                    adam.step(&mut p, &packed_grad(&o, with_z));
                    self.set_params(&p, with_z)?;
                }
                p
            }
            (Optimizer::Adam { .. }, None) => unreachable!("an Adam state exists for the Adam optimiser"),
        };
        self.set_params(&params, with_z)?;
        let cross = if matches!(config.optimizer, Optimizer::Lbfgs { .. }) {
            // The line search may have ended on a rejected point's sites.
            let cross = self.rebuild_totals(data)?;
            self.e_step(data, &cross, config, rng)?;
            cross
        } else {
            self.posterior.cross(data.x())
        };
        Ok((self.objective_at(data, &cross, false).value, evaluations))
    }

    /// `F(θ)` on all of `data`, whose kernel quantities are `cross` (`∂F/∂Z` only `with_z`).
    fn objective_at(&self, data: &Data, cross: &Cross, with_z: bool) -> Objective {
        DataTerms::new(&self.posterior, &self.likelihood, data, cross, None, with_z).finish(
            &self.posterior,
            &self.likelihood,
            None,
        )
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

/// The objective's gradient in the layout of [`OfflineModel::params`].
fn packed_grad(o: &Objective, with_z: bool) -> DVector<f64> {
    if !with_z {
        return o.grad.clone();
    }
    let grad_z = o.grad_z.as_ref().expect("the objective was asked for ∂F/∂Z");
    with_inducing_inputs(o.grad.clone(), grad_z)
}

/// A random partition of `0..n` into batches of `size` (the last may be smaller).
fn shuffled_batches(n: usize, size: usize, rng: &mut ChaCha8Rng) -> Vec<Vec<usize>> {
    let mut rows: Vec<usize> = (0..n).collect();
    rows.shuffle(rng);
    rows.chunks(size.max(1)).map(<[usize]>::to_vec).collect()
}
