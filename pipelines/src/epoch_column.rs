//! `eval --epoch-column COL`: the training rows cut into batches where a
//! column of the file changes value (one robot path, one task, one day a
//! batch) instead of into `--batches` equal parts.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use dualgp_connectors::{Column, ColumnSpec, Features, SchemaError, Table, TableError};

use crate::column_args::ColumnArgs;
use crate::protocol::runs;

/// The batches of the training rows (given by their ids, in stream order),
/// one per run of equal values of `column`, and each batch's value.
pub fn batches_by_column(
    data: &Path,
    columns: &ColumnArgs,
    column: &str,
    train_ids: &[i64],
) -> Result<Vec<(Range<usize>, f64)>> {
    let values = values_in_order(data, columns, column, train_ids)?;
    Ok(runs(&values)
        .into_iter()
        .map(|r| (r.clone(), values[r.start]))
        .collect())
}

/// `column`'s value for each of `ids`, in their order.
fn values_in_order(data: &Path, columns: &ColumnArgs, column: &str, ids: &[i64]) -> Result<Vec<f64>> {
    let by_id = values_by_id(data, columns, column)?;
    ids.iter()
        .map(|id| {
            by_id
                .get(id)
                .copied()
                .ok_or_else(|| anyhow!("--epoch-column {column}: no row of {} has id {id}", data.display()))
        })
        .collect()
}

/// The id and `column` of every row: the column read as a table's one
/// feature, so it is type-checked as numbers are everywhere else.
fn values_by_id(data: &Path, columns: &ColumnArgs, column: &str) -> Result<HashMap<i64, f64>> {
    let mut spec = ColumnSpec {
        features: Features::Names(vec![column.to_owned()]),
        label: Column::Skip,
        fold: Column::Skip,
        task: Column::Skip,
        output: Column::Skip,
        ..ColumnSpec::default()
    };
    if let Some(id) = &columns.id {
        spec.id = id.clone();
    }
    let table = Table::read(data, &spec).map_err(|e| explain(e, column))?;
    let mut by_id = HashMap::with_capacity(table.n());
    for (i, &id) in table.ids.iter().enumerate() {
        if by_id.insert(id, table.features[(i, 0)]).is_some() {
            bail!("--epoch-column {column}: id {id} is on several rows; the rows are matched by id, so ids must be unique");
        }
    }
    Ok(by_id)
}

/// The reader's error about the epoch column in the flag's words (the
/// reader would call it a feature and point at --features).
fn explain(e: TableError, column: &str) -> anyhow::Error {
    match &e {
        TableError::Schema {
            source: SchemaError::MissingColumn { column: missing, available, .. },
            ..
        } if missing == column => anyhow!(
            "--epoch-column {column}: the data has no column `{column}`; the columns are: {}",
            available.join(", ")
        ),
        TableError::Schema {
            source: SchemaError::WrongType { column: wrong, found, .. },
            ..
        } if wrong == column => anyhow!(
            "--epoch-column {column}: column `{column}` has type {found}, not numbers; batches are cut where a numeric column changes value, so choose one"
        ),
        _ => anyhow::Error::new(e).context(format!("--epoch-column {column}")),
    }
}
