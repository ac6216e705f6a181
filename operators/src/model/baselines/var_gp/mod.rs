//! Variational auto-regressive GPs (Kapoor, Karaletsos and Bui, ICML 2021;
//! seed 004): a continual learner whose inducing set grows by `M` a task.
//!
//! Task `t` brings its own inducing inputs `Z_t`; the inducing values of
//! earlier tasks stay frozen and the new ones are conditioned on them,
//! `q(u_t | u_<t) = N(A_t u_<t + m_t, Σ_t)`, `A_t = K(Z_t, Z_<t) K(Z_<t, Z_<t)⁻¹`
//! (seed Eq. 21). The prior's conditional is `p(u_t | u_<t) = N(A_t u_<t, C_t)`,
//! `C_t = K_tt − A_t K_<t,t`, so the innovation `e_t = u_t − A_t u_<t` is
//! `N(0, C_t)` under the prior, `N(m_t, Σ_t)` under `q`, and independent of
//! `u_<t` under both. In the whitened coordinates of the joint factor
//! `L = chol(K(Z_≤t, Z_≤t))`, tasks in order, block `t` of `v = L⁻¹u` is
//! exactly `L_C⁻¹e_t` (`L_C = chol(C_t)`, the diagonal block of `L`): the
//! whole auto-regressive posterior (seed Eq. 22) is a [`DualPosterior`] over
//! `Z_≤t` whose whitened sites are block diagonal, one block a task. So it
//! predicts, scores and checkpoints as every other posterior, its KL is the
//! sum of the blocks' whitened KLs (`E_q(u_<t) KL[q(u_t|u_<t) ‖ p(u_t|u_<t)]
//! = KL[N(m_t, Σ_t) ‖ N(0, C_t)]`, whatever `u_<t`), and the block `(m_t, Σ_t)`
//! in the seed's own parameters comes back by [`VarGpLearner::innovation`].
//!
//! Learning task `t` maximises `Σ_i E_q[log p(y_i|f_i)] − KL[N(m_t, Σ_t) ‖ N(0, C_t)]`
//! over block `t` alone, with the frozen blocks' mean and variance at every
//! point as fixed offsets: `f_i = g_i + a_iᵀv_t`, `a_i` block `t` of `L⁻¹k_i`.
//! Its natural-gradient fixed point is the dual one with the offset taken
//! out of the site, `λ1_i = α̂_i + β̂_i (μ_i − g_i)`, `Λ = Σ β̂_i a_i a_iᵀ`:
//! the project's damped E-step, with its trust radius and backtracking.
//!
//! The seed's ablations (its Appendix B) are [`VarGpVariant`]s of the same
//! learner, solved by the same block E-step: `Global`, each block against
//! its own prior `N(0, K_tt)` with `q(u)` block diagonal in `u`, and
//! `Retrain` (Re-VAR-GP), every block re-learned with the old posterior's
//! sites held as the factor standing for the earlier tasks.
//!
//! The hyperparameters get the seed's log-normal posterior by default,
//! re-learned with each task and averaged over in predictions ([`theta`]);
//! or they are held at the starting kernel, or at a point estimate from the
//! first task (the offline trainer's E- and M-steps on it).

mod block_diagonal;
mod theta;

use block_diagonal::BlockDiagonal;

pub use theta::{held_whitened_data_term, standard_draws, under, ThetaPosterior, ThetaStep};

use std::ops::Range;
use std::time::Instant;

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::model::baselines::offline::{fit_offline, InducingUpdate, OfflineConfig};
use crate::model::data::Data;
use crate::model::dual::estep::{relative_change, site_precision, Backtracking, EStepConfig, PointSites};
use crate::model::dual::objective::expected_log_message;
use crate::model::error::{ModelError, Result};
use crate::model::learner::{field_accessors, Learned, StreamingLearner};
use crate::model::likelihood::{Expectation, Likelihood};
use crate::model::math::inducing::{select_inducing, Pivot};
use crate::model::math::kernel::Kernel;
use crate::model::math::linalg::cholesky_jittered;
use crate::model::math::optim::Optimizer;
use crate::model::posterior::{Cross, DualPosterior, Marginals, Sites};

/// Where the hyperparameters come from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum VarGpTheta {
    /// The starting kernel and likelihood throughout.
    Fixed,
    /// Fitted on the first task by the offline trainer (`rounds` of an E-step
    /// then `m_steps` L-BFGS iterations, inducing inputs kept), then held.
    FirstTask {
        /// Rounds of the offline trainer.
        rounds: usize,
        /// L-BFGS iterations a round.
        m_steps: usize,
    },
    /// The seed's log-normal posterior, re-learned with each task and
    /// averaged over in predictions. VAR-GP's variant (`ar`) only.
    Posterior(ThetaConfig),
}

/// How VAR-GP learns `q_t(θ)`: the previous task's posterior is its prior
/// (the first task's: centred on the starting kernel, `prior_sd` in log
/// space), the KL weighed by `beta`. A task runs the block's E-step over
/// `samples` draws of `θ`, then `rounds` times `m_steps` L-BFGS iterations
/// on `q(θ)` and the E-step again. Predictions average over `samples` draws.
/// The draws come from `seed` (and the task's index).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ThetaConfig {
    /// The first prior's standard deviation, in log space.
    pub prior_sd: f64,
    /// The KL term's weight.
    pub beta: f64,
    /// Draws of `θ` per E-step and per prediction.
    pub samples: usize,
    /// Rounds of `q(θ)` steps and E-steps a task.
    pub rounds: usize,
    /// L-BFGS iterations on `q(θ)` a round.
    pub m_steps: usize,
    /// The seed of the draws.
    pub seed: u64,
}

impl Default for ThetaConfig {
    fn default() -> Self {
        ThetaConfig {
            prior_sd: 1.0,
            beta: 1.0,
            samples: 4,
            rounds: 1,
            m_steps: 20,
            seed: 0,
        }
    }
}

/// Which of the seed's models (its Appendix B ablations) the learner is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VarGpVariant {
    /// VAR-GP: each block conditioned on the frozen earlier ones, `q(u_t | u_<t)`.
    #[default]
    Ar,
    /// No auto-regressive term: block `t` has the prior `N(0, K(Z_t, Z_t))`
    /// and `q(u)` is block diagonal in `u`, earlier blocks frozen.
    Global,
    /// Re-VAR-GP: every block re-learned with each task, the previous
    /// posterior `q_{t−1}(u_<t) / p(u_<t)` standing for the earlier tasks' data.
    Retrain,
}

/// How [`VarGpLearner`] learns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VarGpConfig {
    /// Inducing inputs each task brings (`M`): the total is tasks × `M`.
    pub inducing: usize,
    /// How pivoted Cholesky picks a task's inducing inputs.
    pub pivot: Pivot,
    /// At most `steps` natural-gradient steps a task, damping `rho`.
    pub e_step: EStepConfig,
    /// A task's E-step stops once no site moved by more than this, relatively.
    pub tolerance: f64,
    /// Where the hyperparameters come from.
    pub theta: VarGpTheta,
    /// Checkpoints from before the ablations are VAR-GP's.
    #[serde(default)]
    pub variant: VarGpVariant,
}

impl Default for VarGpConfig {
    fn default() -> Self {
        VarGpConfig {
            inducing: 100,
            // A task's inducing inputs are chosen from it alone and never
            // revised: outliers taken as pivots are capacity lost for good
            // (split Fashion-MNIST: 0.61 accuracy by variance, 0.74 by trace; docs/MODEL.md, "VAR-GP").
            pivot: Pivot::Trace,
            e_step: EStepConfig { steps: 50, rho: 1.0 },
            tolerance: 1e-6,
            // The seed's model; held or fitted on the first task, θ did worse
            // on every set measured (docs/MODEL.md, "VAR-GP").
            theta: VarGpTheta::Posterior(ThetaConfig::default()),
            variant: VarGpVariant::Ar,
        }
    }
}

impl VarGpConfig {
    /// Refuses settings that cannot work (no inducing inputs, no E-step, …).
    pub fn validate(&self) -> Result<()> {
        if self.inducing == 0 {
            return Err(ModelError::Config(
                "VAR-GP: each task needs at least one inducing input".into(),
            ));
        }
        if self.e_step.steps == 0 {
            return Err(ModelError::Config("VAR-GP: a task needs at least one E-step".into()));
        }
        if let VarGpTheta::Posterior(ThetaConfig {
            prior_sd,
            beta,
            samples,
            ..
        }) = self.theta
        {
            if self.variant != VarGpVariant::Ar {
                return Err(ModelError::Config(
                    "VAR-GP: the posterior over θ is built for the auto-regressive variant (ar) only".into(),
                ));
            }
            if !(prior_sd > 0.0 && prior_sd.is_finite() && beta >= 0.0 && beta.is_finite()) || samples == 0 {
                return Err(ModelError::Config(format!(
                    "VAR-GP: θ's prior sd {prior_sd} must be positive, β {beta} non-negative, both finite, \
                     and θ needs at least one draw ({samples} given)"
                )));
            }
        }
        if !(self.tolerance >= 0.0 && self.tolerance.is_finite()) {
            return Err(ModelError::Config(format!(
                "VAR-GP: E-step tolerance {} must be finite and non-negative",
                self.tolerance
            )));
        }
        self.e_step.validate()
    }
}

/// What learning one task's block did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockReport {
    /// `Σ_i E_q[log p(y_i|f_i)] − KL` of the block, at the state before the last step.
    pub bound: f64,
    /// The natural-gradient steps taken.
    pub steps: usize,
}

/// Kapoor et al.'s VAR-GP (or one of its ablations): a block of inducing
/// inputs a task; serialisable as a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VarGpLearner {
    config: VarGpConfig,
    /// The starting kernel; the learned one is the posterior's.
    kernel: Kernel,
    likelihood: Likelihood,
    posterior: Option<DualPosterior>,
    /// Inducing inputs each task brought, in order (rows of `Z`, block by block).
    task_inducing: Vec<usize>,
    /// `q(θ)` after the last task, where the configuration learns it; the
    /// posterior's own kernel is then `q(θ)`'s median.
    #[serde(default)]
    theta: Option<ThetaPosterior>,
    n_seen: u64,
    batches: u64,
}

impl VarGpLearner {
    /// A learner before its first task, `kernel` and `likelihood` its starting hyperparameters.
    pub fn new(kernel: Kernel, likelihood: Likelihood, config: VarGpConfig) -> Result<Self> {
        config.validate()?;
        Ok(VarGpLearner {
            config,
            kernel,
            likelihood,
            posterior: None,
            task_inducing: Vec::new(),
            theta: None,
            n_seen: 0,
            batches: 0,
        })
    }

    /// The rows of `Z` (and of the whitened sites) each task brought.
    pub fn task_blocks(&self) -> Vec<Range<usize>> {
        let mut start = 0;
        self.task_inducing
            .iter()
            .map(|&m| {
                let block = start..start + m;
                start += m;
                block
            })
            .collect()
    }

    /// The seed's parameters of task `task`'s block for latent `c`: the
    /// innovation's `(m_t, Σ_t)`, with `q(u_t | u_<t) = N(A_t u_<t + m_t, Σ_t)`.
    pub fn innovation(&self, task: usize, c: usize) -> Result<(DVector<f64>, DMatrix<f64>)> {
        let post = self.fitted()?;
        let blocks = self.task_blocks();
        let block = blocks
            .get(task)
            .ok_or_else(|| ModelError::Config(format!("no task {task}: {} learned", blocks.len())))?;
        if c >= post.n_latent() {
            return Err(ModelError::Config(format!("no latent {c}")));
        }
        let (start, m) = (block.start, block.len());
        let l_c = post.factors().chol_k.l().view((start, start), (m, m)).into_owned();
        let sites = &post.whitened[c];
        let lambda = sites.lambda.view((start, start), (m, m)).into_owned();
        let (d, _) = cholesky_jittered(&(DMatrix::identity(m, m) + lambda), 0.0, "I + P_t")?;
        let mean_v = d.solve(&sites.l.rows(start, m).into_owned());
        let cov_v = d.inverse();
        Ok((&l_c * mean_v, &l_c * cov_v * l_c.transpose()))
    }

    /// Learns `batch` as one task: a new block of inducing inputs conditioned
    /// on the frozen ones. A task with no records changes nothing.
    pub fn update(&mut self, batch: &Data) -> Result<(BlockReport, usize)> {
        if batch.n() == 0 {
            self.batches += 1;
            let m = self.posterior.as_ref().map_or(0, DualPosterior::m);
            return Ok((BlockReport { bound: 0.0, steps: 0 }, m));
        }
        let d = self.posterior.as_ref().map_or(batch.d(), DualPosterior::d);
        batch.check(d, &self.likelihood)?;
        self.kernel().validate(d)?;
        let (
            post,
            Task {
                likelihood,
                theta,
                report,
            },
        ) = match &self.posterior {
            None => self.first_task(batch)?,
            Some(post) => self.next_task(post, batch)?,
        };
        if post
            .whitened
            .iter()
            .any(|s| s.l.iter().chain(s.lambda.iter()).any(|v| !v.is_finite()))
        {
            return Err(ModelError::Config("VAR-GP: a task's sites came out non-finite".into()));
        }
        let m_new = post.m() - self.posterior.as_ref().map_or(0, DualPosterior::m);
        let total = post.m();
        self.posterior = Some(post);
        self.likelihood = likelihood;
        self.theta = theta;
        self.task_inducing.push(m_new);
        self.batches += 1;
        self.n_seen += batch.n() as u64;
        Ok((report, total))
    }

    /// The first task: `θ` as configured, then its block from the prior.
    fn first_task(&self, batch: &Data) -> Result<(DualPosterior, Task)> {
        let (kernel, likelihood, z) = match self.config.theta {
            VarGpTheta::FirstTask { rounds, m_steps } if rounds > 0 => {
                let config = OfflineConfig {
                    rounds,
                    m_steps,
                    optimizer: Optimizer::Lbfgs { history: 10 },
                    inducing: InducingUpdate::Fixed,
                    pivot: self.config.pivot,
                    ..OfflineConfig::default()
                };
                let model = fit_offline(
                    self.kernel.clone(),
                    self.likelihood.clone(),
                    batch,
                    self.config.inducing,
                    &config,
                )?;
                (model.posterior.kernel, model.likelihood, model.posterior.z)
            }
            _ => {
                let z = select_inducing(&self.kernel, batch.x(), self.config.inducing, self.config.pivot);
                (self.kernel.clone(), self.likelihood.clone(), z)
            }
        };
        // With no earlier blocks the three variants are one model.
        let mut post = DualPosterior::new(kernel, z, likelihood.n_latent())?;
        let task = self.learn_ar(&mut post, 0, &likelihood, batch)?;
        Ok((post, task))
    }

    /// A later task: `Z_t` chosen from its records, the earlier blocks
    /// frozen (VAR-GP, global) or re-learned (Re-VAR-GP).
    fn next_task(&self, old: &DualPosterior, batch: &Data) -> Result<(DualPosterior, Task)> {
        let z_t = select_inducing(&old.kernel, batch.x(), self.config.inducing, self.config.pivot);
        let m_old = old.m();
        let mut z = old.z.clone().resize_vertically(m_old + z_t.nrows(), 0.0);
        z.rows_mut(m_old, z_t.nrows()).copy_from(&z_t);
        let mut post = grown(old, z)?;
        let likelihood = &self.likelihood;
        let task = match self.config.variant {
            VarGpVariant::Ar => self.learn_ar(&mut post, m_old, likelihood, batch)?,
            VarGpVariant::Global => Task::held(
                likelihood,
                learn_global_block(&mut post, old, m_old, likelihood, batch, &self.config)?,
            ),
            VarGpVariant::Retrain => Task::held(
                likelihood,
                learn_all_blocks(&mut post, likelihood, batch, &self.config)?,
            ),
        };
        Ok((post, task))
    }

    /// VAR-GP's block of `post` from row `from` (its sites zero): learned
    /// with `θ` held, or with `q(θ)` where the configuration learns it.
    fn learn_ar(&self, post: &mut DualPosterior, from: usize, likelihood: &Likelihood, batch: &Data) -> Result<Task> {
        let mut blocks = self.task_blocks();
        blocks.push(from..post.m());
        let VarGpTheta::Posterior(ThetaConfig {
            prior_sd,
            beta,
            samples,
            rounds,
            m_steps,
            seed,
        }) = self.config.theta
        else {
            return Ok(Task::held(
                likelihood,
                learn_block(post, &blocks, likelihood, batch, &self.config)?,
            ));
        };
        let prior = self
            .theta
            .clone()
            .unwrap_or_else(|| ThetaPosterior::around(post, likelihood, prior_sd));
        // Fresh draws each task, fixed within it: the θ step's objective is then deterministic.
        let task_seed = seed
            .wrapping_mul(SEED_MIX)
            .wrapping_add(self.task_inducing.len() as u64);
        let eps = standard_draws(prior.mean.len(), samples, task_seed);
        let mut q = prior.clone();
        let mut report = learn_block_over(post, &blocks, &q.draws_of(post, likelihood, &eps)?, batch, &self.config)?;
        for _ in 0..rounds {
            let step = ThetaStep {
                post,
                blocks: &blocks,
                likelihood,
                data: batch,
                prior: &prior,
                eps: &eps,
                beta,
            };
            q = step.climb(&q, m_steps)?.0;
            clear_block(post, from)?;
            report = learn_block_over(post, &blocks, &q.draws_of(post, likelihood, &eps)?, batch, &self.config)?;
        }
        let (median, likelihood) = under(post, likelihood, &q.mean)?;
        *post = median;
        Ok(Task {
            likelihood,
            theta: Some(q),
            report,
        })
    }
}

/// What learning a task gives besides the posterior.
struct Task {
    /// The likelihood under the learned `θ` (its median where `q(θ)` is learned).
    likelihood: Likelihood,
    theta: Option<ThetaPosterior>,
    report: BlockReport,
}

impl Task {
    fn held(likelihood: &Likelihood, report: BlockReport) -> Self {
        Task {
            likelihood: likelihood.clone(),
            theta: None,
            report,
        }
    }
}

/// Sets the sites of `post`'s block from row `from` to zero.
fn clear_block(post: &mut DualPosterior, from: usize) -> Result<()> {
    let m_t = post.m() - from;
    for s in &mut post.whitened {
        s.l.rows_mut(from, m_t).fill(0.0);
        s.lambda.view_mut((from, from), (m_t, m_t)).fill(0.0);
    }
    post.refresh_sites()
}

/// `old`'s posterior over the inducing inputs `z`, `old.z` its first rows:
/// its whitened sites kept, the new rows' sites zero.
fn grown(old: &DualPosterior, z: DMatrix<f64>) -> Result<DualPosterior> {
    let m = z.nrows();
    let mut post = DualPosterior::new(old.kernel.clone(), z, old.n_latent())?;
    post.jitter = old.jitter;
    post.whitened = old
        .whitened
        .iter()
        .map(|s| Sites {
            l: s.l.clone().resize_vertically(m, 0.0),
            lambda: s.lambda.clone().resize(m, m, 0.0),
        })
        .collect();
    post.refresh()?;
    Ok(post)
}

/// One block's problem: maximise `Σ_i E_q[log p(y_i|f_i)] − KL[q(v) ‖ N(0, I)]
/// + E_q[log t(v)]` over the block's `q(v)`, where `f_i = g_i + b_iᵀv`, `g_i`
/// the rest of the posterior (frozen) and `t` fixed Gaussian sites.
struct BlockProblem {
    /// `b_i` as columns (block × points).
    coords: DMatrix<f64>,
    /// `g_i`'s mean and variance at the points.
    frozen: Marginals,
    /// `t`'s sites, one per latent, in the block's coordinates: zero but for
    /// Re-VAR-GP, where they are the old posterior's.
    fixed: Vec<Sites>,
    /// The likelihood of each draw of `θ`, its points `n` columns of
    /// `coords` each, draw after draw, weighed `1/draws` (one draw where `θ` is held).
    likelihoods: Vec<Likelihood>,
}

impl BlockProblem {
    /// The block with columns `coords` of the points whose marginals under
    /// `post` (the block itself at its prior) are `marginals`, against the
    /// rest of `post` and no fixed sites.
    fn against(post: &DualPosterior, marginals: Marginals, coords: DMatrix<f64>, likelihood: &Likelihood) -> Self {
        BlockProblem {
            frozen: frozen_marginals(marginals, &coords),
            fixed: vec![Sites::zeros(coords.nrows()); post.n_latent()],
            coords,
            likelihoods: vec![likelihood.clone()],
        }
    }

    /// The problems of several draws of `θ` (no fixed sites) as one: the
    /// bound's Monte Carlo average over the draws.
    fn stacked(draws: Vec<BlockProblem>) -> Self {
        let columns: Vec<_> = draws.iter().flat_map(|p| p.coords.column_iter()).collect();
        let rows = |part: fn(&BlockProblem) -> &DMatrix<f64>| {
            let blocks: Vec<_> = draws.iter().flat_map(|p| part(p).row_iter()).collect();
            DMatrix::from_rows(&blocks)
        };
        BlockProblem {
            coords: DMatrix::from_columns(&columns),
            frozen: Marginals {
                mean: rows(|p| &p.frozen.mean),
                var: rows(|p| &p.frozen.var),
            },
            fixed: draws[0].fixed.clone(),
            likelihoods: draws.iter().flat_map(|p| p.likelihoods.clone()).collect(),
        }
    }
}

/// Learns the last of `post`'s task blocks `blocks` (its sites zero on
/// entry) from `data`, every earlier block held: VAR-GP, its block in the
/// whitened coordinates `v_t = L_C⁻¹e_t` of the joint.
fn learn_block(
    post: &mut DualPosterior,
    blocks: &[Range<usize>],
    likelihood: &Likelihood,
    data: &Data,
    config: &VarGpConfig,
) -> Result<BlockReport> {
    let problem = block_against(post, blocks, likelihood, data)?;
    set_block(post, blocks, &problem, data, config)
}

/// [`learn_block`] with the bound averaged over `draws`, `post` under each
/// draw of `θ` (the whitened sites alike): VAR-GP's block under `q(θ)`.
fn learn_block_over(
    post: &mut DualPosterior,
    blocks: &[Range<usize>],
    draws: &[(DualPosterior, Likelihood)],
    data: &Data,
    config: &VarGpConfig,
) -> Result<BlockReport> {
    let problems = draws
        .iter()
        .map(|(post, likelihood)| block_against(post, blocks, likelihood, data))
        .collect::<Result<_>>()?;
    set_block(post, blocks, &BlockProblem::stacked(problems), data, config)
}

/// The problem of the last of `post`'s task blocks at the points of `data`.
fn block_against(
    post: &DualPosterior,
    blocks: &[Range<usize>],
    likelihood: &Likelihood,
    data: &Data,
) -> Result<BlockProblem> {
    let cross = post.cross(data.x());
    let from = last_block(blocks).start;
    let coords = cross.a.rows(from, post.m() - from).into_owned();
    let marginals = BlockDiagonal::of(post, blocks)?.marginals(post, &cross);
    Ok(BlockProblem::against(post, marginals, coords, likelihood))
}

fn last_block(blocks: &[Range<usize>]) -> &Range<usize> {
    blocks.last().expect("a task brings a block")
}

/// Solves `problem` and sets the last of `post`'s task blocks to its sites.
fn set_block(
    post: &mut DualPosterior,
    blocks: &[Range<usize>],
    problem: &BlockProblem,
    data: &Data,
    config: &VarGpConfig,
) -> Result<BlockReport> {
    let from = last_block(blocks).start;
    let m_t = post.m() - from;
    let (own, report) = solve_block(post, from, problem, data, config)?;
    for (joint, own) in post.whitened.iter_mut().zip(&own) {
        joint.l.rows_mut(from, m_t).copy_from(&own.l);
        joint.lambda.view_mut((from, from), (m_t, m_t)).copy_from(&own.lambda);
    }
    post.refresh_sites()?;
    Ok(report)
}

/// The global variant's task: `post` (`old` grown by the block from row
/// `from`) becomes `q(u) = q_old(u_<t) · q(u_t)`, block diagonal in `u`,
/// with `q(u_t)` learned against its own prior `N(0, K_tt)`: the block is
/// whitened by `L_t = chol(K_tt)`, `u_t = L_t v`, and `f_i`'s share of it is
/// `(K⁻¹k_i)_tᵀ u_t`, so `b_i = L_tᵀ(K⁻¹k_i)_t`.
fn learn_global_block(
    post: &mut DualPosterior,
    old: &DualPosterior,
    from: usize,
    likelihood: &Likelihood,
    data: &Data,
    config: &VarGpConfig,
) -> Result<BlockReport> {
    let m_t = post.m() - from;
    let k = post.k_zz();
    let (chol_t, _) = cholesky_jittered(&k.view((from, from), (m_t, m_t)).into_owned(), 0.0, "K_tt")?;
    let l_t = chol_t.l();
    let prior_block = vec![(DVector::zeros(m_t), k.view((from, from), (m_t, m_t)).into_owned()); post.n_latent()];
    set_block_diagonal(post, old, &prior_block)?;
    let cross = post.cross(data.x());
    let weights = post
        .factors()
        .chol_k
        .l()
        .transpose()
        .solve_upper_triangular(&cross.a)
        .ok_or_else(|| ModelError::Cholesky {
            what: "K(Z, Z): its factor has a zero on the diagonal".into(),
            jitter: post.jitter,
        })?;
    let coords = l_t.tr_mul(&weights.rows(from, m_t));
    let problem = BlockProblem::against(post, post.marginals(&cross), coords, likelihood);
    let (own, report) = solve_block(post, from, &problem, data, config)?;
    let blocks = own
        .iter()
        .map(|sites| {
            let (mean, cov) = gaussian_of_sites(sites)?;
            Ok((&l_t * mean, &l_t * cov * l_t.transpose()))
        })
        .collect::<Result<Vec<_>>>()?;
    set_block_diagonal(post, old, &blocks)?;
    Ok(report)
}

/// Re-VAR-GP's task: every block of `post` re-learned from `data`, `post`'s
/// sites on entry (the old posterior's, zero on the new rows) held as the
/// fixed factor `q_old(u_<t) / p(u_<t)`. With `Z̃_<t = Z_<t` (the inducing
/// inputs are never moved here) the seed's `E[ℜ_t]` (Eq. 19) is exactly that
/// factor's expectation under `q`.
fn learn_all_blocks(
    post: &mut DualPosterior,
    likelihood: &Likelihood,
    data: &Data,
    config: &VarGpConfig,
) -> Result<BlockReport> {
    let cross = post.cross(data.x());
    let n_latent = post.n_latent();
    let residual = DMatrix::from_fn(data.n(), n_latent, |i, _| cross.residual_var[i]);
    let problem = BlockProblem {
        coords: cross.a,
        frozen: Marginals {
            mean: DMatrix::zeros(data.n(), n_latent),
            var: residual,
        },
        fixed: post.whitened.clone(),
        likelihoods: vec![likelihood.clone()],
    };
    let (all, report) = solve_block(post, 0, &problem, data, config)?;
    post.whitened = all;
    post.refresh_sites()?;
    Ok(report)
}

/// `post`'s sites set so that `q(u)` is `old`'s over its rows and
/// `N(mean, cov)` (one per latent) over the rest, independent of each other.
fn set_block_diagonal(
    post: &mut DualPosterior,
    old: &DualPosterior,
    block: &[(DVector<f64>, DMatrix<f64>)],
) -> Result<()> {
    let (m, m_old) = (post.m(), old.m());
    let l = post.factors().chol_k.l();
    let mut whitened = Vec::with_capacity(block.len());
    for (c, (block_mean, block_cov)) in block.iter().enumerate() {
        let (old_mean, old_cov) = old.q_u(c);
        let mut mean = old_mean.resize_vertically(m, 0.0);
        mean.rows_mut(m_old, m - m_old).copy_from(block_mean);
        let mut cov = old_cov.resize(m, m, 0.0);
        cov.view_mut((m_old, m_old), (m - m_old, m - m_old))
            .copy_from(block_cov);
        whitened.push(sites_of_q_u(&l, &mean, &cov)?);
    }
    post.whitened = whitened;
    post.refresh_sites()
}

/// The whitened sites `(h, P)` whose `q(v) = N((I + P)⁻¹h, (I + P)⁻¹)` is
/// `q(u) = N(mean, cov)` under `u = Lv`.
fn sites_of_q_u(l: &DMatrix<f64>, mean: &DVector<f64>, cov: &DMatrix<f64>) -> Result<Sites> {
    let l_inv = l
        .clone()
        .try_inverse()
        .ok_or_else(|| ModelError::Config("K's factor is singular".into()))?;
    let cov_v = &l_inv * cov * l_inv.transpose();
    let (chol, _) = cholesky_jittered(&cov_v, 0.0, "S_v")?;
    let precision = chol.inverse();
    let mut lambda = &precision - DMatrix::identity(l.nrows(), l.nrows());
    lambda = (&lambda + lambda.transpose()) * 0.5;
    Ok(Sites {
        l: &precision * (&l_inv * mean),
        lambda,
    })
}

/// `q(v) = N((I + Λ)⁻¹l, (I + Λ)⁻¹)` of whitened sites.
fn gaussian_of_sites(sites: &Sites) -> Result<(DVector<f64>, DMatrix<f64>)> {
    let m = sites.l.len();
    let (d, _) = cholesky_jittered(&(DMatrix::identity(m, m) + &sites.lambda), 0.0, "I + P")?;
    Ok((d.solve(&sites.l), d.inverse()))
}

/// The damped natural-gradient E-step of a [`BlockProblem`], the block
/// being `post`'s rows from `from` on. The block is held as a dual
/// posterior of its own (only its sites' factors are used), its marginals
/// added to the frozen ones: its fixed point has the frozen offset taken out
/// of each site, `λ1_i = α̂_i + β̂_i (μ_i − g_i)`, `Λ = Σ β̂_i b_i b_iᵀ + Λ_t`.
/// Returns the block's whitened sites.
fn solve_block(
    post: &DualPosterior,
    from: usize,
    problem: &BlockProblem,
    data: &Data,
    config: &VarGpConfig,
) -> Result<(Vec<Sites>, BlockReport)> {
    let (n, n_latent, m_b) = (data.n(), post.n_latent(), post.m() - from);
    let points = problem.coords.ncols();
    let weight = 1.0 / problem.likelihoods.len() as f64;
    let block_cross = Cross {
        kzx: DMatrix::zeros(0, points),
        a: problem.coords.clone(),
        residual_var: DVector::zeros(points),
        profile: None,
    };
    let frozen = &problem.frozen;
    let mut block = DualPosterior::new(post.kernel.clone(), post.z.rows(from, m_b).into_owned(), n_latent)?;
    let with_fixed = |sites: &PointSites| -> Vec<Sites> {
        let mut totals = sites.totals(&problem.coords);
        for (total, fixed) in totals.iter_mut().zip(&problem.fixed) {
            total.add(fixed, 1.0);
        }
        totals
    };
    let mut sites = PointSites::zeros(points, n_latent);
    block.whitened = with_fixed(&sites);
    block.refresh_sites()?;
    let mut guard = Backtracking::new(config.e_step.rho);
    let mut e = Expectation::default();
    let mut report = BlockReport { bound: 0.0, steps: 0 };
    for _ in 0..config.e_step.steps {
        report.steps += 1;
        let step = guard.step();
        let marginals = joint_marginals(&block, &block_cross, frozen);
        let mut next = sites.clone();
        let mut expected = 0.0;
        marginals.for_each_point(|i, mean, var| {
            let likelihood = &problem.likelihoods[i / n];
            likelihood.expectation(mean, var, data.y()[i % n], &mut e);
            expected += weight * e.value;
            for c in 0..n_latent {
                let (s1_old, s2_old) = (sites.s1[(i, c)], sites.s2[(i, c)]);
                let previous = (s2_old > 0.0).then(|| s1_old / s2_old);
                let beta = site_precision(
                    likelihood,
                    e.beta[c],
                    e.d_mean[c],
                    mean[c],
                    var[c],
                    previous,
                    step.radius,
                );
                // The site is on the block's share of the mean, the frozen offset taken out.
                let lambda1 = e.d_mean[c] + beta * (mean[c] - frozen.mean[(i, c)]);
                next.s1[(i, c)] = (1.0 - step.rho) * s1_old + step.rho * weight * lambda1;
                next.s2[(i, c)] = (1.0 - step.rho) * s2_old + step.rho * weight * beta;
            }
        });
        report.bound = expected - block.kl() + expected_log_message(&block, &problem.fixed);
        if let Some((back_sites, back_whitened)) = guard.check(report.bound, (sites.clone(), block.whitened.clone())) {
            sites = back_sites;
            block.whitened = back_whitened;
            block.refresh_sites()?;
            continue;
        }
        let settled = relative_change(&sites, &next) < config.tolerance;
        sites = next;
        block.whitened = with_fixed(&sites);
        block.refresh_sites()?;
        if settled {
            break;
        }
    }
    Ok((block.whitened, report))
}

/// The marginals of `f` under `post` less the block's prior share `‖b_i‖²`
/// of the variance (the block at its prior on entry), which the block's own
/// `b_iᵀ S b_i` replaces.
fn frozen_marginals(mut frozen: Marginals, coords: &DMatrix<f64>) -> Marginals {
    for (i, b_i) in coords.column_iter().enumerate() {
        frozen.var.row_mut(i).add_scalar_mut(-b_i.norm_squared());
    }
    frozen
}

/// The marginals of `f` at the points: the block's own plus the frozen blocks'.
fn joint_marginals(block: &DualPosterior, cross: &Cross, frozen: &Marginals) -> Marginals {
    let own = block.marginals(cross);
    Marginals {
        mean: own.mean + &frozen.mean,
        var: own.var + &frozen.var,
    }
}

impl StreamingLearner for VarGpLearner {
    fn learn_batch(&mut self, batch: &Data) -> Result<Learned> {
        let started = Instant::now();
        let (report, inducing) = self.update(batch)?;
        Ok(Learned {
            batch: self.batches,
            n_seen: self.n_seen,
            seconds: started.elapsed().as_secs_f64(),
            details: vec![
                ("bound", report.bound),
                ("e_steps", report.steps as f64),
                ("inducing", inducing as f64),
            ],
        })
    }

    /// `samples` draws of `q(θ)` (their own, not the training draws) where
    /// it is learned: the seed's Monte Carlo predictive (Appendix A.1).
    fn theta_draws(&self) -> Result<Option<Vec<(DualPosterior, Likelihood)>>> {
        let (Some(q), VarGpTheta::Posterior(ThetaConfig { samples, seed, .. })) = (&self.theta, self.config.theta)
        else {
            return Ok(None);
        };
        let eps = standard_draws(q.mean.len(), samples, seed ^ SEED_MIX);
        q.draws_of(self.fitted()?, &self.likelihood, &eps).map(Some)
    }

    field_accessors!();
}

/// Spreads the user's seed over the draws' seeds: each task's, and the predictions' apart from them.
const SEED_MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// A task's bound and its gradients in the block's `q(v_t)`, per latent.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskBound {
    /// The bound.
    pub value: f64,
    /// `∂/∂mean` per latent.
    pub grad_mean: Vec<DVector<f64>>,
    /// `∂/∂cov` per latent.
    pub grad_cov: Vec<DMatrix<f64>>,
}

/// Task `t`'s bound `Σ_i E_q[log p(y_i|f_i)] − KL[q(v_t) ‖ N(0, I)]` (seed
/// Eq. 8 at fixed `θ`, whitened) at `q(v_t) = N(mean[c], cov[c])` per latent
/// for the block from row `from` of `post`, the earlier blocks as `post` holds
/// them (later rows ignored), with its gradients in `mean[c]` and `cov[c]`:
/// `Σ_i a_i ∂E_i/∂μ − m` and `Σ_i ∂E_i/∂v a_i a_iᵀ − ½I + ½S⁻¹`.
pub fn task_bound(
    post: &DualPosterior,
    from: usize,
    likelihood: &Likelihood,
    data: &Data,
    mean: &[DVector<f64>],
    cov: &[DMatrix<f64>],
) -> Result<TaskBound> {
    let m_t = post.m() - from;
    if mean.len() != post.n_latent() || cov.len() != post.n_latent() {
        return Err(ModelError::Dimension {
            what: "latents of q(v_t)".into(),
            expected: post.n_latent(),
            got: mean.len(),
        });
    }
    let mut frozen_post = post.clone();
    for s in &mut frozen_post.whitened {
        s.l.rows_mut(from, m_t).fill(0.0);
        s.lambda.view_mut((from, from), (m_t, m_t)).fill(0.0);
    }
    frozen_post.refresh_sites()?;
    let cross = frozen_post.cross(data.x());
    let a = cross.a.rows(from, m_t).into_owned();
    let frozen = frozen_marginals(frozen_post.marginals(&cross), &a);
    let (n, n_latent) = (data.n(), post.n_latent());
    let mut value = 0.0;
    let mut grad_mean: Vec<DVector<f64>> = mean.iter().map(|m| -m).collect();
    let mut grad_cov = Vec::with_capacity(n_latent);
    for (m, s) in mean.iter().zip(cov) {
        let (chol, _) = cholesky_jittered(s, 0.0, "S_t")?;
        let log_det = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
        value -= 0.5 * (s.trace() + m.norm_squared() - m_t as f64 - log_det);
        grad_cov.push((chol.inverse() - DMatrix::identity(m_t, m_t)) * 0.5);
    }
    let mut e = Expectation::default();
    let (mut mi, mut vi) = (vec![0.0; n_latent], vec![0.0; n_latent]);
    for i in 0..n {
        let ai = a.column(i);
        for c in 0..n_latent {
            mi[c] = frozen.mean[(i, c)] + ai.dot(&mean[c]);
            vi[c] = frozen.var[(i, c)] + (&cov[c] * ai).dot(&ai);
        }
        likelihood.expectation(&mi, &vi, data.y()[i], &mut e);
        value += e.value;
        for c in 0..n_latent {
            grad_mean[c].axpy(e.d_mean[c], &ai, 1.0);
            grad_cov[c].ger(e.d_var[c], &ai, &ai, 1.0);
        }
    }
    Ok(TaskBound {
        value,
        grad_mean,
        grad_cov,
    })
}
