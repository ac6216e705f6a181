//! Predictions and dead letters to Parquet files, written atomically
//! (see [`crate::atomic_parquet`]).
//!
//! Prediction columns: `id` (int64), `epoch` (uint64), then by
//! [`PredictionLayout`]: `mean`, `var` (float64); `p1` (Bernoulli: the
//! probability of class 1 only, as the `replay` contract of `../shared/docs/EVALUATION.md` says);
//! or `p0..p{C-1}`. A multi-output model's files have the columns of
//! [`PredictionColumns::Multi`].

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use dualgp_operators::dataflow::Prediction;
use dualgp_operators::model::{Likelihood, Predictive};
use serde::{Deserialize, Serialize};

use crate::atomic_parquet::AtomicParquet;
use crate::dead_letter::DeadLetter;
use crate::error::SinkError;
pub use crate::prediction_columns::PredictionColumns;

/// Which predictive columns a sink writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PredictionLayout {
    /// `mean`, `var`.
    Moments,
    /// `p1` only, from class probabilities `[p0, p1]`.
    Bernoulli,
    /// `p0..p{C-1}`.
    Classes(usize),
}

impl PredictionLayout {
    /// The layout a likelihood's predictions have; for a multi-output
    /// model, output 0's (its files use [`PredictionColumns::for_likelihood`]).
    pub fn for_likelihood(likelihood: &Likelihood) -> Self {
        match likelihood {
            Likelihood::Bernoulli { .. } => PredictionLayout::Bernoulli,
            Likelihood::Softmax { classes, .. } => PredictionLayout::Classes(*classes),
            Likelihood::Gaussian { .. } | Likelihood::Poisson | Likelihood::StudentT { .. } => {
                PredictionLayout::Moments
            }
            Likelihood::MultiOutput(multi) => PredictionLayout::for_likelihood(&multi.outputs[0]),
        }
    }

    /// The predictive columns, after `id` and `epoch`.
    pub fn value_columns(self) -> Vec<String> {
        match self {
            PredictionLayout::Moments => vec!["mean".into(), "var".into()],
            PredictionLayout::Bernoulli => vec!["p1".into()],
            PredictionLayout::Classes(c) => (0..c).map(|k| format!("p{k}")).collect(),
        }
    }

    /// Append `p`'s predictive values to `columns` (one per value column),
    /// or say why they do not fit this layout.
    pub(crate) fn push(self, p: &Prediction, columns: &mut [Vec<f64>]) -> Result<(), SinkError> {
        self.push_predictive(p.id, &p.predictive, columns)
    }

    /// Append the values of record `id`'s `predictive` to `columns`.
    pub(crate) fn push_predictive(
        self,
        id: i64,
        predictive: &Predictive,
        columns: &mut [Vec<f64>],
    ) -> Result<(), SinkError> {
        let values: &[f64] = match (self, predictive) {
            (PredictionLayout::Moments, Predictive::Moments { mean, var }) => {
                columns[0].push(*mean);
                columns[1].push(*var);
                return Ok(());
            }
            (PredictionLayout::Bernoulli, Predictive::Classes(probs)) if probs.len() == 2 => &probs[1..],
            (PredictionLayout::Classes(c), Predictive::Classes(probs)) if probs.len() == c => probs,
            (_, found) => {
                return Err(SinkError::Layout {
                    id,
                    found: match found {
                        Predictive::Moments { .. } => "a mean and a variance".into(),
                        Predictive::Classes(probs) => format!("{} class probabilities", probs.len()),
                    },
                    expected: self.describe(),
                })
            }
        };
        for (column, v) in columns.iter_mut().zip(values) {
            column.push(*v);
        }
        Ok(())
    }

    pub(crate) fn describe(self) -> String {
        match self {
            PredictionLayout::Moments => "a mean and a variance".into(),
            PredictionLayout::Bernoulli => "2 class probabilities".into(),
            PredictionLayout::Classes(c) => format!("{c} class probabilities"),
        }
    }

    /// The value columns as one single-output file has them.
    pub(crate) fn value_fields(self) -> Vec<Field> {
        self.value_columns()
            .into_iter()
            .map(|c| Field::new(c, DataType::Float64, false))
            .collect()
    }

    /// The value columns of a batch of predictions.
    pub(crate) fn value_arrays(self, predictions: &[Prediction]) -> Result<Vec<ArrayRef>, SinkError> {
        let mut values = vec![Vec::with_capacity(predictions.len()); self.value_columns().len()];
        for p in predictions {
            self.push(p, &mut values)?;
        }
        Ok(values
            .into_iter()
            .map(|v| Arc::new(Float64Array::from(v)) as ArrayRef)
            .collect())
    }
}

/// The schema of a prediction file: `id`, `epoch`, the value columns, `model_epoch`.
fn schema(values: Vec<Field>) -> SchemaRef {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("epoch", DataType::UInt64, false),
    ];
    fields.extend(values);
    fields.push(Field::new("model_epoch", DataType::UInt64, true));
    Arc::new(Schema::new(fields))
}

/// Predictions to a Parquet file, one row each, in the order written.
pub struct PredictionWriter {
    file: AtomicParquet,
    columns: PredictionColumns,
}

impl PredictionWriter {
    /// Start `path` (written as `path.partial` until [`finish`](Self::finish))
    /// with the value columns of `columns` (a [`PredictionLayout`] for a
    /// single-output model).
    pub fn create(path: impl AsRef<Path>, columns: impl Into<PredictionColumns>) -> Result<Self, SinkError> {
        let columns = columns.into();
        columns.check()?;
        Ok(PredictionWriter {
            file: AtomicParquet::create(path.as_ref(), schema(columns.fields()))?,
            columns,
        })
    }

    /// Append predictions. A prediction of the wrong shape is an error and
    /// nothing of this call is written.
    pub fn write(&mut self, predictions: &[Prediction]) -> Result<(), SinkError> {
        if predictions.is_empty() {
            return Ok(());
        }
        let values = self.columns.arrays(predictions)?;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(predictions.iter().map(|p| p.id))),
            Arc::new(UInt64Array::from_iter_values(predictions.iter().map(|p| p.epoch))),
        ];
        columns.extend(values);
        columns.push(Arc::new(UInt64Array::from_iter(
            predictions.iter().map(|p| p.model_epoch),
        )));
        self.file.write(columns)
    }

    /// Close the file and move it into place; returns the rows written.
    pub fn finish(self) -> Result<u64, SinkError> {
        self.file.finish()
    }
}

/// Dead letters to a Parquet file: `origin`, `reason_kind`, `reason`, `payload` (utf8).
pub struct DeadLetterWriter {
    file: AtomicParquet,
}

impl DeadLetterWriter {
    /// A writer to `path`, which appears there only once finished.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, SinkError> {
        let schema = Arc::new(Schema::new(
            ["origin", "reason_kind", "reason", "payload"]
                .map(|c| Field::new(c, DataType::Utf8, false))
                .to_vec(),
        ));
        Ok(DeadLetterWriter {
            file: AtomicParquet::create(path.as_ref(), schema)?,
        })
    }

    /// Appends `dead_letters`.
    pub fn write(&mut self, dead_letters: &[DeadLetter]) -> Result<(), SinkError> {
        if dead_letters.is_empty() {
            return Ok(());
        }
        let column = |f: &dyn Fn(&DeadLetter) -> String| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(dead_letters.iter().map(f)))
        };
        let columns = vec![
            column(&|d| d.origin.to_string()),
            column(&|d| d.reason.kind().as_str().to_owned()),
            column(&|d| d.reason.to_string()),
            column(&|d| d.payload.clone()),
        ];
        self.file.write(columns)
    }

    /// Close the file and move it into place; returns the rows written.
    pub fn finish(self) -> Result<u64, SinkError> {
        self.file.finish()
    }
}
