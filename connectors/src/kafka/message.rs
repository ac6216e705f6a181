//! Kafka message payloads to records: JSON objects (one record each, the
//! `dualgp serve` contract) or Arrow IPC streams (many rows each, for
//! high-volume producers). A message that cannot be used becomes a dead letter.

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow::ipc::reader::StreamReader;
use dualgp_operators::dataflow::{panic_message, Record};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::arrow_decode::ArrowDecoder;
use crate::columns::{prefixed_index, Features, UnresolvedFeatures};
use crate::dead_letter::{DeadLetter, Origin, Reason};
use crate::mapping::ColumnMapping;

/// How message payloads are encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageFormat {
    /// Decide per message: an Arrow IPC stream starts with `0xFFFFFFFF`, anything else is read as JSON.
    #[default]
    Auto,
    /// One JSON object a message.
    Json,
    /// An Arrow IPC stream a message, any number of rows.
    ArrowIpc,
}

/// Where a message came from.
#[derive(Clone, Copy, Debug)]
pub struct MessageOrigin<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The offset in the partition.
    pub offset: i64,
}

impl MessageOrigin<'_> {
    fn at(&self, row: Option<u32>) -> Origin {
        Origin::Kafka {
            topic: self.topic.to_owned(),
            partition: self.partition,
            offset: self.offset,
            row,
        }
    }
}

/// Dead-letter payloads are capped so one huge message cannot flood the sink.
const MAX_PAYLOAD_TEXT: usize = 64 * 1024;
/// What a dead letter shows of a message over the size limit: enough to
/// find it by, not so much that the letters of big messages pile up.
const MAX_OVERSIZED_TEXT: usize = 1024;
/// The default limit on a message's size: 1 MiB, a Kafka broker's own
/// default limit (`message.max.bytes`).
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;
const IPC_CONTINUATION: [u8; 4] = [0xFF; 4];

/// Decodes messages with one [`ColumnMapping`]. With features given by
/// prefix and no dimension, the first decodable message fixes the feature
/// names; later messages with other features are dead letters.
#[derive(Clone, Debug)]
pub struct MessageDecoder {
    mapping: ColumnMapping,
    format: MessageFormat,
    /// Feature names, once known (given, or fixed by the first message).
    features: Option<Vec<String>>,
    /// Messages larger than this are dead letters, never parsed.
    max_bytes: Option<usize>,
}

impl MessageDecoder {
    /// A decoder of messages in `format` by `mapping`.
    pub fn new(mapping: &ColumnMapping, format: MessageFormat) -> Self {
        let mut mapping = mapping.clone();
        // Kafka epochs are cut by count and time, not by an event-time column.
        mapping.event_time = None;
        MessageDecoder {
            features: mapping.known_feature_names(),
            mapping,
            format,
            max_bytes: None,
        }
    }

    /// The same decoder, turning messages over `max_bytes` into `too_large`
    /// dead letters without parsing them (a parse of a huge message costs
    /// many times its size in memory).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = Some(max_bytes);
        self
    }

    /// The feature names, once known.
    pub fn feature_names(&self) -> Option<&[String]> {
        self.features.as_deref()
    }

    /// Decode one message into `records`, or into `dead` with the reason.
    pub fn decode(
        &mut self,
        payload: Option<&[u8]>,
        origin: MessageOrigin<'_>,
        records: &mut Vec<Record>,
        dead: &mut Vec<DeadLetter>,
    ) {
        let bytes = payload.unwrap_or_default();
        let is_ipc = match self.format {
            MessageFormat::Json => false,
            MessageFormat::ArrowIpc => true,
            MessageFormat::Auto => bytes.starts_with(&IPC_CONTINUATION),
        };
        if let Some(limit) = self.max_bytes.filter(|&limit| bytes.len() > limit) {
            let mut payload = payload_text(&bytes[..MAX_OVERSIZED_TEXT.min(bytes.len())]);
            payload.push_str(&format!("… ({} bytes in all)", bytes.len()));
            dead.push(DeadLetter {
                origin: origin.at(None),
                payload,
                reason: Reason::TooLarge {
                    bytes: bytes.len() as u64,
                    limit: limit as u64,
                },
            });
        } else if bytes.is_empty() {
            dead.push(DeadLetter {
                origin: origin.at(None),
                payload: String::new(),
                reason: Reason::Undecodable {
                    detail: "empty message".into(),
                },
            });
        } else if is_ipc {
            self.decode_ipc(bytes, origin, records, dead);
        } else {
            match self.decode_json(bytes) {
                Ok(r) => records.push(r),
                Err(reason) => dead.push(DeadLetter {
                    origin: origin.at(None),
                    payload: payload_text(bytes),
                    reason,
                }),
            }
        }
    }

    fn decode_json(&mut self, bytes: &[u8]) -> Result<Record, Reason> {
        let obj: Map<String, Value> = serde_json::from_slice(bytes).map_err(|e| Reason::Undecodable {
            detail: format!("not a JSON object: {e}"),
        })?;
        let id = integer(&obj, &self.mapping.id)?;
        let names = self.json_feature_names(&obj)?;
        let features = names.iter().map(|n| number(&obj, n)).collect::<Result<Vec<f64>, _>>()?;
        let label = match &self.mapping.label {
            Some(l) if !matches!(obj.get(l), None | Some(Value::Null)) => {
                let y = number(&obj, l)?;
                self.mapping.labels.check(y)?;
                Some(y)
            }
            _ => None,
        };
        let output = self.json_output(&obj)?;
        let time = self.mapping.time.as_deref().map(|t| number(&obj, t)).transpose()?;
        if self.features.is_none() {
            self.features = Some(names);
        }
        let mut record = Record::new(id, features, label).with_output(output);
        record.time = time;
        Ok(record)
    }

    /// The message's output index: required by a multi-output model, 0 when
    /// a single-output model's message leaves it out.
    fn json_output(&self, obj: &Map<String, Value>) -> Result<usize, Reason> {
        let name = &self.mapping.output;
        if !obj.contains_key(name) && !self.mapping.requires_output() {
            return Ok(0);
        }
        match field(obj, name)? {
            Value::Number(n) if n.is_i64() => self.mapping.output_index(n.as_i64().unwrap_or_default()),
            Value::Number(n) if n.is_u64() => Err(Reason::InvalidOutput {
                value: n.to_string(),
                outputs: self.mapping.outputs,
            }),
            other => Err(not_an_integer(name, "an integer output index", other)),
        }
    }

    /// This message's feature names: the known ones, or `PREFIX0..` (or the
    /// keys the globs match) from its keys.
    fn json_feature_names(&self, obj: &Map<String, Value>) -> Result<Vec<String>, Reason> {
        let prefix = match &self.mapping.features {
            Features::Prefix(prefix) => prefix,
            Features::Glob(_) => return self.json_glob_names(obj),
            Features::Names(_) => return Ok(self.features.clone().unwrap_or_default()),
        };
        // Prefixed keys are always checked: an extra `x2` is a wrong dimension, not noise.
        let mut indices: Vec<u128> = obj.keys().filter_map(|k| prefixed_index(prefix, k)).collect();
        indices.sort_unstable();
        let contiguous = indices.iter().enumerate().all(|(i, &n)| i as u128 == n);
        let found = || {
            let keys: Vec<String> = indices.iter().map(|i| format!("{prefix}{i}")).collect();
            format!("[{}]", keys.join(","))
        };
        match &self.features {
            Some(known) if known.len() != indices.len() || !contiguous => Err(Reason::FeatureMismatch {
                expected: format!(
                    "{} features {prefix}0..{prefix}{}",
                    known.len(),
                    known.len().saturating_sub(1)
                ),
                found: found(),
            }),
            Some(known) => Ok(known.clone()),
            None if indices.is_empty() => Err(Reason::MissingField {
                field: format!("{prefix}0"),
            }),
            None if !contiguous => Err(Reason::FeatureMismatch {
                expected: format!("features {prefix}0, {prefix}1, … without gaps"),
                found: found(),
            }),
            None => Ok((0..indices.len()).map(|i| format!("{prefix}{i}")).collect()),
        }
    }

    /// The keys `Features::Glob` picks from this message (never the id,
    /// label, output or time field), which must be the ones the first message had.
    fn json_glob_names(&self, obj: &Map<String, Value>) -> Result<Vec<String>, Reason> {
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        let m = &self.mapping;
        let candidates: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| *k != m.id && Some(*k) != m.label.as_deref() && *k != m.output && Some(*k) != m.time.as_deref())
            .collect();
        let names = m.features.resolve_among(&keys, &candidates).map_err(|e| match e {
            UnresolvedFeatures::Missing(field) => Reason::MissingField { field },
            other => Reason::FeatureMismatch {
                expected: format!("features {}", other.wanted()),
                found: format!("[{}]", keys.join(",")),
            },
        })?;
        let expected = match (&self.features, m.dimension) {
            (Some(known), _) if *known != names => known.join(","),
            (None, Some(d)) if d != names.len() => format!("{d} features"),
            _ => return Ok(names),
        };
        Err(Reason::FeatureMismatch {
            expected,
            found: format!("[{}]", names.join(",")),
        })
    }

    fn decode_ipc(
        &mut self,
        bytes: &[u8],
        origin: MessageOrigin<'_>,
        records: &mut Vec<Record>,
        dead: &mut Vec<DeadLetter>,
    ) {
        let whole = |reason: Reason| DeadLetter {
            origin: origin.at(None),
            payload: payload_text(bytes),
            reason,
        };
        // arrow-ipc panics on some damaged streams (a buffer offset past the
        // end of the message): such a panic makes the rest of the message a
        // dead letter, as a read error does.
        let damaged = |row: u32, panic: Box<dyn std::any::Any + Send>| Reason::Undecodable {
            detail: format!("damaged Arrow IPC stream after row {row}: {}", panic_message(&*panic)),
        };
        let mut reader = match catch_unwind(AssertUnwindSafe(|| StreamReader::try_new(Cursor::new(bytes), None))) {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return dead.push(whole(Reason::Undecodable {
                    detail: format!("not an Arrow IPC stream: {e}"),
                }))
            }
            Err(panic) => return dead.push(whole(damaged(0, panic))),
        };
        let mut mapping = self.mapping.clone();
        if let Some(known) = &self.features {
            mapping.dimension = Some(known.len());
        }
        let decoder = match ArrowDecoder::new(&mapping, &reader.schema()) {
            Ok(d) => d,
            Err(e) => return dead.push(whole(e.to_reason())),
        };
        if let Some(known) = &self.features {
            if known.as_slice() != decoder.feature_names() {
                return dead.push(whole(Reason::FeatureMismatch {
                    expected: known.join(","),
                    found: decoder.feature_names().join(","),
                }));
            }
        }
        let mut row = 0u32;
        let mut decoded = Vec::new();
        loop {
            let batch = match catch_unwind(AssertUnwindSafe(|| reader.next())) {
                Ok(None) => break,
                Ok(Some(Ok(b))) => b,
                Ok(Some(Err(e))) => {
                    dead.push(whole(Reason::Undecodable {
                        detail: format!("Arrow IPC batch after row {row}: {e}"),
                    }));
                    break;
                }
                Err(panic) => {
                    dead.push(whole(damaged(row, panic)));
                    break;
                }
            };
            let base = row;
            let at = |r: usize| origin.at(Some(base + r as u32));
            if let Err(e) = decoder.decode(&batch, &at, &mut decoded, dead) {
                dead.push(whole(e.to_reason()));
                break;
            }
            row += batch.num_rows() as u32;
        }
        if !decoded.is_empty() && self.features.is_none() {
            self.features = Some(decoder.feature_names().to_vec());
        }
        records.extend(decoded.into_iter().map(|d| d.record));
    }
}

/// A field that should have held an integer and holds `found` (a number
/// shown as written, anything else by its type).
fn not_an_integer(field: &str, expected: &str, found: &Value) -> Reason {
    Reason::WrongType {
        field: field.into(),
        expected: expected.into(),
        found: match found {
            Value::Number(n) => n.to_string(),
            v => type_name(v).into(),
        },
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a Value, Reason> {
    match obj.get(name) {
        None => Err(Reason::MissingField { field: name.into() }),
        Some(Value::Null) => Err(Reason::Null { field: name.into() }),
        Some(v) => Ok(v),
    }
}

fn number(obj: &Map<String, Value>, name: &str) -> Result<f64, Reason> {
    match field(obj, name)? {
        // JSON numbers are always finite; a huge one parses as infinity.
        Value::Number(n) => n.as_f64().filter(|v| v.is_finite()).ok_or_else(|| Reason::NonFinite {
            field: name.into(),
            value: n.to_string(),
        }),
        other => Err(Reason::WrongType {
            field: name.into(),
            expected: "a number".into(),
            found: type_name(other).into(),
        }),
    }
}

fn integer(obj: &Map<String, Value>, name: &str) -> Result<i64, Reason> {
    match field(obj, name)? {
        Value::Number(n) if n.is_i64() => Ok(n.as_i64().unwrap_or_default()),
        Value::Number(n) if n.is_u64() => Err(Reason::IdOutOfRange { value: n.to_string() }),
        other => Err(not_an_integer(name, "an integer", other)),
    }
}

/// A payload as text for a dead letter: UTF-8 as it is, binary as hex.
fn payload_text(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(MAX_PAYLOAD_TEXT)];
    let mut text = match std::str::from_utf8(shown) {
        Ok(s) => s.to_owned(),
        // Text cut inside its last character by the cap.
        Err(e) if e.error_len().is_none() => String::from_utf8_lossy(&shown[..e.valid_up_to()]).into_owned(),
        Err(_) => {
            let hex: String = shown
                .iter()
                .take(MAX_PAYLOAD_TEXT / 2)
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("hex:{hex}")
        }
    };
    if bytes.len() > shown.len() || text.len() > MAX_PAYLOAD_TEXT {
        text.truncate(text.floor_char_boundary(MAX_PAYLOAD_TEXT));
        text.push_str(&format!("… ({} bytes in all)", bytes.len()));
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use arrow::ipc::writer::StreamWriter;
    use arrow::record_batch::RecordBatch;

    use super::*;
    use crate::ReasonKind;

    const AT: MessageOrigin<'static> = MessageOrigin {
        topic: "in",
        partition: 0,
        offset: 9,
    };

    fn decode(d: &mut MessageDecoder, payload: &[u8]) -> (Vec<Record>, Vec<DeadLetter>) {
        let (mut r, mut dead) = (Vec::new(), Vec::new());
        d.decode(Some(payload), AT, &mut r, &mut dead);
        (r, dead)
    }

    fn reason(d: &mut MessageDecoder, payload: &str) -> Reason {
        let (r, dead) = decode(d, payload.as_bytes());
        assert!(r.is_empty(), "{payload} decoded");
        assert_eq!(dead[0].payload, payload);
        dead[0].reason.clone()
    }

    #[test]
    fn json_messages_follow_the_serve_contract() {
        let mut d = MessageDecoder::new(&ColumnMapping::default().with_classes(2), MessageFormat::Auto);
        let (r, _) = decode(&mut d, br#"{"id": 7, "x1": 2.5, "x0": -1, "y": 1}"#);
        assert_eq!(r, [Record::new(7, vec![-1.0, 2.5], Some(1.0))]);
        assert_eq!(d.feature_names().unwrap(), ["x0", "x1"]);
        // No y: only scored.
        let (r, _) = decode(&mut d, br#"{"id": 8, "x0": 0, "x1": 0, "y": null}"#);
        assert_eq!(r[0].label, None);

        let kinds = [
            ("not json", ReasonKind::Undecodable),
            ("[1, 2]", ReasonKind::Undecodable),
            (r#"{"x0": 1, "x1": 2}"#, ReasonKind::MissingField),
            (r#"{"id": "a", "x0": 1, "x1": 2}"#, ReasonKind::WrongType),
            (r#"{"id": 1.5, "x0": 1, "x1": 2}"#, ReasonKind::WrongType),
            (
                r#"{"id": 18446744073709551615, "x0": 1, "x1": 2}"#,
                ReasonKind::IdOutOfRange,
            ),
            (r#"{"id": 1, "x0": null, "x1": 2}"#, ReasonKind::Null),
            (r#"{"id": 1, "x0": "NaN", "x1": 2}"#, ReasonKind::WrongType),
            // serde_json refuses numbers beyond f64 outright.
            (r#"{"id": 1, "x0": 1e999, "x1": 2}"#, ReasonKind::Undecodable),
            (r#"{"id": 1, "x0": 1, "x1": 2, "x2": 3}"#, ReasonKind::FeatureMismatch),
            (r#"{"id": 1, "x0": 1}"#, ReasonKind::FeatureMismatch),
            (r#"{"id": 1, "x0": 1, "x1": 2, "y": 2}"#, ReasonKind::InvalidLabel),
            (r#"{"id": 1, "x0": 1, "x1": 2, "y": true}"#, ReasonKind::WrongType),
        ];
        for (payload, kind) in kinds {
            assert_eq!(reason(&mut d, payload).kind(), kind, "{payload}");
        }
        let (_, dead) = decode(&mut d, b"");
        assert_eq!(dead[0].reason.kind(), ReasonKind::Undecodable);
        let (_, dead) = decode(&mut d, &[0xc3, 0x28, 0x01]);
        assert_eq!(dead[0].payload, "hex:c32801");
    }

    /// A message over the limit is a `too_large` dead letter with a short
    /// excerpt, never parsed; nesting deeper than serde_json's recursion
    /// limit (128) is an `undecodable` one, not a stack overflow.
    #[test]
    fn oversized_and_deeply_nested_messages_are_dead_letters() {
        let mut d = MessageDecoder::new(&ColumnMapping::default(), MessageFormat::Auto).with_max_bytes(100);
        let big = format!(r#"{{"id": 1, "x0": 1, "x1": 2, "pad": "{}"}}"#, "a".repeat(5000));
        let (r, dead) = decode(&mut d, big.as_bytes());
        assert!(r.is_empty());
        assert_eq!(
            dead[0].reason,
            Reason::TooLarge {
                bytes: big.len() as u64,
                limit: 100
            }
        );
        assert!(dead[0].payload.starts_with(r#"{"id": 1, "x0""#), "{}", dead[0].payload);
        assert!(dead[0].payload.len() < 1100, "{}", dead[0].payload.len());
        // At the limit is not over it.
        let (r, _) = decode(&mut d, br#"{"id": 2, "x0": 1, "x1": 2}"#);
        assert_eq!(r.len(), 1);

        let mut d = MessageDecoder::new(&ColumnMapping::default(), MessageFormat::Auto);
        let deep = format!(
            r#"{{"id": 3, "x0": {}1{}, "x1": 2}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let (r, dead) = decode(&mut d, deep.as_bytes());
        assert!(r.is_empty());
        assert_eq!(dead[0].reason.kind(), ReasonKind::Undecodable);
        assert!(
            dead[0].reason.to_string().contains("recursion limit"),
            "{}",
            dead[0].reason
        );
        // A reason that lists a message's fields is cut for the letter.
        let wide: Vec<String> = (0..20_000).map(|i| format!(r#""x{i}": 1"#)).collect();
        let wide = format!(r#"{{"id": 4, {}}}"#, wide.join(", "));
        let (_, _) = decode(&mut d, br#"{"id": 5, "x0": 1, "x1": 2}"#);
        let (_, dead) = decode(&mut d, wide.as_bytes());
        assert_eq!(dead[0].reason.kind(), ReasonKind::FeatureMismatch);
        assert!(dead[0].reason.to_string().len() > 100_000);
        let text = dead[0].reason_text();
        assert!(text.len() < crate::dead_letter::MAX_REASON_TEXT + 100, "{}", text.len());
        assert!(text.ends_with("bytes in all)"), "{text}");
    }

    #[test]
    fn json_messages_of_a_multi_output_model_name_a_valid_output() {
        use dualgp_operators::model::Likelihood;
        let two = Likelihood::parse_outputs("gaussian,bernoulli", None).unwrap();
        let mut d = MessageDecoder::new(&ColumnMapping::for_likelihood(&two), MessageFormat::Json);
        let (r, _) = decode(&mut d, br#"{"id": 1, "x0": 0.5, "y": 1, "output": 1}"#);
        assert_eq!(r, [Record::new(1, vec![0.5], Some(1.0)).with_output(1)]);
        let kinds = [
            (r#"{"id": 2, "x0": 0.5}"#, ReasonKind::MissingField),
            (r#"{"id": 2, "x0": 0.5, "output": null}"#, ReasonKind::Null),
            (r#"{"id": 2, "x0": 0.5, "output": 2}"#, ReasonKind::InvalidOutput),
            (r#"{"id": 2, "x0": 0.5, "output": -1}"#, ReasonKind::InvalidOutput),
            (
                r#"{"id": 2, "x0": 0.5, "output": 18446744073709551615}"#,
                ReasonKind::InvalidOutput,
            ),
            (r#"{"id": 2, "x0": 0.5, "output": 1.0}"#, ReasonKind::WrongType),
            (r#"{"id": 2, "x0": 0.5, "output": "1"}"#, ReasonKind::WrongType),
            (r#"{"id": 2, "x0": 0.5, "output": [1]}"#, ReasonKind::WrongType),
        ];
        for (payload, kind) in kinds {
            assert_eq!(reason(&mut d, payload).kind(), kind, "{payload}");
        }
        let named = reason(&mut d, r#"{"id": 2, "x0": 0.5, "output": 5}"#).to_string();
        assert!(named.contains("output 5") && named.contains("0..2"), "{named}");

        // A single-output model reads a message without `output` as output 0,
        // and refuses any other output.
        let mut single = MessageDecoder::new(&ColumnMapping::default(), MessageFormat::Json);
        let (r, _) = decode(&mut single, br#"{"id": 3, "x0": 0.5, "y": 0.2}"#);
        assert_eq!(r[0].output, 0);
        let beyond = reason(&mut single, r#"{"id": 4, "x0": 0.5, "output": 1}"#);
        assert_eq!(beyond.kind(), ReasonKind::InvalidOutput);
    }

    #[test]
    fn named_features_ignore_other_keys() {
        let mapping = ColumnMapping::default().with_features(["b", "a"]).without_label();
        let mut d = MessageDecoder::new(&mapping, MessageFormat::Json);
        let (r, _) = decode(&mut d, br#"{"id": 1, "a": 1, "b": 2, "c": "x", "y": "ignored"}"#);
        assert_eq!(r[0].features, [2.0, 1.0]);
        assert_eq!(r[0].label, None);
        let missing = reason(&mut d, r#"{"id": 1, "a": 1}"#);
        assert_eq!(missing, Reason::MissingField { field: "b".into() });
    }

    /// A time field times the record, is no feature, and must be a number.
    #[test]
    fn a_time_field_times_the_record() {
        let mapping = ColumnMapping {
            time: Some("t".into()),
            features: Features::Glob(vec!["*".into()]),
            ..ColumnMapping::default()
        };
        let mut d = MessageDecoder::new(&mapping, MessageFormat::Json);
        let (r, _) = decode(&mut d, br#"{"id": 1, "a": 1, "t": 12.5, "y": 2}"#);
        assert_eq!((r[0].features.as_slice(), r[0].time), ([1.0].as_slice(), Some(12.5)));
        assert_eq!(
            reason(&mut d, r#"{"id": 2, "a": 1, "y": 2}"#).kind(),
            ReasonKind::MissingField
        );
        assert_eq!(
            reason(&mut d, r#"{"id": 3, "a": 1, "t": "noon"}"#).kind(),
            ReasonKind::WrongType
        );
    }

    /// The column flags name JSON fields too: `--id key --target target
    /// --features 'f*'` reads `{"key": …, "f2": …, "f10": …, "target": …}`.
    #[test]
    fn own_field_names_and_globbed_features_are_fixed_by_the_first_message() {
        let mapping = ColumnMapping {
            id: "key".into(),
            label: Some("target".into()),
            features: Features::Glob(vec!["f*".into()]),
            ..ColumnMapping::default()
        };
        let mut d = MessageDecoder::new(&mapping, MessageFormat::Json);
        let (r, _) = decode(&mut d, br#"{"key": 1, "f10": 3, "f2": 2, "target": 0.5, "other": "x"}"#);
        assert_eq!(r, [Record::new(1, vec![2.0, 3.0], Some(0.5))]);
        assert_eq!(d.feature_names().unwrap(), ["f2", "f10"]);
        let (r, _) = decode(&mut d, br#"{"key": 2, "f2": 1, "f10": 4}"#);
        assert_eq!(r, [Record::new(2, vec![1.0, 4.0], None)]);
        for payload in [r#"{"key": 3, "f2": 1}"#, r#"{"key": 3, "f2": 1, "f10": 1, "f3": 1}"#] {
            assert_eq!(reason(&mut d, payload).kind(), ReasonKind::FeatureMismatch, "{payload}");
        }
        assert_eq!(
            reason(&mut d, r#"{"id": 3, "f2": 1, "f10": 1}"#),
            Reason::MissingField { field: "key".into() }
        );
        let mut fresh = MessageDecoder::new(&mapping, MessageFormat::Json);
        assert_eq!(
            reason(&mut fresh, r#"{"key": 3, "g": 1}"#).kind(),
            ReasonKind::FeatureMismatch
        );
        let mut three = MessageDecoder::new(&mapping.clone().with_dimension(3), MessageFormat::Json);
        let short = reason(&mut three, r#"{"key": 3, "f2": 1, "f10": 1}"#);
        assert_eq!(short.kind(), ReasonKind::FeatureMismatch, "{short}");
    }

    fn ipc(columns: Vec<(&str, ArrayRef)>) -> Vec<u8> {
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
                .collect::<Vec<_>>(),
        ));
        let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect()).unwrap();
        let mut w = StreamWriter::try_new(Vec::new(), &schema).unwrap();
        w.write(&batch).unwrap();
        w.write(&batch.slice(1, 1)).unwrap();
        w.into_inner().unwrap()
    }

    #[test]
    fn arrow_ipc_messages_carry_many_rows() {
        let mut d = MessageDecoder::new(&ColumnMapping::default(), MessageFormat::Auto);
        let bytes = ipc(vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2, 3]))),
            (
                "x0",
                Arc::new(Float64Array::from(vec![Some(0.5), Some(f64::NAN), None])),
            ),
            ("y", Arc::new(Float64Array::from(vec![Some(1.0), Some(2.0), None]))),
        ]);
        let (r, dead) = decode(&mut d, &bytes);
        // Rows 0 and 2 of the first batch, then row 0 of the second (a copy of row 1: NaN).
        assert_eq!(r.iter().map(|r| r.id).collect::<Vec<_>>(), [1]);
        let rows: Vec<String> = dead.iter().map(|d| d.origin.to_string()).collect();
        assert_eq!(rows, ["in/0@9 row 1", "in/0@9 row 2", "in/0@9 row 3"]);
        assert_eq!(dead[0].reason.kind(), ReasonKind::NonFinite);
        assert_eq!(dead[1].reason.kind(), ReasonKind::Null);
        assert_eq!(d.feature_names().unwrap(), ["x0"]);

        // A message of another schema is one dead letter, and the stream goes on.
        let other = ipc(vec![
            ("id", Arc::new(Int64Array::from(vec![4, 5]))),
            ("x0", Arc::new(StringArray::from(vec!["a", "b"]))),
        ]);
        let (r, dead) = decode(&mut d, &other);
        assert!(r.is_empty());
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].reason.kind(), ReasonKind::WrongType);
        assert!(dead[0].payload.starts_with("hex:ffffffff"), "{}", dead[0].payload);
        let wider = ipc(vec![
            ("id", Arc::new(Int64Array::from(vec![4, 5]))),
            ("x0", Arc::new(Float64Array::from(vec![1.0, 2.0]))),
            ("x1", Arc::new(Float64Array::from(vec![1.0, 2.0]))),
        ]);
        assert_eq!(decode(&mut d, &wider).1[0].reason.kind(), ReasonKind::FeatureMismatch);
        let truncated = &bytes[..bytes.len() / 2];
        let (_, dead) = decode(&mut d, truncated);
        assert!(dead.iter().any(|d| d.reason.kind() == ReasonKind::Undecodable));
    }

    /// Arrow IPC rows of a multi-output model carry the `output` column:
    /// a bad index is that row's dead letter, a message without the column
    /// one dead letter for the whole message.
    #[test]
    fn arrow_ipc_messages_of_a_multi_output_model_need_the_output_column() {
        use dualgp_operators::model::Likelihood;
        let two = Likelihood::parse_outputs("gaussian,poisson", None).unwrap();
        let mut d = MessageDecoder::new(&ColumnMapping::for_likelihood(&two), MessageFormat::Auto);
        let bytes = ipc(vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2, 3]))),
            ("x0", Arc::new(Float64Array::from(vec![0.1, 0.2, 0.3]))),
            ("y", Arc::new(Float64Array::from(vec![0.5, 2.0, 1.0]))),
            ("output", Arc::new(Int64Array::from(vec![0, 1, 5]))),
        ]);
        let (r, dead) = decode(&mut d, &bytes);
        // Rows 0 and 1, then the second batch's copy of row 1.
        let outputs: Vec<(i64, usize)> = r.iter().map(|r| (r.id, r.output)).collect();
        assert_eq!(outputs, [(1, 0), (2, 1), (2, 1)]);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].origin.to_string(), "in/0@9 row 2");
        assert_eq!(dead[0].reason.kind(), ReasonKind::InvalidOutput);

        let without = ipc(vec![
            ("id", Arc::new(Int64Array::from(vec![4, 5]))),
            ("x0", Arc::new(Float64Array::from(vec![0.1, 0.2]))),
            ("y", Arc::new(Float64Array::from(vec![0.5, 1.0]))),
        ]);
        let (r, dead) = decode(&mut d, &without);
        assert!(r.is_empty());
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].reason, Reason::MissingField { field: "output".into() });
    }

    #[test]
    fn long_payloads_are_capped() {
        let long = format!(r#"{{"id": "{}"}}"#, "é".repeat(MAX_PAYLOAD_TEXT));
        let text = payload_text(long.as_bytes());
        assert!(text.len() < MAX_PAYLOAD_TEXT + 64);
        assert!(
            text.ends_with(&format!("({} bytes in all)", long.len())),
            "{}",
            &text[text.len() - 40..]
        );
    }
}
