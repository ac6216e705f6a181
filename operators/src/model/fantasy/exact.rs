//! An exact GP regression with a Gaussian likelihood, conditioned on fantasy
//! points exactly (each is added to the training set): the gold standard the
//! sparse conditioning is compared with, in tests and benchmarks. `O(n³)` a
//! fantasy; meant for the few hundred points of an experiment loop.

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};

use super::{PointMarginals, Site, Surrogate};
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;
use crate::model::math::kernel::Kernel;
use crate::model::math::linalg::{cholesky_jittered, column_sq_norms, solve_lower_in_place};
use crate::model::posterior::Marginals;

/// A GP regression on all its data, conditioned exactly (`O(n³)`): the
/// oracle the sparse surrogates are tested against.
#[derive(Debug, Clone)]
pub struct ExactGp {
    kernel: Kernel,
    likelihood: Likelihood,
    x: DMatrix<f64>,
    y: DVector<f64>,
    /// Each point's noise variance (a fantasy site's is `1/β`).
    noise: DVector<f64>,
    /// `chol(K(X, X) + diag(noise))` and `α = (K + diag(noise))⁻¹y`.
    chol: Cholesky<f64, Dyn>,
    alpha: DVector<f64>,
}

impl ExactGp {
    /// The posterior of `f` given `y = f(x) + ε`, `ε ~ N(0, noise)`.
    pub fn new(kernel: Kernel, noise: f64, x: DMatrix<f64>, y: DVector<f64>) -> Result<Self> {
        if x.nrows() != y.len() || x.nrows() == 0 {
            return Err(ModelError::Config(format!(
                "an exact GP needs one target per input row and at least one row, got {} rows and {} targets",
                x.nrows(),
                y.len()
            )));
        }
        let n = y.len();
        let likelihood = Likelihood::Gaussian { variance: noise };
        Self::factored(kernel, likelihood, x, y, DVector::from_element(n, noise))
    }

    fn factored(
        kernel: Kernel,
        likelihood: Likelihood,
        x: DMatrix<f64>,
        y: DVector<f64>,
        noise: DVector<f64>,
    ) -> Result<Self> {
        kernel.validate(x.ncols())?;
        let k = kernel.matrix(&x, &x) + DMatrix::from_diagonal(&noise);
        let (chol, _) = cholesky_jittered(&k, 0.0, "K(X, X) + noise")?;
        let alpha = chol.solve(&y);
        Ok(ExactGp {
            kernel,
            likelihood,
            x,
            y,
            noise,
            chol,
            alpha,
        })
    }

    /// Training points, fantasies included.
    fn n(&self) -> usize {
        self.y.len()
    }
}

impl Surrogate for ExactGp {
    fn likelihood(&self) -> &Likelihood {
        &self.likelihood
    }

    fn d(&self) -> usize {
        self.x.ncols()
    }

    fn marginals(&self, x: &DMatrix<f64>) -> Marginals {
        let k = self.kernel.matrix(&self.x, x);
        let mean = k.tr_mul(&self.alpha);
        let mut half = k.clone();
        solve_lower_in_place(&self.chol, &mut half);
        let var = self.kernel.diag(x) - column_sq_norms(&half);
        Marginals {
            mean: DMatrix::from_column_slice(x.nrows(), 1, mean.as_slice()),
            var: DMatrix::from_column_slice(x.nrows(), 1, var.as_slice()),
        }
    }

    fn point_marginals(&self, x: &[f64]) -> PointMarginals {
        let row = DMatrix::from_row_slice(1, x.len(), x);
        let k = self.kernel.matrix(&self.x, &row).column(0).into_owned();
        let solved = self.chol.solve(&k);
        let grad = |g: &DVector<f64>| {
            self.kernel
                .input_grad(&row, &self.x, &DMatrix::from_row_slice(1, g.len(), g.as_slice()))
                .row(0)
                .transpose()
        };
        PointMarginals {
            mean: vec![k.dot(&self.alpha)],
            var: vec![self.kernel.diag(&row)[0] - k.dot(&solved)],
            d_mean: vec![grad(&self.alpha)],
            d_var: vec![grad(&(-2.0 * &solved)) + self.kernel.diag_input_grad(x)],
        }
    }

    /// Adds `x` with target `λ1/β` and noise variance `1/β`: the Gaussian
    /// observation whose site `(λ1, β)` is.
    fn condition(&mut self, x: &[f64], site: &Site) -> Result<()> {
        let (lambda1, beta) = (site.lambda1[0], site.beta[0]);
        if x.len() != self.d()
            || !beta.is_finite()
            || beta <= 0.0
            || !lambda1.is_finite()
            || x.iter().any(|v| !v.is_finite())
        {
            return Err(ModelError::Config(
                "an exact GP takes finite fantasy points of its dimension with β > 0".into(),
            ));
        }
        let n = self.n();
        let mut x_all = self.x.clone().insert_row(n, 0.0);
        x_all.row_mut(n).copy_from_slice(x);
        let y = self.y.clone().push(lambda1 / beta);
        let noise = self.noise.clone().push(1.0 / beta);
        *self = Self::factored(self.kernel.clone(), self.likelihood.clone(), x_all, y, noise)?;
        Ok(())
    }
}
