//! Predictions of `y` and the test metrics the evaluation reports.

use nalgebra::DMatrix;

use crate::model::data::Data;
use crate::model::dual::posterior::DualPosterior;
use crate::model::error::Result;
use crate::model::likelihood::{Likelihood, Predictive};

/// The predictive distribution of `y` at every row of `x`.
pub fn predict(post: &DualPosterior, likelihood: &Likelihood, x: &DMatrix<f64>) -> Vec<Predictive> {
    let mut out = Vec::with_capacity(x.nrows());
    post.predict_f(x)
        .for_each_point(|_, mean, var| out.push(likelihood.predict(mean, var)));
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

pub fn evaluate(post: &DualPosterior, likelihood: &Likelihood, data: &Data) -> Result<Metrics> {
    data.check(post.d(), likelihood)?;
    let n = data.n() as f64;
    let (mut nlpd, mut sq, mut hits, mut classes) = (0.0, 0.0, 0usize, false);
    post.predict_f(data.x()).for_each_point(|i, mean, var| {
        let y = data.y()[i];
        nlpd -= likelihood.log_predictive(mean, var, y);
        match likelihood.predict(mean, var) {
            Predictive::Moments { mean, .. } => sq += (mean - y).powi(2),
            Predictive::Classes(p) => {
                classes = true;
                let best = p
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(c, _)| c);
                hits += usize::from(best as f64 == y);
            }
        }
    });
    Ok(Metrics {
        nlpd: nlpd / n,
        rmse: (!classes).then(|| (sq / n).sqrt()),
        accuracy: classes.then(|| hits as f64 / n),
    })
}
