//! What past data no longer at hand says about the inducing values `u = f(Z)`:
//! per latent a Gaussian factor `t(u) = exp(η₁ᵀu − ½ uᵀη₂u)`, the u-space form
//! `η₁ = K⁻¹l`, `η₂ = K⁻¹ΛK⁻¹` of its site totals. Held fixed while the
//! M-step moves `θ` (as Bui et al. 2017 hold `q_old(a)/p_old(a)`), it keeps
//! what past data said about `θ` in the objective instead of leaving that to
//! the memory alone.

use nalgebra::{DMatrix, DVector};

use super::linalg::symmetrize;
use super::posterior::{DualPosterior, Sites};

const POSITIVE_DIAGONAL: &str = "a Cholesky factor has a positive diagonal";

/// Kept whitened by the Cholesky factor `L₀` of the `K₀` it was formed under
/// (`η̃₁ = L₀ᵀη₁`, `η̃₂ = L₀ᵀη₂L₀`): re-expressing it under another `K` then
/// goes through `L₀⁻¹K` once rather than through `K₀⁻¹` twice, which would
/// square `K₀`'s condition number into the sites.
#[derive(Debug, Clone, PartialEq)]
pub struct PastMessage {
    l0: DMatrix<f64>,
    eta1: Vec<DVector<f64>>,
    eta2: Vec<DMatrix<f64>>,
}

impl PastMessage {
    /// The message of `sites` (site totals under `post`'s kernel and `Z`):
    /// `η̃₁ = L₀⁻¹l`, `η̃₂ = L₀⁻¹ΛL₀⁻ᵀ`.
    pub fn of(post: &DualPosterior, sites: &[Sites]) -> Self {
        let l0 = post.factors().chol_k.l();
        let whiten = |a: &DMatrix<f64>| l0.solve_lower_triangular(a).expect(POSITIVE_DIAGONAL);
        PastMessage {
            eta1: sites
                .iter()
                .map(|s| l0.solve_lower_triangular(&s.l).expect(POSITIVE_DIAGONAL))
                .collect(),
            eta2: sites
                .iter()
                .map(|s| {
                    let mut eta2 = whiten(&whiten(&s.lambda).transpose());
                    symmetrize(&mut eta2);
                    eta2
                })
                .collect(),
            l0,
        }
    }

    /// Its site totals under `post`'s current kernel: `l = Kη₁ = Gᵀη̃₁`,
    /// `Λ = Kη₂K = Gᵀη̃₂G` with `G = L₀⁻¹K`.
    pub fn sites(&self, post: &DualPosterior) -> Vec<Sites> {
        let g = self.l0.solve_lower_triangular(&post.k_zz()).expect(POSITIVE_DIAGONAL);
        self.eta1
            .iter()
            .zip(&self.eta2)
            .map(|(eta1, eta2)| {
                let mut lambda = g.tr_mul(&(eta2 * &g));
                symmetrize(&mut lambda);
                Sites {
                    l: g.tr_mul(eta1),
                    lambda,
                }
            })
            .collect()
    }
}
