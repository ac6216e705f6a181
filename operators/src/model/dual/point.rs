//! A record's identity across the stream, and the randomness that belongs to
//! it: the same on whichever worker holds the record.

use serde::{Deserialize, Serialize};

/// A record's identity across the stream: the batch it came in and its id.
/// Within a batch, records are ordered by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PointId {
    /// The batch it came in.
    pub batch: u64,
    /// The record's id.
    pub id: i64,
}

/// A well-mixed 64-bit hash (Steele et al.'s SplitMix64 finaliser).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform draw in `(0, 1)` that belongs to one point of one stream: the
/// same whichever worker computes it.
pub fn point_uniform(seed: u64, id: PointId) -> f64 {
    let bits = splitmix64(splitmix64(seed ^ splitmix64(id.batch)) ^ id.id as u64);
    ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}
