//! Stopping a serving cluster together. Each worker decides for itself when
//! to stop reading (a signal to its process, an error, its input idle for
//! `--idle-exit`) and tells every worker of every process through a
//! broadcast stream: a halt stops every worker, and the cluster goes idle
//! once every worker has said it is. The stream stays at time 0 and feeds no
//! probe, so it never holds an epoch back.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::{Input, Inspect};
use timely::dataflow::{InputHandleVec, Scope};

/// What a worker tells every other.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum Signal {
    /// Stop reading: a signal came, or a worker failed.
    Halt,
    /// Worker `w` has had no input for `--idle-exit`.
    Idle(usize),
    /// Worker `w` has input again.
    Busy(usize),
}

/// What this worker has heard from all of them.
#[derive(Debug, Default)]
struct Heard {
    halted: bool,
    idle: BTreeSet<usize>,
}

impl Heard {
    fn take(&mut self, signal: Signal) {
        match signal {
            Signal::Halt => self.halted = true,
            Signal::Idle(worker) => drop(self.idle.insert(worker)),
            Signal::Busy(worker) => drop(self.idle.remove(&worker)),
        }
    }
}

/// One worker's end of the signals.
pub(crate) struct Signals {
    input: Option<InputHandleVec<u64, Signal>>,
    heard: Rc<RefCell<Heard>>,
    index: usize,
    peers: usize,
    said_idle: bool,
    said_halt: bool,
}

impl Signals {
    pub fn new(index: usize, peers: usize) -> Self {
        Signals {
            input: Some(InputHandleVec::new()),
            heard: Rc::default(),
            index,
            peers,
            said_idle: false,
            said_halt: false,
        }
    }

    /// Part of the serving dataflow, on every worker.
    pub fn wire(&mut self, scope: Scope<'_, u64>) {
        let Some(input) = self.input.as_mut() else { return };
        let heard = Rc::clone(&self.heard);
        scope
            .input_from(input)
            .broadcast()
            .inspect(move |signal| heard.borrow_mut().take(*signal));
    }

    /// Tells every worker to stop reading (once).
    pub fn halt(&mut self) {
        if !self.said_halt {
            self.said_halt = true;
            self.say(Signal::Halt);
        }
    }

    /// Says whether this worker's input is idle, when that changes.
    pub fn idle(&mut self, idle: bool) {
        if idle != self.said_idle {
            self.said_idle = idle;
            self.say(if idle {
                Signal::Idle(self.index)
            } else {
                Signal::Busy(self.index)
            });
        }
    }

    /// Whether to stop reading: some worker halted, or every worker is idle.
    pub fn stop_reading(&self) -> bool {
        let heard = self.heard.borrow();
        heard.halted || heard.idle.len() == self.peers
    }

    /// Ends this worker's signals (the dataflow cannot finish before).
    pub fn close(&mut self) {
        self.input = None;
    }

    fn say(&mut self, signal: Signal) {
        if let Some(input) = self.input.as_mut() {
            input.send(signal);
            input.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_is_idle_only_while_every_worker_is() {
        let mut heard = Heard::default();
        heard.take(Signal::Idle(0));
        heard.take(Signal::Idle(1));
        heard.take(Signal::Busy(0));
        assert_eq!(heard.idle, BTreeSet::from([1]));
        assert!(!heard.halted);
        heard.take(Signal::Halt);
        assert!(heard.halted);
    }
}
