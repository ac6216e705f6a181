//! Small dense linear-algebra helpers shared by the model: jittered Cholesky,
//! triangular solves with many right-hand sides, weighted outer products.

use nalgebra::{Cholesky, DMatrix, DMatrixView, DMatrixViewMut, DVector, Dyn};

use crate::model::error::{ModelError, Result};

/// How far the jitter may be raised, relative to the mean diagonal.
const MAX_RELATIVE_JITTER: f64 = 1e-2;

/// Cholesky factor of `a + jitter·I`. When that fails the jitter is raised
/// tenfold at a time up to `1e-2 ×` the mean diagonal; then it is an error.
/// Returns the factor and the jitter that worked.
pub fn cholesky_jittered(a: &DMatrix<f64>, jitter: f64, what: &str) -> Result<(Cholesky<f64, Dyn>, f64)> {
    let n = a.nrows();
    let scale = if n == 0 {
        1.0
    } else {
        (a.trace() / n as f64).abs().max(f64::MIN_POSITIVE)
    };
    let max_jitter = MAX_RELATIVE_JITTER * scale;
    let mut jitter = jitter.max(0.0);
    loop {
        let mut shifted = a.clone();
        for i in 0..n {
            shifted[(i, i)] += jitter;
        }
        if shifted.iter().all(|v| v.is_finite()) {
            if let Some(chol) = Cholesky::new(shifted) {
                return Ok((chol, jitter));
            }
        }
        if jitter >= max_jitter {
            return Err(ModelError::Cholesky {
                what: what.into(),
                jitter,
            });
        }
        jitter = (jitter * 10.0).max(1e-12 * scale).min(max_jitter);
    }
}

/// `L⁻¹ B` for a lower-triangular Cholesky factor `L`, in place.
pub fn solve_lower_in_place(chol: &Cholesky<f64, Dyn>, b: &mut DMatrix<f64>) {
    // l_dirty's upper triangle is garbage, but the solves read only the lower one.
    solve_lower_blocked(chol.l_dirty().as_view(), b.as_view_mut());
}

/// `L⁻¹ B` for a lower-triangular `L` held as a matrix (a factor grown by
/// hand, not a `Cholesky`), in place.
pub fn solve_lower_matrix_in_place(l: &DMatrix<f64>, b: &mut DMatrix<f64>) {
    solve_lower_blocked(l.as_view(), b.as_view_mut());
}

/// Below this order the triangular solve runs column by column.
const SOLVE_BLOCK: usize = 16;

/// `L⁻¹ B` by halves: solve the top rows, subtract their effect on the bottom
/// rows with one matrix product, solve the bottom rows. Column-by-column
/// substitution streams `L` through memory once per right-hand side; here all
/// but the small diagonal blocks' flops are a GEMM.
fn solve_lower_blocked(l: DMatrixView<'_, f64>, mut b: DMatrixViewMut<'_, f64>) {
    let m = l.nrows();
    if m <= SOLVE_BLOCK {
        let solved = l.solve_lower_triangular_mut(&mut b);
        debug_assert!(solved, "a Cholesky factor has a non-zero diagonal");
        return;
    }
    let half = m / 2;
    let (mut top, mut bottom) = b.rows_range_pair_mut(0..half, half..m);
    solve_lower_blocked(l.view((0, 0), (half, half)), top.as_view_mut());
    bottom.gemm(-1.0, &l.view((half, 0), (m - half, half)), &top, 1.0);
    solve_lower_blocked(l.view((half, half), (m - half, m - half)), bottom);
}

/// `Σ_j a_ij²` for every column `j`.
pub fn column_sq_norms(a: &DMatrix<f64>) -> DVector<f64> {
    DVector::from_iterator(a.ncols(), a.column_iter().map(|c| c.norm_squared()))
}

/// The transpose of a column-major matrix as a strided view, without a copy.
pub fn transposed(a: &DMatrix<f64>) -> DMatrixView<'_, f64, Dyn, Dyn> {
    DMatrixView::from_slice_with_strides(a.as_slice(), a.ncols(), a.nrows(), a.nrows(), 1)
}

/// `acc += A diag(w) Aᵀ` as one matrix product (`A` is `m × n`).
pub fn add_weighted_gram(acc: &mut DMatrix<f64>, a: &DMatrix<f64>, w: &[f64]) {
    let mut scaled = a.clone();
    for (mut col, &wj) in scaled.column_iter_mut().zip(w) {
        col *= wj;
    }
    acc.gemm(1.0, &scaled, &transposed(a), 1.0);
}

/// `log |A|` from a Cholesky factor of `A`.
pub fn log_det(chol: &Cholesky<f64, Dyn>) -> f64 {
    2.0 * chol.l_dirty().diagonal().iter().map(|d| d.ln()).sum::<f64>()
}

/// Makes a matrix exactly symmetric (rounding in products breaks it slightly).
pub fn symmetrize(a: &mut DMatrix<f64>) {
    let n = a.nrows();
    for j in 0..n {
        for i in 0..j {
            let v = 0.5 * (a[(i, j)] + a[(j, i)]);
            a[(i, j)] = v;
            a[(j, i)] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn the_blocked_solve_inverts_the_factor_at_every_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        // Orders below, at and across the block size, odd and even halves.
        for m in [1, 2, 15, 16, 17, 33, 100, 131] {
            let g = DMatrix::from_fn(m, m, |_, _| rng.random_range(-1.0..1.0));
            let a = &g * g.transpose() + DMatrix::identity(m, m);
            let chol = Cholesky::new(a).expect("positive definite");
            let b = DMatrix::from_fn(m, 7, |_, _| rng.random_range(-1.0..1.0));
            let mut x = b.clone();
            solve_lower_in_place(&chol, &mut x);
            let residual = (chol.l() * &x - &b).amax();
            assert!(residual < 1e-11, "m = {m}: |LX − B| = {residual:e}");
        }
    }
}
