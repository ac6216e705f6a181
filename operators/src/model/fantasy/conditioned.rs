//! A dual posterior conditioned on fantasy sites without touching the learner.
//!
//! A site `(λ1, β)` at `x` adds `λ1 a` to `h` and `β a aᵀ` to `P`
//! (`a = L⁻¹k(Z, x)`), a rank-one change of `D = I + P`. Held as the
//! whitened mean `m = D⁻¹h` and covariance `S = D⁻¹`, Sherman–Morrison makes
//! it `O(m²)`: with `s = Sa`,
//! `S' = S − β s sᵀ / (1 + β aᵀs)`, `m' = m + s (λ1 − β aᵀm) / (1 + β aᵀs)`.
//!
//! With `Z` fixed a site sees only `f(x)`'s projection on `Z`: the variance
//! `k(x, x) − aᵀa` that `Z` leaves unexplained stays after any number of
//! fantasies there, so acquisitions keep choosing next to a fantasised point.
//! [`Conditioned::growing`] adds `x` to `Z` first. Under the prior's
//! conditional the new whitened coordinate is `(u_x − cᵀv)/δ`, independent of
//! `v` with mean 0 and variance 1 (`c = L⁻¹k(Z, x)`, `δ² = k(x, x) − cᵀc`),
//! so `L` gains the row `[cᵀ δ]`, `m` a 0 and `S` a 1: `O(m)`, and the site at
//! `x` is then exact (`a = [c; δ]`).

use nalgebra::{DMatrix, DVector};

use super::{PointMarginals, Site, Surrogate};
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;
use crate::model::math::linalg::{column_sq_norms, solve_lower_matrix_in_place};
use crate::model::posterior::{DualPosterior, Marginals};

/// A site added at a point, by its whitened kernel column (over the `Z` of
/// that moment: the coordinates added later do not see it).
#[derive(Debug, Clone)]
struct Added {
    a: DVector<f64>,
    site: Site,
}

/// A [`DualPosterior`] with fantasy sites added.
#[derive(Debug, Clone)]
pub struct Conditioned {
    base: DualPosterior,
    likelihood: Likelihood,
    /// Whether a fantasy's input joins `Z`.
    growing: bool,
    /// The inducing inputs: the base's, then the fantasies' if growing.
    z: DMatrix<f64>,
    /// `L` of `K(Z, Z) + jitter·I = LLᵀ`.
    l: DMatrix<f64>,
    /// Per latent the whitened mean `m = D⁻¹h` and covariance `S = D⁻¹`.
    mean: Vec<DVector<f64>>,
    cov: Vec<DMatrix<f64>>,
    added: Vec<Added>,
}

/// A fantasy input joins `Z` when `Z` leaves more than this share of its
/// prior variance unexplained: below, the site is exact to that share.
const GROW_ABOVE: f64 = 1e-4;

impl Conditioned {
    /// `post` as it is, ready to take fantasy sites over its own `Z`
    /// (Algorithm 2 as the paper states it).
    pub fn new(post: &DualPosterior, likelihood: Likelihood) -> Result<Self> {
        if likelihood.n_latent() != post.n_latent() {
            return Err(ModelError::Config(format!(
                "the likelihood {} has {} latents, the posterior {}",
                likelihood.name(),
                likelihood.n_latent(),
                post.n_latent()
            )));
        }
        let mut base = post.clone();
        base.ensure_factors()?;
        let f = base.factors();
        let cov = (0..base.n_latent())
            .map(|c| {
                let half = f.d_inv_half(c);
                half.tr_mul(half)
            })
            .collect();
        Ok(Conditioned {
            l: f.chol_k.l(),
            z: base.z.clone(),
            mean: f.m_v.clone(),
            cov,
            likelihood,
            growing: false,
            added: Vec::new(),
            base,
        })
    }

    /// As [`new`](Self::new), but each fantasy's input joins `Z` first, so
    /// that its site conditions `f(x)` itself, as exact GP conditioning does.
    pub fn growing(post: &DualPosterior, likelihood: Likelihood) -> Result<Self> {
        Ok(Conditioned {
            growing: true,
            ..Self::new(post, likelihood)?
        })
    }

    /// The posterior over the current `Z` with the fantasy sites added to its
    /// whitened totals (a rank-k update of `P`; over added inducing inputs
    /// the base's totals are zero), as a learner's posterior would hold them.
    pub fn posterior(&self) -> Result<DualPosterior> {
        let m = self.z.nrows();
        let mut post = self.base.clone();
        post.z = self.z.clone();
        for sites in &mut post.whitened {
            sites.l = sites.l.clone().resize_vertically(m, 0.0);
            sites.lambda = sites.lambda.clone().resize(m, m, 0.0);
        }
        for Added { a, site } in &self.added {
            let a = a.clone().resize_vertically(m, 0.0);
            for (c, sites) in post.whitened.iter_mut().enumerate() {
                sites.l.axpy(site.lambda1[c], &a, 1.0);
                sites.lambda.ger(site.beta[c], &a, &a, 1.0);
            }
        }
        post.refresh()?;
        Ok(post)
    }

    fn check_point(&self, x: &[f64]) -> Result<DMatrix<f64>> {
        if x.len() != self.base.d() {
            return Err(ModelError::Dimension {
                what: "fantasy point".into(),
                expected: self.base.d(),
                got: x.len(),
            });
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::NonFinite {
                row: 0,
                what: "fantasy point".into(),
            });
        }
        Ok(DMatrix::from_row_slice(1, x.len(), x))
    }

    /// `A = L⁻¹K(Z, X)` and `k(x, x)` at every row of `x`.
    fn whitened_columns(&self, x: &DMatrix<f64>) -> (DMatrix<f64>, DVector<f64>) {
        let mut a = self.base.kernel.matrix(&self.z, x);
        solve_lower_matrix_in_place(&self.l, &mut a);
        (a, self.base.kernel.diag(x))
    }

    /// Adds `x` (one row) to `Z` if `Z` leaves enough of its variance unexplained.
    fn grow(&mut self, x: &DMatrix<f64>) {
        let (c, prior_var) = self.whitened_columns(x);
        let c = c.column(0);
        let delta_sq = prior_var[0] + self.base.jitter - c.norm_squared();
        if delta_sq <= GROW_ABOVE * prior_var[0] {
            return;
        }
        let m = self.z.nrows();
        self.z = self.z.clone().insert_row(m, 0.0);
        self.z.row_mut(m).copy_from(&x.row(0));
        self.l = self.l.clone().resize(m + 1, m + 1, 0.0);
        self.l.view_mut((m, 0), (1, m)).copy_from(&c.transpose());
        self.l[(m, m)] = delta_sq.sqrt();
        for (mean, cov) in self.mean.iter_mut().zip(&mut self.cov) {
            *mean = mean.clone().resize_vertically(m + 1, 0.0);
            *cov = cov.clone().resize(m + 1, m + 1, 0.0);
            cov[(m, m)] = 1.0;
        }
    }
}

const POSITIVE_DIAGONAL: &str = "a Cholesky factor has a positive diagonal";

impl Surrogate for Conditioned {
    fn likelihood(&self) -> &Likelihood {
        &self.likelihood
    }

    fn d(&self) -> usize {
        self.base.d()
    }

    fn marginals(&self, x: &DMatrix<f64>) -> Marginals {
        let (a, prior_var) = self.whitened_columns(x);
        let residual_var = prior_var - column_sq_norms(&a);
        let n = x.nrows();
        let mut mean = DMatrix::zeros(n, self.mean.len());
        let mut var = DMatrix::zeros(n, self.mean.len());
        for (c, (m, s)) in self.mean.iter().zip(&self.cov).enumerate() {
            mean.set_column(c, &a.tr_mul(m));
            let sa = s * &a;
            for i in 0..n {
                var[(i, c)] = residual_var[i] + a.column(i).dot(&sa.column(i));
            }
        }
        Marginals { mean, var }
    }

    fn point_marginals(&self, x: &[f64]) -> PointMarginals {
        let row = DMatrix::from_row_slice(1, x.len(), x);
        let (a, prior_var) = self.whitened_columns(&row);
        let a = a.column(0).into_owned();
        let kernel = &self.base.kernel;
        let diag_grad = kernel.diag_input_grad(x);
        let mut out = PointMarginals {
            mean: Vec::new(),
            var: Vec::new(),
            d_mean: Vec::new(),
            d_var: Vec::new(),
        };
        // ∂/∂x of aᵀm and of k(x,x) − aᵀa + aᵀSa is k's gradient against
        // L⁻ᵀm and 2L⁻ᵀ(S − I)a.
        let gradient = |w: DVector<f64>| -> DVector<f64> {
            let g = self.l.tr_solve_lower_triangular(&w).expect(POSITIVE_DIAGONAL);
            kernel
                .input_grad(&row, &self.z, &DMatrix::from_row_slice(1, g.len(), g.as_slice()))
                .row(0)
                .transpose()
        };
        for (m, s) in self.mean.iter().zip(&self.cov) {
            let sa = s * &a;
            out.mean.push(a.dot(m));
            out.var.push(prior_var[0] - a.norm_squared() + a.dot(&sa));
            out.d_mean.push(gradient(m.clone()));
            out.d_var.push(gradient(2.0 * (sa - &a)) + &diag_grad);
        }
        out
    }

    fn condition(&mut self, x: &[f64], site: &Site) -> Result<()> {
        let row = self.check_point(x)?;
        let n = self.mean.len();
        if site.lambda1.len() != n || site.beta.len() != n {
            return Err(ModelError::Dimension {
                what: "fantasy site".into(),
                expected: n,
                got: site.lambda1.len(),
            });
        }
        if site.beta.iter().chain(&site.lambda1).any(|v| !v.is_finite()) || site.beta.iter().any(|&b| b < 0.0) {
            return Err(ModelError::Config(
                "a fantasy site needs finite values and β ≥ 0".into(),
            ));
        }
        if self.growing {
            self.grow(&row);
        }
        let a = self.whitened_columns(&row).0.column(0).into_owned();
        for c in 0..n {
            let (lambda1, beta) = (site.lambda1[c], site.beta[c]);
            let s = &self.cov[c] * &a;
            let denominator = 1.0 + beta * a.dot(&s);
            let step = (lambda1 - beta * a.dot(&self.mean[c])) / denominator;
            self.mean[c].axpy(step, &s, 1.0);
            self.cov[c].ger(-beta / denominator, &s, &s, 1.0);
        }
        self.added.push(Added { a, site: site.clone() });
        Ok(())
    }
}
