//! A line from the learner's thread straight to the shards' threads, for
//! the questions in the middle of an update when every worker is in this
//! process. Through the dataflow a question is a round: two trips of
//! timely's progress tracking and two operators woken on every worker; on
//! the line it is a channel send and a wake-up each way (a kin40k replay on
//! 2 workers spends 9 % less CPU). The shards answer the same way and the
//! learner merges their answers in worker order as the reducing stage does,
//! so the results are the same, bit for bit.
//!
//! The reducing worker opens a line under an id unique to this process and
//! sends the id with every question; each worker that finds the line here
//! joins it with its shard's thread. Workers in other processes cannot:
//! then the line never has every shard, and every question takes the
//! dataflow. An update's first question takes it anyway (it hands each shard
//! thread the records the update learns), and so does `Finish` (with it the
//! workers take up the new model).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::reduce_stage::{merged_in_worker_order, WorkerAnswer};
use super::shard_thread::ShardJob;
use crate::model::Query;

/// Names a line across the workers: this process's id and a count.
pub(super) type LineId = u64;

/// The shards' threads of one learner, as its workers join.
pub(super) struct Line {
    id: LineId,
    shards: Mutex<Vec<Option<Sender<ShardJob>>>>,
}

/// The lines open in this process, by id.
fn lines() -> &'static Mutex<HashMap<LineId, Weak<Line>>> {
    static LINES: OnceLock<Mutex<HashMap<LineId, Weak<Line>>>> = OnceLock::new();
    LINES.get_or_init(Default::default)
}

impl Line {
    /// A line for `peers` workers, found by its id in this process only.
    pub fn open(peers: usize) -> Arc<Line> {
        static OPENED: AtomicU64 = AtomicU64::new(0);
        let id = (u64::from(std::process::id()) << 32) | OPENED.fetch_add(1, Ordering::Relaxed);
        let line = Arc::new(Line {
            id,
            shards: Mutex::new(vec![None; peers]),
        });
        lines()
            .lock()
            .expect("no panic holds it")
            .insert(id, Arc::downgrade(&line));
        line
    }

    pub fn id(&self) -> LineId {
        self.id
    }

    /// `worker`'s shard thread joins line `id`, if it is open in this process.
    pub fn join(id: LineId, worker: usize, shard: Sender<ShardJob>) {
        let Some(line) = lines()
            .lock()
            .expect("no panic holds it")
            .get(&id)
            .and_then(Weak::upgrade)
        else {
            return;
        };
        let mut shards = line.shards.lock().expect("no panic holds it");
        if let Some(slot) = shards.get_mut(worker) {
            *slot = Some(shard);
        }
    }

    /// Sends every shard `query`; `None` while some worker has not joined
    /// (or is in another process).
    pub fn ask(&self, query: &Query) -> Option<OnLine> {
        let shards: Vec<Sender<ShardJob>> = self
            .shards
            .lock()
            .expect("no panic holds it")
            .iter()
            .cloned()
            .collect::<Option<_>>()?;
        let (reply, replies) = channel();
        for (worker, shard) in shards.iter().enumerate() {
            // A thread that is gone drops the job and its reply: `answer` tells.
            let _ = shard.send(ShardJob {
                records: None,
                query: query.clone(),
                reply: Some((worker, reply.clone())),
            });
        }
        Some(OnLine {
            replies,
            shards: shards.len(),
        })
    }

    /// Whether `query` may take the line once the update's first question
    /// has reached every shard: all but `Finish`, which the workers must see.
    pub fn carries(query: &Query) -> bool {
        !matches!(query, Query::Finish { .. })
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if let Ok(mut lines) = lines().lock() {
            lines.remove(&self.id);
        }
    }
}

/// A question on the line, its answers still to come.
pub(super) struct OnLine {
    replies: Receiver<(usize, WorkerAnswer)>,
    shards: usize,
}

impl OnLine {
    /// The shards' answers, merged in worker order, once all are in.
    pub fn answer(self) -> WorkerAnswer {
        // Every reply's sender is in a job: a shard thread that stops ends the wait.
        let answers: Vec<(usize, WorkerAnswer)> = self.replies.iter().take(self.shards).collect();
        if answers.len() < self.shards {
            return Err("a shard's thread stopped".into());
        }
        merged_in_worker_order(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Answer;

    /// A shard's thread stand-in: answers `Nothing` to every job, or drops
    /// the jobs unanswered as a thread that stopped would.
    fn shard(answers: bool) -> Sender<ShardJob> {
        let (jobs, received) = channel::<ShardJob>();
        std::thread::spawn(move || {
            for job in received {
                if let (true, Some((worker, reply))) = (answers, job.reply) {
                    let _ = reply.send((worker, Ok(Answer::Nothing)));
                }
            }
        });
        jobs
    }

    #[test]
    fn a_line_carries_questions_once_every_worker_has_joined_and_only_in_its_process() {
        let line = Line::open(2);
        assert!(line.ask(&Query::Arrivals).is_none(), "nobody joined");
        Line::join(line.id(), 0, shard(true));
        assert!(line.ask(&Query::Arrivals).is_none(), "worker 1 has not joined");
        // A line not open here (no process has this id), or a worker beyond the peers, changes nothing.
        Line::join(u64::MAX, 1, shard(true));
        Line::join(line.id(), 2, shard(true));
        assert!(line.ask(&Query::Arrivals).is_none());
        Line::join(line.id(), 1, shard(true));
        assert!(matches!(
            line.ask(&Query::Arrivals).unwrap().answer(),
            Ok(Answer::Nothing)
        ));
        let id = line.id();
        drop(line);
        assert!(lines().lock().unwrap().get(&id).is_none(), "closed with its learner");
    }

    #[test]
    fn a_shard_thread_that_stops_fails_the_question_instead_of_hanging_it() {
        let line = Line::open(2);
        Line::join(line.id(), 0, shard(true));
        Line::join(line.id(), 1, shard(false));
        let why = line.ask(&Query::Arrivals).unwrap().answer().unwrap_err();
        assert!(why.contains("stopped"), "{why}");
    }
}
