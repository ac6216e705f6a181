//! A validated set of records: finite inputs and finite targets.

use nalgebra::{DMatrix, DVector};

use crate::model::error::{ModelError, Result};
use crate::model::likelihood::Likelihood;

/// Inputs `x` (`n × d`, one record per row) and targets `y`. Construction
/// refuses non-finite values, so every `Data` is safe to learn from.
#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    x: DMatrix<f64>,
    y: DVector<f64>,
}

impl Data {
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
        Ok(Data { x, y })
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

    pub fn x(&self) -> &DMatrix<f64> {
        &self.x
    }

    pub fn y(&self) -> &DVector<f64> {
        &self.y
    }

    pub fn n(&self) -> usize {
        self.x.nrows()
    }

    pub fn d(&self) -> usize {
        self.x.ncols()
    }

    /// The records at `rows`, in that order.
    pub fn select(&self, rows: &[usize]) -> Data {
        Data {
            x: self.x.select_rows(rows),
            y: self.y.select_rows(rows),
        }
    }

    /// Checks the input dimension and that every label is in the likelihood's support.
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
            .try_for_each(|(row, &y)| likelihood.check_label(row, y))
    }
}
