//! The model as the workers see it: enough to score records and to compute
//! their share of an update.

use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::model::dual::posterior::DualPosterior;
use crate::model::error::Result;
use crate::model::likelihood::{Likelihood, Predictive};
use crate::model::predict::predict;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub posterior: DualPosterior,
    pub likelihood: Likelihood,
}

impl Snapshot {
    /// What the shards need of the model: `post` and `likelihood`, copied.
    pub fn of(post: &DualPosterior, likelihood: &Likelihood) -> Self {
        Snapshot {
            posterior: post.clone(),
            likelihood: likelihood.clone(),
        }
    }

    /// The predictive distribution of `y` at each row of `x`.
    pub fn predict(&self, x: &DMatrix<f64>) -> Vec<Predictive> {
        predict(&self.posterior, &self.likelihood, x)
    }

    /// Rebuilds the cached factors a deserialised posterior lacks.
    pub fn ensure_factors(&mut self) -> Result<()> {
        self.posterior.ensure_factors()
    }
}
