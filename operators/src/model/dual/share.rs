//! How much of the past the memory stands for.
//!
//! Past data no longer at hand is held two ways at once: every past point's
//! sites, frozen in the totals when it was last learned, and the memory,
//! whose points are re-learned at every update. Either estimates what all
//! past data says, `Σ_old E_q[log p(y_i|f_i)]`:
//!
//! - the frozen sites, exactly where the posterior has not moved since they
//!   were taken (a Gaussian likelihood's, at any posterior), and with a bias
//!   that grows as it moves: a softmax site taken while a class had no data
//!   has no curvature for that class, so when a later task raises the class
//!   nothing in the frozen sites pushes back;
//! - the memory as a uniform sample, its terms weighted `w = n_old / |M|`:
//!   without bias, and noisy.
//!
//! An update mixes them with a share `γ`: the frozen sites of the past but
//! the memory at weight `1 − γ`, the memory at weight `b = 1 + γ(w − 1)`, so
//! the past still counts `n_old` points. `γ = 0` is the paper's memory,
//! `γ = 1` the memory as a sample of all past data. The mix keeps every
//! weight positive, so the E-step's objective stays concave (a control
//! variate, `w` on the memory's terms and `1 − w` on their frozen sites, does
//! not, and failed to climb at large prior variances: docs/RESULTS.md).
//!
//! [`MemoryShare::Estimated`] chooses `γ` at every update from what the
//! memory shows of the frozen sites' bias. At the posterior that the batch
//! and the memory learned with the frozen sites, each memory point `j`
//! compares the pull of its true likelihood, `α̂_j = ∂E_q[log p]/∂μ_j`, with
//! the pull its own first sites would exert there, `s1_j − s2_j μ_j`. Their
//! difference `δ_j`, summed along the whitened columns `a_j` and scaled by
//! `w`, estimates the error of the frozen sites' pull on `u` over all past
//! data, `B`; the memory's pull `w Σ_M α̂_j a_j` estimates the true one with
//! variance `V`. The share that minimises the mean squared error of the mix,
//! `(1 − γ)² |B|² + γ² V`, is `γ = |B|² / (|B|² + V)`, with `|B|²` estimated
//! without the part its own sampling noise adds. On stationary streams the
//! differences are small and incoherent (`γ` near 0); where a new task moves
//! the posterior at old points they add up (`γ` near 1).

use nalgebra::DVector;
use serde::{Deserialize, Serialize};

/// How much of the past the memory stands for at each update.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryShare {
    /// A fixed share `γ ∈ [0, 1]`: 0 is the paper's memory (each point for
    /// itself), 1 the memory as a sample of all past data.
    Fixed(f64),
    /// `γ` at every update from the bias the memory measures in the frozen sites.
    Estimated,
}

impl MemoryShare {
    /// The paper's memory: every memory point stands for itself.
    pub const OWN: MemoryShare = MemoryShare::Fixed(0.0);

    /// Whether a fixed share is in `[0, 1]`.
    pub fn is_valid(&self) -> bool {
        match *self {
            MemoryShare::Fixed(g) => (0.0..=1.0).contains(&g),
            MemoryShare::Estimated => true,
        }
    }
}

/// How a memory point's sites count in the totals once it stands for past
/// data beyond itself, with `w` its weight:
///
/// - as a *control variate* for all past data (`w = n_old / |M|`, not
///   `sample`): every past point keeps the sites `F_i` it was first learned
///   with, and the memory's re-learned sites `S_j` correct them on behalf of
///   all, `Σ_old E_q[log F_i] + w Σ_M (E_q[log p(y_j|f_j)] − E_q[log F_j])`:
///   unbiased for a uniform memory and exact where the first sites still
///   hold, but with weight `1 − w < 0` on the first sites' concave terms
///   its E-step's objective is not concave, and at a large prior variance
///   it could not climb at all (docs/RESULTS.md, "The memory as a sample of the past", 2026-11-25). A point in
///   the totals holds `(1 − w) F_j + w S_j` and leaves `F_j` behind;
/// - as a *sample* (`sample`): its first sites play no part and it counts
///   `w` times, `w S_j`, the memory's part of a [`MemoryShare`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ControlVariate {
    /// The weight `w`.
    pub weight: f64,
    /// Whether the point counts as a sample rather than a control variate.
    #[serde(default)]
    pub sample: bool,
}

impl ControlVariate {
    /// A memory point's site in the totals, one latent: `(1 − w) F + w S`, its
    /// precision kept non-negative so that no sum of sites can lose definiteness.
    pub fn site(&self, first: (f64, f64), own: (f64, f64)) -> (f64, f64) {
        let w = self.weight;
        // A sample drops the first sites: the point counts `w` times.
        let first = if self.sample { (0.0, 0.0) } else { first };
        let s1 = (1.0 - w) * first.0 + w * own.0;
        let s2 = (1.0 - w) * first.1 + w * own.1;
        (s1, s2.max(0.0))
    }
}

/// What the memory's points show of the frozen sites' bias, for one latent:
/// sums over memory points `j` with whitened columns `a_j`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// `Σ δ_j a_j`, `δ_j = α̂_j − (s1_j − s2_j μ_j)` against the first sites.
    pub bias: DVector<f64>,
    /// `Σ |δ_j a_j|²`.
    pub bias_sq: f64,
    /// `Σ α̂_j a_j`.
    pub pull: DVector<f64>,
    /// `Σ |α̂_j a_j|²`.
    pub pull_sq: f64,
    /// The memory points summed.
    pub points: f64,
}

impl Drift {
    /// The sums over no points, for `m` inducing inputs.
    pub fn zeros(m: usize) -> Self {
        Drift {
            bias: DVector::zeros(m),
            bias_sq: 0.0,
            pull: DVector::zeros(m),
            pull_sq: 0.0,
            points: 0.0,
        }
    }

    /// Adds memory point `j`: its whitened column, true pull and first-site pull.
    pub fn add_point(&mut self, a: &DVector<f64>, alpha: f64, first_pull: f64) {
        let delta = alpha - first_pull;
        let a_sq = a.norm_squared();
        self.bias.axpy(delta, a, 1.0);
        self.bias_sq += delta * delta * a_sq;
        self.pull.axpy(alpha, a, 1.0);
        self.pull_sq += alpha * alpha * a_sq;
        self.points += 1.0;
    }

    /// Adds another share's sums.
    pub fn add(&mut self, other: &Drift) {
        self.bias += &other.bias;
        self.bias_sq += other.bias_sq;
        self.pull += &other.pull;
        self.pull_sq += other.pull_sq;
        self.points += other.points;
    }
}

/// The share `γ = |B|² / (|B|² + V)` of the module's doc, from every latent's
/// [`Drift`] over a memory of `drift[0].points` of `n_old` past points. The
/// common factor `w²` cancels, so the sums are used as they are.
pub fn estimated_share(drift: &[Drift], n_old: f64) -> f64 {
    let (mut bias, mut variance) = (0.0, 0.0);
    for d in drift.iter().filter(|d| d.points > 0.0) {
        // |Σ δa|² is |B|² plus the spread of the δa about their mean.
        let noise = d.bias_sq - d.bias.norm_squared() / d.points;
        bias += (d.bias.norm_squared() - noise).max(0.0);
        // A sample without replacement of |M| out of n_old: finite-population correction.
        let unsampled = (1.0 - d.points / n_old).max(0.0);
        variance += (d.pull_sq - d.pull.norm_squared() / d.points).max(0.0) * unsampled;
    }
    if bias + variance > 0.0 {
        bias / (bias + variance)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drift(points: &[(f64, f64, f64)]) -> Drift {
        let mut d = Drift::zeros(2);
        for &(a0, alpha, first) in points {
            d.add_point(&DVector::from_vec(vec![a0, 1.0 - a0]), alpha, first);
        }
        d
    }

    #[test]
    fn first_sites_that_still_hold_give_no_share() {
        let d = drift(&[(0.2, 0.5, 0.5), (0.7, -0.3, -0.3), (0.4, 0.1, 0.1)]);
        assert_eq!(estimated_share(&[d], 100.0), 0.0);
    }

    #[test]
    fn a_bias_every_point_shares_outweighs_the_sample_noise() {
        // Each memory point pulls down where its first sites said nothing.
        let points: Vec<_> = (0..50).map(|j| (0.5 + 0.01 * (j % 5) as f64, -0.4, 0.0)).collect();
        let share = estimated_share(&[drift(&points)], 500.0);
        assert!(share > 0.99, "{share}");
    }

    #[test]
    fn incoherent_differences_are_taken_for_noise() {
        // Differences of alternating sign about zero: |Σδa|² is what their spread alone gives.
        let points: Vec<_> = (0..40)
            .map(|j| {
                (
                    0.5,
                    if j % 2 == 0 { 1.0 } else { -1.0 },
                    if j % 2 == 0 { 0.9 } else { -0.9 },
                )
            })
            .collect();
        assert_eq!(estimated_share(&[drift(&points)], 400.0), 0.0);
    }

    #[test]
    fn with_every_past_point_in_memory_any_bias_takes_the_memory() {
        let d = drift(&[(0.3, 0.5, 0.1), (0.6, 0.4, 0.2)]);
        assert_eq!(estimated_share(&[d], 2.0), 1.0);
    }
}
