//! The dual-parameter sparse posterior: inducing inputs `Z`, a kernel, and per
//! latent the natural sites `l = Σ k_i λ1_i`, `Λ = Σ β̂_i k_i k_iᵀ`.
//!
//! `R = K + Λ`, `μ(x) = kᵀR⁻¹l`, `v(x) = k** − kᵀK⁻¹k + kᵀR⁻¹k`, computed
//! from the cached Cholesky factors of `K` and `R` and `w = R⁻¹l`.

use std::sync::OnceLock;

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};
use serde::{Deserialize, Serialize};

use super::error::{ModelError, Result};
use super::kernel::Kernel;
use super::linalg::{cholesky_jittered, column_sq_norms, log_det, solve_lower_in_place};

/// Default jitter, relative to the kernel's prior variance.
pub const DEFAULT_RELATIVE_JITTER: f64 = 1e-6;

/// Natural site totals of one latent function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sites {
    pub l: DVector<f64>,
    pub lambda: DMatrix<f64>,
}

impl Sites {
    pub fn zeros(m: usize) -> Self {
        Sites {
            l: DVector::zeros(m),
            lambda: DMatrix::zeros(m, m),
        }
    }

    /// `self += scale · other`.
    pub fn add(&mut self, other: &Sites, scale: f64) {
        self.l.axpy(scale, &other.l, 1.0);
        self.lambda.zip_apply(&other.lambda, |a, b| *a += scale * b);
    }
}

/// Factors derived from the state; rebuilt by [`DualPosterior::refresh`].
#[derive(Debug, Clone)]
pub(crate) struct Factors {
    pub chol_k: Cholesky<f64, Dyn>,
    pub chol_r: Vec<Cholesky<f64, Dyn>>,
    pub w: Vec<DVector<f64>>,
    /// `K⁻¹` and each `R_c⁻¹`, made on first use: only gradients need them,
    /// and every block of points shares them.
    inverses: OnceLock<Box<Inverses>>,
}

/// `K⁻¹` and each `R_c⁻¹`.
type Inverses = (DMatrix<f64>, Vec<DMatrix<f64>>);

impl Factors {
    /// `K⁻¹`.
    pub fn k_inv(&self) -> &DMatrix<f64> {
        &self.inverses().0
    }

    /// `R_c⁻¹` with `R_c = K + Λ_c`.
    pub fn r_inv(&self, c: usize) -> &DMatrix<f64> {
        &self.inverses().1[c]
    }

    fn inverses(&self) -> &Inverses {
        self.inverses.get_or_init(|| {
            Box::new((
                self.chol_k.inverse(),
                self.chol_r.iter().map(Cholesky::inverse).collect(),
            ))
        })
    }
}

/// The predictive marginals `q(f_c(x_i)) = N(mean[(i,c)], var[(i,c)])`.
#[derive(Debug, Clone, PartialEq)]
pub struct Marginals {
    pub mean: DMatrix<f64>,
    pub var: DMatrix<f64>,
}

impl Marginals {
    /// Calls `visit(i, mean_i, var_i)` with point `i`'s marginals over the
    /// latents, reusing two buffers (this runs per record on hot paths).
    pub fn for_each_point(&self, mut visit: impl FnMut(usize, &[f64], &[f64])) {
        let n_latent = self.mean.ncols();
        let (mut mean, mut var) = (vec![0.0; n_latent], vec![0.0; n_latent]);
        for i in 0..self.mean.nrows() {
            for c in 0..n_latent {
                mean[c] = self.mean[(i, c)];
                var[c] = self.var[(i, c)];
            }
            visit(i, &mean, &var);
        }
    }
}

/// Kernel quantities at a set of inputs that stay valid while `θ` and `Z` do.
#[derive(Debug, Clone)]
pub struct Cross {
    /// `K(Z, X)`, `m × n`.
    pub kzx: DMatrix<f64>,
    /// `k(x_i, x_i) − k_iᵀ K⁻¹ k_i`: the prior variance left unexplained by `Z`.
    pub residual_var: DVector<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DualPosterior {
    pub kernel: Kernel,
    /// Inducing inputs, `m × d`.
    pub z: DMatrix<f64>,
    /// Added to `K(Z, Z)`; raised automatically when a factorisation fails.
    pub jitter: f64,
    /// One entry per latent function.
    pub sites: Vec<Sites>,
    #[serde(skip)]
    factors: Option<Factors>,
}

impl DualPosterior {
    /// The prior (all sites zero) over `n_latent` functions.
    pub fn new(kernel: Kernel, z: DMatrix<f64>, n_latent: usize) -> Result<Self> {
        kernel.validate(z.ncols())?;
        if z.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::Config("inducing inputs must be finite".into()));
        }
        if z.nrows() == 0 || n_latent == 0 {
            return Err(ModelError::Config(
                "need at least one inducing input and one latent".into(),
            ));
        }
        let jitter = DEFAULT_RELATIVE_JITTER * kernel.prior_variance();
        let sites = vec![Sites::zeros(z.nrows()); n_latent];
        let mut post = DualPosterior {
            kernel,
            z,
            jitter,
            sites,
            factors: None,
        };
        post.refresh()?;
        Ok(post)
    }

    pub fn m(&self) -> usize {
        self.z.nrows()
    }

    pub fn d(&self) -> usize {
        self.z.ncols()
    }

    pub fn n_latent(&self) -> usize {
        self.sites.len()
    }

    /// `K(Z, Z) + jitter·I`.
    pub fn k_zz(&self) -> DMatrix<f64> {
        let mut k = self.kernel.matrix(&self.z, &self.z);
        for i in 0..self.m() {
            k[(i, i)] += self.jitter;
        }
        k
    }

    /// Recomputes the Cholesky factors and `w` after the kernel, `Z` or the
    /// sites changed. Raises the jitter if `K` is numerically singular.
    pub fn refresh(&mut self) -> Result<()> {
        let mut k = self.kernel.matrix(&self.z, &self.z);
        let (chol_k, jitter) = cholesky_jittered(&k, self.jitter, "K(Z, Z)")?;
        self.jitter = jitter;
        for i in 0..self.m() {
            k[(i, i)] += jitter;
        }
        let mut chol_r = Vec::with_capacity(self.sites.len());
        let mut w = Vec::with_capacity(self.sites.len());
        for sites in &self.sites {
            let (chol, _) = cholesky_jittered(&(&k + &sites.lambda), 0.0, "K + Λ")?;
            w.push(chol.solve(&sites.l));
            chol_r.push(chol);
        }
        self.factors = Some(Factors {
            chol_k,
            chol_r,
            w,
            inverses: OnceLock::new(),
        });
        Ok(())
    }

    pub(crate) fn factors(&self) -> &Factors {
        self.factors
            .as_ref()
            .expect("DualPosterior::refresh runs on every change of state")
    }

    /// Restores the cached factors after deserialisation.
    pub fn ensure_factors(&mut self) -> Result<()> {
        if self.factors.is_none() {
            self.refresh()?;
        }
        Ok(())
    }

    /// `K(Z, X)` and the residual prior variance at `x`.
    pub fn cross(&self, x: &DMatrix<f64>) -> Cross {
        let kzx = self.kernel.matrix(&self.z, x);
        let mut a = kzx.clone();
        solve_lower_in_place(&self.factors().chol_k, &mut a);
        let residual_var = self.kernel.diag(x) - column_sq_norms(&a);
        Cross { kzx, residual_var }
    }

    /// Predictive marginals of the latent functions at `x` (`n × d`).
    pub fn predict_f(&self, x: &DMatrix<f64>) -> Marginals {
        self.marginals(&self.cross(x))
    }

    /// Predictive marginals from precomputed kernel quantities.
    pub fn marginals(&self, cross: &Cross) -> Marginals {
        let n = cross.kzx.ncols();
        let f = self.factors();
        let mut mean = DMatrix::zeros(n, self.n_latent());
        let mut var = DMatrix::zeros(n, self.n_latent());
        let mut b = cross.kzx.clone();
        for c in 0..self.n_latent() {
            mean.set_column(c, &cross.kzx.tr_mul(&f.w[c]));
            b.copy_from(&cross.kzx);
            solve_lower_in_place(&f.chol_r[c], &mut b);
            var.set_column(c, &(&cross.residual_var + column_sq_norms(&b)));
        }
        Marginals { mean, var }
    }

    /// `q(u) = N(m_u, S)` of latent `c`: `m_u = K w`, `S = K R⁻¹ K`.
    pub fn q_u(&self, c: usize) -> (DVector<f64>, DMatrix<f64>) {
        let f = self.factors();
        let k = self.k_zz();
        let m_u = &k * &f.w[c];
        let s = &k * f.chol_r[c].solve(&k);
        (m_u, s)
    }

    /// `KL[q(u) ‖ p(u)]`, summed over latents:
    /// `½ [tr(R⁻¹K) + wᵀKw − m + log|R| − log|K|]`.
    pub fn kl(&self) -> f64 {
        let f = self.factors();
        let k = self.k_zz();
        let m = self.m() as f64;
        let log_det_k = log_det(&f.chol_k);
        (0..self.n_latent())
            .map(|c| {
                // tr(R⁻¹K) = ‖L_R⁻¹ L_K‖²_F
                let mut lr_inv_lk = f.chol_k.l();
                solve_lower_in_place(&f.chol_r[c], &mut lr_inv_lk);
                let trace = lr_inv_lk.norm_squared();
                let mahalanobis = f.w[c].dot(&(&k * &f.w[c]));
                0.5 * (trace + mahalanobis - m + log_det(&f.chol_r[c]) - log_det_k)
            })
            .sum()
    }
}
