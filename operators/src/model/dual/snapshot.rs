//! The model as the workers see it: enough to score records and to compute
//! their share of an update.

use std::ops::Deref;
use std::sync::Arc;

use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::model::error::Result;
use crate::model::likelihood::{Likelihood, Predictive};
use crate::model::posterior::DualPosterior;
use crate::model::predict::predict;

/// Cheap to clone: every question of an update carries the model, and the
/// workers of one process share one copy of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot(Arc<Parts>);

/// What a [`Snapshot`] holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Parts {
    /// The posterior, its factors made.
    pub posterior: DualPosterior,
    /// The likelihood.
    pub likelihood: Likelihood,
}

impl Deref for Snapshot {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

impl Snapshot {
    /// What the shards need of the model: `post` and `likelihood`, copied.
    pub fn of(post: &DualPosterior, likelihood: &Likelihood) -> Self {
        Snapshot(Arc::new(Parts {
            posterior: post.clone(),
            likelihood: likelihood.clone(),
        }))
    }

    /// The predictive distribution of `y` at each row of `x`.
    pub fn predict(&self, x: &DMatrix<f64>) -> Vec<Predictive> {
        predict(&self.posterior, &self.likelihood, x)
    }

    /// Rebuilds the cached factors a deserialised posterior lacks (a copy
    /// of its own then, if it shared one).
    pub fn ensure_factors(&mut self) -> Result<()> {
        match self.posterior.has_factors() {
            true => Ok(()),
            false => Arc::make_mut(&mut self.0).posterior.ensure_factors(),
        }
    }
}
