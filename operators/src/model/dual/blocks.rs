//! Sets of the shards' fixed blocks, and the M-step's sample of them.
//!
//! A block holds the points whose ids hash to it ([`route`]), so a random set
//! of blocks is a random sample of points, and it is the same on any number
//! of workers.

use serde::{Deserialize, Serialize};

use crate::model::dual::point::splitmix64;
use crate::model::dual::shard::{route, BLOCKS};

/// A set of blocks, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocks(u64);

impl Blocks {
    pub const ALL: Blocks = Blocks((1 << BLOCKS) - 1);

    pub fn contains(self, block: u64) -> bool {
        self.0 >> block & 1 == 1
    }

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
