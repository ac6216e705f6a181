//! The M-step objective with the site totals `(l, Λ)` held fixed:
//!
//! `F(θ) = Σ_i c_i E_q[log p(y_i|f_i)] − KL[q_θ(u) ‖ p_θ(u)]`
//!
//! where `q_θ` is the posterior the fixed sites give under `K_θ` (the dual,
//! "tighter" bound of t-SVGP), and its analytic gradient with respect to every
//! hyperparameter: the kernel's log-parameters, then the likelihood's.

use nalgebra::{DMatrix, DVector};

use super::data::Data;
use super::error::{ModelError, Result};
use super::kernel::Kernel;
use super::likelihood::{Expectation, Likelihood};
use super::linalg::transposed;
use super::posterior::DualPosterior;

/// `F(θ)` and `∂F/∂ log θ`.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    pub value: f64,
    pub grad: DVector<f64>,
    /// `∂F/∂Z`, `m × d`, for moving the inducing inputs with the sites held.
    pub grad_z: DMatrix<f64>,
}

/// The hyperparameter vector: kernel log-parameters, then the likelihood's.
pub fn hyperparameters(kernel: &Kernel, likelihood: &Likelihood) -> DVector<f64> {
    let mut p = kernel.log_params();
    p.extend(likelihood.log_params());
    DVector::from_vec(p)
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
    let weight = |i: usize| weights.map_or(1.0, |w| w[i]);
    let (n, m, n_latent) = (data.n(), post.m(), post.n_latent());
    let factors = post.factors();
    let cross = post.cross(data.x());
    let marginals = post.marginals(&cross);

    // Data term and its derivatives in each point's (μ, v).
    let mut value = 0.0;
    let mut d_mean = DMatrix::zeros(n, n_latent);
    let mut d_var = DMatrix::zeros(n, n_latent);
    let mut lik_grad = DVector::zeros(likelihood.n_params());
    let mut e = Expectation::default();
    marginals.for_each_point(|i, mean, var| {
        likelihood.expectation(mean, var, data.y()[i], &mut e);
        let ci = weight(i);
        value += ci * e.value;
        for c in 0..n_latent {
            d_mean[(i, c)] = ci * e.d_mean[c];
            d_var[(i, c)] = ci * e.d_var[c];
        }
        for (g, dp) in lik_grad.iter_mut().zip(&e.d_params) {
            *g += ci * dp;
        }
    });
    value -= post.kl();

    // Chain rule into K = K(Z,Z) + εI, K(Z,X) and k(x_i, x_i).
    let k = post.k_zz();
    let k_inv = factors.chol_k.inverse();
    let mut g_k = DMatrix::zeros(m, m);
    let mut g_kzx = DMatrix::zeros(m, n);
    let mut g_diag = DVector::zeros(n);
    for c in 0..n_latent {
        let w = &factors.w[c];
        let r_inv = factors.chol_r[c].inverse();
        let a = d_mean.column(c);
        let b = d_var.column(c);
        g_diag += b;

        // μ_i = k_iᵀ w with w = R⁻¹ l:  ∂/∂K_zx = w aᵀ,  ∂/∂K = −(R⁻¹ K_zx a) wᵀ.
        g_kzx.ger(1.0, w, &a, 1.0);
        let r_inv_kzx_a = &r_inv * (&cross.kzx * a);
        g_k.ger(-1.0, &r_inv_kzx_a, w, 1.0);

        // v_i = k_ii − k_iᵀK⁻¹k_i + k_iᵀR⁻¹k_i:
        //   ∂/∂K_zx = 2 (R⁻¹ − K⁻¹) K_zx diag(b),  ∂/∂K = K⁻¹ M K⁻¹ − R⁻¹ M R⁻¹,  M = K_zx diag(b) K_xz.
        let mut kzx_b = cross.kzx.clone();
        for (mut col, &bj) in kzx_b.column_iter_mut().zip(b.iter()) {
            col *= bj;
        }
        g_kzx.gemm(2.0, &(&r_inv - &k_inv), &kzx_b, 1.0);
        let gram_b = &kzx_b * transposed(&cross.kzx);
        g_k += &k_inv * &gram_b * &k_inv - &r_inv * &gram_b * &r_inv;

        // −KL: −∂/∂K of ½[tr(R⁻¹K) + wᵀKw + log|R| − log|K|] with R = K + Λ.
        let r_inv_k = &r_inv * &k;
        g_k +=
            -&r_inv + 0.5 * &r_inv_k * &r_inv - 0.5 * w * w.transpose() + (&r_inv_k * w) * w.transpose() + 0.5 * &k_inv;
    }

    let kernel = &post.kernel;
    let mut kernel_grad = kernel.matrix_grad(&post.z, &post.z, &g_k);
    kernel_grad += kernel.matrix_grad(&post.z, data.x(), &g_kzx);
    kernel_grad += kernel.diag_grad(data.x(), &g_diag);

    let grad_z = kernel.input_grad(&post.z, &post.z, &g_k)
        + kernel.input_grad(&post.z, &post.z, &g_k.transpose())
        + kernel.input_grad(&post.z, data.x(), &g_kzx);

    let mut grad = DVector::zeros(kernel.n_params() + likelihood.n_params());
    grad.rows_mut(0, kernel.n_params()).copy_from(&kernel_grad);
    grad.rows_mut(kernel.n_params(), likelihood.n_params())
        .copy_from(&lik_grad);
    Ok(Objective { value, grad, grad_z })
}
