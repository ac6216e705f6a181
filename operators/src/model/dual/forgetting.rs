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
//! Discounting the sites rather than adding a temporal kernel keeps the
//! model's inputs and `m` inducing inputs for the space the user's features
//! span (a time input would need inducing inputs along time, spent anew as it
//! grows), and costs one scaling of the `m × m` totals an update.

use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};

/// Records' weights halve every `half_life` records that arrive after them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Forgetting {
    /// Records after which a record's weight has halved.
    pub half_life: f64,
}

impl Forgetting {
    /// Refuses a half-life that is not a positive number of records.
    pub fn validate(&self) -> Result<()> {
        if !(self.half_life > 0.0 && self.half_life.is_finite()) {
            return Err(ModelError::Config(format!(
                "the forgetting half-life {} must be a positive number of records",
                self.half_life
            )));
        }
        Ok(())
    }

    /// What is left of a weight once `records` more have arrived.
    pub fn factor(&self, records: usize) -> f64 {
        (-(records as f64) / self.half_life).exp2()
    }
}

#[cfg(test)]
mod tests {
    use super::Forgetting;

    #[test]
    fn a_weight_halves_every_half_life_however_the_records_come() {
        let forgetting = Forgetting { half_life: 300.0 };
        assert_eq!(forgetting.factor(0), 1.0);
        assert!((forgetting.factor(300) - 0.5).abs() < 1e-15);
        let in_steps = forgetting.factor(100) * forgetting.factor(250) * forgetting.factor(250);
        assert!((in_steps - 0.25).abs() < 1e-15, "{in_steps}");
        assert!(Forgetting { half_life: 0.0 }.validate().is_err());
        assert!(Forgetting {
            half_life: f64::INFINITY
        }
        .validate()
        .is_err());
    }
}
