//! Learning from a sample when the learner falls behind a stream scored on
//! arrival: which records an update learns, and the share of them that
//! keeps the scoring models within a bound of staleness.
//!
//! The reducing worker picks the share when an update begins and sends it
//! with every question of the update, so each worker keeps the same records
//! of its shard that the learner keeps of the batch's arrivals: a record is
//! kept when a hash of its id falls below the share, a rule every worker
//! applies alike without talking to the others.

use serde::{Deserialize, Serialize};

/// The records of an update that it learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Kept: the ids whose hash is below this; `u64::MAX` keeps every id.
    keep_below: u64,
}

impl Sample {
    /// Every record.
    pub const ALL: Sample = Sample { keep_below: u64::MAX };

    /// About `share` of the records (clamped to `0..=1`; 1 keeps every one).
    pub fn of_share(share: f64) -> Self {
        if share >= 1.0 || share.is_nan() {
            return Sample::ALL;
        }
        let keep_below = (share.max(0.0) * 2f64.powi(64)) as u64;
        Sample { keep_below }
    }

    /// The share of ids it keeps.
    pub fn share(&self) -> f64 {
        match *self == Sample::ALL {
            true => 1.0,
            false => self.keep_below as f64 / 2f64.powi(64),
        }
    }

    /// Whether the record with this id is learned.
    pub fn keeps(&self, id: i64) -> bool {
        *self == Sample::ALL || mix(id as u64) < self.keep_below
    }
}

/// SplitMix64's finaliser: consecutive ids spread evenly over `u64`.
fn mix(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What one update learns: the labelled records of its epochs from
/// `from_epoch` on that `sample` keeps. Records held for earlier epochs
/// belong to an update that learned none of them, and are let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct UpdateBatch {
    pub from_epoch: u64,
    pub sample: Sample,
}

/// The smallest share the pace goes down to: an update still learns one
/// record in a thousand when the learner is far behind.
const LEAST_SHARE: f64 = 1.0 / 1024.0;

/// Sets the share each update learns so that an update begins with about
/// half the bound's epochs waiting. An update that begins with `k` epochs
/// waiting took about as long as those `k` epochs took to arrive, and a
/// record scored just before the next update ends waits for both; so
/// holding `k` near half the bound holds staleness near the bound. The
/// share moves by the factor `target / k` each update: the time an update
/// takes grows with the records it learns, so the share that holds `k`
/// steady is found within a few updates, and it grows back to 1 once the
/// learner keeps up.
#[derive(Debug, Clone)]
pub(super) struct Pace {
    /// Epochs waiting at an update's beginning to aim for; `None`: learn everything.
    target: Option<f64>,
    share: f64,
}

impl Pace {
    /// The pace for a bound of `max_staleness` epochs, or none.
    pub fn new(max_staleness: Option<u64>) -> Self {
        Pace {
            target: max_staleness.map(|s| (s as f64 / 2.0).max(1.0)),
            share: 1.0,
        }
    }

    /// The sample of an update that begins with `waiting` epochs
    /// (its own included) not yet learned.
    pub fn sample_for(&mut self, waiting: u64) -> Sample {
        let Some(target) = self.target else {
            return Sample::ALL;
        };
        let factor = target / waiting.max(1) as f64;
        self.share = (self.share * factor).clamp(LEAST_SHARE, 1.0);
        Sample::of_share(self.share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_keeps_about_its_share_and_the_whole_keeps_every_id() {
        for share in [0.5, 0.25, 0.1, 1.0 / 1024.0] {
            let sample = Sample::of_share(share);
            assert!((sample.share() - share).abs() < 1e-15, "{share}");
            let kept = (0..100_000).filter(|&id| sample.keeps(id)).count();
            let expected = share * 100_000.0;
            // Binomial: within five standard deviations.
            assert!(
                (kept as f64 - expected).abs() < 5.0 * (expected * (1.0 - share)).sqrt() + 1.0,
                "share {share}: kept {kept}"
            );
        }
        assert_eq!(Sample::of_share(1.0), Sample::ALL);
        assert_eq!(Sample::of_share(f64::NAN), Sample::ALL);
        assert!((-50..50).all(|id| Sample::ALL.keeps(id)));
        assert!((-50..50).all(|id| !Sample::of_share(0.0).keeps(id)));
    }

    #[test]
    fn a_smaller_share_keeps_a_subset_of_a_larger_one() {
        let (half, tenth) = (Sample::of_share(0.5), Sample::of_share(0.1));
        assert!((0..10_000).all(|id| !tenth.keeps(id) || half.keeps(id)));
    }

    #[test]
    fn the_pace_sheds_while_epochs_pile_up_and_learns_everything_once_it_keeps_up() {
        assert!((0..5).all(|_| Pace::new(None).sample_for(100) == Sample::ALL));
        let mut pace = Pace::new(Some(8));
        // Four waiting is the target: everything is learned.
        assert_eq!(pace.sample_for(4), Sample::ALL);
        assert_eq!(pace.sample_for(1), Sample::ALL);
        // Sixteen waiting: half the share, then half again.
        assert_eq!(pace.sample_for(16).share(), 0.25);
        assert_eq!(pace.sample_for(8).share(), 0.125);
        // Never below the least share.
        assert_eq!(pace.sample_for(10_000).share(), LEAST_SHARE);
        // Back up by the same factor once the learner keeps up.
        assert_eq!(pace.sample_for(1).share(), 4.0 * LEAST_SHARE);
        for _ in 0..5 {
            pace.sample_for(1);
        }
        assert_eq!(pace.sample_for(1), Sample::ALL);
    }

    /// The loop the pace closes: an update that begins with `k` epochs
    /// waiting and learns a share `s` of them takes `a + b·s·k` epochs'
    /// time (a fixed cost and a cost per record learned); that many wait
    /// for the next. With the learner three times slower than the stream,
    /// the waiting settles at the target and staleness (those waiting and
    /// those arriving meanwhile) at the bound.
    #[test]
    fn the_pace_holds_a_slow_learner_near_the_bound() {
        let (a, b, bound) = (1.0, 3.0, 8);
        let mut pace = Pace::new(Some(bound));
        let mut waiting = 1u64;
        let mut stale = Vec::new();
        for _ in 0..100 {
            let share = pace.sample_for(waiting).share();
            let took = a + b * share * waiting as f64;
            stale.push(waiting as f64 + took);
            waiting = took.ceil() as u64;
        }
        let settled = &stale[50..];
        assert!(settled.iter().all(|&s| s <= bound as f64 + 1.0), "{settled:?}");
    }
}
