//! One column reader with one set of type rules: a file the streaming source
//! accepts (`replay`; `serve`'s Arrow IPC messages go through the same
//! decoder), the whole-table reader accepts (`eval`, `suggest`), and the
//! reverse, for every Arrow numeric type (and a few others, refused by both
//! with the same error); accepted values read the same, bit for bit. CSV
//! files with their own column names read as the same data in Parquet with
//! ours, and a bad CSV file or a missing column is one clear error.

mod common;

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, TimeUnit};
use common::{read_parts, temp_parquet, write_parquet};
use dualgp_connectors::{
    Column, ColumnMapping, ColumnSpec, EpochRule, Features, FileError, ParquetPosition, ParquetSource,
    ParquetSourceConfig, Role, SchemaError, SourceError, Table, TableError, WorkerShare,
};
use dualgp_operators::dataflow::Record;

/// Types no role takes as a number (an event time aside).
fn other_types() -> Vec<DataType> {
    vec![
        DataType::Utf8,
        DataType::Boolean,
        DataType::Date32,
        DataType::Timestamp(TimeUnit::Millisecond, None),
    ]
}

const VALUES: [i64; 4] = [0, 1, 2, 3];

fn of_type(t: &DataType) -> ArrayRef {
    let ints: ArrayRef = Arc::new(Int64Array::from(VALUES.to_vec()));
    cast(&ints, t).unwrap_or_else(|e| panic!("{t}: {e}"))
}

fn float64() -> ArrayRef {
    Arc::new(Float64Array::from(VALUES.map(|v| v as f64 / 4.0).to_vec()))
}

/// Every record of a file, read by the streaming source alone.
fn streamed(path: &std::path::Path, config: &ParquetSourceConfig) -> Result<Vec<Record>, SourceError> {
    let mut source = ParquetSource::open(path, config, WorkerShare::ALONE, None)?;
    let mut records = Vec::new();
    while let Some(part) = source.next_epoch()? {
        assert!(part.dead_letters.is_empty(), "{:?}", part.dead_letters);
        records.extend(part.records);
    }
    Ok(records)
}

/// The table's rows as records, to compare with the stream's.
fn as_records(t: &Table) -> Vec<Record> {
    let labels = t.labels.clone().unwrap_or_default();
    (0..t.n())
        .map(|i| {
            Record::new(
                t.ids[i],
                t.features.row(i).iter().copied().collect(),
                labels.get(i).copied(),
            )
        })
        .collect()
}

fn bits(records: &[Record]) -> Vec<(i64, Vec<u64>, Option<u64>)> {
    records
        .iter()
        .map(|r| {
            let features = r.features.iter().map(|x| x.to_bits()).collect();
            (r.id, features, r.label.map(f64::to_bits))
        })
        .collect()
}

#[test]
fn the_stream_and_the_table_accept_and_refuse_the_same_column_types() {
    let cases = [("id", Role::Id), ("x0", Role::Feature), ("y", Role::Target)];
    for t in common::numeric_types().into_iter().chain(other_types()) {
        for (column, role) in cases {
            let mut columns: Vec<(&str, ArrayRef)> = vec![
                ("id", Arc::new(Int64Array::from(VALUES.to_vec()))),
                ("x0", float64()),
                ("x1", float64()),
                ("y", float64()),
            ];
            let at = columns.iter().position(|(n, _)| *n == column).unwrap();
            columns[at].1 = of_type(&t);
            let (_dir, path) = temp_parquet("types.parquet", 1000, columns);
            let stored = common::read_parquet(&path);
            assert_eq!(stored.column(at).data_type(), &t, "the file holds {t}");

            let table = Table::read(&path, &ColumnSpec::default());
            let stream = streamed(&path, &ParquetSourceConfig::default());
            match (&table, &stream) {
                (Ok(table), Ok(stream)) => {
                    assert!(role.accepts(&t), "{t} as {column} was accepted");
                    assert_eq!(bits(&as_records(table)), bits(stream), "{t} as {column}");
                    let read = match role {
                        Role::Id => table.ids.iter().map(|&i| i as f64).collect::<Vec<_>>(),
                        Role::Target => table.labels.clone().unwrap(),
                        _ => table.features.column(0).iter().copied().collect(),
                    };
                    assert_eq!(read, VALUES.map(|v| v as f64), "{t} as {column}: converted to f64");
                }
                (Err(TableError::Schema { source: eval, .. }), Err(SourceError::Schema { source: replay, .. })) => {
                    assert!(!role.accepts(&t), "{t} as {column} was refused");
                    assert_eq!(eval, replay, "one error for both readers");
                    assert!(
                        matches!(eval, SchemaError::WrongType { column: c, role: r, .. } if c == column && *r == role),
                        "{eval}"
                    );
                }
                _ => panic!(
                    "{t} as {column}: the table said {:?}, the stream {:?}",
                    table.as_ref().err(),
                    stream.as_ref().err()
                ),
            }
        }
    }
}

/// The same rows as Parquet in our names (`id`, `x0..x2`, `y`) and as CSV in
/// the user's (`key`, `a`, `b`, `c`, `target`, plus a text column).
fn same_rows_two_ways(dir: &std::path::Path, n: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let value = |i: usize, k: usize| ((i * 7919 + k * 104_729) % 1000) as f64 / 37.0 - 13.0 + 1e-9 * k as f64;
    let parquet = dir.join("ours.parquet");
    write_parquet(
        &parquet,
        vec![
            ("id", Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef),
            (
                "x0",
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| value(i, 0)))),
            ),
            (
                "x1",
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| value(i, 1)))),
            ),
            (
                "x2",
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| value(i, 2)))),
            ),
            (
                "y",
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| value(i, 3)))),
            ),
        ],
        9,
    );
    let csv = dir.join("theirs.csv");
    let mut text = String::from("note,target,b,key,a,c\n");
    for i in 0..n {
        text.push_str(&format!(
            "\"row {i}\",{:?},{:?},{i},{:?},{:?}\n",
            value(i, 3),
            value(i, 1),
            value(i, 0),
            value(i, 2)
        ));
    }
    std::fs::write(&csv, text).unwrap();
    (parquet, csv)
}

fn their_mapping() -> ColumnMapping {
    ColumnMapping {
        id: "key".into(),
        label: Some("target".into()),
        ..ColumnMapping::default().with_features(["a", "b", "c"])
    }
}

#[test]
fn a_csv_file_in_its_own_names_reads_as_the_same_data_in_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let (parquet, csv) = same_rows_two_ways(dir.path(), 103);

    // The whole-table reader (eval).
    let ours = Table::read(&parquet, &ColumnSpec::default()).unwrap();
    let spec = ColumnSpec::default()
        .with_id("key")
        .with_features(["a", "b", "c"])
        .with_label(Column::Required("target".into()));
    let theirs = Table::read(&csv, &spec).unwrap();
    assert_eq!(bits(&as_records(&ours)), bits(&as_records(&theirs)));

    // The streaming source (replay), with a glob for the features, on
    // several workers, groups and a resume.
    let glob = ColumnMapping {
        features: Features::Glob(vec!["a".into(), "?".into()]),
        ..their_mapping()
    };
    for (mapping, expected) in [(their_mapping(), "a,b,c"), (glob, "a,b,c")] {
        let config = |mapping: ColumnMapping| ParquetSourceConfig {
            mapping,
            epochs: EpochRule::Rows(10),
            batch_rows: 7,
        };
        let source = ParquetSource::open(&csv, &config(mapping.clone()), WorkerShare::ALONE, None).unwrap();
        assert_eq!(source.feature_names().join(","), expected);
        assert_eq!((source.n_rows(), source.n_epochs()), (103, Some(11)));
        let of_epochs = |path: &std::path::Path, mapping: ColumnMapping, peers: usize, from: Option<u64>| {
            let mut epochs: Vec<(u64, Vec<Record>)> = Vec::new();
            for index in 0..peers {
                let resume = from.map(|e| ParquetPosition {
                    next_epoch: e,
                    rows_before: Some(e * 10),
                });
                for part in read_parts(path, &config(mapping.clone()), WorkerShare::new(index, peers), resume) {
                    match epochs.iter_mut().find(|(e, _)| *e == part.epoch) {
                        Some((_, records)) => records.extend(part.records),
                        None => epochs.push((part.epoch, part.records)),
                    }
                }
            }
            epochs.sort_by_key(|(e, _)| *e);
            epochs
                .into_iter()
                .map(|(e, mut r)| {
                    r.sort_by_key(|r| r.id);
                    (e, bits(&r))
                })
                .collect::<Vec<_>>()
        };
        let reference = of_epochs(&parquet, ColumnMapping::default(), 1, None);
        for (peers, from) in [(1, None), (2, None), (3, Some(4))] {
            let read = of_epochs(&csv, mapping.clone(), peers, from);
            let skip = from.unwrap_or(0) as usize;
            assert_eq!(read, reference[skip..], "{peers} workers from {from:?}");
        }
    }
}

#[test]
fn event_time_windows_of_a_csv_file_agree_on_any_number_of_workers() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("timed.csv");
    // Times mostly rising, with late rows.
    let times = [0.5, 1.2, 0.9, 3.1, 2.0, 4.4, 4.0, 7.5, 1.0, 8.2, 8.9, 9.9, 6.0, 12.5];
    let mut text = String::from("key,t,a,target\n");
    for (i, t) in times.iter().enumerate() {
        text.push_str(&format!("{i},{t:?},{:?},{:?}\n", i as f64 * 0.1, i as f64));
    }
    std::fs::write(&csv, text).unwrap();
    let config = ParquetSourceConfig {
        mapping: their_mapping().with_features(["a"]).with_event_time("t"),
        epochs: EpochRule::EventTime {
            width: 2.0,
            origin: 0.0,
        },
        batch_rows: 3,
    };
    let epochs = |peers: usize| {
        let mut all: Vec<(u64, String)> = Vec::new();
        for index in 0..peers {
            for part in read_parts(&csv, &config, WorkerShare::new(index, peers), None) {
                all.extend(part.records.iter().map(|r| (part.epoch, format!("id {}", r.id))));
                all.extend(
                    part.dead_letters
                        .iter()
                        .map(|d| (part.epoch, format!("late {}", d.origin))),
                );
            }
        }
        all.sort();
        all
    };
    let alone = epochs(1);
    assert!(
        alone.iter().any(|(_, what)| what.starts_with("late")),
        "some rows are late: {alone:?}"
    );
    assert_eq!(epochs(2), alone);
    assert_eq!(epochs(3), alone);
}

/// How the table reader and the stream refuse `path`.
fn refused_both_ways(
    path: &std::path::Path,
    spec: &ColumnSpec,
    config: &ParquetSourceConfig,
) -> (TableError, SourceError) {
    let table = Table::read(path, spec).unwrap_err();
    let stream = ParquetSource::open(path, config, WorkerShare::ALONE, None)
        .err()
        .unwrap();
    (table, stream)
}

#[test]
fn a_bad_csv_file_or_a_missing_column_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let (_, csv) = same_rows_two_ways(dir.path(), 50);
    // Cut in the middle of a line, before its third comma.
    let whole = std::fs::read_to_string(&csv).unwrap();
    let start = whole[..whole.len() / 2].rfind('\n').unwrap() + 1;
    let cut = start + whole[start..].match_indices(',').nth(2).unwrap().0;
    let line = whole[..start].matches('\n').count() + 1;
    let truncated = dir.path().join("truncated.csv");
    std::fs::write(&truncated, &whole[..cut]).unwrap();
    let spec = ColumnSpec::default().with_id("key");
    let config = ParquetSourceConfig {
        mapping: their_mapping(),
        ..ParquetSourceConfig::default()
    };

    let (table, stream) = refused_both_ways(&truncated, &spec, &config);
    assert!(matches!(table, TableError::File(FileError::NotCsv { .. })), "{table:?}");
    assert!(
        matches!(stream, SourceError::File(FileError::NotCsv { .. })),
        "{stream:?}"
    );
    for said in [table.to_string(), stream.to_string()] {
        assert!(
            said.contains("truncated.csv") && said.contains(&format!("line {line}")),
            "{said}"
        );
        assert!(!said.contains('\n'), "{said}");
    }

    // A header and no rows: said as such, not as a column of type Null.
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, whole.lines().next().unwrap()).unwrap();
    let (table, stream) = refused_both_ways(&empty, &spec, &config);
    assert!(
        matches!(table, TableError::File(FileError::EmptyCsv { .. })),
        "{table:?}"
    );
    assert!(
        matches!(stream, SourceError::File(FileError::EmptyCsv { .. })),
        "{stream:?}"
    );
    for said in [table.to_string(), stream.to_string()] {
        assert!(said.contains("empty.csv has a header but no rows"), "{said}");
    }

    // Our default columns are not in their file: each error names the column and its flag.
    let table = Table::read(&csv, &ColumnSpec::default()).unwrap_err().to_string();
    assert!(table.contains("no column `id`") && table.contains("--id"), "{table}");
    assert!(
        table.contains("note, target, b, key, a, c"),
        "lists the columns: {table}"
    );
    let missing_target = ColumnMapping {
        label: Some("y".into()),
        ..their_mapping()
    };
    let config = ParquetSourceConfig {
        mapping: missing_target,
        ..ParquetSourceConfig::default()
    };
    let stream = ParquetSource::open(&csv, &config, WorkerShare::ALONE, None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        stream.contains("no column `y`") && stream.contains("--target"),
        "{stream}"
    );
    let prefix = ParquetSourceConfig {
        mapping: ColumnMapping {
            features: Features::Prefix("x".into()),
            ..their_mapping()
        },
        ..ParquetSourceConfig::default()
    };
    let stream = ParquetSource::open(&csv, &prefix, WorkerShare::ALONE, None)
        .err()
        .unwrap()
        .to_string();
    assert!(stream.contains("x<N>") && stream.contains("--features"), "{stream}");

    // A text column where a feature should be: its type, and the flag.
    let text = ColumnSpec::default()
        .with_id("key")
        .with_features(["a", "note"])
        .with_label(Column::Required("target".into()));
    let said = Table::read(&csv, &text).unwrap_err().to_string();
    assert!(
        said.contains("column `note` has type Utf8") && said.contains("--features"),
        "{said}"
    );
}
