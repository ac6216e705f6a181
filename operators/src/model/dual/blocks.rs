//! The fixed blocks points are summed in: which block a point falls in,
//! which worker owns a block, sums kept per block and added in one fixed
//! order, and sets of blocks (the M-step's sample).
//!
//! A block holds the points whose ids hash to it ([`route`]), so a random set
//! of blocks is a random sample of points, and it is the same on any number
//! of workers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::dual::point::splitmix64;

/// How many blocks the points are summed in. Up to this many workers share
/// the work; more would idle. Few enough that a block's `m × m × n` products
/// have a long inner dimension (at 32, an update of 1000 records and 1000
/// memory points gave them ~60 columns, and each block's `m × m`
/// temporaries and sums cost about a fifth of an update). 8 was faster
/// still on 2 workers, but left the M-step's sample of a 150-point batch
/// (`m_sample`, whole blocks) too coarse for the sampled-bound test.
pub const BLOCKS: u64 = 16;

/// The block of a record id. Records and the memory points they become
/// stay on the block's worker ([`Partition::owner`]).
pub fn route(id: i64) -> u64 {
    splitmix64(id as u64) % BLOCKS
}

/// Which share of the memory a shard works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// This shard's place among the peers.
    pub index: usize,
    /// How many shards share the memory.
    pub peers: usize,
}

impl Partition {
    /// Everything: the model-only learner's single shard.
    pub const WHOLE: Partition = Partition { index: 0, peers: 1 };

    /// Whether the record with `id` is this shard's.
    pub fn owns(&self, id: i64) -> bool {
        Partition::owner(route(id), self.peers) == self.index
    }

    /// The worker of `peers` that owns `block`: each a run of neighbouring
    /// blocks, so that it can add their sums itself (see [`BlockSums`]).
    pub fn owner(block: u64, peers: usize) -> usize {
        block as usize * peers / BLOCKS as usize
    }
}

/// A partial sum that adds another of its kind.
pub trait Summand {
    /// Adds `other` to this sum.
    fn add(&mut self, other: &Self);
}

/// Partial sums over runs of blocks, kept apart until [`total`](Self::total)
/// adds them along one fixed binary tree over all [`BLOCKS`] (an absent
/// block adds nothing). Two sums of sibling subtrees are added as soon as
/// both are at hand, by whoever holds them: a worker sends one sum for its
/// run of blocks where the run is a subtree, and the additions, so the
/// bits, are those of the whole tree whatever the number of workers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlockSums<T>(Vec<(Span, T)>);

/// Blocks `first..first + len`, `len` a power of two that divides `first`:
/// a subtree of the tree over all blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Span {
    first: u64,
    len: u64,
}

impl Span {
    fn halves(self) -> (Span, Span) {
        let len = self.len / 2;
        (
            Span { first: self.first, len },
            Span {
                first: self.first + len,
                len,
            },
        )
    }
}

impl<T: Summand> BlockSums<T> {
    /// The sum of one block.
    pub fn one(block: u64, sum: T) -> Self {
        BlockSums(vec![(Span { first: block, len: 1 }, sum)])
    }

    /// Both shares' sums, siblings added wherever both are here.
    pub fn merge(mut self, other: Self) -> Self {
        self.0.extend(other.0);
        self.0.sort_by_key(|piece| piece.0);
        let mut added = true;
        while added {
            added = false;
            let mut pieces = std::mem::take(&mut self.0).into_iter().peekable();
            while let Some((span, mut sum)) = pieces.next() {
                let sibling = Span {
                    first: span.first + span.len,
                    len: span.len,
                };
                let is_left = span.first % (2 * span.len) == 0;
                if is_left && pieces.peek().is_some_and(|next| next.0 == sibling) {
                    let (_, right) = pieces.next().expect("peeked");
                    sum.add(&right);
                    self.0.push((
                        Span {
                            first: span.first,
                            len: 2 * span.len,
                        },
                        sum,
                    ));
                    added = true;
                } else {
                    self.0.push((span, sum));
                }
            }
        }
        self
    }

    /// The sum over all blocks.
    pub fn total(self) -> T {
        let mut pieces: BTreeMap<Span, T> = self.0.into_iter().collect();
        let all = Span { first: 0, len: BLOCKS };
        tree_sum(&mut pieces, all).expect("made of at least one block")
    }
}

/// The sum over `span` along the tree, from the pieces at hand.
fn tree_sum<T: Summand>(pieces: &mut BTreeMap<Span, T>, span: Span) -> Option<T> {
    if let Some(sum) = pieces.remove(&span) {
        return Some(sum);
    }
    if span.len == 1 {
        return None;
    }
    let (left, right) = span.halves();
    match (tree_sum(pieces, left), tree_sum(pieces, right)) {
        (Some(mut left), Some(right)) => {
            left.add(&right);
            Some(left)
        }
        (left, right) => left.or(right),
    }
}

/// A set of blocks, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocks(u64);

impl Blocks {
    /// Every block.
    pub const ALL: Blocks = Blocks((1 << BLOCKS) - 1);

    /// Whether `block` is in the set.
    pub fn contains(self, block: u64) -> bool {
        self.0 >> block & 1 == 1
    }

    /// The blocks not in the set.
    pub fn complement(self) -> Blocks {
        Blocks(Blocks::ALL.0 & !self.0)
    }

    fn with(self, block: u64) -> Blocks {
        Blocks(self.0 | 1 << block)
    }
}

/// The M-step's sample in the update after `updates` earlier ones, of the
/// points with these `ids` (batch and memory): drawn anew each update.
pub fn m_step_sample(ids: impl IntoIterator<Item = i64>, bound: usize, seed: u64, updates: u64) -> Blocks {
    sample(ids, bound, splitmix64(seed ^ splitmix64(updates)))
}

/// Whole blocks, in an order drawn from `seed`, until they hold at least
/// `bound` of the points with these `ids`; every block if all of them fit.
fn sample(ids: impl IntoIterator<Item = i64>, bound: usize, seed: u64) -> Blocks {
    minibatches(ids, bound, seed)[0]
}

/// Every block holding one of these `ids`, in an order drawn from `seed`,
/// cut into sets that hold at least `size` points each (the last may hold
/// fewer): a random partition of the points, the same on any number of workers.
pub fn minibatches(ids: impl IntoIterator<Item = i64>, size: usize, seed: u64) -> Vec<Blocks> {
    let mut count = [0usize; BLOCKS as usize];
    for id in ids {
        count[route(id) as usize] += 1;
    }
    if count.iter().sum::<usize>() <= size {
        return vec![Blocks::ALL];
    }
    let mut order: Vec<u64> = (0..BLOCKS).filter(|&b| count[b as usize] > 0).collect();
    order.sort_by_key(|&b| splitmix64(seed ^ splitmix64(b)));
    let mut sets = vec![(Blocks(0), 0)];
    for b in order {
        let (chosen, held) = sets.last_mut().expect("one set at least");
        if *held >= size {
            sets.push((Blocks(0).with(b), count[b as usize]));
        } else {
            *chosen = chosen.with(b);
            *held += count[b as usize];
        }
    }
    sets.into_iter().map(|(chosen, _)| chosen).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Summand for f64 {
        fn add(&mut self, other: &Self) {
            *self += other;
        }
    }

    /// Values whose sum's rounding depends on the order of the additions.
    fn block_value(block: u64) -> f64 {
        [1e16, 1.0, -1e16, 3.5, 2.0, 1e-3, -7.25, 0.1][block as usize % 8] * (1.0 + block as f64 * 1e-3)
    }

    #[test]
    fn block_sums_are_the_same_bits_for_any_share_of_the_blocks_among_workers() {
        // Some blocks hold no points.
        let held: Vec<u64> = (0..BLOCKS).filter(|b| b % 5 != 3).collect();
        let on = |peers: usize| {
            let shares = (0..peers).map(|worker| {
                held.iter()
                    .filter(|&&b| Partition::owner(b, peers) == worker)
                    .map(|&b| BlockSums::one(b, block_value(b)))
                    .reduce(BlockSums::merge)
            });
            shares.flatten().reduce(BlockSums::merge).unwrap()
        };
        // Whoever holds two siblings adds them: the same pieces, however shared.
        assert_eq!(on(2).0.len(), on(1).0.len());
        for peers in [2, 3, 4, 5, 7, 16, 20] {
            assert_eq!(on(peers).total().to_bits(), on(1).total().to_bits(), "{peers} workers");
        }
        // With every block held, each of two workers sends one sum.
        let half = |worker: u64| (0..BLOCKS / 2).map(move |b| BlockSums::one(worker * BLOCKS / 2 + b, 1.0));
        assert_eq!(half(0).reduce(BlockSums::merge).unwrap().0.len(), 1);
        assert_eq!(half(1).reduce(BlockSums::merge).unwrap().0.len(), 1);
    }

    #[test]
    fn a_sample_holds_at_least_its_bound_in_whole_blocks_and_fewer_blocks_than_all() {
        let ids: Vec<i64> = (0..2000).collect();
        let chosen = sample(ids.iter().copied(), 500, 7);
        let held = ids.iter().filter(|&&id| chosen.contains(route(id))).count();
        let smallest = (0..BLOCKS)
            .filter(|&b| chosen.contains(b))
            .map(|b| ids.iter().filter(|&&id| route(id) == b).count())
            .min()
            .unwrap();
        assert!(
            held >= 500 && held - smallest < 500,
            "{held} points, smallest block {smallest}"
        );
        assert_eq!(chosen.complement().complement(), chosen);
        assert_ne!(
            sample(ids.iter().copied(), 500, 8),
            chosen,
            "another seed, another sample"
        );
    }

    #[test]
    fn minibatches_partition_the_blocks_that_hold_points() {
        let ids: Vec<i64> = (0..600).collect();
        let sets = minibatches(ids.iter().copied(), 200, 3);
        let held = |set: Blocks| ids.iter().filter(|&&id| set.contains(route(id))).count();
        assert!(sets.len() >= 2);
        for set in &sets[..sets.len() - 1] {
            assert!(held(*set) >= 200, "{} points", held(*set));
        }
        assert_eq!(sets.iter().map(|&s| held(s)).sum::<usize>(), 600);
        let union = sets.iter().fold(0, |u, s| {
            assert_eq!(u & s.0, 0, "sets overlap");
            u | s.0
        });
        assert_eq!(union, Blocks::ALL.0, "every block holds some of 600 points");
    }

    #[test]
    fn everything_is_the_sample_when_it_fits() {
        assert_eq!(sample(0..100, 100, 1), Blocks::ALL);
        assert_eq!(Blocks::ALL.complement(), Blocks(0));
    }
}
