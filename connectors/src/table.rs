//! A whole data set in memory (a Parquet or a CSV file): ids, folds, a
//! feature matrix and labels, read through the one column reader
//! ([`columns`](crate::columns)) that the streaming sources use too.
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

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::Schema;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use arrow::util::display::array_value_to_string;
use nalgebra::DMatrix;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use crate::columns::{feature_columns, first_unconverted, to_f64, to_i64, typed_column, Role, SchemaError};
pub use crate::columns::{Features, UnresolvedFeatures};
use crate::csv_input::CsvInput;
use crate::data_file::{DataFile, FileError};
use crate::parquet_check::next_batch;

/// Why a [`Table`] could not be read. Each message is one line saying what to change.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The file cannot be read as data.
    #[error(transparent)]
    File(#[from] FileError),
    /// The footer was read but the data pages could not be decoded.
    #[error("{}: cannot decode the data (corrupt or truncated file?): {source}; re-copy or re-export it", .path.display())]
    Read {
        /// The file asked for.
        path: PathBuf,
        /// The Arrow reader's reason.
        source: arrow::error::ArrowError,
    },
    /// The columns cannot make up records: one is missing or has a type its
    /// role does not take (the same rules as the streaming sources').
    #[error("{}: {source}; {}", .path.display(), .source.hint())]
    Schema {
        /// The file asked for.
        path: PathBuf,
        /// Which column, and why.
        source: SchemaError,
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
    /// An integer column's value does not fit its role (a fold beyond `i8`,
    /// an id beyond `i64`).
    #[error("{}: column `{column}` has value {value} at row {row} (0-based), which is not {expected}", .path.display())]
    OutOfRange {
        /// The file asked for.
        path: PathBuf,
        /// The column.
        column: String,
        /// The row (0-based, in file order).
        row: usize,
        /// The value found.
        value: String,
        /// What the role takes.
        expected: &'static str,
    },
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
    /// Columns of some other use (such as a second target read on its own)
    /// that a prefix or glob of features never matches, as it never matches
    /// the id, label, fold, task or output column.
    pub not_features: Vec<String>,
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
            not_features: Vec::new(),
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

/// The columns of a file that make up a [`Table`], resolved and type-checked.
struct TableColumns {
    id: String,
    features: Vec<String>,
    label: Option<String>,
    fold: Option<String>,
    task: Option<String>,
    output: Option<String>,
}

impl TableColumns {
    /// `spec`'s columns in `schema`, by the column reader's rules.
    fn resolve(spec: &ColumnSpec, schema: &Schema) -> Result<TableColumns, SchemaError> {
        let optional = |column: &Column, role: Role| -> Result<Option<String>, SchemaError> {
            match column {
                Column::Required(n) => typed_column(schema, n, role).map(|_| Some(n.clone())),
                Column::IfPresent(n) if schema.field_with_name(n).is_ok() => {
                    typed_column(schema, n, role).map(|_| Some(n.clone()))
                }
                Column::IfPresent(_) | Column::Skip => Ok(None),
            }
        };
        typed_column(schema, &spec.id, Role::Id)?;
        let mut others = vec![spec.id.as_str()];
        others.extend(
            [&spec.label, &spec.fold, &spec.task, &spec.output]
                .into_iter()
                .filter_map(Column::name),
        );
        others.extend(spec.not_features.iter().map(String::as_str));
        let features = feature_columns(&spec.features, schema, &others)?;
        Ok(TableColumns {
            id: spec.id.clone(),
            label: optional(&spec.label, Role::Target)?,
            fold: optional(&spec.fold, Role::Fold)?,
            task: optional(&spec.task, Role::Task)?,
            output: optional(&spec.output, Role::Output)?,
            features,
        })
    }

    /// Every column read.
    fn names(&self) -> Vec<&str> {
        let mut names = vec![self.id.as_str()];
        names.extend(self.features.iter().map(String::as_str));
        names.extend(
            [&self.label, &self.fold, &self.task, &self.output]
                .into_iter()
                .flatten()
                .map(String::as_str),
        );
        names
    }
}

/// The rows read so far, column by column.
struct Accumulated<'c> {
    columns: &'c TableColumns,
    path: &'c Path,
    ids: Vec<i64>,
    folds: Option<Vec<i8>>,
    tasks: Option<Vec<i64>>,
    outputs: Option<Vec<i64>>,
    labels: Option<Vec<f64>>,
    features: Vec<Vec<f64>>,
    /// Rows before the next batch.
    offset: usize,
}

impl<'c> Accumulated<'c> {
    fn new(columns: &'c TableColumns, path: &'c Path, rows: usize) -> Self {
        fn with<T>(column: &Option<String>, rows: usize) -> Option<Vec<T>> {
            column.as_ref().map(|_| Vec::with_capacity(rows))
        }
        Accumulated {
            ids: Vec::with_capacity(rows),
            folds: with(&columns.fold, rows),
            tasks: with(&columns.task, rows),
            outputs: with(&columns.output, rows),
            labels: with(&columns.label, rows),
            features: columns.features.iter().map(|_| Vec::with_capacity(rows)).collect(),
            offset: 0,
            columns,
            path,
        }
    }

    /// Column `name` of `batch`, refused if it holds a null.
    fn column(&self, batch: &RecordBatch, name: &str) -> Result<ArrayRef, TableError> {
        let array = batch.column_by_name(name).ok_or_else(|| TableError::Read {
            path: self.path.to_owned(),
            source: ArrowError::SchemaError(format!("a batch without column `{name}`")),
        })?;
        if let Some(row) = (array.null_count() > 0)
            .then(|| (0..array.len()).find(|&i| array.is_null(i)))
            .flatten()
        {
            return Err(TableError::Null {
                path: self.path.to_owned(),
                column: name.to_owned(),
                row: self.offset + row,
            });
        }
        Ok(array.clone())
    }

    fn read_err(&self) -> impl Fn(ArrowError) -> TableError + '_ {
        |source| TableError::Read {
            path: self.path.to_owned(),
            source,
        }
    }

    /// Column `name` as `f64`.
    fn numbers(&self, batch: &RecordBatch, name: &str) -> Result<Vec<f64>, TableError> {
        let raw = self.column(batch, name)?;
        Ok(to_f64(&raw).map_err(self.read_err())?.values().to_vec())
    }

    /// Column `name` as `i64`, each value checked by `fits`.
    fn integers(
        &self,
        batch: &RecordBatch,
        name: &str,
        expected: &'static str,
        fits: impl Fn(i64) -> bool,
    ) -> Result<Vec<i64>, TableError> {
        let raw = self.column(batch, name)?;
        let values = to_i64(&raw).map_err(self.read_err())?;
        let bad = first_unconverted(&raw, &values).or_else(|| values.values().iter().position(|&v| !fits(v)));
        if let Some(row) = bad {
            return Err(TableError::OutOfRange {
                path: self.path.to_owned(),
                column: name.to_owned(),
                row: self.offset + row,
                value: array_value_to_string(&raw, row).unwrap_or_default(),
                expected,
            });
        }
        Ok(values.values().to_vec())
    }

    fn push(&mut self, batch: &RecordBatch) -> Result<(), TableError> {
        let c = self.columns;
        let ids = self.integers(batch, &c.id, "an id in the range of int64", |_| true)?;
        self.ids.extend(ids);
        if let Some(name) = &c.fold {
            let folds = self.integers(batch, name, "a fold number in -128..=127", |v| i8::try_from(v).is_ok())?;
            if let Some(out) = self.folds.as_mut() {
                out.extend(folds.into_iter().map(|v| v as i8));
            }
        }
        if let Some(name) = &c.task {
            let tasks = self.integers(batch, name, "a task number in the range of int64", |_| true)?;
            self.tasks.get_or_insert_default().extend(tasks);
        }
        if let Some(name) = &c.output {
            let outputs = self.integers(batch, name, "an output index in the range of int64", |_| true)?;
            self.outputs.get_or_insert_default().extend(outputs);
        }
        for (k, name) in c.features.iter().enumerate() {
            let values = self.numbers(batch, name)?;
            self.features[k].extend(values);
        }
        if let Some(name) = &c.label {
            let labels = self.numbers(batch, name)?;
            self.labels.get_or_insert_default().extend(labels);
        }
        self.offset += batch.num_rows();
        Ok(())
    }

    fn finish(self, metadata: BTreeMap<String, String>) -> Table {
        let (n, d) = (self.ids.len(), self.features.len());
        Table {
            features: DMatrix::from_iterator(n, d, self.features.into_iter().flatten()),
            feature_names: self.columns.features.clone(),
            ids: self.ids,
            folds: self.folds,
            tasks: self.tasks,
            outputs: self.outputs,
            labels: self.labels,
            metadata,
        }
    }
}

/// Batches of a file's selected columns, however the file is stored.
type Batches = Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>>>;

/// An opened data file: its schema, its metadata, and how to read it.
enum Opened {
    Parquet(ParquetRecordBatchReaderBuilder<File>),
    Csv(CsvInput),
}

impl Opened {
    fn open(path: &Path) -> Result<Opened, TableError> {
        Ok(match DataFile::open(path)? {
            DataFile::Parquet { file, metadata } => {
                Opened::Parquet(ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata))
            }
            DataFile::Csv(csv) => Opened::Csv(csv),
        })
    }

    fn schema(&self) -> &Schema {
        match self {
            Opened::Parquet(builder) => builder.schema(),
            Opened::Csv(csv) => csv.schema(),
        }
    }

    /// The file's key-value metadata (CSV has none).
    fn metadata(&self) -> BTreeMap<String, String> {
        let Opened::Parquet(builder) = self else {
            return BTreeMap::new();
        };
        let pairs = builder.metadata().file_metadata().key_value_metadata();
        pairs
            .map(|kvs| {
                kvs.iter()
                    .filter(|kv| kv.key != "ARROW:schema")
                    .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// About how many rows there are: only a capacity hint (a damaged
    /// footer may claim any count).
    fn rows_hint(&self) -> usize {
        let rows = match self {
            Opened::Parquet(builder) => u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0),
            Opened::Csv(csv) => csv.rows(),
        };
        usize::try_from(rows).map_or(0, |n| n.min(1 << 20))
    }

    /// The rows of `columns` only, batch by batch.
    fn batches(self, path: &Path, columns: &[&str]) -> Result<Batches, TableError> {
        match self {
            Opened::Parquet(builder) => {
                let schema = builder.schema().clone();
                let roots = (0..schema.fields().len()).filter(|&i| columns.contains(&schema.field(i).name().as_str()));
                let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
                let mut reader = builder
                    .with_projection(mask)
                    .build()
                    .map_err(|source| FileError::NotParquet {
                        path: path.to_owned(),
                        source,
                    })?;
                Ok(Box::new(std::iter::from_fn(move || next_batch(&mut reader))))
            }
            Opened::Csv(csv) => {
                let reader = csv.batches(columns, 8192).map_err(|source| FileError::NotCsv {
                    path: path.to_owned(),
                    source,
                })?;
                Ok(Box::new(reader))
            }
        }
    }
}

impl Table {
    /// Read the columns `spec` names from the file at `path`: Parquet, or
    /// CSV with a header row when the name ends in `.csv`.
    pub fn read(path: impl AsRef<Path>, spec: &ColumnSpec) -> Result<Table, TableError> {
        let path = path.as_ref();
        let opened = Opened::open(path)?;
        let columns = TableColumns::resolve(spec, opened.schema()).map_err(|source| TableError::Schema {
            path: path.to_owned(),
            source,
        })?;
        let (metadata, rows) = (opened.metadata(), opened.rows_hint());
        let csv = matches!(opened, Opened::Csv(_));
        let mut read = Accumulated::new(&columns, path, rows);
        for batch in opened.batches(path, &columns.names())? {
            let batch = batch.map_err(|source| match csv {
                true => FileError::NotCsv {
                    path: path.to_owned(),
                    source,
                }
                .into(),
                false => TableError::Read {
                    path: path.to_owned(),
                    source,
                },
            })?;
            read.push(&batch)?;
        }
        Ok(read.finish(metadata))
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
