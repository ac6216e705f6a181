//! Learning beside scoring. A worker's timely thread reads, scores and sends
//! on records; the learner's heavy work (a shard's answer, the reducing
//! worker's algebra between questions) runs on a thread of its own, so that
//! records read meanwhile are scored at once instead of after that work.
//! Jobs run one at a time in the order sent, and each result wakes the
//! operator that sent the job: the arithmetic, and so every result, is the
//! same as on the timely thread. In the background the thread runs only on
//! a core nothing else wants, so scoring waits for neither the learner's
//! work nor its turn on a core.

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::thread;

use timely::scheduling::SyncActivator;

/// Makes the calling thread one the kernel runs only when nothing else
/// wants its core (`SCHED_IDLE`): a woken timely thread takes the core at
/// once, where under a normal policy, nice 19 included, it may wait out the
/// learner's time slice. Elsewhere than Linux learning keeps its priority.
fn yield_to_scoring() {
    #[cfg(target_os = "linux")]
    // SAFETY: the parameter outlives the call; 0 names the calling thread, and
    // a refusal leaves its policy as it was.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}

/// Asks the kernel to run the calling thread (a timely worker that scores on
/// arrival) in short time slices, 0.1 ms instead of the default's
/// milliseconds. Under EEVDF (Linux 6.12 on) a woken task with a shorter
/// slice has the earlier deadline and preempts the running one, so a record
/// read while the learner's threads hold every core is scored within a
/// tenth of a millisecond, at the same priority: the learner keeps its
/// share of the cores. Older kernels ignore the slice; elsewhere than Linux
/// nothing changes.
pub(super) fn score_promptly() {
    set_time_slice(100_000);
}

/// The kernel's default time slice for the calling thread: a learning
/// thread started by a worker that scores promptly would inherit its short one.
fn learn_in_default_slices() {
    set_time_slice(0);
}

/// Sets the calling thread's time slice under its normal policy and nice
/// value (`sched_runtime` of sched_setattr(2); 0 for the kernel's default).
fn set_time_slice(nanoseconds: u64) {
    #[cfg(target_os = "linux")]
    {
        /// `struct sched_attr` of sched_setattr(2); libc has the call's number, not the struct.
        #[repr(C)]
        struct SchedAttr {
            size: u32,
            policy: u32,
            flags: u64,
            nice: i32,
            priority: u32,
            runtime: u64,
            deadline: u64,
            period: u64,
        }
        // SAFETY: getpriority reads nothing of ours; the struct outlives the
        // call and its size is given; 0 names the calling thread, and a
        // refusal leaves its scheduling as it was.
        unsafe {
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            let attr = SchedAttr {
                size: std::mem::size_of::<SchedAttr>() as u32,
                policy: libc::SCHED_OTHER as u32,
                flags: 0,
                nice,
                priority: 0,
                runtime: nanoseconds,
                deadline: 0,
                period: 0,
            };
            libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nanoseconds;
}

/// Keeps the calling thread to one of the cores this process may use: the
/// `slot`-th of them, modulo their number. Two shards' threads on a 2-core
/// machine otherwise queued on one core for milliseconds at a time while
/// the other idled (the kernel's balancer does not move a task that has just
/// run); kept apart, a kin40k replay on 2 workers took 0.93× the time.
/// Elsewhere than Linux, or if the kernel refuses, the thread stays free.
fn keep_to_core(slot: usize) {
    #[cfg(target_os = "linux")]
    {
        let cores = allowed_cores();
        if cores.is_empty() {
            return;
        }
        // SAFETY: the set lives on this stack and its size is given; 0 names
        // the calling thread, and a refusal leaves its affinity as it was.
        unsafe {
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cores[slot % cores.len()], &mut one);
            libc::sched_setaffinity(0, std::mem::size_of_val(&one), &one);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = slot;
}

/// The cores the calling thread may run on (none if the kernel will not say).
#[cfg(target_os = "linux")]
fn allowed_cores() -> Vec<usize> {
    // SAFETY: the set lives on this stack and its size is given; 0 names the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Where a learning thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placement {
    /// Only on a core nothing else wants (see [`yield_to_scoring`]).
    pub background: bool,
    /// On one core, the `slot`-th the process may use (see [`keep_to_core`]).
    pub core: Option<usize>,
}

/// The operator's end: jobs out, results back.
pub(super) struct Beside<J, R> {
    jobs: Sender<J>,
    results: Receiver<R>,
}

/// The thread's end for jobs: `None` once the operator is gone.
pub(super) struct Jobs<J>(Receiver<J>);

impl<J> Jobs<J> {
    pub fn next(&self) -> Option<J> {
        self.0.recv().ok()
    }
}

/// The thread's end for results: each one sent wakes the operator.
pub(super) struct Results<R> {
    results: Sender<R>,
    wake: SyncActivator,
}

impl<R> Results<R> {
    /// Hands `result` back; `false` once the operator is gone.
    pub fn send(&self, result: R) -> bool {
        let sent = self.results.send(result).is_ok();
        // The worker may have left the dataflow already: nothing to wake then.
        let _ = self.wake.activate();
        sent
    }
}

/// A result, none yet, or the thread is gone (it stopped without answering).
pub(super) enum Polled<R> {
    Ready(R),
    Pending,
    Gone,
}

impl<J: Send + 'static, R: Send + 'static> Beside<J, R> {
    /// Starts a thread named `name`, placed as asked, that runs `body` until
    /// the operator drops this end; results wake `wake`'s operator.
    pub fn spawn(
        name: String,
        placement: Placement,
        wake: SyncActivator,
        body: impl FnOnce(Jobs<J>, Results<R>) + Send + 'static,
    ) -> Self {
        let (jobs, job_end) = channel();
        let (result_end, results) = channel();
        let results_end = Results {
            results: result_end,
            wake,
        };
        thread::Builder::new()
            .name(name)
            .spawn(move || {
                if placement.background {
                    yield_to_scoring();
                } else {
                    learn_in_default_slices();
                }
                if let Some(slot) = placement.core {
                    keep_to_core(slot);
                }
                body(Jobs(job_end), results_end)
            })
            .expect("the operating system refused a learning thread");
        Beside { jobs, results }
    }

    /// Another end to queue jobs from, on any thread.
    pub fn sender(&self) -> Sender<J> {
        self.jobs.clone()
    }

    /// Queues `job`; `false` if the thread is gone.
    pub fn send(&self, job: J) -> bool {
        self.jobs.send(job).is_ok()
    }

    pub fn poll(&self) -> Polled<R> {
        match self.results.try_recv() {
            Ok(result) => Polled::Ready(result),
            Err(TryRecvError::Empty) => Polled::Pending,
            Err(TryRecvError::Disconnected) => Polled::Gone,
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_kept_to_a_core_runs_on_that_core_alone() {
        let cores = allowed_cores();
        assert!(!cores.is_empty(), "the kernel says which cores this thread may use");
        // Past the last core the slots wrap around.
        for slot in [0, 1, cores.len()] {
            let kept = thread::spawn(move || {
                keep_to_core(slot);
                allowed_cores()
            })
            .join()
            .unwrap();
            assert_eq!(kept, vec![cores[slot % cores.len()]], "slot {slot}");
        }
        assert_eq!(allowed_cores(), cores, "the calling thread keeps its cores");
    }
}
