//! `dualgp inspect CHECKPOINT`: what a saved model holds, for people and as JSON.

use std::fmt;
use std::path::Path;

use anyhow::{Context, Result};
use dualgp_operators::dataflow::{read_checkpoint, Checkpoint, CheckpointStore};
use dualgp_operators::model::{Kernel, StreamingLearner};
use serde::Serialize;

use crate::wording::counted;

/// A checkpoint's model in a few numbers.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    /// The file or directory read.
    pub checkpoint: String,
    /// The checkpoint's format version.
    pub format_version: u32,
    /// The last epoch the model has learned.
    pub epoch: u64,
    /// The kernel's family and parts, in words.
    pub kernel: String,
    /// The likelihood, in words.
    pub likelihood: String,
    /// Kernel and likelihood hyperparameters by name, on their natural scale.
    pub hyperparameters: Vec<(String, f64)>,
    /// Inducing inputs (0 before the first batch).
    pub inducing: usize,
    /// Input dimension, once known.
    pub features: Option<usize>,
    /// Points in the memory.
    pub memory: usize,
    /// Records learned.
    pub records_seen: u64,
    /// Epochs learned.
    pub batches: u64,
    /// Each worker's source position when the checkpoint was taken.
    pub positions: serde_json::Value,
}

/// Reads a checkpoint file, or the newest checkpoint of a directory.
pub fn inspect(path: &Path) -> Result<ModelSummary> {
    let (file, checkpoint): (String, Checkpoint<serde_json::Value>) = if path.is_dir() {
        let store = CheckpointStore::new(path, usize::MAX)?;
        let checkpoint = store
            .latest()?
            .with_context(|| format!("{} holds no checkpoint", path.display()))?;
        (path.display().to_string(), checkpoint)
    } else {
        (path.display().to_string(), read_checkpoint(path)?)
    };
    let learner = &checkpoint.learner;
    let kernel = learner.kernel();
    let hyperparameters = learner.hyperparameters();
    let posterior = learner.posterior();
    Ok(ModelSummary {
        checkpoint: file,
        format_version: checkpoint.version,
        epoch: checkpoint.epoch,
        kernel: describe(kernel),
        likelihood: learner.likelihood.name(),
        hyperparameters,
        inducing: posterior.map_or(0, |p| p.m()),
        features: posterior.map(|p| learner.likelihood.features(p.d())),
        memory: learner.memory.len(),
        records_seen: learner.n_seen,
        batches: learner.batches,
        positions: serde_json::Value::Array(checkpoint.positions),
    })
}

/// `matern52, ARD over 8 inputs`, `se + constant`, …
fn describe(kernel: &Kernel) -> String {
    match kernel {
        Kernel::Stationary(s) => {
            let family = serde_json::to_value(s.family).ok();
            let family = family.as_ref().and_then(|v| v.as_str()).unwrap_or("stationary");
            match s.lengthscales.len() {
                1 => format!("{family}, one lengthscale"),
                d => format!("{family}, ARD over {d} inputs"),
            }
        }
        Kernel::Constant { .. } => "constant".into(),
        Kernel::Linear { .. } => "linear".into(),
        Kernel::Sum(parts) => parts.iter().map(describe).collect::<Vec<_>>().join(" + "),
        Kernel::Product(parts) => parts.iter().map(describe).collect::<Vec<_>>().join(" × "),
        Kernel::Coregional(c) => format!(
            "{} outputs over {} latents: {}",
            c.mixing.ncols(),
            c.latents.len(),
            c.latents.iter().map(describe).collect::<Vec<_>>().join("; ")
        ),
    }
}

impl fmt::Display for ModelSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "checkpoint   {} (format {})", self.checkpoint, self.format_version)?;
        writeln!(f, "epoch        {}", self.epoch)?;
        writeln!(f, "kernel       {}", self.kernel)?;
        writeln!(f, "likelihood   {}", self.likelihood)?;
        let features = self.features.map_or("unknown".into(), |d| d.to_string());
        writeln!(f, "inducing     {} (inputs of dimension {features})", self.inducing)?;
        writeln!(f, "memory       {} points", self.memory)?;
        writeln!(
            f,
            "seen         {} in {}",
            counted(self.records_seen, "record"),
            counted(self.batches, "batch")
        )?;
        writeln!(f, "hyperparameters")?;
        for (name, value) in &self.hyperparameters {
            writeln!(f, "  {name:<28} {value:.6}")?;
        }
        Ok(())
    }
}
