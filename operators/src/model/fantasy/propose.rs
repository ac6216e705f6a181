//! Algorithm 2: a batch of `k` points, each the maximiser of the acquisition
//! under the models conditioned on the fantasies of the points before it.

use nalgebra::{DMatrix, DVector};
use rand::Rng;

use super::{fantasy_site, Acquisition, Fantasy, PointMarginals, Surrogate};
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;

/// Where a batch's points are searched.
#[derive(Debug, Clone, PartialEq)]
pub enum Search {
    /// The box `[lo_j, hi_j]`: `candidates` points of a Sobol sequence
    /// scrambled by the seed (else uniform draws), the best `starts` of them
    /// refined by `steps` of projected gradient ascent.
    Box {
        /// `(lo_j, hi_j)` per input.
        bounds: Vec<(f64, f64)>,
        /// Candidate points scored before the ascent.
        candidates: usize,
        /// Sobol points rather than uniform draws.
        sobol: bool,
        /// The best candidates refined.
        starts: usize,
        /// Projected gradient steps per start.
        steps: usize,
    },
    /// A finite pool of points, one a row: a batch never takes a row twice.
    Pool(DMatrix<f64>),
}

impl Search {
    /// A box searched with 2048 Sobol points, the best 4 refined by 40 steps.
    pub fn in_box(bounds: Vec<(f64, f64)>) -> Search {
        Search::Box {
            bounds,
            candidates: 2048,
            sobol: true,
            starts: 4,
            steps: 40,
        }
    }

    fn validate(&self, d: usize, k: usize) -> Result<()> {
        let config = |m: String| Err(ModelError::Config(m));
        match self {
            Search::Box { bounds, candidates, .. } => {
                if bounds.len() != d {
                    return config(format!("{} bounds for {d} inputs", bounds.len()));
                }
                if let Some((j, (lo, hi))) = bounds
                    .iter()
                    .enumerate()
                    .find(|(_, (lo, hi))| !(lo.is_finite() && hi.is_finite() && lo < hi))
                {
                    return config(format!("bounds of input {j}: need finite lower < upper, got {lo},{hi}"));
                }
                if *candidates == 0 {
                    return config("a search needs at least one candidate".into());
                }
                Ok(())
            }
            Search::Pool(pool) => {
                if pool.ncols() != d {
                    return config(format!("the pool has {} columns for {d} inputs", pool.ncols()));
                }
                if let Some(row) = pool.row_iter().position(|r| r.iter().any(|v| !v.is_finite())) {
                    return Err(ModelError::NonFinite {
                        row,
                        what: "pool point".into(),
                    });
                }
                if pool.nrows() < k {
                    return config(format!("a batch of {k} from a pool of {}", pool.nrows()));
                }
                Ok(())
            }
        }
    }

    fn candidates(&self, rng: &mut impl Rng) -> DMatrix<f64> {
        match self {
            Search::Pool(pool) => pool.clone(),
            Search::Box {
                bounds,
                candidates,
                sobol,
                ..
            } => {
                let d = bounds.len();
                let quasi = *sobol && d as u32 <= sobol_burley::NUM_DIMENSIONS && *candidates <= 1 << 16;
                let seed: u32 = rng.random();
                DMatrix::from_fn(*candidates, d, |i, j| {
                    let u = if quasi {
                        f64::from(sobol_burley::sample(i as u32, j as u32, seed))
                    } else {
                        rng.random::<f64>()
                    };
                    bounds[j].0 + u * (bounds[j].1 - bounds[j].0)
                })
            }
        }
    }
}

/// A chosen point, its acquisition value when chosen, and its pool row.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// The point.
    pub x: Vec<f64>,
    /// The acquisition value there when it was chosen.
    pub acquisition: f64,
    /// Its row of the pool (`None` for a box).
    pub row: Option<usize>,
}

/// Algorithm 2 of Chang et al. (2023): chooses `k` points one at a time, each
/// maximising `acquisition` over `search` and then fantasised (by
/// `fantasy`) in every model, so that the next is chosen knowing it. The
/// models end conditioned on the batch: hand over working copies. The same
/// `rng` state gives the same batch.
pub fn propose_batch(
    models: &mut [Box<dyn Surrogate>],
    acquisition: &Acquisition,
    k: usize,
    search: &Search,
    fantasy: Fantasy,
    rng: &mut impl Rng,
) -> Result<Vec<Proposal>> {
    let d = models
        .first()
        .ok_or_else(|| ModelError::Config("a batch needs at least one model".into()))?
        .d();
    if let Some(other) = models.iter().find(|m| m.d() != d) {
        return Err(ModelError::Config(format!("models of {d} and {} inputs", other.d())));
    }
    if k == 0 {
        return Err(ModelError::Config("a batch needs k ≥ 1 points".into()));
    }
    search.validate(d, k)?;
    let likelihoods: Vec<Likelihood> = models.iter().map(|m| m.likelihood().clone()).collect();
    let likelihoods: Vec<&Likelihood> = likelihoods.iter().collect();
    acquisition.validate(&likelihoods)?;
    let mut acquisition = acquisition.clone();
    let candidates = search.candidates(rng);
    let mut taken = vec![false; candidates.nrows()];
    let mut batch: Vec<Proposal> = Vec::with_capacity(k);
    for _ in 0..k {
        let marginals: Vec<_> = models.iter().map(|m| m.marginals(&candidates)).collect();
        let values = acquisition.values(&likelihoods, &marginals);
        let mut order: Vec<usize> = (0..values.len())
            .filter(|&i| !taken[i] && values[i].is_finite())
            .collect();
        order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
        let Some(&best) = order.first() else {
            return Err(ModelError::Config(
                "the acquisition is not finite at any candidate left".into(),
            ));
        };
        let row = |i: usize| candidates.row(i).iter().copied().collect::<Vec<f64>>();
        let chosen = match search {
            Search::Pool(_) => {
                taken[best] = true;
                Proposal {
                    x: row(best),
                    acquisition: values[best],
                    row: Some(best),
                }
            }
            Search::Box {
                bounds, starts, steps, ..
            } => {
                let refined = order.iter().take((*starts).max(1)).map(|&i| {
                    let (x, value) = refine(models, &likelihoods, &acquisition, row(i), values[i], bounds, *steps);
                    (i, x, value)
                });
                let mut refined: Vec<_> = refined
                    .filter(|(_, x, _)| !batch.iter().any(|p| same(&p.x, x, bounds)))
                    .collect();
                refined.sort_by(|a, b| b.2.total_cmp(&a.2));
                let (i, x, value) = refined.into_iter().next().unwrap_or((best, row(best), values[best]));
                taken[i] = true;
                Proposal {
                    x,
                    acquisition: value,
                    row: None,
                }
            }
        };
        for (p, model) in models.iter_mut().enumerate() {
            let at = model.point_marginals(&chosen.x);
            let (site, label) = fantasy_site(likelihoods[p], &at.mean, &at.var, fantasy, rng);
            if let Some(y) = label {
                acquisition.believe(p, y);
            }
            model.condition(&chosen.x, &site)?;
        }
        batch.push(chosen);
    }
    Ok(batch)
}

/// Whether two points are one, to rounding of the box's scale.
fn same(a: &[f64], b: &[f64], bounds: &[(f64, f64)]) -> bool {
    a.iter()
        .zip(b)
        .zip(bounds)
        .all(|((a, b), (lo, hi))| (a - b).abs() <= 1e-9 * (hi - lo))
}

/// Projected gradient ascent from `x` in the box, in coordinates scaled to
/// the unit cube, with a step that grows after a gain and halves after a loss.
fn refine(
    models: &[Box<dyn Surrogate>],
    likelihoods: &[&Likelihood],
    acquisition: &Acquisition,
    x: Vec<f64>,
    value: f64,
    bounds: &[(f64, f64)],
    steps: usize,
) -> (Vec<f64>, f64) {
    let evaluate = |x: &[f64]| {
        let points: Vec<PointMarginals> = models.iter().map(|m| m.point_marginals(x)).collect();
        acquisition.value_and_grad(likelihoods, &points)
    };
    let width = DVector::from_iterator(bounds.len(), bounds.iter().map(|(lo, hi)| hi - lo));
    let (mut x, mut value) = (x, value);
    let mut grad = evaluate(&x).1;
    let mut step = 0.05;
    for _ in 0..steps {
        let direction = grad.component_mul(&width);
        let norm = direction.norm();
        if !(norm > 0.0 && norm.is_finite()) || step < 1e-7 {
            break;
        }
        let trial: Vec<f64> = (0..x.len())
            .map(|j| (x[j] + step * width[j] * direction[j] / norm).clamp(bounds[j].0, bounds[j].1))
            .collect();
        let (trial_value, trial_grad) = evaluate(&trial);
        if trial_value > value {
            (x, value, grad) = (trial, trial_value, trial_grad);
            step = (step * 1.5).min(0.5);
        } else {
            step *= 0.5;
        }
    }
    (x, value)
}
