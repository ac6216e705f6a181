//! The "paper-uci" evaluation protocol as data preparation (no model code).
//!
//! For a data set and fold k: test = rows with `fold == k`, train = the rest
//! (or a separate test file). Features, and the target for regression, are
//! standardised with train statistics; the train rows are put in the chosen
//! [`Order`] and cut into consecutive, nearly equal batches.
//!
//! ```no_run
//! use dualgp_connectors::{ColumnSpec, Table};
//! use dualgp_pipelines::protocol::{fold_split, prepare, Order};
//!
//! let table = Table::read("../shared/data/elevators.parquet", &ColumnSpec::default())?;
//! let split = fold_split(&table, 0)?;
//! let order: Order = "shuffle:0".parse()?;
//! let data = prepare(&split, &order, 10, true)?;
//! for b in 0..data.batches.len() {
//!     let (x, y) = data.batch(b);
//!     // learn from (x, y), then score on (data.x_test, data.y_test)
//! #   let _ = (x, y);
//! }
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use dualgp_connectors::Table;
use dualgp_operators::dataflow::{Prediction, Record};
use dualgp_operators::model::{Likelihood, Predictive};
use nalgebra::{DMatrix, DMatrixView, DVector, DVectorView};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Why the protocol could not be set up. Each message is one line saying what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// An order string that does not parse.
    #[error("bad order `{given}`: {reason}; use id, shuffle:SEED or sorted:COLUMN")]
    BadOrder {
        /// The string given.
        given: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A fold was asked for but the data has no fold column.
    #[error("the data has no fold column; give a separate test file instead of a fold")]
    NoFolds,
    /// The fold asked for has no rows.
    #[error("fold {fold} has no rows; the data's folds are {}", join(.available))]
    EmptyFold {
        /// The fold asked for.
        fold: i8,
        /// The folds the data has.
        available: Vec<i8>,
    },
    /// Every row is in the test fold, so nothing is left to train on.
    #[error("every row is in fold {fold}, leaving no training rows; use data with several folds")]
    NoTrainRows {
        /// The fold asked for.
        fold: i8,
    },
    /// `sorted:COLUMN` names a column that is not a feature.
    #[error("cannot sort by `{column}`: it is not a feature; the features are {}", .available.join(", "))]
    UnknownColumn {
        /// The column asked for.
        column: String,
        /// The feature names.
        available: Vec<String>,
    },
    /// The train or test data has no labels.
    #[error("the {side} data has no labels (y); the protocol needs a label column")]
    NoLabels {
        /// "train" or "test".
        side: &'static str,
    },
    /// Train and test have different feature columns.
    #[error("train and test have different features ({} vs {}); use files with the same x columns", .train.join(","), .test.join(","))]
    FeatureMismatch {
        /// The train features.
        train: Vec<String>,
        /// The test features.
        test: Vec<String>,
    },
    /// The batch count does not fit the number of rows.
    #[error("cannot split {n} rows into {k} batches; use between 1 and {n} batches")]
    BadBatches {
        /// Rows to split.
        n: usize,
        /// Batches asked for.
        k: usize,
    },
}

fn join(v: &[i8]) -> String {
    v.iter().map(i8::to_string).collect::<Vec<_>>().join(", ")
}

/// The order in which the learner sees the train rows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// File order (`id`).
    #[default]
    Id,
    /// A seeded shuffle (`shuffle:SEED`): ChaCha8 seeded with SEED, Fisher–Yates.
    Shuffle(u64),
    /// Stably sorted by a feature, ascending (`sorted:COLUMN`, e.g. `sorted:x0`).
    Sorted(String),
}

impl FromStr for Order {
    type Err = ProtocolError;

    /// Parse `id`, `shuffle:SEED` (SEED a non-negative integer) or `sorted:COLUMN`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| ProtocolError::BadOrder {
            given: s.to_owned(),
            reason: reason.to_owned(),
        };
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("id", None) => Ok(Order::Id),
            ("id", Some(_)) => Err(bad("`id` takes no argument")),
            ("shuffle", None) | ("shuffle", Some("")) => Err(bad("shuffle needs a seed, e.g. shuffle:0")),
            ("shuffle", Some(seed)) => seed
                .parse::<u64>()
                .map(Order::Shuffle)
                .map_err(|_| bad("the seed must be a non-negative integer")),
            ("sorted", None) | ("sorted", Some("")) => Err(bad("sorted needs a column, e.g. sorted:x0")),
            ("sorted", Some(col)) => Ok(Order::Sorted(col.to_owned())),
            ("", _) => Err(bad("it is empty")),
            _ => Err(bad("unknown kind of order")),
        }
    }
}

impl fmt::Display for Order {
    /// The same form [`Order::from_str`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Order::Id => f.write_str("id"),
            Order::Shuffle(seed) => write!(f, "shuffle:{seed}"),
            Order::Sorted(col) => write!(f, "sorted:{col}"),
        }
    }
}

/// The row indices of `table` in the given order (a permutation of `0..table.n()`).
///
/// Fails only for `sorted:COLUMN` with a column that is not a feature.
pub fn order_rows(table: &Table, order: &Order) -> Result<Vec<usize>, ProtocolError> {
    let mut rows: Vec<usize> = (0..table.n()).collect();
    match order {
        Order::Id => {}
        Order::Shuffle(seed) => rows.shuffle(&mut ChaCha8Rng::seed_from_u64(*seed)),
        Order::Sorted(column) => {
            let j = table
                .feature_index(column)
                .ok_or_else(|| ProtocolError::UnknownColumn {
                    column: column.clone(),
                    available: table.feature_names.clone(),
                })?;
            let x = table.features.column(j);
            rows.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
        }
    }
    Ok(rows)
}

/// `n` rows cut into `k` consecutive batches whose sizes differ by at most one
/// (the larger ones first).
///
/// Fails if `k == 0` or `k > n`.
pub fn batches(n: usize, k: usize) -> Result<Vec<Range<usize>>, ProtocolError> {
    if k == 0 || k > n {
        return Err(ProtocolError::BadBatches { n, k });
    }
    let (size, extra) = (n / k, n % k);
    let mut start = 0;
    Ok((0..k)
        .map(|b| {
            let end = start + size + usize::from(b < extra);
            let r = start..end;
            start = end;
            r
        })
        .collect())
}

/// Consecutive batches, one per run of equal `values` (a new batch wherever
/// the value changes from the row before): the batches of `--epoch-column`.
/// Values are compared exactly, so a run of `NaN`s is cut at every row.
pub fn runs(values: &[f64]) -> Vec<Range<usize>> {
    let mut cuts: Vec<usize> = (1..values.len()).filter(|&i| values[i] != values[i - 1]).collect();
    cuts.insert(0, 0);
    cuts.push(values.len());
    cuts.windows(2).filter(|w| w[0] < w[1]).map(|w| w[0]..w[1]).collect()
}

/// Train and test tables with the same features.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// The rows to learn from.
    pub train: Table,
    /// The held-out rows.
    pub test: Table,
}

impl Split {
    /// A split from two tables (e.g. a separate test file); their feature
    /// names must agree.
    pub fn new(train: Table, test: Table) -> Result<Split, ProtocolError> {
        if train.feature_names != test.feature_names {
            return Err(ProtocolError::FeatureMismatch {
                train: train.feature_names,
                test: test.feature_names,
            });
        }
        Ok(Split { train, test })
    }
}

/// Test = the rows of `table` in fold `k`, train = the rest, both in table order.
pub fn fold_split(table: &Table, k: i8) -> Result<Split, ProtocolError> {
    let folds = table.folds.as_ref().ok_or(ProtocolError::NoFolds)?;
    let (test, train): (Vec<usize>, Vec<usize>) = (0..table.n()).partition(|&i| folds[i] == k);
    if test.is_empty() {
        let mut available = folds.clone();
        available.sort_unstable();
        available.dedup();
        return Err(ProtocolError::EmptyFold { fold: k, available });
    }
    if train.is_empty() {
        return Err(ProtocolError::NoTrainRows { fold: k });
    }
    Ok(Split {
        train: table.select(&train),
        test: table.select(&test),
    })
}

/// Per-feature (and optionally target) shift and scale fitted on train data.
///
/// Uses the population standard deviation (divide by n); a constant column
/// gets its value as mean and scale 1, so it standardises to exactly zero. Without target scaling `y_mean = 0` and `y_std = 1`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Standardizer {
    /// Per-feature means.
    pub x_mean: DVector<f64>,
    /// Per-feature standard deviations (1 for constant features).
    pub x_std: DVector<f64>,
    /// Target mean (0 if the target is not scaled).
    pub y_mean: f64,
    /// Target standard deviation (1 if the target is not scaled or constant).
    pub y_std: f64,
    /// A multi-output model's target scaling `(mean, std)` per output, in
    /// output order (`(0, 1)` for count and class outputs); empty for a
    /// single-output model, whose target uses `y_mean`, `y_std`.
    #[serde(default)]
    pub y_by_output: Vec<(f64, f64)>,
}

/// Mean and population standard deviation; `(value, 1)` for a constant input
/// and `(0, 1)` for an empty one.
fn mean_std(v: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let (n, sum) = v.clone().fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    if n == 0 {
        return (0.0, 1.0);
    }
    let mean = sum / n as f64;
    let mut first = None;
    let mut constant = true;
    let mut ss = 0.0;
    for x in v {
        let f = *first.get_or_insert(x);
        constant &= x == f;
        ss += (x - mean) * (x - mean);
    }
    let std = (ss / n as f64).sqrt();
    match first {
        // Exactly the value, so a constant column becomes exactly zero.
        Some(f) if constant || std == 0.0 => (f, 1.0),
        _ => (mean, std),
    }
}

impl Standardizer {
    /// Fit on train features `x` (rows are records) and, if given, train targets `y`.
    pub fn fit(x: &DMatrix<f64>, y: Option<&[f64]>) -> Standardizer {
        let d = x.ncols();
        let mut x_mean = DVector::zeros(d);
        let mut x_std = DVector::from_element(d, 1.0);
        for j in 0..d {
            (x_mean[j], x_std[j]) = mean_std(x.column(j).iter().copied());
        }
        let (y_mean, y_std) = y.map_or((0.0, 1.0), |y| mean_std(y.iter().copied()));
        Standardizer {
            x_mean,
            x_std,
            y_mean,
            y_std,
            y_by_output: Vec::new(),
        }
    }

    /// `(x - mean) / std`, column by column.
    pub fn transform_x(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        let mut out = x.clone();
        for (j, mut col) in out.column_iter_mut().enumerate() {
            let (m, s) = (self.x_mean[j], self.x_std[j]);
            col.apply(|v| *v = (*v - m) / s);
        }
        out
    }

    /// `(y - y_mean) / y_std`.
    pub fn transform_y(&self, y: &[f64]) -> DVector<f64> {
        DVector::from_iterator(y.len(), y.iter().map(|v| (v - self.y_mean) / self.y_std))
    }

    /// Predictive means back on the original target scale: `m * y_std + y_mean`.
    pub fn inverse_y(&self, mean: &DVector<f64>) -> DVector<f64> {
        mean.map(|m| m * self.y_std + self.y_mean)
    }

    /// Predictive variances back on the original target scale: `v * y_std²`.
    pub fn inverse_y_var(&self, var: &DVector<f64>) -> DVector<f64> {
        var.map(|v| v * self.y_std * self.y_std)
    }
}

/// A stream's standardisation, fitted on its first epoch and fixed from then
/// on (no look-ahead): what `replay` and `serve` put between records and the
/// learner.
impl Standardizer {
    /// Fit on records with `d` features; the target too for a regression likelihood.
    /// A multi-output model's Gaussian and Student-t outputs are scaled each
    /// with the labels of its own records, as `eval` does.
    pub fn fit_records(records: &[Record], d: usize, likelihood: &Likelihood) -> Standardizer {
        let x = DMatrix::from_fn(records.len(), d, |i, j| records[i].features[j]);
        let regression = |l: &Likelihood| matches!(l, Likelihood::Gaussian { .. } | Likelihood::StudentT { .. });
        if let Likelihood::MultiOutput(multi) = likelihood {
            let mut scaling = Standardizer::fit(&x, None);
            scaling.y_by_output = (0..multi.n_outputs())
                .map(|o| match regression(&multi.outputs[o]) {
                    true => mean_std(records.iter().filter(|r| r.output == o).filter_map(|r| r.label)),
                    false => (0.0, 1.0),
                })
                .collect();
            return scaling;
        }
        let y: Vec<f64> = records.iter().filter_map(|r| r.label).collect();
        Standardizer::fit(&x, regression(likelihood).then_some(&y[..]))
    }

    /// The target's `(mean, std)` for output `d`.
    pub fn y_scaling(&self, d: usize) -> (f64, f64) {
        match self.y_by_output.is_empty() {
            true => (self.y_mean, self.y_std),
            // An output beyond the model: the learner refuses the record anyway.
            false => self.y_by_output.get(d).copied().unwrap_or((0.0, 1.0)),
        }
    }

    /// A record as the learner sees it: standardised features and target.
    pub fn record(&self, mut r: Record) -> Record {
        for (j, v) in r.features.iter_mut().enumerate() {
            *v = (*v - self.x_mean[j]) / self.x_std[j];
        }
        let (y_mean, y_std) = self.y_scaling(r.output);
        if y_std != 1.0 || y_mean != 0.0 {
            r.label = r.label.map(|y| (y - y_mean) / y_std);
        }
        r
    }

    /// A prediction back on the data's scale (its density too: per unit of
    /// `y`), every output's predictive on its own output's scale.
    pub fn prediction(&self, mut p: Prediction) -> Prediction {
        let (y_mean, y_std) = self.y_scaling(p.output.unwrap_or(0));
        if unscale(&mut p.predictive, y_mean, y_std) {
            p.log_density = p.log_density.map(|l| l - y_std.ln());
        }
        for (d, predictive) in p.all_outputs.iter_mut().enumerate() {
            let (y_mean, y_std) = self.y_scaling(d);
            unscale(predictive, y_mean, y_std);
        }
        p
    }
}

/// Moments back on the data's scale; whether `predictive` had moments.
fn unscale(predictive: &mut Predictive, y_mean: f64, y_std: f64) -> bool {
    match predictive {
        Predictive::Moments { mean, var } => {
            *mean = *mean * y_std + y_mean;
            *var *= y_std * y_std;
            true
        }
        Predictive::Classes(_) => false,
    }
}

/// Arrays ready for a learner: standardised, train rows in stream order, and
/// the train batches.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// Standardised train features, rows in the chosen order.
    pub x_train: DMatrix<f64>,
    /// Train targets in the same order (standardised if asked).
    pub y_train: DVector<f64>,
    /// Standardised test features, in table order.
    pub x_test: DMatrix<f64>,
    /// Test targets on the same scale as `y_train`.
    pub y_test: DVector<f64>,
    /// Consecutive row ranges of `x_train` / `y_train`, one per batch.
    pub batches: Vec<Range<usize>>,
    /// Ids of the rows of `x_train`.
    pub train_ids: Vec<i64>,
    /// Ids of the rows of `x_test`.
    pub test_ids: Vec<i64>,
    /// The output each train row observes, when the data has an `output` column.
    pub train_outputs: Option<Vec<i64>>,
    /// The output each test row observes, when the test data has an `output` column.
    pub test_outputs: Option<Vec<i64>>,
    /// Feature names, in column order.
    pub feature_names: Vec<String>,
    /// The scaling that was applied (to map predictions back).
    pub standardizer: Standardizer,
}

impl Prepared {
    /// The features and targets of batch `b`.
    ///
    /// # Panics
    /// If `b >= self.batches.len()`.
    pub fn batch(&self, b: usize) -> (DMatrixView<'_, f64>, DVectorView<'_, f64>) {
        let r = self.batches[b].clone();
        (self.x_train.rows_range(r.clone()), self.y_train.rows_range(r))
    }

    /// Number of train rows.
    pub fn n_train(&self) -> usize {
        self.x_train.nrows()
    }

    /// Number of test rows.
    pub fn n_test(&self) -> usize {
        self.x_test.nrows()
    }
}

/// Set up the protocol: fit the [`Standardizer`] on `split.train` (the target
/// too if `standardize_y`, i.e. for regression), order the train rows, and cut
/// them into `n_batches` batches.
pub fn prepare(split: &Split, order: &Order, n_batches: usize, standardize_y: bool) -> Result<Prepared, ProtocolError> {
    let (train, test) = (&split.train, &split.test);
    if train.feature_names != test.feature_names {
        return Err(ProtocolError::FeatureMismatch {
            train: train.feature_names.clone(),
            test: test.feature_names.clone(),
        });
    }
    let y_tr = train
        .labels
        .as_deref()
        .ok_or(ProtocolError::NoLabels { side: "train" })?;
    let y_te = test.labels.as_deref().ok_or(ProtocolError::NoLabels { side: "test" })?;
    let rows = order_rows(train, order)?;
    let batches = batches(rows.len(), n_batches)?;

    let standardizer = Standardizer::fit(&train.features, standardize_y.then_some(y_tr));
    let ordered = train.select(&rows);
    Ok(Prepared {
        x_train: standardizer.transform_x(&ordered.features),
        y_train: standardizer.transform_y(ordered.labels.as_deref().unwrap_or_default()),
        x_test: standardizer.transform_x(&test.features),
        y_test: standardizer.transform_y(y_te),
        batches,
        train_ids: ordered.ids,
        test_ids: test.ids.clone(),
        train_outputs: ordered.outputs.clone(),
        test_outputs: test.outputs.clone(),
        feature_names: train.feature_names.clone(),
        standardizer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Gaussian output's targets are scaled with its own records' labels
    /// (mean 2, sd 1 here), a Bernoulli output's are left as they are, and
    /// predictions go back to each output's own scale.
    #[test]
    fn a_multi_output_stream_scales_each_regression_output_by_its_own_labels() {
        let two = Likelihood::parse_outputs("gaussian,bernoulli", None).unwrap();
        let records = vec![
            Record::new(0, vec![0.0], Some(1.0)),
            Record::new(1, vec![1.0], Some(3.0)),
            Record::new(2, vec![2.0], Some(1.0)).with_output(1),
            Record::new(3, vec![3.0], Some(0.0)).with_output(1),
        ];
        let s = Standardizer::fit_records(&records, 1, &two);
        assert_eq!(s.y_by_output, [(2.0, 1.0), (0.0, 1.0)]);
        let labels: Vec<f64> = records.iter().map(|r| s.record(r.clone()).label.unwrap()).collect();
        assert_eq!(labels, [-1.0, 1.0, 1.0, 0.0]);

        let wide = Standardizer {
            y_by_output: vec![(2.0, 3.0), (0.0, 1.0)],
            ..s
        };
        let back = wide.prediction(Prediction {
            id: 0,
            epoch: 0,
            model_epoch: None,
            predictive: Predictive::Classes(vec![0.4, 0.6]),
            log_density: Some(-0.5),
            output: Some(1),
            all_outputs: vec![
                Predictive::Moments { mean: 1.0, var: 1.0 },
                Predictive::Classes(vec![0.4, 0.6]),
            ],
        });
        assert_eq!(back.log_density, Some(-0.5), "a class output's density is not rescaled");
        assert_eq!(back.all_outputs[0], Predictive::Moments { mean: 5.0, var: 9.0 });
        assert_eq!(back.all_outputs[1], Predictive::Classes(vec![0.4, 0.6]));
    }

    #[test]
    fn runs_cut_where_the_value_changes() {
        assert_eq!(runs(&[1.0, 1.0, 2.0, 2.0, 2.0, 1.0]), vec![0..2, 2..5, 5..6]);
        assert_eq!(runs(&[3.0]), vec![0..1]);
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn constant_columns_get_scale_one() {
        let x = DMatrix::from_row_slice(3, 2, &[1.0, 0.1, 2.0, 0.1, 3.0, 0.1]);
        let s = Standardizer::fit(&x, Some(&[5.0, 5.0, 5.0]));
        assert_eq!(s.x_std[1], 1.0);
        assert_eq!(s.x_mean[1], 0.1);
        assert!((s.x_std[0] - (2.0f64 / 3.0).sqrt()).abs() < 1e-15);
        assert_eq!((s.y_mean, s.y_std), (5.0, 1.0));
        let t = s.transform_x(&x);
        assert!(t.column(1).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn no_target_scaling_is_identity() {
        let x = DMatrix::from_row_slice(2, 1, &[1.0, 3.0]);
        let s = Standardizer::fit(&x, None);
        assert_eq!((s.y_mean, s.y_std), (0.0, 1.0));
        assert_eq!(s.transform_y(&[0.0, 1.0, 2.0]).as_slice(), &[0.0, 1.0, 2.0]);
    }
}
