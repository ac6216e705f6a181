//! A learned model saved with its standardisation, for a warm start:
//! `replay` and `eval` write one (`--save-model FILE`), `serve` and `replay`
//! start from one (`--model PATH`) instead of the prior.
//!
//! The file is a checkpoint (the JSON `dataflow::checkpoint` writes and
//! reads: format version, epoch, learner; no source positions) with the
//! standardisation beside the learner as `scaling`, so `dualgp inspect FILE`
//! reads it as it reads a checkpoint. `--model` also takes what `serve`
//! leaves in its `--checkpoint-dir`: a checkpoint file, or the directory
//! (its newest checkpoint), with `scaling.json` beside.

use std::path::Path;

use anyhow::{bail, Context, Result};
use dualgp_operators::dataflow::{read_checkpoint, with_checksum, Checkpoint, CheckpointStore};
use dualgp_operators::model::{Likelihood, SequentialLearner, StreamingLearner};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::protocol::Standardizer;

/// The first epoch's standardisation, kept beside the checkpoints.
pub(crate) const SCALING_FILE: &str = "scaling.json";

/// A model to start from: the learner on the standardised scale, the
/// standardisation between it and the data, and the last epoch it learned.
#[derive(Debug, Clone)]
pub struct SavedModel {
    /// The learner, on the standardised scale.
    pub learner: SequentialLearner,
    /// Between the data's scale and the learner's.
    pub scaling: Standardizer,
    /// The last epoch (or batch) the learner learned.
    pub epoch: u64,
}

/// The file's contents: a checkpoint's fields and the scaling.
#[derive(Serialize)]
struct ModelFile<'a> {
    #[serde(flatten)]
    checkpoint: &'a Checkpoint<()>,
    scaling: &'a Standardizer,
}

/// The scaling of a model file (its other fields skipped).
#[derive(Deserialize)]
struct ScalingOnly {
    scaling: Option<Standardizer>,
}

impl SavedModel {
    /// The number of input features the model was learned on.
    pub fn features(&self) -> usize {
        self.scaling.x_mean.len()
    }

    /// Writes the model to `path` atomically (a temporary file beside it,
    /// synced, then renamed).
    pub fn save(&self, path: &Path) -> Result<()> {
        let checkpoint = Checkpoint::new(self.epoch, self.learner.clone(), Vec::new());
        // Checked on reading, as a checkpoint is: a damaged file is refused, not half-read.
        let bytes = with_checksum(serde_json::to_vec(&ModelFile {
            checkpoint: &checkpoint,
            scaling: &self.scaling,
        })?);
        let name = path
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
        let temp = path.with_file_name(format!(".{name}.partial"));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&temp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&temp, path)
        };
        write().with_context(|| format!("cannot save the model to {}", path.display()))
    }

    /// Reads a model file, a checkpoint file (with `scaling.json` beside it)
    /// or a checkpoint directory (its newest checkpoint).
    pub fn load(path: &Path) -> Result<SavedModel> {
        let at = || format!("--model {}", path.display());
        let (checkpoint, scaling): (Checkpoint<IgnoredAny>, _) = if path.is_dir() {
            let store = CheckpointStore::new(path, usize::MAX)?;
            let checkpoint = store
                .latest()?
                .with_context(|| format!("{}: the directory holds no checkpoint", at()))?;
            (checkpoint, read_scaling(path)?)
        } else if path.is_file() {
            let checkpoint = read_checkpoint(path).with_context(at)?;
            let scaling = match embedded_scaling(path).with_context(at)? {
                Some(scaling) => Some(scaling),
                None => read_scaling(path.parent().unwrap_or(Path::new(".")))?,
            };
            (checkpoint, scaling)
        } else {
            bail!(
                "{}: no such file or directory; give a file `--save-model` wrote, or a checkpoint",
                at()
            );
        };
        let scaling = scaling.with_context(|| {
            format!(
                "{}: no standardisation in the file and no {SCALING_FILE} beside it, so the model's scale is unknown",
                at()
            )
        })?;
        let model = SavedModel {
            learner: checkpoint.learner,
            scaling,
            epoch: checkpoint.epoch,
        };
        if let Some(posterior) = model.learner.posterior() {
            let inputs = model.learner.likelihood.features(posterior.d());
            if inputs != model.features() {
                bail!(
                    "{}: the model has {inputs} inputs but its standardisation {}",
                    at(),
                    model.features()
                );
            }
        }
        Ok(model)
    }

    /// Refuses a model of another likelihood than `--likelihood` names, or of
    /// another input dimension than the data's (`features`, when known).
    pub fn check_fits(&self, path: &Path, likelihood: &Likelihood, features: Option<usize>) -> Result<()> {
        let (saved, given) = (self.learner.likelihood.name(), likelihood.name());
        if saved != given {
            bail!(
                "--model {} was learned with --likelihood {saved}, not {given}: give the same likelihood",
                path.display()
            );
        }
        match features {
            Some(d) if d != self.features() => bail!(
                "--model {} was learned on {} features, the data has {d}: give data with the model's features",
                path.display(),
                self.features()
            ),
            _ => Ok(()),
        }
    }
}

/// The `scaling` a model file holds; `None` for a checkpoint, which keeps
/// its scaling beside it. Only the first JSON value is read: a checkpoint
/// file's checksum line follows it.
fn embedded_scaling(path: &Path) -> Result<Option<Standardizer>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut json = serde_json::Deserializer::from_slice(&bytes);
    let found = ScalingOnly::deserialize(&mut json).context("not a dualgp model or checkpoint")?;
    Ok(found.scaling)
}

/// The scaling kept beside the checkpoints in `dir`; `None` when there is none yet.
pub(crate) fn read_scaling(dir: &Path) -> Result<Option<Standardizer>> {
    let path = dir.join(SCALING_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                format!("{} is not a dualgp scaling", path.display())
            })?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Written once, atomically, before the first checkpoint.
pub(crate) fn write_scaling(dir: &Path, scaling: &Standardizer) -> Result<()> {
    let (path, temp) = (dir.join(SCALING_FILE), dir.join(format!(".{SCALING_FILE}.partial")));
    std::fs::write(&temp, serde_json::to_vec(scaling)?)
        .and_then(|()| std::fs::rename(&temp, &path))
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualgp_operators::model::{Family, Kernel, SequentialConfig};
    use nalgebra::DVector;

    /// A fresh Gaussian model on `x_mean.len()` inputs, saved at `epoch` with that input mean.
    fn model(x_mean: Vec<f64>, epoch: u64) -> SavedModel {
        let d = x_mean.len();
        let kernel = Kernel::stationary(Family::Matern52, 1.0, (0..d).map(|k| 0.5 + 0.2 * k as f64).collect());
        let likelihood = Likelihood::Gaussian { variance: 0.1 };
        SavedModel {
            learner: SequentialLearner::new(kernel, likelihood, SequentialConfig::default()).unwrap(),
            scaling: Standardizer {
                x_mean: DVector::from_vec(x_mean),
                x_std: DVector::from_fn(d, |k, _| if k == 0 { 1.0 / 7.0 } else { 3.0 }),
                y_mean: 1e-17,
                y_std: 2.5,
                y_by_output: Vec::new(),
            },
            epoch,
        }
    }

    /// A model saved and read back is the same model, bit for bit, with its
    /// scaling; `inspect` reads the file as a checkpoint.
    #[test]
    fn a_saved_model_reads_back_as_it_was_and_as_a_checkpoint() {
        let model = model(vec![0.1, -2.0 / 3.0], 9);
        let scaling = model.scaling.clone();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.json");
        model.save(&path).unwrap();
        let back = SavedModel::load(&path).unwrap();
        assert_eq!((back.epoch, &back.scaling), (9, &scaling));
        assert_eq!(
            serde_json::to_string(&back.learner).unwrap(),
            serde_json::to_string(&model.learner).unwrap()
        );
        assert_eq!(crate::inspect::inspect(&path).unwrap().epoch, 9);
        let gaussian = Likelihood::Gaussian { variance: 1.0 };
        assert!(back.check_fits(&path, &gaussian, Some(2)).is_ok());
        assert!(back.check_fits(&path, &gaussian, Some(3)).is_err());
        assert!(back.check_fits(&path, &Likelihood::Poisson, None).is_err());
        assert!(SavedModel::load(&dir.path().join("none.json")).is_err());
    }

    /// A model file damaged after it was written (one digit changed) is
    /// refused with the reason, not read as a slightly different model.
    #[test]
    fn a_damaged_model_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.json");
        model(vec![0.25], 3).save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("0.25", "0.35", 1)).unwrap();
        let error = format!("{:#}", SavedModel::load(&path).unwrap_err());
        assert!(error.contains("checksum"), "{error}");
    }
}
