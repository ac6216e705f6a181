//! VAR-GP's posterior over the hyperparameters (seed 004, Eq. 8 and
//! Appendix A.1): `q_t(θ)` log-normal, the previous task's posterior its
//! prior with the KL tempered by `β`, learned by reparameterised Monte Carlo
//! with every task's whitened `q(v)` held, and predictions that average the
//! predictive over draws of `θ`.
//!
//! `q(θ)` is a diagonal Gaussian over the M-step's coordinates (the log of
//! every positive hyperparameter, so log-normal in `θ` itself). Holding the
//! whitened sites as `θ` moves keeps the posterior auto-regressive for every
//! `θ`: with `L_θ` block lower triangular, tasks in order, block `t` of
//! `u = L_θ v` is `A_t u_<t + L_C v_t`, so the seed's innovations are
//! `L_C (m_v, S_v) L_Cᵀ` under each draw, and each block's KL is the
//! whitened one, free of `θ`.

use std::ops::Range;

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::model::baselines::var_gp::BlockDiagonal;
use crate::model::data::Data;
use crate::model::dual::objective::{hyperparameters, set_hyperparameters};
use crate::model::error::Result;
use crate::model::likelihood::{Expectation, Likelihood};
use crate::model::math::linalg::solve_lower_transposed_in_place;
use crate::model::math::optim::lbfgs_maximize;
use crate::model::posterior::DualPosterior;

/// `q(θ) = N(mean, diag(sd²))` over the log-hyperparameters, in the order
/// of [`hyperparameters`]: kernel, then likelihood.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThetaPosterior {
    /// The means of the log-hyperparameters.
    pub mean: DVector<f64>,
    /// Their standard deviations.
    pub sd: DVector<f64>,
}

impl ThetaPosterior {
    /// Centred on the hyperparameters of `post` and `likelihood`, every
    /// coordinate with standard deviation `sd`.
    pub fn around(post: &DualPosterior, likelihood: &Likelihood, sd: f64) -> Self {
        let mean = hyperparameters(&post.kernel, likelihood);
        let sd = DVector::from_element(mean.len(), sd);
        ThetaPosterior { mean, sd }
    }

    /// `KL[self ‖ prior]`.
    pub fn kl(&self, prior: &ThetaPosterior) -> f64 {
        self.mean
            .iter()
            .zip(&self.sd)
            .zip(prior.mean.iter().zip(&prior.sd))
            .map(|((&m, &s), (&m0, &s0))| (s0 / s).ln() + (s * s + (m - m0).powi(2)) / (2.0 * s0 * s0) - 0.5)
            .sum()
    }

    /// The draw `mean + sd ⊙ ε`.
    pub fn draw(&self, eps: &DVector<f64>) -> DVector<f64> {
        &self.mean + self.sd.component_mul(eps)
    }

    /// `(mean, log sd)` stacked: the coordinates the θ step climbs in.
    pub fn stacked(&self) -> DVector<f64> {
        let log_sd = self.sd.map(f64::ln);
        DVector::from_iterator(2 * self.mean.len(), self.mean.iter().chain(log_sd.iter()).copied())
    }

    /// The inverse of [`stacked`](Self::stacked).
    pub fn unstacked(x: &DVector<f64>) -> Self {
        let p = x.len() / 2;
        ThetaPosterior {
            mean: x.rows(0, p).into_owned(),
            sd: x.rows(p, p).map(f64::exp),
        }
    }

    /// `post` and `likelihood` under each draw `mean + sd ⊙ ε_s`, the
    /// whitened sites held.
    pub fn draws_of(
        &self,
        post: &DualPosterior,
        likelihood: &Likelihood,
        eps: &[DVector<f64>],
    ) -> Result<Vec<(DualPosterior, Likelihood)>> {
        eps.iter().map(|e| under(post, likelihood, &self.draw(e))).collect()
    }
}

/// `samples` standard normal vectors of length `dim` from `seed`, in
/// antithetic pairs (`ε`, `−ε`): fixed draws make the Monte Carlo objective
/// a deterministic function, which L-BFGS needs, and the pairs cancel its
/// first-order noise.
pub fn standard_draws(dim: usize, samples: usize, seed: u64) -> Vec<DVector<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut draws: Vec<DVector<f64>> = Vec::with_capacity(samples);
    for k in 0..samples {
        let draw = match k % 2 {
            0 => DVector::from_fn(dim, |_, _| StandardNormal.sample(&mut rng)),
            _ => -&draws[k - 1],
        };
        draws.push(draw);
    }
    draws
}

/// `post` and `likelihood` with hyperparameters `theta`, the whitened sites
/// held (the jitter follows the kernel's variance, as every M-step's does).
pub fn under(
    post: &DualPosterior,
    likelihood: &Likelihood,
    theta: &DVector<f64>,
) -> Result<(DualPosterior, Likelihood)> {
    let (mut post, mut likelihood) = (post.clone(), likelihood.clone());
    post.change_kernel_holding_whitened(|kernel| set_hyperparameters(kernel, &mut likelihood, theta))?;
    Ok((post, likelihood))
}

/// `Σ_i E_q[log p(y_i|f_i)]` under `post` with its whitened `q(v) = N(m_v, S)`
/// held, and its gradient in the log-hyperparameters; `S` is block diagonal
/// over `blocks` (one block: dense).
///
/// With `A = L⁻¹K(Z, X)`, `μ_i = a_iᵀm_v` and `v_i = k_ii − a_iᵀ(I − S)a_i`,
/// so `Ā = Σ_c m_v ḡ_μᵀ + 2(S − I)A diag(ḡ_v)`; then `K̄_zx = L⁻ᵀĀ` and
/// `L̄ = −L⁻ᵀĀAᵀ`, taken back through the Cholesky factor to `K(Z, Z)`.
pub fn held_whitened_data_term(
    post: &DualPosterior,
    blocks: &[Range<usize>],
    likelihood: &Likelihood,
    data: &Data,
) -> Result<(f64, DVector<f64>)> {
    let (n, n_latent, m) = (data.n(), post.n_latent(), post.m());
    let diagonal = BlockDiagonal::of(post, blocks)?;
    let cross = post.cross(data.x());
    let mut d_mean = DMatrix::zeros(n, n_latent);
    let mut d_var = DMatrix::zeros(n, n_latent);
    let mut value = 0.0;
    let mut likelihood_grad = DVector::zeros(likelihood.n_params());
    let mut e = Expectation::default();
    diagonal.marginals(post, &cross).for_each_point(|i, mean, var| {
        likelihood.expectation_of(data.output(i), mean, var, data.y()[i], &mut e);
        value += e.value;
        for c in 0..n_latent {
            d_mean[(i, c)] = e.d_mean[c];
            d_var[(i, c)] = e.d_var[c];
        }
        for (g, dp) in likelihood_grad.iter_mut().zip(&e.d_params) {
            *g += dp;
        }
    });
    let factors = post.factors();
    let mut a_bar = DMatrix::zeros(m, n);
    for c in 0..n_latent {
        a_bar.ger(1.0, &factors.m_v[c], &d_mean.column(c), 1.0);
        let mut scaled = cross.a.clone();
        for (mut col, &g) in scaled.column_iter_mut().zip(d_var.column(c).iter()) {
            col *= g;
        }
        a_bar += 2.0 * (diagonal.times_cov(c, &scaled) - scaled);
    }
    let chol_k = &factors.chol_k;
    // LᵀL̄ = −ĀAᵀ: an m²n product where L̄ itself would cost m³.
    let k_bar = cholesky_backward(chol_k, &-(&a_bar * cross.a.transpose()));
    let mut kzx_bar = a_bar;
    solve_lower_transposed_in_place(chol_k, &mut kzx_bar);
    let kernel = &post.kernel;
    let g_diag = DVector::from_fn(n, |i, _| d_var.row(i).sum());
    let kernel_grad = kernel.matrix_grad(&post.z, data.x(), &kzx_bar)
        + kernel.diag_grad(data.x(), &g_diag)
        + kernel.matrix_grad(&post.z, &post.z, &k_bar)
        + post.jitter_grad() * k_bar.trace();
    let grad = DVector::from_iterator(
        kernel_grad.len() + likelihood_grad.len(),
        kernel_grad.iter().chain(likelihood_grad.iter()).copied(),
    );
    Ok((value, grad))
}

/// `∂F/∂K` for `K = LLᵀ` from `LᵀL̄`, `L̄ = ∂F/∂L`: `L⁻ᵀ Φ(LᵀL̄) L⁻¹`
/// symmetrised, `Φ` the lower triangle with the diagonal halved. From
/// `dL = L Φ(L⁻¹ dK L⁻ᵀ)`, which is lower triangular: `L̄`'s upper triangle
/// meets its zeros, so `L̄` need not be cut to its lower triangle first.
fn cholesky_backward(chol: &Cholesky<f64, Dyn>, lt_l_bar: &DMatrix<f64>) -> DMatrix<f64> {
    let mut p = lt_l_bar.lower_triangle();
    for i in 0..p.nrows() {
        p[(i, i)] *= 0.5;
    }
    // L⁻ᵀ P L⁻¹ = L⁻ᵀ (L⁻ᵀ Pᵀ)ᵀ.
    let mut x = p.transpose();
    solve_lower_transposed_in_place(chol, &mut x);
    let mut g = x.transpose();
    solve_lower_transposed_in_place(chol, &mut g);
    (&g + g.transpose()) * 0.5
}

/// The θ step of a task: `q(θ)` maximising
/// `(1/S) Σ_s D(mean + sd ⊙ ε_s) − β KL[q(θ) ‖ prior]` over `(mean, log sd)`,
/// `D` the task's data term with every block's whitened `q(v)` held (the
/// blocks' KLs do not depend on `θ` there).
pub struct ThetaStep<'a> {
    /// The posterior, every block's `q(v)` held.
    pub post: &'a DualPosterior,
    /// The tasks' blocks, over which the whitened precisions are block diagonal.
    pub blocks: &'a [Range<usize>],
    /// The likelihood (its parameters the last ones of `θ`).
    pub likelihood: &'a Likelihood,
    /// The task's records.
    pub data: &'a Data,
    /// The prior `q_{t−1}(θ)`.
    pub prior: &'a ThetaPosterior,
    /// The standard normal draws `ε_s`, fixed for the task.
    pub eps: &'a [DVector<f64>],
    /// The KL term's weight.
    pub beta: f64,
}

impl ThetaStep<'_> {
    /// The objective and its gradient in `(mean, log sd)` at `q`.
    pub fn objective(&self, q: &ThetaPosterior) -> Result<(f64, DVector<f64>)> {
        let p = q.mean.len();
        let weight = 1.0 / self.eps.len() as f64;
        let mut value = -self.beta * q.kl(self.prior);
        let mut grad = DVector::zeros(2 * p);
        for (eps, (post, likelihood)) in self.eps.iter().zip(q.draws_of(self.post, self.likelihood, self.eps)?) {
            let (d, g) = held_whitened_data_term(&post, self.blocks, &likelihood, self.data)?;
            value += weight * d;
            for j in 0..p {
                grad[j] += weight * g[j];
                grad[p + j] += weight * g[j] * eps[j] * q.sd[j];
            }
        }
        for j in 0..p {
            let (s, s0) = (q.sd[j], self.prior.sd[j]);
            grad[j] -= self.beta * (q.mean[j] - self.prior.mean[j]) / (s0 * s0);
            grad[p + j] -= self.beta * (s * s / (s0 * s0) - 1.0);
        }
        Ok((value, grad))
    }

    /// `iterations` of L-BFGS from `start`: the new `q(θ)` and its objective.
    pub fn climb(&self, start: &ThetaPosterior, iterations: usize) -> Result<(ThetaPosterior, f64)> {
        let (x, value) = lbfgs_maximize(
            |x| self.objective(&ThetaPosterior::unstacked(x)),
            start.stacked(),
            iterations,
            10,
        )?;
        Ok((ThetaPosterior::unstacked(&x), value))
    }
}
