//! How the learner runs: the options its user sets, and the time of the
//! scope its two stages share.

use serde::{Deserialize, Serialize};

/// A time inside the learner's scope: (epoch, round), ordered
/// lexicographically; both stages run in it.
pub(super) type Round = (u64, u32);

/// When records are scored; on the command line `prequential` or `on-arrival`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scoring {
    /// Epoch `e` is scored once the updates of every earlier epoch are done,
    /// with their model: the same predictions on any number of workers (backtests).
    #[default]
    Prequential,
    /// Each record is scored the moment its worker sees it, with the newest
    /// model that worker holds; learning never holds scoring back (serving).
    OnArrival,
}

impl std::str::FromStr for Scoring {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "prequential" => Ok(Scoring::Prequential),
            "on-arrival" => Ok(Scoring::OnArrival),
            _ => Err(format!("`{s}` is not a scoring; use prequential or on-arrival")),
        }
    }
}

impl std::fmt::Display for Scoring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scoring::Prequential => "prequential",
            Scoring::OnArrival => "on-arrival",
        })
    }
}

/// How the operator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpOptions {
    /// Inputs per record.
    pub features: usize,
    /// Which model scores each record.
    pub scoring: Scoring,
    /// The epoch whose update made the starting learner (restored from a
    /// checkpoint); predictions made with it say so in `model_epoch`.
    pub learned_through: Option<u64>,
    /// Scoring on arrival, an epoch is handed to the learner as soon as all
    /// its records are in; those that closed while an update ran are learned
    /// together in the next, this many at most. (Prequential scoring hands
    /// over one epoch at a time.)
    pub max_epochs_per_update: usize,
    /// Scoring on arrival, about the most epochs a model lags the records it
    /// scores: a learner that falls behind learns a sample (`ModelUpdate::shed`).
    /// `None` (and prequential scoring): every record is learned.
    pub max_staleness: Option<u64>,
    /// A multi-output model's predictions also carry every output's
    /// predictive, not only that of the output the record observes.
    pub predict_all_outputs: bool,
    /// The learner's threads run only when the cores have nothing else to
    /// do (`SCHED_IDLE` on Linux), so a record that arrives while the
    /// learner computes is scored at once: for serving. The workers must
    /// then park when idle (`step_or_park`): a worker that spins on `step`
    /// keeps its core busy and leaves a background learner almost nothing.
    pub learn_in_background: bool,
    /// Each worker's shard thread keeps to one core: worker `i` to the
    /// `i`-th of the cores the process may use (modulo their number). For a
    /// process with one worker per core: two shards then never share a core
    /// while another idles. Off by default: an embedder places its threads.
    pub shards_on_own_cores: bool,
}

impl GpOptions {
    /// Prequential scoring of records with `features` inputs, from a fresh learner.
    pub fn new(features: usize) -> Self {
        GpOptions {
            features,
            scoring: Scoring::Prequential,
            learned_through: None,
            max_epochs_per_update: 16,
            max_staleness: None,
            predict_all_outputs: false,
            learn_in_background: false,
            shards_on_own_cores: false,
        }
    }
}
