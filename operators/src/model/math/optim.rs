//! Gradient ascent on hyperparameters: Adam and L-BFGS. Both maximise.

use nalgebra::DVector;
use serde::{Deserialize, Serialize};

use crate::model::error::Result;

/// Adam (Kingma & Ba) with the usual bias correction; its moments persist
/// across calls so that a stream of M-steps behaves as one long run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Adam {
    /// The step size.
    pub lr: f64,
    /// The decay of the first moment.
    pub beta1: f64,
    /// The decay of the second moment.
    pub beta2: f64,
    /// Added to the second moment's root, against division by zero.
    pub eps: f64,
    m: DVector<f64>,
    v: DVector<f64>,
    t: u64,
}

impl Adam {
    /// Adam with step size `lr` and the usual β₁ = 0.9, β₂ = 0.999, ε = 1e-8.
    pub fn new(lr: f64) -> Self {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            m: DVector::zeros(0),
            v: DVector::zeros(0),
            t: 0,
        }
    }

    /// One ascent step along `grad`.
    pub fn step(&mut self, params: &mut DVector<f64>, grad: &DVector<f64>) {
        if self.m.len() != params.len() {
            self.m = DVector::zeros(params.len());
            self.v = DVector::zeros(params.len());
            self.t = 0;
        }
        self.t += 1;
        let c1 = 1.0 - self.beta1.powi(self.t as i32);
        let c2 = 1.0 - self.beta2.powi(self.t as i32);
        for i in 0..params.len() {
            self.m[i] = self.beta1 * self.m[i] + (1.0 - self.beta1) * grad[i];
            self.v[i] = self.beta2 * self.v[i] + (1.0 - self.beta2) * grad[i] * grad[i];
            params[i] += self.lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + self.eps);
        }
    }
}

/// Which optimiser an M-step runs, on log-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    /// Adam, `lr` its step size; a fixed number of steps a call.
    Adam {
        /// The step size.
        lr: f64,
    },
    /// `history` curvature pairs; each call runs to convergence or its iteration budget.
    Lbfgs {
        /// Curvature pairs kept.
        history: usize,
    },
}

/// The largest change of one parameter in one L-BFGS step (log space: ×20).
const MAX_MOVE: f64 = 3.0;

/// The curvature pairs `(s, y, 1/sᵀy)` an L-BFGS search learned. A stream's
/// M-steps climb objectives that change little from one update to the next:
/// started from the last search's pairs, a search takes a quasi-Newton step
/// at once instead of a short steepest-ascent probe.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Curvature {
    pairs: Vec<(DVector<f64>, DVector<f64>, f64)>,
}

impl Curvature {
    /// The same pairs in coordinates `x ∘ factor`: steps scale by the factor,
    /// gradient changes by its inverse (`sᵀy` is unchanged).
    pub fn rescaled(mut self, factor: &DVector<f64>) -> Self {
        for (s, y, _) in &mut self.pairs {
            if s.len() == factor.len() {
                s.component_mul_assign(factor);
                y.component_div_assign(factor);
            }
        }
        self
    }
}

/// Maximises `f` (returning value and gradient) by L-BFGS with a backtracking
/// Armijo line search, for at most `max_iter` iterations; `history` pairs are
/// kept. Stops early when the gradient or the progress vanishes. Returns the
/// best point and its value.
pub fn lbfgs_maximize<F>(mut f: F, x0: DVector<f64>, max_iter: usize, history: usize) -> Result<(DVector<f64>, f64)>
where
    F: FnMut(&DVector<f64>) -> Result<(f64, DVector<f64>)>,
{
    let mut search = Lbfgs::new(x0, max_iter, history);
    while let Some(x) = search.next_point() {
        let outcome = f(&x.clone());
        search.tell(outcome)?;
    }
    Ok(search.best())
}

/// L-BFGS as a state machine, for objectives whose evaluation is asynchronous
/// (a question to every worker): [`next_point`](Self::next_point) says where
/// to evaluate, [`tell`](Self::tell) hands back the value and gradient.
/// Maximises; works on −f inside so that the textbook formulas apply.
#[derive(Debug, Clone)]
pub struct Lbfgs {
    max_iter: usize,
    history: usize,
    iterations: usize,
    /// The first point, until its value is known.
    start: Option<DVector<f64>>,
    /// The accepted point, −f and −∇f there.
    x: DVector<f64>,
    fx: f64,
    gx: DVector<f64>,
    pairs: Vec<(DVector<f64>, DVector<f64>, f64)>,
    /// How many of `pairs` (the oldest) came from another search.
    inherited: usize,
    /// An iteration that gains less than this ends the search.
    tolerance: f64,
    /// The line search under way; `None` once finished.
    trial: Option<Trial>,
}

#[derive(Debug, Clone)]
struct Trial {
    x: DVector<f64>,
    dir: DVector<f64>,
    step: f64,
    /// Directional derivative of −f along `dir` at the accepted point.
    slope: f64,
    halvings: usize,
}

/// Step halvings before a line search gives up.
const MAX_HALVINGS: usize = 30;

impl Lbfgs {
    /// A search from `x0` of at most `max_iter` iterations, keeping `history` pairs (at least one).
    pub fn new(x0: DVector<f64>, max_iter: usize, history: usize) -> Self {
        Lbfgs {
            max_iter,
            history: history.max(1),
            iterations: 0,
            x: x0.clone(),
            start: Some(x0),
            fx: f64::NAN,
            gx: DVector::zeros(0),
            pairs: Vec::new(),
            inherited: 0,
            tolerance: 0.0,
            trial: None,
        }
    }

    /// Ends the search once an iteration gains less than `tolerance` in `f`
    /// (as well as when the progress vanishes relative to `f`).
    pub fn with_tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Starts from `curvature` (pairs of another parameter count are dropped).
    pub fn with_curvature(mut self, curvature: Curvature) -> Self {
        let n = self.x.len();
        self.pairs = curvature.pairs.into_iter().filter(|(s, _, _)| s.len() == n).collect();
        let surplus = self.pairs.len().saturating_sub(self.history);
        self.pairs.drain(..surplus);
        self.inherited = self.pairs.len();
        self
    }

    /// The curvature pairs learned so far (and those it started from).
    pub fn curvature(&self) -> Curvature {
        Curvature {
            pairs: self.pairs.clone(),
        }
    }

    /// Where the objective is wanted next; `None` when the search is over.
    pub fn next_point(&self) -> Option<&DVector<f64>> {
        self.start.as_ref().or(self.trial.as_ref().map(|t| &t.x))
    }

    /// The value and gradient at [`next_point`](Self::next_point). A failed
    /// evaluation at the start is returned; later ones shorten the step.
    pub fn tell(&mut self, outcome: Result<(f64, DVector<f64>)>) -> Result<()> {
        if self.start.take().is_some() {
            let (f, g) = outcome?;
            self.fx = -f;
            self.gx = -g;
            self.plan();
            return Ok(());
        }
        let Some(trial) = self.trial.as_mut() else {
            return Ok(());
        };
        let accepted = match outcome {
            Ok((f, g)) if (-f).is_finite() && -f <= self.fx + 1e-4 * trial.step * trial.slope => Some((-f, -g)),
            _ => None,
        };
        let Some((f_new, g_new)) = accepted else {
            if self.inherited > 0 {
                // The objective has changed more than the inherited curvature
                // knows: plan again from what this search learned alone.
                self.pairs.drain(..self.inherited);
                self.inherited = 0;
                self.trial = None;
                self.plan();
                return Ok(());
            }
            trial.halvings += 1;
            trial.step *= 0.5;
            trial.x = &self.x + trial.step * &trial.dir;
            // A step whose first-order gain is below the tolerance cannot make
            // an iteration worth its evaluation: the search is over.
            if trial.halvings == MAX_HALVINGS || trial.step * -trial.slope < self.tolerance {
                self.trial = None;
            }
            return Ok(());
        };
        let x_new = self.trial.take().expect("a trial under way").x;
        let s = &x_new - &self.x;
        let y = &g_new - &self.gx;
        let sy = s.dot(&y);
        if sy > 1e-12 {
            if self.pairs.len() == self.history {
                self.pairs.remove(0);
                self.inherited = self.inherited.saturating_sub(1);
            }
            self.pairs.push((s, y, 1.0 / sy));
        }
        let progress = self.fx - f_new;
        self.x = x_new;
        self.fx = f_new;
        self.gx = g_new;
        self.iterations += 1;
        if progress.abs() > (1e-10 * self.fx.abs().max(1.0)).max(self.tolerance) {
            self.plan();
        }
        Ok(())
    }

    /// The best point so far and its value (`NaN` before the first evaluation).
    pub fn best(&self) -> (DVector<f64>, f64) {
        (self.x.clone(), -self.fx)
    }

    /// The next line search from the accepted point, unless converged or out of iterations.
    fn plan(&mut self) {
        if self.iterations >= self.max_iter || self.gx.amax() < 1e-9 {
            return;
        }
        let mut dir = -two_loop(&self.gx, &self.pairs);
        if dir.dot(&self.gx) >= 0.0 {
            dir = -self.gx.clone(); // not a descent direction: restart from steepest descent
            self.pairs.clear();
            self.inherited = 0;
        }
        // The first step has no curvature information: keep it short. No step
        // moves a log-parameter by more than MAX_MOVE.
        let step = if self.pairs.is_empty() {
            (1.0 / self.gx.norm()).min(1.0)
        } else {
            1.0
        };
        let step = step.min(MAX_MOVE / dir.amax().max(f64::MIN_POSITIVE));
        self.trial = Some(Trial {
            x: &self.x + step * &dir,
            slope: dir.dot(&self.gx),
            dir,
            step,
            halvings: 0,
        });
    }
}

/// The L-BFGS two-loop recursion: an approximation of `H⁻¹ g`.
fn two_loop(g: &DVector<f64>, pairs: &[(DVector<f64>, DVector<f64>, f64)]) -> DVector<f64> {
    let mut q = g.clone();
    let mut alphas = vec![0.0; pairs.len()];
    for (k, (s, y, rho)) in pairs.iter().enumerate().rev() {
        alphas[k] = rho * s.dot(&q);
        q.axpy(-alphas[k], y, 1.0);
    }
    if let Some((s, y, _)) = pairs.last() {
        q *= s.dot(y) / y.dot(y);
    }
    for (k, (s, y, rho)) in pairs.iter().enumerate() {
        let beta = rho * y.dot(&q);
        q.axpy(alphas[k] - beta, s, 1.0);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A concave quadratic with a known maximiser.
    fn quadratic(x: &DVector<f64>) -> Result<(f64, DVector<f64>)> {
        let target = DVector::from_vec(vec![1.0, -2.0, 0.5]);
        let scales = DVector::from_vec(vec![1.0, 10.0, 100.0]);
        let d = x - &target;
        let value = -0.5 * d.component_mul(&scales).dot(&d);
        Ok((value, -d.component_mul(&scales)))
    }

    #[test]
    fn lbfgs_finds_the_maximum_of_an_ill_conditioned_quadratic() {
        let (x, fx) = lbfgs_maximize(quadratic, DVector::zeros(3), 100, 10).unwrap();
        assert!((&x - DVector::from_vec(vec![1.0, -2.0, 0.5])).amax() < 1e-6, "{x}");
        assert!(fx.abs() < 1e-10);
    }

    #[test]
    fn a_tolerance_ends_the_search_at_the_first_iteration_that_gains_less() {
        let accepted_values = |tolerance: f64| {
            let mut search = Lbfgs::new(DVector::from_element(3, 10.0), 100, 10).with_tolerance(tolerance);
            let mut values: Vec<f64> = Vec::new();
            while let Some(x) = search.next_point() {
                let outcome = quadratic(&x.clone());
                search.tell(outcome).unwrap();
                let value = search.best().1;
                if values.last() != Some(&value) {
                    values.push(value);
                }
            }
            values
        };
        let (loose, tight) = (accepted_values(1.0), accepted_values(0.0));
        let gains: Vec<f64> = loose.windows(2).map(|w| w[1] - w[0]).collect();
        let (last, before) = gains.split_last().unwrap();
        assert!(before.iter().all(|&g| g >= 1.0) && *last < 1.0, "{gains:?}");
        assert!(loose.len() < tight.len(), "{} against {}", loose.len(), tight.len());
    }

    /// Runs `search` on `f` to its end; returns the number of evaluations.
    fn solve(search: &mut Lbfgs, f: impl Fn(&DVector<f64>) -> Result<(f64, DVector<f64>)>) -> usize {
        let mut evaluations = 0;
        while let Some(x) = search.next_point() {
            evaluations += 1;
            let outcome = f(&x.clone());
            search.tell(outcome).unwrap();
        }
        evaluations
    }

    #[test]
    fn a_search_started_from_the_last_ones_curvature_needs_fewer_evaluations() {
        // The quadratic's maximiser moves a little, as an M-step's does from one update to the next.
        let moved = |x: &DVector<f64>| quadratic(&(x - DVector::from_vec(vec![0.1, -0.2, 0.05])));
        let mut first = Lbfgs::new(DVector::zeros(3), 100, 10);
        solve(&mut first, quadratic);
        let start = first.best().0;
        let mut cold = Lbfgs::new(start.clone(), 100, 10);
        let mut warm = Lbfgs::new(start, 100, 10).with_curvature(first.curvature());
        let (cold_evaluations, warm_evaluations) = (solve(&mut cold, moved), solve(&mut warm, moved));
        let target = DVector::from_vec(vec![1.1, -2.2, 0.55]);
        for search in [&cold, &warm] {
            assert!((&search.best().0 - &target).amax() < 1e-6, "{}", search.best().0);
        }
        assert!(
            warm_evaluations < cold_evaluations,
            "warm {warm_evaluations}, cold {cold_evaluations}"
        );
    }

    #[test]
    fn a_line_search_gives_up_once_its_step_can_gain_less_than_the_tolerance() {
        // The gradient promises ascent, but every move lowers the value (an
        // objective whose evaluations are slightly noisy looks like this near its top).
        let spike = |x: &DVector<f64>| Ok((if x[0] == 0.0 { 0.0 } else { -1.0 }, DVector::from_element(1, 1.0)));
        let evaluations = |tolerance: f64| {
            solve(
                &mut Lbfgs::new(DVector::zeros(1), 100, 10).with_tolerance(tolerance),
                spike,
            )
        };
        // Steps 1, 1/2, 1/4 and 1/8 can gain 0.1 or more to first order; 1/16 cannot.
        assert_eq!(evaluations(0.1), 1 + 4);
        assert_eq!(evaluations(0.0), 1 + MAX_HALVINGS);
    }

    #[test]
    fn curvature_of_another_parameter_count_is_dropped() {
        let mut first = Lbfgs::new(DVector::zeros(3), 100, 10);
        solve(&mut first, quadratic);
        assert!(!first.curvature().pairs.is_empty());
        let other = Lbfgs::new(DVector::zeros(2), 100, 10).with_curvature(first.curvature());
        assert!(other.curvature().pairs.is_empty());
    }

    #[test]
    fn lbfgs_maximizes_rosenbrock() {
        let f = |x: &DVector<f64>| -> Result<(f64, DVector<f64>)> {
            let (a, b) = (x[0], x[1]);
            let v = (1.0 - a).powi(2) + 100.0 * (b - a * a).powi(2);
            let g = DVector::from_vec(vec![-2.0 * (1.0 - a) - 400.0 * a * (b - a * a), 200.0 * (b - a * a)]);
            Ok((-v, -g))
        };
        let (x, _) = lbfgs_maximize(f, DVector::from_vec(vec![-1.2, 1.0]), 500, 10).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-4 && (x[1] - 1.0).abs() < 1e-4, "{x}");
    }

    #[test]
    fn adam_climbs_to_the_maximum() {
        let mut adam = Adam::new(0.05);
        let mut x = DVector::zeros(3);
        for _ in 0..5000 {
            let (_, g) = quadratic(&x).unwrap();
            adam.step(&mut x, &g);
        }
        assert!((x - DVector::from_vec(vec![1.0, -2.0, 0.5])).amax() < 1e-3);
    }
}
