//! The streaming sparse GP of Bui, Nguyen and Turner (NeurIPS 2017), "online
//! sparse variational GP" (OSGPR): the baseline of Chang et al.'s Table 1.
//!
//! After a batch the model keeps `q_old(a) = N(m_a, S_a)` over its inducing
//! inputs `a` and the old kernel's `K'_aa`. A new batch `(X, y)` is learned
//! over new inducing inputs `b` by maximising, in `q(b)` and `θ`,
//!
//! `F = Σ_i E_q[log p(y_i|f_i)] − KL[q(b) ‖ p_θ(b)] + E_q(a)[log q_old(a) − log p_θold(a)]`
//!
//! (Bui et al.'s online bound; the old approximate likelihood is `q_old(a)/p_θold(a)`).
//! The last term is a Gaussian pseudo-likelihood of `a` with natural parameters
//! `h = S_a⁻¹ m_a` and `P = S_a⁻¹ − K'⁻¹`. We hold `q_old` as dual sites
//! `(l_a, Λ_a)` (as in [`DualPosterior`]: `h = K'⁻¹l_a`, `P = K'⁻¹Λ_aK'⁻¹`)
//! whitened by `L' = chol(K')`: `h_ν = L'⁻¹l_a`, `P_ν = L'⁻¹Λ_aL'⁻ᵀ`. That needs
//! no difference of inverses and stays bounded however ill-conditioned `K'` is
//! (long ARD lengthscales make it so: evaluated unwhitened, the bound on
//! mammographic reached +4700 at batch 7 from rounding alone). Seen from `b`
//! (`L = chol(K_bb)`), the old term is the whitened site `(Gᵀh_ν, GᵀP_νG)` with
//! `G = L'⁻¹K_abL⁻ᵀ`, plus `−½ tr(P_ν W)`, `W = L'⁻¹K_aaL'⁻ᵀ − GGᵀ` (this is
//! `−½ tr(P Q_a)`, `Q_a = K_aa − K_abK⁻¹K_ba`), plus a constant.
//!
//! New inducing inputs: by default greedy pivoted Cholesky over `[a; X_batch]`
//! under the current kernel (old inputs that still explain most stay, batch
//! points take the rest; `m` fixed), or Bui et al.'s code's rule (a random 70 %
//! of `a` kept, the rest random batch points), or fixed; `b` may also move with `θ`.
//!
//! Gaussian likelihood: the optimal `q(b)` is closed form and `F` is Bui et
//! al.'s collapsed bound. Otherwise `q(b) = N(m_b, L Lᵀ)` is explicit (the
//! uncollapsed bound). Either way `θ` (and optionally `b`) climb the profile
//! `θ ↦ F(θ, q*(θ))` by L-BFGS, whose gradient is `∂F/∂θ` at fixed `(m_b, S_b)`
//! (envelope theorem); `q*` is closed form (Gaussian) or the natural-gradient
//! fixed point of the E-step with the old term as one more site.

use std::time::Instant;

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};
use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::model::data::Data;
use crate::model::dual::estep::{e_step_at, EStepConfig, PointSites};
use crate::model::dual::objective::{hyperparameters, set_hyperparameters};
use crate::model::error::{check_inducing, ModelError, Result};
use crate::model::learner::{field_accessors, Learned, StreamingLearner};
use crate::model::likelihood::{Expectation, Likelihood};
use crate::model::math::inducing::{pivoted_cholesky, select_inducing, Pivot};
use crate::model::math::kernel::{Kernel, Rows};
use crate::model::math::linalg::{
    cholesky_jittered, column_sq_norms, log_det, solve_lower_in_place, symmetrize, transposed,
};
use crate::model::math::optim::lbfgs_maximize;
use crate::model::posterior::{Cross, DualPosterior, Sites, DEFAULT_RELATIVE_JITTER};

/// How the inducing inputs `b` of a new batch are chosen from the old `a`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OsgprInducing {
    /// Chosen from the first batch, then kept.
    Fixed,
    /// Greedy pivoted Cholesky over `[a; X_batch]`: keeps the old inputs that
    /// still explain most and replaces the rest by batch points.
    Pivoted,
    /// Bui et al.'s code: keep a random `1 − fraction` of `a`, fill up with
    /// random batch points.
    Replace {
        /// The share of `a` replaced, in `[0, 1]`.
        fraction: f64,
    },
}

/// How [`OsgprLearner`] learns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsgprConfig {
    /// Number of inducing inputs `m`.
    pub inducing: usize,
    /// How a new batch's inducing inputs are chosen.
    pub inducing_policy: OsgprInducing,
    /// Move `b` with the hyperparameters (Bui et al. do).
    pub optimize_z: bool,
    /// L-BFGS iterations on `θ` (and `b`) per batch; 0 keeps them.
    pub max_iter: usize,
    /// L-BFGS history pairs.
    pub history: usize,
    /// Non-Gaussian `q(b)`: at most this many natural-gradient steps per evaluation.
    pub q_steps: usize,
    /// Their damping `ρ ∈ (0, 1]`.
    pub q_rho: f64,
    /// The seed of the random choices (`Replace`'s).
    pub seed: u64,
}

impl Default for OsgprConfig {
    fn default() -> Self {
        OsgprConfig {
            inducing: 100,
            inducing_policy: OsgprInducing::Pivoted,
            optimize_z: false,
            max_iter: 100,
            history: 10,
            q_steps: 50,
            q_rho: 1.0,
            seed: 0,
        }
    }
}

impl OsgprConfig {
    /// Refuses settings that cannot work (no inducing inputs, a fraction outside `[0, 1]`, …).
    pub fn validate(&self) -> Result<()> {
        check_inducing(self.inducing)?;
        if let OsgprInducing::Replace { fraction } = self.inducing_policy {
            if !(0.0..=1.0).contains(&fraction) {
                return Err(ModelError::Config(format!(
                    "replaced fraction {fraction} of the inducing inputs must be in [0, 1]"
                )));
            }
        }
        if self.q_steps == 0 {
            return Err(ModelError::Config(
                "q(b) needs at least one natural-gradient step".into(),
            ));
        }
        EStepConfig {
            steps: self.q_steps,
            rho: self.q_rho,
        }
        .validate()
    }
}

/// Relative change of the point sites below which `q(b)` has converged.
const Q_TOLERANCE: f64 = 1e-9;

/// What the past leaves for the next batch: `q_old(a)` over the old inducing
/// inputs `a` and the old kernel's `K'_aa` (jitter included), its natural
/// parameters whitened by `L' = chol(K')`: `h_ν = L'⁻¹l_a = L'ᵀh`,
/// `P_ν = L'⁻¹Λ_aL'⁻ᵀ = L'ᵀPL'`. Whitened they stay bounded (for a Gaussian
/// likelihood `P_ν ≼ Σ_i k(x_i,x_i)/σ²`) however ill-conditioned `K'` is.
#[derive(Debug, Clone)]
pub struct OldTerm {
    z: DMatrix<f64>,
    k_aa: DMatrix<f64>,
    chol_k: Cholesky<f64, Dyn>,
    whitened: Vec<Sites>,
    /// `chol(I + P_ν)` per latent: `q_old` whitened.
    chol_d: Vec<Cholesky<f64, Dyn>>,
    /// `h = K'⁻¹l_a` and `P = K'⁻¹Λ_aK'⁻¹`, for the gradient only.
    h: Vec<DVector<f64>>,
    p: Vec<DMatrix<f64>>,
    /// `Σ_c ½[log|R'| − log|K'| − l_aᵀR'⁻¹l_a]`: the part of `E[log q_old − log p_old]` free of `q(b)`.
    constant: f64,
}

impl OldTerm {
    /// Freezes a posterior (its kernel is `θ_old`, its sites whitened by
    /// `chol(K(a, a))`) as the next batch's old term.
    pub fn new(post: &DualPosterior) -> Result<Self> {
        OldTerm::build(post, post.factors().chol_k.clone(), post.whitened.clone())
    }

    fn build(post: &DualPosterior, chol_k: Cholesky<f64, Dyn>, whitened: Vec<Sites>) -> Result<Self> {
        let m = post.m();
        let (mut h, mut p, mut chol_d) = (Vec::new(), Vec::new(), Vec::new());
        let mut constant = 0.0;
        for w in &whitened {
            // log|R'| − log|K'| = log|I + P_ν|,  l_aᵀR'⁻¹l_a = h_νᵀ(I + P_ν)⁻¹h_ν.
            let d = cholesky_jittered(&(DMatrix::identity(m, m) + &w.lambda), 0.0, "old I + P_ν")?.0;
            constant += 0.5 * (log_det(&d) - w.l.dot(&d.solve(&w.l)));
            let l_t = chol_k.l().transpose();
            h.push(solve_upper(&l_t, &w.l));
            let half = solve_upper(&l_t, &w.lambda);
            let mut pc = solve_upper(&l_t, &half.transpose());
            symmetrize(&mut pc);
            p.push(pc);
            chol_d.push(d);
        }
        Ok(OldTerm {
            z: post.z.clone(),
            k_aa: post.k_zz(),
            chol_k,
            whitened,
            chol_d,
            h,
            p,
            constant,
        })
    }

    /// The old inducing inputs `a`.
    pub fn z(&self) -> &DMatrix<f64> {
        &self.z
    }

    /// `K'_aa` under the old hyperparameters, jitter included.
    pub fn k_aa(&self) -> &DMatrix<f64> {
        &self.k_aa
    }

    /// `q_old(a) = N(m_a, S_a)` of latent `c`: `L'(I + P_ν)⁻¹h_ν`, `L'(I + P_ν)⁻¹L'ᵀ`.
    pub fn q_old(&self, c: usize) -> (DVector<f64>, DMatrix<f64>) {
        let (l, d) = (self.chol_k.l(), &self.chol_d[c]);
        (&l * d.solve(&self.whitened[c].l), &l * d.solve(&l.transpose()))
    }
}

fn solve_lower_in_place_vec(chol: &Cholesky<f64, Dyn>, v: &mut DVector<f64>) {
    let solved = chol.l_dirty().solve_lower_triangular_mut(v);
    debug_assert!(solved, "a Cholesky factor has a non-zero diagonal");
}

/// `U⁻¹ B` for an upper-triangular `U` with a non-zero diagonal.
fn solve_upper<C: nalgebra::Dim, S: nalgebra::storage::Storage<f64, Dyn, C>>(
    u: &DMatrix<f64>,
    b: &nalgebra::Matrix<f64, Dyn, C, S>,
) -> nalgebra::OMatrix<f64, Dyn, C>
where
    nalgebra::DefaultAllocator: nalgebra::allocator::Allocator<Dyn, C>,
{
    u.solve_upper_triangular(b)
        .expect("a Cholesky factor has a non-zero diagonal")
}

/// An explicit `q(b) = N(mean, sqrt sqrtᵀ)`; only the lower triangle of `sqrt` is used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExplicitQ {
    /// The mean `m_b`.
    pub mean: DVector<f64>,
    /// `L`, the covariance's lower-triangular square root.
    pub sqrt: DMatrix<f64>,
}

impl ExplicitQ {
    /// `q(u)` of latent `c` of a dual posterior, `S` by its Cholesky factor.
    pub fn from_posterior(post: &DualPosterior, c: usize) -> Result<Self> {
        let (mean, mut cov) = post.q_u(c);
        symmetrize(&mut cov);
        let (chol, _) = cholesky_jittered(&cov, 0.0, "S = K R⁻¹ K")?;
        Ok(ExplicitQ { mean, sqrt: chol.l() })
    }

    /// The covariance `L Lᵀ`.
    pub fn cov(&self) -> DMatrix<f64> {
        let l = self.sqrt.lower_triangle();
        &l * l.transpose()
    }
}

/// A bound and its gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct Bound {
    /// The bound `F`.
    pub value: f64,
    /// `∂F/∂ log θ`: the kernel's log-parameters, then the likelihood's.
    pub grad: DVector<f64>,
    /// `∂F/∂b`, `m × d`.
    pub grad_z: DMatrix<f64>,
    /// `∂F/∂m_b` and `∂F/∂L` (lower triangular) per latent, for an explicit `q(b)` only.
    pub grad_mean: Vec<DVector<f64>>,
    /// `∂F/∂L` per latent (see `grad_mean`).
    pub grad_sqrt: Vec<DMatrix<f64>>,
}

/// The closed-form optimum of the Gaussian case.
#[derive(Debug, Clone, PartialEq)]
pub struct Collapsed {
    /// The collapsed bound at the optimum.
    pub value: f64,
    /// The optimal `q(b)`: old term and batch as sites over `b`, whitened by `chol(K(b, b))`.
    pub whitened: Sites,
}

/// One batch's online problem at a model `(θ, b, jitter)`.
#[derive(Debug, Clone, Copy)]
pub struct Online<'a> {
    /// The kernel at `θ`.
    pub kernel: &'a Kernel,
    /// The likelihood at `θ`.
    pub likelihood: &'a Likelihood,
    /// The new inducing inputs `b`, `m × d`.
    pub z: &'a DMatrix<f64>,
    /// Added to `K(b, b)`, and to `K(a, b)` where an old input is kept.
    pub jitter: f64,
    /// The old posterior's term over `a`; `None` for the first batch.
    pub old: Option<&'a OldTerm>,
    /// The batch.
    pub data: &'a Data,
}

/// Kernel quantities at one `(θ, b)`.
struct Geometry {
    chol: Cholesky<f64, Dyn>,
    k_inv: DMatrix<f64>,
    kbf: DMatrix<f64>,
    /// `A = L⁻¹ K(b, X)`.
    a: DMatrix<f64>,
    /// `k(x_i, x_i) − ‖A_i‖²`.
    residual: DVector<f64>,
    old: Option<OldGeometry>,
}

/// The old term seen from `b`.
struct OldGeometry {
    kab: DMatrix<f64>,
    /// `G = L'⁻¹ K_ab L⁻ᵀ`: whitened old given whitened new is `N(G v, W)`.
    g: DMatrix<f64>,
    /// `(l_b, Λ_b) = (Tᵀl_a, TᵀΛ_aT)`, `T = K'⁻¹K_ab`, per latent.
    sites: Vec<Sites>,
    /// `(Gᵀh_ν, GᵀP_νG)`: the same whitened by `L`.
    whitened: Vec<Sites>,
    /// `tr(P Q_a) = tr(P_ν W)` per latent, `W = L'⁻¹K_aaL'⁻ᵀ − GGᵀ`.
    trace_pq: Vec<f64>,
}

/// `q(b)` in the forms the bound needs: whitened (`v = L⁻¹b ~ N(m_v, YYᵀ)`)
/// for the value, and `α = K⁻¹m_b`, `B = K⁻¹SK⁻¹` for the gradient.
struct QView {
    m_v: DVector<f64>,
    y: DMatrix<f64>,
    log_det_sv: f64,
    alpha: DVector<f64>,
    b_mat: DMatrix<f64>,
    /// An explicit `q(b)`: its lower-triangular square root and `S⁻¹`, for `∂F/∂L`.
    explicit: Option<(DMatrix<f64>, DMatrix<f64>)>,
}

impl QView {
    fn explicit(g: &Geometry, q: &ExplicitQ) -> Result<Self> {
        let sqrt = q.sqrt.lower_triangle();
        if sqrt.diagonal().iter().any(|v| *v == 0.0) {
            return Err(ModelError::Config(
                "q(b): the square root of S needs a non-zero diagonal".into(),
            ));
        }
        let mut m_v = q.mean.clone();
        solve_lower_in_place_vec(&g.chol, &mut m_v);
        let mut y = sqrt.clone();
        solve_lower_in_place(&g.chol, &mut y);
        let log_det_sv = 2.0 * sqrt.diagonal().iter().map(|v| v.abs().ln()).sum::<f64>() - log_det(&g.chol);
        let s_inv = {
            let mut l_inv = DMatrix::identity(sqrt.nrows(), sqrt.nrows());
            sqrt.solve_lower_triangular_mut(&mut l_inv);
            l_inv.tr_mul(&l_inv)
        };
        Ok(QView::finish(g, m_v, y, log_det_sv, Some((sqrt, s_inv))))
    }

    /// `q(v) ∝ N(v; 0, I) exp(hᵀv − ½vᵀPv)`: `m_v = D⁻¹h`, `S_v = D⁻¹`, `D = I + P`.
    fn whitened(g: &Geometry, w: &Sites) -> Result<Self> {
        let m = w.l.len();
        let d = cholesky_jittered(&(DMatrix::identity(m, m) + &w.lambda), 0.0, "I + P")?.0;
        let y = solve_upper(&d.l().transpose(), &DMatrix::<f64>::identity(m, m));
        Ok(QView::finish(g, d.solve(&w.l), y, -log_det(&d), None))
    }

    fn finish(
        g: &Geometry,
        m_v: DVector<f64>,
        y: DMatrix<f64>,
        log_det_sv: f64,
        explicit: Option<(DMatrix<f64>, DMatrix<f64>)>,
    ) -> Self {
        let l_t = g.chol.l().transpose();
        let alpha = solve_upper(&l_t, &m_v);
        let half = solve_upper(&l_t, &y);
        let b_mat = &half * half.transpose();
        QView {
            m_v,
            y,
            log_det_sv,
            alpha,
            b_mat,
            explicit,
        }
    }
}

impl<'a> Online<'a> {
    /// Refuses mismatched dimensions, labels outside the likelihood's support, bad `b`.
    fn check(&self) -> Result<()> {
        let d = self.z.ncols();
        self.kernel.validate(d)?;
        self.data.check(d, self.likelihood)?;
        if self.z.nrows() == 0 || self.z.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::Config(
                "inducing inputs must be finite, at least one".into(),
            ));
        }
        if let Some(old) = self.old {
            if old.z.ncols() != d {
                return Err(ModelError::Dimension {
                    what: "old inducing inputs".into(),
                    expected: d,
                    got: old.z.ncols(),
                });
            }
            if old.whitened.len() != self.likelihood.n_latent() {
                return Err(ModelError::Dimension {
                    what: "old latent functions".into(),
                    expected: self.likelihood.n_latent(),
                    got: old.whitened.len(),
                });
            }
        }
        Ok(())
    }

    fn geometry(&self) -> Result<Geometry> {
        self.check()?;
        let m = self.z.nrows();
        let mut k = self.kernel.matrix(self.z, self.z);
        for i in 0..m {
            k[(i, i)] += self.jitter;
        }
        let chol = Cholesky::new(k).ok_or_else(|| cholesky_error("K(b, b)", self.jitter))?;
        let k_inv = chol.inverse();
        let kbf = self.kernel.matrix(self.z, self.data.x());
        let mut a = kbf.clone();
        solve_lower_in_place(&chol, &mut a);
        let residual = self.kernel.diag(self.data.x()) - column_sq_norms(&a);
        let old = self.old.map(|old| self.old_geometry(old, &chol));
        Ok(Geometry {
            chol,
            k_inv,
            kbf,
            a,
            residual,
            old,
        })
    }

    /// `K(a, b)` under the new kernel; an old input kept in `b` is the same
    /// inducing variable, so it carries the jitter there too (`Q_a` is then 0).
    fn k_ab(&self, old: &OldTerm) -> DMatrix<f64> {
        let mut kab = self.kernel.matrix(&old.z, self.z);
        for i in 0..old.z.nrows() {
            for j in 0..self.z.nrows() {
                if old.z.row(i) == self.z.row(j) {
                    kab[(i, j)] += self.jitter;
                }
            }
        }
        kab
    }

    fn old_geometry(&self, old: &OldTerm, chol: &Cholesky<f64, Dyn>) -> OldGeometry {
        let kab = self.k_ab(old);
        // H = L'⁻¹K_ab, G = H L⁻ᵀ.
        let mut h = kab.clone();
        solve_lower_in_place(&old.chol_k, &mut h);
        let mut g_t = h.transpose();
        solve_lower_in_place(chol, &mut g_t);
        let g = g_t.transpose();
        // W = L'⁻¹ K_aa L'⁻ᵀ − G Gᵀ under the new kernel.
        let mut kaa = self.kernel.matrix(&old.z, &old.z);
        for i in 0..old.z.nrows() {
            kaa[(i, i)] += self.jitter;
        }
        solve_lower_in_place(&old.chol_k, &mut kaa);
        let mut w = kaa.transpose();
        solve_lower_in_place(&old.chol_k, &mut w);
        w.gemm(-1.0, &g, &g_t, 1.0);
        let trace_pq = old.whitened.iter().map(|s| s.lambda.component_mul(&w).sum()).collect();
        let project = |s: &Sites, t: &DMatrix<f64>| {
            let mut lambda = t.tr_mul(&(&s.lambda * t));
            symmetrize(&mut lambda);
            Sites {
                l: t.tr_mul(&s.l),
                lambda,
            }
        };
        let sites = old.whitened.iter().map(|s| project(s, &h)).collect();
        let whitened = old.whitened.iter().map(|s| project(s, &g)).collect();
        OldGeometry {
            kab,
            g,
            sites,
            whitened,
            trace_pq,
        }
    }

    /// The old term as dual sites over `b`, whitened by `chol(K(b, b))`
    /// (zero without an old term).
    pub fn old_sites(&self) -> Result<Vec<Sites>> {
        let g = self.geometry()?;
        Ok(self.old_part(&g, |o| &o.whitened))
    }

    fn old_part(&self, g: &Geometry, part: impl Fn(&OldGeometry) -> &Vec<Sites>) -> Vec<Sites> {
        g.old.as_ref().map_or_else(
            || vec![Sites::zeros(self.z.nrows()); self.likelihood.n_latent()],
            |o| part(o).clone(),
        )
    }

    /// The dual posterior over `b` with these whitened sites.
    pub fn posterior(&self, whitened: &[Sites]) -> Result<DualPosterior> {
        self.check()?;
        let mut post = DualPosterior::new(self.kernel.clone(), self.z.clone(), self.likelihood.n_latent())?;
        post.jitter = self.jitter;
        post.whitened = whitened.to_vec();
        post.refresh()?;
        Ok(post)
    }

    /// Bui et al.'s collapsed bound (Gaussian likelihood) and its optimal `q(b)`:
    /// `−½log|D| + ½c̃ᵀD⁻¹c̃` with `D = I + AAᵀ/σ² + GᵀP_νG`, `c̃ = Ay/σ² + Gᵀh_ν`,
    /// plus `−½σ⁻² tr(K_ff − Q_ff)`, `−½ tr(P Q_a)`, the old constant and `y`'s own terms.
    pub fn collapsed(&self) -> Result<Collapsed> {
        let g = self.geometry()?;
        self.collapsed_at(&g)
    }

    fn collapsed_at(&self, g: &Geometry) -> Result<Collapsed> {
        let Likelihood::Gaussian { variance } = *self.likelihood else {
            return Err(ModelError::Config(
                "the collapsed bound needs a Gaussian likelihood".into(),
            ));
        };
        let (m, y) = (self.z.nrows(), self.data.y());
        let n = y.len() as f64;
        let mut w = self.old_part(g, |o| &o.whitened).swap_remove(0);
        w.l.gemv(1.0 / variance, &g.a, y, 1.0);
        w.lambda.gemm(1.0 / variance, &g.a, &transposed(&g.a), 1.0);
        symmetrize(&mut w.lambda);
        let d = cholesky_jittered(&(DMatrix::identity(m, m) + &w.lambda), 0.0, "I + P")?.0;
        let mut value = -0.5 * n * (2.0 * std::f64::consts::PI * variance).ln()
            - 0.5 * y.norm_squared() / variance
            - 0.5 * log_det(&d)
            + 0.5 * w.l.dot(&d.solve(&w.l))
            - 0.5 * g.residual.sum() / variance;
        if let (Some(o), Some(old)) = (&g.old, self.old) {
            value += old.constant - 0.5 * o.trace_pq[0];
        }
        Ok(Collapsed { value, whitened: w })
    }

    /// The collapsed bound with its gradient in `θ` and `b`: the uncollapsed
    /// bound's gradient at the optimal, fixed `q(b)` (exact by the envelope theorem).
    pub fn collapsed_with_grad(&self) -> Result<(Bound, Collapsed)> {
        let g = self.geometry()?;
        let c = self.collapsed_at(&g)?;
        let mut bound = self.bound_at(&g, &[QView::whitened(&g, &c.whitened)?])?;
        bound.value = c.value;
        Ok((bound, c))
    }

    /// The uncollapsed bound at an explicit `q(b)` per latent, with its
    /// gradient in `θ`, `b`, the means and the square roots.
    pub fn uncollapsed(&self, q: &[ExplicitQ]) -> Result<Bound> {
        let g = self.geometry()?;
        check_q(q, self.likelihood.n_latent(), self.z.nrows())?;
        let views = q.iter().map(|qc| QView::explicit(&g, qc)).collect::<Result<Vec<_>>>()?;
        self.bound_at(&g, &views)
    }

    /// The uncollapsed bound at `q(b)` given by whitened sites over `b`, with
    /// its gradient in `θ` and `b` at that `q(b)` held fixed.
    pub fn uncollapsed_whitened(&self, whitened: &[Sites]) -> Result<Bound> {
        let g = self.geometry()?;
        self.uncollapsed_whitened_at(&g, whitened)
    }

    fn uncollapsed_whitened_at(&self, g: &Geometry, whitened: &[Sites]) -> Result<Bound> {
        let m = self.z.nrows();
        if whitened.len() != self.likelihood.n_latent() || whitened.iter().any(|w| w.l.len() != m) {
            return Err(ModelError::Dimension {
                what: "whitened sites of q(b)".into(),
                expected: m,
                got: whitened.first().map_or(0, |w| w.l.len()),
            });
        }
        let views = whitened
            .iter()
            .map(|w| QView::whitened(g, w))
            .collect::<Result<Vec<_>>>()?;
        self.bound_at(g, &views)
    }

    /// The points' sites `(s1, s2)` as whitened sites over `b`: `(A s1, A diag(s2) Aᵀ)`.
    fn whiten_points(&self, g: &Geometry, sites: &PointSites) -> Vec<Sites> {
        (0..sites.s1.ncols())
            .map(|c| {
                let mut scaled = g.a.clone();
                for (mut col, &s2) in scaled.column_iter_mut().zip(sites.s2.column(c).iter()) {
                    col *= s2;
                }
                let mut lambda = &scaled * transposed(&g.a);
                symmetrize(&mut lambda);
                Sites {
                    l: &g.a * sites.s1.column(c),
                    lambda,
                }
            })
            .collect()
    }

    /// The bound's value (whitened) and its gradient at fixed `(m_b, S_b)`.
    fn bound_at(&self, g: &Geometry, q: &[QView]) -> Result<Bound> {
        let (n, m) = (self.data.n(), self.z.nrows());
        let (value, d_mean, d_var, lik_grad) = self.data_term(g, q);
        let mut grads = Grads::zeros(m, n, self.old.map_or(0, |o| o.z.nrows()));
        grads.diag = d_var.column_sum();
        let mut bound = Bound {
            value,
            grad: DVector::zeros(0),
            grad_z: DMatrix::zeros(0, 0),
            grad_mean: Vec::new(),
            grad_sqrt: Vec::new(),
        };
        let kinv_kbf = &g.k_inv * &g.kbf;
        for (c, view) in q.iter().enumerate() {
            let (a, b) = (d_mean.column(c).into_owned(), d_var.column(c).into_owned());
            let (mut grad_mean, mut grad_s) = self.data_and_kl(g, &kinv_kbf, view, &a, &b, &mut grads, &mut bound);
            if let (Some(o), Some(old)) = (&g.old, self.old) {
                self.old_term(g, o, old, c, view, &mut grads, &mut bound, &mut grad_mean, &mut grad_s);
            }
            if let Some((sqrt, _)) = &view.explicit {
                let mut grad_sqrt = 2.0 * &grad_s * sqrt;
                grad_sqrt.fill_upper_triangle(0.0, 1);
                bound.grad_mean.push(grad_mean);
                bound.grad_sqrt.push(grad_sqrt);
            }
        }
        if let Some(old) = self.old {
            bound.value += old.constant;
        }
        let (kernel_grad, grad_z) = self.chain_rule(&grads);
        bound.grad = DVector::from_iterator(
            kernel_grad.len() + lik_grad.len(),
            kernel_grad.iter().chain(lik_grad.iter()).copied(),
        );
        bound.grad_z = grad_z;
        Ok(bound)
    }

    /// `Σ_i E_q[log p(y_i|f_i)]` with `μ_i = A_iᵀm_v`, `v_i = k_ii − ‖A_i‖² + ‖YᵀA_i‖²`,
    /// and its derivatives in each point's `(μ, v)` and in the likelihood's parameters.
    fn data_term(&self, g: &Geometry, q: &[QView]) -> (f64, DMatrix<f64>, DMatrix<f64>, DVector<f64>) {
        let (n, n_latent) = (self.data.n(), q.len());
        let mut mean = DMatrix::zeros(n, n_latent);
        let mut var = DMatrix::zeros(n, n_latent);
        for (c, view) in q.iter().enumerate() {
            mean.set_column(c, &g.a.tr_mul(&view.m_v));
            var.set_column(c, &(&g.residual + column_sq_norms(&view.y.tr_mul(&g.a))));
        }
        let mut value = 0.0;
        let mut d_mean = DMatrix::zeros(n, n_latent);
        let mut d_var = DMatrix::zeros(n, n_latent);
        let mut lik_grad = DVector::zeros(self.likelihood.n_params());
        let mut e = Expectation::default();
        let (mut mi, mut vi) = (vec![0.0; n_latent], vec![0.0; n_latent]);
        for i in 0..n {
            for c in 0..n_latent {
                mi[c] = mean[(i, c)];
                vi[c] = var[(i, c)];
            }
            self.likelihood.expectation(&mi, &vi, self.data.y()[i], &mut e);
            value += e.value;
            for c in 0..n_latent {
                d_mean[(i, c)] = e.d_mean[c];
                d_var[(i, c)] = e.d_var[c];
            }
            for (gp, dp) in lik_grad.iter_mut().zip(&e.d_params) {
                *gp += dp;
            }
        }
        (value, d_mean, d_var, lik_grad)
    }

    /// `−KL` of one latent (value, whitened) and the gradients of the data
    /// term and `−KL`. Returns `∂F/∂m_b` and `∂F/∂S` so far (`S⁻¹` only for an explicit `q`).
    #[allow(clippy::too_many_arguments)]
    fn data_and_kl(
        &self,
        g: &Geometry,
        kinv_kbf: &DMatrix<f64>,
        q: &QView,
        a: &DVector<f64>,
        b: &DVector<f64>,
        grads: &mut Grads,
        bound: &mut Bound,
    ) -> (DVector<f64>, DMatrix<f64>) {
        let m = self.z.nrows() as f64;
        bound.value -= 0.5 * (q.y.norm_squared() + q.m_v.norm_squared() - m - q.log_det_sv);

        // M = K_bf diag(b) K_fb
        let mut kbf_b = g.kbf.clone();
        for (mut col, &bj) in kbf_b.column_iter_mut().zip(b.iter()) {
            col *= bj;
        }
        let gram = &kbf_b * transposed(&g.kbf);
        let kinv_m_kinv = &g.k_inv * &gram * &g.k_inv;
        let kinv_m_b = &g.k_inv * &gram * &q.b_mat;

        // μ_i = k_iᵀα, v_i = k_ii − k_iᵀK⁻¹k_i + k_iᵀBk_i (B = K⁻¹SK⁻¹).
        grads.bf.ger(1.0, &q.alpha, a, 1.0);
        grads.bf.gemm(2.0, &(&q.b_mat - &g.k_inv), &kbf_b, 1.0);
        let kinv_kbf_a = kinv_kbf * a;
        grads.bb.ger(-1.0, &kinv_kbf_a, &q.alpha, 1.0);
        grads.bb += &kinv_m_kinv - &kinv_m_b - kinv_m_b.transpose();
        // −KL: ½B + ½ααᵀ − ½K⁻¹.
        grads.bb += 0.5 * &q.b_mat - 0.5 * &g.k_inv;
        grads.bb.ger(0.5, &q.alpha, &q.alpha, 1.0);

        let grad_mean = kinv_kbf_a - &q.alpha;
        let mut grad_s = kinv_m_kinv - 0.5 * &g.k_inv;
        if let Some((_, s_inv)) = &q.explicit {
            grad_s += 0.5 * s_inv;
        }
        (grad_mean, grad_s)
    }

    /// The old term of one latent, `O = −½tr(PQ_a) − ½tr(BΛ_b) − ½αᵀΛ_bα + l_bᵀα`
    /// (plus the constant), valued whitened:
    /// `−½tr(P_νW) − ½tr(P_ν G S_v Gᵀ) − ½(Gm_v)ᵀP_ν(Gm_v) + h_νᵀGm_v`.
    #[allow(clippy::too_many_arguments)]
    fn old_term(
        &self,
        g: &Geometry,
        o: &OldGeometry,
        old: &OldTerm,
        c: usize,
        q: &QView,
        grads: &mut Grads,
        bound: &mut Bound,
        grad_mean: &mut DVector<f64>,
        grad_s: &mut DMatrix<f64>,
    ) {
        let (p_nu, h_nu) = (&old.whitened[c].lambda, &old.whitened[c].l);
        let gy = &o.g * &q.y;
        let gm = &o.g * &q.m_v;
        bound.value += -0.5 * o.trace_pq[c] - 0.5 * (p_nu * &gy).component_mul(&gy).sum() - 0.5 * gm.dot(&(p_nu * &gm))
            + h_nu.dot(&gm);

        let alpha = &q.alpha;
        let (lb, lam) = (&o.sites[c].l, &o.sites[c].lambda);
        let kinv_resid = &g.k_inv * (lb - lam * alpha);
        *grad_mean += &kinv_resid;
        let kinv_lam_kinv = &g.k_inv * lam * &g.k_inv;
        *grad_s -= 0.5 * &kinv_lam_kinv;

        // Through K(b, b) with Λ_b and l_b held.
        let kinv_lam_b = &g.k_inv * lam * &q.b_mat;
        grads.bb.ger(-1.0, &kinv_resid, alpha, 1.0);
        grads.bb += -0.5 * &kinv_lam_kinv + 0.5 * (&kinv_lam_b + kinv_lam_b.transpose());
        // Through K(a, b) in Λ_b = K_baPK_ab and l_b = K_ba h:  2PK_abΓ + hαᵀ, Γ = ½(K⁻¹ − B − ααᵀ).
        let mut gamma = 0.5 * (&g.k_inv - &q.b_mat);
        gamma.ger(-0.5, alpha, alpha, 1.0);
        grads.ab += 2.0 * &old.p[c] * &o.kab * gamma;
        grads.ab.ger(1.0, &old.h[c], alpha, 1.0);
        // −½tr(P K_aa) under the new kernel.
        grads.aa -= 0.5 * &old.p[c];
    }

    /// `∂F/∂ log θ` of the kernel and `∂F/∂b` from the gradients in the kernel matrices.
    fn chain_rule(&self, grads: &Grads) -> (DVector<f64>, DMatrix<f64>) {
        let (kernel, z, x) = (self.kernel, self.z, self.data.x());
        // K(b, b) is symmetric: θ sees half of G + Gᵀ, and b, both its inputs, all of it.
        let (theta_bb, grad_bb) = kernel.grads(z, z, &(&grads.bb + grads.bb.transpose()), Rows::OfA);
        let (theta_bf, grad_bf) = kernel.grads(z, x, &grads.bf, Rows::OfA);
        let mut theta = 0.5 * theta_bb + theta_bf + kernel.diag_grad(x, &grads.diag);
        let mut grad_z = grad_bb.expect("asked for") + grad_bf.expect("asked for");
        if let Some(old) = self.old {
            let (theta_ab, grad_ab) = kernel.grads(&old.z, z, &grads.ab, Rows::OfB);
            theta += theta_ab + kernel.matrix_grad(&old.z, &old.z, &grads.aa);
            grad_z += grad_ab.expect("asked for");
        }
        (theta, grad_z)
    }

    /// `q(b)` maximising the uncollapsed bound at this `θ` and `b` (the E-step's
    /// natural-gradient fixed point with the old term as one more site, from
    /// the warm `sites`), as whitened sites, with the bound and its gradient there.
    fn optimal_q(&self, sites: &mut PointSites, steps: usize, rho: f64) -> Result<(Bound, Vec<Sites>)> {
        let g = self.geometry()?;
        let old = self.old_part(&g, |o| &o.whitened);
        let mut start = old.clone();
        for (s, warm) in start.iter_mut().zip(self.whiten_points(&g, sites)) {
            s.l += &warm.l;
            s.lambda += &warm.lambda;
        }
        let mut post = self.posterior(&start)?;
        let cross = Cross {
            kzx: g.kbf.clone(),
            a: g.a.clone(),
            residual_var: g.residual.clone(),
            profile: None,
        };
        // One guarded run: steps that lower the bound are undone across the whole run.
        let e_step = EStepConfig { steps, rho };
        e_step_at(
            &mut post,
            self.likelihood,
            self.data,
            &cross,
            sites,
            &e_step,
            Q_TOLERANCE,
        )?;
        // The totals again from their parts, whitened without loss.
        let mut whitened = old;
        for (s, data) in whitened.iter_mut().zip(self.whiten_points(&g, sites)) {
            s.l += &data.l;
            s.lambda += &data.lambda;
        }
        Ok((self.uncollapsed_whitened_at(&g, &whitened)?, whitened))
    }
}

/// `∂F` with respect to `K(b, b)`, `K(b, X)`, `k(x_i, x_i)`, `K(a, b)`, `K(a, a)`.
struct Grads {
    bb: DMatrix<f64>,
    bf: DMatrix<f64>,
    diag: DVector<f64>,
    ab: DMatrix<f64>,
    aa: DMatrix<f64>,
}

impl Grads {
    fn zeros(m: usize, n: usize, m_old: usize) -> Self {
        Grads {
            bb: DMatrix::zeros(m, m),
            bf: DMatrix::zeros(m, n),
            diag: DVector::zeros(n),
            ab: DMatrix::zeros(m_old, m),
            aa: DMatrix::zeros(m_old, m_old),
        }
    }
}

fn check_q(q: &[ExplicitQ], n_latent: usize, m: usize) -> Result<()> {
    if q.len() != n_latent {
        return Err(ModelError::Dimension {
            what: "q(b) latent functions".into(),
            expected: n_latent,
            got: q.len(),
        });
    }
    for qc in q {
        if qc.mean.len() != m || qc.sqrt.shape() != (m, m) {
            return Err(ModelError::Dimension {
                what: "q(b) mean and square root".into(),
                expected: m,
                got: qc.mean.len(),
            });
        }
        if qc.mean.iter().chain(qc.sqrt.iter()).any(|v| !v.is_finite()) {
            return Err(ModelError::Config("q(b) must be finite".into()));
        }
    }
    Ok(())
}

fn cholesky_error(what: &str, jitter: f64) -> ModelError {
    ModelError::Cholesky {
        what: what.into(),
        jitter,
    }
}

/// What one update did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsgprReport {
    /// Batches learned, this one included.
    pub batch: u64,
    /// Records learned, this batch's included.
    pub n_seen: u64,
    /// The online bound at the end of the update.
    pub bound: f64,
    /// Bound evaluations by the optimiser.
    pub evaluations: usize,
    /// Whether the inducing inputs changed.
    pub moved_inducing: bool,
    /// Wall-clock seconds the update took.
    pub seconds: f64,
}

/// Bui et al.'s streaming sparse GP; serialisable as a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OsgprLearner {
    /// How it learns.
    pub config: OsgprConfig,
    /// The likelihood, with its current parameters.
    pub likelihood: Likelihood,
    /// The kernel until the first batch.
    kernel: Kernel,
    /// The prior over given inducing inputs before the first batch, then `q` after each.
    posterior: Option<DualPosterior>,
    /// Records learned so far.
    pub n_seen: u64,
    /// Batches learned so far.
    pub batches: u64,
}

impl OsgprLearner {
    /// A learner at the prior, `kernel` and `likelihood` its starting hyperparameters.
    pub fn new(kernel: Kernel, likelihood: Likelihood, config: OsgprConfig) -> Result<Self> {
        config.validate()?;
        if likelihood.n_outputs() > 1 {
            return Err(ModelError::Config(
                "osgpr learns one output; use --method dual-memory or offline for several".into(),
            ));
        }
        Ok(OsgprLearner {
            config,
            likelihood,
            kernel,
            posterior: None,
            n_seen: 0,
            batches: 0,
        })
    }

    /// Starts from given inducing inputs instead of choosing them from the first batch.
    pub fn with_inducing(mut self, z: DMatrix<f64>) -> Result<Self> {
        if self.batches > 0 {
            return Err(ModelError::Config(
                "inducing inputs can only be given before the first batch".into(),
            ));
        }
        self.posterior = Some(DualPosterior::new(self.kernel.clone(), z, self.likelihood.n_latent())?);
        Ok(self)
    }

    /// Learns `batch` by maximising the online bound, then keeps only `q(b)`.
    pub fn update(&mut self, batch: &Data) -> Result<OsgprReport> {
        let started = Instant::now();
        if batch.n() == 0 {
            return Err(ModelError::Config("an update needs at least one record".into()));
        }
        let d = self.posterior.as_ref().map_or(batch.d(), DualPosterior::d);
        batch.check(d, &self.likelihood)?;
        self.kernel().validate(d)?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed ^ self.batches.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let old = match &self.posterior {
            Some(post) if self.batches > 0 => Some(OldTerm::new(post)?),
            _ => None,
        };
        let (z, moved_inducing) = self.choose_inducing(batch, &mut rng);
        let start_jitter = self
            .posterior
            .as_ref()
            .map_or(DEFAULT_RELATIVE_JITTER * self.kernel().prior_variance(), |p| p.jitter);
        let (_, jitter) = cholesky_jittered(&self.kernel().matrix(&z, &z), start_jitter, "K(b, b)")?;
        let mut fit = Fit {
            kernel: self.kernel().clone(),
            likelihood: self.likelihood.clone(),
            z,
            jitter,
        };
        let mut sites = PointSites::zeros(batch.n(), self.likelihood.n_latent());
        let evaluations = fit.optimise(old.as_ref(), batch, &mut sites, &self.config)?;
        let (posterior, bound) = fit.finish(old.as_ref(), batch, &mut sites, &self.config)?;

        self.likelihood = fit.likelihood;
        self.posterior = Some(posterior);
        self.n_seen += batch.n() as u64;
        self.batches += 1;
        Ok(OsgprReport {
            batch: self.batches,
            n_seen: self.n_seen,
            bound,
            evaluations,
            moved_inducing,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// The new inducing inputs `b` and whether they differ from `a`.
    fn choose_inducing(&self, batch: &Data, rng: &mut ChaCha8Rng) -> (DMatrix<f64>, bool) {
        let m = self.config.inducing;
        let post = match &self.posterior {
            None => return (select_inducing(self.kernel(), batch.x(), m, Pivot::Variance), true),
            Some(post) => post,
        };
        if self.batches == 0 {
            return (post.z.clone(), false);
        }
        let m_old = post.m();
        let chosen: Vec<usize> = match self.config.inducing_policy {
            OsgprInducing::Fixed => return (post.z.clone(), false),
            OsgprInducing::Pivoted => {
                let candidates = stack(&post.z, batch.x());
                let weights = vec![1.0; candidates.nrows()];
                let mut chosen = pivoted_cholesky(&post.kernel, &candidates, &weights, m, Pivot::Variance);
                chosen.sort_unstable();
                chosen
            }
            OsgprInducing::Replace { fraction } => {
                let n_new = batch
                    .n()
                    .min(m.saturating_sub(m_old).max((fraction * m as f64).round() as usize));
                let n_keep = m_old.min(m - n_new);
                let mut keep = sample(rng, m_old, n_keep).into_vec();
                keep.sort_unstable();
                let mut new: Vec<usize> = sample(rng, batch.n(), n_new).into_iter().map(|i| i + m_old).collect();
                new.sort_unstable();
                keep.extend(new);
                keep
            }
        };
        if chosen.iter().copied().eq(0..m_old) {
            return (post.z.clone(), false);
        }
        (stack(&post.z, batch.x()).select_rows(&chosen), true)
    }
}

/// The rows of `a` then those of `b`.
fn stack(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    DMatrix::from_fn(a.nrows() + b.nrows(), a.ncols(), |i, j| {
        if i < a.nrows() {
            a[(i, j)]
        } else {
            b[(i - a.nrows(), j)]
        }
    })
}

/// The model being fitted to one batch. The batch's point sites, kept
/// between evaluations as a warm start for `q(b)`, go alongside.
struct Fit {
    kernel: Kernel,
    likelihood: Likelihood,
    z: DMatrix<f64>,
    jitter: f64,
}

impl Fit {
    fn online<'a>(&'a self, old: Option<&'a OldTerm>, data: &'a Data) -> Online<'a> {
        Online {
            kernel: &self.kernel,
            likelihood: &self.likelihood,
            z: &self.z,
            jitter: self.jitter,
            old,
            data,
        }
    }

    fn gaussian(&self) -> bool {
        matches!(self.likelihood, Likelihood::Gaussian { .. })
    }

    /// `θ`, then `b` column by column when it moves.
    fn params(&self, with_z: bool) -> DVector<f64> {
        let theta = hyperparameters(&self.kernel, &self.likelihood);
        let z = self.z.iter().filter(|_| with_z);
        DVector::from_iterator(
            theta.len() + if with_z { self.z.len() } else { 0 },
            theta.iter().chain(z).copied(),
        )
    }

    fn set_params(&mut self, p: &DVector<f64>, with_z: bool) {
        let n_theta = self.kernel.n_params() + self.likelihood.n_params();
        set_hyperparameters(&mut self.kernel, &mut self.likelihood, &p.rows(0, n_theta).into_owned());
        if with_z {
            self.z.copy_from_slice(&p.as_slice()[n_theta..]);
        }
    }

    /// The profile bound `F(θ, q*(θ))`, its gradient, and `q*` as whitened sites.
    fn profile(
        &self,
        old: Option<&OldTerm>,
        data: &Data,
        sites: &mut PointSites,
        config: &OsgprConfig,
    ) -> Result<(Bound, Vec<Sites>)> {
        let online = self.online(old, data);
        let (bound, whitened) = if self.gaussian() {
            let (bound, c) = online.collapsed_with_grad()?;
            (bound, vec![c.whitened])
        } else {
            online.optimal_q(sites, config.q_steps, config.q_rho)?
        };
        if !bound.value.is_finite() || bound.grad.iter().chain(bound.grad_z.iter()).any(|v| !v.is_finite()) {
            return Err(ModelError::Config("the online bound is not finite here".into()));
        }
        Ok((bound, whitened))
    }

    /// L-BFGS on the profile bound; returns the number of evaluations.
    fn optimise(
        &mut self,
        old: Option<&OldTerm>,
        data: &Data,
        sites: &mut PointSites,
        config: &OsgprConfig,
    ) -> Result<usize> {
        if config.max_iter == 0 {
            return Ok(0);
        }
        let with_z = config.optimize_z;
        let start = self.params(with_z);
        let mut evaluations = 0;
        let f = |p: &DVector<f64>| -> Result<(f64, DVector<f64>)> {
            evaluations += 1;
            let warm = sites.clone();
            self.set_params(p, with_z);
            // A failed trial point must not leave its sites behind.
            let (bound, _) = self.profile(old, data, sites, config).inspect_err(|_| *sites = warm)?;
            let grad = bound.grad.iter().chain(bound.grad_z.iter().filter(|_| with_z));
            Ok((bound.value, DVector::from_iterator(p.len(), grad.copied())))
        };
        let (best, _) = lbfgs_maximize(f, start, config.max_iter, config.history)?;
        self.set_params(&best, with_z);
        Ok(evaluations)
    }

    /// The posterior over `b` at the fitted `θ` and the bound there.
    fn finish(
        &self,
        old: Option<&OldTerm>,
        data: &Data,
        sites: &mut PointSites,
        config: &OsgprConfig,
    ) -> Result<(DualPosterior, f64)> {
        let (bound, whitened) = self.profile(old, data, sites, config)?;
        Ok((self.online(old, data).posterior(&whitened)?, bound.value))
    }
}

impl StreamingLearner for OsgprLearner {
    fn learn_batch(&mut self, batch: &Data) -> Result<Learned> {
        let report = self.update(batch)?;
        Ok(Learned {
            batch: report.batch,
            n_seen: report.n_seen,
            seconds: report.seconds,
            details: vec![
                ("bound", report.bound),
                ("evaluations", report.evaluations as f64),
                ("moved_inducing", f64::from(u8::from(report.moved_inducing))),
            ],
        })
    }

    field_accessors!();
}
