//! Forgetting: past records lose weight with age, exactly in the dual
//! parameters. Each record's likelihood is raised to a weight that halves
//! every `half_life` records that arrive after it, so the learner targets
//!
//! `q(f) ∝ p(f) Π_i p(y_i | f_i)^{w_i}`, `w_i = 2^{−(records after i) / half_life}`:
//!
//! for a Gaussian likelihood the exact GP with noise `σ²/w_i` on record `i`,
//! a Kalman filter's forgetting factor in the sites. Sites are linear in their
//! likelihood's weight, so an update that brings `n` records multiplies every
//! site learned before, the totals, the memory's and the held records' own,
//! by `2^{−n/half_life}`; a memory point re-learned counts its own weight (its
//! sites as before, times what forgetting left of it), the past it stands
//! for is the sum of the past's weights, and past data's message, made from
//! the discounted totals, says only what is left.
//!
//! [`Forgetting::Auto`] picks each update's discount from how probable its
//! batch is under each candidate before it is learned ([`Evidence`]).
//!
//! When records carry times ([`Data::with_times`](crate::model::Data::with_times),
//! `Record::time`), age is counted in time instead ([`Clock`]): a record's
//! weight halves every half-life of time after its update's latest record,
//! so a pause in the stream forgets and a burst does not. A wandering level
//! is then a local-level model (a random walk observed in noise), whose
//! Kalman filter in its steady state is exactly such an exponential
//! discount of the past.
//!
//! Discounting the sites rather than adding a temporal kernel keeps the
//! model's inputs and `m` inducing inputs for the space the user's features
//! span (a time input would need inducing inputs along time, spent anew as it
//! grows), and costs one scaling of the `m × m` totals an update.

use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};

/// How past records lose weight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Forgetting {
    /// A record's weight halves every this many records that arrive after it
    /// (this much time, when records carry times).
    HalfLife(f64),
    /// Each update picks its discount from the prequential evidence of its
    /// batch: among those of [`AUTO_HALF_LIVES`] under which the batch,
    /// scored before it is learned, is significantly more probable than
    /// under no discount, the one that gains most (see [`Evidence::chosen`]).
    Auto,
}

/// The half-lives, in records, among which [`Forgetting::Auto`] chooses.
pub const AUTO_HALF_LIVES: [f64; 6] = [4.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0];

impl Forgetting {
    /// Refuses a half-life that is not a positive number of records.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Forgetting::HalfLife(h) if !(h > 0.0 && h.is_finite()) => Err(ModelError::Config(format!(
                "the forgetting half-life {h} must be a positive number of records"
            ))),
            _ => Ok(()),
        }
    }

    /// The discounts an update that ages the past by `age` may apply: one
    /// for a half-life; for [`Auto`](Forgetting::Auto), none (1) first, then
    /// [`AUTO_HALF_LIVES`]' in turn (half-lives in records' worth of time).
    pub fn candidates(&self, age: Age) -> Vec<f64> {
        match *self {
            Forgetting::HalfLife(h) => vec![halved(age.units, h)],
            Forgetting::Auto => std::iter::once(1.0)
                .chain(AUTO_HALF_LIVES.iter().map(|&h| halved(age.records, h)))
                .collect(),
        }
    }

    /// Records between M-steps at most: a half-life (in records' worth by
    /// `clock`), since the evidence `θ` was fitted to has halved by then (none
    /// for [`Auto`](Forgetting::Auto), whose strong discounts take their
    /// M-steps at once).
    pub fn m_every_cap(&self, clock: &Clock) -> Option<usize> {
        match *self {
            Forgetting::HalfLife(h) => Some(clock.in_records(h).ceil().max(1.0) as usize),
            Forgetting::Auto => None,
        }
    }
}

/// How much an update ages everything learned before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Age {
    /// In the half-life's units: records, or time when records carry times.
    pub units: f64,
    /// In records' worth (the same as `units` when age is counted in records).
    pub records: f64,
}

impl Age {
    /// The age `n` records bring when age is counted in records.
    pub fn of_records(n: usize) -> Age {
        Age {
            units: n as f64,
            records: n as f64,
        }
    }
}

/// Forgetting's clock: records, until a batch's records carry times; from
/// then on the stream's time, each update aging the past by the time from
/// the latest record learned before it to its own latest (none for a batch
/// that comes back in time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Clock {
    /// The earliest and the latest time learned.
    span: Option<(f64, f64)>,
    /// Records learned since the clock first read a time.
    records: u64,
}

impl Clock {
    /// The age an update of `n` records whose times span `span` (if they
    /// carry times) brings; the clock moves on to its latest.
    pub fn advance(&mut self, n: usize, span: Option<(f64, f64)>) -> Age {
        let Some((earliest, latest)) = span else {
            return Age::of_records(n);
        };
        let (first, before) = self.span.unwrap_or((earliest, latest));
        let units = (latest - before).max(0.0);
        let age = Age {
            units,
            records: self.in_records(units),
        };
        self.span = Some((first.min(earliest), before.max(latest)));
        self.records += n as u64;
        age
    }

    /// `time` as the records that arrive in it at the stream's average pace
    /// (itself when age is counted in records, or before time has passed).
    pub fn in_records(&self, time: f64) -> f64 {
        match self.span {
            Some((first, latest)) if latest > first && self.records > 1 => {
                time * (self.records - 1) as f64 / (latest - first)
            }
            _ => time,
        }
    }
}

/// A paired test's statistic above which a discount's gain counts as
/// significant: about one chance in a thousand of a stationary batch's noise.
const SIGNIFICANT: f64 = 3.0;

/// What a batch says of the candidate discounts (see [`Forgetting::candidates`]):
/// per candidate, its records' log predictive densities minus those under
/// the first candidate (no discount), summed, and their squares summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// `Σ_i d_ik`, `d_ik = log p_k(y_i) − log p_0(y_i)`.
    pub gain: Vec<f64>,
    /// `Σ_i d_ik²`.
    pub gain_sq: Vec<f64>,
    /// The records summed.
    pub records: f64,
}

impl Evidence {
    /// Adds a record's log predictive density under each candidate.
    pub fn add_record(&mut self, log_densities: &[f64]) {
        if self.gain.is_empty() {
            self.gain = vec![0.0; log_densities.len()];
            self.gain_sq = vec![0.0; log_densities.len()];
        }
        for (k, &log_p) in log_densities.iter().enumerate() {
            let d = log_p - log_densities[0];
            self.gain[k] += d;
            self.gain_sq[k] += d * d;
        }
        self.records += 1.0;
    }

    /// Adds another share's sums.
    pub fn add(&mut self, other: &Evidence) {
        if self.gain.is_empty() {
            *self = other.clone();
            return;
        }
        for k in 0..self.gain.len().min(other.gain.len()) {
            self.gain[k] += other.gain[k];
            self.gain_sq[k] += other.gain_sq[k];
        }
        self.records += other.records;
    }

    /// The candidate (an index into [`Forgetting::candidates`]) to apply:
    /// of those whose gain over no discount passes a paired test (its
    /// records' mean gain over its standard error above [`SIGNIFICANT`]),
    /// the one that gains most; 0 (no discount) if none does. A model that
    /// is only a little overconfident gains a little on every record from
    /// any discount; a stream that moved gains a lot on most of them.
    pub fn chosen(&self) -> usize {
        let n = self.records;
        let significant = |k: usize| {
            let mean = self.gain[k] / n;
            let spread = (self.gain_sq[k] / n - mean * mean).max(0.0).sqrt();
            mean > 0.0 && (spread == 0.0 || mean / (spread / n.sqrt()) > SIGNIFICANT)
        };
        (1..self.gain.len())
            .filter(|&k| self.gain[k].is_finite() && significant(k))
            .max_by(|&a, &b| self.gain[a].total_cmp(&self.gain[b]))
            .unwrap_or(0)
    }
}

/// What is left of a weight once it has aged `age`, at half-life `half_life`.
fn halved(age: f64, half_life: f64) -> f64 {
    (-age / half_life).exp2()
}

#[cfg(test)]
mod tests {
    use super::{Age, Clock, Evidence, Forgetting};

    #[test]
    fn a_weight_halves_every_half_life_however_the_records_come() {
        let forgetting = Forgetting::HalfLife(300.0);
        let factor = |n| forgetting.candidates(Age::of_records(n))[0];
        assert_eq!(factor(0), 1.0);
        assert!((factor(300) - 0.5).abs() < 1e-15);
        let in_steps = factor(100) * factor(250) * factor(250);
        assert!((in_steps - 0.25).abs() < 1e-15, "{in_steps}");
        assert!(Forgetting::HalfLife(0.0).validate().is_err());
        assert!(Forgetting::HalfLife(f64::INFINITY).validate().is_err());
    }

    #[test]
    fn auto_forgets_only_when_a_discount_gains_significantly_on_the_batchs_records() {
        let candidates = Forgetting::Auto.candidates(Age::of_records(100));
        assert_eq!(candidates[0], 1.0);
        assert!(
            candidates.windows(2).skip(1).all(|w| w[0] < w[1]),
            "shortest half-life first: {candidates:?}"
        );
        let evidence = |records: &[[f64; 3]]| {
            let mut e = Evidence::default();
            records.iter().for_each(|r| e.add_record(r));
            e
        };
        // Candidate 2 gains most on two records and loses on two: noise.
        let noise = evidence(&[
            [-1.0, -0.9, 0.0],
            [-1.0, -1.1, -2.5],
            [-1.0, -0.9, 0.2],
            [-1.0, -1.0, -2.4],
        ]);
        assert_eq!(noise.chosen(), 0);
        // Every record gains from both; candidate 1 gains more.
        let moved: Vec<[f64; 3]> = (0..20).map(|i| [-5.0, -1.0 + 0.01 * i as f64, -2.0]).collect();
        assert_eq!(evidence(&moved).chosen(), 1);
        let mut failed = evidence(&moved);
        failed.gain[1] = f64::NAN;
        assert_eq!(failed.chosen(), 2, "a gain that failed is never chosen");
        let (mut halves, whole) = (evidence(&moved[..7]), evidence(&moved));
        halves.add(&evidence(&moved[7..]));
        assert_eq!(halves.chosen(), whole.chosen());
    }

    /// A clock of times ages the past by the time between the latest
    /// records, counts that time in records at the stream's pace for `auto`
    /// and for the M-steps' cap, and never runs backwards.
    #[test]
    fn a_clock_of_times_ages_by_the_time_that_passed() {
        let mut clock = Clock::default();
        assert_eq!(clock.advance(7, None), Age::of_records(7), "no times: records");
        // Ten records a unit of time: 0.0, 0.1, …, 0.9.
        let first = clock.advance(10, Some((0.0, 0.9)));
        assert_eq!(first.units, 0.0, "nothing came before the first time");
        let age = clock.advance(10, Some((1.0, 1.9)));
        assert!(
            (age.units - 1.0).abs() < 1e-12 && (age.records - 10.0).abs() < 1e-9,
            "{age:?}"
        );
        let pause = clock.advance(10, Some((11.0, 11.9)));
        assert!((pause.units - 10.0).abs() < 1e-12, "a pause ages: {pause:?}");
        assert_eq!(
            clock.advance(5, Some((3.0, 4.0))).units,
            0.0,
            "late records age nothing"
        );
        assert_eq!(Forgetting::HalfLife(2.0).candidates(pause)[0], (-5.0f64).exp2());
        // 35 records over 11.9 units: a half-life of 3.4 units is 10 records' worth.
        assert_eq!(Forgetting::HalfLife(3.4).m_every_cap(&clock), Some(10));
    }
}
