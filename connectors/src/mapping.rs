//! Which columns (or JSON fields) make up a [`Record`](dualgp_operators::dataflow::Record),
//! and what a valid label is.
//!
//! In TOML:
//!
//! ```toml
//! id = "id"
//! features = { prefix = "x" }     # or { names = ["a", "b"] }, or { glob = ["feat_*"] }
//! label = "y"                     # omit for a stream that is only scored
//! labels = { classes = 2 }        # or "real" (default) or "count"
//! event_time = "t"                # optional: epochs by event time
//! time = "t"                      # optional: forgetting's clock, not a feature
//! output = "output"               # which output a record observes
//! outputs = 2                     # the model's outputs (default 1)
//! ```

use dualgp_operators::model::Likelihood;
use serde::{Deserialize, Serialize};

use crate::columns::Features;
use crate::dead_letter::{number_text, Reason};

/// Which columns make up a record. The default is the project's data layout:
/// id `id`, features `x0, x1, …`, real label `y`, no event time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColumnMapping {
    /// The record id (an integer column or field).
    pub id: String,
    /// The feature columns: by name, prefix or glob.
    pub features: Features,
    /// The number of features, for sources without a schema (JSON) whose
    /// features are given by prefix (`x0..x{d-1}`) or glob. When unset
    /// there, the first decodable message fixes it.
    pub dimension: Option<usize>,
    /// The label column; a null or absent label means "score only".
    pub label: Option<String>,
    /// What a valid label is.
    pub labels: LabelKind,
    /// A column of event times (numbers in the column's own unit, or Arrow
    /// timestamps in seconds since the Unix epoch), for event-time epochs.
    pub event_time: Option<String>,
    /// A column of the records' times (numbers in the column's own unit, or
    /// Arrow timestamps in seconds since the Unix epoch): forgetting counts a
    /// record's age in it (`Record::time`). Not a feature unless `features`
    /// names it.
    pub time: Option<String>,
    /// The integer column (or JSON field) naming the output a record
    /// observes, `0..outputs`. Without it a record observes output 0, which
    /// only a single-output model accepts.
    pub output: String,
    /// The model's outputs: 1 for a single-output model; above 1 the output
    /// column is required.
    pub outputs: usize,
}

impl Default for ColumnMapping {
    fn default() -> Self {
        ColumnMapping {
            id: "id".into(),
            features: Features::Prefix("x".into()),
            dimension: None,
            label: Some("y".into()),
            labels: LabelKind::Real,
            event_time: None,
            time: None,
            output: "output".into(),
            outputs: 1,
        }
    }
}

impl ColumnMapping {
    /// The default layout with labels checked for `likelihood`: class indices,
    /// counts or real numbers.
    pub fn for_likelihood(likelihood: &Likelihood) -> Self {
        let mapping = ColumnMapping {
            outputs: likelihood.n_outputs(),
            ..ColumnMapping::default()
        };
        match likelihood {
            Likelihood::Bernoulli { .. } => mapping.with_classes(2),
            Likelihood::Softmax { classes, .. } => mapping.with_classes(*classes),
            Likelihood::Poisson => ColumnMapping {
                labels: LabelKind::Count,
                ..mapping
            },
            Likelihood::Gaussian { .. } | Likelihood::StudentT { .. } => mapping,
            // Which labels are valid depends on a record's output: the model checks them.
            Likelihood::MultiOutput(_) => mapping,
        }
    }

    /// Labels are class indices `0..classes`.
    pub fn with_classes(mut self, classes: usize) -> Self {
        self.labels = LabelKind::Classes(classes);
        self
    }

    /// No label column: every record is only scored.
    pub fn without_label(mut self) -> Self {
        self.label = None;
        self
    }

    /// Use exactly these feature columns, in this order.
    pub fn with_features<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.features = Features::Names(names.into_iter().map(Into::into).collect());
        self
    }

    /// Epochs by event time from `column` rather than by row count.
    pub fn with_event_time(mut self, column: impl Into<String>) -> Self {
        self.event_time = Some(column.into());
        self
    }

    /// Fixes the number of features (for JSON, whose messages have no schema).
    pub fn with_dimension(mut self, d: usize) -> Self {
        self.dimension = Some(d);
        self
    }

    /// Whether every record must say which output it observes.
    pub fn requires_output(&self) -> bool {
        self.outputs > 1
    }

    /// `value` as an output index of this mapping's model, or why it is not one.
    pub fn output_index(&self, value: i64) -> Result<usize, Reason> {
        match usize::try_from(value) {
            Ok(d) if d < self.outputs => Ok(d),
            _ => Err(Reason::InvalidOutput {
                value: value.to_string(),
                outputs: self.outputs,
            }),
        }
    }

    /// The feature names when they can be known without a schema: explicit
    /// names, or a prefix with a [`dimension`](Self::dimension).
    pub fn known_feature_names(&self) -> Option<Vec<String>> {
        match (&self.features, self.dimension) {
            (Features::Names(names), _) => Some(names.clone()),
            (Features::Prefix(p), Some(d)) => Some((0..d).map(|i| format!("{p}{i}")).collect()),
            (Features::Prefix(_), None) | (Features::Glob(_), _) => None,
        }
    }
}

/// What a valid label is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelKind {
    /// Any finite number (Gaussian, Student-t).
    Real,
    /// A non-negative integer (Poisson).
    Count,
    /// A class index `0..C` (Bernoulli: C = 2; softmax).
    Classes(usize),
}

impl LabelKind {
    /// `Ok(())` when `y` is a valid label, else why not.
    pub fn check(self, y: f64) -> Result<(), Reason> {
        let ok = match self {
            LabelKind::Real => y.is_finite(),
            LabelKind::Count => y.is_finite() && y >= 0.0 && y.fract() == 0.0,
            LabelKind::Classes(c) => y.is_finite() && y >= 0.0 && y.fract() == 0.0 && y < c as f64,
        };
        if ok {
            return Ok(());
        }
        Err(Reason::InvalidLabel {
            value: number_text(y),
            expected: self.expected(),
        })
    }

    fn expected(self) -> String {
        match self {
            LabelKind::Real => "a finite number".into(),
            LabelKind::Count => "a non-negative integer count".into(),
            LabelKind::Classes(c) => format!("a class index in 0..{c}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_accept_only_indices_below_c() {
        let k = LabelKind::Classes(3);
        assert!(k.check(0.0).is_ok() && k.check(2.0).is_ok());
        for bad in [3.0, -1.0, 0.5, f64::NAN] {
            let err = k.check(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ReasonKind::InvalidLabel, "{bad}");
        }
        assert!(LabelKind::Count.check(7.0).is_ok());
        assert!(LabelKind::Count.check(-1.0).is_err());
        assert!(LabelKind::Real.check(f64::INFINITY).is_err());
    }

    #[test]
    fn output_indices_must_name_one_of_the_models_outputs() {
        let two = ColumnMapping::for_likelihood(&Likelihood::parse_outputs("gaussian,bernoulli", None).unwrap());
        assert!(two.requires_output());
        assert_eq!(two.output_index(1), Ok(1));
        for bad in [2, -1, i64::MIN] {
            assert_eq!(
                two.output_index(bad).unwrap_err().kind(),
                crate::ReasonKind::InvalidOutput
            );
        }
        let one = ColumnMapping::default();
        assert!(!one.requires_output());
        assert_eq!(one.output_index(0), Ok(0));
        let refused = one.output_index(1).unwrap_err().to_string();
        assert!(refused.contains("output 1") && refused.contains("0..1"), "{refused}");
    }

    #[test]
    fn mapping_reads_from_json_with_defaults() {
        let m: ColumnMapping =
            serde_json::from_str(r#"{"features": {"names": ["a", "b"]}, "labels": {"classes": 2}}"#).unwrap();
        assert_eq!(m.id, "id");
        assert_eq!(m.label.as_deref(), Some("y"));
        assert_eq!(m.labels, LabelKind::Classes(2));
        assert_eq!(m.known_feature_names().unwrap(), ["a", "b"]);
        let unknown = serde_json::from_str::<ColumnMapping>(r#"{"feature": {"prefix": "x"}}"#);
        assert!(unknown.is_err(), "a misspelt key is an error, not ignored");
        assert_eq!(
            ColumnMapping::default()
                .with_dimension(2)
                .known_feature_names()
                .unwrap(),
            ["x0", "x1"]
        );
    }
}
