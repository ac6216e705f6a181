//! Arrow record batches to records: columns are checked once against the
//! schema (a missing or mistyped column is an error for the whole source);
//! rows are checked one by one (a bad row becomes a dead letter).

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type, Schema, TimeUnit};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use arrow::util::display::array_value_to_string;
use dualgp_operators::dataflow::Record;

pub use crate::columns::SchemaError;
use crate::columns::{feature_columns, to_f64, to_i64, typed_column, Role};
use crate::dead_letter::{number_text, DeadLetter, Origin, Reason};
use crate::mapping::{ColumnMapping, LabelKind};

/// A decoded row: the record and its event time, if the mapping has one.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedRow {
    /// The record.
    pub record: Record,
    /// Its event time, in the mapping's units.
    pub event_time: Option<f64>,
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
    /// The records' time column (forgetting's clock) and its seconds per
    /// unit when it is a timestamp.
    clock: Option<(String, Option<f64>)>,
    /// The output column, when the schema has one (else every row observes output 0).
    output: Option<String>,
    /// Checks output indices against the model's outputs.
    mapping: ColumnMapping,
}

impl ArrowDecoder {
    /// Resolve and type-check `mapping`'s columns in `schema`. A label column
    /// the schema lacks is an error too: leave `label` unset for score-only
    /// streams. So is a missing output column when the model has several outputs.
    pub fn new(mapping: &ColumnMapping, schema: &Schema) -> Result<Self, SchemaError> {
        typed_column(schema, &mapping.id, Role::Id)?;
        let others: Vec<&str> = [
            Some(mapping.id.as_str()),
            mapping.label.as_deref(),
            mapping.event_time.as_deref(),
            mapping.time.as_deref(),
        ]
        .into_iter()
        .flatten()
        .chain([mapping.output.as_str()])
        .collect();
        let features = feature_columns(&mapping.features, schema, &others)?;
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
            typed_column(schema, label, Role::Target)?;
        }
        let time_scale = match &mapping.event_time {
            Some(t) => seconds_per_unit(&typed_column(schema, t, Role::EventTime)?),
            None => None,
        };
        let clock = match &mapping.time {
            Some(t) => Some((t.clone(), seconds_per_unit(&typed_column(schema, t, Role::Time)?))),
            None => None,
        };
        let output = match schema.field_with_name(&mapping.output) {
            Ok(_) => Some(typed_column(schema, &mapping.output, Role::Output).map(|_| mapping.output.clone())?),
            Err(_) if mapping.requires_output() => {
                return Err(SchemaError::MissingColumn {
                    role: Role::Output,
                    column: mapping.output.clone(),
                    available: crate::columns::column_names(schema),
                })
            }
            Err(_) => None,
        };
        Ok(ArrowDecoder {
            output,
            mapping: mapping.clone(),
            id: mapping.id.clone(),
            features,
            label: mapping.label.clone(),
            labels: mapping.labels,
            event_time: mapping.event_time.clone(),
            time_scale,
            clock,
        })
    }

    /// The feature columns, in record order.
    pub fn feature_names(&self) -> &[String] {
        &self.features
    }

    /// Every column the decoder reads (for a projection).
    pub fn columns(&self) -> Vec<&str> {
        let mut c = vec![self.id.as_str()];
        c.extend(self.features.iter().map(String::as_str));
        c.extend(self.label.as_deref());
        c.extend(self.event_time.as_deref());
        c.extend(self.clock.as_ref().map(|(t, _)| t.as_str()));
        c.extend(self.output.as_deref());
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

/// Seconds per unit of a timestamp column; None for a column of numbers.
fn seconds_per_unit(t: &DataType) -> Option<f64> {
    match t {
        DataType::Timestamp(unit, _) => Some(match unit {
            TimeUnit::Second => 1.0,
            TimeUnit::Millisecond => 1e-3,
            TimeUnit::Microsecond => 1e-6,
            TimeUnit::Nanosecond => 1e-9,
        }),
        _ => None,
    }
}

/// Event times as `f64`: numbers as they are, timestamps in seconds.
pub(crate) fn event_seconds(raw: &ArrayRef, scale: Option<f64>) -> Result<Float64Array, ArrowError> {
    Ok(match scale {
        None => to_f64(raw)?,
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
    clock: Option<(ArrayRef, Float64Array)>,
    output: Option<(ArrayRef, Int64Array)>,
}

impl Columns {
    fn new(dec: &ArrowDecoder, batch: &RecordBatch) -> Result<Self, SchemaError> {
        let get = |name: &str, role: Role| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| SchemaError::MissingColumn {
                    role,
                    column: name.into(),
                    available: crate::columns::column_names(&batch.schema()),
                })
        };
        let failed = |name: &str| {
            let name = name.to_owned();
            move |e: ArrowError| SchemaError::Convert {
                column: name,
                detail: e.to_string(),
            }
        };
        let number = |name: &str, role: Role| -> Result<(ArrayRef, Float64Array), SchemaError> {
            let raw = get(name, role)?;
            let f = to_f64(&raw).map_err(failed(name))?;
            Ok((raw, f))
        };
        let integer = |name: &str, role: Role| -> Result<(ArrayRef, Int64Array), SchemaError> {
            let raw = get(name, role)?;
            let i = to_i64(&raw).map_err(failed(name))?;
            Ok((raw, i))
        };

        // Integer conversions are checked: an out-of-range id becomes null here.
        let (id_raw, id) = integer(&dec.id, Role::Id)?;
        let features = dec
            .features
            .iter()
            .map(|f| number(f, Role::Feature))
            .collect::<Result<_, _>>()?;
        let label = dec.label.as_deref().map(|l| number(l, Role::Target)).transpose()?;
        let times = |name: &str, scale: Option<f64>, role: Role| -> Result<(ArrayRef, Float64Array), SchemaError> {
            let raw = get(name, role)?;
            let seconds = event_seconds(&raw, scale).map_err(failed(name))?;
            Ok((raw, seconds))
        };
        let time = dec
            .event_time
            .as_deref()
            .map(|t| times(t, dec.time_scale, Role::EventTime))
            .transpose()?;
        let clock = dec
            .clock
            .as_ref()
            .map(|(t, scale)| times(t, *scale, Role::Time))
            .transpose()?;
        let output = dec.output.as_deref().map(|o| integer(o, Role::Output)).transpose()?;
        Ok(Columns {
            id_raw,
            id,
            features,
            label,
            time,
            clock,
            output,
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
        let time = match (&self.clock, &dec.clock) {
            (Some((_, values)), Some((name, _))) => Some(finite(values, r, name)?),
            _ => None,
        };
        let output = match &self.output {
            Some((raw, _)) if raw.is_null(r) => {
                return Err(Reason::Null {
                    field: dec.mapping.output.clone(),
                })
            }
            // A uint64 beyond int64 is null after the checked cast: no output either.
            Some((raw, values)) if values.is_null(r) => {
                return Err(Reason::InvalidOutput {
                    value: text(raw, r),
                    outputs: dec.mapping.outputs,
                })
            }
            Some((_, values)) => dec.mapping.output_index(values.value(r))?,
            None => 0,
        };
        let mut record = Record::new(self.id.value(r), features, label).with_output(output);
        record.time = time;
        Ok(DecodedRow { record, event_time })
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
        if let (Some((raw, _)), Some((name, _))) = (&self.clock, &dec.clock) {
            obj.insert(name.clone(), json_value(raw, r));
        }
        if let (Some((raw, _)), Some(name)) = (&self.output, &dec.output) {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, StringArray, UInt64Array};
    use arrow::datatypes::Field;
    use dualgp_operators::model::Likelihood;

    use super::*;
    use crate::ReasonKind;

    fn batch(output: Option<ArrayRef>) -> RecordBatch {
        let mut columns: Vec<(&str, ArrayRef)> = vec![
            ("id", Arc::new(Int64Array::from(vec![0, 1, 2, 3]))),
            ("x0", Arc::new(Float64Array::from(vec![0.1, 0.2, 0.3, 0.4]))),
            ("y", Arc::new(Float64Array::from(vec![1.0, 0.0, 1.0, 0.5]))),
        ];
        columns.extend(output.map(|o| ("output", o)));
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|c| c.1).collect(),
        )
        .unwrap()
    }

    fn two_outputs() -> ColumnMapping {
        ColumnMapping::for_likelihood(&Likelihood::parse_outputs("gaussian,bernoulli", None).unwrap())
    }

    /// `(id, output)` of each good row.
    type Good = Vec<(i64, usize)>;
    /// `(row, reason kind)` of each bad row.
    type Bad = Vec<(u64, ReasonKind)>;

    /// Good rows with their outputs, and the kinds of the bad rows' reasons.
    fn decode(mapping: &ColumnMapping, batch: &RecordBatch) -> (Good, Bad) {
        let decoder = ArrowDecoder::new(mapping, &batch.schema()).unwrap();
        let (mut rows, mut dead) = (Vec::new(), Vec::new());
        let origin = |row: usize| Origin::File {
            path: "f".into(),
            row: row as u64,
        };
        decoder.decode(batch, &origin, &mut rows, &mut dead).unwrap();
        let good = rows.iter().map(|r| (r.record.id, r.record.output)).collect();
        let bad = dead
            .iter()
            .map(|d| match d.origin {
                Origin::File { row, .. } => (row, d.reason.kind()),
                _ => unreachable!("file rows"),
            })
            .collect();
        (good, bad)
    }

    #[test]
    fn the_output_column_gives_each_row_its_output_and_bad_indices_are_dead_letters() {
        let output: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), Some(2), None, Some(-1)]));
        let (good, bad) = decode(&two_outputs(), &batch(Some(output)));
        assert_eq!(good, [(0, 1)]);
        assert_eq!(
            bad,
            [
                (1, ReasonKind::InvalidOutput),
                (2, ReasonKind::Null),
                (3, ReasonKind::InvalidOutput)
            ]
        );
        // A uint64 beyond int64 is no output index either, not a wrapped one.
        let huge: ArrayRef = Arc::new(UInt64Array::from(vec![0, 1, u64::MAX, 0]));
        let (good, bad) = decode(&two_outputs(), &batch(Some(huge)));
        assert_eq!(good, [(0, 0), (1, 1), (3, 0)]);
        assert_eq!(bad, [(2, ReasonKind::InvalidOutput)]);
    }

    #[test]
    fn a_dead_letter_of_a_bad_output_carries_the_output_in_its_payload() {
        let decoder = ArrowDecoder::new(&two_outputs(), &batch(None).schema());
        assert!(decoder.is_err(), "checked below");
        let output: ArrayRef = Arc::new(Int64Array::from(vec![0, 0, 0, 7]));
        let b = batch(Some(output));
        let decoder = ArrowDecoder::new(&two_outputs(), &b.schema()).unwrap();
        let (mut rows, mut dead) = (Vec::new(), Vec::new());
        let origin = |row: usize| Origin::File {
            path: "f".into(),
            row: row as u64,
        };
        decoder.decode(&b, &origin, &mut rows, &mut dead).unwrap();
        assert_eq!(dead.len(), 1);
        assert!(dead[0].payload.contains(r#""output":7"#), "{}", dead[0].payload);
        assert!(dead[0].reason.to_string().contains("0..2"), "{}", dead[0].reason);
    }

    #[test]
    fn without_an_output_column_a_single_output_model_reads_output_zero_and_a_multi_output_one_refuses() {
        let (good, bad) = decode(&ColumnMapping::default(), &batch(None));
        assert_eq!(good.iter().map(|g| g.1).collect::<Vec<_>>(), [0, 0, 0, 0]);
        assert!(bad.is_empty());
        let err = ArrowDecoder::new(&two_outputs(), &batch(None).schema()).unwrap_err();
        assert!(
            matches!(&err, SchemaError::MissingColumn { column, .. } if column == "output"),
            "{err}"
        );
        // A single-output model given an output column takes only output 0.
        let output: ArrayRef = Arc::new(Int64Array::from(vec![0, 1, 0, 0]));
        let (good, bad) = decode(&ColumnMapping::default(), &batch(Some(output)));
        assert_eq!(good.len(), 3);
        assert_eq!(bad, [(1, ReasonKind::InvalidOutput)]);
        // An output column of another type is the source's error, named.
        let text: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c", "d"]));
        let err = ArrowDecoder::new(&two_outputs(), &batch(Some(text)).schema()).unwrap_err();
        assert!(
            matches!(&err, SchemaError::WrongType { column, .. } if column == "output"),
            "{err}"
        );
    }

    /// The time column gives each record its time (a timestamp in seconds),
    /// is no feature, and a row without a finite time is a dead letter.
    #[test]
    fn the_time_column_times_each_record_and_is_no_feature() {
        use arrow::array::TimestampMillisecondArray;
        let mapping = ColumnMapping {
            time: Some("t".into()),
            features: crate::Features::Glob(vec!["*".into()]),
            ..ColumnMapping::default()
        };
        let stamps: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![
            Some(1_500),
            Some(2_000),
            None,
            Some(4_250),
        ]));
        let with_time = |t: ArrayRef| {
            let b = batch(None);
            let mut fields: Vec<Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new("t", t.data_type().clone(), true));
            let mut columns = b.columns().to_vec();
            columns.push(t);
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
        };
        let decoder = ArrowDecoder::new(&mapping, &with_time(stamps.clone()).schema()).unwrap();
        assert_eq!(decoder.feature_names(), ["x0"], "the time column is not a feature");
        let (mut rows, mut dead) = (Vec::new(), Vec::new());
        let origin = |row: usize| Origin::File {
            path: "f".into(),
            row: row as u64,
        };
        decoder
            .decode(&with_time(stamps), &origin, &mut rows, &mut dead)
            .unwrap();
        let times: Vec<Option<f64>> = rows.iter().map(|r| r.record.time).collect();
        assert_eq!(times, [Some(1.5), Some(2.0), Some(4.25)]);
        assert_eq!(
            dead.iter().map(|d| d.reason.kind()).collect::<Vec<_>>(),
            [ReasonKind::Null]
        );
        assert!(dead[0].payload.contains("\"t\""), "{}", dead[0].payload);

        let numbers: ArrayRef = Arc::new(Float64Array::from(vec![1.0, f64::NAN, 3.0, 4.0]));
        let (good, bad) = decode(&mapping, &with_time(numbers));
        assert_eq!((good.len(), bad), (3, vec![(1, ReasonKind::NonFinite)]));
        let err = ArrowDecoder::new(&mapping, &batch(None).schema()).unwrap_err();
        assert!(
            matches!(&err, SchemaError::MissingColumn { role: Role::Time, .. }),
            "{err}"
        );
        let text: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c", "d"]));
        let err = ArrowDecoder::new(&mapping, &with_time(text).schema()).unwrap_err();
        assert!(
            matches!(&err, SchemaError::WrongType { column, .. } if column == "t"),
            "{err}"
        );
    }
}
