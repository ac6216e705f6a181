//! Running the built `dualgp` binary, shared by the command tests.
#![allow(dead_code)]

use std::process::{Command, Output};

pub fn dualgp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dualgp"))
        .args(args)
        .output()
        .expect("the dualgp binary runs")
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

/// `dualgp serve` from topic `input` to `output` on the broker at `address`;
/// the caller adds the other flags.
pub fn serve_command(address: &str, input: &str, output: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dualgp"));
    command.args([
        "serve",
        "--brokers",
        address,
        "--input-topic",
        input,
        "--output-topic",
        output,
    ]);
    command
}

/// Produces `(key, payload)` messages to `topic`, spread over `partitions`
/// in turn, and waits until the broker has them all.
pub fn produce(address: &str, topic: &str, messages: &[(String, String)], partitions: i32) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Duration;
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", address)
        .set("message.timeout.ms", "60000")
        .create()
        .unwrap();
    for (i, (key, payload)) in messages.iter().enumerate() {
        let partition = i as i32 % partitions;
        let record = BaseRecord::to(topic).key(key).payload(payload).partition(partition);
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("all messages delivered");
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
