//! Arrow record batches to records: columns are checked once against the
//! schema (a missing or mistyped column is an error for the whole source);
//! rows are checked one by one (a bad row becomes a dead letter).

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::util::display::array_value_to_string;
use dualgp_operators::dataflow::Record;

use crate::dead_letter::{number_text, DeadLetter, Origin, Reason};
use crate::mapping::{ColumnMapping, LabelKind};
use crate::table::UnresolvedFeatures;

/// A decoded row: the record and its event time, if the mapping has one.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedRow {
    pub record: Record,
    pub event_time: Option<f64>,
}

/// Why a schema cannot be decoded with a [`ColumnMapping`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SchemaError {
    #[error("no column `{column}`; the columns are: {}", .available.join(", "))]
    MissingColumn { column: String, available: Vec<String> },
    #[error("no feature columns {wanted}; the columns are: {}", .available.join(", "))]
    NoFeatures { wanted: String, available: Vec<String> },
    #[error("column `{column}` has type {found}, expected {expected}")]
    WrongType {
        column: String,
        found: String,
        expected: &'static str,
    },
    #[error("{found} feature columns ({names}), but the stream has {expected}")]
    Dimension {
        expected: usize,
        found: usize,
        names: String,
    },
    #[error("cannot convert column `{column}`: {detail}")]
    Convert { column: String, detail: String },
}

impl SchemaError {
    /// The same problem as a per-message dead-letter reason.
    pub fn to_reason(&self) -> Reason {
        match self {
            SchemaError::MissingColumn { column, .. } => Reason::MissingField { field: column.clone() },
            SchemaError::WrongType {
                column,
                found,
                expected,
            } => Reason::WrongType {
                field: column.clone(),
                expected: (*expected).into(),
                found: found.clone(),
            },
            SchemaError::Dimension { expected, names, .. } => Reason::FeatureMismatch {
                expected: format!("{expected} features"),
                found: names.clone(),
            },
            other => Reason::Undecodable {
                detail: other.to_string(),
            },
        }
    }
}

const NUMBER: &str = "a number (int8..int64, uint8..uint64, float16/32/64)";
const INTEGER: &str = "an integer (int8..int64, uint8..uint64)";
const TIME: &str = "a number or a timestamp";

fn is_integer(t: &DataType) -> bool {
    use DataType::*;
    matches!(t, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64)
}

fn is_number(t: &DataType) -> bool {
    use DataType::*;
    is_integer(t) || matches!(t, Float16 | Float32 | Float64)
}

/// Decodes batches of one schema with one [`ColumnMapping`].
#[derive(Clone, Debug)]
pub struct ArrowDecoder {
    id: String,
    features: Vec<String>,
    label: Option<String>,
    labels: LabelKind,
    event_time: Option<String>,
    /// Seconds per unit, when the event time is an Arrow timestamp.
    time_scale: Option<f64>,
}

impl ArrowDecoder {
    /// Resolve and type-check `mapping`'s columns in `schema`. A label column
    /// the schema lacks is an error too: leave `label` unset for score-only streams.
    pub fn new(mapping: &ColumnMapping, schema: &Schema) -> Result<Self, SchemaError> {
        let available: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let owned = || available.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let field = |name: &str, expected: &'static str, accepts: fn(&DataType) -> bool| {
            let f = schema.field_with_name(name).map_err(|_| SchemaError::MissingColumn {
                column: name.into(),
                available: owned(),
            })?;
            if accepts(f.data_type()) {
                Ok(f.data_type().clone())
            } else {
                Err(SchemaError::WrongType {
                    column: name.into(),
                    found: f.data_type().to_string(),
                    expected,
                })
            }
        };

        field(&mapping.id, INTEGER, is_integer)?;
        let features = mapping.features.resolve(&available).map_err(|e| match e {
            UnresolvedFeatures::Missing(column) => SchemaError::MissingColumn {
                column,
                available: owned(),
            },
            other => SchemaError::NoFeatures {
                wanted: other.wanted(),
                available: owned(),
            },
        })?;
        for f in &features {
            field(f, NUMBER, is_number)?;
        }
        if let Some(d) = mapping.dimension {
            if features.len() != d {
                return Err(SchemaError::Dimension {
                    expected: d,
                    found: features.len(),
                    names: features.join(","),
                });
            }
        }
        if let Some(label) = &mapping.label {
            field(label, NUMBER, is_number)?;
        }
        let time_scale = match &mapping.event_time {
            Some(t) => match field(t, TIME, |t| is_number(t) || matches!(t, DataType::Timestamp(..)))? {
                DataType::Timestamp(unit, _) => Some(match unit {
                    TimeUnit::Second => 1.0,
                    TimeUnit::Millisecond => 1e-3,
                    TimeUnit::Microsecond => 1e-6,
                    TimeUnit::Nanosecond => 1e-9,
                }),
                _ => None,
            },
            None => None,
        };
        Ok(ArrowDecoder {
            id: mapping.id.clone(),
            features,
            label: mapping.label.clone(),
            labels: mapping.labels,
            event_time: mapping.event_time.clone(),
            time_scale,
        })
    }

    pub fn feature_names(&self) -> &[String] {
        &self.features
    }

    /// Every column the decoder reads (for a projection).
    pub fn columns(&self) -> Vec<&str> {
        let mut c = vec![self.id.as_str()];
        c.extend(self.features.iter().map(String::as_str));
        c.extend(self.label.as_deref());
        c.extend(self.event_time.as_deref());
        c
    }

    /// Decode every row of `batch`: good rows to `rows`, bad ones to `dead`
    /// (with `origin(row)`). Errors only when the batch lacks a column or
    /// one cannot be converted (a batch of another schema).
    pub fn decode(
        &self,
        batch: &RecordBatch,
        origin: &dyn Fn(usize) -> Origin,
        rows: &mut Vec<DecodedRow>,
        dead: &mut Vec<DeadLetter>,
    ) -> Result<(), SchemaError> {
        rows.reserve(batch.num_rows());
        self.decode_each(batch, origin, |_, _, outcome| match outcome {
            Ok(row) => rows.push(row),
            Err(d) => dead.push(d),
        })
    }

    /// Decode rows in order, calling `each(row, event_time, outcome)`;
    /// `event_time` is the row's finite event time even when the row is bad
    /// for another reason (event-time watermarks count every row).
    pub fn decode_each(
        &self,
        batch: &RecordBatch,
        origin: &dyn Fn(usize) -> Origin,
        mut each: impl FnMut(usize, Option<f64>, Result<DecodedRow, DeadLetter>),
    ) -> Result<(), SchemaError> {
        let columns = Columns::new(self, batch)?;
        for r in 0..batch.num_rows() {
            let time = columns
                .time
                .as_ref()
                .filter(|(_, t)| t.is_valid(r) && t.value(r).is_finite())
                .map(|(_, t)| t.value(r));
            let outcome = columns.row(self, r).map_err(|reason| DeadLetter {
                origin: origin(r),
                payload: columns.payload(self, r),
                reason,
            });
            each(r, time, outcome);
        }
        Ok(())
    }

    /// Seconds per unit when the event time is an Arrow timestamp.
    pub(crate) fn time_scale(&self) -> Option<f64> {
        self.time_scale
    }
}

/// Event times as `f64`: numbers as they are, timestamps in seconds.
pub(crate) fn event_seconds(raw: &ArrayRef, scale: Option<f64>) -> Result<Float64Array, arrow::error::ArrowError> {
    Ok(match scale {
        None => cast(raw, &DataType::Float64)?.as_primitive::<Float64Type>().clone(),
        Some(scale) => cast(raw, &DataType::Int64)?
            .as_primitive::<Int64Type>()
            .iter()
            .map(|v| v.map(|v| v as f64 * scale))
            .collect(),
    })
}

/// One batch's columns, converted once to `i64`/`f64` arrays.
struct Columns {
    id_raw: ArrayRef,
    id: Int64Array,
    features: Vec<(ArrayRef, Float64Array)>,
    label: Option<(ArrayRef, Float64Array)>,
    time: Option<(ArrayRef, Float64Array)>,
}

impl Columns {
    fn new(dec: &ArrowDecoder, batch: &RecordBatch) -> Result<Self, SchemaError> {
        let get = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| SchemaError::MissingColumn {
                    column: name.into(),
                    available: batch.schema().fields().iter().map(|f| f.name().clone()).collect(),
                })
        };
        let convert = |name: &str, to: &DataType| -> Result<(ArrayRef, ArrayRef), SchemaError> {
            let raw = get(name)?;
            let converted = cast(&raw, to).map_err(|e| SchemaError::Convert {
                column: name.into(),
                detail: e.to_string(),
            })?;
            Ok((raw, converted))
        };
        let float = |name: &str| -> Result<(ArrayRef, Float64Array), SchemaError> {
            let (raw, f) = convert(name, &DataType::Float64)?;
            Ok((raw, f.as_primitive::<Float64Type>().clone()))
        };

        // Integer casts are checked: an out-of-range id becomes null here.
        let (id_raw, id) = convert(&dec.id, &DataType::Int64)?;
        let id = id.as_primitive::<Int64Type>().clone();
        let features = dec.features.iter().map(|f| float(f)).collect::<Result<_, _>>()?;
        let label = dec.label.as_deref().map(float).transpose()?;
        let time = match &dec.event_time {
            None => None,
            Some(t) => {
                let raw = get(t)?;
                let seconds = event_seconds(&raw, dec.time_scale).map_err(|e| SchemaError::Convert {
                    column: t.clone(),
                    detail: e.to_string(),
                })?;
                Some((raw, seconds))
            }
        };
        Ok(Columns {
            id_raw,
            id,
            features,
            label,
            time,
        })
    }

    fn row(&self, dec: &ArrowDecoder, r: usize) -> Result<DecodedRow, Reason> {
        if self.id_raw.is_null(r) {
            return Err(Reason::Null { field: dec.id.clone() });
        }
        if self.id.is_null(r) {
            return Err(Reason::IdOutOfRange {
                value: text(&self.id_raw, r),
            });
        }
        let mut features = Vec::with_capacity(self.features.len());
        for ((_, values), name) in self.features.iter().zip(&dec.features) {
            features.push(finite(values, r, name)?);
        }
        let label = match (&self.label, &dec.label) {
            (Some((_, values)), Some(_)) if values.is_null(r) => None,
            (Some((_, values)), Some(_)) => {
                let y = values.value(r);
                dec.labels.check(y)?;
                Some(y)
            }
            _ => None,
        };
        let event_time = match (&self.time, &dec.event_time) {
            (Some((_, values)), Some(name)) => Some(finite(values, r, name)?),
            _ => None,
        };
        Ok(DecodedRow {
            record: Record::new(self.id.value(r), features, label),
            event_time,
        })
    }

    /// The row's mapped columns as a JSON object, for a dead letter.
    fn payload(&self, dec: &ArrowDecoder, r: usize) -> String {
        let mut obj = serde_json::Map::new();
        obj.insert(dec.id.clone(), json_value(&self.id_raw, r));
        for ((raw, _), name) in self.features.iter().zip(&dec.features) {
            obj.insert(name.clone(), json_value(raw, r));
        }
        if let (Some((raw, _)), Some(name)) = (&self.label, &dec.label) {
            obj.insert(name.clone(), json_value(raw, r));
        }
        if let (Some((raw, _)), Some(name)) = (&self.time, &dec.event_time) {
            obj.insert(name.clone(), json_value(raw, r));
        }
        serde_json::Value::Object(obj).to_string()
    }
}

fn finite(values: &Float64Array, r: usize, name: &str) -> Result<f64, Reason> {
    if values.is_null(r) {
        return Err(Reason::Null { field: name.into() });
    }
    let v = values.value(r);
    if !v.is_finite() {
        return Err(Reason::NonFinite {
            field: name.into(),
            value: number_text(v),
        });
    }
    Ok(v)
}

fn text(array: &ArrayRef, r: usize) -> String {
    array_value_to_string(array, r).unwrap_or_else(|e| format!("<{e}>"))
}

/// A cell as JSON: numbers stay numbers where JSON can hold them; NaN,
/// infinities and everything else become text.
fn json_value(array: &ArrayRef, r: usize) -> serde_json::Value {
    if array.is_null(r) {
        return serde_json::Value::Null;
    }
    let s = text(array, r);
    if let Ok(i) = s.parse::<i64>() {
        return i.into();
    }
    match s.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
        Some(n) => serde_json::Value::Number(n),
        None => serde_json::Value::String(s),
    }
}
