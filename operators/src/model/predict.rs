//! Predictions of `y` and the test metrics the evaluation reports.

use nalgebra::DMatrix;

use crate::model::data::{model_inputs, Data};
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::{Likelihood, Predictive};
use crate::model::posterior::DualPosterior;

/// The predictive distribution of `y` at every row of `x` (of output 0 for a
/// multi-output model; see [`predict_outputs`]).
pub fn predict(post: &DualPosterior, likelihood: &Likelihood, x: &DMatrix<f64>) -> Vec<Predictive> {
    predict_outputs(post, likelihood, x, |_| 0)
}

/// The predictive distribution of output `output(i)` at row `i` of `x`
/// (features only: a multi-output model's output index is appended here).
pub fn predict_outputs(
    post: &DualPosterior,
    likelihood: &Likelihood,
    x: &DMatrix<f64>,
    output: impl Fn(usize) -> usize,
) -> Vec<Predictive> {
    let x = model_inputs(likelihood, x, &output);
    let mut out = Vec::with_capacity(x.nrows());
    post.predict_f(&x)
        .for_each_point(|i, mean, var| out.push(likelihood.predict_of(output(i), mean, var)));
    out
}

/// Mean negative log predictive density, RMSE of the predictive mean (for
/// moments) and accuracy (for classes) on a labelled set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// The mean negative log predictive density.
    pub nlpd: f64,
    /// The root mean squared error of the mean, for real-valued labels.
    pub rmse: Option<f64>,
    /// The share of labels predicted as the most probable class, for classes.
    pub accuracy: Option<f64>,
}

/// Metrics over all of `data` (for a multi-output model, pooled over its
/// outputs; see [`evaluate_by_output`]).
pub fn evaluate(post: &DualPosterior, likelihood: &Likelihood, data: &Data) -> Result<Metrics> {
    Ok(sums_by(&[(post, likelihood)], data, 1, |_| 0)?[0].metrics())
}

/// Metrics of each output on its own records: entry `d` is output `d`'s,
/// `None` where the test set has no record of it.
pub fn evaluate_by_output(post: &DualPosterior, likelihood: &Likelihood, data: &Data) -> Result<Vec<Option<Metrics>>> {
    by_output(&[(post, likelihood)], data)
}

/// Equally weighted posteriors, each with its likelihood: draws of the
/// hyperparameters, whose predictive is the average of theirs (Monte Carlo
/// over `θ`, as VAR-GP predicts).
pub type Draws = [(DualPosterior, Likelihood)];

/// The predictive distribution of `y` at every row of `x`, averaged over the draws.
pub fn predict_mixture(draws: &Draws, x: &DMatrix<f64>) -> Vec<Predictive> {
    let each: Vec<Vec<Predictive>> = draws.iter().map(|(post, lik)| predict(post, lik, x)).collect();
    (0..x.nrows()).map(|i| average(each.iter().map(|e| &e[i]))).collect()
}

/// [`evaluate`] of the draws' mixture: the NLPD is of the averaged density.
pub fn evaluate_mixture(draws: &Draws, data: &Data) -> Result<Metrics> {
    Ok(sums_by(&as_refs(draws), data, 1, |_| 0)?[0].metrics())
}

/// [`evaluate_by_output`] of the draws' mixture.
pub fn evaluate_mixture_by_output(draws: &Draws, data: &Data) -> Result<Vec<Option<Metrics>>> {
    by_output(&as_refs(draws), data)
}

fn as_refs(draws: &Draws) -> Vec<(&DualPosterior, &Likelihood)> {
    draws.iter().map(|(post, lik)| (post, lik)).collect()
}

fn by_output(draws: &[(&DualPosterior, &Likelihood)], data: &Data) -> Result<Vec<Option<Metrics>>> {
    let outputs = draws.first().map_or(1, |(_, lik)| lik.n_outputs());
    let sums = sums_by(draws, data, outputs, |i| data.output(i))?;
    Ok(sums.iter().map(|s| (s.n > 0).then(|| s.metrics())).collect())
}

/// The metrics' sums of the draws' mixture over the records, record `i`
/// counted in group `group(i)` of `groups`.
fn sums_by(
    draws: &[(&DualPosterior, &Likelihood)],
    data: &Data,
    groups: usize,
    group: impl Fn(usize) -> usize,
) -> Result<Vec<Sums>> {
    let Some(&(first, likelihood)) = draws.first() else {
        return Err(ModelError::Config("a mixture needs at least one draw".into()));
    };
    data.check(first.d(), likelihood)?;
    let each: Vec<Vec<(f64, Predictive)>> = draws.iter().map(|(post, lik)| scored(post, lik, data)).collect();
    let mut sums = vec![Sums::default(); groups];
    for i in 0..data.n() {
        let log_densities: Vec<f64> = each.iter().map(|e| e[i].0).collect();
        let predictive = average(each.iter().map(|e| &e[i].1));
        sums[group(i)].add(log_mean_exp(&log_densities), &predictive, data.y()[i]);
    }
    Ok(sums)
}

/// Each record's log predictive density of its label and its predictive.
fn scored(post: &DualPosterior, likelihood: &Likelihood, data: &Data) -> Vec<(f64, Predictive)> {
    let mut out = Vec::with_capacity(data.n());
    post.predict_f(data.x()).for_each_point(|i, mean, var| {
        let d = data.output(i);
        out.push((
            likelihood.log_predictive_of(d, mean, var, data.y()[i]),
            likelihood.predict_of(d, mean, var),
        ));
    });
    out
}

/// `log mean exp`, exact for one value.
fn log_mean_exp(values: &[f64]) -> f64 {
    if let [only] = values {
        return *only;
    }
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return max;
    }
    max + (values.iter().map(|v| (v - max).exp()).sum::<f64>() / values.len() as f64).ln()
}

/// The equally weighted mixture of predictives of one kind: class
/// probabilities averaged; moments matched (the mean of the means, the
/// variance by the law of total variance). One predictive is returned as it is.
fn average<'a>(predictives: impl Iterator<Item = &'a Predictive>) -> Predictive {
    let all: Vec<&Predictive> = predictives.collect();
    let n = all.len() as f64;
    if let [only] = all.as_slice() {
        return (*only).clone();
    }
    let (mut mean, mut second_moment, mut probabilities) = (0.0, 0.0, Vec::new());
    for p in &all {
        match p {
            Predictive::Moments { mean: m, var } => {
                mean += m / n;
                second_moment += (var + m * m) / n;
            }
            Predictive::Classes(q) => {
                probabilities.resize(q.len(), 0.0);
                for (sum, q) in probabilities.iter_mut().zip(q) {
                    *sum += q / n;
                }
            }
        }
    }
    match all.first() {
        Some(Predictive::Moments { .. }) => Predictive::Moments {
            mean,
            var: (second_moment - mean * mean).max(0.0),
        },
        _ => Predictive::Classes(probabilities),
    }
}

/// Running sums of the test metrics.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    n: usize,
    nlpd: f64,
    sq: f64,
    hits: usize,
    classes: usize,
}

impl Sums {
    /// One record: the log density of its label `y` and its predictive.
    fn add(&mut self, log_density: f64, predictive: &Predictive, y: f64) {
        self.n += 1;
        self.nlpd -= log_density;
        match predictive {
            Predictive::Moments { mean, .. } => self.sq += (mean - y).powi(2),
            Predictive::Classes(p) => {
                self.classes += 1;
                let best = p
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(c, _)| c);
                self.hits += usize::from(best as f64 == y);
            }
        }
    }

    /// RMSE over the records with moments, accuracy over those with classes.
    fn metrics(&self) -> Metrics {
        let moments = self.n - self.classes;
        Metrics {
            nlpd: self.nlpd / self.n as f64,
            rmse: (moments > 0).then(|| (self.sq / moments as f64).sqrt()),
            accuracy: (self.classes > 0).then(|| self.hits as f64 / self.classes as f64),
        }
    }
}
