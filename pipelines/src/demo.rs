//! `dualgp demo`: the main job on an embedded default, with no files or
//! services. A generated two-input regression stream is written to a
//! temporary Parquet file and replayed through the timely operator exactly as
//! `dualgp replay` does (score each epoch, then learn from it); the final
//! model is then scored on held-out points.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, Float64Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use dualgp_operators::model::{Data, SequentialLearner, StreamingLearner};
use nalgebra::{DMatrix, DVector};
use parquet::arrow::ArrowWriter;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::likelihood_args::LikelihoodArgs;
use crate::model_args::ModelArgs;
use crate::replay::{self, ReplayArgs, ReplayReport};
use crate::report;

/// The latent field of the generated data: smooth bumps on the unit square.
fn field(x0: f64, x1: f64) -> f64 {
    (3.0 * x0).sin() * (2.0 * x1).cos() + 0.5 * (-((x0 - 0.5).powi(2) + (x1 + 0.5).powi(2)) * 4.0).exp()
}

/// `n` points uniform on [−1.5, 1.5]², targets `field + N(0, noise²)`.
pub fn generate(n: usize, noise: f64, rng: &mut ChaCha8Rng) -> Data {
    let x = DMatrix::from_fn(n, 2, |_, _| rng.random_range(-1.5..1.5));
    let y = DVector::from_fn(n, |i, _| {
        let eps: f64 = rand_distr::Distribution::sample(&rand_distr::StandardNormal, rng);
        field(x[(i, 0)], x[(i, 1)]) + noise * eps
    });
    Data::new(x, y).expect("generated data are finite")
}

/// What the demo did: the replay's figures, the plots, and the model's held-out scores.
pub struct DemoReport {
    /// The stream as `replay` saw it: prequential figures per epoch.
    pub replay: ReplayReport,
    /// The plots written.
    pub plots: Vec<PathBuf>,
    /// The model after the last epoch.
    pub model: SequentialLearner,
    /// Its NLPD on held-out points of the field.
    pub test_nlpd: f64,
    /// Its RMSE there.
    pub test_rmse: f64,
}

/// Streams `n` generated points in 10 epochs through the operator on
/// `workers` threads with `m` inducing inputs, then scores 1000 more.
/// Plots go to `plots` (a directory).
pub fn run(n: usize, m: usize, workers: usize, seed: u64, plots: &Path) -> Result<DemoReport> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let train = generate(n, 0.1, &mut rng);
    let test = generate(1000, 0.1, &mut rng);
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let data = dir.path().join("stream.parquet");
    write_stream(&data, &train)?;
    let predictions = dir.path().join("predictions.parquet");
    let args = ReplayArgs {
        batch_size: n.div_ceil(10).max(1) as u64,
        workers,
        model: ModelArgs {
            inducing: Some(m),
            seed: Some(seed),
            ..ModelArgs::default()
        },
        ..ReplayArgs::new(data, predictions, LikelihoodArgs::new("gaussian"))
    };
    let outcome = replay::run(&args, |_, _| {})?.context("one process writes its own outcome")?;
    let model = outcome.learner.context("the stream taught the model nothing")?;
    // The model learned on the first epoch's scale: score the test set there, report on the data's.
    let s = &outcome.scaling;
    let scaled = Data::new(s.transform_x(test.x()), s.transform_y(test.y().as_slice()))?;
    let metrics = model.evaluate(&scaled)?;
    let plots = report::write(plots, &outcome.report, &outcome.hyperparameters, &model, s)?;
    Ok(DemoReport {
        plots,
        replay: outcome.report,
        model,
        test_nlpd: metrics.nlpd + s.y_std.ln(),
        test_rmse: metrics.rmse.unwrap_or(f64::NAN) * s.y_std,
    })
}

/// `id`, `x0`, `x1`, `y` in one row group.
fn write_stream(path: &Path, data: &Data) -> Result<()> {
    let column =
        |j: usize| -> ArrayRef { Arc::new(Float64Array::from_iter_values(data.x().column(j).iter().copied())) };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..data.n() as i64)),
        column(0),
        column(1),
        Arc::new(Float64Array::from_iter_values(data.y().iter().copied())),
    ];
    let fields = ["id", "x0", "x1", "y"].map(|name| {
        let kind = if name == "id" {
            DataType::Int64
        } else {
            DataType::Float64
        };
        Field::new(name, kind, false)
    });
    let schema = Arc::new(Schema::new(fields.to_vec()));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path)?, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}
