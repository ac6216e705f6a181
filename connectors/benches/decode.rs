//! Decode throughput: Parquet files streamed to records, and `serve`'s JSON
//! messages decoded to records, in records per second (one thread).
//!
//!     cargo bench -p dualgp-connectors --bench decode

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dualgp_connectors::kafka::{MessageDecoder, MessageFormat, MessageOrigin};
use dualgp_connectors::{shared_data, ColumnMapping, ParquetSource, ParquetSourceConfig, WorkerShare};

fn parquet(c: &mut Criterion) {
    let mut group = c.benchmark_group("parquet_stream");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    for name in ["kin40k", "protein", "elevators"] {
        let path = shared_data(&format!("{name}.parquet")).unwrap_or_else(|e| panic!("{e}"));
        let config = ParquetSourceConfig::default();
        let rows = ParquetSource::open(&path, &config, WorkerShare::ALONE, None)
            .unwrap()
            .n_rows();
        group.throughput(Throughput::Elements(rows));
        group.bench_with_input(BenchmarkId::from_parameter(name), &path, |b, path| {
            b.iter(|| {
                let mut source = ParquetSource::open(path, &config, WorkerShare::ALONE, None).unwrap();
                let mut n = 0;
                while let Some(part) = source.next_epoch().unwrap() {
                    n += black_box(part.records).len();
                }
                assert_eq!(n as u64, rows);
            })
        });
    }
    group.finish();
}

fn json(c: &mut Criterion) {
    let mut group = c.benchmark_group("json_messages");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    for d in [2usize, 18] {
        let messages: Vec<Vec<u8>> = (0..10_000)
            .map(|id| {
                let mut obj = serde_json::Map::new();
                obj.insert("id".into(), id.into());
                for j in 0..d {
                    obj.insert(format!("x{j}"), ((id * 7 + j) as f64 * 0.013).into());
                }
                obj.insert("y".into(), (id as f64 * 0.1).sin().into());
                serde_json::Value::Object(obj).to_string().into_bytes()
            })
            .collect();
        group.throughput(Throughput::Elements(messages.len() as u64));
        group.bench_with_input(BenchmarkId::new("d", d), &messages, |b, messages| {
            b.iter(|| {
                let mut decoder = MessageDecoder::new(&ColumnMapping::default(), MessageFormat::Auto);
                let (mut records, mut dead) = (Vec::with_capacity(messages.len()), Vec::new());
                for (offset, m) in messages.iter().enumerate() {
                    let origin = MessageOrigin {
                        topic: "in",
                        partition: 0,
                        offset: offset as i64,
                    };
                    decoder.decode(Some(m), origin, &mut records, &mut dead);
                }
                assert!(dead.is_empty());
                black_box(records)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, parquet, json);
criterion_main!(benches);
