//! The interface every streaming learner implements, so that what they share
//! (predicting, scoring, naming their hyperparameters) is written once and a
//! pipeline can hold any of them.

use nalgebra::DMatrix;

use crate::model::data::Data;
use crate::model::dual::objective::named_hyperparameters;
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::{Likelihood, Predictive};
use crate::model::math::kernel::Kernel;
use crate::model::posterior::DualPosterior;
use crate::model::predict::{
    evaluate, evaluate_by_output, evaluate_mixture, evaluate_mixture_by_output, predict, predict_mixture, Metrics,
};

/// What one update did: figures every learner has, and its own by name.
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    /// Updates so far, this one included.
    pub batch: u64,
    /// Records learned so far, this batch's included.
    pub n_seen: u64,
    /// Wall-clock seconds the update took.
    pub seconds: f64,
    /// Figures of this learner's own (E-steps, bound, …), by name.
    pub details: Vec<(&'static str, f64)>,
}

/// A learner that takes a stream batch by batch and predicts in between. Its
/// state is a serde value (the checkpoint); after deserialising one, call
/// [`ensure_factors`](Self::ensure_factors) before predicting.
pub trait StreamingLearner {
    /// Learns one batch, its records known by their row index.
    fn learn_batch(&mut self, batch: &Data) -> Result<Learned>;

    /// The current posterior over the inducing values, if there is one yet.
    fn posterior(&self) -> Option<&DualPosterior>;

    /// The current posterior, to change in place (a restored checkpoint's factors).
    fn posterior_mut(&mut self) -> Option<&mut DualPosterior>;

    /// The kernel the learner started from.
    fn prior_kernel(&self) -> &Kernel;

    /// The likelihood, with its current parameters.
    fn likelihood(&self) -> &Likelihood;

    /// Batches learned so far.
    fn batches(&self) -> u64;

    /// The posterior predictions come from: none before the first batch.
    fn fitted(&self) -> Result<&DualPosterior> {
        self.posterior()
            .filter(|_| self.batches() > 0)
            .ok_or_else(|| ModelError::Config("the model has not seen a batch yet".into()))
    }

    /// The kernel: the prior's until the first batch, then the learned one.
    fn kernel(&self) -> &Kernel {
        self.posterior().map_or(self.prior_kernel(), |p| &p.kernel)
    }

    /// Draws of a posterior over the hyperparameters, each the fitted
    /// posterior under one `θ`, that predictions average over; `None` (the
    /// default): predictions come from the fitted posterior alone.
    fn theta_draws(&self) -> Result<Option<Vec<(DualPosterior, Likelihood)>>> {
        Ok(None)
    }

    /// Rebuilds the cached factors a deserialised learner lacks.
    fn ensure_factors(&mut self) -> Result<()> {
        self.posterior_mut().map_or(Ok(()), DualPosterior::ensure_factors)
    }

    /// Predictive distributions at the rows of `x`.
    fn predict(&self, x: &DMatrix<f64>) -> Result<Vec<Predictive>> {
        let post = self.fitted()?;
        let features = self.likelihood().features(post.d());
        if x.ncols() != features {
            return Err(ModelError::Dimension {
                what: "inputs".into(),
                expected: features,
                got: x.ncols(),
            });
        }
        Ok(match self.theta_draws()? {
            Some(draws) => predict_mixture(&draws, x),
            None => predict(post, self.likelihood(), x),
        })
    }

    /// Test metrics on `data`.
    fn evaluate(&self, data: &Data) -> Result<Metrics> {
        match self.theta_draws()? {
            Some(draws) => evaluate_mixture(&draws, data),
            None => evaluate(self.fitted()?, self.likelihood(), data),
        }
    }

    /// Test metrics of each output on its own records (`None`: no record of it).
    fn evaluate_by_output(&self, data: &Data) -> Result<Vec<Option<Metrics>>> {
        match self.theta_draws()? {
            Some(draws) => evaluate_mixture_by_output(&draws, data),
            None => evaluate_by_output(self.fitted()?, self.likelihood(), data),
        }
    }

    /// Kernel then likelihood hyperparameters by name, on their natural scale.
    fn hyperparameters(&self) -> Vec<(String, f64)> {
        named_hyperparameters(self.kernel(), self.likelihood())
    }
}

/// The [`StreamingLearner`] accessors of a learner that keeps its state in
/// fields `posterior: Option<DualPosterior>`, `kernel` (the prior),
/// `likelihood` and `batches`: written once, for every such learner.
macro_rules! field_accessors {
    () => {
        fn posterior(&self) -> Option<&DualPosterior> {
            self.posterior.as_ref()
        }

        fn posterior_mut(&mut self) -> Option<&mut DualPosterior> {
            self.posterior.as_mut()
        }

        fn prior_kernel(&self) -> &Kernel {
            &self.kernel
        }

        fn batches(&self) -> u64 {
            self.batches
        }

        fn likelihood(&self) -> &Likelihood {
            &self.likelihood
        }
    };
}
pub(crate) use field_accessors;
