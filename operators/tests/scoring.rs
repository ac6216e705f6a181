//! When records are scored: prequential scoring waits for every earlier
//! epoch's update; on-arrival scoring answers at once with the newest model
//! the worker holds and says which update that was (`model_epoch`).
//!
//! An epoch held open by a second input stands for an update that has not
//! finished: whatever is scored meanwhile was scored without waiting for it.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use dualgp_operators::dataflow::{GpOptions, LearnGp, ModelUpdate, Prediction, Record, Scoring};
use dualgp_operators::model::{
    Data, Family, Kernel, Likelihood, SequentialConfig, SequentialLearner, StreamingLearner,
};
use nalgebra::DMatrix;
use timely::dataflow::operators::{Concat, Input, Inspect, Probe};
use timely::dataflow::{InputHandleVec, ProbeHandle, StreamVec};

/// Enough steps for everything that can happen without new input to happen.
const STEPS: usize = 200;

fn learner() -> SequentialLearner {
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.7]);
    let config = SequentialConfig {
        inducing: 8,
        m_steps: 2,
        ..SequentialConfig::default()
    };
    SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap()
}

/// A learner whose update of a thousand points is slow: an M-step that never stops early.
fn slow_learner() -> SequentialLearner {
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.7]);
    let config = SequentialConfig {
        inducing: 40,
        m_steps: 200,
        m_tolerance: 0.0,
        ..SequentialConfig::default()
    };
    SequentialLearner::new(kernel, Likelihood::Gaussian { variance: 0.1 }, config).unwrap()
}

/// Scoring as `scoring` says, one input per record.
fn scoring_by(scoring: Scoring) -> GpOptions {
    GpOptions {
        scoring,
        ..GpOptions::new(1)
    }
}

/// Records `ids` on a line, labelled or not.
fn records(ids: std::ops::Range<i64>, labelled: bool) -> Vec<Record> {
    ids.map(|i| {
        let x = i as f64 / 20.0 - 2.0;
        Record::new(i, vec![x], labelled.then(|| x.sin()))
    })
    .collect()
}

#[derive(Default)]
struct Seen {
    predictions: Vec<Prediction>,
    updates: Vec<ModelUpdate>,
}

/// Learns from `records` with `learner`, scoring as `scoring` says; what
/// comes out is kept in `seen` and passes `probe`.
fn learn_and_watch(
    records: StreamVec<'_, u64, Record>,
    learner: SequentialLearner,
    options: GpOptions,
    seen: &Rc<RefCell<Seen>>,
    probe: &ProbeHandle<u64>,
) {
    let gp = records.learn_gp_with(None, learner, options);
    let (s1, s2) = (Rc::clone(seen), Rc::clone(seen));
    gp.predictions
        .inspect(move |p| s1.borrow_mut().predictions.push(p.clone()))
        .probe_with(probe);
    gp.updates
        .inspect(move |u| s2.borrow_mut().updates.push(u.clone()))
        .probe_with(probe);
}

/// Epoch 0 (labelled) stays open on one input while unlabelled records of
/// epoch 1 come on another; then both close, and records of epoch 2 come.
/// Returns what came out while epoch 0 was open, and at the end.
fn run(scoring: Scoring) -> (Vec<Prediction>, Seen) {
    timely::execute_directly(move |worker| {
        let (mut held, mut feed) = (InputHandleVec::new(), InputHandleVec::new());
        let probe = ProbeHandle::new();
        let seen = Rc::new(RefCell::new(Seen::default()));
        worker.dataflow::<u64, _, _>(|scope| {
            let records = scope.input_from(&mut held).concat(scope.input_from(&mut feed));
            learn_and_watch(records, learner(), scoring_by(scoring), &seen, &probe);
        });
        held.send_batch(&mut records(0..60, true));
        feed.advance_to(1);
        feed.send_batch(&mut records(100..110, false));
        for _ in 0..STEPS {
            worker.step();
        }
        assert!(probe.less_equal(&0), "epoch 0 is still open");
        let while_open = seen.borrow().predictions.clone();

        held.advance_to(2);
        feed.advance_to(2);
        while probe.less_than(&2) {
            worker.step();
        }
        feed.send_batch(&mut records(200..210, false));
        drop((held, feed));
        while worker.step() {}
        (while_open, seen.take())
    })
}

#[test]
fn prequential_scoring_waits_for_the_epochs_before() {
    let (while_open, seen) = run(Scoring::Prequential);
    assert!(
        while_open.is_empty(),
        "{} scored before epoch 0 closed",
        while_open.len()
    );
    assert_eq!(seen.predictions.len(), 80);
    let update = &seen.updates[0];
    assert_eq!((seen.updates.len(), update.from_epoch, update.epoch), (1, 0, 0));
    for p in &seen.predictions {
        let expected = if p.epoch == 0 { None } else { Some(0) };
        assert_eq!(p.model_epoch, expected, "record {}", p.id);
    }
}

#[test]
fn on_arrival_scoring_answers_before_earlier_epochs_are_learned() {
    let (while_open, seen) = run(Scoring::OnArrival);
    // Every record that had come in was scored, epoch 1's while epoch 0 was open.
    let mut ids: Vec<i64> = while_open.iter().map(|p| p.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..60).chain(100..110).collect::<Vec<_>>());
    assert!(while_open.iter().all(|p| p.model_epoch.is_none()));

    // Epochs 0 and 1 closed together and were learned in one update (epoch 1
    // had nothing to learn); epoch 2 came after it: scored with that model, and said so.
    let update = &seen.updates[0];
    assert_eq!((seen.updates.len(), update.from_epoch, update.epoch), (1, 0, 1));
    let late: Vec<&Prediction> = seen.predictions.iter().filter(|p| p.epoch == 2).collect();
    assert_eq!(late.len(), 10);
    let x = DMatrix::from_fn(10, 1, |i, _| records(200..210, false)[i].features[0]);
    let expected = update.learner.predict(&x).unwrap();
    for (p, expected) in late.iter().zip(&expected) {
        assert_eq!(p.model_epoch, Some(1));
        assert_eq!(&p.predictive, expected, "record {}", p.id);
    }
    // Nothing was scored twice.
    assert_eq!(seen.predictions.len(), 80);
}

/// Epochs 0–3 (labelled) all come in before the worker first runs: scoring on
/// arrival hands each to the learner as soon as it is complete, so one update
/// learns them together; prequential scoring learns them one by one.
fn learn_four_epochs_at_once(options: GpOptions) -> Seen {
    timely::execute_directly(move |worker| {
        let (mut input, probe) = (InputHandleVec::new(), ProbeHandle::new());
        let seen = Rc::new(RefCell::new(Seen::default()));
        worker.dataflow::<u64, _, _>(|scope| {
            learn_and_watch(scope.input_from(&mut input), learner(), options, &seen, &probe);
        });
        for epoch in 0..4 {
            input.advance_to(epoch);
            input.send_batch(&mut records(epoch as i64 * 25..(epoch as i64 + 1) * 25, true));
        }
        drop(input);
        while worker.step() {}
        seen.take()
    })
}

#[test]
fn on_arrival_learns_the_epochs_that_closed_meanwhile_in_one_update() {
    let together = learn_four_epochs_at_once(scoring_by(Scoring::OnArrival));
    let [update] = &together.updates[..] else {
        panic!("{} updates", together.updates.len())
    };
    assert_eq!((update.from_epoch, update.epoch), (0, 3));
    // The same model as learning the 100 records as one batch.
    let mut oracle = learner();
    let all = records(0..100, true);
    let ids: Vec<i64> = all.iter().map(|r| r.id).collect();
    let x = DMatrix::from_fn(100, 1, |i, _| all[i].features[0]);
    let y = nalgebra::DVector::from_fn(100, |i, _| all[i].label.unwrap());
    oracle.update_with_ids(&ids, &Data::new(x, y).unwrap()).unwrap();
    assert_eq!(update.learner.n_seen, 100);
    let grid = DMatrix::from_fn(30, 1, |i, _| i as f64 / 5.0 - 3.0);
    assert_eq!(update.learner.predict(&grid).unwrap(), oracle.predict(&grid).unwrap());
    assert!(together.predictions.iter().all(|p| p.model_epoch.is_none()));

    let one_by_one = learn_four_epochs_at_once(scoring_by(Scoring::Prequential));
    let epochs: Vec<(u64, u64)> = one_by_one.updates.iter().map(|u| (u.from_epoch, u.epoch)).collect();
    assert_eq!(epochs, [(0, 0), (1, 1), (2, 2), (3, 3)]);
}

/// The model-only learner after `before` learned exactly the records of
/// `epochs` that `update`'s sample kept, which must be the model `update`
/// made; and the records it shed are the others.
fn assert_learned_its_sample(before: &SequentialLearner, update: &ModelUpdate, epochs: &[Vec<Record>]) {
    let span = update.from_epoch as usize..=update.epoch as usize;
    let all: Vec<&Record> = epochs[span].iter().flatten().collect();
    let kept: Vec<&Record> = all.iter().copied().filter(|r| update.sample.keeps(r.id)).collect();
    assert_eq!(
        update.shed,
        (all.len() - kept.len()) as u64,
        "epochs {}..={}",
        update.from_epoch,
        update.epoch
    );
    let mut oracle = before.clone();
    let ids: Vec<i64> = kept.iter().map(|r| r.id).collect();
    let x = DMatrix::from_fn(kept.len(), 1, |i, _| kept[i].features[0]);
    let y = nalgebra::DVector::from_fn(kept.len(), |i, _| kept[i].label.unwrap());
    oracle.update_with_ids(&ids, &Data::new(x, y).unwrap()).unwrap();
    assert_eq!(update.learner.n_seen, oracle.n_seen);
    let grid = DMatrix::from_fn(30, 1, |i, _| i as f64 / 5.0 - 3.0);
    assert_eq!(update.learner.predict(&grid).unwrap(), oracle.predict(&grid).unwrap());
}

/// Four epochs waiting for an update, with scoring models allowed to lag
/// two epochs: the pace aims at one epoch waiting, so that update learns a
/// quarter of the records (those whose ids the sample keeps), the same
/// model as learning exactly those, and says how many it shed.
#[test]
fn a_learner_behind_its_staleness_bound_learns_a_sample_and_counts_the_rest() {
    let bounded = GpOptions {
        max_staleness: Some(2),
        ..scoring_by(Scoring::OnArrival)
    };
    let seen = learn_four_epochs_at_once(bounded);
    let [update] = &seen.updates[..] else {
        panic!("{} updates", seen.updates.len())
    };
    assert_eq!((update.from_epoch, update.epoch, update.sample.share()), (0, 3, 0.25));
    let epochs: Vec<Vec<Record>> = (0..4).map(|e| records(e * 25..(e + 1) * 25, true)).collect();
    assert_learned_its_sample(&learner(), update, &epochs);
    assert!(update.shed > 50, "{} shed", update.shed);
    // Every record was scored, shed or not.
    assert_eq!(seen.predictions.len(), 100);
}

/// On two workers, each holding its own share of the records, a learner
/// that falls behind keeps the same records of each update as the model-only
/// learner would: every update is the model of its sample, and every
/// labelled record is learned or shed once.
#[test]
fn on_two_workers_each_update_learns_the_sample_its_learner_picked() {
    let epochs: Vec<Vec<Record>> = (0..8).map(|e| records(e * 40..(e + 1) * 40, true)).collect();
    let options = GpOptions {
        max_staleness: Some(2),
        ..scoring_by(Scoring::OnArrival)
    };
    let outputs = common::operator::run_operator(
        timely::Config::process(2),
        &epochs,
        learner(),
        options,
        common::operator::Feed::WorkerZero,
    );
    let mut before = learner();
    let mut accounted = 0;
    for update in &outputs.updates {
        assert_learned_its_sample(&before, update, &epochs);
        accounted += update.learner.n_seen - before.n_seen + update.shed;
        before = update.learner.clone();
    }
    assert_eq!(accounted, 320);
    // All eight epochs were in before the workers first ran, so an update
    // learned several together, above the pace's target of one.
    assert!(outputs.updates.iter().any(|u| u.shed > 0));
    assert_eq!(outputs.updates.last().map(|u| u.epoch), Some(7));
    assert_eq!(outputs.predictions.len(), 320);
}

/// Scoring on arrival while an update runs: the learner's work runs on a
/// thread beside the worker's, which goes on reading and scoring. Epoch 0's
/// update is made slow (a thousand points, an M-step that never stops early);
/// records of epoch 1, read meanwhile, are scored before it ends, with the
/// prior, and say so. (It fails only if that update took less time than
/// scoring ten records.)
#[test]
fn on_arrival_records_are_scored_while_an_update_runs() {
    timely::execute_directly(move |worker| {
        let (mut input, probe) = (InputHandleVec::new(), ProbeHandle::new());
        let seen = Rc::new(RefCell::new(Seen::default()));
        worker.dataflow::<u64, _, _>(|scope| {
            learn_and_watch(
                scope.input_from(&mut input),
                slow_learner(),
                scoring_by(Scoring::OnArrival),
                &seen,
                &probe,
            );
        });
        input.send_batch(&mut records(0..1000, true));
        input.advance_to(1);
        // Epoch 0 is scored and goes to the learner, whose thread takes it up.
        for _ in 0..STEPS {
            worker.step();
        }
        assert_eq!(seen.borrow().predictions.len(), 1000);
        assert!(probe.less_equal(&0), "epoch 0's update is under way");
        input.send_batch(&mut records(2000..2010, false));
        let scored_in_epoch_1 = |seen: &Seen| seen.predictions.iter().filter(|p| p.epoch == 1).count();
        // Bounded: the update ends by itself, and then the records are scored anyway.
        while scored_in_epoch_1(&seen.borrow()) < 10 && seen.borrow().updates.is_empty() {
            worker.step();
        }
        let (scored, updates) = (scored_in_epoch_1(&seen.borrow()), seen.borrow().updates.len());
        assert_eq!(
            (scored, updates),
            (10, 0),
            "epoch 1 was scored before epoch 0's update ended"
        );
        drop(input);
        while worker.step() {}
        let seen = seen.take();
        assert_eq!(seen.updates.len(), 1);
        assert!(seen.predictions.iter().all(|p| p.model_epoch.is_none()));
    });
}

/// The scheduling policy in a `/proc/…/stat` line: after "pid (comm) ", the
/// fields from the state on; the policy is the 41st field (5: `SCHED_IDLE`).
#[cfg(target_os = "linux")]
fn policy_in(stat: &str) -> Option<u32> {
    stat.rsplit_once(") ")?.1.split_whitespace().nth(38)?.parse().ok()
}

/// A thread's time slice in ns (`se.slice` in `/proc/…/sched`; kernels
/// before 6.6 have none).
#[cfg(target_os = "linux")]
fn slice_in(sched: &str) -> Option<u64> {
    let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// A thread's name, scheduling policy and time slice.
#[cfg(target_os = "linux")]
#[derive(Debug)]
struct Scheduled {
    name: String,
    policy: u32,
    slice: Option<u64>,
}

#[cfg(target_os = "linux")]
fn scheduled(dir: &std::path::Path) -> Option<Scheduled> {
    Some(Scheduled {
        name: std::fs::read_to_string(dir.join("comm")).ok()?.trim().to_string(),
        policy: policy_in(&std::fs::read_to_string(dir.join("stat")).ok()?)?,
        slice: slice_in(&std::fs::read_to_string(dir.join("sched")).unwrap_or_default()),
    })
}

/// Each of this process's threads whose name starts with `prefix`.
#[cfg(target_os = "linux")]
fn threads_named(prefix: &str) -> Vec<Scheduled> {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc lists this process's threads");
    tasks
        .filter_map(|task| scheduled(&task.ok()?.path()))
        .filter(|t| t.name.starts_with(prefix))
        .collect()
}

#[cfg(target_os = "linux")]
const SCHED_IDLE: u32 = 5;

/// The learning threads while an update runs, learning in the `background`
/// or not, and the worker's own thread.
#[cfg(target_os = "linux")]
fn learning_threads_during_an_update(background: bool) -> (Vec<Scheduled>, Option<Scheduled>) {
    let seen = timely::execute_directly(move |worker| {
        let (mut input, probe) = (InputHandleVec::new(), ProbeHandle::new());
        worker.dataflow::<u64, _, _>(|scope| {
            let options = GpOptions {
                scoring: Scoring::OnArrival,
                learn_in_background: background,
                ..GpOptions::new(1)
            };
            let gp = scope
                .input_from(&mut input)
                .learn_gp_with(None, slow_learner(), options);
            gp.updates.probe_with(&probe);
        });
        input.send_batch(&mut records(0..1000, true));
        input.advance_to(1);
        for _ in 0..STEPS {
            worker.step();
        }
        assert!(probe.less_equal(&0), "epoch 0's update is under way");
        // A new thread carries its creator's name and policy until it first
        // runs, which on a loaded machine can take a while: wait, bounded.
        let settled = |threads: &[Scheduled]| {
            let names: Vec<&str> = threads.iter().map(|t| t.name.as_str()).collect();
            names.contains(&"dualgp-learner")
                && names.iter().any(|n| n.starts_with("dualgp-shard"))
                && (!background || threads.iter().all(|t| t.policy == SCHED_IDLE))
                && (background || threads.iter().all(|t| t.slice != Some(SHORT_SLICE)))
        };
        let mut learning = threads_named("dualgp-");
        for _ in 0..1000 {
            if settled(&learning) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            learning = threads_named("dualgp-");
        }
        let own = scheduled(std::path::Path::new("/proc/thread-self"));
        drop(input);
        // Parked, not spinning: a spinning worker would leave a background learner nothing.
        while worker.step_or_park(None) {}
        (learning, own)
    });
    // The threads end once their operators are gone; wait for it (bounded),
    // so that the next call sees only its own.
    for _ in 0..1000 {
        if threads_named("dualgp-").is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    seen
}

/// Learning in the background, the learner's threads (the reducing worker's
/// and the shard's) run only on cores nothing else wants, and the worker's
/// own thread keeps its policy, so that a woken worker takes a core at once
/// to read and score. Otherwise they all run under the worker's policy.
#[cfg(target_os = "linux")]
#[test]
fn learning_in_the_background_yields_the_cores_to_scoring() {
    let (learning, own) = learning_threads_during_an_update(true);
    let names: Vec<&str> = learning.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"dualgp-learner"), "threads: {names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("dualgp-shard")),
        "threads: {names:?}"
    );
    assert!(learning.iter().all(|t| t.policy == SCHED_IDLE), "{learning:?}");
    let own = own.expect("the worker's thread");
    assert_ne!(own.policy, SCHED_IDLE, "the worker's thread keeps its policy");

    let (learning, own) = learning_threads_during_an_update(false);
    let own = own.expect("the worker's thread");
    assert!(learning.len() >= 2, "{learning:?}");
    assert!(
        learning.iter().all(|t| t.policy == own.policy),
        "{learning:?} against {own:?}"
    );
}

/// The slice the worker's thread asks for when it scores on arrival (0.1 ms).
#[cfg(target_os = "linux")]
const SHORT_SLICE: u64 = 100_000;

/// Scoring on arrival, the worker's thread runs in short time slices, so a
/// woken worker preempts the learner at once (EEVDF, Linux 6.12 on), while
/// the learner's threads, at the same priority, keep the kernel's default
/// slice. A kernel before 6.12 has no custom slices, and the test says so.
#[cfg(target_os = "linux")]
#[test]
fn on_arrival_the_worker_preempts_the_learner_at_the_same_priority() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut version = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|v| v.parse().unwrap_or(0));
    let (major, minor): (u32, u32) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    if (major, minor) < (6, 12) {
        eprintln!("Linux {release} has no custom time slices: nothing to check");
        return;
    }
    let (learning, own) = learning_threads_during_an_update(false);
    let own = own.expect("the worker's thread");
    assert_eq!(own.slice, Some(SHORT_SLICE), "{own:?}");
    assert!(learning.len() >= 2, "{learning:?}");
    for thread in &learning {
        assert_eq!(thread.policy, own.policy, "{thread:?}");
        assert!(thread.slice > Some(SHORT_SLICE), "{thread:?}");
    }
}
