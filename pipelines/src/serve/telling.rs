//! What `serve` tells whoever runs it, on standard error, each line starting
//! `dualgp serve: `: one line when it starts (where it reads and writes,
//! which partitions this process takes, the model it starts from, the
//! metrics address); a line at once when it waits for something (the
//! broker, the input topic, the cluster's other processes), naming it; and,
//! unless `--quiet`, a progress line every `--progress` seconds. The summary
//! at the end goes to standard output (`main.rs`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dualgp_connectors::WorkerShare;
use dualgp_operators::dataflow::Prediction;

use crate::metrics::Metrics;
use crate::wording::{counted, plural};

/// One line on standard error.
pub(crate) fn say(line: impl std::fmt::Display) {
    eprintln!("dualgp serve: {line}");
}

/// An epoch kept in an atomic: 0 for none, `e + 1` for epoch `e`.
#[derive(Debug, Default)]
struct NewestEpoch(AtomicU64);

impl NewestEpoch {
    fn raise(&self, epoch: u64) {
        self.0.fetch_max(epoch + 1, Ordering::SeqCst);
    }

    fn get(&self) -> Option<u64> {
        self.0.load(Ordering::SeqCst).checked_sub(1)
    }
}

/// The oldest epoch seen, kept the same way.
#[derive(Debug)]
struct OldestEpoch(AtomicU64);

impl Default for OldestEpoch {
    fn default() -> Self {
        OldestEpoch(AtomicU64::new(u64::MAX))
    }
}

impl OldestEpoch {
    fn lower(&self, epoch: u64) {
        self.0.fetch_min(epoch, Ordering::SeqCst);
    }

    fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::SeqCst)).filter(|&e| e != u64::MAX)
    }
}

/// Which epochs this process has seen, for the progress lines and the
/// summary: the workers of a process share one.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    first_read: OldestEpoch,
    last_read: NewestEpoch,
    first_with_records: OldestEpoch,
    last_with_records: NewestEpoch,
    /// The newest epoch an update learned (worker 0: process 0 only).
    learned: NewestEpoch,
    /// The newest epoch a prediction was made in, and the newest model
    /// (`model_epoch`) that made one.
    scored: NewestEpoch,
    scored_with: NewestEpoch,
    /// Whether a line said the broker is not answering (and none since that it is).
    broker_waited: AtomicBool,
    /// The brokers and `--broker-timeout`, for that line.
    brokers: String,
    broker_timeout: f64,
}

/// The epochs a run saw, for its summary.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Epochs {
    pub read: Option<(u64, u64)>,
    pub with_records: Option<(u64, u64)>,
    pub learned_through: Option<u64>,
}

impl Tally {
    pub fn new(brokers: &str, broker_timeout: f64) -> Tally {
        Tally {
            brokers: brokers.into(),
            broker_timeout,
            ..Tally::default()
        }
    }

    /// An epoch read, and whether it brought anything (records or dead letters).
    pub fn read(&self, epoch: u64, brought: bool) {
        self.first_read.lower(epoch);
        self.last_read.raise(epoch);
        if brought {
            self.first_with_records.lower(epoch);
            self.last_with_records.raise(epoch);
        }
    }

    /// An update that learned every epoch through `epoch`.
    pub fn learned(&self, epoch: u64) {
        self.learned.raise(epoch);
    }

    pub fn predicted(&self, p: &Prediction) {
        self.scored.raise(p.epoch);
        if let Some(m) = p.model_epoch {
            self.scored_with.raise(m);
        }
    }

    pub fn epochs(&self) -> Epochs {
        let range = |a: &OldestEpoch, b: &NewestEpoch| a.get().zip(b.get());
        Epochs {
            read: range(&self.first_read, &self.last_read),
            with_records: range(&self.first_with_records, &self.last_with_records),
            learned_through: self.learned.get(),
        }
    }

    /// Says once that the broker does not answer (`trouble`: for how long
    /// and why), and once that it does again.
    pub fn broker_trouble(&self, trouble: Option<(Duration, &str)>) {
        let (brokers, timeout) = (&self.brokers, self.broker_timeout);
        match trouble {
            Some((waited, detail)) if waited >= Duration::from_millis(500) => {
                if !self.broker_waited.swap(true, Ordering::SeqCst) {
                    say(format_args!(
                        "waiting for the broker at {brokers}, which does not answer ({detail}); giving up after {timeout} s (--broker-timeout)"
                    ));
                }
            }
            Some(_) => {}
            None => {
                if self.broker_waited.swap(false, Ordering::SeqCst) {
                    say(format_args!("the broker at {brokers} answers again"));
                }
            }
        }
    }
}

/// The progress line: what this process has done so far.
fn progress_line(started: Instant, metrics: &Metrics, tally: &Tally) -> String {
    let model = match (tally.scored_with.get(), tally.scored.get()) {
        (Some(m), Some(e)) => {
            let stale = e.saturating_sub(m + 1);
            format!(
                "model of epoch {m} scoring epoch {e}, {stale} epoch{} stale",
                plural(stale)
            )
        }
        (None, Some(e)) => format!("the prior scoring epoch {e}"),
        (_, None) => "nothing scored yet".into(),
    };
    let shed = match metrics.records_shed.get() {
        0 => String::new(),
        n => format!(", {n} shed"),
    };
    format!(
        "{:.0} s: {}, {}, {} ({model}{shed}), {}",
        started.elapsed().as_secs_f64(),
        counted(metrics.records_in.get(), "record"),
        counted(metrics.predictions_out.get(), "prediction"),
        counted(metrics.updates.get(), "update"),
        counted(metrics.dead_letters.get(), "dead letter")
    )
}

/// A thread of these lines, ended when its owner is dropped.
struct Watcher {
    until: Arc<Until>,
    thread: Option<JoinHandle<()>>,
}

/// Whether a watcher is to end, and what wakes it to.
#[derive(Default)]
struct Until(Mutex<bool>, Condvar);

impl Until {
    /// Waits `long` at most; whether the watcher is to end.
    fn wait(&self, long: Duration) -> bool {
        let done = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, _) = self
            .1
            .wait_timeout_while(done, long, |done| !*done)
            .unwrap_or_else(PoisonError::into_inner);
        *done
    }
}

impl Watcher {
    fn spawn(watch: impl FnOnce(&Until) + Send + 'static) -> Watcher {
        let until = Arc::new(Until::default());
        let theirs = Arc::clone(&until);
        let thread = std::thread::spawn(move || watch(&theirs));
        Watcher {
            until,
            thread: Some(thread),
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        *self.until.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.until.1.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Says how far serve has come every so often, until dropped.
pub(crate) struct Progress {
    _watcher: Watcher,
}

impl Progress {
    pub fn start(every: Duration, metrics: Metrics, tally: Arc<Tally>) -> Progress {
        let started = Instant::now();
        let watcher = Watcher::spawn(move |until| {
            let mut next = started + every;
            while !until.wait(next.saturating_duration_since(Instant::now())) {
                say(progress_line(started, &metrics, &tally));
                next += every;
            }
        });
        Progress { _watcher: watcher }
    }
}

/// Says, if the cluster has not formed half a second after it is asked to,
/// which processes it waits for, and once it has formed, that it has; until
/// dropped. A cluster not formed within `timeout` ends the process with one
/// line naming the processes it waited for (nothing has been read yet).
pub(crate) struct PeerWait {
    formed: Arc<AtomicBool>,
    _watcher: Option<Watcher>,
}

impl PeerWait {
    /// For process `me` of a cluster at `addresses`; nothing for one process.
    pub fn start(me: usize, addresses: &[String], timeout: Duration) -> PeerWait {
        let formed = Arc::new(AtomicBool::new(false));
        if addresses.len() < 2 {
            return PeerWait { formed, _watcher: None };
        }
        let others: Vec<String> = addresses
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != me)
            .map(|(i, a)| format!("process {i} at {a}"))
            .collect();
        let (seen, n) = (Arc::clone(&formed), addresses.len());
        let watcher = Watcher::spawn(move |until| {
            if until.wait(Duration::from_millis(500)) || seen.load(Ordering::SeqCst) {
                return;
            }
            say(format_args!(
                "waiting for the cluster's other processes ({}); start each with the same flags and its own --process",
                others.join(", ")
            ));
            let started = Instant::now();
            while !until.wait(Duration::from_millis(100)) {
                if seen.load(Ordering::SeqCst) {
                    say(format_args!("all {n} processes connected"));
                    return;
                }
                if started.elapsed() + Duration::from_millis(500) >= timeout {
                    eprintln!(
                        "dualgp: the cluster did not form within {} s (--peer-timeout): no connection with {}; start each with the same flags and its own --process, and check the hostfile's addresses",
                        timeout.as_secs_f64(),
                        others.join(", ")
                    );
                    std::process::exit(1);
                }
            }
        });
        PeerWait {
            formed,
            _watcher: Some(watcher),
        }
    }

    /// What a worker sets once it runs: the cluster has formed.
    pub fn formed(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.formed)
    }
}

/// What the start line says about the model serve starts from.
pub(crate) enum ModelFrom<'a> {
    /// The newest checkpoint of the checkpoint directory, after this epoch
    /// (and a `--model` given, which it wins over).
    Checkpoint { epoch: u64, over_model: bool },
    /// `--model FILE`, learned through this epoch.
    Saved { path: &'a std::path::Path, epoch: u64 },
    /// The prior, standardised on the first records (or, already, by `scaling.json`).
    Prior { scaling_known: bool },
    /// Another process's word: process 0 reads the checkpoints.
    ProcessZero,
}

/// Everything the start line names.
pub(crate) struct StartLine<'a> {
    pub brokers: &'a str,
    pub input: &'a str,
    pub output: &'a str,
    pub dead_letters: &'a str,
    pub partitions: &'a [i32],
    /// This process's first worker and workers, of all the cluster's.
    pub workers: (usize, usize),
    pub peers: usize,
    pub checkpoint_dir: Option<&'a std::path::Path>,
    pub model: ModelFrom<'a>,
    pub metrics: Option<SocketAddr>,
    pub progress: Option<f64>,
}

impl std::fmt::Display for StartLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (first, count) = self.workers;
        let mine: Vec<String> = self
            .partitions
            .iter()
            .filter(|&&p| (first..first + count).any(|w| WorkerShare::new(w, self.peers).owns(p as usize)))
            .map(i32::to_string)
            .collect();
        let all: Vec<String> = self.partitions.iter().map(i32::to_string).collect();
        let mine = match mine.len() {
            0 => "none of them".to_string(),
            n if n == all.len() => "all of them".to_string(),
            _ => mine.join(", "),
        };
        write!(
            f,
            "brokers {}; reading `{}` (partition{} {}; {} worker{} here take{} {mine}); writing `{}`, dead letters to `{}`; ",
            self.brokers,
            self.input,
            plural(all.len() as u64),
            all.join(", "),
            count,
            plural(count as u64),
            if count == 1 { "s" } else { "" },
            self.output,
            self.dead_letters,
        )?;
        match (self.checkpoint_dir, &self.model) {
            (_, ModelFrom::ProcessZero) => write!(f, "model and checkpoints: process 0's")?,
            (None, _) => write!(f, "no checkpoints (no --checkpoint-dir)")?,
            (Some(dir), ModelFrom::Checkpoint { epoch, .. }) => {
                write!(f, "checkpoint of epoch {epoch} found in {}", dir.display())?
            }
            (Some(dir), _) => write!(f, "no checkpoint yet in {}", dir.display())?,
        }
        match &self.model {
            ModelFrom::Checkpoint { over_model, .. } => write!(
                f,
                "; starting from that checkpoint{}",
                if *over_model {
                    " (newer than --model, which is not read)"
                } else {
                    ""
                }
            )?,
            ModelFrom::Saved { path, epoch } => write!(
                f,
                "; starting from the model in {} (learned through epoch {epoch}; epochs go on from {})",
                path.display(),
                epoch + 1
            )?,
            ModelFrom::Prior { scaling_known: false } => {
                write!(f, "; starting from the prior, standardised on the first records")?
            }
            ModelFrom::Prior { scaling_known: true } => write!(f, "; starting from the prior")?,
            ModelFrom::ProcessZero => {}
        }
        match self.metrics {
            Some(addr) => write!(f, "; metrics on http://{addr}/metrics")?,
            None => write!(f, "; no metrics (--metrics-port)")?,
        }
        if let Some(every) = self.progress {
            write!(f, "; progress every {every} s")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_keeps_the_first_and_last_epochs_with_records_apart_from_those_read() {
        let tally = Tally::default();
        assert!(tally.epochs().read.is_none());
        for (epoch, brought) in [(3, false), (4, true), (5, true), (6, false)] {
            tally.read(epoch, brought);
        }
        tally.learned(4);
        let epochs = tally.epochs();
        assert_eq!(epochs.read, Some((3, 6)));
        assert_eq!(epochs.with_records, Some((4, 5)));
        assert_eq!(epochs.learned_through, Some(4));
    }

    #[test]
    fn the_start_line_names_this_processs_partitions_and_the_model() {
        let line = StartLine {
            brokers: "127.0.0.1:9092",
            input: "in",
            output: "out",
            dead_letters: "in.dlq",
            partitions: &[0, 1, 2, 3],
            workers: (2, 2),
            peers: 4,
            checkpoint_dir: Some(std::path::Path::new("state")),
            model: ModelFrom::Saved {
                path: std::path::Path::new("m.json"),
                epoch: 9,
            },
            metrics: None,
            progress: Some(10.0),
        }
        .to_string();
        assert!(
            line.contains("partitions 0, 1, 2, 3; 2 workers here take 2, 3"),
            "{line}"
        );
        assert!(line.contains("no checkpoint yet in state"), "{line}");
        assert!(line.contains("model in m.json (learned through epoch 9"), "{line}");
        assert!(line.contains("progress every 10 s"), "{line}");
    }
}
