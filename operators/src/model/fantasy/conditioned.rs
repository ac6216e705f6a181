//! A dual posterior conditioned on fantasy sites without touching the learner.
//!
//! A site `(λ1, β)` at `x` adds `λ1 a` to `h` and `β a aᵀ` to `P`
//! (`a = L⁻¹k(Z, x)`), a rank-one change of `D = I + P`. Held as the
//! whitened mean `m = D⁻¹h` and covariance `S = D⁻¹`, Sherman–Morrison makes
//! it `O(m²)`: with `s = Sa`,
//! `S' = S − β s sᵀ / (1 + β aᵀs)`, `m' = m + s (λ1 − β aᵀm) / (1 + β aᵀs)`.

use nalgebra::{DMatrix, DVector};

use super::{PointMarginals, Site, Surrogate};
use crate::model::dual::posterior::{DualPosterior, Marginals};
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;

/// A site added at a point, by its whitened kernel column.
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
    /// `L` of `K(Z, Z) = LLᵀ`.
    l: DMatrix<f64>,
    /// Per latent the whitened mean `m = D⁻¹h` and covariance `S = D⁻¹`.
    mean: Vec<DVector<f64>>,
    cov: Vec<DMatrix<f64>>,
    added: Vec<Added>,
}

impl Conditioned {
    /// `post` as it is, ready to take fantasy sites.
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
            mean: f.m_v.clone(),
            cov,
            likelihood,
            added: Vec::new(),
            base,
        })
    }

    /// Fantasy sites so far.
    pub fn fantasies(&self) -> usize {
        self.added.len()
    }

    /// The posterior with the fantasy sites added to its whitened totals (a
    /// rank-k update of `P`), as a learner's posterior would hold them.
    pub fn posterior(&self) -> Result<DualPosterior> {
        let mut post = self.base.clone();
        for Added { a, site } in &self.added {
            for (c, sites) in post.whitened.iter_mut().enumerate() {
                sites.l.axpy(site.lambda1[c], a, 1.0);
                sites.lambda.ger(site.beta[c], a, a, 1.0);
            }
        }
        post.refresh_sites()?;
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

    /// `a = L⁻¹k(Z, x)` and `k(x, x)`.
    fn whitened_column(&self, x: &DMatrix<f64>) -> (DVector<f64>, f64) {
        let k = self.base.kernel.matrix(&self.base.z, x).column(0).into_owned();
        let a = self.l.solve_lower_triangular(&k).expect(POSITIVE_DIAGONAL);
        (a, self.base.kernel.diag(x)[0])
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
        let cross = self.base.cross(x);
        let n = x.nrows();
        let mut mean = DMatrix::zeros(n, self.mean.len());
        let mut var = DMatrix::zeros(n, self.mean.len());
        for (c, (m, s)) in self.mean.iter().zip(&self.cov).enumerate() {
            mean.set_column(c, &cross.a.tr_mul(m));
            let sa = s * &cross.a;
            for i in 0..n {
                var[(i, c)] = cross.residual_var[i] + cross.a.column(i).dot(&sa.column(i));
            }
        }
        Marginals { mean, var }
    }

    fn point_marginals(&self, x: &[f64]) -> PointMarginals {
        let row = DMatrix::from_row_slice(1, x.len(), x);
        let (a, prior_var) = self.whitened_column(&row);
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
                .input_grad(&row, &self.base.z, &DMatrix::from_row_slice(1, g.len(), g.as_slice()))
                .row(0)
                .transpose()
        };
        for (m, s) in self.mean.iter().zip(&self.cov) {
            let sa = s * &a;
            out.mean.push(a.dot(m));
            out.var.push(prior_var - a.norm_squared() + a.dot(&sa));
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
        let (a, _) = self.whitened_column(&row);
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
