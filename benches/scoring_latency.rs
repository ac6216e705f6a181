//! Scoring latency inside the dataflow while the learner works: no broker,
//! no network, so what is measured is the operator's own share of a
//! record's round trip (`kafka_latency` adds Kafka's).
//!
//! Two timely workers in this process read a paced stream of labelled records
//! (d = 8, 10 000 records/s, epochs of 1000) and score them on arrival with
//! the default learner of `dualgp serve` (m = 100, the M-step moving `Z`, a
//! Gaussian M-step's iterations, one update learning every epoch that closed
//! meanwhile, up to serve's 16 in flight). A record's
//! latency is the instant its prediction leaves the operator minus the instant
//! the record was due on the stream (so a worker that reads late counts
//! against it). Reading never pauses: the learner falls behind as far as it
//! must, and the staleness of the scoring models says how far.
//!
//! The learner runs on threads beside the workers', first at their priority,
//! then in the background (`GpOptions::learn_in_background`: it runs only on
//! a core nothing else wants), then at their priority held to a staleness
//! bound (`GpOptions::max_staleness`, `serve --max-staleness`: it learns a
//! sample of what it cannot absorb).
//! Writes `target/bench-scoring-latency.json` and prints a table. Run:
//!
//! ```text
//! cargo bench --bench scoring_latency
//! ```
//!
//! `SCORING_LATENCY_SECONDS` sets the stream's length (default 20 s a row).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dualgp::operators::dataflow::{GpOptions, LearnGp, Record, Scoring};
use dualgp::operators::model::{Likelihood, SequentialLearner};
use dualgp::pipelines::model_args::ModelArgs;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle};

const D: usize = 8;
const RATE: f64 = 10_000.0;
const EPOCH: usize = 1000;
const WORKERS: usize = 2;
/// One update learns at most this many epochs (serve's default); reading never waits for it.
const MOST_EPOCHS_PER_UPDATE: usize = dualgp::pipelines::serve::EPOCHS_IN_FLIGHT as usize;
/// The bounded row's `--max-staleness`.
const BOUND: u64 = 4;

/// How the learner runs in a row.
#[derive(Clone, Copy)]
struct Learning {
    background: bool,
    max_staleness: Option<u64>,
}

fn seconds() -> f64 {
    let given = std::env::var("SCORING_LATENCY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    given.unwrap_or(20.0)
}

/// The stream: y = sin(x0) + 0.5 x1 + noise, inputs uniform on [-2, 2].
fn stream(n: usize) -> Vec<Record> {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    (0..n)
        .map(|i| {
            let x: Vec<f64> = (0..D).map(|_| rng.random_range(-2.0..2.0)).collect();
            let y = x[0].sin() + 0.5 * x[1] + 0.1 * rng.random::<f64>();
            Record::new(i as i64, x, Some(y))
        })
        .collect()
}

/// serve's default learner for `D` inputs and a Gaussian likelihood.
fn default_learner() -> SequentialLearner {
    let settings = ModelArgs::default().settings().expect("the default settings");
    let likelihood = settings.likelihood(Likelihood::Gaussian { variance: 0.1 });
    let config = settings.sequential_for(&likelihood);
    SequentialLearner::new(settings.kernel(D), likelihood, config).expect("the default learner")
}

/// What one worker saw: for each prediction, its record's id, the latency
/// from the record's due instant, and the epochs its model lagged behind.
#[derive(Default)]
struct Seen {
    scored: Vec<(i64, Duration, u64)>,
    updates: usize,
    /// Labelled records the updates did not learn (the staleness bound).
    shed: u64,
}

/// Streams `records` through the operator on [`WORKERS`] workers, learning as `learning` says.
fn run(records: &Arc<Vec<Record>>, learning: Learning) -> Vec<Seen> {
    let records = Arc::clone(records);
    let start = Instant::now() + Duration::from_millis(100);
    let guards = timely::execute(timely::Config::process(WORKERS), move |worker| {
        let (index, peers) = (worker.index(), worker.peers());
        let mut input = InputHandleVec::new();
        let probe = ProbeHandle::new();
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Seen::default()));
        let (s1, s2) = (seen.clone(), seen.clone());
        worker.dataflow::<u64, _, _>(|scope| {
            let options = GpOptions {
                scoring: Scoring::OnArrival,
                max_epochs_per_update: MOST_EPOCHS_PER_UPDATE,
                learn_in_background: learning.background,
                max_staleness: learning.max_staleness,
                ..GpOptions::new(D)
            };
            let gp = scope
                .input_from(&mut input)
                .learn_gp_with(None, default_learner(), options);
            gp.predictions
                .inspect(move |p| {
                    let due = start + Duration::from_secs_f64(p.id as f64 / RATE);
                    let lag = p.staleness();
                    s1.borrow_mut()
                        .scored
                        .push((p.id, Instant::now().saturating_duration_since(due), lag));
                })
                .probe_with(&probe);
            gp.updates
                .inspect(move |u| {
                    let mut seen = s2.borrow_mut();
                    seen.updates += 1;
                    seen.shed += u.shed;
                })
                .probe_with(&probe);
        });
        // Each worker reads every `peers`-th record when it is due.
        let mut next = index;
        while next < records.len() {
            let due = ((Instant::now().saturating_duration_since(start)).as_secs_f64() * RATE) as usize;
            while next < due.min(records.len()) {
                input.advance_to((next / EPOCH) as u64);
                input.send(records[next].clone());
                next += peers;
            }
            // As serve does: what was read goes in now, not once a buffer fills.
            input.flush();
            worker.step_or_park(Some(Duration::from_micros(200)));
        }
        drop(input);
        while worker.step_or_park(Some(Duration::from_millis(1))) {}
        seen.take()
    })
    .expect("timely starts");
    guards.join().into_iter().map(|r| r.expect("a worker")).collect()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn summary(seen: &[Seen]) -> Value {
    let mut latency_us: Vec<f64> = seen
        .iter()
        .flat_map(|s| s.scored.iter().map(|(_, l, _)| l.as_secs_f64() * 1e6))
        .collect();
    latency_us.sort_by(f64::total_cmp);
    let staleness: Vec<u64> = seen.iter().flat_map(|s| s.scored.iter().map(|(_, _, s)| *s)).collect();
    let mean_staleness = staleness.iter().sum::<u64>() as f64 / staleness.len().max(1) as f64;
    json!({
        "predictions": latency_us.len(),
        "updates": seen.iter().map(|s| s.updates).max().unwrap_or(0),
        "shed": seen.iter().map(|s| s.shed).sum::<u64>(),
        "latency_us": {
            "p50": quantile(&latency_us, 0.5),
            "p90": quantile(&latency_us, 0.9),
            "p99": quantile(&latency_us, 0.99),
            "max": quantile(&latency_us, 1.0),
        },
        "staleness_epochs": { "mean": mean_staleness, "max": staleness.iter().max() },
    })
}

fn main() {
    // `cargo test --all-targets` builds benches without --bench: do not run for minutes there.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n = (RATE * seconds()) as usize;
    let records = Arc::new(stream(n));
    let at = |background, max_staleness| Learning {
        background,
        max_staleness,
    };
    let bounded = format!("at the workers' priority, --max-staleness {BOUND}");
    let rows: Vec<(&str, Value)> = [
        ("at the workers' priority", at(false, None)),
        ("in the background", at(true, None)),
        (bounded.as_str(), at(false, Some(BOUND))),
    ]
    .into_iter()
    .map(|(name, learning)| {
        eprintln!("scoring_latency: learning {name} …");
        let seen = run(&records, learning);
        assert_eq!(
            seen.iter().map(|s| s.scored.len()).sum::<usize>(),
            n,
            "every record scored once"
        );
        (name, summary(&seen))
    })
    .collect();
    println!(
        "\nScoring on arrival inside the dataflow, {RATE} records/s for {} s, {WORKERS} workers, d = {D}, m = 100:\n",
        seconds()
    );
    println!(
        "| learning | predictions | updates | records shed | p50 µs | p90 µs | p99 µs | max µs | staleness mean / max (epochs) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, row) in &rows {
        let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
        let latency = ["p50", "p90", "p99", "max"].map(|q| format!("{:.0}", f(&row["latency_us"][q])));
        let staleness = &row["staleness_epochs"];
        println!(
            "| {name} | {} | {} | {} | {} | {:.1} / {} |",
            row["predictions"],
            row["updates"],
            row["shed"],
            latency.join(" | "),
            f(&staleness["mean"]),
            staleness["max"],
        );
    }
    let json = json!({
        "rate_per_s": RATE,
        "seconds": seconds(),
        "workers": WORKERS,
        "features": D,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "foreground": rows[0].1,
        "background": rows[1].1,
        "bounded": { "max_staleness": BOUND, "row": rows[2].1 },
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-scoring-latency.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("\nwrote {}", path.display());
}
