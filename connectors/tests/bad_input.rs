//! Random and mutated input to the decoders (property tests): a Kafka
//! message becomes records or dead letters, an Arrow batch row by row the
//! same, and a damaged Parquet file an error; never a panic. Every record
//! that comes out is usable: finite features of the stream's dimension, a
//! finite label.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, NullArray,
    StringArray, TimestampMillisecondArray, UInt32Array, UInt64Array, UInt8Array,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use dualgp_connectors::kafka::{MessageDecoder, MessageFormat, MessageOrigin};
use dualgp_connectors::{
    ArrowDecoder, ColumnMapping, ColumnSpec, DeadLetter, EpochRule, Origin, ParquetSource, ParquetSourceConfig, Table,
    WorkerShare,
};
use dualgp_operators::dataflow::Record;
use parquet::arrow::ArrowWriter;
use proptest::prelude::*;
use proptest::sample::{select, Index};

const AT: MessageOrigin<'static> = MessageOrigin {
    topic: "in",
    partition: 0,
    offset: 0,
};

/// The mappings a stream may be read with.
fn mapping(which: u8) -> ColumnMapping {
    match which % 5 {
        0 => ColumnMapping::default(),
        1 => ColumnMapping::default().with_classes(3),
        2 => ColumnMapping::default().with_features(["x1", "x0"]),
        3 => ColumnMapping::default().without_label(),
        _ => ColumnMapping::default().with_event_time("t"),
    }
}

/// Records are usable: finite, all of one dimension.
fn check_records(records: &[Record]) -> Result<(), TestCaseError> {
    for r in records {
        prop_assert!(r.features.iter().all(|v| v.is_finite()), "{r:?}");
        prop_assert!(r.label.is_none_or(f64::is_finite), "{r:?}");
        prop_assert_eq!(r.features.len(), records[0].features.len());
    }
    Ok(())
}

// ---- JSON and Arrow IPC messages ------------------------------------------

fn json_leaf() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("\"NaN\"".to_string()),
        Just("\"\"".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("1e999".to_string()),
        Just("-0".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-9223372036854775809".to_string()),
        Just("9223372036854775807".to_string()),
        Just("4.9e-324".to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |v| v.is_finite())
            .prop_map(|v| format!("{v:e}")),
        (0i64..4).prop_map(|v| v.to_string()),
        "\\PC{0,6}".prop_map(|s| serde_json::Value::String(s).to_string()),
    ]
}

/// A JSON object with keys a stream may or may not expect.
fn json_object() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("id".to_string()),
        Just("x0".to_string()),
        Just("x1".to_string()),
        Just("x2".to_string()),
        Just("x01".to_string()),
        Just("x99999999999999999999999999999999999999999".to_string()),
        Just("y".to_string()),
        Just("t".to_string()),
        "\\PC{0,4}",
    ];
    proptest::collection::vec((key, json_leaf()), 0..7).prop_map(|fields| {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}: {v}", serde_json::Value::String(k.clone())))
            .collect();
        format!("{{{}}}", body.join(", "))
    })
}

/// Bytes changed in place, cut, or spliced with JSON or IPC fragments.
fn mutate(mut bytes: Vec<u8>, edits: &[(Index, u8, u8)]) -> Vec<u8> {
    const PIECES: [&[u8]; 8] = [
        b"{",
        b"}",
        b"[",
        b"\"",
        b"null",
        b"1e999",
        b"\xff\xff\xff\xff",
        b"\x00\x00",
    ];
    for (at, kind, byte) in edits {
        if bytes.is_empty() {
            bytes.push(*byte);
            continue;
        }
        let i = at.index(bytes.len());
        match kind % 5 {
            0 => bytes[i] = *byte,
            1 => bytes[i] ^= 1 << (byte % 8),
            2 => bytes.truncate(i),
            3 => {
                bytes.remove(i);
            }
            _ => {
                let piece = PIECES[*byte as usize % PIECES.len()];
                bytes.splice(i..i, piece.iter().copied());
            }
        }
    }
    bytes
}

fn edits() -> impl Strategy<Value = Vec<(Index, u8, u8)>> {
    proptest::collection::vec((any::<Index>(), any::<u8>(), any::<u8>()), 0..4)
}

/// Decodes `messages` in turn with one decoder; checks what each became.
fn decode_all(decoder: &mut MessageDecoder, messages: &[Vec<u8>], json: bool) -> Result<(), TestCaseError> {
    let mut all = Vec::new();
    for payload in messages {
        let (mut records, mut dead) = (Vec::new(), Vec::new());
        decoder.decode(Some(payload), AT, &mut records, &mut dead);
        if json {
            // A JSON message is one record or one dead letter.
            prop_assert_eq!(records.len() + dead.len(), 1, "{:?}", String::from_utf8_lossy(payload));
        }
        check_dead(&dead)?;
        all.extend(records);
    }
    check_records(&all)
}

fn check_dead(dead: &[DeadLetter]) -> Result<(), TestCaseError> {
    for d in dead {
        prop_assert!(matches!(d.origin, Origin::Kafka { .. }), "{:?}", d.origin);
        prop_assert!(!d.reason.to_string().contains('\n'), "{}", d.reason);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn json_messages_become_a_record_or_a_dead_letter(
        which in any::<u8>(),
        messages in proptest::collection::vec((json_object(), edits()), 1..6),
    ) {
        let mut decoder = MessageDecoder::new(&mapping(which), MessageFormat::Json);
        let messages: Vec<Vec<u8>> = messages.into_iter().map(|(m, e)| mutate(m.into_bytes(), &e)).collect();
        decode_all(&mut decoder, &messages, true)?;
    }

    #[test]
    fn random_bytes_in_any_format_are_dead_letters_or_records(
        which in any::<u8>(),
        format in prop_oneof![Just(MessageFormat::Auto), Just(MessageFormat::Json), Just(MessageFormat::ArrowIpc)],
        messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..4),
    ) {
        let mut decoder = MessageDecoder::new(&mapping(which), format);
        decode_all(&mut decoder, &messages, format == MessageFormat::Json)?;
    }

    #[test]
    fn mutated_arrow_ipc_messages_never_panic(
        which in any::<u8>(),
        batch in record_batch(),
        edits in edits(),
    ) {
        let Some(bytes) = ipc(&batch) else { return Ok(()) };
        let mut decoder = MessageDecoder::new(&mapping(which), MessageFormat::Auto);
        decode_all(&mut decoder, &[bytes.clone(), mutate(bytes, &edits)], false)?;
    }
}

// ---- Arrow batches and Parquet files ---------------------------------------

/// One cell's raw value, turned into each column type below.
fn cell() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(f64::NAN)),
        1 => Just(Some(f64::INFINITY)),
        1 => Just(Some(-1e308)),
        1 => Just(Some(1.8446744073709552e19)),
        1 => Just(Some(-9.3e18)),
        6 => (-3i32..4).prop_map(|v| Some(f64::from(v))),
        2 => any::<f64>().prop_map(Some),
    ]
}

/// A column of one of the types a source may meet.
fn array(kind: u8, cells: &[Option<f64>]) -> ArrayRef {
    let ints = || cells.iter().map(|c| c.map(|v| v as i64));
    match kind % 15 {
        0 => Arc::new(Int8Array::from_iter(ints().map(|v| v.map(|v| v as i8)))),
        1 => Arc::new(Int16Array::from_iter(ints().map(|v| v.map(|v| v as i16)))),
        2 => Arc::new(Int32Array::from_iter(ints().map(|v| v.map(|v| v as i32)))),
        3 => Arc::new(Int64Array::from_iter(ints())),
        4 => Arc::new(UInt8Array::from_iter(ints().map(|v| v.map(|v| v as u8)))),
        5 => Arc::new(UInt32Array::from_iter(ints().map(|v| v.map(|v| v as u32)))),
        6 => Arc::new(UInt64Array::from_iter(cells.iter().map(|c| c.map(|v| v as u64)))),
        7 => cast(&Float64Array::from_iter(cells.iter().copied()), &DataType::Float16).expect("float16 holds any f64"),
        8 => Arc::new(Float32Array::from_iter(cells.iter().map(|c| c.map(|v| v as f32)))),
        9 | 10 => Arc::new(Float64Array::from_iter(cells.iter().copied())),
        11 => Arc::new(StringArray::from_iter(cells.iter().map(|c| c.map(|v| v.to_string())))),
        12 => Arc::new(BooleanArray::from_iter(cells.iter().map(|c| c.map(|v| v > 0.0)))),
        13 => Arc::new(TimestampMillisecondArray::from_iter(ints())),
        _ => Arc::new(NullArray::new(cells.len())),
    }
}

/// A column's type: usually one its role accepts (`good`), else any.
fn kind(good: &'static [u8]) -> impl Strategy<Value = u8> {
    prop_oneof![3 => select(good), 1 => any::<u8>()]
}

/// A batch of 0-5 rows: the columns a mapping looks for, each usually there
/// and of a fitting type, and a few more of any name and type.
fn record_batch() -> impl Strategy<Value = RecordBatch> {
    const INTEGERS: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
    const NUMBERS: &[u8] = &[0, 2, 3, 6, 7, 8, 9, 10];
    let roles: [(&'static str, &'static [u8]); 5] = [
        ("id", INTEGERS),
        ("x0", NUMBERS),
        ("x1", NUMBERS),
        ("y", NUMBERS),
        ("t", &[9, 13]),
    ];
    let extra = prop_oneof![
        Just("x2"),
        Just("x10"),
        Just("x01"),
        Just("fold"),
        Just("id"),
        Just("y")
    ];
    (0usize..6)
        .prop_flat_map(move |rows| {
            let column = move |k: BoxedStrategy<u8>| (k, proptest::collection::vec(cell(), rows));
            let known: Vec<_> = roles
                .iter()
                .map(|&(name, good)| {
                    proptest::option::weighted(0.85, column(kind(good).boxed())).prop_map(move |c| c.map(|c| (name, c)))
                })
                .collect();
            let extras = proptest::collection::vec((extra.clone(), column(any::<u8>().boxed())), 0..3);
            (known, extras).prop_map(move |(known, extras)| {
                let columns: Vec<(&'static str, Column)> = known.into_iter().flatten().chain(extras).collect();
                (rows, columns)
            })
        })
        .prop_map(|(rows, columns)| {
            let arrays: Vec<(&str, ArrayRef)> = columns.iter().map(|(n, (k, c))| (*n, array(*k, c))).collect();
            let schema = Arc::new(Schema::new(
                arrays
                    .iter()
                    .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
                    .collect::<Vec<_>>(),
            ));
            let options = RecordBatchOptions::new().with_row_count(Some(rows));
            RecordBatch::try_new_with_options(schema, arrays.into_iter().map(|a| a.1).collect(), &options)
                .expect("columns of one length")
        })
}

/// A column as drawn: its kind (the array type) and its cells.
type Column = (u8, Vec<Option<f64>>);

/// The batch as an Arrow IPC stream (`None`: the writer refuses it).
fn ipc(batch: &RecordBatch) -> Option<Vec<u8>> {
    let mut w = StreamWriter::try_new(Vec::new(), &batch.schema()).ok()?;
    w.write(batch).ok()?;
    w.into_inner().ok()
}

/// The batch as a Parquet file's bytes (`None`: the writer refuses it).
fn parquet(batch: &RecordBatch) -> Option<Vec<u8>> {
    let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), None).ok()?;
    w.write(batch).ok()?;
    w.into_inner().ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_row_of_any_batch_is_a_record_or_a_dead_letter(which in any::<u8>(), batch in record_batch()) {
        let Ok(decoder) = ArrowDecoder::new(&mapping(which), &batch.schema()) else { return Ok(()) };
        let mut outcomes = 0;
        let mut records = Vec::new();
        let decoded = decoder.decode_each(&batch, &|row| Origin::File { path: "f".into(), row: row as u64 }, |_, _, outcome| {
            outcomes += 1;
            if let Ok(row) = outcome {
                records.push(row.record);
            }
        });
        if decoded.is_ok() {
            prop_assert_eq!(outcomes, batch.num_rows());
        }
        check_records(&records)?;
        prop_assert!(records.iter().all(|r| r.features.len() == decoder.feature_names().len()));
    }
}

proptest! {
    // Each case writes and reads a file: fewer of them.
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn damaged_parquet_files_are_errors(which in any::<u8>(), batch in record_batch(), edits in edits()) {
        let Some(bytes) = parquet(&batch) else { return Ok(()) };
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [("whole", bytes.clone()), ("damaged", mutate(bytes, &edits))] {
            let path = dir.path().join(format!("{name}.parquet"));
            std::fs::write(&path, &bytes).unwrap();
            if let Err(e) = Table::read(&path, &ColumnSpec::default()) {
                prop_assert!(!e.to_string().contains('\n'), "{e}");
            }
            let config = ParquetSourceConfig {
                mapping: mapping(which),
                epochs: EpochRule::Rows(2),
                batch_rows: 3,
            };
            let mut records = Vec::new();
            match ParquetSource::open(&path, &config, WorkerShare::ALONE, None) {
                Ok(mut source) => loop {
                    match source.next_epoch() {
                        Ok(Some(part)) => records.extend(part.records),
                        Ok(None) => break,
                        Err(e) => {
                            prop_assert!(!e.to_string().contains('\n'), "{e}");
                            break;
                        }
                    }
                },
                Err(e) => prop_assert!(!e.to_string().contains('\n'), "{e}"),
            }
            check_records(&records)?;
        }
    }
}
