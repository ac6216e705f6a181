//! Small dense linear-algebra helpers shared by the model: jittered Cholesky,
//! triangular solves with many right-hand sides, weighted outer products.

use nalgebra::{Cholesky, DMatrix, DMatrixView, DVector, Dyn};

use super::error::{ModelError, Result};

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
    // l_dirty's upper triangle is garbage, but the solve reads only the lower one.
    let solved = chol.l_dirty().solve_lower_triangular_mut(b);
    debug_assert!(solved, "a Cholesky factor has a non-zero diagonal");
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
