//! What past data no longer at hand says about the inducing values `u = f(Z)`:
//! per latent a Gaussian factor `t(u) = exp(η₁ᵀu − ½ uᵀη₂u)`, the u-space form
//! `η₁ = K⁻¹l`, `η₂ = K⁻¹ΛK⁻¹` of its site totals. Held fixed while the
//! M-step moves `θ` (as Bui et al. 2017 hold `q_old(a)/p_old(a)`), it keeps
//! what past data said about `θ` in the objective instead of leaving that to
//! the memory alone.

use nalgebra::{DMatrix, DVector};

use crate::model::math::kernel::Rows;
use crate::model::math::linalg::{coupled_rows, solve_lower_transposed_matrix_in_place, symmetrize};
use crate::model::posterior::{keeping_message, same_inducing_inputs, DualPosterior, Sites};

/// Kept over the inducing inputs `Z_a` it was formed over, whitened by the
/// Cholesky factor `L₀` of the `K₀` it was formed under (`η̃₁ = L₀ᵀη₁ =
/// L₀⁻¹l`, `η̃₂ = L₀ᵀη₂L₀ = L₀⁻¹ΛL₀⁻ᵀ`: the posterior's own whitened sites at
/// that moment). When `Z` has moved since, `u_a = f(Z_a)` is seen from the
/// current `u` through the prior's conditional under the current `θ`, as Bui et
/// al. do: `E_q[log t(u_a)]` is the expectation of the sites it gives over `u`
/// plus `−½tr(η₂Q_a)`, `Q_a = K_aa − K_au K⁻¹ K_ua` ([`PastMessage::conditional_term`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PastMessage {
    z: DMatrix<f64>,
    l0: DMatrix<f64>,
    eta: Vec<Sites>,
    /// `η` in u-space, `(η₁, η₂)` per latent: fixed while the M-step moves `θ`,
    /// so made once rather than at every evaluation.
    eta_u: Vec<Sites>,
}

impl PastMessage {
    /// The message of `whitened` (site totals whitened under `post`'s
    /// kernel and `Z`), with `η̃₂`'s negative eigenvalues set to zero (see
    /// [`without_negative_curvature`]).
    pub fn of(post: &DualPosterior, whitened: &[Sites]) -> Self {
        let eta: Vec<Sites> = whitened
            .iter()
            .map(|s| Sites {
                l: s.l.clone(),
                lambda: without_negative_curvature(s.lambda.clone()),
            })
            .collect();
        let l0 = post.factors().chol_k.l();
        PastMessage {
            z: post.z.clone(),
            eta_u: u_space(&l0, &eta),
            l0,
            eta,
        }
    }

    /// The same message at `factor` times its weight.
    pub fn scaled(mut self, factor: f64) -> Self {
        for eta in &mut self.eta {
            eta.l *= factor;
            eta.lambda *= factor;
        }
        self.eta_u = u_space(&self.l0, &self.eta);
        self
    }

    /// How `post` sees the message: `K(Z_a, Z)` and `T` under its kernel and `Z`.
    pub fn seen_from(&self, post: &DualPosterior) -> Seen {
        let cross = post.inducing_cross(&self.z, &post.z);
        let t = keeping_message(&self.l0, &cross, &post.factors().chol_k);
        Seen { cross, t }
    }

    /// Its sites over `post`'s `Z` under `post`'s kernel, whitened:
    /// `(Tη̃₁, Tη̃₂Tᵀ)` with `T = L⁻¹K(Z, Z_a)L₀⁻ᵀ` ([`keeping_message`]).
    pub fn whitened(&self, post: &DualPosterior) -> Vec<Sites> {
        self.whitened_as(&self.seen_from(post))
    }

    /// [`whitened`](Self::whitened), as `seen` from the posterior.
    pub fn whitened_as(&self, seen: &Seen) -> Vec<Sites> {
        self.eta
            .iter()
            .map(|eta| {
                let mut sites = eta.clone();
                sites.transform(&seen.t);
                sites
            })
            .collect()
    }

    /// What `E_q[log t(u_a)]` has beyond the expectation of [`whitened`](Self::whitened)'s
    /// sites when `Z` has moved from `Z_a`: `−½ Σ_c tr(η₂Q_a)` (`= −½tr(η̃₂W)`,
    /// `W = L₀⁻¹K_aaL₀⁻ᵀ − GGᵀ`, `G = L₀⁻¹K_auL⁻ᵀ`), and the gradient of the
    /// whole `E_q[log t(u_a)]` with `q(u)` held: in the kernel's log-parameters,
    /// and in `Z` if `with_z`. Zero while `Z` is where the message was formed
    /// and stays there: the sites carry it all. `seen` is how `post` sees the
    /// message ([`seen_from`](Self::seen_from)).
    pub fn conditional_term(&self, post: &DualPosterior, seen: &Seen, with_z: bool) -> ConditionalTerm {
        let mut grad = DVector::zeros(post.kernel.n_params());
        if self.z == post.z && !with_z {
            return ConditionalTerm {
                value: 0.0,
                grad,
                grad_z: None,
            };
        }
        let factors = post.factors();
        let Seen { cross, t } = seen;
        let mut k_aa = post.kernel.matrix(&self.z, &self.z);
        for i in 0..k_aa.nrows() {
            k_aa[(i, i)] += post.jitter;
        }
        // G = L₀⁻¹K_auL⁻ᵀ = Tᵀ, and tr(η̃₂L₀⁻¹K_aaL₀⁻ᵀ) = tr(η₂K_aa).
        let g_gt = t.transpose() * t;
        let k_inv = factors.k_inv();
        let (mut g_ab, mut g_aa, mut g_bb) = (
            DMatrix::zeros(cross.nrows(), cross.ncols()),
            DMatrix::zeros(k_aa.nrows(), k_aa.ncols()),
            DMatrix::zeros(post.m(), post.m()),
        );
        let mut value = 0.0;
        for (c, (eta, eta_u)) in self.eta.iter().zip(&self.eta_u).enumerate() {
            value -= 0.5 * (eta_u.lambda.dot(&k_aa) - eta.lambda.dot(&g_gt));
            // Over u: l = K_uaη₁, Λ = K_uaη₂K_au.
            let (eta1, eta2) = (&eta_u.l, &eta_u.lambda);
            let (w_c, r_inv) = (&factors.w[c], factors.r_inv(c));
            let l = cross.tr_mul(eta1);
            let eta2_cross = eta2 * cross;
            // As one matrix product: nalgebra's `tr_mul` takes a dot product per entry.
            let lambda = cross.transpose() * &eta2_cross;
            // E = η₁ᵀK_auw − ½wᵀΛw − ½tr(ΛR⁻¹) − ½tr(η₂K_aa) + ½tr(η₂K_auK⁻¹K_ua), with
            // w = K⁻¹μ and R⁻¹ = K⁻¹SK⁻¹ following K as q(u) = N(μ, S) is held.
            let outer = w_c * w_c.transpose() + r_inv - k_inv;
            g_ab += eta1 * w_c.transpose() - eta2_cross * outer;
            g_aa -= 0.5 * eta2;
            let residual = &l - &lambda * w_c;
            let k_inv_lambda = k_inv * &lambda;
            let sym = &k_inv_lambda * r_inv;
            g_bb +=
                -(k_inv * residual) * w_c.transpose() + 0.5 * (&sym + sym.transpose()) - 0.5 * &k_inv_lambda * k_inv;
        }
        let kernel = &post.kernel;
        // The jitter, on K_aa's and K's diagonals and where Z_a and Z share an input, follows θ.
        let on_jitter = g_aa.trace()
            + g_bb.trace()
            + same_inducing_inputs(&self.z, &post.z)
                .iter()
                .map(|&ij| g_ab[ij])
                .sum::<f64>();
        // Z enters K_au as its second input and K on both sides (θ sees half of G + Gᵀ there).
        let (ab, bb) = if with_z {
            (Rows::OfB, Rows::OfA)
        } else {
            (Rows::Neither, Rows::Neither)
        };
        let (theta_ab, z_ab) = kernel.grads(&self.z, &post.z, &g_ab, ab);
        let (theta_bb, z_bb) = kernel.grads(&post.z, &post.z, &(&g_bb + g_bb.transpose()), bb);
        grad +=
            theta_ab + kernel.matrix_grad(&self.z, &self.z, &g_aa) + 0.5 * theta_bb + post.jitter_grad() * on_jitter;
        let grad_z = z_ab.zip(z_bb).map(|(ab, bb)| ab + bb);
        ConditionalTerm { value, grad, grad_z }
    }
}

/// A [`PastMessage`] as a posterior sees it: `K(Z_a, Z)` and `T =
/// L⁻¹K(Z, Z_a)L₀⁻ᵀ` under its kernel and `Z`. The message's sites and its
/// conditional term both need them: made once for each `θ` an M-step tries.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    cross: DMatrix<f64>,
    t: DMatrix<f64>,
}

/// [`PastMessage::conditional_term`]: its value and gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct ConditionalTerm {
    /// The term.
    pub value: f64,
    /// In the kernel's log-parameters.
    pub grad: DVector<f64>,
    /// In `Z`, `m × d`, where asked for.
    pub grad_z: Option<DMatrix<f64>>,
}

const POSITIVE_DIAGONAL: &str = "a Cholesky factor has a positive diagonal";

/// The whitened sites `eta` (under `L₀`) in u-space: `η₁ = L₀⁻ᵀη̃₁`, `η₂ = L₀⁻ᵀη̃₂L₀⁻¹`.
fn u_space(l0: &DMatrix<f64>, eta: &[Sites]) -> Vec<Sites> {
    let unwhiten = |v: &DMatrix<f64>| {
        let mut v = v.clone();
        solve_lower_transposed_matrix_in_place(l0, &mut v);
        v
    };
    eta.iter()
        .map(|eta| {
            let l = l0.tr_solve_lower_triangular(&eta.l).expect(POSITIVE_DIAGONAL);
            let mut lambda = unwhiten(&unwhiten(&eta.lambda).transpose());
            symmetrize(&mut lambda);
            Sites { l, lambda }
        })
        .collect()
}

/// `a` (symmetric) with its negative eigenvalues set to zero. Past data of a
/// log-concave likelihood says `u` is at least as certain as the prior does,
/// so its message has no negative curvature; in the totals it can have some,
/// from rounding that `K`'s condition number amplifies (on bike, eigenvalues
/// of `−4` beside `10¹⁰`, before the totals were held whitened). Re-expressed
/// at another `θ`, such a direction makes `I + P` indefinite and `F` noise,
/// which the M-step then climbs. (A
/// Student-t message may truly curve down somewhere; this drops that too.)
fn without_negative_curvature(a: DMatrix<f64>) -> DMatrix<f64> {
    let (a, coupled) = coupled_rows(&a);
    let mut out = DMatrix::from_diagonal(&a.diagonal().map(|v| v.max(0.0)));
    if !coupled.is_empty() {
        let mut eigen = a.select_rows(&coupled).select_columns(&coupled).symmetric_eigen();
        eigen.eigenvalues.apply(|v| *v = v.max(0.0));
        let block = eigen.recompose();
        for (bi, &i) in coupled.iter().enumerate() {
            for (bj, &j) in coupled.iter().enumerate() {
                out[(i, j)] = block[(bi, bj)];
            }
        }
    }
    symmetrize(&mut out);
    out
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

    #[test]
    fn negative_curvature_is_removed_from_matrices_whose_eigensolver_would_return_nan() {
        // diag(1, 0, 0, 0) and off-diagonal entries near 1e−160: nalgebra's
        // symmetric_eigen gives NaN on it as it is.
        let a = DMatrix::from_fn(4, 4, |i, j| match (i, j) {
            (0, 0) => 1.0,
            _ if i == j => 0.0,
            _ => 1e-160 * (1 + i + j) as f64,
        });
        let cleaned = without_negative_curvature(a.clone());
        assert!(cleaned.iter().all(|v| v.is_finite()), "{cleaned}");
        assert!(max_abs_diff(&cleaned, &a) <= f64::EPSILON, "{cleaned}");
    }

    #[test]
    fn negative_curvature_is_removed_from_a_matrix_with_zero_rows() {
        // A 44 × 44 principal block of a message's η̃₂ from a Bayesian
        // optimisation run, its non-zero entries exactly: rows 5–17, 19–42
        // are zero, and nalgebra's symmetric_eigen gives NaN on it as it is.
        let entries = [
            ((0, 0), 155.58587488931286),
            ((0, 1), 10.021726359450751),
            ((0, 2), 11.746840222511786),
            ((0, 3), 22.45175345096957),
            ((0, 18), -5.229150445984487e-14),
            ((0, 43), 3.7692071686024065e-14),
            ((1, 1), 6.09142095472368),
            ((1, 2), 7.216936408378471),
            ((1, 3), 13.793741284278687),
            ((2, 2), 8.55281143860091),
            ((2, 3), 16.34700122034153),
            ((2, 4), 1.0169642905566434e-13),
            ((3, 3), 31.244047739882593),
            ((4, 4), 9.250378241176804e-13),
        ];
        let mut a = DMatrix::zeros(44, 44);
        for ((i, j), v) in entries {
            a[(i, j)] = v;
            a[(j, i)] = v;
        }
        let cleaned = without_negative_curvature(a.clone());
        assert!(cleaned.iter().all(|v| v.is_finite()), "{cleaned}");
        // a is positive semi-definite to rounding: cleaning leaves it.
        assert!(max_abs_diff(&cleaned, &a) <= 1e-12, "{}", max_abs_diff(&cleaned, &a));
    }

    fn max_abs_diff(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
        (a - b).amax()
    }

    #[test]
    fn under_the_kernel_it_was_formed_under_a_message_gives_back_its_sites() {
        let post = posterior();
        let a = DMatrix::from_fn(6, 9, |i, j| ((i + 2 * j) as f64).cos());
        let given = sites(&a * a.transpose());
        let back = &PastMessage::of(&post, std::slice::from_ref(&given)).whitened(&post)[0];
        assert!(max_abs_diff(&back.lambda, &given.lambda) < 1e-10 * given.lambda.amax());
        assert!((&back.l - &given.l).amax() < 1e-10 * given.l.amax());
    }

    #[test]
    fn under_another_kernel_a_message_says_the_same_about_u() {
        let mut post = posterior();
        let a = DMatrix::from_fn(6, 4, |i, j| ((i + 3 * j) as f64 * 0.7).sin());
        let given = sites(&a * a.transpose());
        let l0 = post.factors().chol_k.l();
        // u-space natural parameters: η₁ = L₀⁻ᵀh, η₂ = L₀⁻ᵀPL₀⁻¹.
        let l0_inv = l0.clone().try_inverse().unwrap();
        let eta1 = l0_inv.transpose() * &given.l;
        let eta2 = l0_inv.transpose() * &given.lambda * &l0_inv;
        let message = PastMessage::of(&post, std::slice::from_ref(&given));

        post.kernel = Kernel::stationary(Family::Matern52, 2.1, vec![0.5, 1.6]);
        post.refresh().unwrap();
        let back = &message.whitened(&post)[0];
        // Its totals under K are (Kη₁, Kη₂K): whitened, (L⁻¹Kη₁, L⁻¹Kη₂KL⁻ᵀ).
        let k = post.k_zz();
        let l_inv = post.factors().chol_k.l().try_inverse().unwrap();
        let want_l = &l_inv * &k * &eta1;
        let want_lambda = &l_inv * &k * &eta2 * &k * l_inv.transpose();
        assert!((&back.l - &want_l).amax() < 1e-9 * want_l.amax());
        assert!(max_abs_diff(&back.lambda, &want_lambda) < 1e-9 * want_lambda.amax());
    }

    #[test]
    fn a_message_drops_the_negative_curvature_its_sites_had() {
        let mut post = posterior();
        let a = DMatrix::from_fn(6, 3, |i, j| ((i * j) as f64 * 0.3 + 0.2).sin());
        let v = DVector::from_fn(6, |i, _| if i % 2 == 0 { 1.0 } else { -1.0 });
        let given = sites(&a * a.transpose() - 0.05 * &v * v.transpose());
        let min_eigenvalue = |m: &DMatrix<f64>| m.clone().symmetric_eigenvalues().min();
        assert!(min_eigenvalue(&given.lambda) < -1e-3, "the test needs indefinite sites");

        let message = PastMessage::of(&post, std::slice::from_ref(&given));
        // At the kernel it was formed under and at another, I + P stays positive definite.
        for variance in [1.3, 2.0] {
            post.kernel = Kernel::stationary(Family::Matern52, variance, vec![0.7, 1.1]);
            post.refresh().unwrap();
            let lambda = &message.whitened(&post)[0].lambda;
            assert!(min_eigenvalue(lambda) > -1e-12 * lambda.amax(), "variance {variance}");
        }
    }
}
