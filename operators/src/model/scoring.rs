//! Scoring records with the newest model a worker holds: each input's
//! predictive distribution and, for a labelled one, its label's log
//! predictive density (its prequential score). Before the first update the
//! model is the prior.

use nalgebra::DMatrix;

use crate::model::data::model_inputs;
use crate::model::dual::snapshot::Snapshot;
use crate::model::likelihood::{Likelihood, Predictive};
use crate::model::math::kernel::Kernel;
use crate::model::posterior::Marginals;

/// The model records are scored with: the prior until the first update.
#[derive(Debug, Clone)]
pub enum ScoringModel {
    /// `N(0, k(x, x))` for every latent, under the stream's likelihood.
    Prior {
        /// The prior's kernel.
        kernel: Kernel,
        /// The stream's likelihood.
        likelihood: Likelihood,
    },
    /// A learned model, factorised for predicting.
    Learned(Box<Snapshot>),
}

/// One input's score: its output's predictive, its label's log density
/// (when it has a label), and every output's predictive (when asked for).
pub type Scored = (Predictive, Option<f64>, Vec<Predictive>);

/// An input to score: its features, the output it observes and its label.
#[derive(Debug, Clone, Copy)]
pub struct ToScore<'a> {
    /// Its features.
    pub features: &'a [f64],
    /// The output it observes (0 for a single-output model).
    pub output: usize,
    /// Its label, if it has one.
    pub label: Option<f64>,
}

impl ScoringModel {
    /// The likelihood predictions go through.
    pub fn likelihood(&self) -> &Likelihood {
        match self {
            ScoringModel::Learned(model) => &model.likelihood,
            ScoringModel::Prior { likelihood, .. } => likelihood,
        }
    }

    /// Each input's [`Scored`]; every output's predictive too if `all_outputs`.
    pub fn score(&self, inputs: &[ToScore<'_>], features: usize, all_outputs: bool) -> Vec<Scored> {
        let x = DMatrix::from_fn(inputs.len(), features, |i, j| inputs[i].features[j]);
        let likelihood = self.likelihood();
        // Every output's predictive needs each output's own latent marginal.
        let mut every: Vec<Vec<Predictive>> = vec![Vec::new(); inputs.len()];
        if all_outputs {
            for o in 0..likelihood.n_outputs() {
                self.marginals(&x, |_| o)
                    .for_each_point(|i, mean, var| every[i].push(likelihood.predict_of(o, mean, var)));
            }
        }
        let mut out = Vec::with_capacity(inputs.len());
        self.marginals(&x, |i| inputs[i].output).for_each_point(|i, mean, var| {
            let d = inputs[i].output;
            let density = inputs[i].label.map(|y| likelihood.log_predictive_of(d, mean, var, y));
            out.push((
                likelihood.predict_of(d, mean, var),
                density,
                std::mem::take(&mut every[i]),
            ));
        });
        out
    }

    /// The latent marginals at the rows of `x`, row `i` as output `output(i)`
    /// (a multi-output model reads the index as its last input).
    pub fn marginals(&self, x: &DMatrix<f64>, output: impl Fn(usize) -> usize) -> Marginals {
        let likelihood = self.likelihood();
        let x = model_inputs(likelihood, x, output);
        match self {
            ScoringModel::Learned(model) => model.posterior.predict_f(&x),
            ScoringModel::Prior { kernel, .. } => {
                let prior = kernel.diag(&x);
                let q = likelihood.n_latent();
                Marginals {
                    mean: DMatrix::zeros(x.nrows(), q),
                    var: DMatrix::from_fn(x.nrows(), q, |i, _| prior[i]),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::data::Data;
    use crate::model::dual::sequential::{SequentialConfig, SequentialLearner};
    use crate::model::learner::StreamingLearner;
    use crate::model::math::kernel::Family;
    use nalgebra::DVector;

    /// The prior's score is the closed form: mean 0, variance `k(x, x)` plus
    /// the noise, and the label's Gaussian log density under it.
    #[test]
    fn the_prior_scores_by_its_closed_form() {
        let kernel = Kernel::stationary(Family::Matern52, 2.0, vec![1.0]);
        let likelihood = Likelihood::Gaussian { variance: 0.5 };
        let prior = ScoringModel::Prior { kernel, likelihood };
        let scored = prior.score(
            &[ToScore {
                features: &[0.3],
                output: 0,
                label: Some(1.0),
            }],
            1,
            false,
        );
        let (predictive, density, every) = &scored[0];
        assert!(every.is_empty());
        let Predictive::Moments { mean, var } = predictive else {
            panic!("{predictive:?}")
        };
        assert_eq!((*mean, *var), (0.0, 2.5));
        let want = -0.5 * (std::f64::consts::TAU * 2.5).ln() - 1.0 / (2.0 * 2.5);
        assert!((density.unwrap() - want).abs() < 1e-12, "{density:?} vs {want}");
    }

    /// A learned model scores as its posterior predicts.
    #[test]
    fn a_learned_model_scores_as_its_posterior_predicts() {
        let x = DMatrix::from_fn(40, 1, |i, _| i as f64 / 10.0);
        let y = DVector::from_fn(40, |i, _| (i as f64 / 10.0).sin());
        let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.5]);
        let likelihood = Likelihood::Gaussian { variance: 0.01 };
        let config = SequentialConfig {
            inducing: 8,
            ..SequentialConfig::default()
        };
        let mut learner = SequentialLearner::new(kernel, likelihood, config).unwrap();
        learner.learn_batch(&Data::new(x, y).unwrap()).unwrap();
        let snapshot = learner.snapshot().unwrap();
        let want = snapshot.posterior.predict_f(&DMatrix::from_element(1, 1, 1.5));
        let scored = ScoringModel::Learned(Box::new(snapshot)).score(
            &[ToScore {
                features: &[1.5],
                output: 0,
                label: None,
            }],
            1,
            false,
        );
        let (Predictive::Moments { mean, .. }, None, _) = &scored[0] else {
            panic!("{:?}", scored[0])
        };
        assert_eq!(*mean, want.mean[(0, 0)]);
    }
}
