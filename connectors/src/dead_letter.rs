//! Records that could not be used: where they came from, what they were, and why.
//!
//! A bad record never stops a stream: it becomes a [`DeadLetter`], the
//! [`Counters`] count it by [`ReasonKind`], and decoding goes on.

use std::collections::BTreeMap;
use std::fmt;

use dualgp_operators::dataflow::Rejected;
use serde::{Deserialize, Serialize};

/// Where a record came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Origin {
    /// Row `row` (0-based, in file order) of a file.
    File {
        /// The file.
        path: String,
        /// The row, 0-based in file order.
        row: u64,
    },
    /// A Kafka message; `row` is the row inside an Arrow IPC message.
    Kafka {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The message's offset in its partition.
        offset: i64,
        /// The row inside an Arrow IPC message (`None` for JSON).
        row: Option<u32>,
    },
    /// The learner, at epoch `epoch` (the payload holds the record and its id).
    Learner {
        /// The epoch the record came in.
        epoch: u64,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, row } => write!(f, "{path} row {row}"),
            Origin::Kafka {
                topic,
                partition,
                offset,
                row,
            } => {
                write!(f, "{topic}/{partition}@{offset}")?;
                match row {
                    Some(r) => write!(f, " row {r}"),
                    None => Ok(()),
                }
            }
            Origin::Learner { epoch } => write!(f, "the learner at epoch {epoch}"),
        }
    }
}

/// Why a record was rejected. Numbers are kept as text so that NaN and
/// infinities survive JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// A column or field the mapping needs is absent.
    #[error("field `{field}` is missing")]
    MissingField {
        /// The field's name.
        field: String,
    },
    /// A value the record needs is null.
    #[error("`{field}` is null")]
    Null {
        /// The field's name.
        field: String,
    },
    /// A number is NaN or infinite.
    #[error("`{field}` is {value}, not a finite number")]
    NonFinite {
        /// The field's name.
        field: String,
        /// The value, as text.
        value: String,
    },
    /// A value is not of the type its role needs.
    #[error("`{field}` has the wrong type: expected {expected}, found {found}")]
    WrongType {
        /// The field's name.
        field: String,
        /// The types the role takes.
        expected: String,
        /// The type found.
        found: String,
    },
    /// A label outside the labels the mapping takes (a class out of range).
    #[error("label {value} is invalid: expected {expected}")]
    InvalidLabel {
        /// The label, as text.
        value: String,
        /// The labels taken.
        expected: String,
    },
    /// An id beyond the range of `i64`.
    #[error("id {value} does not fit in int64")]
    IdOutOfRange {
        /// The id, as text.
        value: String,
    },
    /// An output index outside the model's outputs.
    #[error("output {value} is invalid: expected an output index in 0..{outputs} (the model has {outputs} output(s))")]
    InvalidOutput {
        /// The index, as text.
        value: String,
        /// How many outputs the model has.
        outputs: usize,
    },
    /// A message whose features differ from the stream's first.
    #[error("features {found} do not match the stream's {expected}")]
    FeatureMismatch {
        /// The stream's features.
        expected: String,
        /// The message's.
        found: String,
    },
    /// A payload that is not JSON or Arrow IPC of records.
    #[error("cannot decode the message: {detail}")]
    Undecodable {
        /// What the decoder said.
        detail: String,
    },
    /// An event time in a window the stream has already closed.
    #[error("event time {time} falls in window {window}, but the stream has already reached window {watermark}")]
    Late {
        /// The event time, as text.
        time: String,
        /// The window it falls in.
        window: u64,
        /// The window the stream has reached.
        watermark: u64,
    },
    /// Decoded, but refused by the model (see [`DeadLetter::refused`]).
    #[error("refused by the learner: {detail}")]
    Refused {
        /// The learner's reason.
        detail: String,
    },
    /// A message larger than a record may be, left undecoded.
    #[error("the message is {bytes} bytes, over the limit of {limit} bytes a record may take")]
    TooLarge {
        /// The message's size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
}

/// The kind of a [`Reason`], for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonKind {
    /// [`Reason::MissingField`].
    MissingField,
    /// [`Reason::Null`].
    Null,
    /// [`Reason::NonFinite`].
    NonFinite,
    /// [`Reason::WrongType`].
    WrongType,
    /// [`Reason::InvalidLabel`].
    InvalidLabel,
    /// [`Reason::IdOutOfRange`].
    IdOutOfRange,
    /// An output index outside the model's outputs (multi-output models).
    InvalidOutput,
    /// [`Reason::FeatureMismatch`].
    FeatureMismatch,
    /// [`Reason::Undecodable`].
    Undecodable,
    /// [`Reason::Late`].
    Late,
    /// [`Reason::Refused`].
    Refused,
    /// [`Reason::TooLarge`].
    TooLarge,
}

impl ReasonKind {
    /// The snake_case name, as in JSON and in the dead-letter sinks.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonKind::MissingField => "missing_field",
            ReasonKind::Null => "null",
            ReasonKind::NonFinite => "non_finite",
            ReasonKind::WrongType => "wrong_type",
            ReasonKind::InvalidLabel => "invalid_label",
            ReasonKind::IdOutOfRange => "id_out_of_range",
            ReasonKind::InvalidOutput => "invalid_output",
            ReasonKind::FeatureMismatch => "feature_mismatch",
            ReasonKind::Undecodable => "undecodable",
            ReasonKind::Late => "late",
            ReasonKind::Refused => "refused",
            ReasonKind::TooLarge => "too_large",
        }
    }
}

impl fmt::Display for ReasonKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Reason {
    /// The reason's kind, for counting.
    pub fn kind(&self) -> ReasonKind {
        match self {
            Reason::MissingField { .. } => ReasonKind::MissingField,
            Reason::Null { .. } => ReasonKind::Null,
            Reason::NonFinite { .. } => ReasonKind::NonFinite,
            Reason::WrongType { .. } => ReasonKind::WrongType,
            Reason::InvalidLabel { .. } => ReasonKind::InvalidLabel,
            Reason::IdOutOfRange { .. } => ReasonKind::IdOutOfRange,
            Reason::InvalidOutput { .. } => ReasonKind::InvalidOutput,
            Reason::FeatureMismatch { .. } => ReasonKind::FeatureMismatch,
            Reason::Undecodable { .. } => ReasonKind::Undecodable,
            Reason::Late { .. } => ReasonKind::Late,
            Reason::Refused { .. } => ReasonKind::Refused,
            Reason::TooLarge { .. } => ReasonKind::TooLarge,
        }
    }
}

/// A rejected record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Where it came from.
    pub origin: Origin,
    /// The record as text: the message itself, or the row's columns as JSON.
    pub payload: String,
    /// Why it was rejected.
    pub reason: Reason,
}

/// The most of a reason a dead-letter message carries: a reason can list a
/// message's fields, and a letter must stay well within a broker's message
/// limit (1 MB by default) beside its payload excerpt.
pub const MAX_REASON_TEXT: usize = 4 * 1024;

impl DeadLetter {
    /// The reason as text, cut to [`MAX_REASON_TEXT`] bytes (saying so).
    pub fn reason_text(&self) -> String {
        // A reason quotes the input (field and column names), which may hold line breaks.
        let mut text = one_line(&self.reason.to_string());
        if text.len() > MAX_REASON_TEXT {
            let all = text.len();
            text.truncate(text.floor_char_boundary(MAX_REASON_TEXT));
            text.push_str(&format!("… ({all} bytes in all)"));
        }
        text
    }

    /// A record the learner refused (it passed the source's checks but not
    /// the model's: a wrong dimension, a label outside the likelihood's support).
    pub fn refused(rejected: &Rejected) -> DeadLetter {
        DeadLetter {
            origin: Origin::Learner { epoch: rejected.epoch },
            payload: serde_json::to_string(&rejected.record).unwrap_or_default(),
            reason: Reason::Refused {
                detail: rejected.reason.clone(),
            },
        }
    }
}

/// How many records a source decoded, and how many it rejected, by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Records decoded.
    pub records: u64,
    /// Records rejected, by reason.
    pub dead_letters: BTreeMap<ReasonKind, u64>,
}

impl Counters {
    /// Records rejected, for every reason.
    pub fn total_dead_letters(&self) -> u64 {
        self.dead_letters.values().sum()
    }

    /// Count one epoch part's output.
    pub fn add(&mut self, records: usize, dead_letters: &[DeadLetter]) {
        self.records += records as u64;
        for d in dead_letters {
            *self.dead_letters.entry(d.reason.kind()).or_default() += 1;
        }
    }

    /// Add another worker's counters.
    pub fn merge(&mut self, other: &Counters) {
        self.records += other.records;
        for (k, n) in &other.dead_letters {
            *self.dead_letters.entry(*k).or_default() += n;
        }
    }
}

/// `text` with its control characters (line breaks, carriage returns)
/// escaped, so that a message quoting input stays one line.
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    out
}

/// A number for a [`Reason`]: the shortest text that reads back the same value.
pub(crate) fn number_text(v: f64) -> String {
    format!("{v}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_json_with_their_kind() {
        let r = Reason::NonFinite {
            field: "x3".into(),
            value: number_text(f64::NAN),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"kind\":\"non_finite\""), "{json}");
        assert_eq!(serde_json::from_str::<Reason>(&json).unwrap(), r);
        assert_eq!(r.to_string(), "`x3` is NaN, not a finite number");
    }

    #[test]
    fn counters_count_by_kind_and_merge() {
        let dl = |reason| DeadLetter {
            origin: Origin::File {
                path: "f".into(),
                row: 0,
            },
            payload: String::new(),
            reason,
        };
        let mut a = Counters::default();
        a.add(3, &[dl(Reason::Null { field: "x0".into() })]);
        let mut b = Counters::default();
        b.add(
            2,
            &[
                dl(Reason::Null { field: "x1".into() }),
                dl(Reason::Undecodable { detail: "eof".into() }),
            ],
        );
        a.merge(&b);
        assert_eq!(a.records, 5);
        assert_eq!(a.dead_letters[&ReasonKind::Null], 2);
        assert_eq!(a.total_dead_letters(), 3);
    }

    /// A column named with a line break (the `arrow_record` fuzz target's
    /// find) is quoted escaped, so the reason stays one line.
    #[test]
    fn a_reason_quoting_a_line_break_stays_one_line() {
        let letter = DeadLetter {
            origin: Origin::File {
                path: "f".into(),
                row: 0,
            },
            payload: String::new(),
            reason: Reason::Undecodable {
                detail: "the columns are: id, \n0, y".into(),
            },
        };
        assert_eq!(
            letter.reason_text(),
            "cannot decode the message: the columns are: id, \\n0, y"
        );
    }

    #[test]
    fn origins_read_well() {
        let k = Origin::Kafka {
            topic: "in".into(),
            partition: 2,
            offset: 17,
            row: Some(4),
        };
        assert_eq!(k.to_string(), "in/2@17 row 4");
    }
}
