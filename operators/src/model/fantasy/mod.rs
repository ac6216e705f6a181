//! Fantasy batches (Chang et al. 2023, Sec. 4.1 and Algorithm 2): a posterior
//! conditioned on observations not yet made, in `O(m²)` a point, so that a
//! batch of points to evaluate next is chosen one at a time, each chosen point
//! fantasised before the next is chosen.
//!
//! - [`site`]: the fantasy label at a point and its site (the E-step's α̂, β̂);
//! - [`conditioned`]: a dual posterior with fantasy sites added, the learner untouched;
//! - [`exact`]: an exact GP that conditions the same way, the gold standard
//!   for the conditioning;
//! - [`acquisition`]: expected improvement, confidence bounds, predictive
//!   entropy, probability of feasibility and their products, with gradients in `x`;
//! - [`propose`]: Algorithm 2 over a box (Sobol or random candidates, then
//!   projected gradient ascent) or a finite pool.

pub mod acquisition;
pub mod conditioned;
pub mod exact;
pub mod propose;
pub mod site;

use nalgebra::{DMatrix, DVector};

use crate::model::error::Result;
use crate::model::likelihood::Likelihood;
use crate::model::posterior::Marginals;

pub use acquisition::Acquisition;
pub use conditioned::Conditioned;
pub use exact::ExactGp;
pub use propose::{propose_batch, Proposal, Search};
pub use site::{fantasy_site, Fantasy, Site};

/// The latent marginals at one point and their gradients in the point.
#[derive(Debug, Clone, PartialEq)]
pub struct PointMarginals {
    /// Per latent `μ_c(x)`.
    pub mean: Vec<f64>,
    /// Per latent `v_c(x)`.
    pub var: Vec<f64>,
    /// Per latent `∂μ_c/∂x`.
    pub d_mean: Vec<DVector<f64>>,
    /// Per latent `∂v_c/∂x`.
    pub d_var: Vec<DVector<f64>>,
}

/// A model Algorithm 2 can fantasise with: it predicts its latent functions,
/// with gradients in the input, and takes a site at a new point.
pub trait Surrogate {
    /// The likelihood of its observations.
    fn likelihood(&self) -> &Likelihood;

    /// Input dimension.
    fn d(&self) -> usize;

    /// Latent marginals at the rows of `x`.
    fn marginals(&self, x: &DMatrix<f64>) -> Marginals;

    /// Latent marginals at `x` and their gradients.
    fn point_marginals(&self, x: &[f64]) -> PointMarginals;

    /// Conditions on a site at `x`.
    fn condition(&mut self, x: &[f64], site: &Site) -> Result<()>;
}
