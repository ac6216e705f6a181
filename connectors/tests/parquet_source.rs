//! Streaming Parquet files epoch by epoch: every row once, the same epochs
//! for any number of workers, resuming from a position, bad rows to dead letters.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int64Array, StringArray, TimestampMillisecondArray, UInt64Array,
};
use common::{data, read_parts, regrouped, temp_parquet, write_parquet};
use dualgp_connectors::{
    ColumnMapping, ColumnSpec, EpochPart, EpochRule, FileError, Origin, ParquetPosition, ParquetSource,
    ParquetSourceConfig, Reason, ReasonKind, SchemaError, SourceError, Table, WorkerShare,
};
use dualgp_operators::dataflow::Record;

/// Per epoch: the records (sorted by id) and dead letters (sorted by origin)
/// of all workers together.
type Merged = BTreeMap<u64, (Vec<Record>, Vec<String>)>;

fn merge(parts: impl IntoIterator<Item = EpochPart<ParquetPosition>>) -> Merged {
    let mut merged = Merged::new();
    for part in parts {
        let entry = merged.entry(part.epoch).or_default();
        entry.0.extend(part.records);
        entry
            .1
            .extend(part.dead_letters.iter().map(|d| format!("{} | {}", d.origin, d.reason)));
    }
    for (records, dead) in merged.values_mut() {
        records.sort_by_key(|r| r.id);
        dead.sort();
    }
    merged
}

fn read_all_workers(path: &std::path::Path, config: &ParquetSourceConfig, peers: usize) -> Merged {
    merge((0..peers).flat_map(|w| read_parts(path, config, WorkerShare::new(w, peers), None)))
}

fn rows(n: u64) -> ParquetSourceConfig {
    ParquetSourceConfig {
        epochs: EpochRule::Rows(n),
        ..Default::default()
    }
}

#[test]
fn elevators_streams_every_row_once_in_file_order() {
    let path = data("elevators.parquet");
    let table = Table::read(&path, &ColumnSpec::default()).unwrap();
    let mut source = ParquetSource::open(&path, &rows(1000), WorkerShare::ALONE, None).unwrap();
    assert_eq!(source.n_epochs(), Some(17));
    assert_eq!(source.feature_names().len(), 18);
    let mut next_row = 0usize;
    let mut epochs = 0;
    while let Some(part) = source.next_epoch().unwrap() {
        assert_eq!(part.epoch, epochs);
        assert!(part.dead_letters.is_empty());
        for r in &part.records {
            assert_eq!(r.id, table.ids[next_row]);
            let expected: Vec<f64> = table.features.row(next_row).iter().copied().collect();
            assert_eq!(r.features, expected, "row {next_row}");
            assert_eq!(r.label, Some(table.labels.as_ref().unwrap()[next_row]));
            next_row += 1;
        }
        assert_eq!(part.records.len(), if epochs < 16 { 1000 } else { 599 });
        assert_eq!(
            part.position,
            ParquetPosition {
                next_epoch: epochs + 1,
                rows_before: Some(next_row as u64)
            }
        );
        epochs += 1;
    }
    assert_eq!(next_row, 16599);
    assert_eq!(source.counters().records, 16599);
    assert_eq!(source.counters().total_dead_letters(), 0);
    assert!(source.next_epoch().unwrap().is_none(), "stays finished");
}

#[test]
fn epochs_are_the_same_rows_whatever_the_number_of_workers() {
    // Row groups of 700 rows against epochs of 1000: groups straddle epochs.
    let (_dir, path) = regrouped("bike", 700);
    let config = rows(1000);
    let one = read_all_workers(&path, &config, 1);
    assert_eq!(one.len(), 18);
    for (epoch, (records, _)) in &one {
        let first = *epoch as i64 * 1000;
        let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
        assert_eq!(ids, (first..(first + 1000).min(17379)).collect::<Vec<_>>());
    }
    for peers in [2, 3, 5] {
        // Every worker yields every epoch, possibly empty.
        for w in 0..peers {
            let parts = read_parts(&path, &config, WorkerShare::new(w, peers), None);
            assert_eq!(
                parts.iter().map(|p| p.epoch).collect::<Vec<_>>(),
                (0..18).collect::<Vec<_>>()
            );
        }
        assert_eq!(read_all_workers(&path, &config, peers), one, "{peers} workers");
    }
}

#[test]
fn resume_continues_where_the_checkpoint_left_off() {
    let (_dir, path) = regrouped("elevators", 1500);
    let config = rows(1000);
    let full = read_all_workers(&path, &config, 1);

    // Two workers process epochs 0..=5, then "crash"; the checkpoint holds
    // the smallest position. Three workers resume from it.
    let mut before = Vec::new();
    let mut positions = Vec::new();
    for w in 0..2 {
        let mut s = ParquetSource::open(&path, &config, WorkerShare::new(w, 2), None).unwrap();
        for _ in 0..6 {
            before.push(s.next_epoch().unwrap().unwrap());
        }
        positions.push(before.last().unwrap().position);
        s.next_epoch().unwrap(); // read past the checkpoint: must not matter
    }
    let checkpoint = *positions.iter().min().unwrap();
    assert_eq!(checkpoint.next_epoch, 6);
    let json = serde_json::to_string(&checkpoint).unwrap();
    let restored: ParquetPosition = serde_json::from_str(&json).unwrap();
    let after = (0..3).flat_map(|w| read_parts(&path, &config, WorkerShare::new(w, 3), Some(restored)));
    let resumed = merge(before.into_iter().chain(after));
    assert_eq!(resumed, full, "no row lost, none twice");
}

#[test]
fn a_position_from_another_epoch_size_is_refused() {
    let path = data("bank.parquet");
    let position = ParquetPosition {
        next_epoch: 2,
        rows_before: Some(2000),
    };
    let err = ParquetSource::open(&path, &rows(500), WorkerShare::ALONE, Some(position))
        .err()
        .unwrap();
    assert!(matches!(err, SourceError::Position { .. }), "{err}");
    assert!(err.to_string().contains("another epoch size"), "{err}");
    // The right size resumes.
    let parts = read_parts(&path, &rows(1000), WorkerShare::ALONE, Some(position));
    assert_eq!(parts[0].epoch, 2);
    assert_eq!(parts[0].records[0].id, 2000);
    // Past the end: nothing more to read.
    let end = ParquetPosition {
        next_epoch: 5,
        rows_before: Some(4521),
    };
    assert!(read_parts(&path, &rows(1000), WorkerShare::ALONE, Some(end)).is_empty());
}

#[test]
fn schema_problems_stop_the_whole_source_with_a_clear_error() {
    let path = data("elevators.parquet");
    let open = |mapping: ColumnMapping| {
        let config = ParquetSourceConfig {
            mapping,
            ..Default::default()
        };
        ParquetSource::open(&path, &config, WorkerShare::ALONE, None)
            .err()
            .unwrap()
    };
    let err = open(ColumnMapping {
        label: Some("target".into()),
        ..Default::default()
    });
    assert!(
        matches!(&err, SourceError::Schema { source: SchemaError::MissingColumn { column, .. }, .. } if column == "target"),
        "{err}"
    );
    assert!(err.to_string().contains("x17"), "lists the columns: {err}");

    let err = open(ColumnMapping::default().with_features(["x0", "fold", "nope"]));
    assert!(err.to_string().contains("no column `nope`"), "{err}");

    let z = ColumnMapping {
        features: dualgp_connectors::Features::Prefix("z".into()),
        ..Default::default()
    };
    assert!(open(z).to_string().contains("z<N>"));

    let err = open(ColumnMapping::default().with_dimension(3));
    assert!(err.to_string().contains("18 feature columns"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let strings = dir.path().join("strings.parquet");
    write_parquet(
        &strings,
        vec![
            ("id", Arc::new(Int64Array::from(vec![0, 1])) as ArrayRef),
            ("x0", Arc::new(StringArray::from(vec!["a", "b"]))),
            ("y", Arc::new(Float64Array::from(vec![0.0, 1.0]))),
        ],
        10,
    );
    let err = ParquetSource::open(&strings, &Default::default(), WorkerShare::ALONE, None)
        .err()
        .unwrap();
    assert!(
        matches!(&err, SourceError::Schema { source: SchemaError::WrongType { column, .. }, .. } if column == "x0"),
        "{err}"
    );

    let truncated = dir.path().join("truncated.parquet");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let err = ParquetSource::open(&truncated, &Default::default(), WorkerShare::ALONE, None)
        .err()
        .unwrap();
    assert!(matches!(err, SourceError::File(FileError::NotParquet { .. })), "{err}");

    let err = ParquetSource::open(
        dir.path().join("absent.parquet"),
        &Default::default(),
        WorkerShare::ALONE,
        None,
    )
    .err()
    .unwrap();
    assert!(matches!(err, SourceError::File(FileError::Open { .. })), "{err}");

    for (share, rule) in [
        (WorkerShare::new(2, 2), EpochRule::Rows(10)),
        (WorkerShare::ALONE, EpochRule::Rows(0)),
        (
            WorkerShare::ALONE,
            EpochRule::EventTime {
                width: 1.0,
                origin: 0.0,
            },
        ),
    ] {
        let config = ParquetSourceConfig {
            epochs: rule,
            ..Default::default()
        };
        let err = ParquetSource::open(&path, &config, share, None).err().unwrap();
        assert!(matches!(err, SourceError::Config(_)), "{err}");
    }
}

#[test]
fn bad_rows_become_dead_letters_and_the_stream_goes_on() {
    let n = 12;
    let ids: Vec<Option<i64>> = (0..n).map(|i| if i == 3 { None } else { Some(i) }).collect();
    let mut x0: Vec<Option<f64>> = (0..n).map(|i| Some(i as f64)).collect();
    x0[1] = None;
    x0[4] = Some(f64::NAN);
    x0[5] = Some(f64::INFINITY);
    let x1: Vec<Option<f32>> = (0..n).map(|i| Some(i as f32 * 0.5)).collect();
    let mut y: Vec<Option<i64>> = (0..n).map(|i| Some(i % 2)).collect();
    y[6] = Some(2);
    y[7] = Some(-1);
    y[8] = None; // scored only, not an error
    let (_dir, path) = temp_parquet(
        "bad.parquet",
        5,
        vec![
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("x0", Arc::new(Float64Array::from(x0))),
            ("x1", Arc::new(Float32Array::from(x1))),
            ("y", Arc::new(Int64Array::from(y))),
        ],
    );
    let config = ParquetSourceConfig {
        mapping: ColumnMapping::default().with_classes(2),
        epochs: EpochRule::Rows(4),
        batch_rows: 3,
    };
    let mut source = ParquetSource::open(&path, &config, WorkerShare::ALONE, None).unwrap();
    let mut parts = Vec::new();
    while let Some(p) = source.next_epoch().unwrap() {
        parts.push(p);
    }
    assert_eq!(parts.len(), 3);
    let good: Vec<i64> = parts.iter().flat_map(|p| p.records.iter().map(|r| r.id)).collect();
    assert_eq!(good, [0, 2, 8, 9, 10, 11]);
    let scored_only = parts[2].records.iter().find(|r| r.id == 8).unwrap();
    assert_eq!(scored_only.label, None);
    assert_eq!(scored_only.features, [8.0, 4.0]);

    let dead: Vec<_> = parts.iter().flat_map(|p| p.dead_letters.clone()).collect();
    let rows: Vec<u64> = dead
        .iter()
        .map(|d| match &d.origin {
            Origin::File { row, path: p } => {
                assert!(p.ends_with("bad.parquet"));
                *row
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(rows, [1, 3, 4, 5, 6, 7]);
    assert_eq!(dead[0].reason, Reason::Null { field: "x0".into() });
    assert_eq!(dead[1].reason, Reason::Null { field: "id".into() });
    assert_eq!(
        dead[2].reason,
        Reason::NonFinite {
            field: "x0".into(),
            value: "NaN".into()
        }
    );
    assert_eq!(dead[3].reason.kind(), ReasonKind::NonFinite);
    assert_eq!(dead[4].reason.kind(), ReasonKind::InvalidLabel);
    assert!(dead[4].reason.to_string().contains("0..2"), "{}", dead[4].reason);
    // The payload shows the row as it was.
    let payload: serde_json::Value = serde_json::from_str(&dead[4].payload).unwrap();
    assert_eq!(payload, serde_json::json!({"id": 6, "x0": 6.0, "x1": 3.0, "y": 2}));
    assert_eq!(dead[2].payload, r#"{"id":4,"x0":"NaN","x1":2.0,"y":0}"#);

    let c = source.counters();
    assert_eq!(c.records, 6);
    assert_eq!(c.dead_letters[&ReasonKind::Null], 2);
    assert_eq!(c.dead_letters[&ReasonKind::NonFinite], 2);
    assert_eq!(c.dead_letters[&ReasonKind::InvalidLabel], 2);
}

#[test]
fn unsigned_ids_beyond_int64_are_dead_letters() {
    let (_dir, path) = temp_parquet(
        "u64.parquet",
        10,
        vec![
            ("id", Arc::new(UInt64Array::from(vec![1, u64::MAX, 3])) as ArrayRef),
            ("x0", Arc::new(Float64Array::from(vec![0.1, 0.2, 0.3]))),
        ],
    );
    let config = ParquetSourceConfig {
        mapping: ColumnMapping::default().without_label(),
        ..Default::default()
    };
    let parts = read_parts(&path, &config, WorkerShare::ALONE, None);
    let ids: Vec<i64> = parts[0].records.iter().map(|r| r.id).collect();
    assert_eq!(ids, [1, 3]);
    assert!(parts[0].records.iter().all(|r| r.label.is_none()));
    assert_eq!(
        parts[0].dead_letters[0].reason,
        Reason::IdOutOfRange {
            value: u64::MAX.to_string()
        }
    );
}

#[test]
fn class_labels_are_checked_against_the_number_of_classes() {
    let path = data("bank.parquet");
    let read = |classes| {
        let config = ParquetSourceConfig {
            mapping: ColumnMapping::default().with_classes(classes),
            ..Default::default()
        };
        let mut s = ParquetSource::open(&path, &config, WorkerShare::ALONE, None).unwrap();
        while s.next_epoch().unwrap().is_some() {}
        s.counters().clone()
    };
    let two = read(2);
    assert_eq!((two.records, two.total_dead_letters()), (4521, 0));
    let one = read(1);
    let positives = Table::read(&path, &ColumnSpec::default())
        .unwrap()
        .labels
        .unwrap()
        .iter()
        .filter(|&&y| y == 1.0)
        .count() as u64;
    assert!(positives > 0);
    assert_eq!(one.dead_letters[&ReasonKind::InvalidLabel], positives);
    assert_eq!(one.records, 4521 - positives);
}

fn magnetometer_by_time(width: f64) -> ParquetSourceConfig {
    ParquetSourceConfig {
        // t as a feature too, so the test can check each record's window.
        mapping: ColumnMapping::default()
            .with_features(["x0", "x1", "t"])
            .with_event_time("t"),
        epochs: EpochRule::EventTime { width, origin: 0.0 },
        batch_rows: 4096,
    }
}

#[test]
fn event_time_epochs_agree_across_workers_on_magnetometer() {
    // Nine robot paths, each with its own clock from ~16 s: after the first
    // path, rows whose window is behind the stream's are late.
    let (_dir, path) = regrouped("magnetometer", 5000);
    let config = magnetometer_by_time(20.0);
    let one = read_all_workers(&path, &config, 1);
    let mut watermark = 0u64;
    let mut total = 0;
    for (epoch, (records, dead)) in &one {
        assert!(*epoch >= watermark);
        watermark = *epoch;
        for r in records {
            assert_eq!(
                (r.features[2] / 20.0).floor() as u64,
                *epoch,
                "record {} in its window",
                r.id
            );
        }
        assert!(dead.iter().all(|d| d.contains("already reached window")), "{dead:?}");
        total += records.len() + dead.len();
    }
    assert_eq!(total, 76027, "every row is a record or a dead letter");
    let late: usize = one.values().map(|(_, d)| d.len()).sum();
    assert!(late > 0 && late < 76027, "{late} late rows");
    for peers in [2, 3] {
        assert_eq!(read_all_workers(&path, &config, peers), one, "{peers} workers");
    }

    // Resume with two workers after the epoch a single worker reached.
    let first: Vec<_> = read_parts(&path, &config, WorkerShare::ALONE, None)
        .into_iter()
        .take(3)
        .collect();
    let position = first.last().unwrap().position;
    let after = (0..2).flat_map(|w| read_parts(&path, &config, WorkerShare::new(w, 2), Some(position)));
    assert_eq!(merge(first.into_iter().chain(after)), one);
}

#[test]
fn timestamp_event_times_are_seconds() {
    // Milliseconds: 0.5 s, 1.5 s, 1.9 s, 0.7 s (late), 3.2 s, null.
    let ms = vec![Some(500), Some(1500), Some(1900), Some(700), Some(3200), None];
    let (_dir, path) = temp_parquet(
        "ts.parquet",
        2,
        vec![
            (
                "id",
                Arc::new(Int64Array::from((0..6).collect::<Vec<i64>>())) as ArrayRef,
            ),
            ("x0", Arc::new(Float64Array::from(vec![0.0; 6]))),
            ("ts", Arc::new(TimestampMillisecondArray::from(ms))),
        ],
    );
    let config = ParquetSourceConfig {
        mapping: ColumnMapping::default().without_label().with_event_time("ts"),
        epochs: EpochRule::EventTime {
            width: 1.0,
            origin: 0.0,
        },
        batch_rows: 8,
    };
    let parts = read_parts(&path, &config, WorkerShare::ALONE, None);
    let summary: Vec<(u64, Vec<i64>, Vec<ReasonKind>)> = parts
        .iter()
        .map(|p| {
            (
                p.epoch,
                p.records.iter().map(|r| r.id).collect(),
                p.dead_letters.iter().map(|d| d.reason.kind()).collect(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (0, vec![0], vec![]),
            (1, vec![1, 2], vec![ReasonKind::Late]),
            (3, vec![4], vec![ReasonKind::Null]),
        ]
    );
    // The same with two workers (row groups of 2 rows dealt out).
    let two = merge((0..2).flat_map(|w| read_parts(&path, &config, WorkerShare::new(w, 2), None)));
    assert_eq!(two, merge(parts));
}
