//! The one column reader: which columns of an Arrow schema make up records,
//! the one set of type rules each role's column follows, and the one
//! conversion of a column to `i64` or `f64`. Everything that reads data
//! passes here, whatever the data came from (Parquet, CSV, Arrow IPC):
//! [`Table`](crate::Table) for `eval` and [`ArrowDecoder`](crate::ArrowDecoder)
//! for `replay` and `serve`, so a file one accepts the other accepts.
//!
//! The rules: an id, output, fold or task column is an integer (any of
//! Arrow's eight integer types); a feature or target column is any Arrow
//! numeric type (integers, float16/32/64, decimals), read as `f64`; an
//! event time is a number or a timestamp.

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, Schema};
use arrow::error::ArrowError;
use serde::{Deserialize, Serialize};

use crate::dead_letter::Reason;

/// What a column is used for: which types it may have, and the command-line
/// flag that names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The record id.
    Id,
    /// One of the inputs.
    Feature,
    /// The label (target) of a record.
    Target,
    /// Which output of a multi-output model a record observes.
    Output,
    /// The fold of the paper's protocol (`eval --fold`).
    Fold,
    /// The task of a continual-learning stream (per-task figures in `eval`).
    Task,
    /// The event time of event-time epochs.
    EventTime,
    /// The records' time, forgetting's clock.
    Time,
}

const INTEGER: &str = "an integer (int8..int64, uint8..uint64)";
const NUMBER: &str = "a number (int8..int64, uint8..uint64, float16/32/64, decimal)";
const TIME: &str = "a number or a timestamp";

impl Role {
    /// Whether a column of type `t` can play this role.
    pub fn accepts(self, t: &DataType) -> bool {
        match self {
            Role::Id | Role::Output | Role::Fold | Role::Task => t.is_integer(),
            Role::Feature | Role::Target => t.is_numeric(),
            Role::EventTime | Role::Time => t.is_numeric() || matches!(t, DataType::Timestamp(..)),
        }
    }

    /// The types [`accepts`](Self::accepts) takes, in words.
    pub fn expected(self) -> &'static str {
        match self {
            Role::Id | Role::Output | Role::Fold | Role::Task => INTEGER,
            Role::Feature | Role::Target => NUMBER,
            Role::EventTime | Role::Time => TIME,
        }
    }

    /// The `dualgp` flag that names this role's column (the same key in a
    /// pipeline file's `[columns]`), if there is one.
    pub fn flag(self) -> Option<&'static str> {
        match self {
            Role::Id => Some("--id"),
            Role::Feature => Some("--features"),
            Role::Target => Some("--target"),
            Role::Output => Some("--output-column"),
            Role::Time => Some("--time-column"),
            Role::Fold | Role::Task | Role::EventTime => None,
        }
    }

    /// The role in words, for messages.
    pub fn noun(self) -> &'static str {
        match self {
            Role::Id => "id",
            Role::Feature => "feature",
            Role::Target => "target",
            Role::Output => "output",
            Role::Fold => "fold",
            Role::Task => "task",
            Role::EventTime => "event-time",
            Role::Time => "time",
        }
    }
}

/// Why the columns of a schema cannot make up records: the one error of the
/// column reader, whatever the data came from. Each message names the column
/// and says which flag chooses another ([`SchemaError::hint`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SchemaError {
    /// A column the records need is not there.
    #[error("no column `{column}`; the columns are: {}", .available.join(", "))]
    MissingColumn {
        /// What the column was for.
        role: Role,
        /// The column asked for.
        column: String,
        /// The columns there are.
        available: Vec<String>,
    },
    /// No column is a feature by the [`Features`] rule.
    #[error("no feature columns {wanted}; the columns are: {}", .available.join(", "))]
    NoFeatures {
        /// What was looked for, e.g. "named x<N> (e.g. x0, x1)".
        wanted: String,
        /// The columns there are.
        available: Vec<String>,
    },
    /// A column has a type its role does not take.
    #[error("column `{column}` has type {found}, expected {expected}")]
    WrongType {
        /// What the column was for.
        role: Role,
        /// The column.
        column: String,
        /// Its Arrow type.
        found: DataType,
        /// The types the role takes.
        expected: &'static str,
    },
    /// The features found are not as many as the stream's.
    #[error("{found} feature columns ({names}), but the stream has {expected}")]
    Dimension {
        /// The stream's features.
        expected: usize,
        /// The features found.
        found: usize,
        /// Their names, comma-separated.
        names: String,
    },
    /// A column of an accepted type could not be converted (a batch of
    /// another schema than the one checked).
    #[error("cannot convert column `{column}`: {detail}")]
    Convert {
        /// The column.
        column: String,
        /// The conversion's reason.
        detail: String,
    },
}

impl SchemaError {
    /// What to do about it, naming the flag that chooses the column.
    pub fn hint(&self) -> String {
        let flag_or_input = |role: Role, what: &str| match role.flag() {
            Some(flag) => format!("{what} with {flag} (or fix the input)"),
            None => "fix the input".into(),
        };
        match self {
            SchemaError::MissingColumn { role, .. } => {
                flag_or_input(*role, &format!("name the {} column", role.noun()))
            }
            SchemaError::WrongType { role, .. } => {
                flag_or_input(*role, &format!("convert it, or choose another {} column", role.noun()))
            }
            SchemaError::NoFeatures { .. } => {
                "name the feature columns with --features (`a,b,c`, or a glob such as `feat_*`)".into()
            }
            SchemaError::Dimension { .. } => "send the same features as before, or name them with --features".into(),
            SchemaError::Convert { .. } => "fix the input".into(),
        }
    }

    /// The same problem as a per-message dead-letter reason.
    pub fn to_reason(&self) -> Reason {
        match self {
            SchemaError::MissingColumn { column, .. } => Reason::MissingField { field: column.clone() },
            SchemaError::WrongType {
                column,
                found,
                expected,
                ..
            } => Reason::WrongType {
                field: column.clone(),
                expected: (*expected).into(),
                found: found.to_string(),
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

/// The names of `schema`'s columns, in order.
pub fn column_names(schema: &Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

/// The type of column `name` in `schema`, checked for `role`.
pub fn typed_column(schema: &Schema, name: &str, role: Role) -> Result<DataType, SchemaError> {
    let field = schema.field_with_name(name).map_err(|_| SchemaError::MissingColumn {
        role,
        column: name.into(),
        available: column_names(schema),
    })?;
    if role.accepts(field.data_type()) {
        Ok(field.data_type().clone())
    } else {
        Err(SchemaError::WrongType {
            role,
            column: name.into(),
            found: field.data_type().clone(),
            expected: role.expected(),
        })
    }
}

/// The feature columns of `schema` by `features`, each checked to be a
/// number. Columns named in `others` (the id, target, … columns) are never
/// matched by a prefix or a glob.
pub fn feature_columns(features: &Features, schema: &Schema, others: &[&str]) -> Result<Vec<String>, SchemaError> {
    let names = column_names(schema);
    let candidates: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !others.contains(n))
        .collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let resolved = features.resolve_among(&all, &candidates).map_err(|e| match e {
        UnresolvedFeatures::Missing(column) => SchemaError::MissingColumn {
            role: Role::Feature,
            column,
            available: names.clone(),
        },
        other => SchemaError::NoFeatures {
            wanted: other.wanted(),
            available: names.clone(),
        },
    })?;
    for name in &resolved {
        typed_column(schema, name, Role::Feature)?;
    }
    Ok(resolved)
}

/// A column of an accepted number type as `f64` (nulls stay null).
pub fn to_f64(array: &ArrayRef) -> Result<Float64Array, ArrowError> {
    Ok(cast(array, &DataType::Float64)?.as_primitive::<Float64Type>().clone())
}

/// A column of an accepted integer type as `i64`; a value beyond `i64`
/// (a large uint64) becomes null, never a wrapped number.
pub fn to_i64(array: &ArrayRef) -> Result<Int64Array, ArrowError> {
    Ok(cast(array, &DataType::Int64)?.as_primitive::<Int64Type>().clone())
}

/// The first row where `converted` is null although `raw` is not: a value
/// the conversion could not hold.
pub fn first_unconverted(raw: &ArrayRef, converted: &dyn Array) -> Option<usize> {
    (converted.null_count() > raw.null_count())
        .then(|| (0..raw.len()).find(|&i| converted.is_null(i) && !raw.is_null(i)))
        .flatten()
}

/// How to choose the feature columns.
///
/// In TOML: `features = { prefix = "x" }`, `features = { names = ["a", "b"] }`
/// or `features = { glob = ["feat_*"] }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Features {
    /// Every column named `PREFIX<N>` (N decimal digits), ordered by N
    /// numerically (`x2` before `x10`).
    Prefix(String),
    /// Exactly these columns, in this order.
    Names(Vec<String>),
    /// Names and glob patterns (`*`: any text, `?`: any one character), in
    /// this order; each pattern stands for every column it matches, in
    /// natural order (numbers in names by value: `f2` before `f10`). A
    /// column matched twice counts once; a name must be there, and a pattern
    /// must match something.
    Glob(Vec<String>),
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
    /// No column matches the pattern.
    NoneMatching(String),
}

impl UnresolvedFeatures {
    /// What was looked for, for an error message.
    pub fn wanted(&self) -> String {
        match self {
            UnresolvedFeatures::Empty => "(the list of feature names is empty)".into(),
            UnresolvedFeatures::Missing(name) => format!("named {name}"),
            UnresolvedFeatures::NoneWithPrefix(prefix) => format!("named {prefix}<N> (e.g. {prefix}0, {prefix}1)"),
            UnresolvedFeatures::NoneMatching(pattern) => format!("matching `{pattern}`"),
        }
    }
}

impl Features {
    /// The feature columns among `available`, in feature order.
    pub fn resolve(&self, available: &[&str]) -> Result<Vec<String>, UnresolvedFeatures> {
        self.resolve_among(available, available)
    }

    /// The feature columns: names looked up in `available`, prefixes and
    /// patterns matched against `candidates` (the columns that are not
    /// another role's), in feature order.
    pub fn resolve_among(&self, available: &[&str], candidates: &[&str]) -> Result<Vec<String>, UnresolvedFeatures> {
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
                let mut found: Vec<(u128, &str)> = candidates
                    .iter()
                    .filter_map(|&name| Some((prefixed_index(prefix, name)?, name)))
                    .collect();
                found.sort();
                if found.is_empty() {
                    return Err(UnresolvedFeatures::NoneWithPrefix(prefix.clone()));
                }
                Ok(found.into_iter().map(|(_, n)| n.to_owned()).collect())
            }
            Features::Glob(patterns) => {
                if patterns.is_empty() {
                    return Err(UnresolvedFeatures::Empty);
                }
                let mut out: Vec<String> = Vec::new();
                for pattern in patterns {
                    if !is_glob(pattern) {
                        if !available.contains(&pattern.as_str()) {
                            return Err(UnresolvedFeatures::Missing(pattern.clone()));
                        }
                        if !out.contains(pattern) {
                            out.push(pattern.clone());
                        }
                        continue;
                    }
                    let mut matched: Vec<&str> = candidates
                        .iter()
                        .copied()
                        .filter(|name| glob_match(pattern, name))
                        .collect();
                    if matched.is_empty() {
                        return Err(UnresolvedFeatures::NoneMatching(pattern.clone()));
                    }
                    matched.sort_by(|a, b| natural_cmp(a, b));
                    for name in matched {
                        if !out.iter().any(|o| o == name) {
                            out.push(name.to_owned());
                        }
                    }
                }
                Ok(out)
            }
        }
    }

    /// `a,b,c` as names, or, where an item has `*` or `?`, as names and
    /// patterns; `None` for an empty item.
    pub fn parse_list(text: &str) -> Option<Features> {
        let items: Vec<String> = text.split(',').map(|s| s.trim().to_owned()).collect();
        if items.iter().any(String::is_empty) {
            return None;
        }
        Some(match items.iter().any(|i| is_glob(i)) {
            true => Features::Glob(items),
            false => Features::Names(items),
        })
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

/// Whether `text` is a pattern rather than a name.
pub(crate) fn is_glob(text: &str) -> bool {
    text.contains(['*', '?'])
}

/// Whether `name` matches `pattern`: `*` any run of characters (also none),
/// `?` any one character, everything else itself.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    // Where the last `*` was, and the name position it has swallowed up to.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Names in natural order: runs of digits compare by value, the rest as text.
pub(crate) fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn runs(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ra, rb) = (runs(a), runs(b));
    for ((da, sa), (db, sb)) in ra.iter().zip(&rb) {
        let order = match (da, db) {
            (true, true) => {
                let (ta, tb) = (sa.trim_start_matches('0'), sb.trim_start_matches('0'));
                ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb))
            }
            _ => sa.cmp(sb),
        };
        if order.is_ne() {
            return order;
        }
    }
    ra.len().cmp(&rb.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_shells_do() {
        for (pattern, name) in [
            ("x*", "x0"),
            ("x*", "x"),
            ("feat_*", "feat_b"),
            ("*_in", "a_in"),
            ("a?c", "abc"),
            ("*", ""),
            ("a*b*c", "aXbYbZc"),
            ("é*", "été"),
        ] {
            assert!(glob_match(pattern, name), "{pattern} {name}");
        }
        for (pattern, name) in [("x*", "y0"), ("a?c", "ac"), ("a*b", "abc"), ("feat_*", "feat")] {
            assert!(!glob_match(pattern, name), "{pattern} {name}");
        }
    }

    #[test]
    fn natural_order_reads_numbers_by_value() {
        let mut names = vec!["f10", "f2", "f1", "g", "f02x", "f"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["f", "f1", "f2", "f02x", "f10", "g"]);
    }

    #[test]
    fn globs_expand_in_natural_order_without_other_roles_or_repeats() {
        let available = ["id", "b", "x10", "x2", "a", "y"];
        let candidates = ["b", "x10", "x2", "a"];
        let glob = Features::parse_list("x*, a, *").unwrap();
        assert_eq!(
            glob.resolve_among(&available, &candidates).unwrap(),
            ["x2", "x10", "a", "b"]
        );
        assert_eq!(
            Features::parse_list("z*").unwrap().resolve(&available),
            Err(UnresolvedFeatures::NoneMatching("z*".into()))
        );
        assert_eq!(
            Features::parse_list("x*,c").unwrap().resolve(&available),
            Err(UnresolvedFeatures::Missing("c".into()))
        );
        assert_eq!(
            Features::parse_list("a,b"),
            Some(Features::Names(vec!["a".into(), "b".into()]))
        );
        assert_eq!(Features::parse_list("a,,b"), None);
        assert_eq!(Features::parse_list(""), None);
    }

    #[test]
    fn every_numeric_type_is_a_number_and_only_integers_are_ids() {
        use arrow::datatypes::TimeUnit;
        use DataType::*;
        let integers = [Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64];
        let floats = [Float16, Float32, Float64];
        let decimals = [Decimal32(9, 2), Decimal64(18, 3), Decimal128(38, 0), Decimal256(76, 10)];
        let others: Vec<DataType> = floats.into_iter().chain(decimals).collect();
        for t in &integers {
            assert!(
                Role::Id.accepts(t) && Role::Feature.accepts(t) && Role::Target.accepts(t),
                "{t}"
            );
        }
        for t in &others {
            assert!(
                !Role::Id.accepts(t) && Role::Feature.accepts(t) && Role::Target.accepts(t),
                "{t}"
            );
        }
        for t in [Utf8, Boolean, Date32, Null] {
            assert!(!Role::Feature.accepts(&t) && !Role::Id.accepts(&t), "{t}");
        }
        assert!(Role::EventTime.accepts(&Timestamp(TimeUnit::Millisecond, None)));
    }
}
