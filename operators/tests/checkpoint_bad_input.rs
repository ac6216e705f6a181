//! The checkpoint reader given random, truncated, bit-flipped or reshaped
//! files (property tests): an error that names the file, never a panic. A
//! reshaped file carries a valid checksum, so that what is behind it (the
//! JSON, the learner's dimensions, its factorisation) is tried too.

mod common;

use std::sync::OnceLock;

use common::{kernel, regression_data, small_config};
use dualgp_operators::dataflow::{read_checkpoint, Checkpoint, CheckpointStore};
use dualgp_operators::model::{Likelihood, MemoryPolicy, SequentialConfig, SequentialLearner, StreamingLearner};
use proptest::prelude::*;
use proptest::sample::Index;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

/// Positions as `serve` keeps them: one per worker.
type Positions = Vec<u64>;

/// A real checkpoint file's bytes: a learner after two batches, with a memory.
fn valid() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let config = SequentialConfig {
            inducing: 6,
            memory: MemoryPolicy::PerBatch { k: 3, capacity: None },
            ..small_config()
        };
        let mut learner = SequentialLearner::new(kernel(), Likelihood::Gaussian { variance: 0.1 }, config).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..2 {
            learner.learn_batch(&regression_data(&mut rng, 20)).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path(), 1).unwrap();
        let checkpoint = Checkpoint::new(1, learner, vec![vec![3u64, 4]]);
        std::fs::read(store.save(&checkpoint).unwrap()).unwrap()
    })
}

/// The JSON body of the valid file, without its checksum line.
fn valid_body() -> Value {
    let text = std::str::from_utf8(valid()).unwrap();
    let (body, _) = text.trim_end().rsplit_once('\n').unwrap();
    serde_json::from_str(body).unwrap()
}

/// `body` as a checkpoint file with a matching checksum line.
fn sealed(body: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(body).unwrap();
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(format!("\ncrc32 {crc:08x}\n").as_bytes());
    bytes
}

/// Reads `bytes` as a checkpoint file: the outcome, with any error on one line naming the file.
fn read(bytes: &[u8]) -> Result<Option<Checkpoint<Positions>>, TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint-00000000000000000001.json");
    std::fs::write(&path, bytes).unwrap();
    match read_checkpoint::<Positions>(&path) {
        Ok(c) => Ok(Some(c)),
        Err(e) => {
            let said = e.to_string();
            prop_assert!(!said.contains('\n'), "{said}");
            prop_assert!(said.contains(&path.display().to_string()), "{said}");
            Ok(None)
        }
    }
}

fn same_as_valid(checkpoint: &Checkpoint<Positions>) -> bool {
    serde_json::to_value(checkpoint).unwrap() == valid_body()
}

/// Every place in `value` an edit can go: JSON pointers to its arrays, objects and numbers.
fn places(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Array(items) => {
            out.push(at.clone());
            for (i, v) in items.iter().enumerate() {
                places(v, format!("{at}/{i}"), out);
            }
        }
        Value::Object(map) => {
            out.push(at.clone());
            for (k, v) in map {
                places(v, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        Value::Number(_) => out.push(at),
        _ => {}
    }
}

/// Changes what is at `at`: a number to another, an array one longer or
/// shorter or empty, an object without one of its keys.
fn reshape(body: &mut Value, at: &str, how: u8) {
    const NUMBERS: [f64; 8] = [0.0, -1.0, 1e308, -1e308, 5e-324, 9007199254740993.0, 1e19, 0.5];
    let Some(target) = body.pointer_mut(at) else { return };
    match target {
        Value::Number(_) => *target = serde_json::json!(NUMBERS[how as usize % NUMBERS.len()]),
        Value::Array(items) => match how % 3 {
            0 => {
                items.pop();
            }
            1 => {
                if let Some(last) = items.last().cloned() {
                    items.push(last);
                }
            }
            _ => items.clear(),
        },
        Value::Object(map) => {
            if let Some(key) = map.keys().nth(how as usize % map.len().max(1)).cloned() {
                map.remove(&key);
            }
        }
        _ => {}
    }
}

#[test]
fn the_valid_file_reads_back() {
    let checkpoint = read(valid()).unwrap().expect("a whole checkpoint reads");
    assert!(same_as_valid(&checkpoint));
    assert_eq!(checkpoint.positions, vec![vec![3, 4]]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_bytes_are_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        prop_assert!(read(&bytes)?.is_none());
    }

    /// A cut file reads only if the cut left the JSON whole (the checksum line gone).
    #[test]
    fn a_truncated_file_is_an_error_or_the_whole_checkpoint(cut in any::<Index>()) {
        let bytes = valid();
        if let Some(checkpoint) = read(&bytes[..cut.index(bytes.len())])? {
            prop_assert!(same_as_valid(&checkpoint));
        }
    }

    #[test]
    fn flipped_bits_are_an_error(flips in proptest::collection::vec((any::<Index>(), 0u8..8), 1..4)) {
        let mut bytes = valid().to_vec();
        for (at, bit) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        if bytes != valid() {
            prop_assert!(read(&bytes)?.is_none());
        }
    }

    /// Reshaped contents under a valid checksum: a checkpoint that reads is
    /// one whose learner can be used.
    #[test]
    fn reshaped_contents_are_an_error_or_a_usable_learner(
        edits in proptest::collection::vec((any::<Index>(), any::<u8>()), 1..3),
    ) {
        let mut body = valid_body();
        for (at, how) in &edits {
            let mut all = Vec::new();
            places(&body, String::new(), &mut all);
            let at = all[at.index(all.len())].clone();
            reshape(&mut body, &at, *how);
        }
        if let Some(checkpoint) = read(&sealed(&body))? {
            let mut learner = checkpoint.learner;
            let mut rng = ChaCha8Rng::seed_from_u64(6);
            let batch = regression_data(&mut rng, 5);
            // Learning on may fail (with an error), never panic.
            let _ = learner.learn_batch(&batch);
        }
    }
}
