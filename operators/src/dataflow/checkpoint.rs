//! Checkpoints at epoch boundaries: the learner after an epoch's update and
//! the source positions that update reflects, versioned, written atomically
//! (temporary file, fsync, rename) with a CRC-32 of their contents, so that a
//! restarted pipeline resumes after the last epoch it applied; a newest file
//! that does not read back (truncated, corrupted) gives way to the one before.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use timely::dataflow::StreamVec;

use crate::model::{SequentialLearner, StreamingLearner};

/// The checkpoint format this code writes and reads. Version 1 held the
/// posterior's site totals unwhitened; whitening them on load would lose the
/// digits that holding them whitened is for, so it is refused.
pub const CHECKPOINT_VERSION: u32 = 2;

/// The learner after an epoch's update and the source positions that update
/// reflects: what a restarted pipeline resumes from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint<P> {
    /// The format version, [`CHECKPOINT_VERSION`] when written by this code.
    pub version: u32,
    /// The last epoch the learner has applied.
    pub epoch: u64,
    /// The learner after `epoch`'s update.
    pub learner: SequentialLearner,
    /// Each worker's source position after `epoch`, in worker order.
    pub positions: Vec<P>,
}

impl<P> Checkpoint<P> {
    /// The checkpoint of `learner` after `epoch`, with the sources at `positions`, in this code's format.
    pub fn new(epoch: u64, learner: SequentialLearner, positions: Vec<P>) -> Self {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            epoch,
            learner,
            positions,
        }
    }
}

/// Why a checkpoint could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file system refused a read, write or rename.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The file is not JSON of a checkpoint.
    #[error("checkpoint {path} is not a dualgp checkpoint: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Where the JSON did not parse.
        source: serde_json::Error,
    },
    /// The contents do not match the CRC-32 written with them.
    #[error("checkpoint {path} is damaged: its contents do not match their checksum")]
    Checksum {
        /// The file.
        path: PathBuf,
    },
    /// A format version this code does not read.
    #[error(
        "checkpoint {path} has format version {found}; this dualgp reads version {CHECKPOINT_VERSION} only: \
         point it at an empty checkpoint directory to start afresh"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version it states.
        found: u32,
    },
    /// The file reads, but its learner's shapes or values are inconsistent.
    #[error("checkpoint {path} reads, but its model cannot be used: {why}")]
    Unusable {
        /// The file.
        path: PathBuf,
        /// What is inconsistent.
        why: String,
    },
}

/// A directory of checkpoints `checkpoint-EPOCH.json`, the newest `keep` kept.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep: usize,
}

impl CheckpointStore {
    /// A store in `dir` (created if missing) that keeps the newest `keep`
    /// checkpoints (at least one).
    pub fn new(dir: impl Into<PathBuf>, keep: usize) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| io(&dir, source))?;
        Ok(CheckpointStore { dir, keep: keep.max(1) })
    }

    /// The directory the checkpoints are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `checkpoint` so that a crash leaves either the old set or the new one.
    pub fn save<P: Serialize>(&self, checkpoint: &Checkpoint<P>) -> Result<PathBuf, CheckpointError> {
        let path = self.dir.join(format!("checkpoint-{:020}.json", checkpoint.epoch));
        let temp = self
            .dir
            .join(format!(".checkpoint-{:020}.json.partial", checkpoint.epoch));
        let bytes = serde_json::to_vec(checkpoint).map_err(|source| CheckpointError::Format {
            path: path.clone(),
            source,
        })?;
        let bytes = with_checksum(bytes);
        let write = || -> std::io::Result<()> {
            let mut file = fs::File::create(&temp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            fs::rename(&temp, &path)?;
            fs::File::open(&self.dir)?.sync_all()
        };
        if let Err(source) = write() {
            // A full disk keeps the partial write's blocks: give them back.
            let _ = fs::remove_file(&temp);
            return Err(io(&path, source));
        }
        for old in self.epochs()?.into_iter().rev().skip(self.keep) {
            let _ = fs::remove_file(self.path_of(old));
        }
        // Writes of a process killed mid-write (one writer at a time: none is under way).
        for entry in fs::read_dir(&self.dir)
            .map_err(|source| io(&self.dir, source))?
            .flatten()
        {
            let name = entry.file_name();
            if name.to_string_lossy().ends_with(".json.partial") {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(path)
    }

    /// The newest checkpoint that reads back, if any. A newer one that does
    /// not (truncated, damaged, unreadable) is skipped, with a warning (a
    /// `tracing` event) once an older one is found; if none reads back, the
    /// newest one's error. A checkpoint of
    /// another format version is an error, not damage.
    pub fn latest<P: DeserializeOwned>(&self) -> Result<Option<Checkpoint<P>>, CheckpointError> {
        let mut skipped = Vec::new();
        for epoch in self.epochs()?.into_iter().rev() {
            match read_checkpoint(&self.path_of(epoch)) {
                Ok(checkpoint) => {
                    // Said only when an older checkpoint stands in: otherwise the error says it.
                    for e in &skipped {
                        tracing::warn!("{e}; resuming from an older checkpoint");
                    }
                    return Ok(Some(checkpoint));
                }
                Err(e @ CheckpointError::Version { .. }) => return Err(e),
                Err(e) => skipped.push(e),
            }
        }
        skipped.into_iter().next().map_or(Ok(None), Err)
    }

    fn path_of(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("checkpoint-{epoch:020}.json"))
    }

    /// Epochs with a complete checkpoint, oldest first.
    fn epochs(&self) -> Result<Vec<u64>, CheckpointError> {
        let entries = fs::read_dir(&self.dir).map_err(|source| io(&self.dir, source))?;
        let mut epochs: Vec<u64> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|name| name.strip_prefix("checkpoint-")?.strip_suffix(".json")?.parse().ok())
            .collect();
        epochs.sort_unstable();
        Ok(epochs)
    }
}

/// Reads and checks one checkpoint file, its factors rebuilt.
pub fn read_checkpoint<P: DeserializeOwned>(path: &Path) -> Result<Checkpoint<P>, CheckpointError> {
    let bytes = fs::read(path).map_err(|source| io(path, source))?;
    checkpoint_from_bytes(&bytes, path)
}

/// Checks a checkpoint file's `bytes` (read from `path`, which the errors
/// name) as [`read_checkpoint`] does: the reader without the file system,
/// for the fuzz target and the corpus replay test.
pub fn checkpoint_from_bytes<P: DeserializeOwned>(bytes: &[u8], path: &Path) -> Result<Checkpoint<P>, CheckpointError> {
    let path = path.to_path_buf();
    let body = checked_body(bytes).ok_or_else(|| CheckpointError::Checksum { path: path.clone() })?;
    #[derive(Deserialize)]
    struct Header {
        version: u32,
    }
    let format = |source| CheckpointError::Format {
        path: path.clone(),
        source,
    };
    let header: Header = serde_json::from_slice(body).map_err(format)?;
    if header.version != CHECKPOINT_VERSION {
        return Err(CheckpointError::Version {
            path,
            found: header.version,
        });
    }
    let mut checkpoint: Checkpoint<P> = serde_json::from_slice(body).map_err(format)?;
    let unusable = |why: String| CheckpointError::Unusable {
        path: path.clone(),
        why,
    };
    shapes_agree(&checkpoint.learner).map_err(unusable)?;
    checkpoint
        .learner
        .ensure_factors()
        .map_err(|e| unusable(e.to_string()))?;
    Ok(checkpoint)
}

/// Whether the learner's parts fit together: what a checksum cannot vouch
/// for in a file written by other code or edited by hand, and what the next
/// update would otherwise find out by indexing past an end.
fn shapes_agree(learner: &SequentialLearner) -> Result<(), String> {
    learner.config.validate().map_err(|e| e.to_string())?;
    let latent = learner.likelihood.n_latent();
    let Some(post) = learner.posterior() else {
        return match learner.memory.points.is_empty() {
            true => Ok(()),
            false => Err("memory points without a posterior".into()),
        };
    };
    let (m, d) = post.z.shape();
    if m == 0 || d == 0 {
        return Err(format!("{m} inducing inputs of {d} features"));
    }
    post.kernel.validate(d).map_err(|e| e.to_string())?;
    learner.kernel().validate(d).map_err(|e| e.to_string())?;
    if post.whitened.len() != latent {
        return Err(format!(
            "site totals for {} latents, the likelihood has {latent}",
            post.whitened.len()
        ));
    }
    if post
        .whitened
        .iter()
        .any(|s| s.l.len() != m || s.lambda.shape() != (m, m))
    {
        return Err(format!("site totals that are not of the {m} inducing inputs"));
    }
    for p in &learner.memory.points {
        let first = p.first.as_ref().map_or((latent, latent), |f| (f.s1.len(), f.s2.len()));
        if p.x.len() != d
            || p.column.len() != m
            || (p.s1.len(), p.s2.len()) != (latent, latent)
            || first != (latent, latent)
        {
            return Err(format!(
                "memory point {:?} does not fit {m} inducing inputs of {d} features",
                p.id
            ));
        }
    }
    Ok(())
}

/// Starts the last line of a checkpoint file: the CRC-32 of what precedes it.
const CHECKSUM_PREFIX: &str = "crc32 ";

/// A checkpoint's JSON `body` with its checksum line after it, as
/// [`read_checkpoint`] checks it: for files that hold a checkpoint (and
/// perhaps more after it in the same JSON value) written elsewhere.
pub fn with_checksum(mut body: Vec<u8>) -> Vec<u8> {
    let trailer = format!("\n{CHECKSUM_PREFIX}{:08x}\n", crc32fast::hash(&body));
    body.extend_from_slice(trailer.as_bytes());
    body
}

/// The JSON body of a checkpoint file whose checksum line matches it. Files
/// written before checksums (no such line) are taken as they are: JSON
/// refuses their truncations.
fn checked_body(bytes: &[u8]) -> Option<&[u8]> {
    let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let Some(newline) = text.iter().rposition(|&b| b == b'\n') else {
        return Some(bytes);
    };
    let (body, last) = (&text[..newline], &text[newline + 1..]);
    let Some(hex) = last.strip_prefix(CHECKSUM_PREFIX.as_bytes()) else {
        return Some(bytes);
    };
    let stated = std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())?;
    (crc32fast::hash(body) == stated).then_some(body)
}

fn io(path: &Path, source: std::io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Each worker's `(worker, source position)` at an epoch.
pub type Positions<'scope, P> = StreamVec<'scope, u64, (usize, P)>;

/// The epochs whose checkpoint was saved, or why saving failed.
pub type Saved<'scope> = StreamVec<'scope, u64, Result<u64, String>>;

/// Saves checkpoints from a stream of model updates (implemented, with the
/// thread that writes them, in `checkpoint_writer.rs`).
pub trait WriteCheckpoints<'scope> {
    /// Saves a checkpoint for every model update once every worker has
    /// reported its source position for that epoch. An epoch some worker
    /// never reported (its stream closed first) gets none: resuming there
    /// would skip that worker's records. Only worker 0 writes: the other
    /// workers may pass `None` (a process of a cluster without the directory).
    fn write_checkpoints<P: Position>(
        self,
        positions: Positions<'scope, P>,
        store: impl Into<Option<CheckpointStore>>,
    ) -> Saved<'scope>;
}

/// A source position a checkpoint can hold: sent between workers, saved as JSON.
pub trait Position: timely::ExchangeData + Clone + Serialize {}

impl<P: timely::ExchangeData + Clone + Serialize> Position for P {}
