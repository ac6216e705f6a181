//! Bounded state, measured: `dualgp serve` with the default model over a
//! million labelled records from a real Kafka-protocol broker (tansu) on
//! 127.0.0.1, its resident memory read from `/proc` when 10 % of the records
//! and when all of them have been scored. With the memory bounded (1000
//! points by default) and reading held to `--epochs-in-flight` epochs ahead,
//! nothing in serve grows with the stream, so the two figures agree to 10 %.
//!
//! Ignored by the test suite (minutes long); `scripts/rss.sh` runs it.
//! `RSS_RECORDS` (default 1 000 000) changes the run; it writes
//! `target/rss.json`.

#[allow(dead_code)] // only the in-memory broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;
mod common;

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use broker::Broker;
use common::{metrics_page, produce, serve_command};
use dualgp_connectors::kafka::create_topic;
use dualgp_connectors::KafkaConnection;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Messages handed to the producer at a time: librdkafka queues at most
/// 100 000.
const CHUNK: usize = 50_000;

/// Labelled records with two inputs, `y = sin(3 x0) + x1² + noise`, ids `from..to`.
fn messages(from: usize, to: usize, rng: &mut ChaCha8Rng) -> Vec<(String, String)> {
    (from..to)
        .map(|id| {
            let (x0, x1): (f64, f64) = (rng.random_range(-2.0..2.0), rng.random_range(-2.0..2.0));
            let y = (3.0 * x0).sin() + x1 * x1 + 0.1 * rng.random::<f64>();
            (id.to_string(), format!(r#"{{"id":{id},"x0":{x0},"x1":{x1},"y":{y}}}"#))
        })
        .collect()
}

/// A counter's value on the metrics page at `port`, if the page can be read.
fn counter(port: u16, name: &str) -> Option<u64> {
    metrics_page(port)?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The resident set of process `pid`, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("a running process");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

#[test]
#[ignore = "minutes long; scripts/rss.sh runs it"]
fn serve_memory_stays_flat_over_a_million_records() {
    let records: usize = std::env::var("RSS_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let broker = Broker::start();
    let address = broker.address();
    let conn = KafkaConnection::new(&address).with_timeout(Duration::from_secs(20));
    create_topic(&conn, "rss-in", 1).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let started = Instant::now();
    for from in (0..records).step_by(CHUNK) {
        produce(
            &address,
            "rss-in",
            &messages(from, (from + CHUNK).min(records), &mut rng),
            1,
        );
    }
    let produced = started.elapsed().as_secs_f64();

    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let work = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(work.path().join("serve.log")).unwrap();
    let mut serve = serve_command(&address, "rss-in", "rss-out")
        .args(["--likelihood", "gaussian", "--idle-exit", "10"])
        .args(["--metrics-port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the dualgp binary runs");
    let pid = serve.id();

    // RSS when a tenth of the records and when all of them are scored, and
    // its largest value between; bounded: serve exits once idle.
    let tenth = records as u64 / 10;
    let (mut at_tenth, mut peak, mut at_end) = (None, 0, None);
    let scoring = Instant::now();
    while serve.try_wait().unwrap().is_none() && at_end.is_none() {
        if let Some(scored) = counter(port, "dualgp_predictions_out_total") {
            let rss = rss_kb(pid);
            if at_tenth.is_some() {
                peak = peak.max(rss);
            }
            if scored >= tenth && at_tenth.is_none() {
                at_tenth = Some((scored, rss, scoring.elapsed().as_secs_f64()));
            }
            if scored >= records as u64 {
                at_end = Some((scored, rss, scoring.elapsed().as_secs_f64()));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = serve.kill();
    let log = std::fs::read_to_string(work.path().join("serve.log")).unwrap_or_default();
    let (Some(tenth), Some(end)) = (at_tenth, at_end) else {
        panic!("serve did not score every record ({at_tenth:?}, {at_end:?}): {log}");
    };
    let figures = serde_json::json!({
        "records": records,
        "produce_seconds": produced,
        "rss_kb_at_tenth": tenth.1,
        "scored_at_tenth": tenth.0,
        "seconds_at_tenth": tenth.2,
        "rss_kb_at_end": end.1,
        "scored_at_end": end.0,
        "seconds_at_end": end.2,
        "rss_kb_peak_after_tenth": peak,
        "records_per_second": end.0 as f64 / end.2,
    });
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/rss.json");
    std::fs::write(&target, serde_json::to_string_pretty(&figures).unwrap()).unwrap();
    println!("{figures:#}");
    let growth = end.1 as f64 / tenth.1 as f64;
    assert!(
        growth <= 1.10,
        "RSS grew {growth:.3}× from a tenth of the stream to its end: {figures}"
    );
}
