//! A Parquet file as a stream of epochs, read one row group at a time; or a
//! CSV file (a path ending in `.csv`, see [`csv_input`](crate::csv_input)),
//! whose rows are cut into groups of `batch_rows` rows that play the part
//! of row groups (every worker parses the file, and keeps its groups).
//!
//! Row groups are dealt round-robin to workers ([`WorkerShare::owns`]);
//! epochs are global (rows `[k·B, (k+1)·B)` in file order, or event-time
//! windows), so every worker yields its part of the same epochs whatever
//! the number of workers. Memory stays at about one decoded batch plus one
//! epoch of records: the file is never read whole.
//!
//! ```no_run
//! use dualgp_connectors::{ParquetSource, ParquetSourceConfig, WorkerShare};
//! let config = ParquetSourceConfig::default(); // epochs of 1000 rows, columns id, x0.., y
//! let mut source = ParquetSource::open("../shared/data/bike.parquet", &config, WorkerShare::ALONE, None)?;
//! while let Some(part) = source.next_epoch()? {
//!     println!("epoch {}: {} records, {} dead letters", part.epoch, part.records.len(), part.dead_letters.len());
//! }
//! # Ok::<(), dualgp_connectors::SourceError>(())
//! ```

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::Array;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::arrow::ProjectionMask;
use serde::{Deserialize, Serialize};

use crate::arrow_decode::{event_seconds, ArrowDecoder, DecodedRow};
use crate::csv_input::CsvInput;
use crate::data_file::{DataFile, FileError};
use crate::dead_letter::{number_text, Counters, DeadLetter, Origin, Reason};
use crate::epoch::{EpochPart, WorkerShare};
use crate::error::SourceError;
use crate::mapping::ColumnMapping;
use crate::parquet_check::next_batch;

/// How a stream is cut into epochs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpochRule {
    /// Epoch k holds rows `[k·n, (k+1)·n)` in file order.
    Rows(u64),
    /// Epoch k is the event-time window `[origin + k·width, origin + (k+1)·width)`
    /// (times before `origin` fall in epoch 0). Epoch numbers skip empty
    /// windows. A row whose window is earlier than that of a row before it in
    /// file order is late: it goes to the dead letters of the later window.
    EventTime {
        /// A window's length, in event-time units.
        width: f64,
        /// Where window 0 starts.
        #[serde(default)]
        origin: f64,
    },
}

/// How to read a Parquet file as a stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParquetSourceConfig {
    /// Which columns make a record.
    pub mapping: ColumnMapping,
    /// How rows are cut into epochs.
    pub epochs: EpochRule,
    /// Rows decoded at a time (bounds memory together with the epoch size).
    pub batch_rows: usize,
}

impl Default for ParquetSourceConfig {
    fn default() -> Self {
        ParquetSourceConfig {
            mapping: ColumnMapping::default(),
            epochs: EpochRule::Rows(1000),
            batch_rows: 8192,
        }
    }
}

/// Where to resume: every epoch before `next_epoch` has been processed.
///
/// The same for every worker count, so a checkpoint taken with 2 workers
/// resumes with 4. Positions order by `next_epoch`: the one to checkpoint
/// is the smallest over the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ParquetPosition {
    /// The first epoch not yet processed.
    pub next_epoch: u64,
    /// With [`EpochRule::Rows`]: rows in the epochs before `next_epoch`,
    /// checked on resume (a different file or epoch size is refused).
    pub rows_before: Option<u64>,
}

/// One of this worker's row groups.
#[derive(Clone, Copy, Debug)]
struct GroupSpan {
    index: usize,
    first_row: u64,
    rows: u64,
}

/// The row group being read and the global row of its next batch.
struct OpenGroup {
    reader: GroupReader,
    index: usize,
    next_row: u64,
}

/// One row group's batches.
enum GroupReader {
    Parquet(ParquetRecordBatchReader),
    /// A CSV group is one batch.
    Csv(Option<RecordBatch>),
}

impl GroupReader {
    fn next(&mut self) -> Option<Result<RecordBatch, ArrowError>> {
        match self {
            GroupReader::Parquet(reader) => next_batch(reader),
            GroupReader::Csv(batch) => batch.take().map(Ok),
        }
    }
}

/// Where the rows come from.
enum Input {
    Parquet {
        file: File,
        metadata: ArrowReaderMetadata,
        projection: ProjectionMask,
    },
    /// The file parsed in order, a group (a batch of `batch_rows` rows) at a
    /// time; groups of other workers are parsed and dropped.
    Csv {
        reader: Box<arrow::csv::Reader<File>>,
        /// The group the reader's next batch is.
        next_group: usize,
    },
}

/// State of [`EpochRule::EventTime`] reading.
struct Windows {
    width: f64,
    origin: f64,
    /// Per row group: the largest event time of all earlier row groups
    /// (from the footer's statistics), so every worker knows what came before.
    max_before_group: Option<Vec<Option<f64>>>,
    /// Largest event time seen so far in file order.
    watermark: Option<f64>,
    /// Decoded rows with their epochs, not yet handed out (at most one batch).
    carry: VecDeque<(u64, Result<DecodedRow, DeadLetter>)>,
}

impl Windows {
    fn window(&self, t: f64) -> u64 {
        let w = ((t - self.origin) / self.width).floor();
        if w > 0.0 {
            w as u64
        } else {
            0
        }
    }
}

/// A worker's reader of one Parquet file, epoch by epoch.
pub struct ParquetSource {
    path: PathBuf,
    name: String,
    input: Input,
    decoder: ArrowDecoder,
    batch_rows: usize,
    epoch_rows: Option<u64>,
    n_rows: u64,
    groups: VecDeque<GroupSpan>,
    open: Option<OpenGroup>,
    /// A batch (or its tail) read but belonging to a later epoch.
    pending: Option<(u64, RecordBatch)>,
    next_epoch: u64,
    /// Epochs before this one were processed before a resume: skip them.
    resume_epoch: u64,
    windows: Option<Windows>,
    counters: Counters,
}

impl ParquetSource {
    /// Open `path` for worker `share`, resuming after `resume` if given.
    /// A missing or mistyped column is an error here, before any row is read.
    pub fn open(
        path: impl AsRef<Path>,
        config: &ParquetSourceConfig,
        share: WorkerShare,
        resume: Option<ParquetPosition>,
    ) -> Result<ParquetSource, SourceError> {
        let path = path.as_ref().to_owned();
        let name = path.display().to_string();
        check_config(config, share)?;
        let opened = DataFile::open(&path)?;
        let schema = match &opened {
            DataFile::Parquet { metadata, .. } => metadata.schema().clone(),
            DataFile::Csv(csv) => csv.schema().clone(),
        };
        let decoder = ArrowDecoder::new(&config.mapping, &schema).map_err(|source| SourceError::Schema {
            input: name.clone(),
            source,
        })?;
        let wanted = decoder.columns();
        let all_groups = opened.groups(config.batch_rows);
        let n_rows = all_groups.last().map_or(0, |g| g.first_row + g.rows);
        let max_before_group = match config.epochs {
            EpochRule::Rows(_) => None,
            EpochRule::EventTime { .. } => {
                opened.watermarks(&decoder, &config.mapping, share, &name, config.batch_rows)?
            }
        };
        let input = match opened {
            DataFile::Parquet { file, metadata } => {
                let roots = (0..schema.fields().len()).filter(|&i| wanted.contains(&schema.field(i).name().as_str()));
                let projection = ProjectionMask::roots(metadata.parquet_schema(), roots);
                Input::Parquet {
                    file,
                    metadata,
                    projection,
                }
            }
            DataFile::Csv(csv) => Input::Csv {
                reader: Box::new(
                    csv.batches(&wanted, config.batch_rows)
                        .map_err(|source| FileError::NotCsv {
                            path: path.clone(),
                            source,
                        })?,
                ),
                next_group: 0,
            },
        };

        let (epoch_rows, windows) = match config.epochs {
            EpochRule::Rows(n) => (Some(n), None),
            EpochRule::EventTime { width, origin } => {
                let windows = Windows {
                    width,
                    origin,
                    max_before_group,
                    watermark: None,
                    carry: VecDeque::new(),
                };
                (None, Some(windows))
            }
        };

        let resume_epoch = match resume {
            None => 0,
            Some(p) => {
                if let Some(n) = epoch_rows {
                    let expected = p.next_epoch.saturating_mul(n).min(n_rows);
                    if p.rows_before != Some(expected) {
                        return Err(SourceError::Position {
                            input: name,
                            position: format!("{p:?}"),
                            why: format!(
                                "with epochs of {n} rows, epoch {} starts at row {expected} of {n_rows}; \
                                 the position was taken with another epoch size or another file",
                                p.next_epoch
                            ),
                        });
                    }
                }
                p.next_epoch
            }
        };
        let start_row = epoch_rows.map_or(0, |n| resume_epoch.saturating_mul(n).min(n_rows));
        let groups = all_groups
            .into_iter()
            .filter(|g| share.owns(g.index) && g.first_row + g.rows > start_row)
            .filter(|g| {
                !windows
                    .as_ref()
                    .is_some_and(|w| all_epochs_before(w, g.index, resume_epoch))
            })
            .collect();

        Ok(ParquetSource {
            path,
            name,
            input,
            decoder,
            batch_rows: config.batch_rows,
            epoch_rows,
            n_rows,
            groups,
            open: None,
            pending: None,
            next_epoch: resume_epoch,
            resume_epoch,
            windows,
            counters: Counters::default(),
        })
    }

    /// This worker's part of the next epoch, or `None` when the file is done.
    ///
    /// With [`EpochRule::Rows`] every worker yields every epoch `0..n_epochs`
    /// (parts may be empty); with event time, only windows that have rows.
    pub fn next_epoch(&mut self) -> Result<Option<EpochPart<ParquetPosition>>, SourceError> {
        let part = match self.epoch_rows {
            Some(n) => self.next_row_epoch(n)?,
            None => self.next_window_epoch()?,
        };
        if let Some(p) = &part {
            self.counters.add(p.records.len(), &p.dead_letters);
        }
        Ok(part)
    }

    /// The number of epochs in the file, for [`EpochRule::Rows`].
    pub fn n_epochs(&self) -> Option<u64> {
        self.epoch_rows.map(|n| self.n_rows.div_ceil(n))
    }

    /// Rows in the whole file (all workers' shares).
    pub fn n_rows(&self) -> u64 {
        self.n_rows
    }

    /// The feature columns, in record order.
    pub fn feature_names(&self) -> &[String] {
        self.decoder.feature_names()
    }

    /// Records and dead letters this worker has yielded so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn next_row_epoch(&mut self, n: u64) -> Result<Option<EpochPart<ParquetPosition>>, SourceError> {
        let epoch = self.next_epoch;
        let lo = epoch.saturating_mul(n);
        if lo >= self.n_rows {
            return Ok(None);
        }
        let hi = lo.saturating_add(n).min(self.n_rows);
        let mut rows = Vec::new();
        let mut dead_letters = Vec::new();
        while let Some((start, batch)) = self.next_batch()? {
            if start >= hi {
                self.pending = Some((start, batch));
                break;
            }
            let take = (hi - start).min(batch.num_rows() as u64) as usize;
            if take < batch.num_rows() {
                self.pending = Some((start + take as u64, batch.slice(take, batch.num_rows() - take)));
            }
            let name = &self.name;
            let origin = |r: usize| Origin::File {
                path: name.clone(),
                row: start + r as u64,
            };
            self.decoder
                .decode(&batch.slice(0, take), &origin, &mut rows, &mut dead_letters)
                .map_err(|source| SourceError::Schema {
                    input: self.name.clone(),
                    source,
                })?;
            if self.pending.is_some() {
                break;
            }
        }
        self.next_epoch = epoch + 1;
        Ok(Some(EpochPart {
            epoch,
            records: rows.into_iter().map(|r| r.record).collect(),
            dead_letters,
            position: ParquetPosition {
                next_epoch: epoch + 1,
                rows_before: Some(hi),
            },
        }))
    }

    fn next_window_epoch(&mut self) -> Result<Option<EpochPart<ParquetPosition>>, SourceError> {
        let mut epoch = None;
        let mut records = Vec::new();
        let mut dead_letters = Vec::new();
        loop {
            let windows = self.windows.as_mut().expect("event-time state");
            while let Some((e, _)) = windows.carry.front() {
                match epoch {
                    None => epoch = Some(*e),
                    Some(current) if *e != current => break,
                    Some(_) => {}
                }
                match windows.carry.pop_front() {
                    Some((_, Ok(row))) => records.push(row.record),
                    Some((_, Err(d))) => dead_letters.push(d),
                    None => {}
                }
            }
            if !windows.carry.is_empty() {
                break;
            }
            let Some((start, batch)) = self.next_batch()? else {
                break;
            };
            self.assign_windows(start, &batch)?;
        }
        let Some(epoch) = epoch else {
            return Ok(None);
        };
        self.next_epoch = epoch + 1;
        Ok(Some(EpochPart {
            epoch,
            records,
            dead_letters,
            position: ParquetPosition {
                next_epoch: epoch + 1,
                rows_before: None,
            },
        }))
    }

    /// Decode a batch and give each row its epoch: the window of the largest
    /// event time up to and including it in file order. Rows before the
    /// resume epoch are dropped.
    fn assign_windows(&mut self, start: u64, batch: &RecordBatch) -> Result<(), SourceError> {
        let windows = self.windows.as_mut().expect("event-time state");
        let resume_epoch = self.resume_epoch;
        let name = &self.name;
        let origin = |r: usize| Origin::File {
            path: name.clone(),
            row: start + r as u64,
        };
        self.decoder
            .decode_each(batch, &origin, |r, time, outcome| {
                let before = windows.watermark;
                if let Some(t) = time {
                    windows.watermark = Some(before.map_or(t, |w| w.max(t)));
                }
                let epoch = windows.watermark.map_or(0, |w| windows.window(w));
                let outcome = match (outcome, time, before) {
                    (Ok(row), Some(t), Some(b)) if windows.window(t) < windows.window(b) => Err(DeadLetter {
                        origin: origin(r),
                        payload: serde_json::to_string(&row.record).unwrap_or_default(),
                        reason: Reason::Late {
                            time: number_text(t),
                            window: windows.window(t),
                            watermark: epoch,
                        },
                    }),
                    (outcome, ..) => outcome,
                };
                if epoch >= resume_epoch {
                    windows.carry.push_back((epoch, outcome));
                }
            })
            .map_err(|source| SourceError::Schema {
                input: self.name.clone(),
                source,
            })
    }

    /// The next batch of this worker's rows with the global row of its first
    /// row, opening row groups as needed.
    fn next_batch(&mut self) -> Result<Option<(u64, RecordBatch)>, SourceError> {
        if let Some(p) = self.pending.take() {
            return Ok(Some(p));
        }
        loop {
            if let Some(open) = &mut self.open {
                match open.reader.next() {
                    Some(Ok(batch)) => {
                        let start = open.next_row;
                        open.next_row += batch.num_rows() as u64;
                        return Ok(Some((start, batch)));
                    }
                    Some(Err(e)) => {
                        let index = open.index;
                        return Err(self.read_error(index, e.to_string()));
                    }
                    None => self.open = None,
                }
            }
            let Some(group) = self.groups.pop_front() else {
                return Ok(None);
            };
            self.open = Some(self.open_group(group)?);
        }
    }

    /// Why row group `index` could not be read (for CSV: the file).
    fn read_error(&self, index: usize, detail: String) -> SourceError {
        read_error(&self.path, matches!(self.input, Input::Csv { .. }), index, detail)
    }

    fn open_group(&mut self, group: GroupSpan) -> Result<OpenGroup, SourceError> {
        let path = &self.path;
        let failed = |csv: bool, detail: String| read_error(path, csv, group.index, detail);
        let start_row = self.epoch_rows.map_or(0, |n| self.resume_epoch.saturating_mul(n));
        let skip = start_row.saturating_sub(group.first_row).min(group.rows);
        let reader = match &mut self.input {
            Input::Parquet {
                file,
                metadata,
                projection,
            } => {
                let file = file.try_clone().map_err(|e| e.to_string());
                let reader = file.and_then(|file| {
                    let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata.clone())
                        .with_row_groups(vec![group.index])
                        .with_projection(projection.clone())
                        .with_batch_size(self.batch_rows);
                    if skip > 0 {
                        builder = builder.with_row_selection(RowSelection::from(vec![
                            RowSelector::skip(skip as usize),
                            RowSelector::select((group.rows - skip) as usize),
                        ]));
                    }
                    builder.build().map_err(|e| e.to_string())
                });
                GroupReader::Parquet(reader.map_err(|e| failed(false, e))?)
            }
            Input::Csv { reader, next_group } => {
                let mut batch = None;
                while *next_group <= group.index {
                    let read = reader.next().transpose();
                    *next_group += 1;
                    batch = read.map_err(|e| e.to_string()).transpose();
                }
                let batch = batch
                    .unwrap_or_else(|| {
                        Err(format!(
                            "row {} is missing: the file is shorter than it was",
                            group.first_row
                        ))
                    })
                    .map_err(|e| failed(true, e))?;
                let skip = (skip as usize).min(batch.num_rows());
                GroupReader::Csv(Some(batch.slice(skip, batch.num_rows() - skip)))
            }
        };
        if let Some(w) = &mut self.windows {
            // Start from what every earlier row group held, as any worker would.
            if let Some(Some(before)) = w.max_before_group.as_ref().map(|m| m[group.index]) {
                w.watermark = Some(w.watermark.map_or(before, |x| x.max(before)));
            }
        }
        Ok(OpenGroup {
            reader,
            index: group.index,
            next_row: group.first_row + skip,
        })
    }
}

impl DataFile {
    /// Every row group, in file order; a CSV file's are `group_rows` rows each.
    fn groups(&self, group_rows: usize) -> Vec<GroupSpan> {
        let sizes: Vec<u64> = match self {
            DataFile::Parquet { metadata, .. } => metadata
                .metadata()
                .row_groups()
                .iter()
                .map(|g| g.num_rows().max(0) as u64)
                .collect(),
            DataFile::Csv(csv) => {
                let per = group_rows.max(1) as u64;
                (0..csv.rows().div_ceil(per))
                    .map(|k| per.min(csv.rows() - k * per))
                    .collect()
            }
        };
        let mut first_row = 0u64;
        let mut groups = Vec::with_capacity(sizes.len());
        for (index, rows) in sizes.into_iter().enumerate() {
            groups.push(GroupSpan { index, first_row, rows });
            first_row += rows;
        }
        groups
    }

    /// Per row group, the largest event time of all earlier groups (see
    /// [`group_watermarks`]); a CSV file's are read from its rows.
    fn watermarks(
        &self,
        decoder: &ArrowDecoder,
        mapping: &ColumnMapping,
        share: WorkerShare,
        name: &str,
        group_rows: usize,
    ) -> Result<Option<Vec<Option<f64>>>, SourceError> {
        match self {
            DataFile::Parquet { metadata, .. } => group_watermarks(metadata, decoder, mapping, share, name),
            DataFile::Csv(csv) => csv_watermarks(csv, decoder, mapping, group_rows).map(Some),
        }
    }
}

/// [`group_watermarks`] of a CSV file, from one pass over its event times.
fn csv_watermarks(
    csv: &CsvInput,
    decoder: &ArrowDecoder,
    mapping: &ColumnMapping,
    group_rows: usize,
) -> Result<Vec<Option<f64>>, SourceError> {
    let column = mapping.event_time.as_deref().unwrap_or_default();
    let failed = |source| FileError::NotCsv {
        path: csv.path().to_owned(),
        source,
    };
    let mut out = vec![None];
    let mut running: Option<f64> = None;
    for batch in csv.batches(&[column], group_rows).map_err(failed)? {
        let batch = batch.map_err(failed)?;
        let times = event_seconds(batch.column(0), decoder.time_scale()).map_err(failed)?;
        for t in times.iter().flatten().filter(|t| t.is_finite()) {
            running = Some(running.map_or(t, |r| r.max(t)));
        }
        out.push(running);
    }
    Ok(out)
}

/// Why row group `index` of the file at `path` could not be read (for CSV: the file).
fn read_error(path: &Path, csv: bool, index: usize, detail: String) -> SourceError {
    match csv {
        false => SourceError::Read {
            path: path.to_owned(),
            row_group: index,
            detail,
        },
        true => FileError::NotCsv {
            path: path.to_owned(),
            source: ArrowError::CsvError(detail),
        }
        .into(),
    }
}

fn check_config(config: &ParquetSourceConfig, share: WorkerShare) -> Result<(), SourceError> {
    share.check().map_err(SourceError::Config)?;
    if config.batch_rows == 0 {
        return Err(SourceError::Config("batch_rows must be at least 1".into()));
    }
    match config.epochs {
        EpochRule::Rows(0) => Err(SourceError::Config("epochs of 0 rows: give at least 1".into())),
        EpochRule::EventTime { width, origin } => {
            if !(width.is_finite() && width > 0.0 && origin.is_finite()) {
                return Err(SourceError::Config(format!(
                    "event-time windows need a finite width > 0 and a finite origin (got width {width}, origin {origin})"
                )));
            }
            if config.mapping.event_time.is_none() {
                return Err(SourceError::Config(
                    "event-time epochs need `event_time` (a column) in the mapping".into(),
                ));
            }
            Ok(())
        }
        EpochRule::Rows(_) => Ok(()),
    }
}

/// Per row group, the largest event time in all earlier groups, from the
/// footer's statistics. A lone worker reads every row in order and needs
/// none; several workers need them to agree on which rows are late.
fn group_watermarks(
    metadata: &ArrowReaderMetadata,
    decoder: &ArrowDecoder,
    mapping: &ColumnMapping,
    share: WorkerShare,
    name: &str,
) -> Result<Option<Vec<Option<f64>>>, SourceError> {
    let column = mapping.event_time.as_deref().unwrap_or_default();
    let groups = metadata.metadata().row_groups();
    let stats = (|| {
        let conv = StatisticsConverter::try_new(column, metadata.schema(), metadata.parquet_schema()).ok()?;
        let maxes = event_seconds(&conv.row_group_maxes(groups).ok()?, decoder.time_scale()).ok()?;
        let nulls = conv.row_group_null_counts(groups).ok()?;
        let mut out = Vec::with_capacity(groups.len() + 1);
        let mut running: Option<f64> = None;
        for (i, g) in groups.iter().enumerate() {
            out.push(running);
            let all_null = nulls.is_valid(i) && nulls.value(i) == g.num_rows().max(0) as u64;
            if maxes.is_valid(i) {
                let m = maxes.value(i);
                running = Some(running.map_or(m, |r| r.max(m)));
            } else if !all_null {
                return None;
            }
        }
        out.push(running);
        Some(out)
    })();
    match stats {
        Some(s) => Ok(Some(s)),
        None if share.peers == 1 => Ok(None),
        None => Err(SourceError::Config(format!(
            "{name}: event-time epochs with several workers need min/max statistics of `{column}` \
             in every row group; rewrite the file with statistics, or read it with one worker"
        ))),
    }
}

/// Whether every row of group `g` falls in an epoch before `epoch`, by the
/// statistics (the watermark after `g` is below the window `epoch` starts).
fn all_epochs_before(w: &Windows, g: usize, epoch: u64) -> bool {
    match &w.max_before_group {
        Some(m) => match m.get(g + 1) {
            Some(Some(after)) => w.window(*after) < epoch,
            _ => false,
        },
        None => false,
    }
}
