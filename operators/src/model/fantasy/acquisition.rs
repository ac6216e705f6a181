//! Acquisition functions of one or several models' latent marginals, with
//! their gradients in the input (for the local refinement of
//! [`propose`](super::propose)). Larger is better for every one of them.

use nalgebra::DVector;

use super::PointMarginals;
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::{Likelihood, Predictive};
use crate::model::math::special::ndtr;
use crate::model::posterior::Marginals;

/// `model` indexes the models handed to [`propose_batch`](super::propose_batch).
#[derive(Debug, Clone, PartialEq)]
pub enum Acquisition {
    /// `E[max(0, incumbent − f(x))]` of a one-latent model (of `f − incumbent`
    /// with `maximize`); the incumbent moves to a fantasy's label when that is
    /// better (the "kriging believer").
    ExpectedImprovement {
        /// The model of `f`.
        model: usize,
        /// The best value so far.
        incumbent: f64,
        /// Whether larger values are better.
        maximize: bool,
    },
    /// `−μ + κσ` (with `maximize`, `μ + κσ`).
    UpperConfidenceBound {
        /// The model of `f`.
        model: usize,
        /// How much the standard deviation counts against the mean.
        kappa: f64,
        /// Whether larger values are better.
        maximize: bool,
    },
    /// The entropy of the predictive distribution of `y` (for moments, of a
    /// Gaussian with the predictive variance).
    Entropy {
        /// The model whose predictive it is.
        model: usize,
    },
    /// `p(y = 1)` of a Bernoulli model: the probability that `x` is feasible.
    Feasibility {
        /// The Bernoulli model.
        model: usize,
    },
    /// The product of the factors (expected improvement × feasibility, ...).
    Product(Vec<Acquisition>),
}

/// A value and its partial derivatives in each model's latent means and variances.
struct Partials {
    value: f64,
    /// Per model, per latent `∂/∂μ_c` and `∂/∂v_c`.
    d_mean: Vec<Vec<f64>>,
    d_var: Vec<Vec<f64>>,
}

impl Acquisition {
    /// Refuses model indices out of range and models an acquisition cannot use.
    pub fn validate(&self, likelihoods: &[&Likelihood]) -> Result<()> {
        let model = |i: usize| {
            likelihoods.get(i).copied().ok_or_else(|| {
                ModelError::Config(format!(
                    "the acquisition names model {i}; there are {}",
                    likelihoods.len()
                ))
            })
        };
        let needs = |ok: bool, what: &str, lik: &Likelihood| {
            if ok {
                Ok(())
            } else {
                Err(ModelError::Config(format!(
                    "{what} needs {}; the model is {}",
                    self.needs(),
                    lik.name()
                )))
            }
        };
        match self {
            Acquisition::ExpectedImprovement {
                model: i, incumbent, ..
            } => {
                let lik = model(*i)?;
                if !incumbent.is_finite() {
                    return Err(ModelError::Config(
                        "expected improvement needs a finite incumbent".into(),
                    ));
                }
                needs(has_moments(lik), "expected improvement", lik)
            }
            Acquisition::UpperConfidenceBound { model: i, kappa, .. } => {
                let lik = model(*i)?;
                if !(kappa.is_finite() && *kappa >= 0.0) {
                    return Err(ModelError::Config(format!(
                        "a confidence bound needs κ ≥ 0, got {kappa}"
                    )));
                }
                needs(has_moments(lik), "a confidence bound", lik)
            }
            Acquisition::Entropy { model: i } => model(*i).map(|_| ()),
            Acquisition::Feasibility { model: i } => {
                let lik = model(*i)?;
                needs(matches!(lik, Likelihood::Bernoulli { .. }), "feasibility", lik)
            }
            Acquisition::Product(factors) if factors.is_empty() => {
                Err(ModelError::Config("a product of acquisitions needs a factor".into()))
            }
            Acquisition::Product(factors) => factors.iter().try_for_each(|f| f.validate(likelihoods)),
        }
    }

    fn needs(&self) -> &'static str {
        match self {
            Acquisition::Feasibility { .. } => "a Bernoulli model",
            _ => "a model of real-valued outputs (gaussian or student-t)",
        }
    }

    /// The value at every row the models' marginals were computed at.
    pub fn values(&self, likelihoods: &[&Likelihood], marginals: &[Marginals]) -> Vec<f64> {
        let n = marginals.first().map_or(0, |m| m.mean.nrows());
        // One row's latent means and variances per model, reused row to row.
        let mut rows: Vec<(Vec<f64>, Vec<f64>)> = marginals
            .iter()
            .map(|m| (vec![0.0; m.mean.ncols()], vec![0.0; m.var.ncols()]))
            .collect();
        (0..n)
            .map(|i| {
                for ((mean, var), m) in rows.iter_mut().zip(marginals) {
                    mean.iter_mut()
                        .zip(m.mean.row(i).iter())
                        .for_each(|(to, from)| *to = *from);
                    var.iter_mut()
                        .zip(m.var.row(i).iter())
                        .for_each(|(to, from)| *to = *from);
                }
                let point: Vec<(&[f64], &[f64])> = rows.iter().map(|(m, v)| (&m[..], &v[..])).collect();
                self.partials(likelihoods, &point, false).value
            })
            .collect()
    }

    /// The value at one point and its gradient in the point.
    pub fn value_and_grad(&self, likelihoods: &[&Likelihood], points: &[PointMarginals]) -> (f64, DVector<f64>) {
        let point: Vec<(&[f64], &[f64])> = points.iter().map(|p| (&p.mean[..], &p.var[..])).collect();
        let partials = self.partials(likelihoods, &point, true);
        let d = points.first().map_or(0, |p| p.d_mean.first().map_or(0, |g| g.len()));
        let mut grad = DVector::zeros(d);
        for (p, model) in points.iter().enumerate() {
            for (c, g) in partials.d_mean[p].iter().enumerate() {
                grad.axpy(*g, &model.d_mean[c], 1.0);
            }
            for (c, g) in partials.d_var[p].iter().enumerate() {
                grad.axpy(*g, &model.d_var[c], 1.0);
            }
        }
        (partials.value, grad)
    }

    /// After a fantasy of label `y` from `model`: expected improvement takes
    /// it as its incumbent if it is better.
    pub fn believe(&mut self, model: usize, y: f64) {
        match self {
            Acquisition::ExpectedImprovement {
                model: m,
                incumbent,
                maximize,
            } if *m == model => {
                *incumbent = if *maximize { incumbent.max(y) } else { incumbent.min(y) };
            }
            Acquisition::Product(factors) => factors.iter_mut().for_each(|f| f.believe(model, y)),
            _ => {}
        }
    }

    /// `point[p]` is model `p`'s latent means and variances.
    fn partials(&self, likelihoods: &[&Likelihood], point: &[(&[f64], &[f64])], grad: bool) -> Partials {
        let (p, [value, d_mean, d_var]) = match *self {
            Acquisition::Product(ref factors) => return product(factors, likelihoods, point, grad),
            Acquisition::ExpectedImprovement {
                model,
                incumbent,
                maximize,
            } => (
                model,
                expected_improvement(point[model].0[0], point[model].1[0], incumbent, maximize),
            ),
            Acquisition::UpperConfidenceBound { model, kappa, maximize } => {
                let sd = point[model].1[0].max(MIN_VAR).sqrt();
                let sign = if maximize { 1.0 } else { -1.0 };
                (model, [sign * point[model].0[0] + kappa * sd, sign, 0.5 * kappa / sd])
            }
            Acquisition::Feasibility { model } => {
                let terms = likelihoods[model].prob_one_and_grads(point[model].0[0], point[model].1[0]);
                (model, terms.unwrap_or([0.0; 3]))
            }
            Acquisition::Entropy { model } => {
                let (lik, (mean, var)) = (likelihoods[model], point[model]);
                match entropy_one_latent(lik, mean[0], var[0]) {
                    Some(terms) => (model, terms),
                    None => {
                        let mut out = unused(point);
                        out.value = entropy(lik, mean, var);
                        if grad {
                            (out.d_mean[model], out.d_var[model]) =
                                central_differences(mean, var, |m, v| entropy(lik, m, v));
                        }
                        return out;
                    }
                }
            }
        };
        let mut out = unused(point);
        out.value = value;
        out.d_mean[p][0] = d_mean;
        out.d_var[p][0] = d_var;
        out
    }
}

/// Zero partials in every model's latents.
fn unused(point: &[(&[f64], &[f64])]) -> Partials {
    Partials {
        value: 0.0,
        d_mean: point.iter().map(|(m, _)| vec![0.0; m.len()]).collect(),
        d_var: point.iter().map(|(_, v)| vec![0.0; v.len()]).collect(),
    }
}

/// Variances are floored here, so that `σ` and its derivative stay finite.
const MIN_VAR: f64 = 1e-18;

/// Whether `y` is `f` plus noise, so that a bound on `f` or its improvement
/// speaks of `y` and a fantasy's label can be an incumbent (a Poisson
/// model's latent is a log-rate, its labels counts).
fn has_moments(lik: &Likelihood) -> bool {
    matches!(lik, Likelihood::Gaussian { .. } | Likelihood::StudentT { .. })
}

/// `[EI, ∂/∂μ, ∂/∂v]`: with improvement `r = ±(incumbent − μ)` and `z = r/σ`,
/// `EI = rΦ(z) + σφ(z)`, `∂EI/∂r = Φ(z)`, `∂EI/∂σ = φ(z)`.
fn expected_improvement(mean: f64, var: f64, incumbent: f64, maximize: bool) -> [f64; 3] {
    let sign = if maximize { -1.0 } else { 1.0 };
    let r = sign * (incumbent - mean);
    let sd = var.max(MIN_VAR).sqrt();
    let z = r / sd;
    let (cdf, density) = (ndtr(z), (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt());
    [r * cdf + sd * density, -sign * cdf, 0.5 * density / sd]
}

/// `[H, ∂H/∂μ, ∂H/∂v]` where closed forms exist: Gaussian and Student-t
/// (the noise adds to `v`) and Bernoulli.
fn entropy_one_latent(lik: &Likelihood, mean: f64, var: f64) -> Option<[f64; 3]> {
    match lik {
        Likelihood::Gaussian { .. } | Likelihood::StudentT { .. } => {
            let Predictive::Moments { var: var_y, .. } = lik.predict(&[mean], &[var]) else {
                return None;
            };
            Some([gaussian_entropy(var_y), 0.0, 0.5 / var_y.max(MIN_VAR)])
        }
        Likelihood::Bernoulli { .. } => {
            let [p, dp_mean, dp_var] = lik.prob_one_and_grads(mean, var)?;
            let p = p.clamp(1e-300, 1.0 - 1e-16);
            let dh = ((1.0 - p) / p).ln();
            Some([-p * p.ln() - (1.0 - p) * (1.0 - p).ln(), dh * dp_mean, dh * dp_var])
        }
        _ => None,
    }
}

/// The entropy of the predictive distribution of `y`.
fn entropy(lik: &Likelihood, mean: &[f64], var: &[f64]) -> f64 {
    match lik.predict(mean, var) {
        Predictive::Moments { var, .. } => gaussian_entropy(var),
        Predictive::Classes(p) => -p.iter().filter(|&&p| p > 0.0).map(|p| p * p.ln()).sum::<f64>(),
    }
}

/// `½ log(2πe v)`.
fn gaussian_entropy(var: f64) -> f64 {
    0.5 * (2.0 * std::f64::consts::PI * std::f64::consts::E * var.max(MIN_VAR)).ln()
}

/// `∂f/∂μ_c` and `∂f/∂v_c` by central differences, for predictives without
/// closed-form derivatives (softmax's seeded draws are smooth in `μ` and `v`).
fn central_differences(mean: &[f64], var: &[f64], f: impl Fn(&[f64], &[f64]) -> f64) -> (Vec<f64>, Vec<f64>) {
    let (mut m, mut v) = (mean.to_vec(), var.to_vec());
    let mut d_mean = vec![0.0; mean.len()];
    let mut d_var = vec![0.0; var.len()];
    for c in 0..mean.len() {
        let h = 1e-5 * (1.0 + mean[c].abs());
        m[c] = mean[c] + h;
        let up = f(&m, &v);
        m[c] = mean[c] - h;
        d_mean[c] = (up - f(&m, &v)) / (2.0 * h);
        m[c] = mean[c];
        let h = 1e-5 * var[c].max(1e-8);
        v[c] = var[c] + h;
        let up = f(&m, &v);
        v[c] = var[c] - h;
        d_var[c] = (up - f(&m, &v)) / (2.0 * h);
        v[c] = var[c];
    }
    (d_mean, d_var)
}

/// `Π f_j` and, by the product rule, its partials.
fn product(factors: &[Acquisition], likelihoods: &[&Likelihood], point: &[(&[f64], &[f64])], grad: bool) -> Partials {
    let parts: Vec<Partials> = factors.iter().map(|f| f.partials(likelihoods, point, grad)).collect();
    let mut out = unused(point);
    out.value = parts.iter().map(|p| p.value).product();
    for (j, part) in parts.iter().enumerate() {
        let others: f64 = parts
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != j)
            .map(|(_, p)| p.value)
            .product();
        for p in 0..point.len() {
            for (acc, g) in out.d_mean[p].iter_mut().zip(&part.d_mean[p]) {
                *acc += others * g;
            }
            for (acc, g) in out.d_var[p].iter_mut().zip(&part.d_var[p]) {
                *acc += others * g;
            }
        }
    }
    out
}
