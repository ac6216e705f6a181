//! Kafka round-trip latency of `dualgp serve`: the time from producing a
//! labelled record to consuming its scored prediction, at a steady 10 000
//! records/s, against a real Kafka-protocol broker (tansu) on 127.0.0.1.
//!
//! First the broker alone: the same paced producer, and a consumer of the
//! input topic itself (one hop); then two hops: a relay consumes the input
//! and produces it unchanged to an output topic that the consumer reads, the
//! broker's share of serve's own round trip. Each setup
//! gets a fresh broker (in memory, it slows as it holds more: at 10 000
//! records/s its own round trip grows through a run of 60 s).
//! For each serve configuration (the default model flags with m = 100, and a
//! lighter schedule), the bench starts the built `dualgp serve` as a child
//! process, produces 2000 warm-up records and waits for their predictions (serve
//! fixes the dimension from its first epoch, and the first updates are not
//! what a running service sees), then produces for 60 s (`KAFKA_LATENCY_SECONDS`) at 10 000 records/s
//! while another thread consumes the output topic. Latency is the receive
//! instant of a prediction minus the send instant of its record, so it includes
//! the producer's linger, the broker both ways, serve's epoch batching, waiting
//! for the previous epoch's update (prequential scoring only), and scoring. It reports p50/p90/p99/max,
//! the produce rate achieved, the rate predictions came back at, and how many
//! records got no prediction within 60 s of the end of producing ("lost"; a
//! lost record is looked for again on the output topic, to tell a prediction
//! never written from one the consumer missed).
//! When the learner cannot keep up, records wait in Kafka and latency grows
//! through the run: the p50 of the first and the last second of sends shows it.
//!
//! Writes `target/bench-kafka-latency.json` and prints a markdown table. Run:
//!
//! ```text
//! cargo bench -p dualgp-pipelines --bench kafka_latency
//! ```
//!
//! About nine minutes at 60 s a row; wall-clock numbers from one run on a shared machine, so
//! noisy. `KAFKA_LATENCY_RATE` sets the rate; `KAFKA_LATENCY_ONLY='light;default'` runs only the setups named so,
//! and `KAFKA_LATENCY_SERVE_FLAGS` adds flags to every serve. Only `cargo bench` (which passes `--bench`) runs it: under
//! `cargo test --all-targets` it returns at once.

#[allow(dead_code)] // only the in-memory broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;
#[path = "../tests/common/mod.rs"]
mod common;

use std::fs::File;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use broker::Broker;
use dualgp_connectors::kafka::create_topic;
use dualgp_connectors::KafkaConnection;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientConfig, Message};
use serde_json::{json, Value};

/// Features per record.
const D: usize = 8;
/// Records per second, produced at a steady pace: `KAFKA_LATENCY_RATE`, 10 000 by default.
fn rate() -> f64 {
    let given = std::env::var("KAFKA_LATENCY_RATE").ok().and_then(|s| s.parse().ok());
    given.unwrap_or(10_000.0)
}
/// Records produced (and awaited) before the clock starts.
const WARMUP: usize = 2000;
/// How long the measured stream lasts: `KAFKA_LATENCY_SECONDS`, 60 by default.
fn measured_span() -> Duration {
    let seconds = std::env::var("KAFKA_LATENCY_SECONDS").ok().and_then(|s| s.parse().ok());
    Duration::from_secs(seconds.unwrap_or(60))
}

/// Records in the measured stream.
fn measured() -> usize {
    (rate() * measured_span().as_secs_f64()) as usize
}
/// Input partitions: one per serve worker.
const PARTITIONS: usize = 2;
/// How long predictions are awaited after the last send, at most.
const DRAIN: Duration = Duration::from_secs(60);
/// After the last send, this long without any prediction means serve is done
/// (its epochs last at most about a second even when behind).
const QUIET: Duration = Duration::from_secs(10);
/// How long the warm-up predictions are awaited (serve's start included).
const WARMUP_WAIT: Duration = Duration::from_secs(90);
/// serve stops after this many seconds without input.
const IDLE_EXIT: &str = "5";

/// The flags every configuration shares; only the model schedule differs.
const SERVE_FLAGS: &[&str] = &[
    "--likelihood",
    "gaussian",
    "--batch-size",
    "1000",
    "--idle-exit",
    IDLE_EXIT,
];

/// Two workers, an epoch every 100 ms at most (serve's defaults are one worker and 1 000 ms).
const TWO_WORKERS: &[&str] = &["--batch-timeout-ms", "100", "--workers", "2"];

struct Setup {
    name: &'static str,
    kind: Kind,
}

/// What stands between the producer and the measuring consumer.
enum Kind {
    /// Nothing: the consumer reads the input topic itself (one hop).
    BrokerAlone,
    /// A relay that consumes the input topic and produces each message
    /// unchanged to the output topic, which the consumer reads: the broker's
    /// share of serve's round trip (two hops), at the same rate.
    TwoHops,
    Serve(ServeFlags),
}

/// What one serve configuration adds to [`SERVE_FLAGS`].
struct ServeFlags {
    /// `--scoring`: on-arrival (serve's default) or prequential.
    scoring: &'static str,
    /// Workers and epoch timeout ([`TWO_WORKERS`], or none for serve's defaults).
    workers: &'static [&'static str],
    model_flags: &'static [&'static str],
}

/// A schedule light enough to keep up with the stream.
const LIGHT: &[&str] = &[
    "--m-past",
    "scaled-memory",
    "--m-optimizer",
    "adam",
    "--m-relearn",
    "false",
    "--m-steps",
    "5",
    "--inducing",
    "50",
];

/// A serve setup: `name`, `--scoring`, workers flags, model flags.
const fn serve(
    name: &'static str,
    scoring: &'static str,
    workers: &'static [&'static str],
    model_flags: &'static [&'static str],
) -> Setup {
    Setup {
        name,
        kind: Kind::Serve(ServeFlags {
            scoring,
            workers,
            model_flags,
        }),
    }
}

const M100: &[&str] = &["--inducing", "100"];

const SETUPS: &[Setup] = &[
    Setup {
        name: "broker alone",
        kind: Kind::BrokerAlone,
    },
    Setup {
        name: "broker, two hops",
        kind: Kind::TwoHops,
    },
    // serve as a new user starts it: one worker, epochs of up to 1 000 ms.
    serve("serve's defaults", "on-arrival", &[], M100),
    // The default schedule (a re-learning L-BFGS M-step that moves the
    // inducing inputs; up to 16 epochs in flight, as many as one update learns).
    serve("default", "on-arrival", TWO_WORKERS, M100),
    serve(
        "default, 64 in flight",
        "on-arrival",
        TWO_WORKERS,
        &["--inducing", "100", "--epochs-in-flight", "64"],
    ),
    // Reading waits once the learner is 2 epochs behind (replay's default).
    serve(
        "default, 2 in flight",
        "on-arrival",
        TWO_WORKERS,
        &["--inducing", "100", "--epochs-in-flight", "2"],
    ),
    serve("light", "on-arrival", TWO_WORKERS, LIGHT),
    // Each epoch waits for the previous epoch's update, as before scoring on arrival.
    serve("light, prequential", "prequential", TWO_WORKERS, LIGHT),
];

/// The input stream as JSON messages, indexed by id: y = sin(x0) + 0.5 x1 + noise.
fn messages(n: usize) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let noise = Normal::new(0.0, 0.1).unwrap();
    (0..n)
        .map(|id| {
            let x: Vec<f64> = (0..D).map(|_| rng.random_range(-2.0..2.0)).collect();
            let y = x[0].sin() + 0.5 * x[1] + noise.sample(&mut rng);
            let features: String = x.iter().enumerate().map(|(j, v)| format!(r#","x{j}":{v}"#)).collect();
            format!(r#"{{"id":{id}{features},"y":{y}}}"#)
        })
        .collect()
}

/// Sends `messages[first..first + count]` at [`rate`] per second, round-robin
/// over the input partitions, for at most `limit`. Returns each sent record's
/// send instant, in id order.
fn produce_paced(
    address: &str,
    topic: &str,
    messages: &[String],
    first: usize,
    count: usize,
    limit: Duration,
) -> Vec<Instant> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", address)
        // Small batches: the producer's linger is part of the latency measured.
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("a producer");
    let mut sent = Vec::with_capacity(count);
    let rate = rate();
    let start = Instant::now();
    while sent.len() < count && start.elapsed() < limit {
        // Catch up to the schedule: sleeping is coarser than 100 µs.
        let due = ((start.elapsed().as_secs_f64() * rate) as usize + 1).min(count);
        while sent.len() < due {
            let id = first + sent.len();
            let key = id.to_string();
            let record = BaseRecord::to(topic)
                .key(&key)
                .payload(&messages[id])
                .partition((id % PARTITIONS) as i32);
            let at = Instant::now();
            match producer.send(record) {
                Ok(()) => sent.push(at),
                // The local queue is full: deliver some, retry on the next round.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => break,
                Err((e, _)) => panic!("cannot produce to `{topic}`: {e}"),
            }
        }
        producer.poll(Duration::ZERO);
        let next = start + Duration::from_secs_f64(sent.len() as f64 / rate);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
    }
    producer.flush(Duration::from_secs(30)).expect("all records delivered");
    sent
}

/// Consumes `input` from the start and produces each message, key and
/// payload unchanged, to `output`'s one partition, as serve's reader and
/// writer would, until the consumer's plan is set and nothing has come for [`QUIET`].
fn relay(address: &str, input: &str, output: &str, plan: &Plan) {
    let consumer = from_the_start(
        address,
        input,
        PARTITIONS,
        "kafka-latency-relay",
        &[("fetch.wait.max.ms", "10")],
    );
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", address)
        .set("linger.ms", "5")
        .create()
        .expect("the relay's producer");
    let mut last_message = Instant::now();
    let give_up = Instant::now() + WARMUP_WAIT + 2 * measured_span() + DRAIN;
    while Instant::now() < give_up {
        let ended = plan.lock().unwrap().map(|(_, ended)| ended);
        if ended.is_some_and(|ended| ended.elapsed().min(last_message.elapsed()) >= QUIET) {
            break;
        }
        producer.poll(Duration::ZERO);
        let Some(message) = consumer.poll(Duration::from_millis(10)) else {
            continue;
        };
        let message = message.expect("reading the input");
        last_message = Instant::now();
        let mut record: BaseRecord<[u8], [u8]> = BaseRecord::to(output).partition(0);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(payload) = message.payload() {
            record = record.payload(payload);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                // A full queue: deliver some, then try again.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    producer.poll(Duration::from_millis(1));
                    record = back;
                }
                Err((e, _)) => panic!("cannot relay to `{output}`: {e}"),
            }
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("the relayed messages delivered");
}

/// What the consumer saw: the first receive instant of each id's prediction.
struct Received {
    at: Vec<Option<Instant>>,
    duplicates: usize,
    malformed: usize,
    /// Messages read, offsets jumped over between consecutive ones, messages
    /// whose offset is not above the one before, and the last offset read:
    /// tells a message the consumer skipped from one that never reached the
    /// topic. (Not the high watermark: tansu's lags behind what it serves.)
    read: usize,
    offset_gaps: i64,
    offset_repeats: usize,
    last_offset: i64,
}

/// Told to the consumer once producing is over: how many ids to wait for, and since when.
type Plan = Arc<Mutex<Option<(usize, Instant)>>>;

/// A consumer of `topic`'s first `partitions` partitions from their start, in
/// consumer group `group`, with `settings` besides.
fn from_the_start(
    address: &str,
    topic: &str,
    partitions: usize,
    group: &str,
    settings: &[(&str, &str)],
) -> BaseConsumer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", address)
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    for (key, value) in settings {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config.create().expect("a consumer");
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions as i32 {
        // Offset 0, not Beginning: tansu 0.6.0 may name a later batch as the earliest.
        list.add_partition_offset(topic, partition, Offset::Offset(0)).unwrap();
    }
    // assign, not subscribe: group joins are slow on tansu.
    consumer.assign(&list).expect("the output partition assigned");
    consumer
}

/// Reads every message on `topic` (`partitions` of them, from the start)
/// that holds field `field` for an id until
/// ids `0..WARMUP + n` have all come, `DRAIN` has passed since producing ended, or
/// nothing came for `QUIET` after it was set; `warm` counts the warm-up ids
/// received so far.
fn consume(
    address: &str,
    (topic, partitions): (&str, usize),
    field: &str,
    warm: &AtomicUsize,
    plan: &Plan,
) -> Received {
    // Answer fetches quickly: the measuring client's long poll is not serve's latency.
    let consumer = from_the_start(
        address,
        topic,
        partitions,
        "kafka-latency-bench",
        &[("fetch.wait.max.ms", "10")],
    );

    let mut got = Received {
        at: vec![None; WARMUP + measured()],
        duplicates: 0,
        malformed: 0,
        read: 0,
        offset_gaps: 0,
        offset_repeats: 0,
        last_offset: -1,
    };
    let (mut measured, mut last_message) = (0, Instant::now());
    // A hard stop, should the plan never come.
    let give_up = Instant::now() + WARMUP_WAIT + 2 * measured_span() + DRAIN;
    while Instant::now() < give_up {
        if let Some(&(n, ended)) = plan.lock().unwrap().as_ref() {
            let quiet = ended.elapsed().min(last_message.elapsed()) >= QUIET;
            if measured >= n || ended.elapsed() >= DRAIN || quiet {
                break;
            }
        }
        let Some(message) = consumer.poll(Duration::from_millis(50)) else {
            continue;
        };
        let now = Instant::now();
        let message = message.expect("reading the predictions");
        last_message = now;
        got.read += 1;
        got.offset_gaps += (message.offset() - got.last_offset - 1).max(0);
        got.offset_repeats += usize::from(message.offset() <= got.last_offset);
        got.last_offset = message.offset();
        let payload: Value = serde_json::from_slice(message.payload().unwrap_or_default()).unwrap_or(Value::Null);
        let id = payload["id"].as_u64().map(|id| id as usize);
        let Some(id) = id.filter(|&id| id < got.at.len() && payload[field].is_number()) else {
            got.malformed += 1;
            continue;
        };
        if got.at[id].is_some() {
            got.duplicates += 1;
            continue;
        }
        got.at[id] = Some(now);
        if id < WARMUP {
            warm.fetch_add(1, Ordering::SeqCst);
        } else {
            measured += 1;
        }
    }
    got
}

/// How many of `ids` have a prediction on `topic`, read again from the start
/// by a fresh consumer (until nothing new for 3 s, at most 60 s).
fn recount(address: &str, topic: &str, ids: &[usize]) -> usize {
    let consumer = from_the_start(address, topic, 1, "kafka-latency-recount", &[]);
    let wanted: std::collections::HashSet<usize> = ids.iter().copied().collect();
    let mut found = std::collections::HashSet::new();
    let (start, mut last) = (Instant::now(), Instant::now());
    while last.elapsed() < Duration::from_secs(3) && start.elapsed() < Duration::from_secs(60) {
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
            last = Instant::now();
            let payload: Value = serde_json::from_slice(message.payload().unwrap_or_default()).unwrap_or(Value::Null);
            if let Some(id) = payload["id"]
                .as_u64()
                .map(|id| id as usize)
                .filter(|id| wanted.contains(id))
            {
                found.insert(id);
            }
        }
    }
    found.len()
}

/// `KAFKA_LATENCY_SERVE_FLAGS`: flags added to every serve (split at spaces).
fn extra_serve_flags() -> Vec<String> {
    let flags = std::env::var("KAFKA_LATENCY_SERVE_FLAGS").unwrap_or_default();
    flags.split_whitespace().map(String::from).collect()
}

/// `dualgp serve` as a child process, its output in files; killed if still running when dropped.
struct Serve {
    child: Child,
    dir: tempfile::TempDir,
}

impl Serve {
    fn start(address: &str, input: &str, output: &str, flags: &ServeFlags) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let stdout = File::create(dir.path().join("stdout")).unwrap();
        let stderr = File::create(dir.path().join("stderr")).unwrap();
        let child = common::serve_command(address, input, output)
            .args(SERVE_FLAGS)
            .args(flags.workers)
            .args(["--scoring", flags.scoring])
            .args(flags.model_flags)
            .args(extra_serve_flags())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("the dualgp binary runs");
        Serve { child, dir }
    }

    fn output(&self) -> String {
        let read = |name| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!("{}{}", read("stdout"), read("stderr")).trim().to_owned()
    }

    /// Waits (bounded) for serve to stop by itself after `--idle-exit`; kills it otherwise.
    fn finish(&mut self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait().unwrap() {
                Some(status) if status.success() => return self.output(),
                Some(status) => return format!("serve failed ({status}): {}", self.output()),
                None if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return format!("still running after {limit:?}, killed; {}", self.output());
                }
                None => thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `q` quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median_ms(mut latencies: Vec<f64>) -> f64 {
    latencies.sort_by(f64::total_cmp);
    quantile(&latencies, 0.5)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One configuration, start to finish, on topics of its own.
fn measure(address: &str, setup: &Setup, messages: &Arc<Vec<String>>) -> Value {
    let (input, output) = (format!("in-{}", setup.name), format!("out-{}", setup.name));
    let conn = KafkaConnection::new(address).with_timeout(Duration::from_secs(20));
    create_topic(&conn, &input, PARTITIONS as i32).expect("the input topic");
    // Created here so the consumer can be assigned before serve writes to it.
    create_topic(&conn, &output, 1).expect("the output topic");

    let warm = Arc::new(AtomicUsize::new(0));
    let plan: Plan = Arc::new(Mutex::new(None));
    let consumer = {
        let (address, warm, plan) = (address.to_owned(), Arc::clone(&warm), Arc::clone(&plan));
        let (read, field) = match setup.kind {
            Kind::Serve(_) => ((output.clone(), 1), "mean"),
            Kind::TwoHops => ((output.clone(), 1), "y"),
            Kind::BrokerAlone => ((input.clone(), PARTITIONS), "y"),
        };
        thread::spawn(move || consume(&address, (&read.0, read.1), field, &warm, &plan))
    };
    let mut serve = match &setup.kind {
        Kind::Serve(flags) => Some(Serve::start(address, &input, &output, flags)),
        _ => None,
    };
    let relay = matches!(setup.kind, Kind::TwoHops).then(|| {
        let (address, input, output, plan) = (address.to_owned(), input.clone(), output.clone(), Arc::clone(&plan));
        thread::spawn(move || relay(&address, &input, &output, &plan))
    });

    produce_paced(address, &input, messages, 0, WARMUP, Duration::from_secs(10));
    let waiting = Instant::now();
    while warm.load(Ordering::SeqCst) < WARMUP {
        if waiting.elapsed() > WARMUP_WAIT {
            panic!(
                "{}: {} of {WARMUP} warm-up predictions within {WARMUP_WAIT:?}; serve: {}",
                setup.name,
                warm.load(Ordering::SeqCst),
                serve.as_ref().map(Serve::output).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    let warmup_s = waiting.elapsed().as_secs_f64();
    // Let the last warm-up update finish, well within serve's idle exit.
    thread::sleep(Duration::from_secs(1));

    let sends = {
        let (address, input, messages) = (address.to_owned(), input.clone(), Arc::clone(messages));
        thread::spawn(move || {
            produce_paced(
                &address,
                &input,
                &messages,
                WARMUP,
                measured(),
                measured_span() + Duration::from_secs(5),
            )
        })
        .join()
        .expect("the producer thread")
    };
    *plan.lock().unwrap() = Some((sends.len(), Instant::now()));
    let received = consumer.join().expect("the consumer thread");
    if let Some(relay) = relay {
        relay.join().expect("the relay thread");
    }
    let serve_says = serve
        .as_mut()
        .map(|serve| serve.finish(Duration::from_secs(30)))
        .unwrap_or_default();

    let arrivals: Vec<Option<Instant>> = received.at[WARMUP..WARMUP + sends.len()].to_vec();
    let latencies: Vec<(Instant, f64)> = sends
        .iter()
        .zip(&arrivals)
        .filter_map(|(&sent, got)| got.map(|got| (sent, ms(got.duration_since(sent)))))
        .collect();
    let lost = sends.len() - latencies.len();
    // Where the lost ones went: on the topic (the consumer missed them) or never written.
    let missing: Vec<usize> = (0..sends.len())
        .filter(|&i| arrivals[i].is_none())
        .map(|i| WARMUP + i)
        .collect();
    let lost_but_on_topic = if missing.is_empty() || matches!(setup.kind, Kind::BrokerAlone) {
        0
    } else {
        recount(address, &output, &missing)
    };
    let mut sorted: Vec<f64> = latencies.iter().map(|&(_, l)| l).collect();
    sorted.sort_by(f64::total_cmp);

    let (first_send, last_send) = (sends[0], *sends.last().unwrap());
    let produce_rate = (sends.len() - 1) as f64 / last_send.duration_since(first_send).as_secs_f64();
    let first_got = arrivals.iter().flatten().min().copied();
    let last_got = arrivals.iter().flatten().max().copied();
    let (receive_rate, drain_s) = match (first_got, last_got) {
        (Some(a), Some(b)) if b > a => (
            (latencies.len() - 1) as f64 / b.duration_since(a).as_secs_f64(),
            b.saturating_duration_since(last_send).as_secs_f64(),
        ),
        _ => (f64::NAN, f64::NAN),
    };
    // The p50 of records sent in the first and in the last second: a learner
    // that falls behind shows as a growing latency.
    let second = Duration::from_secs(1);
    let window = |from: Instant, to: Instant| {
        median_ms(
            latencies
                .iter()
                .filter(|&&(s, _)| s >= from && s < to)
                .map(|&(_, l)| l)
                .collect(),
        )
    };
    let p50_first_second = window(first_send, first_send + second);
    let p50_last_second = window(last_send - second, last_send + Duration::from_millis(1));

    let flags: Vec<&str> = match &setup.kind {
        Kind::Serve(serve) => SERVE_FLAGS
            .iter()
            .chain(serve.workers)
            .chain(&["--scoring", serve.scoring])
            .chain(serve.model_flags)
            .copied()
            .collect(),
        Kind::BrokerAlone => vec!["(no serve: the input topic read back)"],
        Kind::TwoHops => vec!["(no serve: the input relayed unchanged to the output topic)"],
    };
    json!({
        "name": setup.name,
        "flags": flags.join(" "),
        "records_measured": sends.len(),
        "received": latencies.len(),
        "lost": lost,
        "duplicates": received.duplicates,
        "malformed": received.malformed,
        "lost_but_on_topic": lost_but_on_topic,
        "lost_ids_sample": missing.iter().take(10).collect::<Vec<_>>(),
        "lost_ids_span": missing.first().zip(missing.last()),
        "output_messages_read": received.read,
        "output_offset_gaps": received.offset_gaps,
        "output_offset_repeats": received.offset_repeats,
        "output_last_offset": received.last_offset,
        "latency_ms": {
            "p50": quantile(&sorted, 0.5),
            "p90": quantile(&sorted, 0.9),
            "p99": quantile(&sorted, 0.99),
            "max": sorted.last().copied().unwrap_or(f64::NAN),
            "p50_first_second": p50_first_second,
            "p50_last_second": p50_last_second,
        },
        "produce_rate_per_s": produce_rate,
        "prediction_receive_rate_per_s": receive_rate,
        "drain_after_last_send_s": drain_s,
        "warmup_wait_s": warmup_s,
        "serve_output": serve_says,
    })
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` does not, and
    // should not start a broker for minutes.
    if !std::env::args().any(|a| a == "--bench") {
        println!("kafka_latency: run with `cargo bench -p dualgp-pipelines --bench kafka_latency`");
        return;
    }
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let messages = Arc::new(messages(WARMUP + measured()));

    // `KAFKA_LATENCY_ONLY='light;default'`: only the setups named so.
    let only = std::env::var("KAFKA_LATENCY_ONLY").ok();
    let chosen = |setup: &&Setup| {
        only.as_ref()
            .is_none_or(|names| names.split(';').any(|n| n == setup.name))
    };
    let results: Vec<Value> = SETUPS
        .iter()
        .filter(chosen)
        .map(|setup| {
            eprintln!("kafka_latency: measuring `{}` …", setup.name);
            // A fresh broker each: an in-memory broker slows as it holds
            // more, so a shared one would handicap the later setups.
            let broker = Broker::start();
            measure(&broker.address(), setup, &messages)
        })
        .collect();

    println!(
        "\nKafka round trip of `dualgp serve` at {} records/s for {:?} (d = {D}):\n",
        rate(),
        measured_span()
    );
    println!("| config | flags | measured | lost | p50 ms | p90 ms | p99 ms | max ms | p50 first → last s, ms | produced/s | predictions/s | drain s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        let l = &r["latency_ms"];
        let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | `{}` | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} → {:.0} | {:.0} | {:.0} | {:.1} |",
            r["name"].as_str().unwrap_or_default(),
            r["flags"].as_str().unwrap_or_default(),
            r["records_measured"],
            r["lost"],
            f(&l["p50"]),
            f(&l["p90"]),
            f(&l["p99"]),
            f(&l["max"]),
            f(&l["p50_first_second"]),
            f(&l["p50_last_second"]),
            f(&r["produce_rate_per_s"]),
            f(&r["prediction_receive_rate_per_s"]),
            f(&r["drain_after_last_send_s"]),
        );
    }
    for r in &results {
        if r["lost"].as_u64().unwrap_or(0) > 0 {
            println!(
                "\n{}: {} lost (ids {}), {} of them found on the topic when read again; the consumer read {} \
                 messages up to offset {}, skipping {} offsets and seeing {} repeated",
                r["name"].as_str().unwrap_or_default(),
                r["lost"],
                r["lost_ids_span"],
                r["lost_but_on_topic"],
                r["output_messages_read"],
                r["output_last_offset"],
                r["output_offset_gaps"],
                r["output_offset_repeats"],
            );
        }
        println!(
            "\n{}: {}",
            r["name"].as_str().unwrap_or_default(),
            r["serve_output"].as_str().unwrap_or_default()
        );
    }

    let json = json!({
        "rate_per_s": rate(),
        "measure_s": measured_span().as_secs_f64(),
        "warmup_records": WARMUP,
        "features": D,
        "input_partitions": PARTITIONS,
        "cores": thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg_before": load_before.trim(),
        "note": "wall clock, one run, machine shared with other jobs: noisy",
        "configs": results,
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-kafka-latency.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("\nwrote {}", path.display());
}
