//! Observation models. A likelihood is only `E_q[log p(y|f)]` under a
//! Gaussian `q(f) = N(μ, v)` per latent, its derivatives, and predictions.
//!
//! Gaussian and Poisson expectations are closed form; Bernoulli and Student-t
//! use Gauss–Hermite quadrature with `∂E/∂μ = E[∂_f log p]` (Bonnet) and
//! `∂E/∂v` the exact derivative of the quadrature estimate, which equals
//! `½ E[∂²_f log p]` (Price) for the true integral; see
//! [`GaussHermite::expect_and_grads`](crate::model::math::quadrature::GaussHermite::expect_and_grads).
//! Softmax uses a fixed, seeded antithetic Monte Carlo sample whose
//! derivatives are exact for that sample. One file a family.

mod bernoulli;
mod gaussian;
mod poisson;
mod softmax;
mod student_t;

use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};
use crate::model::multi::MultiOutput;
use softmax::Softmax;
use student_t::StudentT;

/// How a Bernoulli likelihood maps the latent `f` to `p(y = 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Link {
    /// `Φ(f)`, the standard normal CDF: expectations in closed form.
    Probit,
    /// `1 / (1 + e^{−f})`.
    Logit,
}

/// The observation model `p(y | f)`: how a label depends on the latent
/// function(s) at its inputs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Likelihood {
    /// Real labels with Gaussian noise.
    Gaussian {
        /// The noise variance.
        variance: f64,
    },
    /// Labels 0 or 1.
    Bernoulli {
        /// How `f` becomes a probability.
        link: Link,
    },
    /// Counts, `y ~ Poisson(e^f)`.
    Poisson,
    /// Real labels with heavy-tailed Student-t noise, robust to outliers.
    StudentT {
        /// Degrees of freedom.
        df: f64,
        /// The noise scale.
        scale: f64,
    },
    /// C classes over C latents; expectations by a fixed seeded Monte Carlo sample.
    Softmax {
        /// The number of classes C.
        classes: usize,
        /// Monte Carlo draws per expectation (antithetic pairs).
        samples: usize,
        /// The seed of the draws, fixed so that expectations are deterministic.
        seed: u64,
    },
    /// Several outputs over shared latents (see [`MultiOutput`]); a record
    /// observes one output, named by its index.
    MultiOutput(Box<MultiOutput>),
}

/// `E_q[log p(y|f)]` and its derivatives at one point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expectation {
    /// `E_q[log p(y|f)]`.
    pub value: f64,
    /// `∂E/∂μ_c` per latent (this is α̂).
    pub d_mean: Vec<f64>,
    /// `∂E/∂v_c` per latent: the exact derivative of `value`, for the M-step.
    pub d_var: Vec<f64>,
    /// `β̂_c`, the site precision: `−2 ∂E/∂v_c`, which equals
    /// `E[−∂²log p/∂f_c²]` (Price). Softmax takes the second form over its
    /// draws: always positive and as precise as `α̂`, where the draws'
    /// derivative in `v` is noise when `p_c` is small and then `α̂/β̂`, the
    /// site's step, explodes.
    pub beta: Vec<f64>,
    /// `∂E/∂ log θ` per likelihood parameter, in the order of `log_params`.
    pub d_params: Vec<f64>,
}

/// The predictive distribution of `y` at one point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Predictive {
    /// Mean and variance of `y` (Gaussian: including the noise; Poisson: of the count).
    Moments {
        /// The mean of `y`.
        mean: f64,
        /// The variance of `y`.
        var: f64,
    },
    /// Class probabilities (Bernoulli: `[p0, p1]`).
    Classes(Vec<f64>),
}

/// Default Monte Carlo sample count (antithetic pairs) for `parse("softmax:C")`.
pub const DEFAULT_SOFTMAX_SAMPLES: usize = 64;

impl Likelihood {
    /// Number of latent functions (1, or C for softmax).
    pub fn n_latent(&self) -> usize {
        match *self {
            Likelihood::Softmax { classes, .. } => classes,
            _ => 1,
        }
    }

    /// Number of outputs a record may observe (`D` of a multi-output model, else 1).
    pub fn n_outputs(&self) -> usize {
        match self {
            Likelihood::MultiOutput(m) => m.n_outputs(),
            _ => 1,
        }
    }

    /// Whether the model's inputs end with each record's output index (a
    /// multi-output model's coregional kernel reads it there; see
    /// [`Data::for_model`](crate::model::data::Data::for_model)).
    pub fn reads_output_index(&self) -> bool {
        matches!(self, Likelihood::MultiOutput(_))
    }

    /// How many of a model's `inputs` are the records' features (all but
    /// the output index a multi-output model reads).
    pub fn features(&self, inputs: usize) -> usize {
        inputs - usize::from(self.reads_output_index())
    }

    /// The likelihood of output `d`: that output's own, or `self` for a
    /// single-output model.
    pub fn of_output(&self, d: usize) -> &Likelihood {
        match self {
            Likelihood::MultiOutput(m) => m.outputs.get(d).unwrap_or(self),
            _ => self,
        }
    }

    /// Whether the sites are exact in one undamped E-step, whatever the posterior (Gaussian).
    pub fn is_conjugate(&self) -> bool {
        match self {
            Likelihood::MultiOutput(m) => m.is_conjugate(),
            _ => matches!(self, Likelihood::Gaussian { .. }),
        }
    }

    /// The site of `y` on output `d` that one undamped E-step reaches from
    /// any posterior: `Some` exactly when output `d`'s likelihood is
    /// conjugate (for every `d` when [`is_conjugate`](Self::is_conjugate)).
    /// Gaussian: `(y/σ², 1/σ²)`, of output `d`'s own `σ²` for several outputs.
    pub fn exact_site(&self, d: usize, y: f64) -> Option<(f64, f64)> {
        match self {
            Likelihood::Gaussian { variance } => Some((y / variance, 1.0 / variance)),
            Likelihood::MultiOutput(m) => m.outputs.get(d)?.exact_site(0, y),
            _ => None,
        }
    }

    /// The number of learnable parameters ([`log_params`](Self::log_params)' length).
    pub fn n_params(&self) -> usize {
        match self {
            Likelihood::Gaussian { .. } => 1,
            Likelihood::StudentT { .. } => 2,
            Likelihood::MultiOutput(m) => m.n_params(),
            _ => 0,
        }
    }

    /// The optimiser's coordinates: Gaussian `[log σ²]`, Student-t
    /// `[log df, log scale]`, a multi-output model its outputs' in output
    /// order, others none.
    pub fn log_params(&self) -> Vec<f64> {
        match *self {
            Likelihood::Gaussian { variance } => vec![variance.ln()],
            Likelihood::StudentT { df, scale } => vec![df.ln(), scale.ln()],
            Likelihood::MultiOutput(ref m) => m.log_params(),
            _ => Vec::new(),
        }
    }

    /// Sets the parameters from the coordinates [`log_params`](Self::log_params) gives.
    pub fn set_log_params(&mut self, p: &[f64]) {
        assert_eq!(p.len(), self.n_params(), "wrong number of likelihood parameters");
        match self {
            Likelihood::Gaussian { variance } => *variance = p[0].exp(),
            Likelihood::StudentT { df, scale } => {
                *df = p[0].exp();
                *scale = p[1].exp();
            }
            Likelihood::MultiOutput(m) => m.set_log_params(p),
            _ => {}
        }
    }

    /// The parameters' names, in the order of [`log_params`](Self::log_params).
    pub fn param_names(&self) -> Vec<String> {
        match self {
            Likelihood::Gaussian { .. } => vec!["gaussian.variance".into()],
            Likelihood::StudentT { .. } => vec!["student-t.df".into(), "student-t.scale".into()],
            Likelihood::MultiOutput(m) => m.named_params().into_iter().map(|(n, _)| n).collect(),
            _ => Vec::new(),
        }
    }

    /// Parameters by name on their natural scale.
    pub fn named_params(&self) -> Vec<(String, f64)> {
        match self {
            Likelihood::MultiOutput(m) => m.named_params(),
            _ => self
                .param_names()
                .into_iter()
                .zip(self.log_params().into_iter().map(f64::exp))
                .collect(),
        }
    }

    /// One likelihood per output (`"gaussian,bernoulli"`) over `latents`
    /// latent GPs (default: one per output), which the model's coregional
    /// kernel mixes: a single entry without `latents` (or with 1) is that
    /// likelihood itself, the single-output model.
    pub fn parse_outputs(s: &str, latents: Option<usize>) -> Result<Likelihood> {
        let outputs = s.split(',').map(Likelihood::parse).collect::<Result<Vec<_>>>()?;
        if latents == Some(0) {
            return Err(ModelError::Config("--latents must be at least 1".into()));
        }
        match (outputs.len(), latents) {
            (1, None | Some(1)) => Ok(outputs.into_iter().next().expect("one entry")),
            (d, q) => Ok(Likelihood::MultiOutput(Box::new(MultiOutput::new(
                outputs,
                q.unwrap_or(d),
            )?))),
        }
    }

    /// Short name that [`Likelihood::parse`] accepts back (parameters are not
    /// included), e.g. `gaussian`, `bernoulli:logit`, `softmax:3`.
    pub fn name(&self) -> String {
        match self {
            Likelihood::Gaussian { .. } => "gaussian".into(),
            Likelihood::Bernoulli { link: Link::Probit } => "bernoulli".into(),
            Likelihood::Bernoulli { link: Link::Logit } => "bernoulli:logit".into(),
            Likelihood::Poisson => "poisson".into(),
            Likelihood::StudentT { .. } => "student-t".into(),
            Likelihood::Softmax { classes, .. } => format!("softmax:{classes}"),
            Likelihood::MultiOutput(ref m) => m.name(),
        }
    }

    /// Parses `gaussian`, `bernoulli` (probit), `bernoulli:probit`,
    /// `bernoulli:logit`, `poisson`, `student-t` or `softmax:C`, with default
    /// parameters (Gaussian variance 1; Student-t df 4, scale 1; softmax
    /// 64 antithetic pairs, seed 0).
    pub fn parse(s: &str) -> Result<Likelihood> {
        let lower = s.trim().to_ascii_lowercase();
        let lik = match lower.as_str() {
            "gaussian" => Likelihood::Gaussian { variance: 1.0 },
            "bernoulli" | "bernoulli:probit" => Likelihood::Bernoulli { link: Link::Probit },
            "bernoulli:logit" => Likelihood::Bernoulli { link: Link::Logit },
            "poisson" => Likelihood::Poisson,
            "student-t" | "student_t" | "studentt" => Likelihood::StudentT { df: 4.0, scale: 1.0 },
            other => match other.strip_prefix("softmax:") {
                Some(c) => Likelihood::Softmax {
                    classes: parse_classes(c)?,
                    samples: DEFAULT_SOFTMAX_SAMPLES,
                    seed: 0,
                },
                None => {
                    return Err(ModelError::Config(format!(
                        "unknown likelihood {s:?}; expected gaussian, bernoulli, \
                         bernoulli:logit, poisson, student-t or softmax:C"
                    )))
                }
            },
        };
        Ok(lik)
    }

    /// Whether `y` is in the support (finite; 0/1 for Bernoulli; a class in
    /// 0..C; a non-negative integer count for Poisson). The error names `row`.
    pub fn check_label(&self, row: usize, y: f64) -> Result<()> {
        if !y.is_finite() {
            return Err(ModelError::NonFinite {
                row,
                what: "label".into(),
            });
        }
        let is_count = y >= 0.0 && y.fract() == 0.0;
        let reason = match *self {
            Likelihood::MultiOutput(ref m) => return m.check_label(row, 0, y),
            Likelihood::Bernoulli { .. } if y != 0.0 && y != 1.0 => "is not 0 or 1".to_string(),
            Likelihood::Poisson if !is_count => "is not a non-negative integer count".to_string(),
            Likelihood::Softmax { classes, .. } if !is_count || y >= classes as f64 => {
                format!("is not a class in 0..{classes}")
            }
            _ => return Ok(()),
        };
        Err(ModelError::InvalidLabel { row, label: y, reason })
    }

    /// [`check_label`](Self::check_label) of a record that observes output
    /// `d`: an index the model does not have is an error too.
    pub fn check_label_of(&self, row: usize, d: usize, y: f64) -> Result<()> {
        match self {
            Likelihood::MultiOutput(m) => m.check_label(row, d, y),
            _ if d != 0 => Err(ModelError::InvalidOutput {
                row,
                output: d,
                outputs: 1,
            }),
            _ => self.check_label(row, y),
        }
    }

    /// [`expectation`](Self::expectation) of a record that observes output
    /// `d` (checked by [`check_label_of`](Self::check_label_of)).
    pub fn expectation_of(&self, d: usize, mean: &[f64], var: &[f64], y: f64, out: &mut Expectation) {
        match self {
            Likelihood::MultiOutput(m) => m.expectation(d, mean, var, y, out),
            _ => self.expectation(mean, var, y, out),
        }
    }

    /// [`log_predictive`](Self::log_predictive) of output `d`.
    pub fn log_predictive_of(&self, d: usize, mean: &[f64], var: &[f64], y: f64) -> f64 {
        match self {
            Likelihood::MultiOutput(m) => m.log_predictive(d, mean, var, y),
            _ => self.log_predictive(mean, var, y),
        }
    }

    /// [`predict`](Self::predict) of output `d`.
    pub fn predict_of(&self, d: usize, mean: &[f64], var: &[f64]) -> Predictive {
        match self {
            Likelihood::MultiOutput(m) => m.predict(d, mean, var),
            _ => self.predict(mean, var),
        }
    }

    /// Fills `out` (resized to `n_latent()` / `n_params()`) with `E_q[log p(y|f)]`
    /// and its derivatives, for `q(f_c) = N(mean[c], var[c])`.
    pub fn expectation(&self, mean: &[f64], var: &[f64], y: f64, out: &mut Expectation) {
        let n = self.n_latent();
        debug_assert!(mean.len() == n && var.len() == n, "expected {n} latents");
        out.d_mean.resize(n, 0.0);
        out.d_var.resize(n, 0.0);
        out.beta.resize(n, 0.0);
        out.d_params.resize(self.n_params(), 0.0);
        let (m, v) = (mean[0], var[0]);
        let [value, d_mean, d_var] = match *self {
            Likelihood::Gaussian { variance } => {
                let e = gaussian::expectation(variance, m, v, y);
                out.d_params[0] = e[3];
                [e[0], e[1], e[2]]
            }
            Likelihood::Poisson => poisson::expectation(m, v, y),
            Likelihood::Bernoulli { link } => bernoulli::expectation(link, m, v, y),
            Likelihood::StudentT { df, scale } => {
                let t = StudentT::new(df, scale);
                let (e, d_params) = t.expectation(m, v, y);
                out.d_params.copy_from_slice(&d_params);
                e
            }
            Likelihood::Softmax { classes, samples, seed } => {
                Softmax::new(classes, samples, seed).expectation(mean, var, y, out);
                return;
            }
            Likelihood::MultiOutput(ref m) => {
                m.expectation(0, mean, var, y, out);
                return;
            }
        };
        out.value = value;
        out.d_mean[0] = d_mean;
        out.d_var[0] = d_var;
        out.beta[0] = -2.0 * d_var;
    }

    /// `log p(y | data) = log ∫ p(y|f) q(f) df`, for the test NLPD.
    pub fn log_predictive(&self, mean: &[f64], var: &[f64], y: f64) -> f64 {
        let (m, v) = (mean[0], var[0]);
        match *self {
            Likelihood::Gaussian { variance } => gaussian::log_density(y, m, v + variance),
            Likelihood::Poisson => poisson::log_predictive(m, v, y),
            Likelihood::Bernoulli { link } => bernoulli::log_predictive(link, m, v, y),
            Likelihood::StudentT { df, scale } => StudentT::new(df, scale).log_predictive(m, v, y),
            Likelihood::Softmax { classes, samples, seed } => {
                Softmax::new(classes, samples, seed).log_predictive(mean, var, y)
            }
            Likelihood::MultiOutput(ref m) => m.log_predictive(0, mean, var, y),
        }
    }

    /// A Bernoulli model's `[p(y = 1), ∂p/∂μ, ∂p/∂v]`; `None` for the others.
    pub fn prob_one_and_grads(&self, mean: f64, var: f64) -> Option<[f64; 3]> {
        match *self {
            Likelihood::Bernoulli { link } => Some(bernoulli::prob_one_and_grads(link, mean, var)),
            _ => None,
        }
    }

    /// The predictive distribution of `y` given the latents' marginals `N(mean_c, var_c)`.
    pub fn predict(&self, mean: &[f64], var: &[f64]) -> Predictive {
        let (m, v) = (mean[0], var[0]);
        match *self {
            Likelihood::Gaussian { variance } => Predictive::Moments {
                mean: m,
                var: v + variance,
            },
            Likelihood::Poisson => poisson::predict(m, v),
            Likelihood::Bernoulli { link } => {
                let p1 = bernoulli::prob_one(link, m, v);
                Predictive::Classes(vec![1.0 - p1, p1])
            }
            Likelihood::StudentT { df, scale } => {
                let noise = if df > 2.0 {
                    scale * scale * df / (df - 2.0)
                } else {
                    f64::INFINITY
                };
                Predictive::Moments {
                    mean: m,
                    var: v + noise,
                }
            }
            Likelihood::Softmax { classes, samples, seed } => {
                Predictive::Classes(Softmax::new(classes, samples, seed).predict(mean, var))
            }
            Likelihood::MultiOutput(ref m) => m.predict(0, mean, var),
        }
    }
}

fn parse_classes(c: &str) -> Result<usize> {
    match c.trim().parse::<usize>() {
        Ok(classes) if classes >= 2 => Ok(classes),
        _ => Err(ModelError::Config(format!(
            "softmax needs an integer class count ≥ 2, got {c:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::f64::consts::PI;

    use super::*;
    use crate::model::math::quadrature;
    use crate::model::math::special::*;

    #[test]
    fn an_exact_site_is_what_one_undamped_site_update_reaches_and_only_conjugate_ones_have_it() {
        let gaussians = || {
            vec![
                Likelihood::Gaussian { variance: 0.3 },
                Likelihood::Gaussian { variance: 2.0 },
            ]
        };
        let mixed = vec![
            Likelihood::Gaussian { variance: 0.3 },
            Likelihood::Bernoulli { link: Link::Probit },
        ];
        let cases = [
            Likelihood::Gaussian { variance: 0.3 },
            Likelihood::Bernoulli { link: Link::Probit },
            Likelihood::MultiOutput(Box::new(MultiOutput::new(gaussians(), 2).unwrap())),
            Likelihood::MultiOutput(Box::new(MultiOutput::new(mixed, 2).unwrap())),
        ];
        let (y, mean, var) = (1.7, 0.4, 0.9);
        for lik in &cases {
            for d in 0..lik.n_outputs() {
                let exact = lik.exact_site(d, y);
                assert_eq!(exact.is_some(), lik.of_output(d).is_conjugate(), "{}", lik.name());
                let Some((s1, s2)) = exact else { continue };
                // The E-step's undamped update from an arbitrary marginal: λ₁ = α̂ + β̂μ, λ₂ = β̂.
                let mut e = Expectation::default();
                lik.expectation_of(d, &[mean], &[var], y, &mut e);
                assert_close(s1, e.d_mean[0] + e.beta[0] * mean, 1e-12, 0.0, "λ₁");
                assert_close(s2, e.beta[0], 1e-12, 0.0, "λ₂");
            }
        }
    }

    fn assert_close(got: f64, want: f64, rel: f64, abs: f64, what: &str) {
        let tol = rel * got.abs().max(want.abs()) + abs;
        assert!(
            (got - want).abs() <= tol,
            "{what}: got {got:e}, want {want:e} (diff {:e}, tol {tol:e})",
            (got - want).abs()
        );
    }

    /// Central difference with one Richardson step: O(h⁴) truncation error.
    fn derivative(f: impl Fn(f64) -> f64, x: f64, h: f64) -> f64 {
        let d = |h: f64| (f(x + h) - f(x - h)) / (2.0 * h);
        (4.0 * d(0.5 * h) - d(h)) / 3.0
    }

    fn value(lik: &Likelihood, mean: &[f64], var: &[f64], y: f64) -> f64 {
        let mut out = Expectation::default();
        lik.expectation(mean, var, y, &mut out);
        out.value
    }

    /// Every analytic derivative in `out` against central differences of `value`.
    fn check_gradients(lik: &Likelihood, mean: &[f64], var: &[f64], y: f64) {
        let mut out = Expectation::default();
        lik.expectation(mean, var, y, &mut out);
        let ctx = format!("{} at μ={mean:?} v={var:?} y={y}", lik.name());
        assert!(out.value.is_finite(), "{ctx}: value {}", out.value);
        let abs = 1e-9 * (1.0 + out.value.abs());
        for c in 0..mean.len() {
            let fd = derivative(
                |m| {
                    let mut mu = mean.to_vec();
                    mu[c] = m;
                    value(lik, &mu, var, y)
                },
                mean[c],
                1e-3 * mean[c].abs().max(1.0),
            );
            assert_close(out.d_mean[c], fd, 1e-5, abs, &format!("{ctx}: d_mean[{c}]"));
            let fd = derivative(
                |v| {
                    let mut s2 = var.to_vec();
                    s2[c] = v;
                    value(lik, mean, &s2, y)
                },
                var[c],
                1e-2 * var[c],
            );
            assert_close(out.d_var[c], fd, 1e-5, abs, &format!("{ctx}: d_var[{c}]"));
        }
        let theta = lik.log_params();
        for (i, name) in lik.param_names().iter().enumerate() {
            let fd = derivative(
                |p| {
                    let mut l = lik.clone();
                    let mut t = theta.clone();
                    t[i] = p;
                    l.set_log_params(&t);
                    value(&l, mean, var, y)
                },
                theta[i],
                1e-3,
            );
            assert_close(out.d_params[i], fd, 1e-5, abs, &format!("{ctx}: {name}"));
        }
    }

    fn probit() -> Likelihood {
        Likelihood::Bernoulli { link: Link::Probit }
    }

    fn logit() -> Likelihood {
        Likelihood::Bernoulli { link: Link::Logit }
    }

    // ---- special functions ------------------------------------------------

    #[test]
    fn ln_gamma_spot_values() {
        assert_close(ln_gamma(0.5), PI.sqrt().ln(), 1e-15, 0.0, "lgamma(0.5)");
        assert_close(ln_gamma(1.0), 0.0, 0.0, 1e-15, "lgamma(1)");
        assert_close(ln_gamma(2.0), 0.0, 0.0, 1e-15, "lgamma(2)");
        assert_close(ln_gamma(10.0), 362_880f64.ln(), 1e-14, 0.0, "lgamma(10)");
        assert_close(ln_gamma(3.7), 1.428_072_326_665_388_3, 1e-14, 0.0, "lgamma(3.7)");
        assert_close(ln_gamma(100.5), 361.435_540_467_777_6, 1e-14, 0.0, "lgamma(100.5)");
        assert_close(ln_gamma(1e-3), 6.907_178_885_383_854, 1e-14, 0.0, "lgamma(1e-3)");
    }

    #[test]
    fn digamma_spot_values_and_lgamma_derivative() {
        // The recurrence from 1 to 10 cancels a couple of digits' worth of ulps.
        assert_close(digamma(1.0), -0.577_215_664_901_532_9, 5e-15, 0.0, "ψ(1)");
        assert_close(digamma(0.25), -4.227_453_533_376_265, 1e-14, 0.0, "ψ(0.25)");
        assert_close(digamma(3.7), 1.167_153_539_361_511_4, 1e-14, 0.0, "ψ(3.7)");
        assert_close(digamma(25.5), 3.218_942_472_883_919_8, 1e-14, 0.0, "ψ(25.5)");
        for x in [0.3, 2.5, 7.0, 40.0] {
            let fd = derivative(ln_gamma, x, 1e-3 * x);
            assert_close(digamma(x), fd, 1e-9, 0.0, "ψ vs d lgamma");
        }
    }

    #[test]
    fn erfc_family_spot_values() {
        assert_close(erfc(1.0), 0.157_299_207_050_285_13, 1e-15, 0.0, "erfc(1)");
        assert_close(erfc(0.3), 0.671_373_240_540_872_6, 1e-15, 0.0, "erfc(0.3)");
        assert_close(erfc(2.5), 4.069_520_174_449_589e-4, 1e-14, 0.0, "erfc(2.5)");
        assert_close(erfc(5.0), 1.537_459_794_428_035e-12, 1e-14, 0.0, "erfc(5)");
        assert_close(erfcx(0.2), 0.809_019_519_901_580_7, 1e-15, 0.0, "erfcx(0.2)");
        assert_close(erfcx(5.5), 0.100_962_218_399_499_09, 1e-15, 0.0, "erfcx(5.5)");
        assert_close(erfcx(10.0), 0.056_140_992_743_822_59, 1e-15, 0.0, "erfcx(10)");
        assert_close(erfcx(100.0), 0.005_641_613_782_989_433, 1e-15, 0.0, "erfcx(100)");
        assert_close(ndtr(1.0), 0.841_344_746_068_542_9, 1e-15, 0.0, "Φ(1)");
        assert_close(ndtr(-1.0), 0.158_655_253_931_457_07, 1e-15, 0.0, "Φ(−1)");
    }

    #[test]
    fn log_ndtr_is_accurate_in_both_tails() {
        assert_eq!(log_ndtr(0.0), 0.5f64.ln());
        // The asymptotic series at x = −30: three terms are off by the next,
        // 15/x⁶ ≈ 2.1e−8; five terms by 945/x¹⁰ ≈ 1.6e−12.
        let x: f64 = -30.0;
        let log_pdf = -0.5 * x * x - 0.5 * (2.0 * PI).ln();
        let head = log_pdf - (-x).ln();
        let series3 = head + (1.0 - 1.0 / x.powi(2) + 3.0 / x.powi(4)).ln();
        assert_close(log_ndtr(x), series3, 0.0, 2.2e-8, "log Φ(−30) vs 3-term series");
        let series5 = head + (1.0 - 1.0 / x.powi(2) + 3.0 / x.powi(4) - 15.0 / x.powi(6) + 105.0 / x.powi(8)).ln();
        assert_close(log_ndtr(x), series5, 0.0, 2e-12, "log Φ(−30) vs 5-term series");
        assert_close(log_ndtr(-30.0), -454.321_243_956_343_2, 1e-15, 0.0, "log Φ(−30)");
        assert_close(log_ndtr(-40.0), -804.608_442_013_753_8, 1e-15, 0.0, "log Φ(−40)");
        assert_close(log_ndtr(-5.0), -15.064_998_393_988_726, 1e-15, 0.0, "log Φ(−5)");
        assert_close(log_ndtr(3.0), -1.350_809_964_748_193_8e-3, 1e-14, 0.0, "log Φ(3)");
        assert_close(log_ndtr(10.0), -7.619_853_024_160_526e-24, 1e-14, 0.0, "log Φ(10)");
        let (_, mills) = log_ndtr_and_mills(-40.0);
        assert_close(mills, 40.024_968_847_207_26, 1e-14, 0.0, "φ/Φ at −40");
    }

    #[test]
    fn log_ndtr_derivative_is_the_mills_ratio() {
        for x in [-35.0, -8.0, -1.0, 0.0, 0.7, 6.0] {
            let fd = derivative(log_ndtr, x, 1e-3);
            assert_close(log_ndtr_and_mills(x).1, fd, 1e-8, 1e-20, &format!("x={x}"));
        }
    }

    #[test]
    fn softplus_and_sigmoid_are_stable() {
        assert_eq!(softplus(-800.0), 0.0);
        assert_eq!(softplus(800.0), 800.0);
        assert_close(softplus(0.0), 2f64.ln(), 1e-15, 0.0, "softplus(0)");
        assert_eq!(sigmoid(-800.0), 0.0);
        assert_eq!(sigmoid(800.0), 1.0);
        assert_close(sigmoid(1.5) + sigmoid(-1.5), 1.0, 1e-15, 0.0, "σ(x) + σ(−x)");
    }

    // ---- expectations -------------------------------------------------------

    #[test]
    fn gaussian_and_poisson_closed_forms_match_quadrature() {
        let noise = 0.7;
        let gauss = Likelihood::Gaussian { variance: noise };
        for &(m, v, y) in &[(0.3, 0.5, 1.2), (-2.0, 3.0, 4.0), (5.0, 1e-3, -1.0)] {
            let mut out = Expectation::default();
            gauss.expectation(&[m], &[v], y, &mut out);
            let quad = quadrature::expect_and_grads(m, v, |f| {
                [gaussian::log_density(y, f, noise), (y - f) / noise, -1.0 / noise]
            });
            assert_close(out.value, quad[0], 1e-10, 0.0, "gaussian E");
            assert_close(out.d_mean[0], quad[1], 1e-10, 1e-14, "gaussian dμ");
            assert_close(out.d_var[0], quad[2], 1e-10, 0.0, "gaussian dv");
        }
        for &(m, v, y) in &[(0.3, 0.5, 2.0), (-2.0, 3.0, 0.0), (2.0, 0.01, 10.0)] {
            let mut out = Expectation::default();
            Likelihood::Poisson.expectation(&[m], &[v], y, &mut out);
            let log_fact = ln_gamma(y + 1.0);
            let quad = quadrature::expect_and_grads(m, v, |f| {
                let rate = f.exp();
                [y * f - rate - log_fact, y - rate, -rate]
            });
            assert_close(out.value, quad[0], 1e-10, 0.0, "poisson E");
            assert_close(out.d_mean[0], quad[1], 1e-10, 0.0, "poisson dμ");
            assert_close(out.d_var[0], quad[2], 1e-10, 0.0, "poisson dv");
        }
    }

    #[test]
    fn gaussian_gradients() {
        let lik = Likelihood::Gaussian { variance: 0.7 };
        for &(m, v, y) in &[(0.3, 0.5, 1.2), (-2.0, 3.0, 4.0), (5.0, 1e-3, -1.0)] {
            check_gradients(&lik, &[m], &[v], y);
        }
    }

    #[test]
    fn poisson_gradients() {
        for &(m, v, y) in &[(0.3, 0.5, 2.0), (-2.0, 3.0, 0.0), (2.0, 0.01, 10.0), (4.0, 2.0, 100.0)] {
            check_gradients(&Likelihood::Poisson, &[m], &[v], y);
        }
    }

    #[test]
    fn bernoulli_gradients_including_extremes() {
        for lik in [probit(), logit()] {
            for m in [-8.0, -1.0, 0.0, 0.5, 8.0] {
                for v in [1e-4, 0.3, 1.0, 10.0, 100.0] {
                    for y in [0.0, 1.0] {
                        check_gradients(&lik, &[m], &[v], y);
                    }
                }
            }
        }
    }

    #[test]
    fn bernoulli_tends_to_pointwise_derivatives_as_v_vanishes() {
        // Below quadrature::PRICE_BELOW_VAR, where finite differences in v drown in rounding.
        for m in [-8.0, -0.4, 2.0] {
            let mut out = Expectation::default();
            probit().expectation(&[m], &[1e-10], 1.0, &mut out);
            let (log_cdf, mills) = log_ndtr_and_mills(m);
            assert_close(out.value, log_cdf, 1e-9, 1e-12, "log Φ(μ)");
            assert_close(out.d_mean[0], mills, 1e-9, 1e-12, "λ(μ)");
            assert_close(out.d_var[0], -0.5 * mills * (m + mills), 1e-8, 1e-12, "½ ∂²");
            logit().expectation(&[m], &[1e-10], 0.0, &mut out);
            let p = sigmoid(m);
            assert_close(out.value, -softplus(m), 1e-9, 1e-12, "log σ(−μ)");
            assert_close(out.d_mean[0], -p, 1e-9, 1e-12, "−σ(μ)");
            assert_close(out.d_var[0], -0.5 * p * (1.0 - p), 1e-8, 1e-12, "½ ∂²");
        }
    }

    #[test]
    fn bernoulli_is_log_concave_and_finite_far_out() {
        for lik in [probit(), logit()] {
            for m in [-40.0, -8.0, 0.0, 3.0, 8.0, 40.0] {
                for v in [1e-6, 1e-2, 1.0, 100.0] {
                    for y in [0.0, 1.0] {
                        let mut out = Expectation::default();
                        lik.expectation(&[m], &[v], y, &mut out);
                        let beta = -2.0 * out.d_var[0];
                        let ctx = format!("{} μ={m} v={v} y={y}", lik.name());
                        assert!(out.value.is_finite() && out.value <= 0.0, "{ctx}: E={}", out.value);
                        assert!(out.d_mean[0].is_finite(), "{ctx}");
                        // At |μ| = 40 with tiny v the curvature underflows to 0.
                        let positive = if m.abs() < 10.0 { beta > 0.0 } else { beta >= 0.0 };
                        assert!(positive && beta.is_finite(), "{ctx}: β̂ = {beta}");
                        assert!(lik.log_predictive(&[m], &[v], y).is_finite(), "{ctx}");
                    }
                }
            }
        }
    }

    #[test]
    fn probit_predictive_closed_form_equals_quadrature() {
        for &(m, v) in &[(0.0, 1.0), (0.5, 0.2), (-2.0, 3.0), (3.0, 0.5)] {
            for y in [0.0, 1.0] {
                let closed = probit().log_predictive(&[m], &[v], y);
                // 32 nodes are good to ~1e−9 here; 96 nodes pin the closed form tightly.
                let quad = bernoulli::quadrature_log_predictive(Link::Probit, m, v, y, 96);
                assert_close(closed, quad, 1e-12, 0.0, &format!("μ={m} v={v} y={y}"));
            }
        }
    }

    #[test]
    fn bernoulli_predict_is_a_distribution() {
        for lik in [probit(), logit()] {
            let Predictive::Classes(p) = lik.predict(&[0.8], &[0.5]) else {
                panic!("expected classes")
            };
            assert_eq!(p.len(), 2);
            assert_close(p[0] + p[1], 1.0, 1e-15, 0.0, "Σp");
            assert!(p[1] > 0.5);
            assert_close(p[1], lik.log_predictive(&[0.8], &[0.5], 1.0).exp(), 1e-9, 0.0, "p1");
        }
    }

    #[test]
    fn student_t_gradients_including_parameters() {
        for (df, scale) in [(4.0, 1.0), (2.5, 0.3), (30.0, 2.0)] {
            let lik = Likelihood::StudentT { df, scale };
            for &(m, v, y) in &[(0.0, 1.0, 0.5), (1.0, 0.05, -2.0), (-3.0, 4.0, 2.0), (0.2, 1e-4, 0.2)] {
                check_gradients(&lik, &[m], &[v], y);
            }
        }
    }

    #[test]
    fn student_t_tends_to_gaussian_for_large_df() {
        let t = Likelihood::StudentT { df: 1e7, scale: 0.8 };
        let g = Likelihood::Gaussian { variance: 0.64 };
        let (mut a, mut b) = (Expectation::default(), Expectation::default());
        t.expectation(&[0.3], &[0.4], 1.1, &mut a);
        g.expectation(&[0.3], &[0.4], 1.1, &mut b);
        assert_close(a.value, b.value, 1e-6, 0.0, "E");
        assert_close(a.d_mean[0], b.d_mean[0], 1e-6, 0.0, "dμ");
        assert_close(a.d_var[0], b.d_var[0], 1e-6, 0.0, "dv");
        let lp = t.log_predictive(&[0.3], &[0.4], 1.1);
        assert_close(lp, g.log_predictive(&[0.3], &[0.4], 1.1), 1e-6, 0.0, "log pred");
    }

    #[test]
    fn student_t_predict_variance() {
        let lik = Likelihood::StudentT { df: 4.0, scale: 0.5 };
        assert_eq!(
            lik.predict(&[1.0], &[0.2]),
            Predictive::Moments {
                mean: 1.0,
                var: 0.2 + 0.5
            }
        );
        let heavy = Likelihood::StudentT { df: 1.5, scale: 0.5 };
        assert_eq!(
            heavy.predict(&[1.0], &[0.2]),
            Predictive::Moments {
                mean: 1.0,
                var: f64::INFINITY
            }
        );
    }

    #[test]
    fn log_predictive_is_above_expected_log_likelihood() {
        // Jensen: log E_q p ≥ E_q log p, with equality only as v → 0.
        let liks = [
            Likelihood::Gaussian { variance: 0.5 },
            Likelihood::Poisson,
            probit(),
            logit(),
            Likelihood::StudentT { df: 4.0, scale: 1.0 },
        ];
        for lik in &liks {
            let mut out = Expectation::default();
            lik.expectation(&[0.4], &[0.8], 1.0, &mut out);
            let lp = lik.log_predictive(&[0.4], &[0.8], 1.0);
            assert!(lp > out.value, "{}: {lp} ≤ {}", lik.name(), out.value);
            lik.expectation(&[0.4], &[1e-10], 1.0, &mut out);
            let lp = lik.log_predictive(&[0.4], &[1e-10], 1.0);
            assert_close(lp, out.value, 1e-8, 1e-12, &lik.name());
        }
    }

    #[test]
    fn gaussian_predict_and_log_predictive() {
        let lik = Likelihood::Gaussian { variance: 0.3 };
        assert_eq!(lik.predict(&[1.5], &[0.2]), Predictive::Moments { mean: 1.5, var: 0.5 });
        let want = -0.5 * (2.0 * PI * 0.5).ln() - (2.0 - 1.5f64).powi(2) / (2.0 * 0.5);
        assert_close(lik.log_predictive(&[1.5], &[0.2], 2.0), want, 1e-15, 0.0, "log N");
    }

    #[test]
    fn poisson_predict_matches_quadrature_moments() {
        for &(m, v) in &[(0.5, 0.3), (-1.0, 1.5), (2.0, 0.01)] {
            let Predictive::Moments { mean, var } = Likelihood::Poisson.predict(&[m], &[v]) else {
                panic!("expected moments")
            };
            let [e1, e2] = quadrature::expect_many(m, v, |f| [f.exp(), (2.0 * f).exp()]);
            assert_close(mean, e1, 1e-10, 0.0, "E y");
            // Var y = E[rate] + Var[rate].
            assert_close(var, e1 + e2 - e1 * e1, 1e-10, 0.0, "Var y");
        }
    }

    #[test]
    fn poisson_log_predictive_tends_to_the_pmf() {
        let lp = Likelihood::Poisson.log_predictive(&[3f64.ln()], &[1e-12], 2.0);
        let pmf = (9.0 / 2.0 * (-3f64).exp()).ln();
        assert_close(lp, pmf, 1e-9, 0.0, "log Poisson(2; 3)");
    }

    // ---- softmax ----------------------------------------------------------------

    fn softmax(classes: usize, seed: u64) -> Likelihood {
        Likelihood::Softmax {
            classes,
            samples: 32,
            seed,
        }
    }

    #[test]
    fn softmax_is_deterministic_per_seed() {
        let (m, v) = ([0.2, -0.5, 1.0], [0.5, 1.0, 0.2]);
        let a = value(&softmax(3, 7), &m, &v, 1.0);
        assert_eq!(a, value(&softmax(3, 7), &m, &v, 1.0));
        assert_ne!(a, value(&softmax(3, 8), &m, &v, 1.0));
    }

    #[test]
    fn softmax_probabilities_sum_to_one() {
        for (lik, m, v) in [
            (softmax(3, 0), vec![0.2, -0.5, 1.0], vec![0.5, 1.0, 0.2]),
            (softmax(2, 1), vec![3.0, -3.0], vec![2.0, 0.1]),
        ] {
            let Predictive::Classes(p) = lik.predict(&m, &v) else {
                panic!("expected classes")
            };
            assert_eq!(p.len(), m.len());
            assert_close(p.iter().sum(), 1.0, 1e-14, 0.0, "Σp");
            assert!(p.iter().all(|&q| q > 0.0 && q < 1.0));
            let lp: Vec<f64> = (0..m.len())
                .map(|y| lik.log_predictive(&m, &v, y as f64).exp())
                .collect();
            for (a, b) in p.iter().zip(&lp) {
                assert_close(*a, *b, 1e-12, 0.0, "predict vs exp(log_predictive)");
            }
        }
    }

    #[test]
    fn softmax_draws_are_antithetic() {
        // σ(ε₀ − ε₁) + σ(ε₁ − ε₀) = 1, so a symmetric point gives exactly ½ only
        // when every draw is paired with its negation.
        let Predictive::Classes(p) = softmax(2, 11).predict(&[0.0, 0.0], &[1.0, 1.0]) else {
            panic!("expected classes")
        };
        assert_close(p[0], 0.5, 1e-14, 0.0, "p0");
    }

    #[test]
    fn softmax_gradients() {
        let cases = [
            (softmax(3, 0), vec![0.2, -0.5, 1.0], vec![0.5, 1.0, 0.2]),
            (softmax(2, 3), vec![4.0, -4.0], vec![3.0, 1e-3]),
            (softmax(4, 5), vec![0.0; 4], vec![1.0; 4]),
        ];
        for (lik, m, v) in &cases {
            for y in 0..m.len() {
                check_gradients(lik, m, v, y as f64);
            }
        }
    }

    #[test]
    fn softmax_two_class_matches_logit_roughly() {
        // softmax([f, 0]) class 0 is σ(f). The default 64 pairs are only good
        // to ~5% here; 4096 pairs bring the MC error to ~1%.
        let sm = Likelihood::Softmax {
            classes: 2,
            samples: 4096,
            seed: 0,
        };
        let mc = value(&sm, &[0.7, 0.0], &[0.9, 0.0], 0.0);
        let quad = value(&logit(), &[0.7], &[0.9], 1.0);
        assert_close(mc, quad, 0.05, 0.0, "softmax vs logit");
    }

    #[test]
    fn softmax_beta_is_the_expected_curvature() {
        // softmax([f, 0]) with the second latent certain is the logit model of
        // f, whose β̂ quadrature gives to 1e-10.
        let sm = Likelihood::Softmax {
            classes: 2,
            samples: 4096,
            seed: 0,
        };
        let mut e = Expectation::default();
        for y in [0.0, 1.0] {
            sm.expectation(&[0.7, 0.0], &[0.9, 0.0], y, &mut e);
            let beta = e.beta[0];
            logit().expectation(&[0.7], &[0.9], 1.0 - y, &mut e);
            assert_close(beta, e.beta[0], 0.01, 0.0, "β̂ against the logit model's");
        }
        // An unlikely class: the site's step α̂/β̂ = −1/(1 − p) on every draw,
        // so it stays a unit step however few draws there are.
        let mean = [3.0, -8.0, -8.0, -9.0];
        softmax(4, 0).expectation(&mean, &[1.0; 4], 0.0, &mut e);
        for c in 1..4 {
            let step = e.d_mean[c] / e.beta[c];
            assert!((-1.01..=-1.0).contains(&step), "class {c}: α̂/β̂ = {step}");
        }
    }

    // ---- labels, names, parameters -----------------------------------------------

    #[test]
    fn check_label_refuses_out_of_support() {
        let sm = softmax(3, 0);
        assert!(sm.check_label(0, 0.0).is_ok());
        assert!(sm.check_label(0, 2.0).is_ok());
        for bad in [3.0, -1.0, 0.5] {
            match sm.check_label(4, bad) {
                Err(ModelError::InvalidLabel { row: 4, label, reason }) => {
                    assert_eq!(label, bad);
                    assert!(reason.contains("0..3"), "{reason}");
                }
                other => panic!("label {bad}: {other:?}"),
            }
        }
        assert!(probit().check_label(0, 1.0).is_ok());
        assert!(matches!(
            probit().check_label(1, 2.0),
            Err(ModelError::InvalidLabel { .. })
        ));
        assert!(matches!(
            probit().check_label(1, -1.0),
            Err(ModelError::InvalidLabel { .. })
        ));
        assert!(Likelihood::Poisson.check_label(0, 7.0).is_ok());
        assert!(Likelihood::Poisson.check_label(0, 1.5).is_err());
        assert!(Likelihood::Poisson.check_label(0, -1.0).is_err());
        let gauss = Likelihood::Gaussian { variance: 1.0 };
        assert!(gauss.check_label(0, -3.7).is_ok());
        assert_eq!(
            gauss.check_label(9, f64::NAN),
            Err(ModelError::NonFinite {
                row: 9,
                what: "label".into()
            })
        );
        assert!(matches!(
            sm.check_label(2, f64::INFINITY),
            Err(ModelError::NonFinite { row: 2, .. })
        ));
    }

    #[test]
    fn names_round_trip_through_parse() {
        let liks = [
            Likelihood::Gaussian { variance: 1.0 },
            probit(),
            logit(),
            Likelihood::Poisson,
            Likelihood::StudentT { df: 4.0, scale: 1.0 },
            softmax(3, 0),
        ];
        for lik in &liks {
            assert_eq!(Likelihood::parse(&lik.name()).unwrap().name(), lik.name());
        }
        assert_eq!(softmax(3, 0).name(), "softmax:3");
        assert!(matches!(
            Likelihood::parse("softmax:5").unwrap(),
            Likelihood::Softmax {
                classes: 5,
                samples: 64,
                seed: 0
            }
        ));
        assert!(matches!(
            Likelihood::parse(" Student-T ").unwrap(),
            Likelihood::StudentT { df, scale } if df == 4.0 && scale == 1.0
        ));
        for bad in ["", "gauss", "softmax", "softmax:1", "softmax:x", "bernoulli:cauchit"] {
            assert!(matches!(Likelihood::parse(bad), Err(ModelError::Config(_))), "{bad:?}");
        }
    }

    #[test]
    fn params_round_trip_and_shapes() {
        let mut t = Likelihood::StudentT { df: 4.0, scale: 0.5 };
        assert_eq!(t.n_params(), 2);
        assert_eq!(t.param_names().len(), 2);
        t.set_log_params(&[5f64.ln(), 2f64.ln()]);
        let p = t.log_params();
        assert_close(p[0].exp(), 5.0, 1e-15, 0.0, "df");
        assert_close(p[1].exp(), 2.0, 1e-15, 0.0, "scale");
        assert_eq!(softmax(3, 0).n_latent(), 3);
        assert_eq!(probit().n_latent(), 1);
        assert_eq!(Likelihood::Poisson.n_params(), 0);
        let mut out = Expectation::default();
        softmax(3, 0).expectation(&[0.0; 3], &[1.0; 3], 2.0, &mut out);
        assert_eq!((out.d_mean.len(), out.d_var.len(), out.d_params.len()), (3, 3, 0));
        // The same buffers are reused, and shrunk, for another likelihood.
        Likelihood::Gaussian { variance: 1.0 }.expectation(&[0.0], &[1.0], 0.0, &mut out);
        assert_eq!((out.d_mean.len(), out.d_var.len(), out.d_params.len()), (1, 1, 1));
    }

    #[test]
    fn serde_round_trip() {
        let lik = Likelihood::StudentT { df: 3.0, scale: 0.5 };
        let json = serde_json::to_string(&lik).unwrap();
        assert!(json.contains("student-t"), "{json}");
        let back: Likelihood = serde_json::from_str(&json).unwrap();
        assert_eq!(back.log_params(), lik.log_params());
    }
}
