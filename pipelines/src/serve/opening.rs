//! How a serving cluster starts: process 0 alone reads the checkpoint
//! directory (and, on a first start, the records the standardisation is
//! fitted on) and hands what it found to every worker of every process
//! through a small dataflow of its own, run before the serving one. So a
//! restart of any process resumes the whole cluster from the one checkpoint
//! process 0 chose, and the other processes need no access to its disk.

use std::cell::RefCell;
use std::rc::Rc;

use dualgp_connectors::KafkaPosition;
use dualgp_operators::model::{SequentialLearner, StreamingLearner};
use serde::{Deserialize, Serialize};
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::{Input, Inspect};
use timely::dataflow::InputHandleVec;
use timely::worker::Worker;

use crate::protocol::Standardizer;

/// What every worker serves from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Opening {
    /// The model to start from: a checkpoint's, or a fresh one.
    pub learner: SequentialLearner,
    /// The epoch of the checkpoint the learner comes from.
    pub learned_through: Option<u64>,
    /// Every worker's source position in that checkpoint, merged: each
    /// worker takes its partitions' offsets from it.
    pub resume: Option<KafkaPosition>,
    pub scaling: Standardizer,
    /// Whether worker 0 writes checkpoints: every worker wires the same dataflow.
    pub checkpointing: bool,
}

/// Process 0's word to the cluster: an opening, or nothing to serve (told to
/// stop, or idle too long, before the first record came).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Word(pub Option<Opening>);

/// Sends worker 0's `word` to every worker of the cluster and returns it
/// there. Worker 0 passes `Some`, every other worker `None`. The word goes as
/// JSON: the learner's tagged enums do not pass through timely's bincode, and
/// JSON reads floats back bit for bit (serde_json's `float_roundtrip`).
pub(crate) fn share_opening(worker: &mut Worker, word: Option<&Word>) -> Result<Word, String> {
    let mut input = InputHandleVec::<u64, String>::new();
    let heard: Rc<RefCell<Option<String>>> = Rc::default();
    let keep = Rc::clone(&heard);
    worker.dataflow::<u64, _, _>(|scope| {
        scope
            .input_from(&mut input)
            .broadcast()
            .inspect(move |json| drop(keep.borrow_mut().replace(json.clone())));
    });
    // On failure worker 0 still takes part, so that the others hear nothing and stop too.
    let sent = word.map(serde_json::to_string).transpose();
    if let Ok(Some(json)) = &sent {
        input.send(json.clone());
    }
    drop(input);
    // Only this dataflow exists yet: it is done once every worker has closed its input.
    while worker.step_or_park(None) {}
    sent.map_err(|e| format!("cannot pass on the opening: {e}"))?;
    let json = heard
        .take()
        .ok_or_else(|| "process 0 sent no opening: it could not open the stream (its log says why), or the cluster's processes disagree".to_string())?;
    let mut word: Word = serde_json::from_str(&json).map_err(|e| format!("the opening did not read back: {e}"))?;
    // The learner's factors are not serialised: rebuilt as from a checkpoint.
    if let Some(opening) = word.0.as_mut() {
        opening
            .learner
            .ensure_factors()
            .map_err(|e| format!("the opening's model cannot be used: {e}"))?;
    }
    Ok(word)
}
