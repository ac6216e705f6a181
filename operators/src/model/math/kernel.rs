//! Covariance functions: stationary families with shared or ARD lengthscales,
//! a constant (bias) kernel, sums and products of kernels, and a coregional
//! (multi-output) kernel over latent kernels ([`Coregional`]).
//!
//! Every kernel gives `K(A, B)`, its diagonal, and the gradient of a scalar
//! objective with respect to its log-parameters from `dL/dK` (analytic).

use std::borrow::Cow;

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};
use crate::model::math::exp::exp_nonpositive;
#[cfg(target_arch = "x86_64")]
use crate::model::math::exp::has_avx2_fma;
use crate::model::math::linalg::transposed;

/// The radial profile of a stationary kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `exp(−r²/2)`: infinitely smooth functions.
    #[serde(alias = "se", alias = "rbf")]
    SquaredExponential,
    /// Matérn ν = 1/2, `exp(−r)`: continuous, nowhere differentiable functions.
    Matern12,
    /// Matérn ν = 3/2: once differentiable functions.
    Matern32,
    /// Matérn ν = 5/2: twice differentiable functions.
    Matern52,
}

/// `variance · f(r)`, `r² = Σ_k (a_k − b_k)² / ℓ_k²`; one lengthscale is shared
/// by all inputs, `d` of them is ARD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stationary {
    /// The radial profile `f`.
    pub family: Family,
    /// The prior variance `k(x, x)`.
    pub variance: f64,
    /// One shared lengthscale, or one per input (ARD).
    pub lengthscales: Vec<f64>,
}

/// A covariance function over inputs: what the GP's prior says about how
/// outputs vary together; its hyperparameters are learned in log space.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// A function of the scaled distance between inputs.
    Stationary(Stationary),
    /// `k(a, b) = variance` for all inputs: a bias term.
    Constant {
        /// The constant.
        variance: f64,
    },
    /// `k(a, b) = variance · aᵀb`: Bayesian linear regression on the inputs,
    /// the limit a stationary kernel reaches only as its variance and
    /// lengthscale run off together.
    Linear {
        /// The prior variance of each weight.
        variance: f64,
    },
    /// The sum of the parts' covariances: independent effects added.
    Sum(Vec<Kernel>),
    /// The product of the parts' covariances: effects that interact.
    Product(Vec<Kernel>),
    /// Several outputs as loadings on latent kernels; the last input column
    /// is an output (or latent) index.
    Coregional(Coregional),
}

/// The size of every starting loading but the one tying each output to its own
/// latent (see [`Kernel::coregional`]).
pub const CROSS_LOADING: f64 = 0.1;

/// The linear model of coregionalisation (its mathematics in
/// [`coregional`](super::coregional)). Defined here because it and `Kernel`
/// hold each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coregional {
    /// One kernel per latent function u_q, over every input column but the last.
    pub latents: Vec<Kernel>,
    /// Q × D loadings a_{q,d}: output d is f_d = Σ_q a_{q,d} u_q.
    pub mixing: DMatrix<f64>,
}

/// What a kernel's gradient needs again of `K(A, B)`, kept beside the kernel
/// columns an M-step reuses.
#[derive(Debug, Clone, PartialEq)]
pub enum Profile {
    /// A stationary kernel's.
    Radial(Radial),
    /// A coregional kernel's: each latent's, in latent order.
    Latents(Vec<Option<Profile>>),
}

/// A stationary kernel's `K(A, B)` before its variance: the scaled squared
/// distances `R²`, the profile `f(R²)` and its slope `f'(R²)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Radial {
    r2: DMatrix<f64>,
    values: DMatrix<f64>,
    slopes: DMatrix<f64>,
}

/// Whose rows an input gradient is wanted for, beside the log-parameters'
/// (see [`Kernel::grads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// No input gradient: the log-parameters' only.
    Neither,
    /// The gradient in `A`'s rows.
    OfA,
    /// The gradient in `B`'s rows.
    OfB,
}

impl Rows {
    /// A zero gradient for these rows of `K(A, B)`'s inputs.
    pub(super) fn zeros(self, a: &DMatrix<f64>, b: &DMatrix<f64>) -> Option<DMatrix<f64>> {
        match self {
            Rows::Neither => None,
            Rows::OfA => Some(DMatrix::zeros(a.nrows(), a.ncols())),
            Rows::OfB => Some(DMatrix::zeros(b.nrows(), b.ncols())),
        }
    }
}

impl Kernel {
    /// A stationary kernel: one lengthscale shared by every input, or one each (ARD).
    pub fn stationary(family: Family, variance: f64, lengthscales: Vec<f64>) -> Self {
        Kernel::Stationary(Stationary {
            family,
            variance,
            lengthscales,
        })
    }

    /// `outputs` outputs over `latents` copies of `base` (a kernel over the
    /// inputs without the index column), loadings started at `a_{q,d} = 1` for
    /// `q = d mod Q` and ±[`CROSS_LOADING`] elsewhere (+ where `q + d` is even):
    /// every output starts on a latent of its own and no loading starts at zero.
    pub fn coregional(base: Kernel, latents: usize, outputs: usize) -> Kernel {
        Kernel::Coregional(Coregional::new(base, latents, outputs))
    }

    /// Number of parameters, in the order of [`Kernel::log_params`].
    pub fn n_params(&self) -> usize {
        match self {
            Kernel::Stationary(s) => 1 + s.lengthscales.len(),
            Kernel::Constant { .. } | Kernel::Linear { .. } => 1,
            Kernel::Sum(parts) | Kernel::Product(parts) => parts.iter().map(Kernel::n_params).sum(),
            Kernel::Coregional(c) => c.n_params(),
        }
    }

    /// Log-parameters: a stationary kernel gives `[log variance, log ℓ_1, …]`,
    /// a constant `[log variance]`, sums and products their parts in order, a
    /// coregional kernel its latents' then its loadings (as they are: they take
    /// either sign).
    pub fn log_params(&self) -> Vec<f64> {
        match self {
            Kernel::Stationary(s) => std::iter::once(s.variance)
                .chain(s.lengthscales.iter().copied())
                .map(f64::ln)
                .collect(),
            Kernel::Constant { variance } | Kernel::Linear { variance } => vec![variance.ln()],
            Kernel::Sum(parts) | Kernel::Product(parts) => parts.iter().flat_map(Kernel::log_params).collect(),
            Kernel::Coregional(c) => c.log_params(),
        }
    }

    /// Inverse of [`Kernel::log_params`]; `p.len()` must be `n_params()`.
    pub fn set_log_params(&mut self, p: &[f64]) {
        assert_eq!(p.len(), self.n_params(), "kernel: wrong number of log-parameters");
        match self {
            Kernel::Stationary(s) => {
                s.variance = p[0].exp();
                for (l, &lp) in s.lengthscales.iter_mut().zip(&p[1..]) {
                    *l = lp.exp();
                }
            }
            Kernel::Constant { variance } | Kernel::Linear { variance } => *variance = p[0].exp(),
            Kernel::Sum(parts) | Kernel::Product(parts) => {
                let mut rest = p;
                for part in parts {
                    let (head, tail) = rest.split_at(part.n_params());
                    part.set_log_params(head);
                    rest = tail;
                }
            }
            Kernel::Coregional(c) => c.set_log_params(p),
        }
    }

    /// Human-readable names in the same order, e.g. `matern52.variance`, `matern52.lengthscale[3]`.
    pub fn param_names(&self) -> Vec<String> {
        let mut names = Vec::with_capacity(self.n_params());
        self.push_names("", &mut names);
        names
    }

    /// Names and natural-scale values, in `log_params` order: exp of each
    /// log-parameter, a coregional kernel's loadings as they are.
    pub fn named_params(&self) -> Vec<(String, f64)> {
        self.param_names().into_iter().zip(self.natural_params()).collect()
    }

    /// The values behind [`named_params`](Self::named_params).
    pub(super) fn natural_params(&self) -> Vec<f64> {
        match self {
            Kernel::Sum(parts) | Kernel::Product(parts) => parts.iter().flat_map(Kernel::natural_params).collect(),
            Kernel::Coregional(c) => c.natural_params(),
            _ => self.log_params().into_iter().map(f64::exp).collect(),
        }
    }

    /// Refuses non-positive or non-finite parameters and ARD lengthscales whose count is not `d`.
    pub fn validate(&self, d: usize) -> Result<()> {
        self.validate_at(d, "")
    }

    /// `k(x, x)` for stationary kernels (the prior variance), at a unit input
    /// for the linear kernel; used to scale jitter.
    pub fn prior_variance(&self) -> f64 {
        match self {
            Kernel::Stationary(s) => s.variance,
            Kernel::Constant { variance } | Kernel::Linear { variance } => *variance,
            Kernel::Sum(parts) => parts.iter().map(Kernel::prior_variance).sum(),
            Kernel::Product(parts) => parts.iter().map(Kernel::prior_variance).product(),
            Kernel::Coregional(c) => c.prior_variance(),
        }
    }

    /// `∂ log v / ∂ log θ` of [`prior_variance`](Self::prior_variance) `v`,
    /// in the order of [`Kernel::log_params`] (`∂ log v / ∂ a` for a loading).
    pub fn log_prior_variance_grad(&self) -> DVector<f64> {
        match self {
            Kernel::Stationary(s) => {
                let mut grad = DVector::zeros(1 + s.lengthscales.len());
                grad[0] = 1.0;
                grad
            }
            Kernel::Constant { .. } | Kernel::Linear { .. } => DVector::from_element(1, 1.0),
            // log Σ v_p: each part's share v_p / v of its own log-gradient.
            Kernel::Sum(parts) => {
                let total = self.prior_variance();
                concat(
                    parts
                        .iter()
                        .map(|p| p.log_prior_variance_grad() * (p.prior_variance() / total)),
                )
            }
            Kernel::Product(parts) => concat(parts.iter().map(Kernel::log_prior_variance_grad)),
            Kernel::Coregional(c) => c.log_prior_variance_grad(),
        }
    }

    /// `K(A, B)`, `|A| × |B|`, with points as rows.
    pub fn matrix(&self, a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
        assert_eq!(a.ncols(), b.ncols(), "kernel: inputs have different numbers of columns");
        match self {
            Kernel::Stationary(s) => s.matrix(a, b),
            Kernel::Constant { variance } => DMatrix::from_element(a.nrows(), b.nrows(), *variance),
            Kernel::Linear { variance } => *variance * a * transposed(b),
            Kernel::Sum(parts) => {
                let mut k = DMatrix::zeros(a.nrows(), b.nrows());
                for part in parts {
                    k += part.matrix(a, b);
                }
                k
            }
            Kernel::Product(parts) => {
                let mut k = DMatrix::from_element(a.nrows(), b.nrows(), 1.0);
                for part in parts {
                    k.component_mul_assign(&part.matrix(a, b));
                }
                k
            }
            Kernel::Coregional(c) => c.matrix(a, b),
        }
    }

    /// `K(X, x_p)` for rows `x_p` of one `X`, one column at a time, as
    /// [`matrix`](Self::matrix) gives it to the bit: what a pivoted Cholesky
    /// asks once a pivot. The inputs' scaled copy and norms are made once,
    /// not at every column.
    pub fn columns<'a>(&'a self, x: &'a DMatrix<f64>) -> Columns<'a> {
        Columns(Prepared::of(self, x))
    }

    /// `k(a_i, a_i)` for every row of `a`.
    pub fn diag(&self, a: &DMatrix<f64>) -> DVector<f64> {
        let n = a.nrows();
        match self {
            // f(0) = 1 for every family.
            Kernel::Stationary(Stationary { variance, .. }) | Kernel::Constant { variance } => {
                DVector::from_element(n, *variance)
            }
            Kernel::Linear { variance } => *variance * row_sq_norms(a),
            Kernel::Sum(parts) => {
                let mut k = DVector::zeros(n);
                for part in parts {
                    k += part.diag(a);
                }
                k
            }
            Kernel::Product(parts) => {
                let mut k = DVector::from_element(n, 1.0);
                for part in parts {
                    k.component_mul_assign(&part.diag(a));
                }
                k
            }
            Kernel::Coregional(c) => c.diag(a),
        }
    }

    /// `∂k(x, x)/∂x` at one point `x`: zero for stationary and constant
    /// kernels, whose prior variance is the same everywhere.
    pub fn diag_input_grad(&self, x: &[f64]) -> DVector<f64> {
        match self {
            Kernel::Stationary(_) | Kernel::Constant { .. } => DVector::zeros(x.len()),
            Kernel::Linear { variance } => DVector::from_iterator(x.len(), x.iter().map(|v| 2.0 * variance * v)),
            Kernel::Sum(parts) => parts
                .iter()
                .fold(DVector::zeros(x.len()), |acc, part| acc + part.diag_input_grad(x)),
            Kernel::Product(parts) => {
                let row = DMatrix::from_row_slice(1, x.len(), x);
                let diags: Vec<f64> = parts.iter().map(|part| part.diag(&row)[0]).collect();
                let mut out = DVector::zeros(x.len());
                for (p, part) in parts.iter().enumerate() {
                    let others: f64 = diags
                        .iter()
                        .enumerate()
                        .filter(|&(q, _)| q != p)
                        .map(|(_, v)| v)
                        .product();
                    out.axpy(others, &part.diag_input_grad(x), 1.0);
                }
                out
            }
            Kernel::Coregional(c) => c.diag_input_grad(x),
        }
    }

    /// `Σ_ij G_ij ∂K(A,B)_ij / ∂ log θ` for every log-parameter θ (`∂/∂a` for a
    /// coregional loading).
    pub fn matrix_grad(&self, a: &DMatrix<f64>, b: &DMatrix<f64>, g: &DMatrix<f64>) -> DVector<f64> {
        self.grads(a, b, g, Rows::Neither).0
    }

    /// `Σ_j G_ij ∂k(a_i, b_j) / ∂a_i`, `|A| × d`: the gradient with respect to
    /// the rows of `A` (for moving inducing inputs). For `K(Z, Z)` add the same
    /// with `Gᵀ`, since every kernel here is symmetric.
    pub fn input_grad(&self, a: &DMatrix<f64>, b: &DMatrix<f64>, g: &DMatrix<f64>) -> DMatrix<f64> {
        self.grads(a, b, g, Rows::OfA).1.expect("asked for")
    }

    /// [`matrix_grad`](Self::matrix_grad) and, if asked, the gradient with
    /// respect to the rows of `A` ([`input_grad`](Self::input_grad)) or of `B`
    /// (`input_grad(B, A, Gᵀ)`) in one pass: a stationary kernel's distances,
    /// profiles and product with the inputs are made once for both.
    pub fn grads(
        &self,
        a: &DMatrix<f64>,
        b: &DMatrix<f64>,
        g: &DMatrix<f64>,
        rows: Rows,
    ) -> (DVector<f64>, Option<DMatrix<f64>>) {
        self.grads_from(a, b, g, rows, None)
    }

    /// `K(A, B)` and, for a stationary kernel, its [`Profile`], from which
    /// [`grads_from`](Self::grads_from) starts without the distances and
    /// exponentials again.
    pub fn matrix_with_profile(&self, a: &DMatrix<f64>, b: &DMatrix<f64>) -> (DMatrix<f64>, Option<Profile>) {
        assert_eq!(a.ncols(), b.ncols(), "kernel: inputs have different numbers of columns");
        match self {
            Kernel::Stationary(s) => {
                let radial = s.profile(a, b, None);
                (&radial.values * s.variance, Some(Profile::Radial(radial)))
            }
            Kernel::Coregional(c) => {
                let (k, latents) = c.matrix_with_profiles(a, b);
                (k, Some(Profile::Latents(latents)))
            }
            _ => (self.matrix(a, b), None),
        }
    }

    /// `K(A, B)` again from its [`Profile`], where the profile holds it all (a
    /// stationary kernel's, the same bits as [`matrix`](Self::matrix)).
    pub(super) fn matrix_from(&self, profile: &Profile) -> Option<DMatrix<f64>> {
        match (self, profile) {
            (Kernel::Stationary(s), Profile::Radial(radial)) => Some(&radial.values * s.variance),
            _ => None,
        }
    }

    /// [`grads`](Self::grads), from `K(A, B)`'s [`Profile`] if there is one
    /// (made by [`matrix_with_profile`](Self::matrix_with_profile) under this kernel).
    pub fn grads_from(
        &self,
        a: &DMatrix<f64>,
        b: &DMatrix<f64>,
        g: &DMatrix<f64>,
        rows: Rows,
        profile: Option<&Profile>,
    ) -> (DVector<f64>, Option<DMatrix<f64>>) {
        assert_eq!(a.ncols(), b.ncols(), "kernel: inputs have different numbers of columns");
        assert_eq!(g.shape(), (a.nrows(), b.nrows()), "kernel: dL/dK has the wrong shape");
        let zeros = || rows.zeros(a, b);
        match self {
            Kernel::Stationary(s) => {
                let radial = match profile {
                    Some(Profile::Radial(radial)) => Some(radial),
                    _ => None,
                };
                s.grads(a, b, g, rows, radial)
            }
            Kernel::Constant { variance } => (DVector::from_element(1, variance * g.sum()), zeros()),
            // ∂K/∂log σ² = K; ∂(σ² a_iᵀb_j)/∂a_i = σ² b_j.
            Kernel::Linear { variance } => {
                let theta = DVector::from_element(1, self.matrix(a, b).dot(g));
                let input = match rows {
                    Rows::Neither => None,
                    Rows::OfA => Some(*variance * g * b),
                    Rows::OfB => Some(*variance * g.transpose() * a),
                };
                (theta, input)
            }
            Kernel::Sum(parts) => {
                let mut input = zeros();
                let theta = concat(parts.iter().map(|part| {
                    let (theta, part_input) = part.grads(a, b, g, rows);
                    if let (Some(total), Some(part)) = (input.as_mut(), part_input) {
                        *total += part;
                    }
                    theta
                }));
                (theta, input)
            }
            Kernel::Product(parts) => {
                let factors: Vec<_> = parts.iter().map(|part| part.matrix(a, b)).collect();
                let mut input = zeros();
                let theta = concat(parts.iter().enumerate().map(|(p, part)| {
                    // Product rule: this factor sees G times every other factor.
                    let mut gp = g.clone();
                    for (_, other) in factors.iter().enumerate().filter(|&(q, _)| q != p) {
                        gp.component_mul_assign(other);
                    }
                    let (theta, part_input) = part.grads(a, b, &gp, rows);
                    if let (Some(total), Some(part)) = (input.as_mut(), part_input) {
                        *total += part;
                    }
                    theta
                }));
                (theta, input)
            }
            Kernel::Coregional(c) => {
                let latents = match profile {
                    Some(Profile::Latents(latents)) => Some(&latents[..]),
                    _ => None,
                };
                c.grads(a, b, g, rows, latents)
            }
        }
    }

    /// `Σ_i g_i ∂k(a_i, a_i) / ∂ log θ` for every log-parameter θ.
    pub fn diag_grad(&self, a: &DMatrix<f64>, g: &DVector<f64>) -> DVector<f64> {
        assert_eq!(g.len(), a.nrows(), "kernel: dL/ddiag has the wrong length");
        match self {
            // The diagonal is the variance and does not depend on lengthscales.
            Kernel::Stationary(s) => {
                let mut grad = DVector::zeros(1 + s.lengthscales.len());
                grad[0] = s.variance * g.sum();
                grad
            }
            Kernel::Constant { variance } => DVector::from_element(1, variance * g.sum()),
            Kernel::Linear { variance } => DVector::from_element(1, variance * row_sq_norms(a).dot(g)),
            Kernel::Sum(parts) => concat(parts.iter().map(|part| part.diag_grad(a, g))),
            Kernel::Product(parts) => {
                let factors: Vec<_> = parts.iter().map(|part| part.diag(a)).collect();
                concat(parts.iter().enumerate().map(|(p, part)| {
                    let mut gp = g.clone();
                    for (_, other) in factors.iter().enumerate().filter(|&(q, _)| q != p) {
                        gp.component_mul_assign(other);
                    }
                    part.diag_grad(a, &gp)
                }))
            }
            Kernel::Coregional(c) => c.diag_grad(a, g),
        }
    }

    pub(super) fn push_names(&self, prefix: &str, out: &mut Vec<String>) {
        match self {
            Kernel::Stationary(s) => {
                let base = join(prefix, s.family.name());
                out.push(format!("{base}.variance"));
                if s.lengthscales.len() == 1 {
                    out.push(format!("{base}.lengthscale"));
                } else {
                    out.extend((0..s.lengthscales.len()).map(|k| format!("{base}.lengthscale[{k}]")));
                }
            }
            Kernel::Constant { .. } => out.push(join(prefix, "constant.variance")),
            Kernel::Linear { .. } => out.push(join(prefix, "linear.variance")),
            Kernel::Sum(parts) => push_part_names(parts, &join(prefix, "sum"), out),
            Kernel::Product(parts) => push_part_names(parts, &join(prefix, "product"), out),
            Kernel::Coregional(c) => c.push_names(prefix, out),
        }
    }

    pub(super) fn validate_at(&self, d: usize, prefix: &str) -> Result<()> {
        match self {
            Kernel::Stationary(s) => {
                let base = join(prefix, s.family.name());
                check_positive(&format!("{base}.variance"), s.variance)?;
                match s.lengthscales.len() {
                    0 => return Err(config(format!("{base}: no lengthscales"))),
                    1 => check_positive(&format!("{base}.lengthscale"), s.lengthscales[0])?,
                    n if n != d => return Err(config(format!("{base}: {n} ARD lengthscales for {d} input columns"))),
                    _ => {
                        for (k, &l) in s.lengthscales.iter().enumerate() {
                            check_positive(&format!("{base}.lengthscale[{k}]"), l)?;
                        }
                    }
                }
                Ok(())
            }
            Kernel::Constant { variance } => check_positive(&join(prefix, "constant.variance"), *variance),
            Kernel::Linear { variance } => check_positive(&join(prefix, "linear.variance"), *variance),
            Kernel::Sum(parts) => validate_parts(parts, d, &join(prefix, "sum")),
            Kernel::Product(parts) => validate_parts(parts, d, &join(prefix, "product")),
            Kernel::Coregional(c) => c.validate_at(d, prefix),
        }
    }
}

impl Family {
    /// The name used in parameter names and error messages.
    fn name(self) -> &'static str {
        match self {
            Family::SquaredExponential => "se",
            Family::Matern12 => "matern12",
            Family::Matern32 => "matern32",
            Family::Matern52 => "matern52",
        }
    }
}

// Radial profiles as functions of r²: `f` and `df/d(r²)`. Taking r² (not r)
// keeps the SE kernel free of square roots and makes every slope finite at
// r = 0 except Matérn-1/2's, see `Family::profiles`.

const SQRT_3: f64 = 1.732_050_807_568_877_2;
const SQRT_5: f64 = 2.236_067_977_499_79;

impl Family {
    /// Overwrites each r² in `values` with `scale · f(r²)` and, given `slopes`,
    /// sets those to `df/d(r²)`. Each family is `poly(s)·e^{−s}` for some `s(r²)`;
    /// the exponentials go four at a time ([`exp_nonpositive`]),
    /// where libm's one-at-a-time `exp` was a tenth of an update's time.
    fn profiles(self, values: &mut [f64], scale: f64, slopes: Option<&mut [f64]>) {
        match self {
            Family::SquaredExponential => Form {
                exponent: |r2| 0.5 * r2,
                value: |_, e| e,
                slope: |_, e| -0.5 * e,
            }
            .apply(values, scale, slopes),
            // The slope `−e^{−r}/(2r)` diverges at r = 0, but it is only ever
            // multiplied by some `Δ_k²/ℓ_k² ≤ r²`, which is 0 there, so r = 0 contributes 0.
            Family::Matern12 => Form {
                exponent: f64::sqrt,
                value: |_, e| e,
                slope: |r, e| if r > 0.0 { -0.5 * e / r } else { 0.0 },
            }
            .apply(values, scale, slopes),
            Family::Matern32 => Form {
                exponent: |r2: f64| SQRT_3 * r2.sqrt(),
                value: |s, e| (1.0 + s) * e,
                slope: |_, e| -1.5 * e,
            }
            .apply(values, scale, slopes),
            Family::Matern52 => Form {
                exponent: |r2: f64| SQRT_5 * r2.sqrt(),
                value: |s, e| (1.0 + s + s * s * (1.0 / 3.0)) * e,
                slope: |s, e| -(5.0 / 6.0) * (1.0 + s) * e,
            }
            .apply(values, scale, slopes),
        }
    }
}

/// A family's profile as `poly(s)·e^{−s}`: `s = exponent(r²)`, then with
/// `e = e^{−s}` its `value(s, e)` and `slope(s, e)`.
#[derive(Clone, Copy)]
struct Form<E, V, S> {
    exponent: E,
    value: V,
    slope: S,
}

impl<E: Fn(f64) -> f64, V: Fn(f64, f64) -> f64, S: Fn(f64, f64) -> f64> Form<E, V, S> {
    /// Overwrites each r² in `values` with `scale` times the profile and,
    /// given `slopes`, sets those to its slope, in one pass. Compiled for
    /// AVX2 and FMA where the CPU has them (four values a lane, the square
    /// roots and the exponential included); the operations are the same
    /// correctly rounded IEEE ones (a fused multiply–add included) on every
    /// path, so are the bits.
    fn apply(self, values: &mut [f64], scale: f64, slopes: Option<&mut [f64]>) {
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA, checked just above.
            unsafe { self.apply_avx2(values, scale, slopes) };
            return;
        }
        self.fused(values, scale, slopes);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn apply_avx2(self, values: &mut [f64], scale: f64, slopes: Option<&mut [f64]>) {
        self.fused(values, scale, slopes);
    }

    #[inline(always)]
    fn fused(self, values: &mut [f64], scale: f64, slopes: Option<&mut [f64]>) {
        let Form { exponent, value, slope } = self;
        match slopes {
            Some(slopes) => {
                for (v, out) in values.iter_mut().zip(slopes) {
                    let s = exponent(*v);
                    let e = exp_nonpositive(-s);
                    *out = slope(s, e);
                    *v = value(s, e) * scale;
                }
            }
            None => {
                for v in values {
                    let s = exponent(*v);
                    *v = value(s, exp_nonpositive(-s)) * scale;
                }
            }
        }
    }
}

/// [`Kernel::columns`]: `K(X, x_p)` one column at a time.
pub struct Columns<'a>(Prepared<'a>);

/// Each part of the kernel with what it keeps of `X`.
enum Prepared<'a> {
    /// `X` scaled by the lengthscales (ARD) or as it is, and its rows' squared norms.
    Stationary {
        kernel: &'a Stationary,
        inputs: Cow<'a, DMatrix<f64>>,
        norms: DVector<f64>,
    },
    /// The parts of a sum over `X`'s rows.
    Sum(usize, Vec<Prepared<'a>>),
    /// The parts of a product over `X`'s rows.
    Product(usize, Vec<Prepared<'a>>),
    /// Any other kernel, through [`Kernel::matrix`].
    Direct(&'a Kernel, &'a DMatrix<f64>),
}

impl<'a> Prepared<'a> {
    fn of(kernel: &'a Kernel, x: &'a DMatrix<f64>) -> Self {
        match kernel {
            Kernel::Stationary(s) => {
                let inputs = match s.lengthscales[..] {
                    [_] => Cow::Borrowed(x),
                    _ => Cow::Owned(s.scaled(x, &DMatrix::zeros(0, x.ncols())).0),
                };
                let norms = row_sq_norms(&inputs);
                Prepared::Stationary {
                    kernel: s,
                    inputs,
                    norms,
                }
            }
            Kernel::Sum(parts) => Prepared::Sum(x.nrows(), parts.iter().map(|part| Prepared::of(part, x)).collect()),
            Kernel::Product(parts) => {
                Prepared::Product(x.nrows(), parts.iter().map(|part| Prepared::of(part, x)).collect())
            }
            _ => Prepared::Direct(kernel, x),
        }
    }
}

impl Columns<'_> {
    /// `K(X, x_p)`, `n × 1`.
    pub fn column(&self, p: usize) -> DMatrix<f64> {
        self.0.column(p)
    }
}

impl Prepared<'_> {
    fn column(&self, p: usize) -> DMatrix<f64> {
        match self {
            Prepared::Stationary { kernel, inputs, norms } => {
                let row = inputs.rows(p, 1).into_owned();
                let mut k = sq_dist_with_norms(inputs, norms, &row, kernel.distance_scale());
                kernel.family.profiles(k.as_mut_slice(), kernel.variance, None);
                k
            }
            Prepared::Sum(rows, parts) => {
                let mut k = DMatrix::zeros(*rows, 1);
                for part in parts {
                    k += part.column(p);
                }
                k
            }
            Prepared::Product(rows, parts) => {
                let mut k = DMatrix::from_element(*rows, 1, 1.0);
                for part in parts {
                    k.component_mul_assign(&part.column(p));
                }
                k
            }
            Prepared::Direct(kernel, x) => kernel.matrix(x, &x.rows(p, 1).into_owned()),
        }
    }
}

impl Stationary {
    fn matrix(&self, a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
        let mut k = self.scaled_sq_dist(a, b, None);
        self.family.profiles(k.as_mut_slice(), self.variance, None);
        k
    }

    /// What multiplies plain squared distances into `r²`: `1/ℓ²` for one
    /// lengthscale; 1 for ARD, whose distances come from scaled inputs.
    fn distance_scale(&self) -> f64 {
        match self.lengthscales[..] {
            [l] => 1.0 / (l * l),
            _ => 1.0,
        }
    }

    /// `r²_ij = Σ_k (a_ik − b_jk)²/ℓ_k²`. One lengthscale scales the plain
    /// squared distances, without scaled copies of the inputs (at 784 pixels
    /// those copies, made at every call, were most of the kernel's time); ARD
    /// takes `scaled` copies if the caller has them.
    fn scaled_sq_dist(
        &self,
        a: &DMatrix<f64>,
        b: &DMatrix<f64>,
        scaled: Option<&(DMatrix<f64>, DMatrix<f64>)>,
    ) -> DMatrix<f64> {
        match (&self.lengthscales[..], scaled) {
            ([_], _) => sq_dist_matrix(a, b, self.distance_scale()),
            (_, Some((a_s, b_s))) => sq_dist_matrix(a_s, b_s, 1.0),
            (_, None) => {
                let (a_s, b_s) = self.scaled(a, b);
                sq_dist_matrix(&a_s, &b_s, 1.0)
            }
        }
    }

    /// `K(A, B)`'s [`Profile`] (from the `scaled` inputs, if given).
    fn profile(&self, a: &DMatrix<f64>, b: &DMatrix<f64>, scaled: Option<&(DMatrix<f64>, DMatrix<f64>)>) -> Radial {
        let r2 = self.scaled_sq_dist(a, b, scaled);
        let (mut values, mut slopes) = (r2.clone(), DMatrix::zeros(a.nrows(), b.nrows()));
        self.family
            .profiles(values.as_mut_slice(), 1.0, Some(slopes.as_mut_slice()));
        Radial { r2, values, slopes }
    }

    /// `∂K/∂log σ² = K`, and `∂K/∂log ℓ_k = σ² f'(r²) · (−2 Δ_k²/ℓ_k²)`,
    /// summed with weights `G`; with `rows`, `∂k(a_i, b_j)/∂a_ik = σ² f'(r²) ·
    /// 2 (a_ik − b_jk)/ℓ_k²` summed over j (`W = G ∘ f'(R²)`: `diag(W1) A − W B`),
    /// or the same for `B` (`diag(Wᵀ1) B − Wᵀ A`).
    fn grads(
        &self,
        a: &DMatrix<f64>,
        b: &DMatrix<f64>,
        g: &DMatrix<f64>,
        rows: Rows,
        profile: Option<&Radial>,
    ) -> (DVector<f64>, Option<DMatrix<f64>>) {
        let mut grad = DVector::zeros(1 + self.lengthscales.len());
        if a.nrows() == 0 || b.nrows() == 0 {
            return (grad, rows.zeros(a, b));
        }
        // One lengthscale scales the plain distances; ARD scales the inputs
        // (`Δ` in scaled units is `Δ_k/ℓ_k`).
        let scaled = match self.lengthscales[..] {
            [_] => None,
            _ => Some(self.scaled(a, b)),
        };
        let (a_u, b_u) = scaled.as_ref().map_or((a, b), |(a_s, b_s)| (a_s, b_s));
        let made;
        let Radial { r2, values, slopes } = match profile {
            Some(profile) => profile,
            None => {
                made = self.profile(a, b, scaled.as_ref());
                &made
            }
        };
        let w = slopes.component_mul(g); // G ∘ f'(R²)
        grad[0] = self.variance * values.dot(g);
        // W B, or Wᵀ A for the rows of B: the input gradient's product and the ARD sums' alike.
        let product = match rows {
            Rows::OfB => Some(w.tr_mul(a_u)),
            Rows::OfA => Some(&w * b_u),
            Rows::Neither => None,
        };
        match self.lengthscales[..] {
            // Σ_k Δ_k²/ℓ² is r² itself.
            [_] => grad[1] = -2.0 * self.variance * w.dot(r2),
            _ => {
                // Σ_ij W_ij a_ik b_jk, from whichever product there is.
                let cross: Vec<f64> = match (rows, &product) {
                    (Rows::OfB, Some(wt_a)) => dots(b_u, wt_a),
                    (_, Some(wb)) => dots(a_u, wb),
                    (_, None) => dots(a_u, &(&w * b_u)),
                };
                let sums = weighted_sq_diffs(a_u, b_u, &w, &cross);
                for (gk, sum) in grad.iter_mut().skip(1).zip(sums) {
                    *gk = -2.0 * self.variance * sum;
                }
            }
        }
        let input = product.map(|product| {
            let (own, sums) = match rows {
                Rows::OfB => (b_u, column_totals(&w)),
                _ => (a_u, w.column_sum()),
            };
            let mut out = own.clone();
            for mut col in out.column_iter_mut() {
                col.component_mul_assign(&sums);
            }
            out -= product;
            // One more 1/ℓ_k turns scaled units into Δ/ℓ_k²; unscaled, 1/ℓ².
            for (k, mut col) in out.column_iter_mut().enumerate() {
                let l = match self.lengthscales[..] {
                    [l] => l * l,
                    _ => self.lengthscales[k],
                };
                col *= 2.0 * self.variance / l;
            }
            out
        });
        (grad, input)
    }

    /// Both inputs with column k divided by ℓ_k, so r² is a plain squared distance.
    fn scaled(&self, a: &DMatrix<f64>, b: &DMatrix<f64>) -> (DMatrix<f64>, DMatrix<f64>) {
        let d = a.ncols();
        let inv: Vec<f64> = if self.lengthscales.len() == 1 {
            vec![1.0 / self.lengthscales[0]; d]
        } else {
            assert_eq!(
                self.lengthscales.len(),
                d,
                "kernel: ARD lengthscales do not match the input columns"
            );
            self.lengthscales.iter().map(|l| 1.0 / l).collect()
        };
        (scale_columns(a, &inv), scale_columns(b, &inv))
    }
}

fn scale_columns(x: &DMatrix<f64>, factors: &[f64]) -> DMatrix<f64> {
    let mut out = x.clone();
    for (mut col, &f) in out.column_iter_mut().zip(factors) {
        col *= f;
    }
    out
}

/// Below this fraction of `‖a‖² + ‖b‖²`, a squared distance from the norms is
/// mostly rounding (about `d·ε` of them) and is recomputed directly.
const NEAR: f64 = 1e-6;

/// `R²_ij = scale · ‖a_i − b_j‖²` as `scale (‖a_i‖² + ‖b_j‖² − 2 a_i·b_j)`:
/// one matrix product instead of `|A|·|B|·d` differences. Near-coincident
/// pairs, where that cancels, are recomputed by direct differences, so
/// coincident points are at exactly 0.
fn sq_dist_matrix(a: &DMatrix<f64>, b: &DMatrix<f64>, scale: f64) -> DMatrix<f64> {
    sq_dist_with_norms(a, &row_sq_norms(a), b, scale)
}

/// [`sq_dist_matrix`] with `a`'s row norms made already.
fn sq_dist_with_norms(a: &DMatrix<f64>, a_norms: &DVector<f64>, b: &DMatrix<f64>, scale: f64) -> DMatrix<f64> {
    let b_norms = row_sq_norms(b);
    let mut r2 = DMatrix::zeros(a.nrows(), b.nrows());
    r2.gemm(-2.0, a, &transposed(b), 0.0);
    // A branch-free pass (at d = 8 this loop, not the GEMM, was the
    // distances' time), then the rare near pairs again, directly.
    let near = add_norms(r2.as_mut_slice(), a_norms.as_slice(), b_norms.as_slice(), scale);
    let rows = a.nrows();
    for j in near {
        for i in 0..rows {
            let norms = a_norms[i] + b_norms[j];
            if r2[(i, j)] <= NEAR * norms * scale {
                r2[(i, j)] = (a.row(i) - b.row(j)).norm_squared() * scale;
            }
        }
    }
    r2
}

/// Adds `‖a_i‖² + ‖b_j‖²` to every `−2a_iᵀb_j` of the column-major `r2` and
/// multiplies by `scale` (a multiply here is free where a pass of its own
/// cost a tenth of the kernel); returns the columns with a pair near enough
/// to lose digits. Compiled for AVX2 where the CPU has it (the same
/// operations on every path).
fn add_norms(r2: &mut [f64], a_norms: &[f64], b_norms: &[f64], scale: f64) -> Vec<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { add_norms_avx2(r2, a_norms, b_norms, scale) };
    }
    add_norms_portable(r2, a_norms, b_norms, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn add_norms_avx2(r2: &mut [f64], a_norms: &[f64], b_norms: &[f64], scale: f64) -> Vec<usize> {
    add_norms_portable(r2, a_norms, b_norms, scale)
}

#[inline(always)]
fn add_norms_portable(r2: &mut [f64], a_norms: &[f64], b_norms: &[f64], scale: f64) -> Vec<usize> {
    let rows = a_norms.len();
    let mut near = Vec::new();
    if rows == 0 {
        return near;
    }
    for (j, (col, &b_norm)) in r2.chunks_exact_mut(rows).zip(b_norms).enumerate() {
        // Counted, not branched on, so that the loop vectorises.
        let mut near_pairs = 0usize;
        for (r, &a_norm) in col.iter_mut().zip(a_norms) {
            let norms = a_norm + b_norm;
            let sum = *r + norms;
            near_pairs += usize::from(sum <= NEAR * norms);
            *r = sum * scale;
        }
        if near_pairs > 0 {
            near.push(j);
        }
    }
    near
}

/// Each column's sum, as nalgebra's `row_sum_tr` adds it (in order, from
/// +0), over the contiguous column rather than through its iterator, which
/// steps one entry at a time.
fn column_totals(w: &DMatrix<f64>) -> DVector<f64> {
    if w.nrows() == 0 {
        return DVector::zeros(w.ncols());
    }
    DVector::from_iterator(
        w.ncols(),
        w.as_slice()
            .chunks_exact(w.nrows())
            .map(|col| col.iter().fold(0.0, |total, &x| total + x)),
    )
}

fn row_sq_norms(x: &DMatrix<f64>) -> DVector<f64> {
    let mut norms = DVector::zeros(x.nrows());
    for col in x.column_iter() {
        norms.zip_apply(&col, |n, v| *n += v * v);
    }
    norms
}

/// `Σ_ij W_ij (a_ik − b_jk)²` for every input k, expanded into
/// `Σ_i a_ik² (W1)_i − 2 cross_k + Σ_j b_jk² (Wᵀ1)_j` with `cross_k = Σ_ij W_ij a_ik b_jk`.
fn weighted_sq_diffs(a: &DMatrix<f64>, b: &DMatrix<f64>, w: &DMatrix<f64>, cross: &[f64]) -> Vec<f64> {
    let (row_sums, col_sums) = (w.column_sum(), column_totals(w));
    (0..a.ncols())
        .map(|k| {
            let (ak, bk) = (a.column(k), b.column(k));
            ak.component_mul(&ak).dot(&row_sums) - 2.0 * cross[k] + bk.component_mul(&bk).dot(&col_sums)
        })
        .collect()
}

/// The dot products of `x`'s and `y`'s columns, one per column.
fn dots(x: &DMatrix<f64>, y: &DMatrix<f64>) -> Vec<f64> {
    x.column_iter().zip(y.column_iter()).map(|(x, y)| x.dot(&y)).collect()
}

pub(super) fn concat(grads: impl Iterator<Item = DVector<f64>>) -> DVector<f64> {
    let all: Vec<f64> = grads.flat_map(|g| g.data.as_vec().clone()).collect();
    DVector::from_vec(all)
}

pub(super) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn push_part_names(parts: &[Kernel], base: &str, out: &mut Vec<String>) {
    for (i, part) in parts.iter().enumerate() {
        part.push_names(&format!("{base}[{i}]"), out);
    }
}

fn validate_parts(parts: &[Kernel], d: usize, base: &str) -> Result<()> {
    if parts.is_empty() {
        return Err(config(format!("{base}: no parts")));
    }
    for (i, part) in parts.iter().enumerate() {
        part.validate_at(d, &format!("{base}[{i}]"))?;
    }
    Ok(())
}

fn check_positive(name: &str, x: f64) -> Result<()> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(config(format!("{name} must be positive and finite, got {x}")))
    }
}

pub(super) fn config(msg: String) -> ModelError {
    ModelError::Config(msg)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const FAMILIES: [Family; 4] = [
        Family::SquaredExponential,
        Family::Matern12,
        Family::Matern32,
        Family::Matern52,
    ];

    fn random_matrix(rng: &mut ChaCha8Rng, rows: usize, cols: usize, lo: f64, hi: f64) -> DMatrix<f64> {
        DMatrix::from_fn(rows, cols, |_, _| rng.random_range(lo..hi))
    }

    /// A (8 × 3) and B (6 × 3) where two rows of B equal rows of A (r = 0)
    /// and one more shares a single coordinate (Δ_k = 0 with r > 0).
    fn inputs(rng: &mut ChaCha8Rng) -> (DMatrix<f64>, DMatrix<f64>) {
        let a = random_matrix(rng, 8, 3, -1.5, 1.5);
        let mut b = random_matrix(rng, 6, 3, -1.5, 1.5);
        b.row_mut(0).copy_from(&a.row(1));
        b.row_mut(3).copy_from(&a.row(5));
        b[(4, 0)] = a[(2, 0)];
        (a, b)
    }

    fn ard(family: Family) -> Kernel {
        Kernel::stationary(family, 1.7, vec![0.7, 1.3, 2.1])
    }

    #[test]
    fn a_column_at_a_time_is_the_matrix_to_the_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let mut x = random_matrix(&mut rng, 40, 3, -1.5, 1.5);
        // A repeated row: a pair at distance 0, recomputed directly.
        let repeated = x.row(3).into_owned();
        x.row_mut(17).copy_from(&repeated);
        let kernels = [
            ard(Family::Matern52),
            Kernel::stationary(Family::Matern32, 0.8, vec![0.9]),
            Kernel::Sum(vec![
                ard(Family::SquaredExponential),
                Kernel::Constant { variance: 0.3 },
            ]),
            Kernel::Product(vec![ard(Family::Matern12), Kernel::Linear { variance: 0.5 }]),
        ];
        for kernel in &kernels {
            let columns = kernel.columns(&x);
            for p in [0, 3, 17, 39] {
                let want = kernel.matrix(&x, &x.rows(p, 1).into_owned());
                let got = columns.column(p);
                let same = want.iter().zip(got.iter()).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same && got.shape() == (40, 1), "{kernel:?}, column {p}");
            }
        }
    }

    fn shared(family: Family) -> Kernel {
        Kernel::stationary(family, 0.9, vec![0.8])
    }

    /// Every kernel shape the gradient tests cover, for 3 input columns.
    fn all_kernels() -> Vec<Kernel> {
        let mut kernels: Vec<Kernel> = FAMILIES.iter().flat_map(|&f| [shared(f), ard(f)]).collect();
        kernels.push(Kernel::Constant { variance: 0.6 });
        kernels.push(Kernel::Linear { variance: 0.7 });
        kernels.push(Kernel::Sum(vec![
            shared(Family::Matern52),
            Kernel::Linear { variance: 0.3 },
        ]));
        kernels.push(Kernel::Sum(vec![
            ard(Family::Matern52),
            Kernel::stationary(Family::SquaredExponential, 0.4, vec![2.0, 0.5, 1.1]),
        ]));
        kernels.push(Kernel::Product(vec![
            shared(Family::Matern32),
            Kernel::Constant { variance: 2.5 },
        ]));
        kernels.push(Kernel::Product(vec![
            ard(Family::SquaredExponential),
            ard(Family::Matern12),
            Kernel::Constant { variance: 1.3 },
        ]));
        kernels.push(Kernel::Sum(vec![
            Kernel::Product(vec![shared(Family::Matern12), ard(Family::Matern32)]),
            Kernel::Constant { variance: 0.2 },
        ]));
        kernels
    }

    /// Central differences of `objective` in each log-parameter.
    fn finite_diff(kernel: &Kernel, objective: impl Fn(&Kernel) -> f64) -> Vec<f64> {
        finite_diff_step(kernel, 1e-5, objective)
    }

    /// [`finite_diff`] with step `h` in each of the kernel's coordinates.
    pub(in crate::model::math) fn finite_diff_step(
        kernel: &Kernel,
        h: f64,
        objective: impl Fn(&Kernel) -> f64,
    ) -> Vec<f64> {
        let p0 = kernel.log_params();
        (0..p0.len())
            .map(|i| {
                let mut k = kernel.clone();
                let mut p = p0.clone();
                p[i] = p0[i] + h;
                k.set_log_params(&p);
                let up = objective(&k);
                p[i] = p0[i] - h;
                k.set_log_params(&p);
                let down = objective(&k);
                (up - down) / (2.0 * h)
            })
            .collect()
    }

    fn assert_grad_close(kernel: &Kernel, analytic: &DVector<f64>, numeric: &[f64], what: &str) {
        assert_grads_within(kernel, analytic, numeric, 1e-8, what);
    }

    /// Each coordinate's analytic gradient within 1e-5 of the finite
    /// difference, relative to it (or to `floor` where it is smaller).
    pub(in crate::model::math) fn assert_grads_within(
        kernel: &Kernel,
        analytic: &DVector<f64>,
        numeric: &[f64],
        floor: f64,
        what: &str,
    ) {
        assert_eq!(analytic.len(), numeric.len(), "{what}: gradient length");
        for ((name, &a), &n) in kernel.param_names().iter().zip(analytic.iter()).zip(numeric) {
            let rel = (a - n).abs() / n.abs().max(floor);
            assert!(
                rel < 1e-5,
                "{what} {name}: analytic {a} vs finite difference {n} (rel {rel:e})"
            );
        }
    }

    #[test]
    fn matrix_grad_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (a, b) = inputs(&mut rng);
        let g_ab = random_matrix(&mut rng, a.nrows(), b.nrows(), -1.0, 1.0);
        let g_aa = random_matrix(&mut rng, a.nrows(), a.nrows(), -1.0, 1.0);
        for kernel in all_kernels() {
            for (x, g, what) in [(&b, &g_ab, "K(A, B)"), (&a, &g_aa, "K(A, A)")] {
                let analytic = kernel.matrix_grad(&a, x, g);
                let numeric = finite_diff(&kernel, |k| k.matrix(&a, x).component_mul(g).sum());
                assert_grad_close(&kernel, &analytic, &numeric, &format!("{kernel:?} {what}"));
            }
        }
    }

    #[test]
    fn input_grad_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let (a, b) = inputs(&mut rng);
        // Perturb A off B's rows: Matérn-1/2 has a kink where points coincide.
        let a = a.map(|v| v + 0.013);
        let g = random_matrix(&mut rng, a.nrows(), b.nrows(), -1.0, 1.0);
        for kernel in all_kernels() {
            let analytic = kernel.input_grad(&a, &b, &g);
            assert_input_grad(&kernel, (&a, &b, &g), Rows::OfA, &analytic, a.ncols());
        }
    }

    /// `input`, the gradient of `Σ G ∘ K(A, B)` in the rows of `A` or of `B`
    /// (`rows`), against central differences in their first `coordinates` columns.
    pub(in crate::model::math) fn assert_input_grad(
        kernel: &Kernel,
        (a, b, g): (&DMatrix<f64>, &DMatrix<f64>, &DMatrix<f64>),
        rows: Rows,
        input: &DMatrix<f64>,
        coordinates: usize,
    ) {
        let h = 1e-6;
        let value = |a: &DMatrix<f64>, b: &DMatrix<f64>| kernel.matrix(a, b).component_mul(g).sum();
        let moved = if rows == Rows::OfA { a } else { b };
        assert_eq!(input.shape(), moved.shape(), "{kernel:?} {rows:?}");
        for i in 0..moved.nrows() {
            for k in 0..coordinates {
                let (mut plus, mut minus) = (moved.clone(), moved.clone());
                plus[(i, k)] += h;
                minus[(i, k)] -= h;
                let numeric = match rows {
                    Rows::OfA => (value(&plus, b) - value(&minus, b)) / (2.0 * h),
                    _ => (value(a, &plus) - value(a, &minus)) / (2.0 * h),
                };
                let err = (input[(i, k)] - numeric).abs() / numeric.abs().max(1e-6);
                assert!(
                    err < 1e-5,
                    "{kernel:?} {rows:?} [{i},{k}]: {} vs {numeric}",
                    input[(i, k)]
                );
            }
        }
    }

    #[test]
    fn one_pass_gives_the_parameter_and_either_inputs_gradient() {
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let (a, b) = inputs(&mut rng);
        // Off each other's rows: Matérn-1/2 has a kink where points coincide.
        let b = b.map(|v| v - 0.017);
        let g = random_matrix(&mut rng, a.nrows(), b.nrows(), -1.0, 1.0);
        for kernel in all_kernels() {
            for rows in [Rows::OfA, Rows::OfB] {
                let (theta, input) = kernel.grads(&a, &b, &g, rows);
                let numeric = finite_diff(&kernel, |k| k.matrix(&a, &b).component_mul(&g).sum());
                assert_grad_close(&kernel, &theta, &numeric, &format!("{kernel:?} {rows:?}"));
                let input = input.expect("asked for");
                assert_input_grad(&kernel, (&a, &b, &g), rows, &input, a.ncols());
            }
            assert!(kernel.grads(&a, &b, &g, Rows::Neither).1.is_none());
        }
    }

    #[test]
    fn diag_input_grad_matches_finite_differences() {
        let x = [0.4, -1.3, 0.9];
        let mut kernels = all_kernels();
        // Where k(x, x) depends on x: a linear part inside a product and a sum.
        kernels.push(Kernel::Product(vec![
            Kernel::Linear { variance: 0.7 },
            ard(Family::Matern52),
            Kernel::Linear { variance: 1.1 },
        ]));
        kernels.push(Kernel::Sum(vec![
            Kernel::Product(vec![
                Kernel::Linear { variance: 0.5 },
                Kernel::Constant { variance: 2.0 },
            ]),
            Kernel::Linear { variance: 0.3 },
        ]));
        for kernel in kernels {
            assert_diag_input_grad(&kernel, &x, x.len());
        }
    }

    /// `∂k(x, x)/∂x` against central differences in the first `coordinates`
    /// inputs of `x`.
    pub(in crate::model::math) fn assert_diag_input_grad(kernel: &Kernel, x: &[f64], coordinates: usize) {
        let h = 1e-6;
        let analytic = kernel.diag_input_grad(x);
        let diag = |p: &[f64]| kernel.diag(&DMatrix::from_row_slice(1, p.len(), p))[0];
        for k in 0..coordinates {
            let (mut plus, mut minus) = (x.to_vec(), x.to_vec());
            plus[k] += h;
            minus[k] -= h;
            let numeric = (diag(&plus) - diag(&minus)) / (2.0 * h);
            assert!(
                (analytic[k] - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "{kernel:?} ∂k(x,x)/∂x[{k}] at {x:?}: {} vs {numeric}",
                analytic[k]
            );
        }
    }

    #[test]
    fn diag_grad_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let (a, _) = inputs(&mut rng);
        let g = DVector::from_fn(a.nrows(), |_, _| rng.random_range(-1.0..1.0));
        for kernel in all_kernels() {
            let analytic = kernel.diag_grad(&a, &g);
            let numeric = finite_diff(&kernel, |k| k.diag(&a).dot(&g));
            assert_grad_close(&kernel, &analytic, &numeric, &format!("{kernel:?} diag"));
        }
    }

    #[test]
    fn lengthscale_gradient_is_zero_at_coincident_points() {
        // G weights only the r = 0 pairs (the diagonal of K(A, A)): those do not
        // depend on ℓ, and Matérn-1/2 must give 0 there, not NaN.
        let a = DMatrix::from_row_slice(2, 3, &[0.1, 0.2, 0.3, -1.0, 0.5, 2.0]);
        let g = DMatrix::identity(2, 2);
        for family in FAMILIES {
            let grad = ard(family).matrix_grad(&a, &a, &g);
            assert!((grad[0] - 2.0 * 1.7).abs() < 1e-14, "{family:?}: {grad}");
            // Zero up to the rounding of the expanded Σ W (a − b)².
            assert!(grad.iter().skip(1).all(|&v| v.abs() < 1e-13), "{family:?}: {grad}");
        }
    }

    #[test]
    fn closed_form_values() {
        let var = 1.7;
        // Points 0 and 2 with ℓ = 2 are at r = 1.
        let a = DMatrix::from_row_slice(1, 1, &[0.0]);
        let b = DMatrix::from_row_slice(1, 1, &[2.0]);
        let e = std::f64::consts::E;
        let (s3, s5) = (3f64.sqrt(), 5f64.sqrt());
        let expected = [
            (Family::SquaredExponential, var * e.powf(-0.5)),
            (Family::Matern12, var / e),
            (Family::Matern32, var * (1.0 + s3) * (-s3).exp()),
            (Family::Matern52, var * (1.0 + s5 + 5.0 / 3.0) * (-s5).exp()),
        ];
        for (family, want) in expected {
            let k = Kernel::stationary(family, var, vec![2.0]);
            let got = k.matrix(&a, &b)[(0, 0)];
            assert!((got - want).abs() < 1e-14, "{family:?}: {got} vs {want}");
            assert!((k.matrix(&b, &a)[(0, 0)] - want).abs() < 1e-14, "{family:?} swapped");
            assert_eq!(k.matrix(&a, &a)[(0, 0)], var, "{family:?}: k(x, x)");
            assert_eq!(k.prior_variance(), var);
        }
        // ARD: (0, 0) to (3, 8) with ℓ = (3, 4) is at r² = 1 + 4 = 5.
        let a = DMatrix::from_row_slice(1, 2, &[0.0, 0.0]);
        let b = DMatrix::from_row_slice(1, 2, &[3.0, 8.0]);
        let k = Kernel::stationary(Family::SquaredExponential, 2.0, vec![3.0, 4.0]);
        assert!((k.matrix(&a, &b)[(0, 0)] - 2.0 * (-2.5f64).exp()).abs() < 1e-15);
        let k = Kernel::stationary(Family::Matern12, 2.0, vec![3.0, 4.0]);
        assert!((k.matrix(&a, &b)[(0, 0)] - 2.0 * (-s5).exp()).abs() < 1e-15);

        let c = Kernel::Constant { variance: 0.3 };
        assert_eq!(c.matrix(&a, &b)[(0, 0)], 0.3);
        assert_eq!(c.prior_variance(), 0.3);
        let se = Kernel::stationary(Family::SquaredExponential, 2.0, vec![3.0, 4.0]);
        let sum = Kernel::Sum(vec![se.clone(), c.clone()]);
        let prod = Kernel::Product(vec![se, c]);
        assert!((sum.matrix(&a, &b)[(0, 0)] - (2.0 * (-2.5f64).exp() + 0.3)).abs() < 1e-15);
        assert!((prod.matrix(&a, &b)[(0, 0)] - 0.6 * (-2.5f64).exp()).abs() < 1e-15);
        assert!((sum.prior_variance() - 2.3).abs() < 1e-15);
        assert!((prod.prior_variance() - 0.6).abs() < 1e-15);
    }

    /// One entry straight from the definition, for checking the column loops.
    fn reference_entry(s: &Stationary, x: &[f64], y: &[f64]) -> f64 {
        let r2: f64 = (0..x.len())
            .map(|k| {
                let l = if s.lengthscales.len() == 1 {
                    s.lengthscales[0]
                } else {
                    s.lengthscales[k]
                };
                ((x[k] - y[k]) / l).powi(2)
            })
            .sum();
        let r = r2.sqrt();
        let f = match s.family {
            Family::SquaredExponential => (-0.5 * r2).exp(),
            Family::Matern12 => (-r).exp(),
            Family::Matern32 => (1.0 + 3f64.sqrt() * r) * (-(3f64.sqrt()) * r).exp(),
            Family::Matern52 => (1.0 + 5f64.sqrt() * r + 5.0 * r2 / 3.0) * (-(5f64.sqrt()) * r).exp(),
        };
        s.variance * f
    }

    #[test]
    fn matrix_matches_pairwise_definition() {
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let a = random_matrix(&mut rng, 9, 3, -2.0, 2.0);
        let b = random_matrix(&mut rng, 5, 3, -2.0, 2.0);
        for family in FAMILIES {
            for kernel in [shared(family), ard(family)] {
                let Kernel::Stationary(s) = &kernel else { unreachable!() };
                let k = kernel.matrix(&a, &b);
                assert_eq!(k.shape(), (9, 5));
                for i in 0..9 {
                    for j in 0..5 {
                        let x: Vec<f64> = a.row(i).iter().copied().collect();
                        let y: Vec<f64> = b.row(j).iter().copied().collect();
                        let want = reference_entry(s, &x, &y);
                        assert!(
                            (k[(i, j)] - want).abs() < 1e-13,
                            "{family:?} ({i}, {j}): {} vs {want}",
                            k[(i, j)]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_linear_kernel_is_a_scaled_inner_product() {
        let a = DMatrix::from_row_slice(2, 2, &[1.0, 2.0, -3.0, 0.5]);
        let b = DMatrix::from_row_slice(1, 2, &[4.0, -1.0]);
        let k = Kernel::Linear { variance: 0.5 };
        assert_eq!(k.matrix(&a, &b), DMatrix::from_row_slice(2, 1, &[1.0, -6.25]));
        assert_eq!(k.diag(&a), DVector::from_vec(vec![2.5, 4.625]));
    }

    #[test]
    fn the_vector_paths_give_the_portable_bits() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let r2: Vec<f64> = (0..1001)
            .map(|i| if i % 50 == 0 { 0.0 } else { rng.random_range(0.0..40.0) })
            .collect();
        let form = Form {
            exponent: |r2: f64| SQRT_5 * r2.sqrt(),
            value: |s: f64, e: f64| (1.0 + s + s * s / 3.0) * e,
            slope: |s: f64, e: f64| -(5.0 / 6.0) * (1.0 + s) * e,
        };
        let (mut dispatched, mut portable) = (r2.clone(), r2.clone());
        let (mut dispatched_slopes, mut portable_slopes) = (vec![0.0; r2.len()], vec![0.0; r2.len()]);
        form.apply(&mut dispatched, 1.7, Some(&mut dispatched_slopes));
        form.fused(&mut portable, 1.7, Some(&mut portable_slopes));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&dispatched), bits(&portable));
        assert_eq!(bits(&dispatched_slopes), bits(&portable_slopes));

        let (a_norms, b_norms): (Vec<f64>, Vec<f64>) = (
            (0..37).map(|_| rng.random_range(0.0..9.0)).collect(),
            (0..11).map(|_| rng.random_range(0.0..9.0)).collect(),
        );
        let mut cross: Vec<f64> = (0..37 * 11).map(|_| rng.random_range(-9.0..0.0)).collect();
        cross[5 * 37 + 3] = -(a_norms[3] + b_norms[5]); // a pair at distance 0
        let (mut dispatched, mut portable) = (cross.clone(), cross);
        let near = add_norms(&mut dispatched, &a_norms, &b_norms, 0.3);
        assert_eq!(near, add_norms_portable(&mut portable, &a_norms, &b_norms, 0.3));
        assert!(near.contains(&5), "the pair at distance 0 is near: {near:?}");
        assert_eq!(bits(&dispatched), bits(&portable));
    }

    #[test]
    fn close_points_far_from_the_origin_keep_their_distance() {
        // ‖a‖² ≈ 3e8 while r² ≈ 1e-6: the expansion through the norms would
        // be off by percents; the direct recomputation loses only what scaling
        // by 1/ℓ before subtracting loses (1e-9 of Δ).
        let a = DMatrix::from_row_slice(2, 3, &[1e4, -1e4, 1e4, 1e4, -1e4, 1e4 + 1e-3]);
        for family in FAMILIES {
            let kernel = shared(family);
            let Kernel::Stationary(s) = &kernel else { unreachable!() };
            let k = kernel.matrix(&a, &a);
            let want = reference_entry(s, &[1e4, -1e4, 1e4], &[1e4, -1e4, 1e4 + 1e-3]);
            assert!(
                (k[(0, 1)] - want).abs() < 1e-8 * want,
                "{family:?}: {} vs {want}",
                k[(0, 1)]
            );
            assert_eq!(
                k[(0, 0)],
                s.variance,
                "{family:?}: a point is at distance 0 from itself"
            );
        }
    }

    #[test]
    fn gram_matrix_is_symmetric_psd_and_matches_diag() {
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        for seed_set in 0..3 {
            let a = random_matrix(&mut rng, 25, 3, -2.0, 2.0);
            for kernel in all_kernels() {
                let k = kernel.matrix(&a, &a);
                let what = format!("set {seed_set}, {kernel:?}");
                assert!((&k - k.transpose()).amax() < 1e-14, "{what}: not symmetric");
                assert!((k.diagonal() - kernel.diag(&a)).amax() < 1e-14, "{what}: diag");
                let jittered = k + DMatrix::identity(25, 25) * 1e-10;
                assert!(jittered.cholesky().is_some(), "{what}: not positive semidefinite");
            }
        }
    }

    #[test]
    fn empty_inputs_give_empty_results() {
        let a = DMatrix::<f64>::zeros(0, 3);
        let b = DMatrix::from_element(4, 3, 0.5);
        for kernel in all_kernels() {
            assert_eq!(kernel.matrix(&a, &b).shape(), (0, 4));
            assert_eq!(kernel.matrix(&b, &a).shape(), (4, 0));
            assert_eq!(kernel.diag(&a).len(), 0);
            let grad = kernel.matrix_grad(&a, &b, &DMatrix::zeros(0, 4));
            assert_eq!(grad, DVector::zeros(kernel.n_params()));
        }
    }

    #[test]
    fn log_params_round_trip_and_names() {
        for kernel in all_kernels() {
            let p = kernel.log_params();
            assert_eq!(p.len(), kernel.n_params());
            let mut copy = kernel.clone();
            copy.set_log_params(&p);
            for (x, y) in copy.log_params().iter().zip(&p) {
                assert!((x - y).abs() < 1e-15, "{kernel:?}");
            }
            let names = kernel.param_names();
            assert_eq!(names.len(), kernel.n_params());
            let unique: std::collections::HashSet<_> = names.iter().collect();
            assert_eq!(unique.len(), names.len(), "{names:?}");
        }
        let mut k = Kernel::Sum(vec![ard(Family::Matern52), Kernel::Constant { variance: 1.0 }]);
        assert_eq!(
            k.param_names(),
            [
                "sum[0].matern52.variance",
                "sum[0].matern52.lengthscale[0]",
                "sum[0].matern52.lengthscale[1]",
                "sum[0].matern52.lengthscale[2]",
                "sum[1].constant.variance"
            ]
        );
        k.set_log_params(&[2f64.ln(), 0.0, 3f64.ln(), 0.5f64.ln(), 4f64.ln()]);
        let Kernel::Sum(parts) = &k else { unreachable!() };
        let Kernel::Stationary(s) = &parts[0] else {
            unreachable!()
        };
        assert!((s.variance - 2.0).abs() < 1e-15);
        assert!((s.lengthscales[1] - 3.0).abs() < 1e-15);
        assert!((s.lengthscales[2] - 0.5).abs() < 1e-15);
        assert!(matches!(parts[1], Kernel::Constant { variance } if (variance - 4.0).abs() < 1e-14));
        assert_eq!(
            shared(Family::SquaredExponential).param_names(),
            ["se.variance", "se.lengthscale"]
        );
    }

    #[test]
    fn serde_json_round_trip() {
        for kernel in all_kernels() {
            let json = serde_json::to_string(&kernel).unwrap();
            let back: Kernel = serde_json::from_str(&json).unwrap();
            assert_eq!(back, kernel, "{json}");
        }
        let json = r#"{"stationary": {"family": "rbf", "variance": 1.0, "lengthscales": [0.5]}}"#;
        let k: Kernel = serde_json::from_str(json).unwrap();
        assert_eq!(k, Kernel::stationary(Family::SquaredExponential, 1.0, vec![0.5]));
    }

    #[test]
    fn validate_refuses_bad_configs() {
        for kernel in all_kernels() {
            assert!(kernel.validate(3).is_ok(), "{kernel:?}");
        }
        assert!(shared(Family::Matern32).validate(7).is_ok());
        let bad = [
            Kernel::stationary(Family::Matern52, 0.0, vec![1.0]),
            Kernel::stationary(Family::Matern52, -1.0, vec![1.0]),
            Kernel::stationary(Family::Matern52, f64::NAN, vec![1.0]),
            Kernel::stationary(Family::Matern52, f64::INFINITY, vec![1.0]),
            Kernel::stationary(Family::Matern52, 1.0, vec![]),
            Kernel::stationary(Family::Matern52, 1.0, vec![0.0]),
            Kernel::stationary(Family::Matern52, 1.0, vec![1.0, f64::NAN, 1.0]),
            Kernel::stationary(Family::Matern52, 1.0, vec![1.0, -2.0, 1.0]),
            Kernel::stationary(Family::Matern52, 1.0, vec![1.0, 2.0]), // ARD count != 3
            Kernel::stationary(Family::Matern52, 1.0, vec![1.0, 2.0, 3.0, 4.0]),
            Kernel::Constant { variance: 0.0 },
            Kernel::Constant {
                variance: f64::NEG_INFINITY,
            },
            Kernel::Sum(vec![]),
            Kernel::Product(vec![]),
            Kernel::Sum(vec![ard(Family::Matern12), Kernel::Constant { variance: -1.0 }]),
            Kernel::Product(vec![Kernel::Sum(vec![ard(Family::Matern12), Kernel::Product(vec![])])]),
        ];
        for kernel in bad {
            match kernel.validate(3) {
                Err(ModelError::Config(msg)) => assert!(!msg.is_empty()),
                other => panic!("{kernel:?} gave {other:?}"),
            }
        }
        let err = Kernel::Sum(vec![ard(Family::Matern12), Kernel::Constant { variance: -1.0 }]).validate(3);
        assert!(format!("{err:?}").contains("sum[1].constant.variance"), "{err:?}");
    }
}
