//! The partitioned half of an update. A [`Shard`] holds one worker's share of
//! the points an update works on (its records of the batch and the memory
//! points it owns) and answers the learner's [`Query`]s with partial sums that
//! add up across shards ([`Answer::merge`]). The learner itself never touches
//! points: the same update runs on one local shard or on every worker of a
//! dataflow.
//!
//! Points fall into fixed blocks by id and a worker owns whole blocks; sums
//! are made per block and added in one fixed order (see [`BlockSums`]), so
//! an update's arithmetic is the same, bit for bit, on any number of
//! workers: the optimiser's line searches take the same branches, and
//! results agree exactly rather than up to amplified rounding.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::model::data::{span, Data};
use crate::model::dual::blocks::Blocks;
pub use crate::model::dual::blocks::{route, BlockSums, Partition, Summand, BLOCKS};
use crate::model::dual::estep::{site_update, Anchored, Counted, PointSites, StepSize};
use crate::model::dual::forgetting::Evidence;
use crate::model::dual::memory::{bayesian_leverage_scores, reservoir_key, MemoryPoint};
use crate::model::dual::objective::DataTerms;
use crate::model::dual::point::{point_uniform, PointId};
use crate::model::dual::share::{ControlVariate, Drift};
use crate::model::dual::snapshot::Snapshot;
use crate::model::likelihood::{Expectation, Likelihood};
use crate::model::math::kernel::Kernel;
use crate::model::posterior::{Cross, DualPosterior, Sites};

/// What the learner asks of the shards, in the order of Algorithm 1.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Query {
    /// The batch's inputs (only the round that announces a batch answers it).
    Arrivals,
    /// The batch's log predictive density under each of `models`, before
    /// anything is learned from it: the evidence automatic forgetting weighs.
    Evidence {
        /// The models, over the same kernel and `Z`.
        models: Vec<Snapshot>,
    },
    /// Start from zero sites on the batch and the memory points this shard
    /// owns, under `model`; each memory point stands for itself. `pending`
    /// points, learned by earlier updates since the last M-step, join the
    /// batch. Every block answers from here on.
    Begin {
        /// The model to start under.
        model: Snapshot,
        /// The memory points this shard owns.
        memory: Vec<MemoryPoint>,
        /// Points learned since the last M-step.
        pending: Vec<MemoryPoint>,
    },
    /// Only these blocks answer until the next `Focus` or `Begin`.
    Focus {
        /// The blocks that answer.
        blocks: Blocks,
    },
    /// One damped E-step: the points' expected log-likelihood before it, and
    /// the change of their contribution to the totals.
    EStep {
        /// The model the step is taken under.
        model: Snapshot,
        /// Its damping and trust radius.
        step: StepSize,
    },
    /// Undo the last E-step and the one before it: back to the sites the
    /// step before last started from (see [`Backtracking`](crate::model::dual::estep::Backtracking)).
    Restore,
    /// The data terms of the M-step objective, memory terms weighted; `∂F/∂Z`
    /// only `with_z` (an M-step that moves the inducing inputs).
    Gradient {
        /// The model at the M-step's current `θ`.
        model: Snapshot,
        /// The memory terms' weight.
        memory_weight: f64,
        /// Whether to compute `∂F/∂Z`.
        with_z: bool,
    },
    /// The points' contribution to the totals, with the columns their sites
    /// were added with, whitened under `model`.
    Contribution {
        /// The model whose columns whiten the contribution.
        model: Snapshot,
    },
    /// Kernel columns under `model` replace the old ones: the change of the contribution.
    Recolumn {
        /// The model of the new columns.
        model: Snapshot,
    },
    /// Kernel columns under `model` replace the old ones and, with a
    /// conjugate likelihood, the sites become exact under it: the whole
    /// contribution (what [`Recolumn`](Query::Recolumn) then an E-step give,
    /// without whitening the old columns again). A Gaussian likelihood's
    /// comes in `K`'s coordinates ([`Answer::KernelTotals`]): the columns
    /// are whitened only if a later query needs them.
    Refit {
        /// The model of the new columns.
        model: Snapshot,
    },
    /// From now on the memory points stand for past data as `control`
    /// says: the change of the contribution.
    CorrectForPast {
        /// The current model.
        model: Snapshot,
        /// How the memory points stand for past data from now on.
        control: ControlVariate,
    },
    /// What the memory points show of their first sites' bias, per latent
    /// (see [`Drift`]).
    Drift {
        /// The current model.
        model: Snapshot,
    },
    /// Reservoir keys of the batch's records, by BLS or uniform.
    Keys {
        /// The model the leverage scores are under.
        model: Snapshot,
        /// The seed of the reservoir's draws.
        seed: u64,
        /// Keys by Bayesian leverage score, else uniform.
        by_leverage: bool,
    },
    /// With a control variate, the memory points in `leaving` (sorted) are
    /// about to leave keeping their first sites: what they hold in the totals beyond those.
    Leave {
        /// The points about to leave, sorted.
        leaving: Vec<PointId>,
    },
    /// The update is over: the memory this shard owns, with `keep` (sorted)
    /// from the batch added. `model` is the learned model, for scoring what comes next.
    Finish {
        /// The batch's points that join the memory, sorted.
        keep: Vec<PointId>,
        /// The learned model.
        model: Snapshot,
    },
}

/// A shard's answer; answers of the same query merge into the whole.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Answer {
    /// No answer (a block outside the focus, a query without one).
    Nothing,
    /// The batch's records as the learner first sees them.
    Arrivals(Arrivals),
    /// Contributions to the site totals, per latent.
    Totals(BlockSums<Vec<Sites>>),
    /// Contributions to the site totals in `K`'s coordinates, per latent:
    /// whitened once summed ([`DualPosterior::whitened_sites`]).
    KernelTotals(BlockSums<Vec<Sites>>),
    /// An E-step's expectation and change of the totals.
    Step(BlockSums<SiteStep>),
    /// The M-step objective's data terms.
    Terms(BlockSums<DataTerms>),
    /// Reservoir keys of the batch's records.
    Keys(Vec<(PointId, f64)>),
    /// The memory a shard keeps after the update.
    Memory(Vec<MemoryPoint>),
    /// What the memory shows of its first sites' bias, per latent.
    Drift(BlockSums<Vec<Drift>>),
    /// What the batch says of the models asked about.
    Evidence(BlockSums<Evidence>),
}

/// A batch's records as the learner first sees them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Arrivals {
    /// Ids and inputs, in id order.
    pub rows: Vec<(PointId, Vec<f64>)>,
    /// The earliest and the latest of their times, when they carry times
    /// (forgetting's clock).
    pub time_span: Option<(f64, f64)>,
}

impl Arrivals {
    /// Both shares, rows in id order, spans joined.
    fn merge(mut self, other: Arrivals) -> Arrivals {
        self.rows.extend(other.rows);
        self.rows.sort_by_key(|r| r.0);
        let ends = [self.time_span, other.time_span].into_iter().flatten();
        self.time_span = span(ends.flat_map(|(a, b)| [a, b]));
        self
    }
}

impl Answer {
    /// Keeps block sums apart and concatenates lists (in id order, so that
    /// the whole does not depend on how the points were shared out).
    pub fn merge(self, other: Answer) -> Answer {
        match (self, other) {
            (Answer::Nothing, b) => b,
            (a, Answer::Nothing) => a,
            (Answer::Arrivals(a), Answer::Arrivals(b)) => Answer::Arrivals(a.merge(b)),
            (Answer::Totals(a), Answer::Totals(b)) => Answer::Totals(a.merge(b)),
            (Answer::KernelTotals(a), Answer::KernelTotals(b)) => Answer::KernelTotals(a.merge(b)),
            (Answer::Step(a), Answer::Step(b)) => Answer::Step(a.merge(b)),
            (Answer::Terms(a), Answer::Terms(b)) => Answer::Terms(a.merge(b)),
            (Answer::Drift(a), Answer::Drift(b)) => Answer::Drift(a.merge(b)),
            (Answer::Evidence(a), Answer::Evidence(b)) => Answer::Evidence(a.merge(b)),
            (Answer::Keys(mut a), Answer::Keys(b)) => {
                a.extend(b);
                a.sort_by_key(|k| k.0);
                Answer::Keys(a)
            }
            (Answer::Memory(mut a), Answer::Memory(b)) => {
                a.extend(b);
                a.sort_by_key(|p| p.id);
                Answer::Memory(a)
            }
            (a, b) => panic!("answers to different queries cannot merge: {a:?} and {b:?}"),
        }
    }
}

impl Summand for Vec<Sites> {
    fn add(&mut self, other: &Self) {
        for (a, b) in self.iter_mut().zip(other) {
            a.add(b, 1.0);
        }
    }
}

/// One E-step of some points: `Σ_i E_q[log p(y_i|f_i)]` at the sites it
/// started from (`None` for a conjugate likelihood, see
/// [`site_update`]), and the change of their contribution to the totals.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SiteStep {
    /// `Σ_i E_q[log p(y_i|f_i)]` before the step (`None`: conjugate).
    pub expected: Option<f64>,
    /// The change of the points' contribution, per latent.
    pub change: Vec<Sites>,
}

impl Summand for SiteStep {
    fn add(&mut self, other: &Self) {
        self.expected = self.expected.zip(other.expected).map(|(a, b)| a + b);
        self.change.add(&other.change);
    }
}

impl Summand for Evidence {
    fn add(&mut self, other: &Self) {
        Evidence::add(self, other);
    }
}

impl Summand for Vec<Drift> {
    fn add(&mut self, other: &Self) {
        for (a, b) in self.iter_mut().zip(other) {
            a.add(b);
        }
    }
}

impl Summand for DataTerms {
    fn add(&mut self, other: &Self) {
        DataTerms::add(self, other);
    }
}

/// One worker's points for the current update, in blocks.
#[derive(Debug, Clone)]
pub struct Shard {
    partition: Partition,
    blocks: BTreeMap<u64, Block>,
    focus: Blocks,
    /// Threads that answer the blocks together (1: the caller's alone).
    threads: usize,
}

impl Shard {
    /// A shard of `batch` with its records' `ids` (any order).
    pub fn new(partition: Partition, batch: u64, ids: &[i64], data: Data) -> Self {
        let ids: Vec<PointId> = ids.iter().map(|&id| PointId { batch, id }).collect();
        Shard::of_points(partition, &ids, data)
    }

    /// A shard of records that may come from several batches learned in one
    /// update (each keeps its own batch in its id).
    pub fn of_points(partition: Partition, ids: &[PointId], data: Data) -> Self {
        let mut rows: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, p) in ids.iter().enumerate() {
            rows.entry(route(p.id)).or_default().push(i);
        }
        let blocks = rows
            .into_iter()
            .map(|(block, rows)| {
                let ids: Vec<PointId> = rows.iter().map(|&i| ids[i]).collect();
                (block, Block::new(block, &ids, Some(data.select(&rows))))
            })
            .collect();
        Shard {
            partition,
            blocks,
            focus: Blocks::ALL,
            threads: 1,
        }
    }

    /// Answers on `threads` threads, each taking a run of blocks. The answer
    /// keeps block sums apart, so it is the same, bit for bit, for any count.
    pub fn answered_on(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// This shard's answer to `query`, its state moved on.
    pub fn answer(&mut self, mut query: Query) -> Answer {
        // A snapshot that came through serialisation lacks its cached factors.
        let factorised = |model: &mut Snapshot| {
            model
                .ensure_factors()
                .expect("the learner factorised this posterior before sending it")
        };
        match &mut query {
            Query::Evidence { models } => models.iter_mut().for_each(factorised),
            query => query.model_mut().into_iter().for_each(factorised),
        }
        match &mut query {
            Query::Begin { memory, pending, .. } => {
                self.focus = Blocks::ALL;
                self.share_out(std::mem::take(memory), std::mem::take(pending));
            }
            Query::Focus { blocks } => {
                self.focus = *blocks;
                return Answer::Nothing;
            }
            _ => {}
        }
        let focus = self.focus;
        let mut blocks: Vec<&mut Block> = self
            .blocks
            .iter_mut()
            .filter(|(&block, _)| focus.contains(block))
            .map(|(_, b)| b)
            .collect();
        let answer_run = |run: &mut [&mut Block]| {
            run.iter_mut()
                .map(|b| b.answer(&query))
                .fold(Answer::Nothing, Answer::merge)
        };
        if self.threads == 1 || blocks.len() < 2 {
            return answer_run(&mut blocks);
        }
        let per_thread = blocks.len().div_ceil(self.threads);
        let (first, rest) = blocks.split_at_mut(per_thread);
        std::thread::scope(|scope| {
            let others: Vec<_> = rest
                .chunks_mut(per_thread)
                .map(|run| scope.spawn(|| answer_run(run)))
                .collect();
            others.into_iter().fold(answer_run(first), |answer, other| {
                // A panic in a block is the caller's, as on one thread.
                let other = other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                answer.merge(other)
            })
        })
    }

    /// Gives each block the memory points it owns (a block may hold only
    /// memory), and the pending points it owns as batch rows.
    fn share_out(&mut self, memory: Vec<MemoryPoint>, pending: Vec<MemoryPoint>) {
        for block in self.blocks.values_mut() {
            block.memory.clear();
        }
        let partition = self.partition;
        let mut joining: BTreeMap<u64, Vec<MemoryPoint>> = BTreeMap::new();
        for p in pending.into_iter().filter(|p| partition.owns(p.id.id)) {
            joining.entry(route(p.id.id)).or_default().push(p);
        }
        for (block, points) in joining {
            self.block(block).join_batch(points);
        }
        for p in memory.into_iter().filter(|p| partition.owns(p.id.id)) {
            self.block(route(p.id.id)).memory.push(p);
        }
    }

    fn block(&mut self, block: u64) -> &mut Block {
        self.blocks.entry(block).or_insert_with(|| Block::new(block, &[], None))
    }
}

/// The model a query carries, borrowed as the query is.
macro_rules! model_of {
    ($query:expr) => {
        match $query {
            Query::Begin { model, .. }
            | Query::EStep { model, .. }
            | Query::Gradient { model, .. }
            | Query::Contribution { model }
            | Query::Recolumn { model }
            | Query::Refit { model }
            | Query::CorrectForPast { model, .. }
            | Query::Drift { model }
            | Query::Keys { model, .. }
            | Query::Finish { model, .. } => Some(model),
            Query::Arrivals | Query::Evidence { .. } | Query::Focus { .. } | Query::Restore | Query::Leave { .. } => {
                None
            }
        }
    };
}

impl Query {
    fn model(&self) -> Option<&Snapshot> {
        model_of!(self)
    }

    fn model_mut(&mut self) -> Option<&mut Snapshot> {
        model_of!(self)
    }
}

/// The points of one block: its records of the batch, the memory points it
/// owns, and their working state.
#[derive(Debug, Clone)]
struct Block {
    block: u64,
    /// The block's records of the batch, in id order.
    batch_ids: Vec<PointId>,
    batch: Option<Data>,
    /// What forgetting has left of each batch record's weight: 1 but for
    /// held records that join the batch again.
    batch_weights: Vec<f64>,
    /// Its memory points; their columns and sites are brought up to date
    /// when the update finishes.
    memory: Vec<MemoryPoint>,
    /// How the memory stands for past data, once [`Query::CorrectForPast`] said.
    control: Option<ControlVariate>,
    /// The memory points' first sites.
    first: PointSites,
    /// Batch records then memory points.
    points: Option<Data>,
    /// The kernel columns the sites were added to the totals with.
    columns: Option<Columns>,
    /// The last [`Query::Refit`]'s sums, while its columns and sites hold.
    refit_totals: Option<Vec<Sites>>,
    sites: PointSites,
    /// The sites the last E-step and the one before it started from.
    step_starts: [PointSites; 2],
    keys: Vec<f64>,
}

/// Kernel columns of some points and what they depend on (kernel, `Z`,
/// jitter): the same dependencies, the same columns. They keep the kernel's
/// profile, which an M-step's gradient under the same `θ` starts from.
#[derive(Debug, Clone)]
struct Columns {
    cross: Cross,
    kernel: Kernel,
    z: DMatrix<f64>,
    jitter: f64,
}

impl Columns {
    fn under(post: &DualPosterior, x: &DMatrix<f64>) -> Self {
        Columns::of(post, post.cross_with_profile(x))
    }

    /// [`under`](Self::under), whitened later by [`whiten`](Self::whiten).
    fn unwhitened(post: &DualPosterior, x: &DMatrix<f64>) -> Self {
        Columns::of(post, post.unwhitened_cross(x))
    }

    fn of(post: &DualPosterior, cross: Cross) -> Self {
        Columns {
            cross,
            kernel: post.kernel.clone(),
            z: post.z.clone(),
            jitter: post.jitter,
        }
    }

    /// Makes the whitened columns, where `post` (whose `K` they are under) has not yet.
    fn whiten(&mut self, post: &DualPosterior, x: &DMatrix<f64>) {
        debug_assert!(self.are_under(post), "whitened by another K");
        post.whiten_cross(&mut self.cross, x);
    }

    fn are_under(&self, post: &DualPosterior) -> bool {
        self.kernel == post.kernel && self.z == post.z && self.jitter == post.jitter
    }

    /// The columns whitened by `post`'s `K`, which may have moved since.
    fn whitened(&self, post: &DualPosterior) -> Cow<'_, DMatrix<f64>> {
        if self.are_under(post) {
            Cow::Borrowed(&self.cross.a)
        } else {
            Cow::Owned(post.whiten(&self.cross.kzx))
        }
    }
}

impl Block {
    fn new(block: u64, ids: &[PointId], data: Option<Data>) -> Self {
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i]);
        let batch_ids = order.iter().map(|&i| ids[i]).collect();
        Block {
            block,
            batch_ids,
            batch: data.filter(|d| d.n() > 0).map(|d| d.select(&order)),
            batch_weights: vec![1.0; ids.len()],
            memory: Vec::new(),
            control: None,
            first: PointSites::zeros(0, 0),
            points: None,
            columns: None,
            refit_totals: None,
            sites: PointSites::zeros(0, 0),
            step_starts: [PointSites::zeros(0, 0), PointSites::zeros(0, 0)],
            keys: Vec::new(),
        }
    }

    fn n_batch(&self) -> usize {
        self.batch_ids.len()
    }

    /// Points learned by earlier updates become batch rows again (in id order with the others).
    fn join_batch(&mut self, points: Vec<MemoryPoint>) {
        let n_old = self.n_batch();
        let mut ids = self.batch_ids.clone();
        ids.extend(points.iter().map(|p| p.id));
        let d = points[0].x.len();
        let old = self.batch.take();
        let from_old = |i: usize| old.as_ref().filter(|_| i < n_old);
        let x = DMatrix::from_fn(ids.len(), d, |i, j| match from_old(i) {
            Some(b) => b.x()[(i, j)],
            None => points[i - n_old].x[j],
        });
        let y = DVector::from_fn(ids.len(), |i, _| match from_old(i) {
            Some(b) => b.y()[i],
            None => points[i - n_old].y,
        });
        let outputs = (0..ids.len())
            .map(|i| match from_old(i) {
                Some(b) => b.output(i),
                None => points[i - n_old].output,
            })
            .collect();
        let data = Data::with_outputs(x, y, outputs).expect("pending points were validated when they arrived");
        let old_weights: HashMap<PointId, f64> =
            (self.batch_ids.iter().copied().zip(self.batch_weights.iter().copied()))
                .chain(points.iter().map(|p| (p.id, p.weight)))
                .collect();
        let memory = std::mem::take(&mut self.memory);
        *self = Block::new(self.block, &ids, Some(data));
        self.batch_weights = self.batch_ids.iter().map(|id| old_weights[id]).collect();
        self.memory = memory;
    }

    /// Each point's weight (batch records, then memory points), None when
    /// every one is 1 (no forgetting).
    fn weights(&self) -> Option<Vec<f64>> {
        let weights = self
            .batch_weights
            .iter()
            .copied()
            .chain(self.memory.iter().map(|p| p.weight));
        // Asked at every E-step and gradient: without forgetting, no list is made.
        weights.clone().any(|w| w != 1.0).then(|| weights.collect())
    }

    /// The shard made `query`'s model ready; `Begin`'s memory is already shared out.
    fn answer(&mut self, query: &Query) -> Answer {
        // Only a gradient right after a refit, before anything else moves, reuses its sums.
        let refit_totals = self.refit_totals.take();
        if let (Some(model), Some(points), Some(columns)) = (query.model(), &self.points, &mut self.columns) {
            // Columns a Gaussian refit left unwhitened, for what needs them.
            if !matches!(query, Query::Gradient { .. } | Query::Refit { .. }) && columns.are_under(&model.posterior) {
                columns.whiten(&model.posterior, points.x());
            }
        }
        let totals = |sums: Vec<Sites>| Answer::Totals(BlockSums::one(self.block, sums));
        let held = matches!(query, Query::Recolumn { .. }).then(|| self.contribution().into_owned());
        match query {
            Query::Arrivals => self.arrivals(),
            Query::Evidence { models } => self.evidence(models),
            Query::Focus { .. } => Answer::Nothing,
            Query::Begin { model, .. } => self.begin(model),
            Query::EStep { model, step } => match (&self.points, &self.columns) {
                (Some(points), Some(columns)) => {
                    debug_assert!(columns.are_under(&model.posterior), "E-steps follow Begin or Recolumn");
                    let [before_last, last] = &mut self.step_starts;
                    std::mem::swap(before_last, last);
                    last.clone_from(&self.sites);
                    // Only a memory that stands for past data, or points forgetting
                    // has discounted, hold other sites than their own.
                    let weights = self.weights();
                    let counted = (self.control.is_some() || weights.is_some()).then(|| Counted {
                        weights: weights.as_deref(),
                        anchored: self.control.map(|control| Anchored {
                            from: self.batch_ids.len(),
                            control,
                            first: &self.first,
                        }),
                    });
                    let before = counted.as_ref().map(|_| self.contribution().into_owned());
                    let (expected, mut change) = site_update(
                        &model.posterior,
                        &model.likelihood,
                        points,
                        &columns.cross,
                        &mut self.sites,
                        *step,
                        counted.as_ref(),
                    );
                    if let Some(before) = before {
                        change = self.contribution().into_owned();
                        change.s1 -= &before.s1;
                        change.s2 -= &before.s2;
                    }
                    let change = change.totals(&columns.cross.a);
                    Answer::Step(BlockSums::one(self.block, SiteStep { expected, change }))
                }
                _ => Answer::Nothing,
            },
            Query::Restore => {
                let [before_last, last] = &mut self.step_starts;
                self.sites.clone_from(before_last);
                last.clone_from(before_last);
                Answer::Nothing
            }
            Query::Gradient {
                model,
                memory_weight,
                with_z,
            } => self.gradient(model, *memory_weight, *with_z, refit_totals),
            Query::Contribution { model } => match &self.columns {
                Some(columns) => totals(self.contribution().totals(&columns.whitened(&model.posterior))),
                None => Answer::Nothing,
            },
            Query::Recolumn { model } => match (&self.points, &mut self.columns) {
                (Some(points), Some(columns)) => {
                    let new = Columns::under(&model.posterior, points.x());
                    let sites = held.expect("computed for Recolumn");
                    let mut change = sites.totals(&new.cross.a);
                    for (c, old) in change.iter_mut().zip(sites.totals(&columns.whitened(&model.posterior))) {
                        c.add(&old, -1.0);
                    }
                    *columns = new;
                    totals(change)
                }
                _ => Answer::Nothing,
            },
            Query::Refit { model } => self.refit(model),
            Query::Keys {
                model,
                seed,
                by_leverage,
            } => self.keys(model, *seed, *by_leverage),
            Query::CorrectForPast { model, control } => self.correct_for_past(model, *control),
            Query::Drift { model } => self.drift(model),
            Query::Leave { leaving } => self.leave(leaving),
            Query::Finish { keep, .. } => self.finish(keep),
        }
    }

    fn arrivals(&self) -> Answer {
        match &self.batch {
            Some(batch) => Answer::Arrivals(Arrivals {
                rows: self
                    .batch_ids
                    .iter()
                    .zip(batch.x().row_iter())
                    .map(|(&id, x)| (id, x.iter().copied().collect()))
                    .collect(),
                time_span: batch.time_span(),
            }),
            None => Answer::Nothing,
        }
    }

    /// Each batch record's log predictive density under each model (the
    /// same kernel and `Z`), against the first model's.
    fn evidence(&self, models: &[Snapshot]) -> Answer {
        let (Some(batch), Some(first)) = (&self.batch, models.first()) else {
            return Answer::Nothing;
        };
        let cross = first.posterior.cross(batch.x());
        // A record's densities under every model: one column, contiguous.
        let mut log_densities = DMatrix::zeros(models.len(), batch.n());
        for (k, model) in models.iter().enumerate() {
            model.posterior.marginals(&cross).for_each_point(|i, mean, var| {
                log_densities[(k, i)] = model
                    .likelihood
                    .log_predictive_of(batch.output(i), mean, var, batch.y()[i]);
            });
        }
        let mut evidence = Evidence::default();
        for record in log_densities.column_iter() {
            evidence.add_record(record.as_slice());
        }
        Answer::Evidence(BlockSums::one(self.block, evidence))
    }

    /// The sites the block's points hold in the totals: their own times
    /// their weight, but memory points that stand for past data.
    fn contribution(&self) -> Cow<'_, PointSites> {
        let weights = self.weights();
        match (self.control, &weights) {
            (None, None) => Cow::Borrowed(&self.sites),
            (control, weights) => Cow::Owned(contribution(
                &self.sites,
                weights.as_deref(),
                self.n_batch(),
                control,
                &self.first,
            )),
        }
    }

    fn refit(&mut self, model: &Snapshot) -> Answer {
        let Some(points) = &self.points else {
            return Answer::Nothing;
        };
        for (i, &y) in points.y().iter().enumerate() {
            if let Some((s1, s2)) = model.likelihood.exact_site(points.output(i), y) {
                self.sites.s1[(i, 0)] = s1;
                self.sites.s2[(i, 0)] = s2;
            }
        }
        let post = &model.posterior;
        if !matches!(model.likelihood, Likelihood::Gaussian { .. }) {
            let columns = Columns::under(post, points.x());
            let sums = self.contribution().totals(&columns.cross.a);
            self.columns = Some(columns);
            return Answer::Totals(BlockSums::one(self.block, sums));
        }
        // Summed in K's coordinates: the learner whitens the total, and the
        // gradient that follows needs no whitened columns.
        let columns = Columns::unwhitened(post, points.x());
        let sums = self.contribution().totals(&columns.cross.kzx);
        self.columns = Some(columns);
        self.refit_totals = Some(sums.clone());
        Answer::KernelTotals(BlockSums::one(self.block, sums))
    }

    /// The data terms of the M-step objective under `model`, memory terms
    /// weighted `memory_weight`. Right after a Gaussian refit under the same
    /// `θ`, its sums (`refit_totals`) are the terms' site gram.
    fn gradient(
        &mut self,
        model: &Snapshot,
        memory_weight: f64,
        with_z: bool,
        refit_totals: Option<Vec<Sites>>,
    ) -> Answer {
        let Some(points) = &self.points else {
            return Answer::Nothing;
        };
        let post = &model.posterior;
        let n_batch = self.n_batch();
        let forgotten = self.weights();
        let weights: Vec<f64> = (0..points.n())
            .map(|i| {
                let left = forgotten.as_ref().map_or(1.0, |w| w[i]);
                if i < n_batch {
                    left
                } else {
                    left * memory_weight
                }
            })
            .collect();
        // A re-learning M-step has just recolumned under this θ: reuse the
        // columns (and the refit's sums); other ones are not those the sites
        // were added with.
        let under = self.columns.as_ref().is_some_and(|c| c.are_under(post));
        let site_gram = match (&model.likelihood, refit_totals.filter(|_| under)) {
            (Likelihood::Gaussian { variance }, Some(mut sums)) => {
                let s2 = &self.contribution().s2;
                let exact = (0..points.n()).all(|i| s2[(i, 0)] == weights[i] * (1.0 / variance));
                exact.then(|| sums.swap_remove(0).lambda)
            }
            _ => None,
        };
        let mut fresh;
        let columns = match &mut self.columns {
            Some(columns) if under => columns,
            _ => {
                fresh = Columns::under(post, points.x());
                &mut fresh
            }
        };
        if site_gram.is_none() {
            columns.whiten(post, points.x());
        }
        let terms = DataTerms::new(
            post,
            &model.likelihood,
            points,
            &columns.cross,
            Some(&weights),
            with_z,
            site_gram.as_ref(),
        );
        Answer::Terms(BlockSums::one(self.block, terms))
    }

    fn correct_for_past(&mut self, model: &Snapshot, control: ControlVariate) -> Answer {
        let Some(columns) = &self.columns else {
            return Answer::Nothing;
        };
        debug_assert!(columns.are_under(&model.posterior), "the correction follows an E-step");
        let before = self.contribution().into_owned();
        self.control = Some(control);
        let mut change = before;
        let held = self.contribution();
        change.s1 = &held.s1 - &change.s1;
        change.s2 = &held.s2 - &change.s2;
        Answer::Totals(BlockSums::one(self.block, change.totals(&columns.cross.a)))
    }

    /// Each memory point's pull on `u` against the pull its first sites
    /// would exert at the current posterior.
    fn drift(&self, model: &Snapshot) -> Answer {
        let (Some(points), Some(columns)) = (&self.points, &self.columns) else {
            return Answer::Nothing;
        };
        debug_assert!(columns.are_under(&model.posterior), "the drift follows an E-step");
        let post = &model.posterior;
        let n_batch = self.n_batch();
        let weights = self.weights();
        let mut drift = vec![Drift::zeros(post.m()); post.n_latent()];
        let memory = (n_batch..points.n()).collect::<Vec<_>>();
        let cross = columns.cross.select(&memory);
        let mut e = Expectation::default();
        post.marginals(&cross).for_each_point(|k, mean, var| {
            let i = n_batch + k;
            model
                .likelihood
                .expectation_of(points.output(i), mean, var, points.y()[i], &mut e);
            let a = cross.a.column(k).into_owned();
            for (c, d) in drift.iter_mut().enumerate() {
                // First sites are held at the point's weight: so is its pull.
                let pull = e.d_mean[c] * weights.as_ref().map_or(1.0, |w| w[i]);
                let first_pull = self.first.s1[(k, c)] - self.first.s2[(k, c)] * mean[c];
                d.add_point(&a, pull, first_pull);
            }
        });
        Answer::Drift(BlockSums::one(self.block, drift))
    }

    fn leave(&self, leaving: &[PointId]) -> Answer {
        let (Some(columns), Some(_)) = (&self.columns, self.control) else {
            return Answer::Nothing;
        };
        let rows: Vec<usize> = (0..self.memory.len())
            .filter(|&k| leaving.binary_search(&self.memory[k].id).is_ok())
            .collect();
        if rows.is_empty() {
            return Answer::Nothing;
        }
        let held = self.contribution();
        let points: Vec<usize> = rows.iter().map(|k| self.n_batch() + k).collect();
        let mut beyond = held.select(&points);
        beyond.s1 -= self.first.s1.select_rows(&rows);
        beyond.s2 -= self.first.s2.select_rows(&rows);
        let a = columns.cross.a.select_columns(&points);
        Answer::Totals(BlockSums::one(self.block, beyond.totals(&a)))
    }

    fn begin(&mut self, model: &Snapshot) -> Answer {
        let d = model.posterior.d();
        let n = self.n_batch() + self.memory.len();
        self.points = (n > 0).then(|| {
            let mut x = DMatrix::zeros(n, d);
            let mut y = DVector::zeros(n);
            let mut outputs = vec![0; n];
            if let Some(batch) = &self.batch {
                x.rows_mut(0, batch.n()).copy_from(batch.x());
                y.rows_mut(0, batch.n()).copy_from(batch.y());
                for (i, o) in outputs.iter_mut().take(batch.n()).enumerate() {
                    *o = batch.output(i);
                }
            }
            for (k, p) in self.memory.iter().enumerate() {
                let i = self.n_batch() + k;
                x.row_mut(i).copy_from_slice(&p.x);
                y[i] = p.y;
                outputs[i] = p.output;
            }
            Data::with_outputs(x, y, outputs).expect("records and memory points were validated")
        });
        self.columns = self.points.as_ref().map(|p| Columns::under(&model.posterior, p.x()));
        let n_latent = model.posterior.n_latent();
        self.sites = PointSites::zeros(n, n_latent);
        self.control = None;
        self.first = PointSites::zeros(self.memory.len(), n_latent);
        for (k, p) in self.memory.iter().enumerate() {
            let first = p.first.as_ref().map_or((&p.s1, &p.s2), |f| (&f.s1, &f.s2));
            for c in 0..n_latent {
                self.first.s1[(k, c)] = first.0[c];
                self.first.s2[(k, c)] = first.1[c];
            }
        }
        Answer::Nothing
    }

    fn keys(&mut self, model: &Snapshot, seed: u64, by_leverage: bool) -> Answer {
        let Some(batch) = &self.batch else {
            return Answer::Nothing;
        };
        let weights = if by_leverage {
            bayesian_leverage_scores(&model.posterior, &model.likelihood, batch)
        } else {
            vec![1.0; batch.n()]
        };
        self.keys = self
            .batch_ids
            .iter()
            .zip(&weights)
            .map(|(&id, &w)| reservoir_key(w, point_uniform(seed, id)))
            .collect();
        Answer::Keys(self.batch_ids.iter().copied().zip(self.keys.iter().copied()).collect())
    }

    /// The memory points with the columns and sites they now hold in the
    /// totals, and the batch records chosen to join them.
    fn finish(&mut self, keep: &[PointId]) -> Answer {
        let n_batch = self.n_batch();
        let Some(Columns { cross, .. }) = &self.columns else {
            return Answer::Memory(std::mem::take(&mut self.memory));
        };
        let row = |m: &DMatrix<f64>, i: usize| m.row(i).iter().copied().collect::<Vec<f64>>();
        let held = self.contribution().into_owned();
        for (k, p) in self.memory.iter_mut().enumerate() {
            let i = n_batch + k;
            p.column = cross.kzx.column(i).into_owned();
            p.s1 = row(&held.s1, i);
            p.s2 = row(&held.s2, i);
        }
        let mut memory = std::mem::take(&mut self.memory);
        if let Some(batch) = &self.batch {
            for (i, id) in self.batch_ids.iter().enumerate() {
                if keep.binary_search(id).is_ok() {
                    memory.push(MemoryPoint {
                        id: *id,
                        x: row(batch.x(), i),
                        y: batch.y()[i],
                        output: batch.output(i),
                        column: cross.kzx.column(i).into_owned(),
                        s1: row(&held.s1, i),
                        s2: row(&held.s2, i),
                        key: self.keys.get(i).copied().unwrap_or(f64::MIN),
                        first: None,
                        weight: self.batch_weights[i],
                    });
                }
            }
        }
        memory.sort_by_key(|p| p.id);
        Answer::Memory(memory)
    }
}

/// `sites` as the totals hold them: each row times its weight (`None`: 1
/// each), and the memory's rows (from `n_batch` on) as `control` says (see
/// [`ControlVariate::site`]; first sites are held at their point's weight).
fn contribution(
    sites: &PointSites,
    weights: Option<&[f64]>,
    n_batch: usize,
    control: Option<ControlVariate>,
    first: &PointSites,
) -> PointSites {
    let mut held = sites.clone();
    for (i, &w) in weights.unwrap_or(&[]).iter().enumerate() {
        held.s1.row_mut(i).scale_mut(w);
        held.s2.row_mut(i).scale_mut(w);
    }
    let Some(control) = control else { return held };
    for k in 0..first.n() {
        for c in 0..sites.s1.ncols() {
            let i = n_batch + k;
            let own = (held.s1[(i, c)], held.s2[(i, c)]);
            (held.s1[(i, c)], held.s2[(i, c)]) = control.site((first.s1[(k, c)], first.s2[(k, c)]), own);
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::dual::objective::Objective;
    use crate::model::math::kernel::Family;
    use crate::model::posterior::DualPosterior;

    /// A Gaussian gradient right after a refit takes the refit's sums (in
    /// `K`'s coordinates) as its gram: the terms of one made afresh from
    /// whitened columns, up to rounding, also for memory points that stand
    /// for part of the past.
    #[test]
    fn a_gradient_after_a_refit_agrees_with_one_made_from_whitened_columns() {
        let x = DMatrix::from_fn(60, 2, |i, j| ((3 * i + 7 * j) % 11) as f64 / 3.0 - 1.5);
        let y = DVector::from_fn(60, |i, _| (i as f64 * 0.37).sin());
        let data = Data::new(x.clone(), y).unwrap();
        let kernel = Kernel::stationary(Family::Matern52, 1.2, vec![0.7, 1.3]);
        let post = DualPosterior::new(kernel, x.rows(0, 8).into_owned(), 1).unwrap();
        let model = Snapshot::of(&post, &Likelihood::Gaussian { variance: 0.3 });
        let memory: Vec<MemoryPoint> = (0..12)
            .map(|k| MemoryPoint {
                id: PointId { batch: 0, id: 100 + k },
                x: vec![k as f64 / 6.0 - 1.0, 0.5],
                y: 0.2,
                output: 0,
                column: DVector::zeros(8),
                s1: vec![0.0],
                s2: vec![0.0],
                key: 0.0,
                first: None,
                weight: 1.0,
            })
            .collect();
        let ids: Vec<i64> = (0..60).collect();
        let terms = |fresh: bool| {
            let mut shard = Shard::new(Partition::WHOLE, 1, &ids, data.clone());
            let begin = Query::Begin {
                model: model.clone(),
                memory: memory.clone(),
                pending: Vec::new(),
            };
            shard.answer(begin);
            let control = ControlVariate {
                weight: 3.7,
                sample: true,
            };
            shard.answer(Query::CorrectForPast {
                model: model.clone(),
                control,
            });
            shard.answer(Query::Refit { model: model.clone() });
            if fresh {
                shard.answer(Query::Contribution { model: model.clone() });
            }
            let gradient = Query::Gradient {
                model: model.clone(),
                memory_weight: 3.7,
                with_z: true,
            };
            match shard.answer(gradient) {
                Answer::Terms(terms) => terms.total(),
                other => panic!("{other:?}"),
            }
        };
        let (after_refit, afresh) = (terms(false), terms(true));
        assert!(after_refit.kernel_gram_d_var.is_some() && afresh.kernel_gram_d_var.is_none());
        let post = &model.posterior;
        let (a, b) = (
            after_refit.finish(post, &model.likelihood, None),
            afresh.finish(post, &model.likelihood, None),
        );
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * (1.0 + y.abs());
        assert!(close(a.value, b.value), "{} against {}", a.value, b.value);
        let grads = |o: &Objective| {
            o.grad
                .iter()
                .chain(o.grad_z.as_ref().unwrap().iter())
                .copied()
                .collect::<Vec<f64>>()
        };
        for (x, y) in grads(&a).into_iter().zip(grads(&b)) {
            assert!(close(x, y), "{x} against {y}");
        }
    }
}
