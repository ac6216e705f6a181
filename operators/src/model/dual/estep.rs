//! The E-step: damped natural-gradient updates of the per-point sites.
//!
//! Each point `i` of a set `P` keeps its damped sites `(s1_i, s2_i)` per latent,
//! and `P` contributes exactly `(Σ k_i s1_i, Σ s2_i k_i k_iᵀ)` to the totals
//! `(l, Λ)`, whitened `(Σ a_i s1_i, Σ s2_i a_i a_iᵀ)` with `a_i = L⁻¹k_i` as the
//! posterior holds them. One step recomputes `λ1_i = α̂_i + β̂_i μ_i` and `β̂_i` at the
//! current marginals, damps them with `ρ` and moves the totals by the change.

use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::model::data::Data;
use crate::model::dual::objective::expected_log_message;
use crate::model::dual::share::ControlVariate;
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::{Expectation, Likelihood};
use crate::model::math::linalg::weighted_gram;
use crate::model::posterior::{Cross, DualPosterior, Sites};

/// `β̂` is clipped from below so that every site stays a valid precision.
pub const BETA_MIN: f64 = 1e-8;

/// How far a site's new pseudo-observation `μ + α̂/β̂` may lie beyond its
/// previous one (or beyond `μ`, for a new site), in marginal standard
/// deviations, at the first step of an E-step (see [`site_precision`]).
pub const SITE_STEP_LIMIT: f64 = 4.0;

/// The trust radius grows at most to this many marginal standard deviations.
const SITE_STEP_LIMIT_MAX: f64 = 4096.0;

/// The size of one E-step: its damping `ρ` and its trust radius, in marginal
/// standard deviations (see [`site_precision`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepSize {
    /// The damping `ρ`.
    pub rho: f64,
    /// The trust radius, in marginal standard deviations.
    pub radius: f64,
}

impl StepSize {
    /// The first step of an E-step with damping `rho`.
    pub fn first(rho: f64) -> Self {
        StepSize {
            rho,
            radius: SITE_STEP_LIMIT,
        }
    }
}

/// The precision a site moves to: `β̂`, raised where needed so that its
/// pseudo-observation `μ + α̂/β̂` lies at most `radius` marginal
/// standard deviations beyond the site's previous one (`previous`, or `μ` for
/// a site that contributes nothing yet): a trust region. Where the likelihood
/// still slopes but barely curves (a class the model has learned to push
/// down: `α̂ ≈ 1`, `β̂ ≈ p ≈ 0`)
/// the pseudo-observation lies far out, and a batch of such sites moved the
/// posterior by their summed gradients times the prior variance: the E-step
/// overshot and diverged. At a fixed point every site proposes its previous
/// pseudo-observation, so the bound is slack there and the fixed point is the
/// one of the true `β̂`. A conjugate likelihood's one step is exact and keeps its `β̂`.
///
/// The radius is in marginal standard deviations, and those shrink as the
/// batch's sites add up: a class that must rise far (a new task's, from
/// below every learned class) climbed a few posterior standard deviations a
/// step, thousands of steps from its optimum. [`Backtracking`] therefore
/// doubles the radius after every step it keeps and halves it (down to
/// [`SITE_STEP_LIMIT`]) after every step it undoes.
pub fn site_precision(
    likelihood: &Likelihood,
    beta: f64,
    alpha: f64,
    mean: f64,
    var: f64,
    previous: Option<f64>,
    radius: f64,
) -> f64 {
    if likelihood.is_conjugate() {
        return beta;
    }
    // Room towards α̂'s side: the trust radius, plus however far out the previous pseudo-observation lies.
    let ahead = previous.map_or(0.0, |r| ((r - mean) * alpha.signum()).max(0.0));
    let room = radius * var.max(f64::EPSILON).sqrt() + ahead;
    beta.max(alpha.abs() / room).max(BETA_MIN)
}

/// How many damped site updates an E-step takes, and how damped.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EStepConfig {
    /// Fixed-point iterations.
    pub steps: usize,
    /// Damping `ρ ∈ (0, 1]`; `ρ = 1` is exact in one step for a Gaussian likelihood.
    pub rho: f64,
}

impl Default for EStepConfig {
    fn default() -> Self {
        EStepConfig { steps: 4, rho: 0.8 }
    }
}

impl EStepConfig {
    /// Refuses a damping outside `(0, 1]`.
    pub fn validate(&self) -> Result<()> {
        if !(self.rho > 0.0 && self.rho <= 1.0) {
            return Err(ModelError::Config(format!(
                "E-step rate ρ = {} must be in (0, 1]",
                self.rho
            )));
        }
        Ok(())
    }
}

/// Points from row `from` on are memory points counted as a control variate
/// (see [`ControlVariate`]) with their first sites `first` (rows from `from`).
pub struct Anchored<'a> {
    /// The first memory point's row.
    pub from: usize,
    /// How the memory points stand for past data.
    pub control: ControlVariate,
    /// The memory points' first sites, from row `from` on.
    pub first: &'a PointSites,
}

impl Anchored<'_> {
    /// A memory point's part of the E-step's bound,
    /// `w E_q[log p(y|f)] + (1 − w) E_q[log F(f)]` (up to a constant), with
    /// `F(f) = exp(s1 f − ½ s2 f²)` per latent.
    fn expected(&self, i: usize, value: f64, mean: &[f64], var: &[f64]) -> f64 {
        let w = self.control.weight;
        if self.control.sample {
            return w * value;
        }
        let row = i - self.from;
        let first: f64 = (0..mean.len())
            .map(|c| {
                let (s1, s2) = (self.first.s1[(row, c)], self.first.s2[(row, c)]);
                s1 * mean[c] - 0.5 * s2 * (mean[c] * mean[c] + var[c])
            })
            .sum();
        w * value + (1.0 - w) * first
    }
}

/// How each point's expectation counts in the E-step's bound: times its
/// weight (what forgetting has left of it), and memory points as `anchored` says.
pub struct Counted<'a> {
    /// Each point's weight; None: 1 each.
    pub weights: Option<&'a [f64]>,
    /// Memory points that stand for past data.
    pub anchored: Option<Anchored<'a>>,
}

impl Counted<'_> {
    fn expected(&self, i: usize, value: f64, mean: &[f64], var: &[f64]) -> f64 {
        let value = self.weights.map_or(value, |w| w[i] * value);
        match &self.anchored {
            Some(a) if i >= a.from => a.expected(i, value, mean, var),
            _ => value,
        }
    }
}

/// Damped sites of a set of points: `n × L` each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointSites {
    /// Each point's first natural parameter `λ1` per latent.
    pub s1: DMatrix<f64>,
    /// Each point's site precision per latent.
    pub s2: DMatrix<f64>,
}

impl PointSites {
    /// Sites that contribute nothing.
    pub fn zeros(n: usize, n_latent: usize) -> Self {
        PointSites {
            s1: DMatrix::zeros(n, n_latent),
            s2: DMatrix::zeros(n, n_latent),
        }
    }

    /// The number of points.
    pub fn n(&self) -> usize {
        self.s1.nrows()
    }

    /// The points' contribution `(A s1_c, A diag(s2_c) Aᵀ)` per latent, given
    /// their columns `A` (whitened, as the posterior holds its totals).
    pub fn totals(&self, a: &DMatrix<f64>) -> Vec<Sites> {
        let m = a.nrows();
        (0..self.s1.ncols())
            .map(|c| {
                // A Gaussian likelihood's β̂ is constant: later steps leave Λ alone.
                let lambda = match self.s2.column(c).iter().any(|&v| v != 0.0) {
                    true => weighted_gram(a, self.s2.column(c).as_slice()),
                    false => DMatrix::zeros(m, m),
                };
                Sites {
                    l: a * self.s1.column(c),
                    lambda,
                }
            })
            .collect()
    }

    /// The sites of the points at `rows`.
    pub fn select(&self, rows: &[usize]) -> PointSites {
        PointSites {
            s1: self.s1.select_rows(rows),
            s2: self.s2.select_rows(rows),
        }
    }

    /// Writes `part` (the sites of the points at `rows`) back.
    pub fn scatter(&mut self, rows: &[usize], part: &PointSites) {
        for (k, &i) in rows.iter().enumerate() {
            self.s1.set_row(i, &part.s1.row(k));
            self.s2.set_row(i, &part.s2.row(k));
        }
    }
}

/// Runs `config.steps` damped site updates over the points of `data`.
///
/// The posterior's totals must already hold `sites`' contribution under the
/// current kernel and `Z` (zero sites contribute nothing).
pub fn e_step(
    post: &mut DualPosterior,
    likelihood: &Likelihood,
    data: &Data,
    sites: &mut PointSites,
    config: &EStepConfig,
) -> Result<()> {
    config.validate()?;
    data.check(post.d(), likelihood)?;
    let n_latent = post.n_latent();
    if sites.n() != data.n() || sites.s1.ncols() != n_latent {
        return Err(ModelError::Dimension {
            what: "point sites".into(),
            expected: data.n(),
            got: sites.n(),
        });
    }
    let cross = post.cross(data.x());
    e_step_at(post, likelihood, data, &cross, sites, config, 0.0)
}

/// [`e_step`] with the kernel quantities at `data` already computed (they
/// stay valid while the kernel and `Z` do); the caller has checked `data`.
/// It stops before `config.steps` once a step moved no site by more than
/// `tolerance` relative to its size ([`relative_change`]); 0 takes every step.
///
/// Each step must raise the E-step's objective, the bound
/// `Σ_i E_q[log p(y_i|f_i)] + E_q[log t(u)] − KL[q ‖ p]` with `t` what the rest
/// of the totals say: when a step lowered it, the sites go back to where they
/// were and the damping is halved. Undamped fixed-point steps can cycle: a
/// softmax latent with no data of its class is pushed down by every point
/// (α̂ = −p), whose sites then lose their precision (β̂ ≈ p ≈ 0) and release
/// it; on split Fashion that cycle kept the bound from settling.
pub fn e_step_at(
    post: &mut DualPosterior,
    likelihood: &Likelihood,
    data: &Data,
    cross: &Cross,
    sites: &mut PointSites,
    config: &EStepConfig,
    tolerance: f64,
) -> Result<()> {
    if likelihood.is_conjugate() {
        // One undamped step is exact; no step can overshoot.
        for _ in 0..config.steps {
            let (_, change) = site_update(post, likelihood, data, cross, sites, StepSize::first(config.rho), None);
            for (totals, change) in post.whitened.iter_mut().zip(&change.totals(&cross.a)) {
                totals.add(change, 1.0);
            }
            post.refresh_sites()?;
        }
        return Ok(());
    }
    let others = without(&post.whitened, &sites.totals(&cross.a));
    let mut guard = Backtracking::new(config.rho);
    for _ in 0..config.steps {
        let start = (sites.clone(), post.whitened.clone());
        let (expected, change) = site_update(post, likelihood, data, cross, sites, guard.step(), None);
        let expected = checked_expectation(expected)?;
        let settled = relative_change(&start.0, sites) < tolerance;
        if let Some((back_sites, back_totals)) = guard.check(bound(post, expected, &others), start) {
            *sites = back_sites;
            post.whitened = back_totals;
        } else {
            for (totals, change) in post.whitened.iter_mut().zip(&change.totals(&cross.a)) {
                totals.add(change, 1.0);
            }
            if settled {
                post.refresh_sites()?;
                break;
            }
        }
        post.refresh_sites()?;
    }
    Ok(())
}

/// The expectation a step of a likelihood that is not conjugate comes with
/// (see [`site_update`]), for the bound that checks that step.
pub fn checked_expectation(expected: Option<f64>) -> Result<f64> {
    expected.ok_or_else(|| {
        ModelError::Config("an E-step of a likelihood that is not conjugate came without its expectation".into())
    })
}

/// `max |Δs| / (1 + |s|)` over every point's sites.
pub fn relative_change(before: &PointSites, after: &PointSites) -> f64 {
    let pairs = before
        .s1
        .iter()
        .zip(after.s1.iter())
        .chain(before.s2.iter().zip(after.s2.iter()));
    pairs.map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max)
}

/// `totals − part`, latent by latent: what the rest of the data says.
pub fn without(totals: &[Sites], part: &[Sites]) -> Vec<Sites> {
    let mut rest = totals.to_vec();
    for (rest, part) in rest.iter_mut().zip(part) {
        rest.add(part, -1.0);
    }
    rest
}

/// The E-step's objective at the posterior's state, given the points'
/// `Σ_i E_q[log p(y_i|f_i)]` there and the `others`' sites.
pub fn bound(post: &DualPosterior, expected: f64, others: &[Sites]) -> f64 {
    expected + expected_log_message(post, others) - post.kl()
}

/// Keeps E-steps from lowering their bound: every step starts from a state
/// whose bound is known once the step's expectations are in; a state below
/// the one before it sends the sites back there, and the damping and the
/// trust radius halve. A step kept doubles the radius and raises the damping
/// by half, up to where it started: a site far from its optimum gets there in
/// a number of steps logarithmic in the distance, and one halving early in a
/// run no longer slows all the steps after it.
#[derive(Debug, Clone)]
pub struct Backtracking<S> {
    step: StepSize,
    rho_max: f64,
    /// The bound of the last state kept, and that state.
    kept: Option<(f64, S)>,
}

impl<S> Backtracking<S> {
    /// A search that starts at damping `rho` and never exceeds it.
    pub fn new(rho: f64) -> Self {
        Backtracking {
            step: StepSize::first(rho),
            rho_max: rho,
            kept: None,
        }
    }

    /// The size of the next step.
    pub fn step(&self) -> StepSize {
        self.step
    }

    /// `bound` is that of `start`, the state the step just taken left. `None`:
    /// keep the step (and remember `start`); otherwise the state to return to.
    pub fn check(&mut self, bound: f64, start: S) -> Option<S> {
        if let Some((kept, _)) = &self.kept {
            if bound < kept - BOUND_TOLERANCE * kept.abs().max(1.0) {
                self.step.rho *= 0.5;
                self.step.radius = (0.5 * self.step.radius).max(SITE_STEP_LIMIT);
                // Back there, its step is taken again, shorter, and its bound told again.
                return self.kept.take().map(|(_, state)| state);
            }
            // The step that left `start` raised the bound: the next may be longer.
            self.step.radius = (2.0 * self.step.radius).min(SITE_STEP_LIMIT_MAX);
            self.step.rho = (1.5 * self.step.rho).min(self.rho_max);
        }
        self.kept = Some((bound, start));
        None
    }
}

/// A step lowered the bound only beyond rounding.
const BOUND_TOLERANCE: f64 = 1e-12;

/// One damped update of the sites of `data`'s points (kernel quantities
/// `cross`); returns their `Σ_i E_q[log p(y_i|f_i)]` before it and the
/// changes of the sites (of their contribution to the totals:
/// `change.totals(&cross.a)`). Shares of points update independently; both
/// add up.
///
/// A conjugate likelihood's sites do not depend on the marginal variances
/// (its `α̂`, `β̂` are those of a Gaussian in `μ` alone) and its steps are
/// exact, so no bound checks them: the variances, an `m × m × n` product,
/// are skipped and the expectation is `None`.
pub fn site_update(
    post: &DualPosterior,
    likelihood: &Likelihood,
    data: &Data,
    cross: &Cross,
    sites: &mut PointSites,
    step: StepSize,
    counted: Option<&Counted>,
) -> (Option<f64>, PointSites) {
    let rho = step.rho;
    let n_latent = post.n_latent();
    let conjugate = likelihood.is_conjugate();
    let marginals = match conjugate {
        true => post.marginal_means(cross),
        false => post.marginals(cross),
    };
    let mut change = PointSites::zeros(data.n(), n_latent);
    let mut expected = 0.0;
    let mut e = Expectation::default();
    marginals.for_each_point(|i, mean, var| {
        likelihood.expectation_of(data.output(i), mean, var, data.y()[i], &mut e);
        expected += counted.map_or(e.value, |c| c.expected(i, e.value, mean, var));
        for (c, (&mean_c, &var_c)) in mean.iter().zip(var).enumerate() {
            let (s1_old, s2_old) = (sites.s1[(i, c)], sites.s2[(i, c)]);
            let previous = (s2_old > 0.0).then(|| s1_old / s2_old);
            let beta = site_precision(likelihood, e.beta[c], e.d_mean[c], mean_c, var_c, previous, step.radius);
            let lambda1 = e.d_mean[c] + beta * mean_c;
            let s1 = (1.0 - rho) * s1_old + rho * lambda1;
            let s2 = (1.0 - rho) * s2_old + rho * beta;
            change.s1[(i, c)] = s1 - s1_old;
            change.s2[(i, c)] = s2 - s2_old;
            sites.s1[(i, c)] = s1;
            sites.s2[(i, c)] = s2;
        }
    });
    ((!conjugate).then_some(expected), change)
}
