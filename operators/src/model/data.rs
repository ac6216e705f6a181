//! A validated set of records: finite inputs and finite targets, each record
//! observing one output of the model (always output 0 for a single-output model).

use std::borrow::Cow;

use nalgebra::{DMatrix, DVector};

use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;

/// `x` with row `i`'s output index `output(i)` appended as its last column:
/// the inputs of a multi-output model (see [`Data::for_model`]).
pub fn with_output_column(x: &DMatrix<f64>, output: impl Fn(usize) -> usize) -> DMatrix<f64> {
    let d = x.ncols();
    DMatrix::from_fn(
        x.nrows(),
        d + 1,
        |i, j| if j < d { x[(i, j)] } else { output(i) as f64 },
    )
}

/// The inputs `likelihood`'s model reads at the rows of features `x`, row
/// `i` as output `output(i)`: `x` itself, or for a multi-output model `x`
/// [`with_output_column`].
pub fn model_inputs<'a>(
    likelihood: &Likelihood,
    x: &'a DMatrix<f64>,
    output: impl Fn(usize) -> usize,
) -> Cow<'a, DMatrix<f64>> {
    match likelihood.reads_output_index() {
        true => Cow::Owned(with_output_column(x, output)),
        false => Cow::Borrowed(x),
    }
}

/// Inputs `x` (`n × d`, one record per row), targets `y` and the output each
/// record observes. Construction refuses non-finite values, so every `Data`
/// is safe to learn from.
#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    x: DMatrix<f64>,
    y: DVector<f64>,
    /// Output index per record; every record observes output 0 when empty
    /// (a single-output stream pays nothing for the column it lacks).
    outputs: Vec<usize>,
    /// Each record's time, forgetting's clock (see [`with_times`](Self::with_times));
    /// empty when the records carry none.
    times: Vec<f64>,
}

impl Data {
    /// Records of output 0: inputs `x` (`n × d`) and targets `y`, checked finite.
    pub fn new(x: DMatrix<f64>, y: DVector<f64>) -> Result<Self> {
        if x.nrows() != y.len() {
            return Err(ModelError::Dimension {
                what: "targets".into(),
                expected: x.nrows(),
                got: y.len(),
            });
        }
        for (row, xi) in x.row_iter().enumerate() {
            if let Some(col) = xi.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::NonFinite {
                    row,
                    what: format!("feature {col}"),
                });
            }
        }
        if let Some(row) = y.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::NonFinite {
                row,
                what: "label".into(),
            });
        }
        Ok(Data {
            x,
            y,
            outputs: Vec::new(),
            times: Vec::new(),
        })
    }

    /// Records that each observe one output of a multi-output model. Whether
    /// every index is below the model's output count is [`check`](Self::check)'s part.
    pub fn with_outputs(x: DMatrix<f64>, y: DVector<f64>, outputs: Vec<usize>) -> Result<Self> {
        if outputs.len() != y.len() {
            return Err(ModelError::Dimension {
                what: "output indices".into(),
                expected: y.len(),
                got: outputs.len(),
            });
        }
        let mut data = Data::new(x, y)?;
        if outputs.iter().any(|&o| o != 0) {
            data.outputs = outputs;
        }
        Ok(data)
    }

    /// Records of `likelihood`'s model: a multi-output model reads each
    /// record's output index as its last input column (its coregional kernel
    /// does), so that column is appended to `x`; any other model's inputs
    /// are `x` itself.
    pub fn for_model(likelihood: &Likelihood, x: DMatrix<f64>, y: DVector<f64>, outputs: Vec<usize>) -> Result<Self> {
        let x = match likelihood.reads_output_index() {
            // A length mismatch is with_outputs' error to give.
            true => with_output_column(&x, |i| outputs.get(i).copied().unwrap_or(0)),
            false => x,
        };
        Data::with_outputs(x, y, outputs)
    }

    /// The same records, each at its time: forgetting then counts a record's
    /// age in time rather than in the records after it
    /// ([`Forgetting`](crate::model::dual::forgetting::Forgetting)).
    pub fn with_times(mut self, times: Vec<f64>) -> Result<Self> {
        if times.len() != self.n() {
            return Err(ModelError::Dimension {
                what: "record times".into(),
                expected: self.n(),
                got: times.len(),
            });
        }
        if let Some(row) = times.iter().position(|t| !t.is_finite()) {
            return Err(ModelError::NonFinite {
                row,
                what: "time".into(),
            });
        }
        self.times = times;
        Ok(self)
    }

    /// Records given as rows of features.
    pub fn from_rows(rows: &[Vec<f64>], y: &[f64]) -> Result<Self> {
        let d = rows.first().map_or(0, Vec::len);
        if let Some(bad) = rows.iter().position(|r| r.len() != d) {
            return Err(ModelError::Dimension {
                what: format!("row {bad}"),
                expected: d,
                got: rows[bad].len(),
            });
        }
        let x = DMatrix::from_fn(rows.len(), d, |i, j| rows[i][j]);
        Data::new(x, DVector::from_column_slice(y))
    }

    /// The inputs, one record per row.
    pub fn x(&self) -> &DMatrix<f64> {
        &self.x
    }

    /// The targets, one per record.
    pub fn y(&self) -> &DVector<f64> {
        &self.y
    }

    /// The output record `i` observes.
    pub fn output(&self, i: usize) -> usize {
        self.outputs.get(i).copied().unwrap_or(0)
    }

    /// The earliest and the latest of the records' times, when they carry times.
    pub fn time_span(&self) -> Option<(f64, f64)> {
        span(self.times.iter().copied())
    }

    /// Whether some record observes an output other than 0.
    pub fn has_outputs(&self) -> bool {
        !self.outputs.is_empty()
    }

    /// The number of records.
    pub fn n(&self) -> usize {
        self.x.nrows()
    }

    /// The number of inputs per record.
    pub fn d(&self) -> usize {
        self.x.ncols()
    }

    /// The records at `rows`, in that order.
    pub fn select(&self, rows: &[usize]) -> Data {
        Data {
            x: self.x.select_rows(rows),
            y: self.y.select_rows(rows),
            outputs: if self.outputs.is_empty() {
                Vec::new()
            } else {
                rows.iter().map(|&r| self.outputs[r]).collect()
            },
            times: if self.times.is_empty() {
                Vec::new()
            } else {
                rows.iter().map(|&r| self.times[r]).collect()
            },
        }
    }

    /// Checks the input dimension, that every record's output is one of the
    /// likelihood's and that every label is in that output's support.
    pub fn check(&self, d: usize, likelihood: &Likelihood) -> Result<()> {
        if self.d() != d {
            return Err(ModelError::Dimension {
                what: "inputs".into(),
                expected: d,
                got: self.d(),
            });
        }
        self.y
            .iter()
            .enumerate()
            .try_for_each(|(row, &y)| likelihood.check_label_of(row, self.output(row), y))
    }
}

/// The earliest and the latest of `times`; None when there are none.
pub fn span(times: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    times.into_iter().fold(None, |s, t| {
        Some(s.map_or((t, t), |(a, b): (f64, f64)| (a.min(t), b.max(t))))
    })
}
