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
    /// `η̃₁ = L₀⁻¹l`, `η̃₂ = L₀⁻¹ΛL₀⁻ᵀ`, with `η̃₂`'s negative eigenvalues
    /// set to zero (see [`without_negative_curvature`]).
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
                    without_negative_curvature(eta2)
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

/// `a` (symmetric) with its negative eigenvalues set to zero. Past data of a
/// log-concave likelihood says `u` is at least as certain as the prior does,
/// so its message has no negative curvature; in the totals it can have some,
/// from rounding that `K`'s condition number amplifies (on bike, eigenvalues
/// of `−4` beside `10¹⁰`). Re-expressed at another `θ`, such a direction makes
/// `K + Λ` indefinite and `F` noise, which the M-step then climbs. (A
/// Student-t message may truly curve down somewhere; this drops that too.)
fn without_negative_curvature(a: DMatrix<f64>) -> DMatrix<f64> {
    let mut eigen = a.symmetric_eigen();
    eigen.eigenvalues.apply(|v| *v = v.max(0.0));
    let mut a = eigen.recompose();
    symmetrize(&mut a);
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Family, Kernel};

    fn posterior() -> DualPosterior {
        let z = DMatrix::from_fn(6, 2, |i, j| ((i * 7 + j * 3) % 5) as f64 * 0.4 - 0.8);
        let kernel = Kernel::stationary(Family::Matern52, 1.3, vec![0.7, 1.1]);
        DualPosterior::new(kernel, z, 1).unwrap()
    }

    fn sites(lambda: DMatrix<f64>) -> Sites {
        Sites {
            l: DVector::from_fn(lambda.nrows(), |i, _| (i as f64 * 0.9).sin()),
            lambda,
        }
    }

    fn max_abs_diff(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
        (a - b).amax()
    }

    #[test]
    fn under_the_kernel_it_was_formed_under_a_message_gives_back_its_sites() {
        let post = posterior();
        let k = post.k_zz();
        let a = DMatrix::from_fn(6, 9, |i, j| ((i + 2 * j) as f64).cos());
        let given = sites(&k * &a * a.transpose() * &k);
        let back = &PastMessage::of(&post, std::slice::from_ref(&given)).sites(&post)[0];
        let scale = given.lambda.amax();
        assert!(max_abs_diff(&back.lambda, &given.lambda) < 1e-10 * scale);
        assert!((&back.l - &given.l).amax() < 1e-10 * given.l.amax());
    }

    #[test]
    fn a_message_drops_the_negative_curvature_its_sites_had() {
        let mut post = posterior();
        let k = post.k_zz();
        let a = DMatrix::from_fn(6, 3, |i, j| ((i * j) as f64 * 0.3 + 0.2).sin());
        let v = DVector::from_fn(6, |i, _| if i % 2 == 0 { 1.0 } else { -1.0 });
        let psd = &k * &a * a.transpose() * &k;
        let given = sites(&psd - 0.05 * &v * v.transpose());
        let min_eigenvalue = |m: &DMatrix<f64>| m.clone().symmetric_eigenvalues().min();
        assert!(min_eigenvalue(&given.lambda) < -1e-3, "the test needs indefinite sites");

        let message = PastMessage::of(&post, std::slice::from_ref(&given));
        // At the kernel it was formed under and at another, K + Λ stays positive definite.
        for variance in [1.3, 2.0] {
            post.kernel = Kernel::stationary(Family::Matern52, variance, vec![0.7, 1.1]);
            let lambda = &message.sites(&post)[0].lambda;
            assert!(min_eigenvalue(lambda) > -1e-12 * lambda.amax(), "variance {variance}");
        }
    }
}
