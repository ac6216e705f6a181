//! `dualgp serve` behind a broker that is slow, then still, for longer than
//! an epoch: a relay on 127.0.0.1 between every Kafka client and a real
//! broker (tansu, which tells the clients to connect to the relay) delays
//! each chunk of bytes, then holds them all. Serve rides it out: it does
//! not exit, and every record is scored and sent once.

#[allow(dead_code)] // not every helper of the broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;

mod common;

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, spawn};
use std::time::{Duration, Instant};

use broker::Broker;
use common::{
    create_topics, exit_within, free_port, labelled_records, metric, metrics_page, produce, read_topic, serve_command,
    terminate, SpawnPiped,
};

/// How the relay treats the bytes it carries.
#[derive(Clone, Copy)]
enum Pace {
    /// Passed on at once.
    Open,
    /// Each chunk passed on this long after it arrived.
    Delayed(Duration),
    /// Nothing passed on; connections stay open.
    Held,
}

/// A TCP relay on 127.0.0.1:`port` to a broker, at a pace the test sets.
struct Relay {
    pace: Arc<Mutex<Pace>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn start(port: u16, broker: u16) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let pace = Arc::new(Mutex::new(Pace::Open));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&pace), Arc::clone(&stop));
        spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", broker)) else {
                            continue;
                        };
                        for (from, to) in [(&client, &server), (&server, &client)] {
                            let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                            let (p, s) = (Arc::clone(&p), Arc::clone(&s));
                            spawn(move || pump(from, to, &p, &s));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => sleep(Duration::from_millis(10)),
                    Err(e) => panic!("the relay cannot accept: {e}"),
                }
            }
        });
        Relay { pace, stop }
    }

    fn set(&self, pace: Pace) {
        *self.pace.lock().unwrap() = pace;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Carries bytes from `from` to `to` at the relay's pace until either end
/// closes or the relay stops.
fn pump(mut from: TcpStream, mut to: TcpStream, pace: &Mutex<Pace>, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buffer = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::SeqCst) {
        let n = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        let arrived = Instant::now();
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let wait = match *pace.lock().unwrap() {
                Pace::Open => Duration::ZERO,
                Pace::Delayed(by) => by.saturating_sub(arrived.elapsed()),
                Pace::Held => Duration::from_millis(10),
            };
            if wait.is_zero() {
                break;
            }
            sleep(wait.min(Duration::from_millis(10)));
        }
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Waits (at most `limit`) until serve has sent `n` predictions.
fn await_predictions(port: u16, n: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while metric(port, "dualgp_predictions_out_total").unwrap_or(0) < n {
        assert!(
            Instant::now() < deadline,
            "serve did not send {n} predictions within {limit:?}"
        );
        sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_broker_slow_then_still_for_longer_than_an_epoch_loses_and_doubles_nothing() {
    const RECORDS: i64 = 600;
    let relay_port = free_port();
    let broker = Broker::start_advertising(relay_port);
    let relay = Relay::start(relay_port, broker.port);
    let address = format!("127.0.0.1:{relay_port}");
    create_topics(&address, 2, &["in"]);
    create_topics(&address, 1, &["out", "in.dlq"]);
    let metrics = free_port();

    // Epochs of at most 300 ms; the broker timeout (30 s) outlasts every stall.
    let mut serve = serve_command(&address, "in", "out")
        .args(["--likelihood", "gaussian", "--inducing", "10", "--workers", "2"])
        .args(["--batch-size", "50", "--batch-timeout-ms", "300"])
        .args(["--metrics-port", &metrics.to_string()])
        .spawn_piped();
    let (first, second, third) = (0..200, 200..400, 400..RECORDS);
    produce(&address, "in", &labelled_records(first), 2);
    await_predictions(metrics, 200, Duration::from_secs(60));

    // Slow: every chunk each way 400 ms late, for 3 s.
    relay.set(Pace::Delayed(Duration::from_millis(400)));
    produce(&address, "in", &labelled_records(second), 2);
    sleep(Duration::from_secs(3));
    // Still: nothing passes for 5 s, while records wait to be read.
    relay.set(Pace::Held);
    sleep(Duration::from_secs(5));
    assert!(
        serve.try_wait().unwrap().is_none(),
        "serve exited while the broker was still"
    );
    relay.set(Pace::Open);
    produce(&address, "in", &labelled_records(third), 2);
    await_predictions(metrics, RECORDS as u64, Duration::from_secs(60));

    assert_eq!(metric(metrics, "dualgp_records_in_total"), Some(RECORDS as u64));
    let page = metrics_page(metrics).unwrap();
    assert!(
        !page.contains("\ndualgp_dead_letters_total"),
        "no dead letter at all:\n{page}"
    );
    terminate(&serve);
    let status = exit_within(&mut serve, Duration::from_secs(60));
    let mut stdout = String::new();
    serve.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let mut stderr = String::new();
    serve.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains(&format!("{RECORDS} records scored")), "{stdout}");
    // It said what it waited for, and when the broker answered again.
    assert!(stderr.contains("waiting for the broker at"), "{stderr}");
    assert!(stderr.contains("answers again"), "{stderr}");

    let ids: Vec<i64> = read_topic(&address, "out", RECORDS as usize)
        .iter()
        .map(|text| {
            serde_json::from_str::<serde_json::Value>(text).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    let distinct: BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct, (0..RECORDS).collect(), "a record was not predicted");
    assert_eq!(ids.len(), distinct.len(), "a record was predicted twice");
}
