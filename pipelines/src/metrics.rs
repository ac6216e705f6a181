//! `serve`'s metrics in the Prometheus text format (the `prometheus` crate),
//! on a small HTTP endpoint (127.0.0.1 by default; `tiny_http`, which reads
//! each client on its own thread, so a client that connects and says nothing
//! holds up no one): counters of records in and out, dead letters by reason, updates
//! applied and failed, epochs; the last update's forgetting discount;
//! histograms of epoch latency (first record
//! read → predictions delivered) and of staleness (epochs a record's model
//! lagged behind it). The names are a contract: outside checks read them.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use dualgp_connectors::DeadLetter;
use dualgp_operators::dataflow::Prediction;
use prometheus::{Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// Every metric `serve` keeps; clones share the counts.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Records read.
    pub records_in: IntCounter,
    /// Predictions delivered.
    pub predictions_out: IntCounter,
    /// Records sent to the dead-letter topic.
    pub dead_letters: DeadLetterCount,
    /// Updates applied.
    pub updates: IntCounter,
    /// Updates that failed, the model left as it was (see `reduce_stage`).
    pub updates_failed: IntCounter,
    /// Labelled records scored and not learned (`--max-staleness`).
    pub records_shed: IntCounter,
    /// Epochs read (the most any worker has read).
    pub epochs: IntCounter,
    /// What forgetting left of the past's weight at the last update applied.
    pub forgetting_discount: Gauge,
    /// The most epochs any worker has read: workers raise `epochs` to it
    /// without a lock.
    epochs_seen: Arc<AtomicU64>,
    epoch_latency: Histogram,
    staleness: Histogram,
    prequential_nlpd: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("a valid metric name");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h =
                Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("valid buckets");
            registry.register(Box::new(h.clone())).expect("registered once");
            h
        };
        Metrics {
            records_in: counter("dualgp_records_in_total", "Records decoded from the input."),
            predictions_out: counter("dualgp_predictions_out_total", "Predictions delivered."),
            dead_letters: DeadLetterCount::registered(&registry),
            updates: counter("dualgp_updates_total", "Model updates applied."),
            updates_failed: counter(
                "dualgp_updates_failed_total",
                "Model updates that failed; the model stayed as it was before the epoch.",
            ),
            records_shed: counter(
                "dualgp_records_shed_total",
                "Labelled records scored and not learned, to hold the models within --max-staleness.",
            ),
            epochs: counter("dualgp_epochs_total", "Epochs read."),
            forgetting_discount: {
                let help = "What forgetting left of the past's weight at the last update (1: nothing forgotten; \
                            well below 1 under --forget-half-life auto: the stream moved).";
                let g = Gauge::new("dualgp_forgetting_discount", help).expect("a valid metric name");
                g.set(1.0);
                registry.register(Box::new(g.clone())).expect("registered once");
                g
            },
            epochs_seen: Arc::default(),
            epoch_latency: histogram(
                "dualgp_epoch_latency_seconds",
                "From an epoch's first record read to its predictions delivered.",
                &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            ),
            staleness: histogram(
                "dualgp_prediction_staleness_epochs",
                "Epochs before a record's own that the model which scored it had not learned.",
                &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0],
            ),
            prequential_nlpd: histogram(
                "dualgp_prequential_nlpd",
                "Each labelled record's negative log predictive density, scored before it was learned \
                 (its mean over a recent window against the whole run's: drift).",
                &[-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0],
            ),
            registry,
        }
    }
}

/// Messages or records sent to the dead-letter topic, by the kind of their
/// reason (`dualgp_dead_letters_total{reason="non_finite"}`), and in all.
#[derive(Clone)]
pub struct DeadLetterCount {
    by_reason: IntCounterVec,
    total: Arc<AtomicU64>,
}

impl DeadLetterCount {
    fn registered(registry: &Registry) -> Self {
        let opts = Opts::new(
            "dualgp_dead_letters_total",
            "Messages or records sent to the dead-letter topic, by the kind of their reason.",
        );
        let by_reason = IntCounterVec::new(opts, &["reason"]).expect("a valid metric name");
        registry.register(Box::new(by_reason.clone())).expect("registered once");
        DeadLetterCount {
            by_reason,
            total: Arc::default(),
        }
    }

    /// Counts `letters`.
    pub fn count(&self, letters: &[DeadLetter]) {
        for letter in letters {
            self.by_reason.with_label_values(&[letter.reason.kind().as_str()]).inc();
        }
        self.total.fetch_add(letters.len() as u64, Ordering::SeqCst);
    }

    /// All counted so far.
    pub fn get(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }
}

impl Metrics {
    /// Records how long an epoch took from its first record to its predictions.
    pub fn observe_epoch_latency(&self, seconds: f64) {
        self.epoch_latency.observe(seconds);
    }

    /// Records a prediction's staleness: epochs its model had not learned.
    pub fn observe_staleness(&self, epochs: u64) {
        self.staleness.observe(epochs as f64);
    }

    /// Records a labelled prediction's negative log density (nothing for
    /// one without a label).
    pub fn observe_prediction(&self, p: &Prediction) {
        if let Some(log_density) = p.log_density {
            self.prequential_nlpd.observe(-log_density);
        }
    }

    /// Raises the epochs read to `epochs` (a counter only goes up).
    pub fn saw_epochs(&self, epochs: u64) {
        let seen = self.epochs_seen.fetch_max(epochs, Ordering::SeqCst);
        if epochs > seen {
            self.epochs.inc_by(epochs - seen);
        }
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into memory fails only on a metric the registry refused.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The metrics endpoint while it runs.
pub struct Endpoint {
    server: Arc<tiny_http::Server>,
    thread: JoinHandle<()>,
    addr: SocketAddr,
}

impl Endpoint {
    /// The address it listens on (port 0 asked for any).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops answering and waits for the answering thread.
    pub fn stop(self) {
        self.server.unblock();
        let _ = self.thread.join();
    }
}

/// Answers every HTTP request on `addr` with the metrics until stopped.
pub fn serve_http(addr: SocketAddr, metrics: Metrics) -> std::io::Result<Endpoint> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let server = tiny_http::Server::from_listener(listener, None).map_err(std::io::Error::other)?;
    let server = Arc::new(server);
    let requests = Arc::clone(&server);
    let content_type =
        tiny_http::Header::from_bytes("Content-Type", TextEncoder::new().format_type()).expect("a valid header");
    // Requests come here once read whole; answering one is a write of a few
    // kilobytes, so one thread answers them all.
    let thread = std::thread::spawn(move || {
        for request in requests.incoming_requests() {
            let response = tiny_http::Response::from_string(metrics.render()).with_header(content_type.clone());
            let _ = request.respond(response);
        }
    });
    Ok(Endpoint { server, thread, addr })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    use dualgp_connectors::{Origin, Reason};
    use dualgp_operators::model::Predictive;

    use super::*;

    fn scrape(addr: SocketAddr) -> String {
        let mut scraper = TcpStream::connect(addr).unwrap();
        scraper.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            scraper,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        scraper.read_to_string(&mut answer).unwrap();
        answer
    }

    /// A client that connects and sends nothing holds the connection open:
    /// a scrape beside it is answered while it still waits, not after the
    /// server gives up on it.
    #[test]
    fn a_client_that_sends_nothing_does_not_block_scraping() {
        let metrics = Metrics::default();
        metrics.records_in.inc_by(3);
        let endpoint = serve_http("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let silent = TcpStream::connect(endpoint.addr()).unwrap();
        let answer = scrape(endpoint.addr());
        assert!(answer.lines().any(|l| l == "dualgp_records_in_total 3"), "{answer}");
        // Nothing came back to the silent client yet: it was not served first.
        silent.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let unanswered = matches!((&silent).read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        drop(silent);
        endpoint.stop();
        assert!(unanswered, "the silent client was dealt with before the scrape");
    }

    #[test]
    fn the_endpoint_answers_with_counters_and_a_cumulative_histogram() {
        let metrics = Metrics::default();
        metrics.records_in.inc_by(12);
        metrics.predictions_out.inc_by(10);
        let letter = |reason| DeadLetter {
            origin: Origin::File {
                path: "in.parquet".into(),
                row: 0,
            },
            payload: String::new(),
            reason,
        };
        let non_finite = |field: &str| Reason::NonFinite {
            field: field.into(),
            value: "NaN".into(),
        };
        metrics.dead_letters.count(&[
            letter(non_finite("x0")),
            letter(non_finite("y")),
            letter(Reason::Undecodable {
                detail: "not JSON".into(),
            }),
        ]);
        metrics.updates_failed.inc();
        metrics.forgetting_discount.set(0.25);
        metrics.saw_epochs(4);
        metrics.saw_epochs(3);
        for s in [0.02, 0.3, 0.3, 7.0] {
            metrics.observe_epoch_latency(s);
        }
        for epochs in [0, 0, 3] {
            metrics.observe_staleness(epochs);
        }
        let scored = |log_density| Prediction {
            id: 0,
            epoch: 0,
            model_epoch: None,
            predictive: Predictive::Moments { mean: 0.0, var: 1.0 },
            log_density,
            output: None,
            all_outputs: Vec::new(),
        };
        for log_density in [Some(0.25), Some(-1.5), None] {
            metrics.observe_prediction(&scored(log_density));
        }
        let endpoint = serve_http("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let addr = endpoint.addr();
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Sent in pieces with pauses: the server must wait for the whole head.
        for piece in [
            "GET /metrics HTTP/1.1\r\n".to_string(),
            format!("Host: {addr}\r\n"),
            "Connection: close\r\n\r\n".to_string(),
        ] {
            stream.write_all(piece.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        endpoint.stop();

        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.contains("text/plain; version=0.0.4"), "{answer}");
        for line in [
            "# TYPE dualgp_records_in_total counter",
            "dualgp_records_in_total 12",
            "dualgp_predictions_out_total 10",
            "dualgp_dead_letters_total{reason=\"non_finite\"} 2",
            "dualgp_dead_letters_total{reason=\"undecodable\"} 1",
            "dualgp_updates_total 0",
            "dualgp_updates_failed_total 1",
            "dualgp_epochs_total 4",
            "dualgp_forgetting_discount 0.25",
            "# TYPE dualgp_epoch_latency_seconds histogram",
            "dualgp_epoch_latency_seconds_bucket{le=\"0.025\"} 1",
            "dualgp_epoch_latency_seconds_bucket{le=\"0.5\"} 3",
            "dualgp_epoch_latency_seconds_bucket{le=\"5\"} 3",
            "dualgp_epoch_latency_seconds_bucket{le=\"10\"} 4",
            "dualgp_epoch_latency_seconds_bucket{le=\"+Inf\"} 4",
            "dualgp_epoch_latency_seconds_count 4",
            "dualgp_prediction_staleness_epochs_bucket{le=\"0\"} 2",
            "dualgp_prediction_staleness_epochs_bucket{le=\"2\"} 2",
            "dualgp_prediction_staleness_epochs_bucket{le=\"4\"} 3",
            "dualgp_prediction_staleness_epochs_sum 3",
            "dualgp_prequential_nlpd_bucket{le=\"-0.5\"} 0",
            "dualgp_prequential_nlpd_bucket{le=\"0\"} 1",
            "dualgp_prequential_nlpd_bucket{le=\"2\"} 2",
            "dualgp_prequential_nlpd_sum 1.25",
            "dualgp_prequential_nlpd_count 2",
        ] {
            assert!(answer.lines().any(|l| l == line), "no `{line}` in\n{answer}");
        }
    }

    #[test]
    fn many_scrapes_at_once_are_all_answered() {
        let metrics = Metrics::default();
        metrics.updates.inc();
        let endpoint = serve_http("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let addr = endpoint.addr();
        let scrapers: Vec<_> = (0..8).map(|_| std::thread::spawn(move || scrape(addr))).collect();
        for s in scrapers {
            let answer = s.join().unwrap();
            assert!(answer.lines().any(|l| l == "dualgp_updates_total 1"), "{answer}");
        }
        endpoint.stop();
    }
}
