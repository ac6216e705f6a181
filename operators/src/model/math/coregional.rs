//! The linear model of coregionalisation: `D` outputs, each a linear
//! combination `f_d = Σ_q a_{q,d} u_q` of `Q` independent latent functions.
//!
//! The last input column is an index, not a coordinate: `d ≥ 0` marks a point
//! of output `d`, `−(q+1)` a point of latent `u_q` itself (where inducing
//! inputs may sit). With `w_q(x)` a row's weight on latent `q` (`a_{q,d}` for
//! output `d`, 1 on latent `q`'s own rows, 0 on any other row),
//!
//! `k(x, x') = Σ_q w_q(x) w_q(x') k_q(x̄, x̄')`, `x̄` being `x` without its index,
//!
//! one formula for output–output, latent–output and latent–latent pairs.
//! The loadings are parameters as they are, not logs: they take either sign.

use nalgebra::{DMatrix, DVector};

use crate::model::error::Result;
use crate::model::math::kernel::{concat, config, join, Kernel, Profile, Rows};
// Defined beside `Kernel`, which holds it and which it holds; its mathematics is here.
pub use crate::model::math::kernel::{Coregional, CROSS_LOADING};

/// What a row's index column makes it a point of.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Output(usize),
    Latent(usize),
    /// An index outside `[−Q, D)`: weight 0 on every latent (data is
    /// validated elsewhere; the kernel does not panic on it).
    Neither,
}

impl Coregional {
    /// See [`Kernel::coregional`].
    pub(super) fn new(base: Kernel, latents: usize, outputs: usize) -> Self {
        let mixing = DMatrix::from_fn(latents, outputs, |q, d| {
            if q == d % latents {
                1.0
            } else if (q + d) % 2 == 0 {
                CROSS_LOADING
            } else {
                -CROSS_LOADING
            }
        });
        Coregional {
            latents: vec![base; latents],
            mixing,
        }
    }

    fn role(&self, index: f64) -> Role {
        // `NaN as i64` is 0, which would make it a point of output 0.
        if index.is_nan() {
            return Role::Neither;
        }
        let i = index.round() as i64;
        let (q, d) = (self.latents.len() as i64, self.mixing.ncols() as i64);
        if (0..d).contains(&i) {
            Role::Output(i as usize)
        } else if (-q..0).contains(&i) {
            Role::Latent((-1 - i) as usize)
        } else {
            Role::Neither
        }
    }

    /// `w_q` of a row with this role.
    fn weight(&self, role: Role, q: usize) -> f64 {
        match role {
            Role::Output(d) => self.mixing[(q, d)],
            Role::Latent(p) => f64::from(u8::from(p == q)),
            Role::Neither => 0.0,
        }
    }

    /// Each row's role, and per latent `q` the rows' weights `w_q`.
    fn weights(&self, x: &DMatrix<f64>) -> (Vec<Role>, Vec<DVector<f64>>) {
        let roles: Vec<Role> = match x.ncols() {
            0 => vec![Role::Neither; x.nrows()],
            d => x.column(d - 1).iter().map(|&i| self.role(i)).collect(),
        };
        let weights = (0..self.latents.len())
            .map(|q| DVector::from_iterator(roles.len(), roles.iter().map(|&r| self.weight(r, q))))
            .collect();
        (roles, weights)
    }

    pub(super) fn n_params(&self) -> usize {
        self.latents.iter().map(Kernel::n_params).sum::<usize>() + self.mixing.len()
    }

    pub(super) fn log_params(&self) -> Vec<f64> {
        let latents = self.latents.iter().flat_map(Kernel::log_params);
        latents.chain(self.mixing.iter().copied()).collect()
    }

    pub(super) fn natural_params(&self) -> Vec<f64> {
        let latents = self.latents.iter().flat_map(Kernel::natural_params);
        latents.chain(self.mixing.iter().copied()).collect()
    }

    /// `p` is `n_params()` long (checked by the caller).
    pub(super) fn set_log_params(&mut self, p: &[f64]) {
        let mut rest = p;
        for latent in &mut self.latents {
            let (head, tail) = rest.split_at(latent.n_params());
            latent.set_log_params(head);
            rest = tail;
        }
        self.mixing.as_mut_slice().copy_from_slice(rest);
    }

    pub(super) fn push_names(&self, prefix: &str, out: &mut Vec<String>) {
        for (q, latent) in self.latents.iter().enumerate() {
            latent.push_names(&join(prefix, &format!("latent{q}")), out);
        }
        // Column-major, as `mixing.iter()` runs.
        for d in 0..self.mixing.ncols() {
            for q in 0..self.mixing.nrows() {
                out.push(join(prefix, &format!("mixing.latent{q}.output{d}")));
            }
        }
    }

    pub(super) fn validate_at(&self, d: usize, prefix: &str) -> Result<()> {
        let base = join(prefix, "coregional");
        let q = self.latents.len();
        if d < 2 {
            return Err(config(format!(
                "{base}: needs an input column and the output index column, got {d} columns"
            )));
        }
        if q == 0 {
            return Err(config(format!("{base}: no latents")));
        }
        if self.mixing.nrows() != q {
            let rows = self.mixing.nrows();
            return Err(config(format!("{base}: {rows} rows of loadings for {q} latents")));
        }
        if self.mixing.ncols() == 0 {
            return Err(config(format!("{base}: no outputs")));
        }
        if let Some(((l, o), a)) = self.mixing.iter().enumerate().find_map(|(i, &a)| {
            let at = (i % q, i / q);
            (!a.is_finite()).then_some((at, a))
        }) {
            let name = join(prefix, &format!("mixing.latent{l}.output{o}"));
            return Err(config(format!("{name} must be finite, got {a}")));
        }
        for (q, latent) in self.latents.iter().enumerate() {
            latent.validate_at(d - 1, &join(prefix, &format!("latent{q}")))?;
        }
        Ok(())
    }

    /// The mean over outputs of `k(x, x)`: `Σ_q a_{q,d}² v_q`, `v_q` a
    /// latent's prior variance (the mean of the `v_q` if there are no outputs).
    pub(super) fn prior_variance(&self) -> f64 {
        self.shares().iter().sum()
    }

    /// Each latent's part of [`prior_variance`](Self::prior_variance).
    fn shares(&self) -> Vec<f64> {
        let (q, d) = (self.latents.len(), self.mixing.ncols());
        let latents = self.latents.iter().enumerate().map(|(l, latent)| {
            let v = latent.prior_variance();
            match d {
                0 => v / q as f64,
                _ => v * self.mixing.row(l).norm_squared() / d as f64,
            }
        });
        latents.collect()
    }

    pub(super) fn log_prior_variance_grad(&self) -> DVector<f64> {
        let v = self.prior_variance();
        let shares = self.shares();
        // A latent moves log v by its share of v times its own log-gradient.
        let latents = self
            .latents
            .iter()
            .zip(&shares)
            .map(|(latent, share)| latent.log_prior_variance_grad() * (share / v));
        let d = self.mixing.ncols() as f64;
        let mixing = DVector::from_iterator(
            self.mixing.len(),
            self.mixing.iter().enumerate().map(|(i, &a)| {
                let v_q = self.latents[i % self.mixing.nrows()].prior_variance();
                2.0 * a * v_q / d / v
            }),
        );
        concat(latents.chain(std::iter::once(mixing)))
    }

    /// Called through [`Kernel::matrix`], which checks the column counts.
    pub(super) fn matrix(&self, a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
        self.mixed(a, b, |latent, a_bar, b_bar| latent.matrix(a_bar, b_bar))
    }

    /// `Σ_q diag(w_q(A)) K_q diag(w_q(B))`, each latent's `K_q` from `latent_matrix`.
    fn mixed(
        &self,
        a: &DMatrix<f64>,
        b: &DMatrix<f64>,
        mut latent_matrix: impl FnMut(&Kernel, &DMatrix<f64>, &DMatrix<f64>) -> DMatrix<f64>,
    ) -> DMatrix<f64> {
        let ((_, wa), (_, wb)) = (self.weights(a), self.weights(b));
        let (a_bar, b_bar) = (coordinates(a), coordinates(b));
        let mut k = DMatrix::zeros(a.nrows(), b.nrows());
        for (q, latent) in self.latents.iter().enumerate() {
            k += scaled(latent_matrix(latent, &a_bar, &b_bar), &wa[q], &wb[q]);
        }
        k
    }

    pub(super) fn diag(&self, a: &DMatrix<f64>) -> DVector<f64> {
        let (_, w) = self.weights(a);
        let a_bar = coordinates(a);
        let mut k = DVector::zeros(a.nrows());
        for (latent, w) in self.latents.iter().zip(&w) {
            k += latent.diag(&a_bar).component_mul(&w.component_mul(w));
        }
        k
    }

    /// `Σ_q w_q² ∂k_q(x̄, x̄)/∂x̄`, and 0 for the index.
    pub(super) fn diag_input_grad(&self, x: &[f64]) -> DVector<f64> {
        let mut out = DVector::zeros(x.len());
        let Some((&index, coords)) = x.split_last() else {
            return out;
        };
        let role = self.role(index);
        for (q, latent) in self.latents.iter().enumerate() {
            let w = self.weight(role, q);
            out.rows_mut(0, coords.len())
                .axpy(w * w, &latent.diag_input_grad(coords), 1.0);
        }
        out
    }

    /// [`matrix`](Self::matrix) and each latent's [`Profile`] of it.
    pub(super) fn matrix_with_profiles(
        &self,
        a: &DMatrix<f64>,
        b: &DMatrix<f64>,
    ) -> (DMatrix<f64>, Vec<Option<Profile>>) {
        let mut profiles = Vec::with_capacity(self.latents.len());
        let k = self.mixed(a, b, |latent, a_bar, b_bar| {
            let (k_q, profile) = latent.matrix_with_profile(a_bar, b_bar);
            profiles.push(profile);
            k_q
        });
        (k, profiles)
    }

    /// Each latent sees `G_q = diag(w_q(A)) G diag(w_q(B))`; a loading
    /// `a_{q,e}` is the weight of every output-`e` row on either side.
    /// `profiles`: each latent's, from [`matrix_with_profiles`](Self::matrix_with_profiles).
    pub(super) fn grads(
        &self,
        a: &DMatrix<f64>,
        b: &DMatrix<f64>,
        g: &DMatrix<f64>,
        rows: Rows,
        profiles: Option<&[Option<Profile>]>,
    ) -> (DVector<f64>, Option<DMatrix<f64>>) {
        let ((roles_a, wa), (roles_b, wb)) = (self.weights(a), self.weights(b));
        let (a_bar, b_bar) = (coordinates(a), coordinates(b));
        // Full width: the index column's gradient stays 0.
        let mut input = rows.zeros(a, b);
        let mut mixing = DMatrix::zeros(self.mixing.nrows(), self.mixing.ncols());
        let latents = concat(self.latents.iter().enumerate().map(|(q, latent)| {
            // The latent's matrix and profile as kept, else made anew.
            let kept = profiles.and_then(|p| p.get(q)).and_then(Option::as_ref);
            let made;
            let (k, profile) = match kept.and_then(|p| latent.matrix_from(p).map(|k| (k, p))) {
                Some((k, p)) => (k, Some(p)),
                None => {
                    let k;
                    (k, made) = latent.matrix_with_profile(&a_bar, &b_bar);
                    (k, made.as_ref())
                }
            };
            let g_q = scaled(g.clone(), &wa[q], &wb[q]);
            let (theta, latent_input) = latent.grads_from(&a_bar, &b_bar, &g_q, rows, profile);
            if let (Some(total), Some(part)) = (input.as_mut(), latent_input) {
                let mut coords = total.columns_mut(0, part.ncols());
                coords += part;
            }
            // H = G ∘ K_q: ∂/∂w_q(a_i) is (H w_q(B))_i, ∂/∂w_q(b_j) is (Hᵀ w_q(A))_j.
            let h = g.component_mul(&k);
            add_by_output(&mut mixing, q, &roles_a, &(&h * &wb[q]));
            add_by_output(&mut mixing, q, &roles_b, &h.tr_mul(&wa[q]));
            theta
        }));
        let mixing = DVector::from_column_slice(mixing.as_slice());
        (concat([latents, mixing].into_iter()), input)
    }

    pub(super) fn diag_grad(&self, a: &DMatrix<f64>, g: &DVector<f64>) -> DVector<f64> {
        let (roles, w) = self.weights(a);
        let a_bar = coordinates(a);
        let mut mixing = DMatrix::zeros(self.mixing.nrows(), self.mixing.ncols());
        let latents = concat(self.latents.iter().zip(&w).enumerate().map(|(q, (latent, w))| {
            // ∂(w² k_q)/∂w = 2 w k_q, where w is a loading (output rows).
            let k = latent.diag(&a_bar);
            add_by_output(&mut mixing, q, &roles, &(g.component_mul(&k).component_mul(w) * 2.0));
            latent.diag_grad(&a_bar, &g.component_mul(&w.component_mul(w)))
        }));
        let mixing = DVector::from_column_slice(mixing.as_slice());
        concat([latents, mixing].into_iter())
    }
}

/// The input without its last (index) column.
fn coordinates(x: &DMatrix<f64>) -> DMatrix<f64> {
    x.columns(0, x.ncols().saturating_sub(1)).into_owned()
}

/// `diag(r) M diag(c)`.
fn scaled(mut m: DMatrix<f64>, r: &DVector<f64>, c: &DVector<f64>) -> DMatrix<f64> {
    for (mut col, &c) in m.column_iter_mut().zip(c.iter()) {
        col.component_mul_assign(r);
        col *= c;
    }
    m
}

/// Adds each output row's entry of `sums` to latent `q`'s loading on that output.
fn add_by_output(grad: &mut DMatrix<f64>, q: usize, roles: &[Role], sums: &DVector<f64>) {
    for (role, &s) in roles.iter().zip(sums.iter()) {
        if let Role::Output(e) = *role {
            grad[(q, e)] += s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::error::ModelError;
    use crate::model::math::kernel::tests::{
        assert_diag_input_grad, assert_grads_within, assert_input_grad, finite_diff_step,
    };
    use crate::model::math::kernel::Family;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Latents over 2 coordinates: Matérn-5/2 with ARD lengthscales, and SE.
    fn matern_ard() -> Kernel {
        Kernel::stationary(Family::Matern52, 1.4, vec![0.6, 1.2])
    }

    fn se() -> Kernel {
        Kernel::stationary(Family::SquaredExponential, 0.8, vec![0.9])
    }

    /// The two latents above (Q = 2) under D = 3 outputs, random loadings of
    /// both signs (negative where q + d is odd).
    fn two_latents(rng: &mut ChaCha8Rng) -> Coregional {
        let mixing = DMatrix::from_fn(2, 3, |q, d| {
            let size = rng.random_range(0.2..1.5);
            if (q + d) % 2 == 0 {
                size
            } else {
                -size
            }
        });
        Coregional {
            latents: vec![matern_ard(), se()],
            mixing,
        }
    }

    /// `n` rows of 2 coordinates and an index cycling through every output,
    /// every latent, and one index past each end (weight 0).
    fn mixed_rows(rng: &mut ChaCha8Rng, n: usize, q: usize, d: usize) -> DMatrix<f64> {
        let indices = (-(q as i64) - 1)..=(d as i64);
        let span = indices.clone().count();
        DMatrix::from_fn(n, 3, |i, k| match k {
            2 => (indices.start() + (i % span) as i64) as f64,
            _ => rng.random_range(-1.5..1.5),
        })
    }

    /// Coregional kernels and their (Q, D), the gradient tests' cases.
    fn cases(rng: &mut ChaCha8Rng) -> Vec<(Kernel, usize, usize)> {
        // k(x, x) that varies with x, so diag_input_grad is not zero.
        let varying = Coregional {
            latents: vec![
                Kernel::Product(vec![Kernel::Linear { variance: 0.6 }, se()]),
                Kernel::Sum(vec![
                    Kernel::stationary(Family::Matern32, 0.5, vec![0.7]),
                    Kernel::Linear { variance: 0.3 },
                ]),
            ],
            mixing: DMatrix::from_row_slice(2, 2, &[0.8, -0.3, -0.6, 1.1]),
        };
        vec![
            (Kernel::Coregional(two_latents(rng)), 2, 3),
            (Kernel::Coregional(varying), 2, 2),
            // More latents than outputs: latent 2 has no output of its own.
            (Kernel::coregional(matern_ard(), 3, 2), 3, 2),
            // Nested in a sum, treated like any other part.
            (
                Kernel::Sum(vec![Kernel::coregional(se(), 1, 3), Kernel::Constant { variance: 0.4 }]),
                1,
                3,
            ),
        ]
    }

    /// Central differences in each coordinate of `log_params`
    /// (log-parameters, and loadings as they are).
    fn finite_diff(kernel: &Kernel, objective: impl Fn(&Kernel) -> f64) -> Vec<f64> {
        finite_diff_step(kernel, 1e-6, objective)
    }

    fn assert_grad_close(kernel: &Kernel, analytic: &DVector<f64>, numeric: &[f64], what: &str) {
        assert_grads_within(kernel, analytic, numeric, 1e-6, what);
    }

    /// The latents of [`two_latents`] straight from their closed forms.
    fn reference_latent(q: usize, x: &[f64], y: &[f64]) -> f64 {
        match q {
            0 => {
                let r2 = ((x[0] - y[0]) / 0.6).powi(2) + ((x[1] - y[1]) / 1.2).powi(2);
                let s = (5.0 * r2).sqrt();
                1.4 * (1.0 + s + s * s / 3.0) * (-s).exp()
            }
            _ => {
                let r2 = ((x[0] - y[0]).powi(2) + (x[1] - y[1]).powi(2)) / 0.81;
                0.8 * (-0.5 * r2).exp()
            }
        }
    }

    /// One entry by the kind of pair: Σ_q a_qd a_qd' k_q between outputs,
    /// a_qd k_q between output d and latent q, δ k_q between latents.
    fn reference_entry(c: &Coregional, x: &[f64], y: &[f64]) -> f64 {
        let (q_n, d_n) = (2, 3);
        let (i, j) = (x[2] as i64, y[2] as i64);
        let k = |q: i64| reference_latent(q as usize, x, y);
        let a = |q: i64, d: i64| c.mixing[(q as usize, d as usize)];
        let known = |i: i64| (-q_n..d_n).contains(&i);
        if !known(i) || !known(j) {
            return 0.0;
        }
        match (i >= 0, j >= 0) {
            (true, true) => (0..q_n).map(|q| a(q, i) * a(q, j) * k(q)).sum(),
            (true, false) => a(-j - 1, i) * k(-j - 1),
            (false, true) => a(-i - 1, j) * k(-i - 1),
            (false, false) if i == j => k(-i - 1),
            (false, false) => 0.0,
        }
    }

    #[test]
    fn matrix_matches_the_pairwise_definition() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let c = two_latents(&mut rng);
        assert!(c.mixing.iter().any(|&a| a < 0.0) && c.mixing.iter().any(|&a| a > 0.0));
        let a = mixed_rows(&mut rng, 14, 2, 3);
        let b = mixed_rows(&mut rng, 9, 2, 3);
        let kernel = Kernel::Coregional(c.clone());
        let k = kernel.matrix(&a, &b);
        assert_eq!(k.shape(), (14, 9));
        for i in 0..a.nrows() {
            for j in 0..b.nrows() {
                let x: Vec<f64> = a.row(i).iter().copied().collect();
                let y: Vec<f64> = b.row(j).iter().copied().collect();
                let want = reference_entry(&c, &x, &y);
                assert!(
                    (k[(i, j)] - want).abs() < 1e-13,
                    "({i}, {j}) indices {} {}: {} vs {want}",
                    x[2],
                    y[2],
                    k[(i, j)]
                );
            }
        }
    }

    #[test]
    fn one_latent_is_its_kernel_and_identity_mixing_separates_outputs() {
        let mut rng = ChaCha8Rng::seed_from_u64(22);
        let mut a = mixed_rows(&mut rng, 7, 1, 1);
        let mut b = mixed_rows(&mut rng, 5, 1, 1);
        a.column_mut(2).fill(0.0);
        b.column_mut(2).fill(0.0);
        let one = Kernel::coregional(matern_ard(), 1, 1);
        let plain = matern_ard().matrix(&coordinates(&a), &coordinates(&b));
        assert_eq!(one.matrix(&a, &b), plain);
        assert_eq!(one.diag(&a), matern_ard().diag(&coordinates(&a)));

        let identity = Kernel::Coregional(Coregional {
            latents: vec![matern_ard(), se()],
            mixing: DMatrix::identity(2, 2),
        });
        let x = DMatrix::from_row_slice(4, 3, &[0.1, 0.2, 0.0, 0.1, 0.2, 1.0, -0.3, 0.5, 0.0, 0.7, -0.4, 1.0]);
        let k = identity.matrix(&x, &x);
        for i in 0..4 {
            for j in 0..4 {
                if x[(i, 2)] != x[(j, 2)] {
                    assert_eq!(k[(i, j)], 0.0, "({i}, {j})");
                } else {
                    assert!(k[(i, j)] > 0.0, "({i}, {j})");
                }
            }
        }
        // Indices round; one outside [−Q, D) gives a zero row, without panicking.
        let odd = DMatrix::from_row_slice(
            4,
            3,
            &[0.1, 0.2, 0.9999, 0.1, 0.2, 2.0, 0.1, 0.2, -3.0, 0.1, 0.2, f64::NAN],
        );
        let k = identity.matrix(&odd, &x);
        assert_eq!(k.row(0), identity.matrix(&x.rows(1, 1).into_owned(), &x).row(0));
        assert!(k.rows(1, 3).iter().all(|&v| v == 0.0), "{k}");
    }

    #[test]
    fn gram_matrix_is_symmetric_psd_and_matches_diag() {
        let mut rng = ChaCha8Rng::seed_from_u64(23);
        for (kernel, q, d) in cases(&mut rng) {
            let a = mixed_rows(&mut rng, 30, q, d);
            let k = kernel.matrix(&a, &a);
            let scale = k.diagonal().amax();
            assert!(
                (&k - k.transpose()).amax() <= 1e-14 * scale,
                "{kernel:?}: not symmetric"
            );
            assert!(
                (k.diagonal() - kernel.diag(&a)).amax() <= 1e-14 * scale,
                "{kernel:?}: diag"
            );
            let smallest = k.symmetric_eigenvalues().min();
            assert!(smallest >= -1e-9 * scale, "{kernel:?}: eigenvalue {smallest}");
        }
    }

    #[test]
    fn parameter_and_mixing_gradient_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(24);
        for (kernel, q, d) in cases(&mut rng) {
            let a = mixed_rows(&mut rng, 11, q, d);
            let b = mixed_rows(&mut rng, 8, q, d);
            for (x, what) in [(&b, "K(A, B)"), (&a, "K(A, A)")] {
                let g = DMatrix::from_fn(a.nrows(), x.nrows(), |_, _| rng.random_range(-1.0..1.0));
                let analytic = kernel.matrix_grad(&a, x, &g);
                let numeric = finite_diff(&kernel, |k| k.matrix(&a, x).component_mul(&g).sum());
                assert_grad_close(&kernel, &analytic, &numeric, &format!("{kernel:?} {what}"));
            }
        }
    }

    /// The matrix and gradients from the latents' kept profiles are those
    /// made afresh, to the bit (the M-step's shards reuse the profiles).
    /// Calls `check` with each case's kernel, rows `A` (11) and `B` (8) and a
    /// `dL/dK(A, B)`, drawn in that order from `seed`.
    fn each_case_with_rows(seed: u64, mut check: impl FnMut(&Kernel, &DMatrix<f64>, &DMatrix<f64>, &DMatrix<f64>)) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for (kernel, q, d) in cases(&mut rng) {
            let a = mixed_rows(&mut rng, 11, q, d);
            let b = mixed_rows(&mut rng, 8, q, d);
            let g = DMatrix::from_fn(a.nrows(), b.nrows(), |_, _| rng.random_range(-1.0..1.0));
            check(&kernel, &a, &b, &g);
        }
    }

    #[test]
    fn kept_profiles_give_the_same_bits() {
        each_case_with_rows(27, |kernel, a, b, g| {
            let (k, profile) = kernel.matrix_with_profile(a, b);
            assert_eq!(k, kernel.matrix(a, b), "{kernel:?}");
            for rows in [Rows::Neither, Rows::OfA, Rows::OfB] {
                let kept = kernel.grads_from(a, b, g, rows, profile.as_ref());
                assert_eq!(kept, kernel.grads(a, b, g, rows), "{kernel:?} {rows:?}");
            }
        });
    }

    #[test]
    fn input_gradient_matches_finite_differences() {
        each_case_with_rows(25, |kernel, a, b, g| {
            for rows in [Rows::OfA, Rows::OfB] {
                let (_, input) = kernel.grads(a, b, g, rows);
                let input = input.expect("asked for");
                assert!(
                    input.column(2).iter().all(|&v| v == 0.0),
                    "{kernel:?} {rows:?}: index column"
                );
                assert_input_grad(kernel, (a, b, g), rows, &input, 2);
            }
            assert_eq!(kernel.input_grad(a, b, g), kernel.grads(a, b, g, Rows::OfA).1.unwrap());
        });
    }

    #[test]
    fn diagonal_gradients_match_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(26);
        for (kernel, q, d) in cases(&mut rng) {
            let a = mixed_rows(&mut rng, 12, q, d);
            let g = DVector::from_fn(a.nrows(), |_, _| rng.random_range(-1.0..1.0));
            let analytic = kernel.diag_grad(&a, &g);
            let numeric = finite_diff(&kernel, |k| k.diag(&a).dot(&g));
            assert_grad_close(&kernel, &analytic, &numeric, &format!("{kernel:?} diag"));

            let analytic = kernel.log_prior_variance_grad();
            let numeric = finite_diff(&kernel, |k| k.prior_variance().ln());
            assert_grad_close(&kernel, &analytic, &numeric, &format!("{kernel:?} log prior variance"));

            for row in a.row_iter() {
                let x: Vec<f64> = row.iter().copied().collect();
                let analytic = kernel.diag_input_grad(&x);
                assert_eq!(analytic.len(), 3);
                assert_eq!(analytic[2], 0.0, "{kernel:?} index of {x:?}");
                assert_diag_input_grad(&kernel, &x, 2);
            }
        }
    }

    #[test]
    fn prior_variance_is_the_mean_output_variance() {
        let c = Coregional {
            latents: vec![matern_ard(), se()],
            mixing: DMatrix::from_row_slice(2, 2, &[1.0, -0.5, 2.0, 0.0]),
        };
        // Output 0: 1.4 + 4 · 0.8 = 4.6; output 1: 0.25 · 1.4 = 0.35.
        assert!((Kernel::Coregional(c).prior_variance() - (4.6 + 0.35) / 2.0).abs() < 1e-14);
    }

    #[test]
    fn parameters_names_serde_and_validation() {
        // The constructor: a_{q,d} = 1 for q = d mod Q, ±0.1 by the parity of q + d.
        let kernel = Kernel::coregional(matern_ard(), 3, 4);
        let Kernel::Coregional(c) = &kernel else { unreachable!() };
        let t = CROSS_LOADING;
        #[rustfmt::skip]
        let want = DMatrix::from_row_slice(3, 4, &[
            1.0, -t,  t,   1.0,
            -t,  1.0, -t,  t,
            t,   -t,  1.0, -t,
        ]);
        assert_eq!(c.mixing, want);
        assert_eq!(c.latents, vec![matern_ard(); 3]);

        let mut rng = ChaCha8Rng::seed_from_u64(27);
        for (kernel, _, _) in cases(&mut rng) {
            let p = kernel.log_params();
            assert_eq!(p.len(), kernel.n_params());
            let mut copy = kernel.clone();
            copy.set_log_params(&p);
            assert_eq!(copy, kernel);
            let names = kernel.param_names();
            assert_eq!(names.len(), kernel.n_params());
            let unique: std::collections::HashSet<_> = names.iter().collect();
            assert_eq!(unique.len(), names.len(), "{names:?}");
            assert!(kernel.validate(3).is_ok(), "{kernel:?}");
            let json = serde_json::to_string(&kernel).unwrap();
            let back: Kernel = serde_json::from_str(&json).unwrap();
            assert_eq!(back, kernel, "{json}");
        }

        let mut kernel = Kernel::Coregional(Coregional {
            latents: vec![matern_ard(), se()],
            mixing: DMatrix::from_row_slice(2, 2, &[1.0, -0.5, 2.0, 0.25]),
        });
        let names = [
            "latent0.matern52.variance",
            "latent0.matern52.lengthscale[0]",
            "latent0.matern52.lengthscale[1]",
            "latent1.se.variance",
            "latent1.se.lengthscale",
            "mixing.latent0.output0",
            "mixing.latent1.output0",
            "mixing.latent0.output1",
            "mixing.latent1.output1",
        ];
        assert_eq!(kernel.param_names(), names);
        let values = [1.4, 0.6, 1.2, 0.8, 0.9, 1.0, 2.0, -0.5, 0.25];
        for ((name, value), (want_name, want)) in kernel.named_params().into_iter().zip(names.iter().zip(values)) {
            assert_eq!(name, *want_name);
            assert!((value - want).abs() < 1e-14, "{name}: {value} vs {want}");
        }
        kernel.set_log_params(&[0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 3.0, 0.5, -2.0]);
        let Kernel::Coregional(c) = &kernel else { unreachable!() };
        assert_eq!(c.mixing, DMatrix::from_row_slice(2, 2, &[-1.0, 0.5, 3.0, -2.0]));
        assert_eq!(
            c.latents[1],
            Kernel::stationary(Family::SquaredExponential, 1.0, vec![1.0])
        );
        let sum = Kernel::Sum(vec![kernel.clone(), Kernel::Constant { variance: 0.5 }]);
        let named = sum.named_params();
        assert_eq!(named[5], ("sum[0].mixing.latent0.output0".to_string(), -1.0));
        assert_eq!(named[9].0, "sum[1].constant.variance");
        assert!((named[9].1 - 0.5).abs() < 1e-15);

        let good = || Coregional {
            latents: vec![matern_ard(), se()],
            mixing: DMatrix::from_row_slice(2, 2, &[1.0, -0.5, 2.0, 0.25]),
        };
        assert!(Kernel::Coregional(good()).validate(3).is_ok());
        let mut more_rows = good();
        more_rows.mixing = DMatrix::from_element(3, 2, 0.5);
        let mut nan = good();
        nan.mixing[(1, 0)] = f64::NAN;
        let mut infinite = good();
        infinite.mixing[(0, 1)] = f64::INFINITY;
        let mut no_outputs = good();
        no_outputs.mixing = DMatrix::zeros(2, 0);
        let no_latents = Coregional {
            latents: vec![],
            mixing: DMatrix::zeros(0, 2),
        };
        let bad = [
            (more_rows, 3, "3 rows of loadings for 2 latents"),
            (nan, 3, "mixing.latent1.output0"),
            (infinite, 3, "mixing.latent0.output1"),
            (no_outputs, 3, "no outputs"),
            (no_latents, 3, "no latents"),
            (good(), 1, "index column"),
            // The ARD latent has 2 lengthscales, for d − 1 = 3 coordinates.
            (good(), 4, "latent0.matern52"),
        ];
        for (c, d, says) in bad {
            match Kernel::Coregional(c.clone()).validate(d) {
                Err(ModelError::Config(msg)) => assert!(msg.contains(says), "{msg}"),
                other => panic!("{c:?} at d = {d} gave {other:?}"),
            }
        }
    }
}
