//! Running the built `dualgp` binary, shared by the command tests.
#![allow(dead_code)]

use std::process::{Command, Output};

#[path = "../../../operators/tests/common/hostfile.rs"]
mod hostfile;
#[allow(unused_imports)] // not every test binary runs a cluster
pub use hostfile::hostfile;

pub fn dualgp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dualgp"))
        .args(args)
        .output()
        .expect("the dualgp binary runs")
}

/// The words of `line`: constant flags written as one command line (no
/// value among them holds a space).
pub fn words(line: &str) -> Vec<&str> {
    line.split(' ').collect()
}

/// `dualgp eval` of `data`, tested on `test`, under `likelihood`; the caller
/// adds the other flags.
pub fn eval_args<'a>(data: &'a str, test: &'a str, likelihood: &'a str) -> Vec<&'a str> {
    vec!["eval", "--data", data, "--test", test, "--likelihood", likelihood]
}

/// `dualgp replay` of `data`, predictions to `output`; the caller adds the
/// other flags.
pub fn replay_args<'a>(data: &'a std::path::Path, output: &'a std::path::Path) -> Vec<&'a str> {
    vec![
        "replay",
        "--data",
        data.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]
}

/// `dualgp serve` from topic `input` to `output` on the broker at `address`;
/// the caller adds the other flags.
pub fn serve_args<'a>(address: &'a str, input: &'a str, output: &'a str) -> Vec<&'a str> {
    vec![
        "serve",
        "--brokers",
        address,
        "--input-topic",
        input,
        "--output-topic",
        output,
    ]
}

/// Creates `topics`, each of `partitions` partitions, on the broker at `address`.
pub fn create_topics(address: &str, partitions: i32, topics: &[&str]) {
    let conn = dualgp_connectors::KafkaConnection::new(address).with_timeout(std::time::Duration::from_secs(20));
    for topic in topics {
        dualgp_connectors::kafka::create_topic(&conn, topic, partitions).unwrap();
    }
}

/// Runs `dualgp` and requires it to succeed; returns the JSON report at `report`.
pub fn json_report_of(args: &[&str], report: &std::path::Path) -> serde_json::Value {
    let out = dualgp(args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap()
}

/// Fails with exit code ≠ 0 and a single stderr line containing `needle`.
pub fn assert_fails_with(args: &[&str], needle: &str) {
    let out = dualgp(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "{args:?}: expected one line, got:\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{args:?}: {stderr:?} does not mention {needle:?}"
    );
}

/// [`serve_args`] as a command to spawn; the caller adds the other flags.
pub fn serve_command(address: &str, input: &str, output: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dualgp"));
    command.args(serve_args(address, input, output));
    command
}

/// Produces `(key, payload)` messages to `topic`, spread over `partitions`
/// in turn, and waits until the broker has them all.
pub fn produce(address: &str, topic: &str, messages: &[(String, String)], partitions: i32) {
    produce_with(address, topic, messages, partitions, &[]);
}

/// [`produce`] with librdkafka `options` (`message.max.bytes` for big messages).
pub fn produce_with(
    address: &str,
    topic: &str,
    messages: &[(String, String)],
    partitions: i32,
    options: &[(&str, &str)],
) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Duration;
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", address)
        .set("message.timeout.ms", "60000");
    for (k, v) in options {
        config.set(*k, *v);
    }
    let producer: BaseProducer = config.create().unwrap();
    for (i, (key, payload)) in messages.iter().enumerate() {
        let partition = i as i32 % partitions;
        let record = BaseRecord::to(topic).key(key).payload(payload).partition(partition);
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("all messages delivered");
}

/// Every message payload on partition 0 of `topic`, read until `expected`
/// have come and then nothing new for two seconds (to catch duplicates), or
/// for a minute at most.
pub fn read_topic(address: &str, topic: &str, expected: usize) -> Vec<String> {
    use std::time::Duration;
    read_topic_within(
        address,
        topic,
        expected,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
}

/// [`read_topic`] with its quiet time and its limit given. It reads by
/// assignment, not by a group join (which takes seconds on tansu), from
/// offset 0: tansu 0.6.0 answers "the earliest offset" with the batch it
/// stored first, which is not the lowest when two producers wrote at once
/// (`delivery.rs`). A fetch while a producer writes can skip a batch being
/// stored (read again, it is there), so a read that stalls short of
/// `expected` for five seconds starts again from the beginning with a new
/// consumer, within the same limit; the longest read is returned.
pub fn read_topic_within(
    address: &str,
    topic: &str,
    expected: usize,
    quiet: std::time::Duration,
    limit: std::time::Duration,
) -> Vec<String> {
    use std::time::{Duration, Instant};
    const STALLED: Duration = Duration::from_secs(5);
    let deadline = Instant::now() + limit;
    let mut longest: Vec<String> = Vec::new();
    while Instant::now() < deadline {
        let read = read_once(address, topic, expected, quiet, STALLED, deadline);
        if read.len() > longest.len() {
            longest = read;
        }
        if longest.len() >= expected {
            break;
        }
    }
    longest
}

/// One read of partition 0 from its beginning: until `expected` have come
/// and then nothing for `quiet`, nothing for `stalled` while short, or the
/// deadline.
fn read_once(
    address: &str,
    topic: &str,
    expected: usize,
    quiet: std::time::Duration,
    stalled: std::time::Duration,
    deadline: std::time::Instant,
) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    use std::time::{Duration, Instant};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", address)
        .set("group.id", "dualgp-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Offset(0)).unwrap();
    consumer.assign(&list).unwrap();
    let mut out = Vec::new();
    let mut last = Instant::now();
    while Instant::now() < deadline {
        let waited = last.elapsed();
        if (out.len() >= expected && waited >= quiet) || (out.len() < expected && waited >= stalled) {
            break;
        }
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            out.push(String::from_utf8_lossy(message.unwrap().payload().unwrap_or_default()).into_owned());
            last = Instant::now();
        }
    }
    out
}

/// The newest checkpoint `serve` wrote in `dir`; there must be one.
pub fn newest_checkpoint(
    dir: &std::path::Path,
) -> dualgp_operators::dataflow::Checkpoint<dualgp_connectors::KafkaPosition> {
    dualgp_operators::dataflow::CheckpointStore::new(dir, 3)
        .unwrap()
        .latest()
        .unwrap()
        .expect("a checkpoint")
}

/// Labelled records `y = sin(3·x0) + x1` with ids `ids`, as `(key, JSON)`.
pub fn labelled_records(ids: std::ops::Range<i64>) -> Vec<(String, String)> {
    ids.map(|id| {
        let x0 = (id * 37 % 101) as f64 / 50.0 - 1.0;
        let x1 = (id * 61 % 97) as f64 / 48.0 - 1.0;
        let y = (3.0 * x0).sin() + x1;
        (id.to_string(), format!(r#"{{"id":{id},"x0":{x0},"x1":{x1},"y":{y}}}"#))
    })
    .collect()
}

/// Starting the `dualgp` binary with its standard output and error piped.
pub trait SpawnPiped {
    fn spawn_piped(&mut self) -> std::process::Child;
}

impl SpawnPiped for Command {
    fn spawn_piped(&mut self) -> std::process::Child {
        use std::process::Stdio;
        self.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the dualgp binary runs")
    }
}

/// A port that was free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The Prometheus page `serve --metrics-port PORT` serves, if it can be read.
pub fn metrics_page(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut page = String::new();
    stream.read_to_string(&mut page).ok()?;
    Some(page)
}

/// The value on the line `name VALUE` of serve's metrics page at `port`.
pub fn metric(port: u16, name: &str) -> Option<u64> {
    let page = metrics_page(port)?;
    let line = page
        .lines()
        .find(|l| l.strip_prefix(name).is_some_and(|v| v.starts_with(' ')))?;
    line.rsplit(' ').next()?.parse().ok()
}

/// Waits (at most `limit`) for `child` to exit; kills it past that.
pub fn exit_within(child: &mut std::process::Child, limit: std::time::Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("dualgp did not stop within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// [`exit_within`], then what `child` wrote.
pub fn output_within(mut child: std::process::Child, limit: std::time::Duration) -> Output {
    exit_within(&mut child, limit);
    child.wait_with_output().unwrap()
}

/// Sends SIGTERM to `child` (serve's graceful stop).
pub fn terminate(child: &std::process::Child) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}
