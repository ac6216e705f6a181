//! Inducing-input selection by greedy pivoted Cholesky (Burt et al. 2020):
//! repeatedly take the candidate with the largest variance left unexplained
//! by those already taken.

use nalgebra::DMatrix;

use super::kernel::Kernel;

/// Residual variance below which a candidate adds nothing (relative to the prior).
const NEGLIGIBLE_VARIANCE: f64 = 1e-12;

/// Indices of up to `m` rows of `candidates`, in the order taken. Fewer come
/// back when the rest are (numerically) explained already, e.g. duplicates.
/// Cost `O(N m²)` plus `N m` kernel evaluations for `N` candidates.
pub fn pivoted_cholesky(kernel: &Kernel, candidates: &DMatrix<f64>, m: usize) -> Vec<usize> {
    let n = candidates.nrows();
    let m = m.min(n);
    let mut residual = kernel.diag(candidates);
    let floor = NEGLIGIBLE_VARIANCE * residual.amax().max(f64::MIN_POSITIVE);
    // Row j of the partial factor, over all candidates.
    let mut factor = DMatrix::<f64>::zeros(m, n);
    let mut chosen = Vec::with_capacity(m);
    for j in 0..m {
        let (pivot, &best) = residual
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .expect("at least one candidate");
        if best <= floor {
            break;
        }
        chosen.push(pivot);
        let k_pivot = kernel.matrix(&candidates.rows(pivot, 1).into_owned(), candidates);
        let scale = best.sqrt();
        for i in 0..n {
            let explained: f64 = (0..j).map(|t| factor[(t, pivot)] * factor[(t, i)]).sum();
            let value = (k_pivot[(0, i)] - explained) / scale;
            factor[(j, i)] = value;
            residual[i] -= value * value;
        }
        residual[pivot] = 0.0;
    }
    chosen
}

/// The rows of `candidates` chosen by [`pivoted_cholesky`].
pub fn select_inducing(kernel: &Kernel, candidates: &DMatrix<f64>, m: usize) -> DMatrix<f64> {
    candidates.select_rows(&pivoted_cholesky(kernel, candidates, m))
}
