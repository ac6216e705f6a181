//! The dual-parameter sparse posterior: inducing inputs `Z`, a kernel, and per
//! latent the natural site totals `l = Σ k_i λ1_i`, `Λ = Σ β̂_i k_i k_iᵀ`,
//! held whitened by the Cholesky factor `L` of `K = K(Z, Z) + εI`:
//! `h = L⁻¹l = Σ a_i λ1_i`, `P = L⁻¹ΛL⁻ᵀ = Σ β̂_i a_i a_iᵀ` with `a_i = L⁻¹k_i`.
//!
//! In `v = L⁻¹u` the posterior is `q(v) = N(D⁻¹h, D⁻¹)`, `D = I + P`, so
//! `μ(x) = aᵀD⁻¹h` and `v(x) = k** − aᵀa + aᵀD⁻¹a`. Held in `K`'s own
//! coordinates, `Λ` grows as `K`'s entries squared times the data while
//! `K` is nearly singular under long lengthscales; turning such a `Λ` into
//! factors (`R = K + Λ`) loses digits in proportion to `K`'s condition number
//! (at batch 1 of elevators the bound came out 0.1 nats off, its gradient 30 %).
//! Whitened, every quantity stays on the scale of `I + P`.

use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};
use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};
use crate::model::math::kernel::{Kernel, Profile};
use crate::model::math::linalg::{
    cholesky_inverse, cholesky_jittered, column_sq_norms, log_det, solve_lower_in_place, solve_lower_matrix_in_place,
    solve_lower_transposed_in_place, symmetric_eigen, symmetrize,
};

/// Default jitter, relative to the kernel's prior variance.
pub const DEFAULT_RELATIVE_JITTER: f64 = 1e-6;

/// Natural site totals of one latent function: `(l, Λ)`, or whitened `(h, P)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sites {
    /// `l = Σ k_i λ1_i` (whitened: `h`), `m`.
    pub l: DVector<f64>,
    /// `Λ = Σ β̂_i k_i k_iᵀ` (whitened: `P`), `m × m`.
    pub lambda: DMatrix<f64>,
}

impl Sites {
    /// No sites: the prior, over `m` inducing values.
    pub fn zeros(m: usize) -> Self {
        Sites {
            l: DVector::zeros(m),
            lambda: DMatrix::zeros(m, m),
        }
    }

    /// `self += scale · other`.
    pub fn add(&mut self, other: &Sites, scale: f64) {
        self.l.axpy(scale, &other.l, 1.0);
        self.lambda.zip_apply(&other.lambda, |a, b| *a += scale * b);
    }

    /// `self ← factor · self`: the sites of a likelihood raised to `factor`.
    pub fn scale(&mut self, factor: f64) {
        self.l *= factor;
        self.lambda *= factor;
    }

    /// `l ← T l`, `Λ ← T Λ Tᵀ`: the same sites in other coordinates (see
    /// [`keeping_totals`] and [`keeping_message`]).
    pub fn transform(&mut self, t: &DMatrix<f64>) {
        self.l = t * &self.l;
        self.lambda = t * &self.lambda * t.transpose();
        symmetrize(&mut self.lambda);
    }
}

/// `T = L'⁻¹L`: re-whitens sites whitened by `L` under `L'` so that their
/// totals `(l, Λ)` stay what they were (sites held as the kernel moves).
pub fn keeping_totals(from: &DMatrix<f64>, to: &Cholesky<f64, Dyn>) -> DMatrix<f64> {
    let mut t = from.clone();
    solve_lower_in_place(to, &mut t);
    t
}

/// `T = L'⁻¹ K(Z', Z) L⁻ᵀ`: re-expresses sites whitened by `L` (over `Z`)
/// as whitened sites over `Z'` (factor `L'`) that say the same about the
/// inducing values, carried through the prior's conditional: in u-space
/// `η = K⁻¹l`, `K⁻¹ΛK⁻¹` stay put. `cross` is `K(Z, Z')`; over the same `Z`
/// it is `K'` itself and `T = L'ᵀL⁻ᵀ`.
pub fn keeping_message(from: &DMatrix<f64>, cross: &DMatrix<f64>, to: &Cholesky<f64, Dyn>) -> DMatrix<f64> {
    let mut g = cross.clone();
    solve_lower_matrix_in_place(from, &mut g);
    let mut t = g.transpose();
    solve_lower_in_place(to, &mut t);
    t
}

/// `w = L⁻ᵀm_v` for each latent's whitened mean: `K⁻¹` times its mean in u-space.
fn unwhitened(chol_k: &Cholesky<f64, Dyn>, m_v: &[DVector<f64>]) -> Vec<DVector<f64>> {
    let l_t = chol_k.l().transpose();
    m_v.iter()
        .map(|mean| l_t.solve_upper_triangular(mean).expect(POSITIVE_DIAGONAL))
        .collect()
}

/// The pairs `(i, j)` with `z_a[i] = z_b[j]`, matched one to one in order:
/// each row of `z_a` takes the first row of `z_b` equal to it that no earlier
/// row took. Rows are looked up by their values (`−0` as `0`; a row with a
/// NaN equals none), so an M-step's evaluation pays `O(m d)`, not `O(m² d)`.
pub fn same_inducing_inputs(z_a: &DMatrix<f64>, z_b: &DMatrix<f64>) -> Vec<(usize, usize)> {
    let key = |z: &DMatrix<f64>, i: usize| -> Option<Vec<u64>> {
        let row = z.row(i);
        (!row.iter().any(|v| v.is_nan())).then(|| row.iter().map(|v| (v + 0.0).to_bits()).collect())
    };
    let mut unmatched: HashMap<Vec<u64>, VecDeque<usize>> = HashMap::new();
    for j in 0..z_b.nrows() {
        if let Some(k) = key(z_b, j) {
            unmatched.entry(k).or_default().push_back(j);
        }
    }
    (0..z_a.nrows())
        .filter_map(|i| {
            let j = unmatched.get_mut(&key(z_a, i)?)?.pop_front()?;
            Some((i, j))
        })
        .collect()
}

const POSITIVE_DIAGONAL: &str = "a Cholesky factor has a positive diagonal";

/// Factors derived from the state; rebuilt by [`DualPosterior::refresh`].
#[derive(Debug, Clone)]
pub(crate) struct Factors {
    /// `L` with `K = LLᵀ`.
    pub chol_k: Cholesky<f64, Dyn>,
    /// Per latent the factor of `D = I + P`.
    pub chol_d: Vec<Cholesky<f64, Dyn>>,
    /// Per latent the whitened mean `m_v = D⁻¹h`.
    pub m_v: Vec<DVector<f64>>,
    /// Per latent `w = R⁻¹l = L⁻ᵀm_v` (`R = K + Λ`), for gradients in `K`'s coordinates.
    pub w: Vec<DVector<f64>>,
    /// `K⁻¹` and each `R_c⁻¹`, made on first use: only gradients need them,
    /// and every block of points shares them.
    inverses: OnceLock<Box<Inverses>>,
    /// Each `L_D⁻¹`, made on first use (the KL, `E_q[log t]`, `R⁻¹`, `q(u)`).
    d_inv_halves: OnceLock<Vec<DMatrix<f64>>>,
    /// Each `G_c` of [`DualPosterior::variance_half`], made on first use (prediction).
    variance_halves: OnceLock<Vec<DMatrix<f64>>>,
}

/// `K⁻¹`, each `D_c⁻¹`, each `R_c⁻¹` and each `R_c⁻¹ − K⁻¹`.
#[derive(Debug, Clone)]
struct Inverses {
    k_inv: DMatrix<f64>,
    d_inv: Vec<DMatrix<f64>>,
    r_inv: Vec<DMatrix<f64>>,
    /// Every block of points multiplies by it in the M-step's gradient.
    r_minus_k: Vec<DMatrix<f64>>,
}

impl Factors {
    /// `K⁻¹`.
    pub fn k_inv(&self) -> &DMatrix<f64> {
        &self.inverses().k_inv
    }

    /// `D_c⁻¹ = L_D⁻ᵀL_D⁻¹`, exactly symmetric.
    pub fn d_inv(&self, c: usize) -> &DMatrix<f64> {
        &self.inverses().d_inv[c]
    }

    /// `R_c⁻¹ = L⁻ᵀD⁻¹L⁻¹`.
    pub fn r_inv(&self, c: usize) -> &DMatrix<f64> {
        &self.inverses().r_inv[c]
    }

    /// `R_c⁻¹ − K⁻¹`.
    pub fn r_inv_minus_k_inv(&self, c: usize) -> &DMatrix<f64> {
        &self.inverses().r_minus_k[c]
    }

    /// `L_D⁻¹` of latent `c`: `D⁻¹ = L_D⁻ᵀL_D⁻¹`.
    pub fn d_inv_half(&self, c: usize) -> &DMatrix<f64> {
        &self.d_inv_halves.get_or_init(|| {
            self.chol_d
                .iter()
                .map(|chol| {
                    let m = chol.l_dirty().nrows();
                    let mut half = DMatrix::identity(m, m);
                    solve_lower_in_place(chol, &mut half);
                    half
                })
                .collect()
        })[c]
    }

    fn inverses(&self) -> &Inverses {
        self.inverses.get_or_init(|| {
            let r_inv: Vec<DMatrix<f64>> = (0..self.chol_d.len())
                .map(|c| {
                    // R⁻¹ = XXᵀ with X = L⁻ᵀ L_D⁻ᵀ.
                    let mut x = self.d_inv_half(c).transpose();
                    solve_lower_transposed_in_place(&self.chol_k, &mut x);
                    &x * x.transpose()
                })
                .collect();
            let k_inv = cholesky_inverse(&self.chol_k);
            let d_inv = self.chol_d.iter().map(cholesky_inverse).collect();
            let r_minus_k = r_inv.iter().map(|r| r - &k_inv).collect();
            Box::new(Inverses {
                k_inv,
                d_inv,
                r_inv,
                r_minus_k,
            })
        })
    }
}

/// The predictive marginals `q(f_c(x_i)) = N(mean[(i,c)], var[(i,c)])`.
#[derive(Debug, Clone, PartialEq)]
pub struct Marginals {
    /// `n × C`: each point's mean of each latent.
    pub mean: DMatrix<f64>,
    /// `n × C`: each point's variance of each latent.
    pub var: DMatrix<f64>,
}

impl Marginals {
    /// Calls `visit(i, mean_i, var_i)` with point `i`'s marginals over the
    /// latents, reusing two buffers (this runs per record on hot paths).
    pub fn for_each_point(&self, mut visit: impl FnMut(usize, &[f64], &[f64])) {
        let n_latent = self.mean.ncols();
        let (mut mean, mut var) = (vec![0.0; n_latent], vec![0.0; n_latent]);
        for i in 0..self.mean.nrows() {
            for c in 0..n_latent {
                mean[c] = self.mean[(i, c)];
                var[c] = self.var[(i, c)];
            }
            visit(i, &mean, &var);
        }
    }
}

/// Kernel quantities at a set of inputs that stay valid while `θ` and `Z` do.
#[derive(Debug, Clone)]
pub struct Cross {
    /// `K(Z, X)`, `m × n`.
    pub kzx: DMatrix<f64>,
    /// `A = L⁻¹K(Z, X)`: the points' whitened columns (`0 × 0` until made,
    /// see [`DualPosterior::unwhitened_cross`]).
    pub a: DMatrix<f64>,
    /// `k(x_i, x_i) − k_iᵀ K⁻¹ k_i`: the prior variance left unexplained by
    /// `Z` (empty until made, with `a`).
    pub residual_var: DVector<f64>,
    /// What the kernel's gradient needs of `K(Z, X)` again, where kept
    /// ([`DualPosterior::cross_with_profile`]).
    pub profile: Option<Profile>,
}

impl Cross {
    fn unwhitened(kzx: DMatrix<f64>, profile: Option<Profile>) -> Cross {
        Cross {
            kzx,
            a: DMatrix::zeros(0, 0),
            residual_var: DVector::zeros(0),
            profile,
        }
    }

    /// Whether `a` and `residual_var` are made (see [`DualPosterior::unwhitened_cross`]).
    pub fn is_whitened(&self) -> bool {
        self.a.shape() == self.kzx.shape()
    }

    /// The quantities of the points at `rows` (without the profile).
    pub fn select(&self, rows: &[usize]) -> Cross {
        Cross {
            kzx: self.kzx.select_columns(rows),
            a: self.a.select_columns(rows),
            residual_var: self.residual_var.select_rows(rows),
            profile: None,
        }
    }
}

/// The sparse posterior every learner holds: `Z`, the kernel and the whitened
/// site totals, with the factors predictions need cached beside them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DualPosterior {
    /// The kernel, with its current hyperparameters.
    pub kernel: Kernel,
    /// Inducing inputs, `m × d`.
    pub z: DMatrix<f64>,
    /// Added to `K(Z, Z)`; raised automatically when a factorisation fails,
    /// and scaled with the kernel's prior variance when `θ` moves.
    pub jitter: f64,
    /// The site totals whitened by `chol(K)`, one entry per latent function.
    pub whitened: Vec<Sites>,
    #[serde(skip)]
    factors: Option<Factors>,
}

impl DualPosterior {
    /// The prior (all sites zero) over `n_latent` functions.
    pub fn new(kernel: Kernel, z: DMatrix<f64>, n_latent: usize) -> Result<Self> {
        kernel.validate(z.ncols())?;
        if z.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::Config("inducing inputs must be finite".into()));
        }
        if z.nrows() == 0 || n_latent == 0 {
            return Err(ModelError::Config(
                "need at least one inducing input and one latent".into(),
            ));
        }
        let jitter = DEFAULT_RELATIVE_JITTER * kernel.prior_variance();
        let whitened = vec![Sites::zeros(z.nrows()); n_latent];
        let mut post = DualPosterior {
            kernel,
            z,
            jitter,
            whitened,
            factors: None,
        };
        post.refresh()?;
        Ok(post)
    }

    /// The number of inducing inputs.
    pub fn m(&self) -> usize {
        self.z.nrows()
    }

    /// The number of inputs per point.
    pub fn d(&self) -> usize {
        self.z.ncols()
    }

    /// The number of latent functions.
    pub fn n_latent(&self) -> usize {
        self.whitened.len()
    }

    /// `K(Z, Z) + jitter·I`.
    pub fn k_zz(&self) -> DMatrix<f64> {
        let mut k = self.kernel.matrix(&self.z, &self.z);
        for i in 0..self.m() {
            k[(i, i)] += self.jitter;
        }
        k
    }

    /// Recomputes the factors after the kernel, `Z` or the sites changed.
    /// Raises the jitter if `K` is numerically singular (the whitened sites
    /// are then kept as they are: the change is within rounding of `K`).
    pub fn refresh(&mut self) -> Result<()> {
        let chol_k = self.factor_k()?;
        self.refresh_with(chol_k)
    }

    /// Changes the kernel and `Z` (by `change`; `m` stays) with the site
    /// totals `(l, Λ)` held, as the M-step's bound holds them: the whitened
    /// sites follow `K`. Returns the [`keeping_totals`] map that was applied.
    pub fn change_holding_totals(
        &mut self,
        change: impl FnOnce(&mut Kernel, &mut DMatrix<f64>),
    ) -> Result<DMatrix<f64>> {
        let before = self.factors().chol_k.l();
        let scale = self.kernel.prior_variance();
        change(&mut self.kernel, &mut self.z);
        self.follow_kernel_scale(scale);
        let chol_k = self.factor_k()?;
        let t = keeping_totals(&before, &chol_k);
        self.transform_sites(&t);
        self.refresh_with(chol_k)?;
        Ok(t)
    }

    /// Changes the kernel and `Z` (by `change`; `m` stays) and sets the site
    /// totals to zero, for a caller that sets them anew under the new `K`:
    /// re-expressing them as [`change_holding_totals`](Self::change_holding_totals)
    /// does costs several `m³` products and two factorisations.
    pub fn change_dropping_totals(&mut self, change: impl FnOnce(&mut Kernel, &mut DMatrix<f64>)) -> Result<()> {
        let scale = self.kernel.prior_variance();
        change(&mut self.kernel, &mut self.z);
        self.follow_kernel_scale(scale);
        let chol_k = self.factor_k()?;
        let m = self.m();
        for sites in &mut self.whitened {
            *sites = Sites::zeros(m);
        }
        // Zero sites: D = I is its own factor, and the means are zero.
        let n_latent = self.n_latent();
        self.factors = Some(Factors {
            chol_k,
            chol_d: vec![Cholesky::pack_dirty(DMatrix::identity(m, m)); n_latent],
            m_v: vec![DVector::zeros(m); n_latent],
            w: vec![DVector::zeros(m); n_latent],
            inverses: OnceLock::new(),
            d_inv_halves: OnceLock::new(),
            variance_halves: OnceLock::new(),
        });
        Ok(())
    }

    /// Changes the kernel (by `change`) with the whitened sites held, as
    /// VAR-GP's draws of `θ` hold them: `D = I + P`, its factor and `m_v`
    /// do not depend on `K`, so only `K`'s factor and `w = L⁻ᵀm_v` are made
    /// anew (a full [`refresh`](Self::refresh) factorises every `D` again).
    pub fn change_kernel_holding_whitened(&mut self, change: impl FnOnce(&mut Kernel)) -> Result<()> {
        let scale = self.kernel.prior_variance();
        change(&mut self.kernel);
        self.follow_kernel_scale(scale);
        let chol_k = self.factor_k()?;
        let Some(old) = self.factors.take() else {
            return self.refresh_with(chol_k);
        };
        let w = unwhitened(&chol_k, &old.m_v);
        self.factors = Some(Factors {
            chol_k,
            chol_d: old.chol_d,
            m_v: old.m_v,
            w,
            inverses: OnceLock::new(),
            d_inv_halves: old.d_inv_halves,
            variance_halves: OnceLock::new(),
        });
        Ok(())
    }

    /// Keeps the jitter the same fraction of the prior variance after the
    /// kernel changed from one whose prior variance was `before`. A fixed
    /// jitter under a variance grown by 10⁴ leaves `K` conditioned 10⁴ times
    /// worse, and the M-step gradient's `K⁻¹` products lose their digits.
    pub fn follow_kernel_scale(&mut self, before: f64) {
        self.jitter *= self.kernel.prior_variance() / before;
    }

    /// `∂ jitter / ∂ log θ` (the jitter follows the prior variance).
    pub fn jitter_grad(&self) -> DVector<f64> {
        self.kernel.log_prior_variance_grad() * self.jitter
    }

    /// Moves the inducing inputs to `z_new` (any number), re-expressing the
    /// site totals over them (paper Eq. 27, `l ← Pᵀl`, `Λ ← PᵀΛP`, done
    /// whitened by [`keeping_message`]). Returns `P = K(Z, Z)⁻¹K(Z, Z_new)`
    /// for columns held elsewhere. An inducing input kept in place is the same
    /// inducing variable, jitter included, so that it projects onto itself exactly.
    pub fn move_inducing(&mut self, z_new: DMatrix<f64>) -> Result<DMatrix<f64>> {
        let cross = self.inducing_cross(&self.z, &z_new);
        let before = self.factors().chol_k.clone();
        self.z = z_new;
        let chol_k = self.factor_k()?;
        self.transform_sites(&keeping_message(&before.l(), &cross, &chol_k));
        self.refresh_with(chol_k)?;
        Ok(before.solve(&cross))
    }

    /// `K(Z_a, Z_b)` between two sets of inducing inputs; an input in both is
    /// the same inducing variable and carries the jitter (matched one to one:
    /// repeated inputs are distinct variables).
    pub fn inducing_cross(&self, z_a: &DMatrix<f64>, z_b: &DMatrix<f64>) -> DMatrix<f64> {
        let mut cross = self.kernel.matrix(z_a, z_b);
        for (i, j) in same_inducing_inputs(z_a, z_b) {
            cross[(i, j)] += self.jitter;
        }
        cross
    }

    /// `chol(K)` under the current kernel and `Z`, the jitter raised if need be.
    fn factor_k(&mut self) -> Result<Cholesky<f64, Dyn>> {
        let (chol_k, jitter) = cholesky_jittered(&self.kernel.matrix(&self.z, &self.z), self.jitter, "K(Z, Z)")?;
        self.jitter = jitter;
        Ok(chol_k)
    }

    fn transform_sites(&mut self, t: &DMatrix<f64>) {
        for sites in &mut self.whitened {
            sites.transform(t);
        }
    }

    /// [`refresh`](Self::refresh) after only the sites changed: `K`'s factor stays.
    pub fn refresh_sites(&mut self) -> Result<()> {
        let chol_k = self.factors().chol_k.clone();
        self.refresh_with(chol_k)
    }

    fn refresh_with(&mut self, chol_k: Cholesky<f64, Dyn>) -> Result<()> {
        let m = self.m();
        let mut chol_d = Vec::with_capacity(self.whitened.len());
        let mut m_v = Vec::with_capacity(self.whitened.len());
        for sites in &self.whitened {
            let (chol, _) = cholesky_jittered(&(DMatrix::identity(m, m) + &sites.lambda), 0.0, "I + P")?;
            m_v.push(chol.solve(&sites.l));
            chol_d.push(chol);
        }
        let w = unwhitened(&chol_k, &m_v);
        self.factors = Some(Factors {
            chol_k,
            chol_d,
            m_v,
            w,
            inverses: OnceLock::new(),
            d_inv_halves: OnceLock::new(),
            variance_halves: OnceLock::new(),
        });
        Ok(())
    }

    /// Makes the inverses the M-step's gradient needs now, so that the
    /// snapshots cloned from here on carry them: every worker (and every
    /// evaluation's learner) would otherwise make the same ones again.
    pub fn prepare_gradients(&self) {
        self.factors().k_inv();
    }

    pub(crate) fn factors(&self) -> &Factors {
        self.factors
            .as_ref()
            .expect("DualPosterior::refresh runs on every change of state")
    }

    /// Restores the cached factors after deserialisation.
    /// Whether the cached factors are there (a deserialised posterior lacks them).
    pub fn has_factors(&self) -> bool {
        self.factors.is_some()
    }

    /// Makes the cached factors if they are missing (after deserialising).
    pub fn ensure_factors(&mut self) -> Result<()> {
        if self.factors.is_none() {
            self.refresh()?;
        }
        Ok(())
    }

    /// `K(Z, X)`, its whitened columns and the residual prior variance at `x`.
    pub fn cross(&self, x: &DMatrix<f64>) -> Cross {
        self.cross_of(self.kernel.matrix(&self.z, x), None, x)
    }

    /// [`cross`](Self::cross) with the kernel's profile kept, for an M-step
    /// gradient under the same `θ` and `Z`.
    pub fn cross_with_profile(&self, x: &DMatrix<f64>) -> Cross {
        let (kzx, profile) = self.kernel.matrix_with_profile(&self.z, x);
        self.cross_of(kzx, profile, x)
    }

    fn cross_of(&self, kzx: DMatrix<f64>, profile: Option<Profile>, x: &DMatrix<f64>) -> Cross {
        let mut cross = Cross::unwhitened(kzx, profile);
        self.whiten_cross(&mut cross, x);
        cross
    }

    /// [`cross_with_profile`](Self::cross_with_profile) without the whitened
    /// columns and the residual variances, which
    /// [`whiten_cross`](Self::whiten_cross) makes when they are needed: a
    /// Gaussian M-step sums its points in `K`'s coordinates and whitens
    /// only the sums, saving every point a triangular solve.
    pub fn unwhitened_cross(&self, x: &DMatrix<f64>) -> Cross {
        let (kzx, profile) = self.kernel.matrix_with_profile(&self.z, x);
        Cross::unwhitened(kzx, profile)
    }

    /// Makes the whitened columns and residual variances of `cross`, the
    /// kernel columns of the points `x` under this posterior's `K`, if they
    /// are not made yet.
    pub fn whiten_cross(&self, cross: &mut Cross, x: &DMatrix<f64>) {
        if !cross.is_whitened() {
            cross.a = self.whiten(&cross.kzx);
            cross.residual_var = self.kernel.diag(x) - column_sq_norms(&cross.a);
        }
    }

    /// Site totals summed in `K`'s coordinates, whitened: `(L⁻¹l, L⁻¹ΛL⁻ᵀ)`.
    pub fn whitened_sites(&self, sites: Sites) -> Sites {
        let l = self.whiten(&DMatrix::from_column_slice(sites.l.len(), 1, sites.l.as_slice()));
        Sites {
            l: l.column(0).into_owned(),
            lambda: self.whitened_gram(sites.lambda),
        }
    }

    /// `L⁻¹GL⁻ᵀ` of a symmetric `G` in `K`'s coordinates.
    pub fn whitened_gram(&self, mut gram: DMatrix<f64>) -> DMatrix<f64> {
        let chol = &self.factors().chol_k;
        solve_lower_in_place(chol, &mut gram);
        gram.transpose_mut();
        solve_lower_in_place(chol, &mut gram);
        symmetrize(&mut gram);
        gram
    }

    /// `L⁻¹B`: kernel columns (under any earlier `θ`) whitened by today's `K`.
    pub fn whiten(&self, b: &DMatrix<f64>) -> DMatrix<f64> {
        let mut a = b.clone();
        solve_lower_in_place(&self.factors().chol_k, &mut a);
        a
    }

    /// Predictive marginals of the latent functions at `x` (`n × d`): with
    /// `k = K(Z, x)`, mean `kᵀw` and variance `k(x, x) − ‖G k‖²`
    /// ([`variance_half`](Self::variance_half)), one matrix product a batch
    /// where [`marginals`](Self::marginals) whitens the columns first.
    pub fn predict_f(&self, x: &DMatrix<f64>) -> Marginals {
        let kzx = self.kernel.matrix(&self.z, x);
        let prior = self.kernel.diag(x);
        let f = self.factors();
        let n = x.nrows();
        let mut mean = DMatrix::zeros(n, self.n_latent());
        let mut var = DMatrix::zeros(n, self.n_latent());
        let mut gk = DMatrix::zeros(self.m(), n);
        for c in 0..self.n_latent() {
            mean.set_column(c, &kzx.tr_mul(&f.w[c]));
            gk.gemm(1.0, self.variance_half(c), &kzx, 0.0);
            var.set_column(c, &(&prior - column_sq_norms(&gk)));
        }
        Marginals { mean, var }
    }

    /// `G_c = S Vᵀ L⁻¹` with `P_c = V diag(p) Vᵀ` (the whitened site
    /// precision, `D = I + P`) and `S = diag(√(p / (1 + p)))`, so that
    /// `‖G k‖² = aᵀ(I − D⁻¹)a` for `a = L⁻¹k`: what the data explain of the
    /// prior variance at an input. `S` is taken from `P`'s eigenvalues,
    /// not `D`'s, so that directions the data barely touch lose no digits.
    /// Made once per model on first use ([`prepare_predictions`](Self::prepare_predictions)).
    pub fn variance_half(&self, c: usize) -> &DMatrix<f64> {
        let f = self.factors();
        &f.variance_halves.get_or_init(|| {
            let mut l_inv = DMatrix::identity(self.m(), self.m());
            solve_lower_in_place(&f.chol_k, &mut l_inv);
            (self.whitened.iter())
                .map(|sites| {
                    let mut p = sites.lambda.clone();
                    symmetrize(&mut p);
                    let (values, vectors) = symmetric_eigen(&p);
                    let mut half = vectors.transpose() * &l_inv;
                    for (mut row, &p) in half.row_iter_mut().zip(values.iter()) {
                        let p = p.max(0.0);
                        row *= (p / (1.0 + p)).sqrt();
                    }
                    half
                })
                .collect()
        })[c]
    }

    /// Makes what [`predict_f`](Self::predict_f) needs now, so that the
    /// first record a new model scores does not wait for it.
    pub fn prepare_predictions(&self) {
        self.variance_half(0);
    }

    /// Predictive marginals from precomputed kernel quantities.
    pub fn marginals(&self, cross: &Cross) -> Marginals {
        let n = cross.a.ncols();
        let f = self.factors();
        let mut mean = DMatrix::zeros(n, self.n_latent());
        let mut var = DMatrix::zeros(n, self.n_latent());
        let mut b = DMatrix::zeros(cross.a.nrows(), n);
        for c in 0..self.n_latent() {
            mean.set_column(c, &cross.a.tr_mul(&f.m_v[c]));
            // `L_D⁻¹A` as one product with the cached inverse: twice the
            // flops of the triangular solve, at the matrix product's speed.
            b.gemm(1.0, f.d_inv_half(c), &cross.a, 0.0);
            var.set_column(c, &(&cross.residual_var + column_sq_norms(&b)));
        }
        Marginals { mean, var }
    }

    /// [`marginals`](Self::marginals)' means alone, the variances left zero:
    /// for callers that only read the means.
    pub fn marginal_means(&self, cross: &Cross) -> Marginals {
        let n = cross.a.ncols();
        let f = self.factors();
        let mut mean = DMatrix::zeros(n, self.n_latent());
        for c in 0..self.n_latent() {
            mean.set_column(c, &cross.a.tr_mul(&f.m_v[c]));
        }
        Marginals {
            mean,
            var: DMatrix::zeros(n, self.n_latent()),
        }
    }

    /// `q(u) = N(m_u, S)` of latent `c`: `m_u = L m_v`, `S = L D⁻¹ Lᵀ`.
    pub fn q_u(&self, c: usize) -> (DVector<f64>, DMatrix<f64>) {
        let f = self.factors();
        let l = f.chol_k.l();
        let half = &l * f.d_inv_half(c).transpose();
        (&l * &f.m_v[c], &half * half.transpose())
    }

    /// `KL[q(u) ‖ p(u)] = KL[q(v) ‖ N(0, I)]`, summed over latents:
    /// `½ [tr(D⁻¹) + m_vᵀm_v − m + log|D|]`.
    pub fn kl(&self) -> f64 {
        let f = self.factors();
        let m = self.m() as f64;
        (0..self.n_latent())
            .map(|c| {
                let trace = f.d_inv_half(c).norm_squared();
                0.5 * (trace + f.m_v[c].norm_squared() - m + log_det(&f.chol_d[c]))
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, pair by pair: each row of `z_a` takes the first equal unmatched row of `z_b`.
    fn by_definition(z_a: &DMatrix<f64>, z_b: &DMatrix<f64>) -> Vec<(usize, usize)> {
        let mut matched = vec![false; z_b.nrows()];
        let mut pairs = Vec::new();
        for i in 0..z_a.nrows() {
            if let Some(j) = (0..z_b.nrows()).find(|&j| !matched[j] && z_a.row(i) == z_b.row(j)) {
                matched[j] = true;
                pairs.push((i, j));
            }
        }
        pairs
    }

    #[test]
    fn inducing_inputs_are_matched_one_to_one_as_the_definition_matches_them() {
        // Repeated rows, −0 beside 0, a NaN, rows in one set only.
        let rows_a = [
            [1.0, 2.0],
            [0.0, 1.0],
            [1.0, 2.0],
            [f64::NAN, 1.0],
            [3.0, 3.0],
            [1.0, 2.0],
        ];
        let rows_b = [
            [1.0, 2.0],
            [5.0, 5.0],
            [-0.0, 1.0],
            [f64::NAN, 1.0],
            [1.0, 2.0],
            [3.0, 3.0],
        ];
        let z = |rows: &[[f64; 2]]| DMatrix::from_fn(rows.len(), 2, |i, j| rows[i][j]);
        let (z_a, z_b) = (z(&rows_a), z(&rows_b));
        let want = by_definition(&z_a, &z_b);
        assert_eq!(want, vec![(0, 0), (1, 2), (2, 4), (4, 5)]);
        assert_eq!(same_inducing_inputs(&z_a, &z_b), want);
        assert_eq!(same_inducing_inputs(&z_b, &z_a), by_definition(&z_b, &z_a));
        assert_eq!(same_inducing_inputs(&z_a, &z_a), by_definition(&z_a, &z_a));
    }
}
