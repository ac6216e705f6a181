//! The value columns of a prediction file: one output's [`PredictionLayout`],
//! or a multi-output model's columns.
//!
//! A multi-output model's file has, after `id` and `epoch`:
//! - `output` (int64): the output the row's record observes;
//! - the value columns of every output's layout under their single-output
//!   names, each name once (`mean`, `var` for Gaussian, Student-t and Poisson
//!   outputs, `p1` for Bernoulli, `p0..p{C-1}` for softmax), nullable: a row
//!   fills those of its own output's layout and leaves the others null, so
//!   `mean` is never output 1's variance's neighbour by accident;
//! - asked for every output, `output{d}_{column}` for each output `d` and
//!   each column of its layout (`output0_mean`, `output0_var`, `output1_p1`):
//!   every output's predictive at the record's inputs, never null.
//!
//! then `model_epoch`, as in a single-output file.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array};
use arrow::datatypes::{DataType, Field};
use dualgp_operators::dataflow::Prediction;
use dualgp_operators::model::Likelihood;

use crate::error::SinkError;
use crate::parquet_sink::PredictionLayout;

/// Which value columns a prediction file has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PredictionColumns {
    /// A single-output model's.
    Single(PredictionLayout),
    /// A multi-output model's (see the module documentation).
    Multi {
        /// Each output's layout, in output order.
        outputs: Vec<PredictionLayout>,
        /// Whether every output's predictive is written too.
        every_output: bool,
    },
}

impl From<PredictionLayout> for PredictionColumns {
    fn from(layout: PredictionLayout) -> Self {
        PredictionColumns::Single(layout)
    }
}

impl PredictionColumns {
    /// The columns a likelihood's predictions have; `every_output` matters
    /// only for a multi-output model.
    pub fn for_likelihood(likelihood: &Likelihood, every_output: bool) -> Self {
        match likelihood {
            Likelihood::MultiOutput(multi) => PredictionColumns::Multi {
                outputs: multi.outputs.iter().map(PredictionLayout::for_likelihood).collect(),
                every_output,
            },
            single => PredictionColumns::Single(PredictionLayout::for_likelihood(single)),
        }
    }

    /// The value columns' names, after `id` and `epoch`.
    pub fn names(&self) -> Vec<String> {
        self.fields().iter().map(|f| f.name().clone()).collect()
    }

    pub(crate) fn check(&self) -> Result<(), SinkError> {
        let layouts = match self {
            PredictionColumns::Single(layout) => std::slice::from_ref(layout),
            PredictionColumns::Multi { outputs, .. } if outputs.is_empty() => {
                return Err(SinkError::Config(
                    "a multi-output layout needs at least 1 output".into(),
                ))
            }
            PredictionColumns::Multi { outputs, .. } => outputs.as_slice(),
        };
        if layouts.contains(&PredictionLayout::Classes(0)) {
            return Err(SinkError::Config("a class layout needs at least 1 class".into()));
        }
        Ok(())
    }

    pub(crate) fn fields(&self) -> Vec<Field> {
        match self {
            PredictionColumns::Single(layout) => layout.value_fields(),
            PredictionColumns::Multi { outputs, every_output } => {
                let mut fields = vec![Field::new("output", DataType::Int64, false)];
                fields.extend(
                    shared_names(outputs)
                        .into_iter()
                        .map(|name| Field::new(name, DataType::Float64, true)),
                );
                if *every_output {
                    fields.extend(
                        every_output_names(outputs)
                            .into_iter()
                            .map(|name| Field::new(name, DataType::Float64, false)),
                    );
                }
                fields
            }
        }
    }

    pub(crate) fn arrays(&self, predictions: &[Prediction]) -> Result<Vec<ArrayRef>, SinkError> {
        match self {
            PredictionColumns::Single(layout) => layout.value_arrays(predictions),
            PredictionColumns::Multi { outputs, every_output } => {
                let mut arrays = own_output_arrays(outputs, predictions)?;
                if *every_output {
                    arrays.extend(every_output_arrays(outputs, predictions)?);
                }
                Ok(arrays)
            }
        }
    }
}

/// The value column names of all outputs' layouts, each once, in order of
/// first appearance.
fn shared_names(outputs: &[PredictionLayout]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in outputs.iter().flat_map(|l| l.value_columns()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

fn every_output_names(outputs: &[PredictionLayout]) -> Vec<String> {
    outputs
        .iter()
        .enumerate()
        .flat_map(|(d, l)| l.value_columns().into_iter().map(move |c| format!("output{d}_{c}")))
        .collect()
}

/// `output`, then the shared columns, each row's own output's filled.
fn own_output_arrays(outputs: &[PredictionLayout], predictions: &[Prediction]) -> Result<Vec<ArrayRef>, SinkError> {
    let shared = shared_names(outputs);
    let mut indices = Vec::with_capacity(predictions.len());
    let mut values: Vec<Vec<Option<f64>>> = vec![Vec::with_capacity(predictions.len()); shared.len()];
    for p in predictions {
        let d = p
            .output
            .filter(|&d| d < outputs.len())
            .ok_or_else(|| SinkError::Layout {
                id: p.id,
                found: match p.output {
                    Some(d) => format!("a prediction of output {d}"),
                    None => "a prediction without an output index".into(),
                },
                expected: format!("a prediction of one of {} outputs", outputs.len()),
            })?;
        let own = outputs[d];
        let own_names = own.value_columns();
        let mut own_values = vec![Vec::with_capacity(1); own_names.len()];
        own.push(p, &mut own_values)?;
        for (name, column) in shared.iter().zip(values.iter_mut()) {
            let at = own_names.iter().position(|n| n == name);
            column.push(at.map(|k| own_values[k][0]));
        }
        indices.push(d as i64);
    }
    let mut arrays: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(indices))];
    arrays.extend(values.into_iter().map(|v| Arc::new(Float64Array::from(v)) as ArrayRef));
    Ok(arrays)
}

/// `output{d}_{column}` for every output, from each prediction's `all_outputs`.
fn every_output_arrays(outputs: &[PredictionLayout], predictions: &[Prediction]) -> Result<Vec<ArrayRef>, SinkError> {
    let mut per_output: Vec<Vec<Vec<f64>>> = outputs
        .iter()
        .map(|l| vec![Vec::with_capacity(predictions.len()); l.value_columns().len()])
        .collect();
    for p in predictions {
        if p.all_outputs.len() != outputs.len() {
            return Err(SinkError::Layout {
                id: p.id,
                found: format!("a prediction of {} outputs' predictives", p.all_outputs.len()),
                expected: format!("every output's predictive ({} outputs)", outputs.len()),
            });
        }
        for ((layout, columns), predictive) in outputs.iter().zip(per_output.iter_mut()).zip(&p.all_outputs) {
            layout.push_predictive(p.id, predictive, columns)?;
        }
    }
    Ok(per_output
        .into_iter()
        .flatten()
        .map(|v| Arc::new(Float64Array::from(v)) as ArrayRef)
        .collect())
}
