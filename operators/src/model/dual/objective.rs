//! The M-step objective with the site totals `(l, Λ)` held fixed:
//!
//! `F(θ) = Σ_i c_i E_q[log p(y_i|f_i)] − KL[q_θ(u) ‖ p_θ(u)]`
//!
//! where `q_θ` is the posterior the fixed sites give under `K_θ` (the dual,
//! "tighter" bound of t-SVGP), and its analytic gradient with respect to every
//! hyperparameter: the kernel's log-parameters, then the likelihood's.

use std::borrow::Cow;

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::model::data::Data;
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::{Expectation, Likelihood};
use crate::model::math::kernel::{Kernel, Rows};
use crate::model::math::linalg::{gram_of_scaled, solve_lower_transposed_matrix_in_place};
use crate::model::posterior::{Cross, DualPosterior, Sites};

/// `F(θ)` and `∂F/∂ log θ`.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    /// `F(θ)`.
    pub value: f64,
    /// `∂F/∂ log θ`: the kernel's log-parameters, then the likelihood's.
    pub grad: DVector<f64>,
    /// `∂F/∂Z`, `m × d`, for moving the inducing inputs with the sites held;
    /// `None` where it was not asked for.
    pub grad_z: Option<DMatrix<f64>>,
}

/// The hyperparameter vector: kernel log-parameters, then the likelihood's.
pub fn hyperparameters(kernel: &Kernel, likelihood: &Likelihood) -> DVector<f64> {
    let mut p = kernel.log_params();
    p.extend(likelihood.log_params());
    DVector::from_vec(p)
}

/// An M-step's point when it moves the inducing inputs too: `θ` as
/// [`hyperparameters`] gives it, then `Z` column by column.
pub fn with_inducing_inputs(theta: DVector<f64>, z: &DMatrix<f64>) -> DVector<f64> {
    DVector::from_iterator(theta.len() + z.len(), theta.iter().chain(z.iter()).copied())
}

impl Objective {
    /// The gradient in the layout of [`with_inducing_inputs`] where `∂F/∂Z`
    /// was asked for, else in `θ` alone.
    pub fn stacked_grad(self) -> DVector<f64> {
        match self.grad_z {
            Some(grad_z) => with_inducing_inputs(self.grad, &grad_z),
            None => self.grad,
        }
    }
}

/// Kernel then likelihood hyperparameters by name, on their natural scale.
pub fn named_hyperparameters(kernel: &Kernel, likelihood: &Likelihood) -> Vec<(String, f64)> {
    let mut named = kernel.named_params();
    named.extend(likelihood.named_params());
    named
}

/// Sets the hyperparameters from the vector [`hyperparameters`] returns.
pub fn set_hyperparameters(kernel: &mut Kernel, likelihood: &mut Likelihood, p: &DVector<f64>) {
    let nk = kernel.n_params();
    kernel.set_log_params(&p.as_slice()[..nk]);
    likelihood.set_log_params(&p.as_slice()[nk..]);
}

/// `F(θ)` at the posterior's current kernel, `Z` and sites, with point weights
/// `c_i` (`None`: all 1).
pub fn m_step_objective(
    post: &DualPosterior,
    likelihood: &Likelihood,
    data: &Data,
    weights: Option<&[f64]>,
) -> Result<Objective> {
    data.check(post.d(), likelihood)?;
    if let Some(w) = weights {
        if w.len() != data.n() {
            return Err(ModelError::Dimension {
                what: "point weights".into(),
                expected: data.n(),
                got: w.len(),
            });
        }
    }
    let terms = DataTerms::new(
        post,
        likelihood,
        data,
        &post.cross_with_profile(data.x()),
        weights,
        true,
        None,
    );
    Ok(terms.finish(post, likelihood, None))
}

/// `E_q[log t(u)]` (up to a constant) of a message `t(u) = exp(η₁ᵀu − ½uᵀη₂u)`
/// whose sites under the posterior's `K` are `whitened` (`h = L⁻¹Kη₁`,
/// `P = L⁻¹Kη₂KL⁻ᵀ`): with `q(v) = N(m_v, D⁻¹)` in `v = L⁻¹u`,
/// `hᵀm_v − ½m_vᵀPm_v − ½tr(PD⁻¹)`.
pub(crate) fn expected_log_message(post: &DualPosterior, whitened: &[Sites]) -> f64 {
    let factors = post.factors();
    whitened
        .iter()
        .enumerate()
        .map(|(c, t)| {
            let m_v = &factors.m_v[c];
            let half = factors.d_inv_half(c);
            // tr(PD⁻¹) = tr(L_D⁻¹ P L_D⁻ᵀ)
            let trace = (half * &t.lambda).component_mul(half).sum();
            t.l.dot(m_v) - 0.5 * m_v.dot(&(&t.lambda * m_v)) - 0.5 * trace
        })
        .sum()
}

/// The part of `F(θ)` and its gradient that sums over points: what one worker
/// computes over its records. Partial terms add up; [`DataTerms::finish`]
/// adds the KL term and the chain rule through `K(Z, Z)` once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataTerms {
    /// `Σ c_i E_q[log p(y_i|f_i)]`.
    pub value: f64,
    /// Through `K(Z, X)` and `k(x_i, x_i)`, in the kernel's log-parameters.
    pub kernel_grad: DVector<f64>,
    /// In the likelihood's log-parameters.
    pub likelihood_grad: DVector<f64>,
    /// Through `K(Z, X)`, `m × d`: an `m·n·d` product, computed only where
    /// asked for (learners that place `Z` otherwise skip it).
    pub grad_z: Option<DMatrix<f64>>,
    /// Per latent `Σ_i k_i ∂/∂μ_i`, `m`.
    pub kzx_d_mean: Vec<DVector<f64>>,
    /// Per latent `Σ_i ∂/∂v_i a_i a_iᵀ`, `m × m`, in whitened columns
    /// `a_i = L⁻¹k_i` (`L` times it times `Lᵀ` is the sum in `K`'s coordinates).
    pub whitened_gram_d_var: Vec<DMatrix<f64>>,
    /// Latent 0's `Σ_i ∂/∂v_i k_i k_iᵀ` in `K`'s coordinates, from a
    /// Gaussian refit's sums, for points whose terms were made without
    /// their whitened columns: [`finish`](Self::finish) whitens it into the
    /// gram above and takes from its trace the `‖a_i‖²` those points'
    /// variances left out (they took the prior's `k(x_i, x_i)` whole).
    pub kernel_gram_d_var: Option<DMatrix<f64>>,
    /// A Gaussian likelihood's terms leave out what its points' variances
    /// add beyond the prior's residual, `Σ_i ∂/∂v_i ‖L_D⁻¹a_i‖²`: that is
    /// `tr(D⁻¹ G)` of the gram above, which [`finish`](Self::finish) adds to
    /// the value (and its negative to `∂/∂ log σ²`), saving every point a
    /// product with `L_D⁻¹`.
    pub variance_from_gram: bool,
}

impl DataTerms {
    /// Nothing summed yet.
    pub fn zeros(post: &DualPosterior, likelihood: &Likelihood) -> Self {
        let (m, d, n_latent) = (post.m(), post.d(), post.n_latent());
        DataTerms {
            value: 0.0,
            kernel_grad: DVector::zeros(post.kernel.n_params()),
            likelihood_grad: DVector::zeros(likelihood.n_params()),
            grad_z: Some(DMatrix::zeros(m, d)),
            kzx_d_mean: vec![DVector::zeros(m); n_latent],
            whitened_gram_d_var: vec![DMatrix::zeros(m, m); n_latent],
            kernel_gram_d_var: None,
            variance_from_gram: false,
        }
    }

    /// The terms of the points of `data` (already checked), whose kernel
    /// quantities under the posterior's current `θ` and `Z` are `cross`;
    /// `∂F/∂Z` only `with_z` (learners that place `Z` otherwise skip it).
    /// `site_gram`, where known, is the points' `Σ_i s_i k_i k_iᵀ` in `K`'s
    /// coordinates with Gaussian sites `s_i = c_i · (1/σ²)` exactly (their
    /// weights over the noise): a Gaussian likelihood's `Σ_i ∂/∂v_i k_i k_iᵀ`
    /// is then `−½` of it, and the points' terms need no whitened columns
    /// (`cross` may lack them).
    pub fn new(
        post: &DualPosterior,
        likelihood: &Likelihood,
        data: &Data,
        cross: &Cross,
        weights: Option<&[f64]>,
        with_z: bool,
        site_gram: Option<&DMatrix<f64>>,
    ) -> Self {
        let weight = |i: usize| weights.map_or(1.0, |w| w[i]);
        let (n, n_latent) = (data.n(), post.n_latent());
        let factors = post.factors();
        let mut terms = DataTerms::zeros(post, likelihood);

        // Data term and its derivatives in each point's (μ, v).
        let mut d_mean = DMatrix::zeros(n, n_latent);
        let mut d_var = DMatrix::zeros(n, n_latent);
        if let Likelihood::Gaussian { variance } = *likelihood {
            // E = −½log 2πσ² − ((y − μ)² + v)/2σ², v = r + ‖L_D⁻¹a‖² (the
            // last part from the gram, in `finish`), r = k(x, x) − ‖a‖² (with
            // `site_gram`, the last part from its trace, in `finish`).
            terms.kernel_gram_d_var = site_gram.map(|gram| -0.5 * gram);
            let (mean, prior_var) = match site_gram {
                Some(_) => (cross.kzx.tr_mul(&factors.w[0]), Cow::Owned(post.kernel.diag(data.x()))),
                None => (cross.a.tr_mul(&factors.m_v[0]), Cow::Borrowed(&cross.residual_var)),
            };
            for i in 0..n {
                let (ci, residual) = (weight(i), data.y()[i] - mean[i]);
                let spread = residual * residual + prior_var[i];
                terms.value += ci * (-0.5 * (std::f64::consts::TAU * variance).ln() - spread / (2.0 * variance));
                terms.likelihood_grad[0] += ci * (-0.5 + spread / (2.0 * variance));
                d_mean[(i, 0)] = ci * residual / variance;
                // As `−½ s_i` of a site `c_i · (1/σ²)`: see `site_gram`.
                d_var[(i, 0)] = -0.5 * (ci * (1.0 / variance));
            }
            terms.variance_from_gram = true;
        } else {
            let mut e = Expectation::default();
            post.marginals(cross).for_each_point(|i, mean, var| {
                likelihood.expectation_of(data.output(i), mean, var, data.y()[i], &mut e);
                let ci = weight(i);
                terms.value += ci * e.value;
                for c in 0..n_latent {
                    d_mean[(i, c)] = ci * e.d_mean[c];
                    d_var[(i, c)] = ci * e.d_var[c];
                }
                for (g, dp) in terms.likelihood_grad.iter_mut().zip(&e.d_params) {
                    *g += ci * dp;
                }
            });
        }

        // Chain rule into K(Z,X) and k(x_i, x_i); what goes through K(Z, Z)
        // needs only the sums kept in `kzx_d_mean` and `whitened_gram_d_var`.
        let mut g_kzx = DMatrix::zeros(post.m(), n);
        let mut g_diag = DVector::zeros(n);
        // Each latent's `2 (R⁻¹ − K⁻¹) K_zx diag(b)`, made in place of a copy of K_zx.
        let mut product = DMatrix::zeros(if n_latent > 1 { post.m() } else { 0 }, n);
        for c in 0..n_latent {
            let a = d_mean.column(c);
            let b = d_var.column(c);
            g_diag += b;
            terms.kzx_d_mean[c] = &cross.kzx * a;
            // v_i = k_ii − k_iᵀK⁻¹k_i + k_iᵀR⁻¹k_i:  ∂/∂K_zx = 2 (R⁻¹ − K⁻¹) K_zx diag(b).
            let part = if c == 0 { &mut g_kzx } else { &mut product };
            part.gemm(2.0, factors.r_inv_minus_k_inv(c), &cross.kzx, 0.0);
            for (mut col, &bj) in part.column_iter_mut().zip(b.iter()) {
                col *= bj;
            }
            if c > 0 {
                g_kzx += &product;
            }
            // μ_i = k_iᵀ w:  ∂/∂K_zx = w aᵀ.
            g_kzx.ger(1.0, &factors.w[c], &a, 1.0);
            if terms.kernel_gram_d_var.is_none() {
                let mut a_b = cross.a.clone();
                for (mut col, &bj) in a_b.column_iter_mut().zip(b.iter()) {
                    col *= bj;
                }
                terms.whitened_gram_d_var[c] = gram_of_scaled(&a_b, &cross.a);
            }
        }
        let kernel = &post.kernel;
        let rows = if with_z { Rows::OfA } else { Rows::Neither };
        let (kernel_grad, grad_z) = kernel.grads_from(&post.z, data.x(), &g_kzx, rows, cross.profile.as_ref());
        terms.kernel_grad = kernel_grad + kernel.diag_grad(data.x(), &g_diag);
        terms.grad_z = grad_z;
        terms
    }

    /// Weighs every point `w` times as much.
    pub fn scale(&mut self, w: f64) {
        self.value *= w;
        self.kernel_grad *= w;
        self.likelihood_grad *= w;
        if let Some(g) = self.grad_z.as_mut() {
            *g *= w;
        }
        for a in &mut self.kzx_d_mean {
            *a *= w;
        }
        for a in self.whitened_gram_d_var.iter_mut().chain(&mut self.kernel_gram_d_var) {
            *a *= w;
        }
    }

    /// Adds another share of points.
    pub fn add(&mut self, other: &DataTerms) {
        self.value += other.value;
        self.kernel_grad += &other.kernel_grad;
        self.likelihood_grad += &other.likelihood_grad;
        self.grad_z = match (self.grad_z.take(), &other.grad_z) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        for (a, b) in self.kzx_d_mean.iter_mut().zip(&other.kzx_d_mean) {
            *a += b;
        }
        for (a, b) in self.whitened_gram_d_var.iter_mut().zip(&other.whitened_gram_d_var) {
            *a += b;
        }
        self.kernel_gram_d_var = match (self.kernel_gram_d_var.take(), &other.kernel_gram_d_var) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or_else(|| b.clone()),
        };
        self.variance_from_gram |= other.variance_from_gram;
    }

    /// `F(θ)` and its gradient: the summed data terms, minus the KL term, with
    /// the chain rule through `K = K(Z, Z) + εI`.
    ///
    /// Without `past`, every site is held as `θ` moves (t-SVGP's dual M-step
    /// bound). With `past`, the part of the (whitened) totals that is past
    /// data's message `t(u)` (see [`PastMessage`](crate::model::dual::past::PastMessage)), `q(u)` is held
    /// instead and `F` gains `E_q[log t(u)]`: at the `q` that is optimal for `F`
    /// (the sites re-learned and `t` held in u-space), this is the gradient of
    /// the collapsed bound.
    pub fn finish(mut self, post: &DualPosterior, likelihood: &Likelihood, past: Option<&[Sites]>) -> Objective {
        let m = post.m();
        let factors = post.factors();
        if let Some(gram) = self.kernel_gram_d_var.take() {
            let whitened = post.whitened_gram(gram);
            // Σ c_i ‖a_i‖²/2σ² = −tr(G): what those points' `k(x_i, x_i)` held too much.
            let explained = -whitened.trace();
            self.value += explained;
            self.likelihood_grad[0] -= explained;
            self.whitened_gram_d_var[0] += whitened;
        }
        if self.variance_from_gram {
            // tr(D⁻¹G), both symmetric.
            let extra = factors.d_inv(0).dot(&self.whitened_gram_d_var[0]);
            self.value += extra;
            self.likelihood_grad[0] -= extra;
        }
        let l = factors.chol_k.l();
        // `L⁻ᵀML⁻¹`: how `K⁻¹` (`R⁻¹ = L⁻ᵀD⁻¹L⁻¹`) enters, with `M` in whitened coordinates.
        let unwhitened = |mut m: DMatrix<f64>| {
            solve_lower_transposed_matrix_in_place(&l, &mut m);
            m.transpose_mut();
            solve_lower_transposed_matrix_in_place(&l, &mut m);
            m
        };
        // Only the bound with every site held needs K itself.
        let k = past.is_none().then(|| post.k_zz());
        let k_inv = factors.k_inv();
        let mut g_k = DMatrix::zeros(m, m);
        for c in 0..post.n_latent() {
            let w = &factors.w[c];
            let r_inv = factors.r_inv(c);
            let gram = &self.whitened_gram_d_var[c];
            let d_inv = factors.d_inv(c);
            let d_inv_gram = d_inv * gram;
            if past.is_some() {
                // With q(u) = N(Kw, KR⁻¹K) held, μ_i = k_iᵀK⁻¹(Kw):  ∂/∂K = −(K⁻¹ K_zx a) wᵀ.
                g_k.ger(-1.0, &(k_inv * &self.kzx_d_mean[c]), w, 1.0);
                // v_i = k_ii − k_iᵀK⁻¹k_i + k_iᵀR⁻¹k_i, with R⁻¹ = K⁻¹SK⁻¹ and S held:
                // ∂/∂K = K⁻¹MK⁻¹ − K⁻¹MR⁻¹ − R⁻¹MK⁻¹ for M = K_zx diag(b) K_xz = L G Lᵀ.
                g_k += unwhitened(gram - &d_inv_gram - d_inv_gram.transpose());
                // −KL[N(μ, S) ‖ N(0, K)]:  ∂/∂K = ½ (K⁻¹SK⁻¹ + K⁻¹μμᵀK⁻¹ − K⁻¹).
                g_k += 0.5 * (r_inv + w * w.transpose() - k_inv);
                continue;
            }
            // μ:  ∂/∂K = −(R⁻¹ K_zx a) wᵀ.
            g_k.ger(-1.0, &(r_inv * &self.kzx_d_mean[c]), w, 1.0);
            // v:  ∂/∂K = K⁻¹ M K⁻¹ − R⁻¹ M R⁻¹ with M = K_zx diag(b) K_xz = L G Lᵀ.
            g_k += unwhitened(gram - &d_inv_gram * d_inv);
            // −KL: −∂/∂K of ½[tr(R⁻¹K) + wᵀKw + log|R| − log|K|] with R = K + Λ.
            let r_inv_k = r_inv * k.as_ref().expect("computed without a message");
            g_k += -r_inv + 0.5 * &r_inv_k * r_inv - 0.5 * w * w.transpose()
                + (&r_inv_k * w) * w.transpose()
                + 0.5 * k_inv;
        }
        // K(Z, Z) is symmetric: θ sees half of G + Gᵀ, and Z, both its inputs, all of it.
        let rows = if self.grad_z.is_some() {
            Rows::OfA
        } else {
            Rows::Neither
        };
        let kernel = &post.kernel;
        let (theta_k, input_k) = kernel.grads(&post.z, &post.z, &(&g_k + g_k.transpose()), rows);
        let kernel_grad = self.kernel_grad + 0.5 * theta_k + post.jitter_grad() * g_k.trace();
        let grad_z = self.grad_z.zip(input_k).map(|(g, input)| g + input);
        let mut grad = DVector::zeros(kernel.n_params() + likelihood.n_params());
        grad.rows_mut(0, kernel.n_params()).copy_from(&kernel_grad);
        grad.rows_mut(kernel.n_params(), likelihood.n_params())
            .copy_from(&self.likelihood_grad);
        Objective {
            value: self.value - post.kl() + past.map_or(0.0, |p| expected_log_message(post, p)),
            grad,
            grad_z,
        }
    }
}
