//! What flows through the operator: records in, predictions out.

use serde::{Deserialize, Serialize};

use crate::model::Predictive;

/// One observation of a stream. Class labels are stored as `0.0, 1.0, …`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The caller's key; predictions carry it back.
    pub id: i64,
    /// The inputs, one value per feature.
    pub features: Vec<f64>,
    /// `None`: score only, nothing to learn from.
    pub label: Option<f64>,
    /// The output the record observes (and is scored on): 0 for a
    /// single-output model.
    #[serde(default)]
    pub output: usize,
    /// When the record happened, in the stream's own unit: with forgetting
    /// on, a record's weight halves every half-life of this time after it
    /// rather than every half-life of records. `None`: ages by records.
    #[serde(default)]
    pub time: Option<f64>,
}

impl Record {
    /// A record of output 0 (a single-output model's one output).
    pub fn new(id: i64, features: Vec<f64>, label: Option<f64>) -> Self {
        Record {
            id,
            features,
            label,
            output: 0,
            time: None,
        }
    }

    /// The record at `time` (see [`Record::time`]).
    pub fn at_time(mut self, time: f64) -> Self {
        self.time = Some(time);
        self
    }

    /// The record as an observation of output `d`.
    pub fn with_output(mut self, d: usize) -> Self {
        self.output = d;
        self
    }
}

/// The predictive distribution of one record's `y`, made before the model
/// learned from the record (score first, then learn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// The record's id.
    pub id: i64,
    /// The epoch the record came in.
    pub epoch: u64,
    /// The epoch whose update made the model that scored it; `None`: no
    /// update had been made (the prior). Prequential scoring gives the newest
    /// update before `epoch`; scoring on arrival may give an older one.
    pub model_epoch: Option<u64>,
    /// The predictive distribution of the record's `y` (of its output).
    pub predictive: Predictive,
    /// `log p(label | model)` when the record came with a label: its
    /// prequential score, before the model learned from it.
    pub log_density: Option<f64>,
    /// The output `predictive` is of, for a multi-output model (`None`:
    /// a single-output model's one output).
    #[serde(default)]
    pub output: Option<usize>,
    /// Every output's predictive at the record's inputs, in output order,
    /// when the operator is asked for them (`GpOptions::predict_all_outputs`);
    /// empty otherwise.
    #[serde(default)]
    pub all_outputs: Vec<Predictive>,
}

impl Prediction {
    /// Epochs before the record's own that its model had not learned: 0 for
    /// prequential scoring when every epoch has labels.
    pub fn staleness(&self) -> u64 {
        match self.model_epoch {
            Some(m) => self.epoch.saturating_sub(m + 1),
            None => self.epoch,
        }
    }
}

/// A record the operator cannot score or learn from, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejected {
    /// The epoch the record came in.
    pub epoch: u64,
    /// The record as it came.
    pub record: Record,
    /// Why it was refused, in a sentence.
    pub reason: String,
}
