//! Predictions of `y` and the test metrics the evaluation reports.

use nalgebra::DMatrix;

use crate::model::data::Data;
use crate::model::dual::posterior::DualPosterior;
use crate::model::error::Result;
use crate::model::likelihood::{Likelihood, Predictive};

/// The predictive distribution of `y` at every row of `x` (of output 0 for a
/// multi-output model; see [`predict_outputs`]).
pub fn predict(post: &DualPosterior, likelihood: &Likelihood, x: &DMatrix<f64>) -> Vec<Predictive> {
    predict_outputs(post, likelihood, x, |_| 0)
}

/// The predictive distribution of output `output(i)` at row `i` of `x`.
pub fn predict_outputs(
    post: &DualPosterior,
    likelihood: &Likelihood,
    x: &DMatrix<f64>,
    output: impl Fn(usize) -> usize,
) -> Vec<Predictive> {
    let mut out = Vec::with_capacity(x.nrows());
    post.predict_f(x)
        .for_each_point(|i, mean, var| out.push(likelihood.predict_of(output(i), mean, var)));
    out
}

/// Mean negative log predictive density, RMSE of the predictive mean (for
/// moments) and accuracy (for classes) on a labelled set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    pub nlpd: f64,
    pub rmse: Option<f64>,
    pub accuracy: Option<f64>,
}

/// Metrics over all of `data` (for a multi-output model, pooled over its
/// outputs; see [`evaluate_by_output`]).
pub fn evaluate(post: &DualPosterior, likelihood: &Likelihood, data: &Data) -> Result<Metrics> {
    data.check(post.d(), likelihood)?;
    let mut sums = Sums::default();
    post.predict_f(data.x())
        .for_each_point(|i, mean, var| sums.add(likelihood, data.output(i), mean, var, data.y()[i]));
    Ok(sums.metrics())
}

/// Metrics of each output on its own records: entry `d` is output `d`'s,
/// `None` where the test set has no record of it.
pub fn evaluate_by_output(post: &DualPosterior, likelihood: &Likelihood, data: &Data) -> Result<Vec<Option<Metrics>>> {
    data.check(post.d(), likelihood)?;
    let mut sums = vec![Sums::default(); likelihood.n_outputs()];
    post.predict_f(data.x()).for_each_point(|i, mean, var| {
        let d = data.output(i);
        sums[d].add(likelihood, d, mean, var, data.y()[i]);
    });
    Ok(sums.iter().map(|s| (s.n > 0).then(|| s.metrics())).collect())
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
    fn add(&mut self, likelihood: &Likelihood, d: usize, mean: &[f64], var: &[f64], y: f64) {
        self.n += 1;
        self.nlpd -= likelihood.log_predictive_of(d, mean, var, y);
        match likelihood.predict_of(d, mean, var) {
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
