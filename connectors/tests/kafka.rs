//! Kafka sources and sinks against a real Kafka-protocol broker (tansu) on
//! 127.0.0.1, started by scripts/broker.sh for each test.
#![cfg(feature = "kafka")]

#[path = "common/broker.rs"]
mod broker;
mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::time::{Duration, Instant};

use arrow::ipc::writer::StreamWriter;
use broker::Broker;
use common::data;
use dualgp_connectors::kafka::{create_topic, dlq_topic, prediction_json, topic_partitions};
use dualgp_connectors::{
    ColumnMapping, DeadLetter, DeadLetterProducer, KafkaConnection, KafkaError, KafkaPosition, KafkaSource,
    KafkaSourceConfig, ParquetSource, ParquetSourceConfig, PredictionProducer, ReasonKind, StartOffset, WorkerShare,
};
use dualgp_operators::dataflow::{Prediction, Record};
use dualgp_operators::model::Predictive;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientConfig, Message};

fn connection(broker: &Broker) -> KafkaConnection {
    KafkaConnection::new(broker.address()).with_timeout(Duration::from_secs(20))
}

fn source_config(conn: &KafkaConnection, topic: &str) -> KafkaSourceConfig {
    KafkaSourceConfig {
        connection: conn.clone(),
        topic: topic.into(),
        mapping: ColumnMapping::default().with_classes(2),
        epoch_records: 300,
        epoch_ms: 300,
        start: StartOffset::Earliest,
        ..Default::default()
    }
}

fn producer(conn: &KafkaConnection) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", &conn.brokers)
        .set("message.timeout.ms", "60000")
        .set("reconnect.backoff.max.ms", "1000")
        .create()
        .unwrap()
}

/// Send `(key, payload)` messages and wait until all are delivered.
fn produce(conn: &KafkaConnection, topic: &str, messages: &[(String, Vec<u8>)]) {
    let p = producer(conn);
    send_all(&p, topic, messages);
    p.flush(Duration::from_secs(60)).expect("all messages delivered");
}

fn send_all(p: &BaseProducer, topic: &str, messages: &[(String, Vec<u8>)]) {
    for (key, payload) in messages {
        let mut record = BaseRecord::to(topic).key(key).payload(payload);
        loop {
            match p.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    p.poll(Duration::from_millis(50));
                }
            }
        }
        p.poll(Duration::ZERO);
    }
}

/// A good record's JSON: features and label follow from the id.
fn json_record(id: i64) -> (String, Vec<u8>) {
    let payload = serde_json::json!({"id": id, "x0": id as f64 * 0.5, "x1": -(id as f64), "y": id % 2});
    (id.to_string(), payload.to_string().into_bytes())
}

fn check_record(r: &Record) {
    assert_eq!(r.features, [r.id as f64 * 0.5, -(r.id as f64)], "record {}", r.id);
    assert_eq!(r.label, Some((r.id % 2) as f64));
}

/// Every message of `topic`, read from the start until `n` came or 60 s passed.
fn read_topic(conn: &KafkaConnection, topic: &str, n: usize) -> Vec<(String, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &conn.brokers)
        .set("group.id", "test-reader")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    for p in topic_partitions(conn, topic).unwrap() {
        // Offset 0, not Beginning: tansu 0.6.0 may name a later batch as the earliest.
        list.add_partition_offset(topic, p, Offset::Offset(0)).unwrap();
    }
    consumer.assign(&list).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let text = |b: Option<&[u8]>| String::from_utf8(b.unwrap_or_default().to_vec()).unwrap();
            out.push((text(m.key()), text(m.payload())));
        }
    }
    out
}

/// Epoch parts from all `sources`, round-robin, until `until` holds or 60 s pass.
fn drain(
    sources: &mut [KafkaSource],
    records: &mut Vec<Record>,
    dead: &mut Vec<DeadLetter>,
    until: impl Fn(&[Record], &[DeadLetter]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !until(records, dead) {
        assert!(
            Instant::now() < deadline,
            "only {} records, {} dead letters",
            records.len(),
            dead.len()
        );
        for s in sources.iter_mut() {
            let part = s.next_epoch().unwrap();
            records.extend(part.records);
            dead.extend(part.dead_letters);
        }
    }
}

fn ids(records: &[Record]) -> Vec<i64> {
    let mut ids: Vec<i64> = records.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn every_record_comes_out_once_and_malformed_ones_go_to_the_dlq() {
    let broker = Broker::start();
    let conn = connection(&broker);
    create_topic(&conn, "in", 4).unwrap();
    create_topic(&conn, &dlq_topic("in"), 1).unwrap();

    let mut messages: Vec<(String, Vec<u8>)> = (0..2000).map(json_record).collect();
    let malformed: [(&str, ReasonKind); 6] = [
        ("not json at all", ReasonKind::Undecodable),
        (r#"{"x0": 1, "x1": 2, "y": 0}"#, ReasonKind::MissingField),
        (r#"{"id": 5000, "x0": "one", "x1": 2, "y": 0}"#, ReasonKind::WrongType),
        (r#"{"id": 5001, "x0": 1, "x1": 2, "y": 5}"#, ReasonKind::InvalidLabel),
        (r#"{"id": 5002, "x0": 1, "x1": null, "y": 1}"#, ReasonKind::Null),
        ("", ReasonKind::Undecodable),
    ];
    for (i, (payload, _)) in malformed.iter().enumerate() {
        messages.insert(300 * i + 7, (format!("bad{i}"), payload.as_bytes().to_vec()));
    }
    produce(&conn, "in", &messages);

    let config = source_config(&conn, "in");
    let mut sources: Vec<KafkaSource> = (0..3)
        .map(|w| KafkaSource::open(&config, WorkerShare::new(w, 3), None).unwrap())
        .collect();
    let mut owned: Vec<i32> = sources.iter().flat_map(|s| s.partitions().to_vec()).collect();
    owned.sort_unstable();
    assert_eq!(owned, [0, 1, 2, 3], "every partition has exactly one worker");

    let (mut records, mut dead) = (Vec::new(), Vec::new());
    drain(&mut sources, &mut records, &mut dead, |r, d| r.len() + d.len() >= 2006);
    // A little longer: nothing more (no duplicates) arrives.
    drain(&mut sources, &mut records, &mut dead, |_, _| true);
    for s in &mut sources {
        let part = s.next_epoch().unwrap();
        assert!(part.records.is_empty() && part.dead_letters.is_empty());
    }
    assert_eq!(ids(&records), (0..2000).collect::<Vec<_>>(), "each record exactly once");
    records.iter().for_each(check_record);

    let mut kinds: Vec<ReasonKind> = dead.iter().map(|d| d.reason.kind()).collect();
    kinds.sort();
    let mut expected: Vec<ReasonKind> = malformed.iter().map(|m| m.1).collect();
    expected.sort();
    assert_eq!(kinds, expected);
    let counted: u64 = sources.iter().map(|s| s.counters().total_dead_letters()).sum();
    assert_eq!(counted, 6);
    assert_eq!(sources.iter().map(|s| s.counters().records).sum::<u64>(), 2000);

    // Dead letters to in.dlq, with their reasons.
    let dlq = DeadLetterProducer::new(&conn, "in").unwrap();
    assert_eq!(dlq.topic(), "in.dlq");
    dlq.send(&dead, 0).unwrap();
    dlq.flush().unwrap();
    let messages = read_topic(&conn, "in.dlq", 6);
    assert_eq!(messages.len(), 6);
    let by_payload: BTreeMap<String, serde_json::Value> = messages
        .iter()
        .map(|(_, v)| {
            let v: serde_json::Value = serde_json::from_str(v).unwrap();
            (v["payload"].as_str().unwrap().to_owned(), v)
        })
        .collect();
    let label = &by_payload[r#"{"id": 5001, "x0": 1, "x1": 2, "y": 5}"#];
    assert_eq!(label["kind"], "invalid_label");
    assert!(label["reason"].as_str().unwrap().contains("0..2"), "{label}");
    assert_eq!(label["origin"]["topic"], "in");
    assert_eq!(by_payload["not json at all"]["kind"], "undecodable");
}

/// Elevators rows as Arrow IPC messages of 500 rows each.
fn elevators_as_ipc() -> Vec<(String, Vec<u8>)> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(data("elevators.parquet")).unwrap()).unwrap();
    let schema = builder.schema().clone();
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| schema.field(i).name() != "fold")
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), keep);
    let reader = builder.with_projection(mask).with_batch_size(500).build().unwrap();
    reader
        .enumerate()
        .map(|(i, batch)| {
            let batch = batch.unwrap();
            let mut w = StreamWriter::try_new(Vec::new(), &batch.schema()).unwrap();
            w.write(&batch).unwrap();
            (format!("batch{i}"), w.into_inner().unwrap())
        })
        .collect()
}

#[test]
fn arrow_ipc_messages_decode_like_the_parquet_file() {
    let broker = Broker::start();
    let conn = connection(&broker);
    create_topic(&conn, "rows", 2).unwrap();
    let messages = elevators_as_ipc();
    assert_eq!(messages.len(), 34);
    produce(&conn, "rows", &messages);

    let mut config = source_config(&conn, "rows");
    config.mapping = ColumnMapping::default();
    config.epoch_records = 5000;
    let mut sources = vec![KafkaSource::open(&config, WorkerShare::ALONE, None).unwrap()];
    let (mut records, mut dead) = (Vec::new(), Vec::new());
    drain(&mut sources, &mut records, &mut dead, |r, _| r.len() >= 16599);
    assert!(dead.is_empty(), "{dead:?}");
    records.sort_by_key(|r| r.id);

    let mut expected = Vec::new();
    let parquet = ParquetSource::open(
        data("elevators.parquet"),
        &ParquetSourceConfig::default(),
        WorkerShare::ALONE,
        None,
    )
    .unwrap();
    let mut parquet = parquet;
    while let Some(part) = parquet.next_epoch().unwrap() {
        expected.extend(part.records);
    }
    assert_eq!(records, expected, "the same records as from the file");
    assert_eq!(sources[0].feature_names().unwrap().len(), 18);
}

#[test]
fn resuming_from_a_checkpoint_or_committed_offsets_loses_and_repeats_nothing() {
    let broker = Broker::start();
    let conn = connection(&broker);
    create_topic(&conn, "in", 2).unwrap();
    produce(&conn, "in", &(0..1000).map(json_record).collect::<Vec<_>>());
    let mut config = source_config(&conn, "in");
    config.group_id = "g1".into();
    config.epoch_records = 150;

    // Two workers read some epochs; the checkpoint is after epoch 1 of both.
    let mut workers: Vec<KafkaSource> = (0..2)
        .map(|w| KafkaSource::open(&config, WorkerShare::new(w, 2), None).unwrap())
        .collect();
    let mut checkpointed = Vec::new();
    let mut positions = Vec::new();
    for w in &mut workers {
        let mut position = None;
        while position.is_none() {
            let part = w.next_epoch().unwrap();
            checkpointed.extend(part.records);
            if part.epoch == 1 {
                position = Some(part.position);
            }
        }
        positions.extend(position);
        w.next_epoch().unwrap(); // read past the checkpoint, then "crash"
    }
    let checkpoint = KafkaPosition::merge(&positions).unwrap();
    assert_eq!(checkpoint.next_epoch, 2);
    assert_eq!(checkpoint.offsets.len(), 2);
    assert!(
        checkpointed.len() >= 300 && checkpointed.len() < 1000,
        "{}",
        checkpointed.len()
    );
    workers[0].commit(1, &checkpoint).unwrap();
    assert_eq!(
        workers[0].settle_commits(),
        Some(1),
        "the broker acknowledged the commit"
    );
    drop(workers);

    let rest = |resume: Option<&KafkaPosition>, config: &KafkaSourceConfig, peers: usize| {
        let mut sources: Vec<KafkaSource> = (0..peers)
            .map(|w| KafkaSource::open(config, WorkerShare::new(w, peers), resume).unwrap())
            .collect();
        let (mut records, mut dead) = (checkpointed.clone(), Vec::new());
        drain(&mut sources, &mut records, &mut dead, |r, _| r.len() >= 1000);
        drain(&mut sources, &mut records, &mut dead, |_, _| true);
        assert!(dead.is_empty());
        if let Some(r) = resume {
            assert!(sources.iter().all(|s| s.position().next_epoch > r.next_epoch));
        }
        ids(&records)
    };
    let all: Vec<i64> = (0..1000).collect();
    // From the checkpoint, with another number of workers.
    assert_eq!(rest(Some(&checkpoint), &config, 3), all);
    // From the group's committed offsets (no checkpoint at hand).
    config.start = StartOffset::Committed;
    assert_eq!(rest(None, &config, 1), all);
}

#[test]
fn predictions_go_out_as_json_keyed_by_id() {
    let broker = Broker::start();
    let conn = connection(&broker);
    create_topic(&conn, "out", 3).unwrap();
    let out = PredictionProducer::new(&conn, "out").unwrap();
    let predictions: Vec<Prediction> = (0..200)
        .map(|id| Prediction {
            id,
            epoch: id as u64 / 50,
            model_epoch: (id as u64 / 50).checked_sub(1),
            predictive: if id % 2 == 0 {
                Predictive::Moments {
                    mean: id as f64,
                    var: 0.5,
                }
            } else {
                Predictive::Classes(vec![0.25, 0.75])
            },
            log_density: None,
            output: None,
            all_outputs: Vec::new(),
        })
        .collect();
    out.send(&predictions).unwrap();
    out.flush().unwrap();
    let messages: BTreeMap<String, String> = read_topic(&conn, "out", 200).into_iter().collect();
    assert_eq!(messages.len(), 200);
    for p in &predictions {
        assert_eq!(messages[&p.id.to_string()], prediction_json(p));
    }
    let odd: serde_json::Value = serde_json::from_str(&messages["7"]).unwrap();
    assert_eq!(
        odd,
        serde_json::json!({"id": 7, "epoch": 0, "model_epoch": null, "p": [0.25, 0.75]})
    );
}

#[test]
fn a_broker_that_is_not_there_is_a_clear_error_after_a_bounded_wait() {
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conn = KafkaConnection::new(format!("127.0.0.1:{port}")).with_timeout(Duration::from_secs(3));
    let started = Instant::now();
    let err = KafkaSource::open(&source_config(&conn, "in"), WorkerShare::ALONE, None)
        .err()
        .unwrap();
    assert!(matches!(err, KafkaError::BrokerUnavailable { .. }), "{err}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());

    let broker = Broker::start();
    let conn = connection(&broker).with_timeout(Duration::from_secs(3));
    let err = KafkaSource::open(&source_config(&conn, "absent"), WorkerShare::ALONE, None)
        .err()
        .unwrap();
    assert!(matches!(err, KafkaError::TopicMissing { .. }), "{err}");
}

#[test]
fn a_broker_restart_loses_no_record() {
    // Topics live in a local S3 server, so they outlive the broker process.
    let mut broker = Broker::start_durable();
    let conn = connection(&broker).with_timeout(Duration::from_secs(4));
    create_topic(&conn, "in", 2).unwrap();
    produce(&conn, "in", &(0..300).map(json_record).collect::<Vec<_>>());

    let mut config = source_config(&conn, "in");
    config.epoch_records = 100;
    let mut source = KafkaSource::open(&config, WorkerShare::ALONE, None).unwrap();
    let (mut records, mut dead) = (Vec::new(), Vec::new());
    let mut checkpoint = None;
    while records.len() < 150 {
        let part = source.next_epoch().unwrap();
        records.extend(part.records);
        checkpoint = Some(part.position);
    }
    let checkpointed = records.clone();

    broker.stop();
    // Meanwhile a producer keeps sending: librdkafka holds the messages.
    let pending = producer(&conn);
    send_all(&pending, "in", &(300..400).map(json_record).collect::<Vec<_>>());
    let stopped = Instant::now();
    let err = loop {
        match source.next_epoch() {
            Ok(part) => records.extend(part.records),
            Err(e) => break e,
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "no error while the broker is down"
        );
    };
    assert!(matches!(err, KafkaError::BrokerUnavailable { .. }), "{err}");
    assert!(stopped.elapsed() < Duration::from_secs(20), "{:?}", stopped.elapsed());

    broker.restart();
    pending
        .flush(Duration::from_secs(60))
        .expect("held messages delivered after the restart");
    produce(&conn, "in", &(400..500).map(json_record).collect::<Vec<_>>());

    // The same source goes on where it was …
    let mut sources = vec![source];
    drain(&mut sources, &mut records, &mut dead, |r, _| r.len() >= 500);
    drain(&mut sources, &mut records, &mut dead, |_, _| true);
    assert!(dead.is_empty(), "{dead:?}");
    assert_eq!(ids(&records), (0..500).collect::<Vec<_>>(), "each record exactly once");

    // … and a new one resumes from the checkpoint taken before the outage.
    let checkpoint = checkpoint.unwrap();
    let mut resumed = vec![KafkaSource::open(&config, WorkerShare::ALONE, Some(&checkpoint)).unwrap()];
    let (mut all, mut dead) = (checkpointed, Vec::new());
    drain(&mut resumed, &mut all, &mut dead, |r, _| r.len() >= 500);
    drain(&mut resumed, &mut all, &mut dead, |_, _| true);
    assert_eq!(
        ids(&all),
        (0..500).collect::<Vec<_>>(),
        "checkpoint + resumed: each record once"
    );
    all.iter().for_each(check_record);
}
