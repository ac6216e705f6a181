//! The column flags every command that reads data shares (`eval`, `replay`,
//! `serve`, `suggest`, and a pipeline file's `[columns]` table): which
//! columns of a file (or fields of a Kafka message) are the id, the
//! features, the target and the output. Unset, they are the project's
//! layout (`id`, `x0, x1, …`, `y`, `output`), so data in that layout reads
//! as it always has.

use anyhow::{anyhow, bail, Result};
use clap::Args;
use dualgp_connectors::{Column, ColumnMapping, ColumnSpec, Features};
use dualgp_operators::model::Likelihood;
use serde::{Deserialize, Deserializer};

/// Which columns make up a record. In a pipeline file, the same names form
/// the `[columns]` table (`features` there may also be a list of names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColumnArgs {
    /// The record id column (or JSON field), integer [default: id]
    #[arg(long = "id", value_name = "NAME")]
    pub id: Option<String>,
    /// The feature columns, in this order: names `a,b,c`, or globs such as
    /// `feat_*` (`*` any text, `?` one character; a glob's columns in natural
    /// order, f2 before f10, never the id, target or output column)
    /// [default: x0, x1, … by number]
    #[arg(long, value_name = "NAMES")]
    #[serde(deserialize_with = "names_or_list")]
    pub features: Option<String>,
    /// The target (label) column; a null or absent target is only scored [default: y]
    #[arg(long, value_name = "NAME")]
    pub target: Option<String>,
    /// The column saying which output a record observes (0, 1, …), for a
    /// model of several outputs [default: output]
    #[arg(long, value_name = "NAME")]
    pub output_column: Option<String>,
    /// A column of the records' times (numbers in any unit, or timestamps in
    /// seconds) for streams whose level wanders: past records lose weight
    /// with the time since them (`--forget-half-life` in this column's units;
    /// `auto` unless given), and the column is no kernel input unless
    /// `--features` names it (replay, serve)
    #[arg(long, value_name = "NAME")]
    pub time_column: Option<String>,
}

/// `features` in a pipeline file: `"a,b"` as on the command line, or `["a", "b"]`.
fn names_or_list<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Text(String),
        List(Vec<String>),
    }
    Ok(Some(match Given::deserialize(d)? {
        Given::Text(text) => text,
        Given::List(list) => list.join(","),
    }))
}

impl ColumnArgs {
    /// These columns with every one `over` names taking precedence.
    pub fn overridden_by(&self, over: &ColumnArgs) -> ColumnArgs {
        ColumnArgs {
            id: over.id.clone().or_else(|| self.id.clone()),
            features: over.features.clone().or_else(|| self.features.clone()),
            target: over.target.clone().or_else(|| self.target.clone()),
            output_column: over.output_column.clone().or_else(|| self.output_column.clone()),
            time_column: over.time_column.clone().or_else(|| self.time_column.clone()),
        }
    }

    /// The feature rule: `--features` as names or globs, else `x<N>` by number.
    pub fn features(&self) -> Result<Features> {
        match &self.features {
            None => Ok(Features::Prefix("x".into())),
            Some(text) => Features::parse_list(text).ok_or_else(|| {
                anyhow!("--features {text:?}: give column names or globs separated by commas, none empty (e.g. a,b,c or feat_*)")
            }),
        }
    }

    /// Checks every name given: none empty.
    fn check(&self) -> Result<()> {
        for (flag, name) in [
            ("--id", &self.id),
            ("--target", &self.target),
            ("--output-column", &self.output_column),
            ("--time-column", &self.time_column),
        ] {
            if name.as_deref().is_some_and(|n| n.trim().is_empty()) {
                return Err(anyhow!("{flag} is empty: give a column name"));
            }
        }
        Ok(())
    }

    /// The streaming sources' mapping (replay, serve): the default layout
    /// for `likelihood`, with the columns given here.
    pub fn mapping(&self, likelihood: &Likelihood) -> Result<ColumnMapping> {
        self.check()?;
        let mut mapping = ColumnMapping::for_likelihood(likelihood);
        if let Some(id) = &self.id {
            mapping.id = id.clone();
        }
        mapping.features = self.features()?;
        if let Some(target) = &self.target {
            mapping.label = Some(target.clone());
        }
        if let Some(output) = &self.output_column {
            mapping.output = output.clone();
        }
        mapping.time = self.time_column.clone();
        Ok(mapping)
    }

    /// The whole-table reader's columns (eval, suggest): the default layout
    /// with the columns given here (the target required).
    pub fn spec(&self) -> Result<ColumnSpec> {
        self.check()?;
        if self.time_column.is_some() {
            bail!("--time-column is for streams (replay, serve): a whole table has no age to forget by");
        }
        let mut spec = ColumnSpec::default();
        if let Some(id) = &self.id {
            spec = spec.with_id(id.clone());
        }
        spec.features = self.features()?;
        if let Some(target) = &self.target {
            spec = spec.with_label(Column::Required(target.clone()));
        }
        if let Some(output) = &self.output_column {
            spec.output = Column::IfPresent(output.clone());
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_columns_are_the_project_layout() {
        let likelihood = Likelihood::parse("gaussian").unwrap();
        let none = ColumnArgs::default();
        assert_eq!(
            none.mapping(&likelihood).unwrap(),
            ColumnMapping::for_likelihood(&likelihood)
        );
        assert_eq!(none.spec().unwrap(), ColumnSpec::default());
    }

    #[test]
    fn given_columns_replace_the_defaults() {
        let args = ColumnArgs {
            id: Some("key".into()),
            features: Some("a, b".into()),
            target: Some("target".into()),
            output_column: Some("task_out".into()),
            time_column: None,
        };
        let mapping = args.mapping(&Likelihood::parse("gaussian").unwrap()).unwrap();
        assert_eq!(
            (mapping.id.as_str(), mapping.label.as_deref(), mapping.output.as_str()),
            ("key", Some("target"), "task_out")
        );
        assert_eq!(mapping.features, Features::Names(vec!["a".into(), "b".into()]));
        let spec = args.spec().unwrap();
        assert_eq!(spec.label, Column::Required("target".into()));
        // A time column is the streams' (their records age by it), not a whole table's.
        let timed = ColumnArgs {
            time_column: Some("date".into()),
            ..args
        };
        let mapping = timed.mapping(&Likelihood::parse("gaussian").unwrap()).unwrap();
        assert_eq!(mapping.time.as_deref(), Some("date"));
        assert!(timed.spec().unwrap_err().to_string().contains("--time-column"));
        let globbed = ColumnArgs {
            features: Some("feat_*".into()),
            ..ColumnArgs::default()
        };
        assert_eq!(globbed.features().unwrap(), Features::Glob(vec!["feat_*".into()]));
        for bad in ["a,,b", ""] {
            let args = ColumnArgs {
                features: Some(bad.into()),
                ..ColumnArgs::default()
            };
            assert!(args.spec().unwrap_err().to_string().contains("--features"));
        }
        let empty_id = ColumnArgs {
            id: Some(" ".into()),
            ..ColumnArgs::default()
        };
        assert!(empty_id.spec().unwrap_err().to_string().contains("--id"));
    }

    #[test]
    fn a_pipeline_files_features_may_be_a_list() {
        let list: ColumnArgs = toml::from_str("features = [\"a\", \"b\"]\ntarget = \"t\"").unwrap();
        let text: ColumnArgs = toml::from_str("features = \"a,b\"\ntarget = \"t\"").unwrap();
        assert_eq!(list, text);
        assert!(
            toml::from_str::<ColumnArgs>("label = \"t\"").is_err(),
            "unknown keys are refused"
        );
    }
}
