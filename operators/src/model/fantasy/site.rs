//! The site of a fantasy observation: the E-step's `α̂`, `β̂` at the fantasy
//! label, under the posterior the point is fantasised in.

use rand::Rng;
use rand_distr::{Distribution, Poisson, StandardNormal, StudentT};

use crate::model::likelihood::{Expectation, Likelihood, Predictive};

/// How a fantasy label is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fantasy {
    /// The predictive mean (Algorithm 2). For classes, whose mean is not a
    /// label, the E-step's terms averaged over the predictive class
    /// probabilities, which is the soft label `p(y | data)`: then `α̂ = 0`
    /// for a logit link (as for a Gaussian at its mean) and the fantasy
    /// leaves the mean where it is and shrinks the variance.
    #[default]
    Mean,
    /// One draw from the predictive distribution.
    Sample,
}

/// A fantasy site per latent: `λ1 = α̂ + β̂μ` and the precision `β̂ ≥ 0`.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// `λ1 = α̂ + β̂μ` per latent.
    pub lambda1: Vec<f64>,
    /// The precision `β̂` per latent.
    pub beta: Vec<f64>,
}

impl Site {
    /// The site of an observation `y` at a point whose latent marginals are
    /// `N(mean_c, var_c)`: one undamped E-step (exact for a Gaussian).
    pub fn observed(likelihood: &Likelihood, mean: &[f64], var: &[f64], y: f64) -> Site {
        fantasy_site_of(likelihood, mean, var, &[(y, 1.0)])
    }
}

/// The site of a fantasy observation at a point whose latent marginals are
/// `N(mean_c, var_c)`, and its label when it has one (not a class mean).
pub fn fantasy_site(
    likelihood: &Likelihood,
    mean: &[f64],
    var: &[f64],
    fantasy: Fantasy,
    rng: &mut impl Rng,
) -> (Site, Option<f64>) {
    let labels = labels(likelihood, mean, var, fantasy, rng);
    let label = match labels[..] {
        [(y, _)] => Some(y),
        _ => None,
    };
    (fantasy_site_of(likelihood, mean, var, &labels), label)
}

/// The E-step's terms averaged over weighted labels, as a site.
fn fantasy_site_of(likelihood: &Likelihood, mean: &[f64], var: &[f64], labels: &[(f64, f64)]) -> Site {
    let n = mean.len();
    let (mut alpha, mut beta) = (vec![0.0; n], vec![0.0; n]);
    let mut e = Expectation::default();
    for &(y, weight) in labels {
        likelihood.expectation(mean, var, y, &mut e);
        for c in 0..n {
            alpha[c] += weight * e.d_mean[c];
            beta[c] += weight * e.beta[c];
        }
    }
    // A site that widens the posterior (Student-t far out) is not a fantasy's.
    let beta: Vec<f64> = beta.into_iter().map(|b| b.max(0.0)).collect();
    let lambda1 = (0..n).map(|c| alpha[c] + beta[c] * mean[c]).collect();
    Site { lambda1, beta }
}

/// The fantasy labels with their weights.
fn labels(likelihood: &Likelihood, mean: &[f64], var: &[f64], fantasy: Fantasy, rng: &mut impl Rng) -> Vec<(f64, f64)> {
    match (fantasy, likelihood.predict(mean, var)) {
        (Fantasy::Mean, Predictive::Moments { mean, .. }) => vec![(mean, 1.0)],
        (Fantasy::Mean, Predictive::Classes(p)) => p
            .iter()
            .enumerate()
            .filter(|(_, &p)| p > 0.0)
            .map(|(c, &p)| (c as f64, p))
            .collect(),
        (Fantasy::Sample, Predictive::Classes(p)) => {
            let u: f64 = rng.random();
            let mut below = 0.0;
            let class = p.iter().position(|&p| {
                below += p;
                u < below
            });
            vec![(class.unwrap_or(p.len() - 1) as f64, 1.0)]
        }
        (Fantasy::Sample, Predictive::Moments { .. }) => vec![(sample_label(likelihood, mean[0], var[0], rng), 1.0)],
    }
}

/// A draw of `y` from `∫ p(y|f) N(f; mean, var) df` for one latent.
fn sample_label(likelihood: &Likelihood, mean: f64, var: f64, rng: &mut impl Rng) -> f64 {
    let z: f64 = StandardNormal.sample(rng);
    let f = mean + var.max(0.0).sqrt() * z;
    match *likelihood {
        Likelihood::Gaussian { variance } => {
            let e: f64 = StandardNormal.sample(rng);
            f + variance.sqrt() * e
        }
        Likelihood::StudentT { df, scale } => {
            let t: f64 = StudentT::new(df).map_or(0.0, |d| d.sample(rng));
            f + scale * t
        }
        Likelihood::Poisson => Poisson::new(f.exp()).map_or(0.0, |d| d.sample(rng)),
        // Not reached: classes are drawn from their probabilities.
        Likelihood::Bernoulli { .. } | Likelihood::Softmax { .. } => f,
        // Not reached: `dualgp suggest` takes one output's likelihood.
        Likelihood::MultiOutput(_) => f,
    }
}
