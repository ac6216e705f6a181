//! `serve`'s metrics in the Prometheus text format, on a small HTTP endpoint
//! (127.0.0.1 by default): counters of records in and out and dead letters,
//! and histograms of epoch latency (first record read → predictions
//! delivered) and of staleness (epochs a record's model lagged behind it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A cumulative Prometheus histogram.
#[derive(Debug, Clone)]
struct Histogram {
    name: &'static str,
    help: &'static str,
    /// Upper bounds of the buckets.
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(name: &'static str, help: &'static str, bounds: &'static [f64]) -> Self {
        Histogram {
            name,
            help,
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        for (count, &bound) in self.counts.iter_mut().zip(self.bounds) {
            if value <= bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String) {
        let Histogram { name, help, .. } = self;
        *out += &format!("# HELP {name} {help}\n# TYPE {name} histogram\n");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            *out += &format!("{name}_bucket{{le=\"{bound}\"}} {count}\n");
        }
        *out += &format!("{name}_bucket{{le=\"+Inf\"}} {}\n", self.count);
        *out += &format!("{name}_sum {}\n{name}_count {}\n", self.sum, self.count);
    }
}

#[derive(Debug, Clone)]
pub struct Metrics {
    pub records_in: u64,
    pub predictions_out: u64,
    pub dead_letters: u64,
    pub updates: u64,
    pub epochs: u64,
    epoch_latency: Histogram,
    staleness: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            records_in: 0,
            predictions_out: 0,
            dead_letters: 0,
            updates: 0,
            epochs: 0,
            epoch_latency: Histogram::new(
                "dualgp_epoch_latency_seconds",
                "From an epoch's first record read to its predictions delivered.",
                &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            ),
            staleness: Histogram::new(
                "dualgp_prediction_staleness_epochs",
                "Epochs before a record's own that the model which scored it had not learned.",
                &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0],
            ),
        }
    }
}

impl Metrics {
    pub fn observe_epoch_latency(&mut self, seconds: f64) {
        self.epoch_latency.observe(seconds);
    }

    pub fn observe_staleness(&mut self, epochs: u64) {
        self.staleness.observe(epochs as f64);
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters = [
            (
                "dualgp_records_in_total",
                "Records decoded from the input.",
                self.records_in,
            ),
            (
                "dualgp_predictions_out_total",
                "Predictions delivered.",
                self.predictions_out,
            ),
            (
                "dualgp_dead_letters_total",
                "Messages or records sent to the dead-letter topic.",
                self.dead_letters,
            ),
            ("dualgp_updates_total", "Model updates applied.", self.updates),
            ("dualgp_epochs_total", "Epochs read.", self.epochs),
        ];
        for (name, help, value) in counters {
            out += &format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n");
        }
        self.epoch_latency.render(&mut out);
        self.staleness.render(&mut out);
        out
    }
}

/// Answers every HTTP request on `addr` with the metrics until `stop` is set.
/// Returns the bound address (port 0 picks a free one) and the thread.
pub fn serve_http(
    addr: SocketAddr,
    metrics: Arc<Mutex<Metrics>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    // Non-blocking accept, so the thread notices `stop` within a tick.
    listener.set_nonblocking(true)?;
    let thread = std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                    // Every path gets the metrics, but the request head must be read
                    // whole: closing on unread bytes resets the connection under the client.
                    read_request_head(&mut stream);
                    let body = metrics.lock().map(|m| m.render()).unwrap_or_default();
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(50)),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    });
    Ok((bound, thread))
}

/// Reads until the blank line that ends an HTTP request head, a read error or
/// timeout, end of stream, or 8 KiB, whichever comes first.
fn read_request_head(stream: &mut impl Read) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::*;

    #[test]
    fn the_endpoint_answers_with_counters_and_a_cumulative_histogram() {
        let metrics = Arc::new(Mutex::new(Metrics::default()));
        {
            let mut m = metrics.lock().unwrap();
            m.records_in = 12;
            m.predictions_out = 10;
            m.dead_letters = 2;
            for s in [0.02, 0.3, 0.3, 7.0] {
                m.observe_epoch_latency(s);
            }
            for epochs in [0, 0, 3] {
                m.observe_staleness(epochs);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (addr, thread) = serve_http("127.0.0.1:0".parse().unwrap(), metrics, Arc::clone(&stop)).unwrap();
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Sent in pieces with pauses: the server must wait for the whole head.
        for piece in [
            "GET /metrics HTTP/1.1\r\n".to_string(),
            format!("Host: {addr}\r\n"),
            "\r\n".to_string(),
        ] {
            stream.write_all(piece.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        stop.store(true, Ordering::SeqCst);
        thread.join().unwrap();

        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        for line in [
            "dualgp_records_in_total 12",
            "dualgp_predictions_out_total 10",
            "dualgp_dead_letters_total 2",
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
        ] {
            assert!(answer.lines().any(|l| l == line), "no `{line}` in\n{answer}");
        }
    }
}
