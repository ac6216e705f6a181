//! A whole Parquet data set in memory: ids, folds, a feature matrix and labels.
//!
//! ```no_run
//! use dualgp_connectors::{ColumnSpec, Table};
//! let table = Table::read("../shared/data/elevators.parquet", &ColumnSpec::default())?;
//! assert_eq!(table.d(), 18);
//! # Ok::<(), dualgp_connectors::TableError>(())
//! ```

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, Schema};
use nalgebra::DMatrix;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use serde::{Deserialize, Serialize};

use crate::parquet_check::{check_chunks, next_batch};

/// Why a [`Table`] could not be read. Each message is one line saying what to change.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The file could not be opened.
    #[error("cannot open {}: {source}; check the path (data sets live in shared/data)", .path.display())]
    Open {
        /// The file asked for.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The file is not Parquet, or its footer is missing (a truncated file).
    #[error("{} is not a valid Parquet file (truncated, or another format): {source}; re-copy or re-export it", .path.display())]
    NotParquet {
        /// The file asked for.
        path: PathBuf,
        /// The Parquet reader's reason.
        source: parquet::errors::ParquetError,
    },
    /// The footer was read but the data pages could not be decoded.
    #[error("{}: cannot decode the data (corrupt or truncated file?): {source}; re-copy or re-export it", .path.display())]
    Read {
        /// The file asked for.
        path: PathBuf,
        /// The Arrow reader's reason.
        source: arrow::error::ArrowError,
    },
    /// A column named in the [`ColumnSpec`] is not in the file.
    #[error("{}: no column `{column}`; the file has columns: {}", .path.display(), .available.join(", "))]
    MissingColumn {
        /// The file asked for.
        path: PathBuf,
        /// The column asked for.
        column: String,
        /// The columns the file has.
        available: Vec<String>,
    },
    /// No feature columns were selected.
    #[error("{}: no feature columns {wanted}; the file has columns: {}", .path.display(), .available.join(", "))]
    NoFeatures {
        /// The file asked for.
        path: PathBuf,
        /// What was looked for, e.g. "named x<N>".
        wanted: String,
        /// The columns the file has.
        available: Vec<String>,
    },
    /// A column has a type that cannot be used for its role.
    #[error("{}: column `{column}` has type {found}, expected {expected}; convert it or select another column", .path.display())]
    WrongType {
        /// The file asked for.
        path: PathBuf,
        /// The column.
        column: String,
        /// Its Arrow type.
        found: DataType,
        /// The accepted types.
        expected: &'static str,
    },
    /// A feature, label, id or fold value is null.
    #[error("{}: column `{column}` has a null at row {row} (0-based); fill or drop missing values first", .path.display())]
    Null {
        /// The file asked for.
        path: PathBuf,
        /// The column.
        column: String,
        /// The row (0-based, in file order).
        row: usize,
    },
    /// A fold value does not fit in `i8`.
    #[error("{}: column `{column}` has value {value} at row {row} (0-based), which is not a fold number in -128..=127", .path.display())]
    BadFold {
        /// The file asked for.
        path: PathBuf,
        /// The column.
        column: String,
        /// The row (0-based, in file order).
        row: usize,
        /// The value found.
        value: i64,
    },
}

/// How to choose the feature columns.
///
/// In TOML: `features = { prefix = "x" }` or `features = { names = ["a", "b"] }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Features {
    /// Every column named `PREFIX<N>` (N decimal digits), ordered by N
    /// numerically (`x2` before `x10`).
    Prefix(String),
    /// Exactly these columns, in this order.
    Names(Vec<String>),
}

/// Why [`Features::resolve`] found no usable feature columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnresolvedFeatures {
    /// `Names` was an empty list.
    Empty,
    /// A named column is not there.
    Missing(String),
    /// No column is called `PREFIX<N>`.
    NoneWithPrefix(String),
}

impl UnresolvedFeatures {
    /// What was looked for, for an error message.
    pub fn wanted(&self) -> String {
        match self {
            UnresolvedFeatures::Empty => "(the list of feature names is empty)".into(),
            UnresolvedFeatures::Missing(name) => format!("named {name}"),
            UnresolvedFeatures::NoneWithPrefix(prefix) => format!("named {prefix}<N> (e.g. {prefix}0, {prefix}1)"),
        }
    }
}

impl Features {
    /// The feature columns among `available`, in feature order.
    pub fn resolve(&self, available: &[&str]) -> Result<Vec<String>, UnresolvedFeatures> {
        match self {
            Features::Names(names) => {
                if names.is_empty() {
                    return Err(UnresolvedFeatures::Empty);
                }
                if let Some(m) = names.iter().find(|n| !available.contains(&n.as_str())) {
                    return Err(UnresolvedFeatures::Missing(m.clone()));
                }
                Ok(names.clone())
            }
            Features::Prefix(prefix) => {
                let mut found: Vec<(u128, &str)> = available
                    .iter()
                    .filter_map(|&name| Some((prefixed_index(prefix, name)?, name)))
                    .collect();
                found.sort();
                if found.is_empty() {
                    return Err(UnresolvedFeatures::NoneWithPrefix(prefix.clone()));
                }
                Ok(found.into_iter().map(|(_, n)| n.to_owned()).collect())
            }
        }
    }
}

/// `N` when `name` is `PREFIX<N>` with N decimal digits (huge N sorts last).
pub(crate) fn prefixed_index(prefix: &str, name: &str) -> Option<u128> {
    let rest = name.strip_prefix(prefix)?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(rest.parse::<u128>().unwrap_or(u128::MAX))
}

/// Whether a column is read, and whether it must be there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Column {
    /// Read it; a file without it is an error.
    Required(String),
    /// Read it if the file has it.
    IfPresent(String),
    /// Do not read it.
    Skip,
}

impl Column {
    /// The column's name, unless skipped.
    pub fn name(&self) -> Option<&str> {
        match self {
            Column::Required(n) | Column::IfPresent(n) => Some(n),
            Column::Skip => None,
        }
    }
}

/// Which columns of a file make up a [`Table`].
///
/// The default is the project's data layout: id `id`, features `x0, x1, …`,
/// label `y` (required), fold `fold` (if present).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnSpec {
    /// The record id column (integer, required).
    pub id: String,
    /// The feature columns.
    pub features: Features,
    /// The label column.
    pub label: Column,
    /// The fold column (integer fitting in `i8`).
    pub fold: Column,
    /// The task column (integer; which task of a continual-learning stream a
    /// record belongs to, for per-task evaluation).
    pub task: Column,
    /// The output column (integer; which output of a multi-output model a
    /// record observes, 0..D−1). A file without it observes output 0.
    pub output: Column,
}

impl Default for ColumnSpec {
    fn default() -> Self {
        ColumnSpec {
            id: "id".into(),
            features: Features::Prefix("x".into()),
            label: Column::Required("y".into()),
            fold: Column::IfPresent("fold".into()),
            task: Column::IfPresent("task".into()),
            output: Column::IfPresent("output".into()),
        }
    }
}

impl ColumnSpec {
    /// Use exactly these feature columns, in this order.
    pub fn with_features<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.features = Features::Names(names.into_iter().map(Into::into).collect());
        self
    }

    /// Use every column `PREFIX<N>` as a feature, ordered by N.
    pub fn with_feature_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.features = Features::Prefix(prefix.into());
        self
    }

    /// Set the label column.
    pub fn with_label(mut self, label: Column) -> Self {
        self.label = label;
        self
    }

    /// Set the fold column.
    pub fn with_fold(mut self, fold: Column) -> Self {
        self.fold = fold;
        self
    }

    /// Set the id column.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
}

/// A data set held in memory: one row per record, in file order unless
/// [`Table::select`]ed.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// Record ids.
    pub ids: Vec<i64>,
    /// Fold of each record, when the file has a fold column.
    pub folds: Option<Vec<i8>>,
    /// Task of each record, when the file has a task column.
    pub tasks: Option<Vec<i64>>,
    /// Output of each record, when the file has an output column.
    pub outputs: Option<Vec<i64>>,
    /// Features, n × d (rows are records).
    pub features: DMatrix<f64>,
    /// Names of the feature columns, in matrix column order.
    pub feature_names: Vec<String>,
    /// Labels (integer class labels converted to `f64`), when read.
    pub labels: Option<Vec<f64>>,
    /// The file's key-value metadata (without Arrow's own `ARROW:schema` entry).
    pub metadata: BTreeMap<String, String>,
}

/// What a selected column is used for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Id,
    Fold,
    Task,
    Output,
    Feature,
    Label,
}

impl Role {
    fn expected(self) -> &'static str {
        match self {
            Role::Id | Role::Fold | Role::Task | Role::Output => "an integer type (int8/16/32/64 or uint8/16/32)",
            Role::Feature | Role::Label => "int32, int64, float32 or float64",
        }
    }

    fn accepts(self, t: &DataType) -> bool {
        use DataType::*;
        match self {
            Role::Id | Role::Fold | Role::Task | Role::Output => {
                matches!(t, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32)
            }
            Role::Feature | Role::Label => matches!(t, Int32 | Int64 | Float32 | Float64),
        }
    }
}

impl Table {
    /// Read the columns `spec` names from the Parquet file at `path`.
    pub fn read(path: impl AsRef<Path>, spec: &ColumnSpec) -> Result<Table, TableError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| TableError::Open {
            path: path.to_owned(),
            source,
        })?;
        let file_len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
        let not_parquet = |source| TableError::NotParquet {
            path: path.to_owned(),
            source,
        };
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(not_parquet)?;
        check_chunks(builder.metadata(), file_len).map_err(not_parquet)?;

        let metadata = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .map(|kvs| {
                kvs.iter()
                    .filter(|kv| kv.key != "ARROW:schema")
                    .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();

        let schema = builder.schema().clone();
        let available: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let missing = |column: &str| TableError::MissingColumn {
            path: path.to_owned(),
            column: column.to_owned(),
            available: available.clone(),
        };
        let has = |name: &str| available.iter().any(|a| a == name);

        // Decide which columns to read.
        let names: Vec<&str> = available.iter().map(String::as_str).collect();
        let feature_names = spec.features.resolve(&names).map_err(|e| match e {
            UnresolvedFeatures::Missing(column) => missing(&column),
            other => TableError::NoFeatures {
                path: path.to_owned(),
                wanted: other.wanted(),
                available: available.clone(),
            },
        })?;
        if !has(&spec.id) {
            return Err(missing(&spec.id));
        }
        let optional = |c: &Column| -> Result<Option<String>, TableError> {
            match c {
                Column::Required(n) if !has(n) => Err(missing(n)),
                Column::Required(n) => Ok(Some(n.clone())),
                Column::IfPresent(n) => Ok(has(n).then(|| n.clone())),
                Column::Skip => Ok(None),
            }
        };
        let label = optional(&spec.label)?;
        let fold = optional(&spec.fold)?;
        let task = optional(&spec.task)?;
        let output = optional(&spec.output)?;

        let mut wanted: Vec<(&str, Role)> = vec![(spec.id.as_str(), Role::Id)];
        if let Some(f) = &fold {
            wanted.push((f, Role::Fold));
        }
        if let Some(t) = &task {
            wanted.push((t, Role::Task));
        }
        if let Some(o) = &output {
            wanted.push((o, Role::Output));
        }
        wanted.extend(feature_names.iter().map(|n| (n.as_str(), Role::Feature)));
        if let Some(l) = &label {
            wanted.push((l, Role::Label));
        }
        for &(name, role) in &wanted {
            check_type(path, &schema, name, role)?;
        }

        // Read only those columns, batch by batch.
        let roots: Vec<usize> = available
            .iter()
            .enumerate()
            .filter(|(_, a)| wanted.iter().any(|(w, _)| w == a))
            .map(|(i, _)| i)
            .collect();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        // Only a capacity hint: a damaged footer may claim any count.
        let n_rows = usize::try_from(builder.metadata().file_metadata().num_rows()).map_or(0, |n| n.min(1 << 20));
        let mut reader = builder
            .with_projection(mask)
            .build()
            .map_err(|source| TableError::NotParquet {
                path: path.to_owned(),
                source,
            })?;

        let mut ids: Vec<i64> = Vec::with_capacity(n_rows);
        let mut folds: Option<Vec<i8>> = fold.as_ref().map(|_| Vec::with_capacity(n_rows));
        let mut tasks: Option<Vec<i64>> = task.as_ref().map(|_| Vec::with_capacity(n_rows));
        let mut outputs: Option<Vec<i64>> = output.as_ref().map(|_| Vec::with_capacity(n_rows));
        let mut labels: Option<Vec<f64>> = label.as_ref().map(|_| Vec::with_capacity(n_rows));
        let mut columns: Vec<Vec<f64>> = feature_names.iter().map(|_| Vec::with_capacity(n_rows)).collect();
        let mut offset = 0usize;
        while let Some(batch) = next_batch(&mut reader) {
            let batch = batch.map_err(|source| TableError::Read {
                path: path.to_owned(),
                source,
            })?;
            let col = |name: &str| -> Result<ArrayRef, TableError> {
                let array = batch.column_by_name(name).ok_or_else(|| missing(name))?;
                if let Some(i) = (array.null_count() > 0)
                    .then(|| (0..array.len()).find(|&i| array.is_null(i)))
                    .flatten()
                {
                    return Err(TableError::Null {
                        path: path.to_owned(),
                        column: name.to_owned(),
                        row: offset + i,
                    });
                }
                Ok(array.clone())
            };
            let read_err = |source| TableError::Read {
                path: path.to_owned(),
                source,
            };

            let id = cast(&col(&spec.id)?, &DataType::Int64).map_err(read_err)?;
            ids.extend_from_slice(id.as_primitive::<Int64Type>().values());
            if let (Some(name), Some(folds)) = (&fold, folds.as_mut()) {
                let f = cast(&col(name)?, &DataType::Int64).map_err(read_err)?;
                for (i, &v) in f.as_primitive::<Int64Type>().values().iter().enumerate() {
                    folds.push(i8::try_from(v).map_err(|_| TableError::BadFold {
                        path: path.to_owned(),
                        column: name.clone(),
                        row: offset + i,
                        value: v,
                    })?);
                }
            }
            if let (Some(name), Some(tasks)) = (&task, tasks.as_mut()) {
                let t = cast(&col(name)?, &DataType::Int64).map_err(read_err)?;
                tasks.extend_from_slice(t.as_primitive::<Int64Type>().values());
            }
            if let (Some(name), Some(outputs)) = (&output, outputs.as_mut()) {
                let o = cast(&col(name)?, &DataType::Int64).map_err(read_err)?;
                outputs.extend_from_slice(o.as_primitive::<Int64Type>().values());
            }
            for (name, out) in feature_names.iter().zip(columns.iter_mut()) {
                let f = cast(&col(name)?, &DataType::Float64).map_err(read_err)?;
                out.extend_from_slice(f.as_primitive::<Float64Type>().values());
            }
            if let (Some(name), Some(labels)) = (&label, labels.as_mut()) {
                let f = cast(&col(name)?, &DataType::Float64).map_err(read_err)?;
                labels.extend_from_slice(f.as_primitive::<Float64Type>().values());
            }
            offset += batch.num_rows();
        }

        let n = ids.len();
        let d = feature_names.len();
        let features = DMatrix::from_iterator(n, d, columns.into_iter().flatten());
        Ok(Table {
            ids,
            folds,
            tasks,
            outputs,
            features,
            feature_names,
            labels,
            metadata,
        })
    }

    /// Number of records (rows).
    pub fn n(&self) -> usize {
        self.ids.len()
    }

    /// Number of features (columns of [`Table::features`]).
    pub fn d(&self) -> usize {
        self.features.ncols()
    }

    /// The matrix column of the feature called `name`.
    pub fn feature_index(&self, name: &str) -> Option<usize> {
        self.feature_names.iter().position(|f| f == name)
    }

    /// The rows `rows`, in that order (repeats allowed).
    ///
    /// # Panics
    /// If a row index is `>= self.n()`.
    pub fn select(&self, rows: &[usize]) -> Table {
        Table {
            ids: rows.iter().map(|&r| self.ids[r]).collect(),
            folds: self.folds.as_ref().map(|f| rows.iter().map(|&r| f[r]).collect()),
            tasks: self.tasks.as_ref().map(|t| rows.iter().map(|&r| t[r]).collect()),
            outputs: self.outputs.as_ref().map(|o| rows.iter().map(|&r| o[r]).collect()),
            features: self.features.select_rows(rows),
            feature_names: self.feature_names.clone(),
            labels: self.labels.as_ref().map(|l| rows.iter().map(|&r| l[r]).collect()),
            metadata: self.metadata.clone(),
        }
    }
}

fn check_type(path: &Path, schema: &Schema, name: &str, role: Role) -> Result<(), TableError> {
    // The caller has checked that the column exists.
    let Ok(field) = schema.field_with_name(name) else {
        return Ok(());
    };
    if role.accepts(field.data_type()) {
        Ok(())
    } else {
        Err(TableError::WrongType {
            path: path.to_owned(),
            column: name.to_owned(),
            found: field.data_type().clone(),
            expected: role.expected(),
        })
    }
}

/// The project's `shared/` folder (data sets in `shared/data`), if it can be found.
///
/// The path of `file` in `shared/data`, or a message saying how to make it found.
pub fn shared_data(file: &str) -> Result<PathBuf, String> {
    let shared = shared_dir().ok_or(
        "cannot find shared/ (the data sets): set DUALGP_SHARED=/path/to/shared or put shared/ beside the repository",
    )?;
    let path = shared.join("data").join(file);
    if !path.is_file() {
        return Err(format!(
            "data file {} is missing; is DUALGP_SHARED right?",
            path.display()
        ));
    }
    Ok(path)
}

/// `$DUALGP_SHARED` if set; otherwise the first existing of `../shared` and
/// `../../shared` beside this crate's source, then `../shared` from the
/// current directory.
pub fn shared_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DUALGP_SHARED").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut candidates = vec![manifest.join("../shared"), manifest.join("../../shared")];
    if let Ok(cwd) = std::env::current_dir() {
        candidates.push(cwd.join("../shared"));
    }
    candidates
        .into_iter()
        .find(|c| c.is_dir())
        .map(|c| c.canonicalize().unwrap_or(c))
}
