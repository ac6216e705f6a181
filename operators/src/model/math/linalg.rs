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

/// A symmetric `a` made ready for nalgebra's eigensolver, which returns NaN
/// on some matrices with zero rows (nalgebra issue 379) or entries of 1e−160
/// beside 1 (site precisions over inducing inputs the data do not reach have
/// both): entries below the rounding of the largest set to zero, and the
/// rows still coupled to another. The other rows are eigenvectors already
/// (`e_i`, eigenvalue `a_ii`) and stay out of the solver.
pub fn coupled_rows(a: &DMatrix<f64>) -> (DMatrix<f64>, Vec<usize>) {
    let n = a.nrows();
    let negligible = f64::EPSILON * a.amax();
    let a = a.map(|v| if v.abs() < negligible { 0.0 } else { v });
    let coupled = (0..n).filter(|&i| (0..n).any(|j| j != i && a[(i, j)] != 0.0)).collect();
    (a, coupled)
}

/// The eigenvalues and eigenvectors (as columns) of a symmetric `a`, the
/// solver run on its [`coupled_rows`] only.
pub fn symmetric_eigen(a: &DMatrix<f64>) -> (DVector<f64>, DMatrix<f64>) {
    let (a, coupled) = coupled_rows(a);
    let n = a.nrows();
    let mut values = a.diagonal();
    let mut vectors = DMatrix::identity(n, n);
    if !coupled.is_empty() {
        let eigen = a.select_rows(&coupled).select_columns(&coupled).symmetric_eigen();
        for (bj, &j) in coupled.iter().enumerate() {
            values[j] = eigen.eigenvalues[bj];
            vectors.column_mut(j).fill(0.0);
            for (bi, &i) in coupled.iter().enumerate() {
                vectors[(i, j)] = eigen.eigenvectors[(bi, bj)];
            }
        }
    }
    (values, vectors)
}

/// `L⁻¹ B` for a lower-triangular Cholesky factor `L`, in place.
pub fn solve_lower_in_place(chol: &Cholesky<f64, Dyn>, b: &mut DMatrix<f64>) {
    // l_dirty's upper triangle is garbage, but the solves read only the lower one.
    solve_blocked(chol.l_dirty().as_view(), b.as_view_mut(), false);
}

/// `L⁻¹ B` for a lower-triangular `L` held as a matrix (a factor grown by
/// hand, not a `Cholesky`), in place.
pub fn solve_lower_matrix_in_place(l: &DMatrix<f64>, b: &mut DMatrix<f64>) {
    solve_blocked(l.as_view(), b.as_view_mut(), false);
}

/// `L⁻ᵀ B` for a Cholesky factor `L`, in place.
pub fn solve_lower_transposed_in_place(chol: &Cholesky<f64, Dyn>, b: &mut DMatrix<f64>) {
    solve_blocked(chol.l_dirty().as_view(), b.as_view_mut(), true);
}

/// `L⁻ᵀ B` for a lower-triangular `L` held as a matrix, in place.
pub fn solve_lower_transposed_matrix_in_place(l: &DMatrix<f64>, b: &mut DMatrix<f64>) {
    solve_blocked(l.as_view(), b.as_view_mut(), true);
}

/// `A⁻¹ = L⁻ᵀL⁻¹` from a Cholesky factor of `A`, by blocked solves.
pub fn cholesky_inverse(chol: &Cholesky<f64, Dyn>) -> DMatrix<f64> {
    let m = chol.l_dirty().nrows();
    let mut inverse = DMatrix::identity(m, m);
    solve_lower_in_place(chol, &mut inverse);
    solve_lower_transposed_in_place(chol, &mut inverse);
    symmetrize(&mut inverse);
    inverse
}

/// Below this order the triangular solves substitute row by row.
const SOLVE_BLOCK: usize = 16;

/// `L⁻¹ B` (or `L⁻ᵀ B`, `transposed`) by halves: solve the top rows,
/// subtract their effect on the bottom rows with one matrix product, solve
/// the bottom rows; for `Lᵀ`, upper triangular, the bottom rows first.
/// Column-by-column substitution streams `L` through memory once per
/// right-hand side; here all but the small diagonal blocks' flops are a GEMM.
fn solve_blocked(l: DMatrixView<'_, f64>, mut b: DMatrixViewMut<'_, f64>, transposed: bool) {
    let m = l.nrows();
    if m <= SOLVE_BLOCK {
        substitute(&Leaf::new(l, transposed), b);
        return;
    }
    let half = m / 2;
    let (first, last) = (l.view((0, 0), (half, half)), l.view((half, half), (m - half, m - half)));
    let below = l.view((half, 0), (m - half, half));
    let (mut top, mut bottom) = b.rows_range_pair_mut(0..half, half..m);
    if transposed {
        solve_blocked(last, bottom.as_view_mut(), true);
        // nalgebra's gemm_tr takes a dot product per entry; a transposed copy of
        // the block goes through the matrix product instead.
        top.gemm(-1.0, &below.transpose(), &bottom, 1.0);
        solve_blocked(first, top, true);
    } else {
        solve_blocked(first, top.as_view_mut(), false);
        bottom.gemm(-1.0, &below, &top, 1.0);
        solve_blocked(last, bottom, false);
    }
}

/// A diagonal block of at most [`SOLVE_BLOCK`] rows as the system `T x = b`,
/// `T = L` or `T = Lᵀ`, with the unknowns in the order they are solved
/// (the last row first for `Lᵀ`), so both substitutions run one loop.
struct Leaf {
    n: usize,
    transposed: bool,
    /// Unknown `i`'s coefficients on the unknowns solved before it.
    before: [[f64; SOLVE_BLOCK]; SOLVE_BLOCK],
    diagonal: [f64; SOLVE_BLOCK],
}

impl Leaf {
    fn new(l: DMatrixView<'_, f64>, transposed: bool) -> Self {
        let n = l.nrows();
        let mut leaf = Leaf {
            n,
            transposed,
            before: [[0.0; SOLVE_BLOCK]; SOLVE_BLOCK],
            diagonal: [0.0; SOLVE_BLOCK],
        };
        for i in 0..n {
            let row = leaf.row(i);
            leaf.diagonal[i] = l[(row, row)];
            for k in 0..i {
                let col = leaf.row(k);
                leaf.before[i][k] = if transposed { l[(col, row)] } else { l[(row, col)] };
            }
        }
        leaf
    }

    /// The row of unknown `i`.
    fn row(&self, i: usize) -> usize {
        if self.transposed {
            self.n - 1 - i
        } else {
            i
        }
    }
}

/// Solves a leaf for every column of `b`. nalgebra's substitution takes a
/// bounds-checked view per step, which at 16 rows costs more than the GEMMs
/// around it; here columns go [`LANES`] at a time through short loops on the
/// stack that the compiler turns into vector operations. Each column sees the
/// same operations in the same order as it would alone.
fn substitute(leaf: &Leaf, b: DMatrixViewMut<'_, f64>) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { substitute_avx2(leaf, b) };
        return;
    }
    substitute_lanes(leaf, b);
}

/// The same loops, compiled for four lanes at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn substitute_avx2(leaf: &Leaf, b: DMatrixViewMut<'_, f64>) {
    substitute_lanes(leaf, b);
}

/// Columns substituted side by side.
const LANES: usize = 4;

#[inline(always)]
fn substitute_lanes(leaf: &Leaf, mut b: DMatrixViewMut<'_, f64>) {
    let mut x = [[0.0; LANES]; SOLVE_BLOCK];
    for first in (0..b.ncols()).step_by(LANES) {
        let width = LANES.min(b.ncols() - first);
        for i in 0..leaf.n {
            let row = leaf.row(i);
            let mut sum = [0.0; LANES];
            for (l, s) in sum.iter_mut().enumerate().take(width) {
                *s = b[(row, first + l)];
            }
            for (coefficient, solved) in leaf.before[i][..i].iter().zip(&x[..i]) {
                for (s, v) in sum.iter_mut().zip(solved) {
                    *s -= coefficient * v;
                }
            }
            for (v, s) in x[i].iter_mut().zip(sum) {
                *v = s / leaf.diagonal[i];
            }
        }
        for (i, solved) in x[..leaf.n].iter().enumerate() {
            for (l, v) in solved.iter().enumerate().take(width) {
                b[(leaf.row(i), first + l)] = *v;
            }
        }
    }
}

/// `Σ_j a_ij²` for every column `j`.
pub fn column_sq_norms(a: &DMatrix<f64>) -> DVector<f64> {
    DVector::from_iterator(a.ncols(), a.column_iter().map(|c| c.norm_squared()))
}

/// The transpose of a column-major matrix as a strided view, without a copy.
/// Only ever the right operand of a product: on the left, nalgebra's path
/// for products with a dimension of 5 or less writes out of bounds
/// (nalgebra 0.35; `the_transposed_view_is_a_safe_right_operand_at_every_size`).
pub fn transposed(a: &DMatrix<f64>) -> DMatrixView<'_, f64, Dyn, Dyn> {
    DMatrixView::from_slice_with_strides(a.as_slice(), a.ncols(), a.nrows(), a.nrows(), 1)
}

/// `A diag(w) Aᵀ` (`A` is `m × n`), exactly symmetric (see [`gram_of_scaled`]).
pub fn weighted_gram(a: &DMatrix<f64>, w: &[f64]) -> DMatrix<f64> {
    let mut scaled = a.clone();
    for (mut col, &wj) in scaled.column_iter_mut().zip(w) {
        col *= wj;
    }
    gram_of_scaled(&scaled, a)
}

/// `X Aᵀ` for `X = A diag(w)`, a symmetric product: its lower triangle in
/// blocks of matrix products (the diagonal blocks split again), mirrored.
/// At `m = 100` that is 5/8 of the full product's flops, and the result is
/// exactly symmetric.
pub fn gram_of_scaled(x: &DMatrix<f64>, a: &DMatrix<f64>) -> DMatrix<f64> {
    let m = a.nrows();
    let mut gram = DMatrix::zeros(m, m);
    lower_gram(gram.as_view_mut(), x, a, 0);
    for j in 0..m {
        for i in j + 1..m {
            gram[(j, i)] = gram[(i, j)];
        }
    }
    gram
}

/// Below this order a diagonal block of a gram is one product, both triangles.
const GRAM_BLOCK: usize = 32;

/// The lower triangle (at least) of rows and columns `from..` of `X Aᵀ` into `c`.
fn lower_gram(mut c: DMatrixViewMut<'_, f64>, x: &DMatrix<f64>, a: &DMatrix<f64>, from: usize) {
    let m = c.nrows();
    if m <= GRAM_BLOCK {
        c.gemm(1.0, &x.rows(from, m), &rows_transposed(a, from, m), 0.0);
        return;
    }
    let half = m / 2;
    let (mut top, mut bottom) = c.rows_range_pair_mut(0..half, half..m);
    lower_gram(top.columns_range_mut(0..half), x, a, from);
    bottom.columns_range_mut(0..half).gemm(
        1.0,
        &x.rows(from + half, m - half),
        &rows_transposed(a, from, half),
        0.0,
    );
    lower_gram(bottom.columns_range_mut(half..m), x, a, from + half);
}

/// Rows `from..from + len` of a column-major matrix, transposed, as a strided view.
fn rows_transposed(a: &DMatrix<f64>, from: usize, len: usize) -> DMatrixView<'_, f64, Dyn, Dyn> {
    DMatrixView::from_slice_with_strides(&a.as_slice()[from..], a.ncols(), len, a.nrows(), 1)
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

    /// A site precision with a zero row and an entry of 1e-160 beside 1
    /// (inducing inputs the data do not reach) decomposes without NaN, and
    /// its pairs put it back together, orthonormal.
    #[test]
    fn symmetric_eigen_takes_zero_rows_and_negligible_entries() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let x = DMatrix::from_fn(5, 8, |_, _| rng.random_range(-1.0..1.0));
        let mut a = DMatrix::zeros(7, 7);
        a.view_mut((0, 0), (5, 5)).copy_from(&(&x * x.transpose()));
        a[(6, 6)] = 1.0;
        a[(6, 0)] = 1e-160;
        a[(0, 6)] = 1e-160;
        let (values, vectors) = symmetric_eigen(&a);
        assert!(values.iter().chain(vectors.iter()).all(|v| v.is_finite()));
        let back = &vectors * DMatrix::from_diagonal(&values) * vectors.transpose();
        assert!((&back - &a).amax() < 1e-12 * a.amax(), "{back} against {a}");
        assert!((vectors.transpose() * &vectors - DMatrix::<f64>::identity(7, 7)).amax() < 1e-12);
        assert_eq!(values[5], 0.0, "the zero row is an eigenvector of its own");
    }

    #[test]
    fn a_leaf_solves_a_column_to_the_same_bits_alone_or_beside_others() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        // One leaf: no GEMM, whose kernels may round differently at other widths.
        let m = SOLVE_BLOCK - 3;
        let g = DMatrix::from_fn(m, m, |_, _| rng.random_range(-1.0..1.0));
        let chol = Cholesky::new(&g * g.transpose() + DMatrix::identity(m, m)).expect("positive definite");
        let b = DMatrix::from_fn(m, 11, |_, _| rng.random_range(-1.0..1.0));
        for transposed in [false, true] {
            let solve = |mut x: DMatrix<f64>| {
                if transposed {
                    solve_lower_transposed_in_place(&chol, &mut x);
                } else {
                    solve_lower_in_place(&chol, &mut x);
                }
                x
            };
            let together = solve(b.clone());
            for j in 0..b.ncols() {
                let alone = solve(b.columns(j, 1).into_owned());
                assert!(
                    together
                        .column(j)
                        .iter()
                        .zip(alone.iter())
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "column {j} (transposed: {transposed})"
                );
            }
        }
    }

    /// As the right operand of a product or of `gemm`, the strided view is
    /// the copied transpose at every size, the small ones (nalgebra's own
    /// loops, not matrixmultiply) included. Under debug assertions a write
    /// out of bounds would abort here.
    #[test]
    fn the_transposed_view_is_a_safe_right_operand_at_every_size() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for (r, c, k) in triples(&[1, 2, 3, 6, 9]) {
            let a = DMatrix::from_fn(r, c, |_, _| rng.random_range(-1.0..1.0));
            let b = DMatrix::from_fn(k, c, |_, _| rng.random_range(-1.0..1.0));
            let want = &b * a.transpose();
            assert_eq!(&b * transposed(&a), want, "{r} {c} {k}");
            let mut got = DMatrix::zeros(k, r);
            got.gemm(1.0, &b, &transposed(&a), 0.0);
            assert_eq!(got, want, "gemm {r} {c} {k}");
        }
    }

    fn triples(sizes: &[usize]) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        for &r in sizes {
            for &c in sizes {
                for &k in sizes {
                    out.push((r, c, k));
                }
            }
        }
        out
    }

    #[test]
    fn a_weighted_gram_is_symmetric_and_matches_the_full_product_at_every_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for m in [1, 5, 32, 33, 64, 100, 131] {
            let a = DMatrix::from_fn(m, 23, |_, _| rng.random_range(-1.0..1.0));
            let w: Vec<f64> = (0..23).map(|_| rng.random_range(-0.5..2.0)).collect();
            let gram = weighted_gram(&a, &w);
            let full = &a * DMatrix::from_diagonal(&DVector::from_vec(w.clone())) * a.transpose();
            assert!(gram == gram.transpose(), "m = {m}: not exactly symmetric");
            let error = (&gram - &full).amax();
            assert!(error < 1e-13 * full.amax().max(1.0), "m = {m}: {error:e}");
        }
    }

    #[test]
    fn blocked_solves_and_the_inverse_match_the_factor_at_every_order() {
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
            let mut y = b.clone();
            solve_lower_transposed_in_place(&chol, &mut y);
            let residual = (chol.l().transpose() * &y - &b).amax();
            assert!(residual < 1e-11, "m = {m}: |LᵀY − B| = {residual:e}");
            let identity = cholesky_inverse(&chol) * chol.l() * chol.l().transpose();
            let residual = (identity - DMatrix::<f64>::identity(m, m)).amax();
            assert!(residual < 1e-10, "m = {m}: |A⁻¹A − I| = {residual:e}");
        }
    }
}
