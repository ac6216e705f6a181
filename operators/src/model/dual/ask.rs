//! How a trainer talks to the shards that hold its points: the questions
//! every trainer asks the same way (E-steps that never lower their bound,
//! site totals), whether the shards are this process's own or every worker
//! of a dataflow.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use crate::model::dual::estep::{bound, checked_expectation, Backtracking, EStepConfig};
use crate::model::dual::shard::{Answer, Query, Shard};
use crate::model::dual::snapshot::Snapshot;
use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;
use crate::model::posterior::{DualPosterior, Sites};

/// Asks every shard the same question and merges their answers.
pub trait Shards {
    /// Every shard's answer to `query`, merged.
    fn ask(&mut self, query: Query) -> impl Future<Output = Answer>;

    /// [`ask`](Self::ask), doing `work` meanwhile where the shards answer on
    /// other threads (a local shard answers first).
    fn ask_beside<T>(&mut self, query: Query, work: impl FnOnce() -> T) -> impl Future<Output = (Answer, T)> {
        async move {
            let answer = self.ask(query).await;
            (answer, work())
        }
    }
}

/// A process's own shard, which answers at once.
pub struct Local<'a>(pub &'a mut Shard);

impl Shards for Local<'_> {
    fn ask(&mut self, query: Query) -> impl Future<Output = Answer> {
        std::future::ready(self.0.answer(query))
    }
}

/// The outcome of `work` whose questions go to a [`Local`] shard only,
/// which answers at once: it never waits.
pub fn at_once<T>(work: impl Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    match work.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(outcome) => outcome,
        Poll::Pending => unreachable!("a local shard answers at once"),
    }
}

/// Up to `e_step.steps` damped E-steps of the points that answer, each kept
/// only if the step before it raised the bound (see [`Backtracking`]);
/// `others` is the totals' part those points do not hold (only a
/// non-conjugate likelihood's bound uses it).
pub async fn e_steps_beside(
    shards: &mut impl Shards,
    post: &mut DualPosterior,
    likelihood: &Likelihood,
    e_step: EStepConfig,
    others: &[Sites],
) -> Result<()> {
    let checked = !likelihood.is_conjugate();
    let mut guard = Backtracking::new(e_step.rho);
    for _ in 0..e_step.steps {
        let start = post.whitened.clone();
        let query = Query::EStep {
            model: Snapshot::of(post, likelihood),
            step: guard.step(),
        };
        let step = match shards.ask(query).await {
            Answer::Step(s) => s.total(),
            Answer::Nothing => return Ok(()),
            other => return Err(unexpected("an E-step", &other)),
        };
        // Conjugate steps are exact: nothing to check, no bound to compute.
        let back = if checked {
            let value = bound(post, checked_expectation(step.expected)?, others);
            tracing::debug!(
                rho = guard.step().rho,
                radius = guard.step().radius,
                bound = value,
                "e-step"
            );
            guard.check(value, start)
        } else {
            None
        };
        match back {
            Some(back) => {
                shards.ask(Query::Restore).await;
                post.whitened = back;
            }
            None => {
                for (totals, change) in post.whitened.iter_mut().zip(&step.change) {
                    totals.add(change, 1.0);
                }
            }
        }
        post.refresh_sites()?;
    }
    Ok(())
}

/// Summed [`Answer::Totals`] (zero if no shard holds a point).
pub async fn totals(shards: &mut impl Shards, post: &DualPosterior, query: Query) -> Result<Vec<Sites>> {
    totals_in(shards.ask(query).await, post)
}

/// The site totals an answer holds (zero where no shard held points).
pub fn totals_in(answer: Answer, post: &DualPosterior) -> Result<Vec<Sites>> {
    match answer {
        Answer::Totals(t) => Ok(t.total()),
        Answer::KernelTotals(t) => Ok(t.total().into_iter().map(|s| post.whitened_sites(s)).collect()),
        Answer::Nothing => Ok(vec![Sites::zeros(post.m()); post.n_latent()]),
        other => Err(unexpected("site totals", &other)),
    }
}

/// The error for shards that answered another question than the one asked.
pub fn unexpected(wanted: &str, got: &Answer) -> ModelError {
    let kind = format!("{got:?}");
    let kind = kind.split(['(', ' ', '{']).next().unwrap_or("?").to_string();
    ModelError::Config(format!("the shards answered {kind} where {wanted} were asked for"))
}
