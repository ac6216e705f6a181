//! The memory of a sequential learner: a few past points, chosen by their
//! Bayesian leverage score, whose likelihood terms are re-evaluated at every
//! update. Each point keeps the exact vectors of its contribution to the site
//! totals so that it can leave without a trace.

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::model::data::Data;
use crate::model::dual::estep::{PointSites, BETA_MIN};
use crate::model::dual::point::PointId;
use crate::model::likelihood::{Expectation, Likelihood};
use crate::model::posterior::{DualPosterior, Sites};

/// Which points of a batch enter the memory, and which leave it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
// Externally tagged: bincode (timely's wire format) cannot read internally tagged enums.
#[serde(rename_all = "kebab-case")]
pub enum MemoryPolicy {
    /// `k` points per batch by BLS, kept forever (the paper; `capacity`
    /// `None`) or, once the memory holds `capacity`, competing with the old
    /// points on their reservoir keys.
    PerBatch {
        /// Points chosen from each batch.
        k: usize,
        /// The most the memory holds (`None`: no bound).
        #[serde(default)]
        capacity: Option<usize>,
    },
    /// At most `capacity` points over the whole stream: BLS-weighted reservoir sampling.
    Reservoir {
        /// The most the memory holds.
        capacity: usize,
    },
    /// `k` points per batch uniformly at random (the paper's ablation), kept
    /// forever or up to `capacity` as for [`PerBatch`](Self::PerBatch): the
    /// memory stays a uniform sample of the past when batches are of one size.
    Random {
        /// Points drawn from each batch.
        k: usize,
        /// The most the memory holds (`None`: no bound).
        #[serde(default)]
        capacity: Option<usize>,
    },
    /// At most `capacity` points over the whole stream, every point seen
    /// equally likely to stay: the reservoir's ablation, BLS left out.
    RandomReservoir {
        /// The most the memory holds.
        capacity: usize,
    },
    /// No memory.
    None,
}

/// One remembered point and its contribution `(k s1, s2 k kᵀ)` per latent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryPoint {
    /// The record's identity.
    pub id: PointId,
    /// Its inputs.
    pub x: Vec<f64>,
    /// Its label.
    pub y: f64,
    /// The output it observes (0 for a single-output model).
    #[serde(default)]
    pub output: usize,
    /// The kernel column `k(Z, x)` its sites were added with, projected by every move of `Z` since.
    pub column: DVector<f64>,
    /// Its site's first natural parameter, per latent.
    pub s1: Vec<f64>,
    /// Its site's precision, per latent.
    pub s2: Vec<f64>,
    /// Reservoir key `ln(u)/h`: larger keys stay.
    pub key: f64,
    /// The sites it was first learned with, per latent: against them the
    /// memory measures how far past points' frozen sites have drifted
    /// ([`Drift`](crate::model::dual::share::Drift)), and a control variate
    /// corrects them.
    #[serde(default)]
    pub first: Option<FirstSites>,
    /// What forgetting has left of its weight: 1 when it arrived, halved
    /// every half-life of records since. Its sites (`s1`, `s2`, `first`) are
    /// its likelihood's raised to this power; re-learned, it counts this much.
    #[serde(default = "full_weight")]
    pub weight: f64,
}

/// A whole weight, 1: nothing forgotten (serde's default for what forgetting leaves).
pub(crate) fn full_weight() -> f64 {
    1.0
}

/// A memory point's sites from the update that first learned it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstSites {
    /// The first natural parameter, per latent.
    pub s1: Vec<f64>,
    /// The precision, per latent.
    pub s2: Vec<f64>,
}

/// The remembered points the learner revisits at every update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// In id order.
    pub points: Vec<MemoryPoint>,
}

impl Memory {
    /// The memory of `points` (in id order).
    pub fn of(points: Vec<MemoryPoint>) -> Self {
        Memory { points }
    }

    /// The number of points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether there are no points.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The remembered points as records.
    pub fn data(&self, d: usize) -> Data {
        let x = DMatrix::from_fn(self.len(), d, |i, j| self.points[i].x[j]);
        let y = DVector::from_iterator(self.len(), self.points.iter().map(|p| p.y));
        let outputs = self.points.iter().map(|p| p.output).collect();
        Data::with_outputs(x, y, outputs).expect("remembered points were validated when they arrived")
    }

    /// The part of `post`'s totals that the memory contributes, whitened by
    /// `post`'s `K`: each point's column whitened on its own (summed first,
    /// `K`'s condition number would enter the sum's rounding).
    pub fn whitened_totals(&self, post: &DualPosterior) -> Vec<Sites> {
        if self.is_empty() {
            return vec![Sites::zeros(post.m()); post.n_latent()];
        }
        let columns = DMatrix::from_columns(&self.points.iter().map(|p| p.column.clone()).collect::<Vec<_>>());
        let row = |f: fn(&MemoryPoint) -> &Vec<f64>| {
            DMatrix::from_fn(self.len(), post.n_latent(), |i, c| f(&self.points[i])[c])
        };
        let sites = PointSites {
            s1: row(|p| &p.s1),
            s2: row(|p| &p.s2),
        };
        sites.totals(&post.whiten(&columns))
    }

    /// Every point's weight (and so its sites) times `factor` (see [`Forgetting`](crate::model::dual::forgetting::Forgetting)).
    /// A reservoir key `ln(u)/h` becomes `ln(u)/(h·weight)`: the memory stays
    /// a weighted sample of the past by what is left of it.
    pub fn discount(&mut self, factor: f64) {
        for point in &mut self.points {
            point.weight *= factor;
            point.key = (point.key / factor).max(f64::MIN);
            for s in point.s1.iter_mut().chain(&mut point.s2) {
                *s *= factor;
            }
            if let Some(first) = &mut point.first {
                for s in first.s1.iter_mut().chain(&mut first.s2) {
                    *s *= factor;
                }
            }
        }
    }

    /// Takes out the points whose weight forgetting has brought below `floor`.
    pub fn take_below(&mut self, floor: f64) -> Memory {
        let (gone, kept) = std::mem::take(&mut self.points)
            .into_iter()
            .partition(|p| p.weight < floor);
        self.points = kept;
        Memory::of(gone)
    }

    /// The points' weights summed (their number, without forgetting).
    pub fn weight(&self) -> f64 {
        self.points.iter().map(|p| p.weight).sum()
    }

    /// Re-expresses every contribution in new inducing inputs: `k ← Pᵀ k`
    /// (paper Eq. 27).
    pub fn project(&mut self, p: &DMatrix<f64>) {
        for point in &mut self.points {
            point.column = p.tr_mul(&point.column);
        }
    }
}

/// The Bayesian leverage score of every record, `h_i = Σ_c β̂_ic v_ic` at the
/// current posterior (paper Eq. 31): how much the record moves the posterior.
/// For a Gaussian likelihood it is the ridge leverage score `v_i / σ²`.
pub fn bayesian_leverage_scores(post: &DualPosterior, likelihood: &Likelihood, data: &Data) -> Vec<f64> {
    // The whitened columns' marginals, as the shards make them: the memory
    // the learner keeps does not move with the scorer's rounding.
    let f = post.marginals(&post.cross(data.x()));
    let mut e = Expectation::default();
    let mut scores = Vec::with_capacity(data.n());
    f.for_each_point(|i, mean, var| {
        likelihood.expectation_of(data.output(i), mean, var, data.y()[i], &mut e);
        scores.push(e.beta.iter().zip(var).map(|(b, v)| b.max(BETA_MIN) * v).sum());
    });
    scores
}

/// Efraimidis–Spirakis key `ln(u)/w` of a point with weight `w` and a
/// uniform draw `u`: the `k` largest keys are a weighted sample without replacement.
/// Kept finite (a weight near zero gives the lowest key, not `-∞`) so that
/// checkpoints stay valid JSON.
pub fn reservoir_key(weight: f64, u: f64) -> f64 {
    (u.max(f64::MIN_POSITIVE).ln() / weight.max(f64::MIN_POSITIVE)).max(f64::MIN)
}

/// Indices of the `k` largest keys, largest first (ties by index).
pub fn top_k(keys: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

#[cfg(test)]
mod tests {
    use super::MemoryPolicy;

    #[test]
    fn a_per_batch_policy_saved_without_a_capacity_reads_back_unbounded() {
        let old: MemoryPolicy = serde_json::from_str(r#"{"random":{"k":20}}"#).unwrap();
        assert_eq!(old, MemoryPolicy::Random { k: 20, capacity: None });
        let old: MemoryPolicy = serde_json::from_str(r#"{"per-batch":{"k":10}}"#).unwrap();
        assert_eq!(old, MemoryPolicy::PerBatch { k: 10, capacity: None });
    }
}
