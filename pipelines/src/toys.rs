//! Generated multi-output streams (seed 002's toys and the issue's
//! heterogeneous stream), written as Parquet files in the project's data
//! layout with an `output` column: what the multi-output experiments and the
//! command tests learn from.

use std::f64::consts::PI;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{ArrayRef, Float64Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Seed 002's streaming toy (its Table 1):
/// `4.5 cos(2πx + 1.5π) − 3 sin(4.3πx + 0.3π) + 5 cos(7πx + 2.4π)`.
pub fn seed_toy(x: f64) -> f64 {
    4.5 * (2.0 * PI * x + 1.5 * PI).cos() - 3.0 * (4.3 * PI * x + 0.3 * PI).sin()
        + 5.0 * (7.0 * PI * x + 2.4 * PI).cos()
}

/// The second, smoother latent of the heterogeneous stream: `3 sin(1.5πx)`.
pub fn smooth_latent(x: f64) -> f64 {
    3.0 * (1.5 * PI * x).sin()
}

/// Rows of a one-input multi-output data set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    pub x: Vec<f64>,
    pub y: Vec<f64>,
    pub output: Vec<i64>,
}

/// The heterogeneous stream: `x ~ U(0, 1)`, `u₁` the seed's toy,
/// `u₂` [`smooth_latent`]; 80 % of the rows observe `f₀ = −0.5u₁ + 0.1u₂`
/// with Gaussian noise of sd 0.5, 20 % observe `f₁ = −0.1u₁ + 0.6u₂`
/// through a probit Bernoulli.
pub fn heterogeneous(n: usize, seed: u64) -> Rows {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Rows::default();
    for _ in 0..n {
        let x: f64 = rng.random_range(0.0..1.0);
        let (u1, u2) = (seed_toy(x), smooth_latent(x));
        let noise: f64 = StandardNormal.sample(&mut rng);
        let (y, output) = if rng.random::<f64>() < 0.8 {
            (-0.5 * u1 + 0.1 * u2 + 0.5 * noise, 0)
        } else {
            (f64::from(-0.1 * u1 + 0.6 * u2 + noise > 0.0), 1)
        };
        rows.x.push(x);
        rows.y.push(y);
        rows.output.push(output);
    }
    rows
}

/// Writes `id`, `x0`, `y` and `output` (ids from 0, in row order).
pub fn write(path: &Path, rows: &Rows) -> Result<()> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..rows.x.len() as i64)),
        Arc::new(Float64Array::from(rows.x.clone())),
        Arc::new(Float64Array::from(rows.y.clone())),
        Arc::new(Int64Array::from(rows.output.clone())),
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x0", DataType::Float64, false),
        Field::new("y", DataType::Float64, false),
        Field::new("output", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path)?, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

/// The rows of `rows` whose output is `d`, as output 0 (a single-output
/// learner's view of one channel).
pub fn only_output(rows: &Rows, d: i64) -> Rows {
    let keep: Vec<usize> = (0..rows.x.len()).filter(|&i| rows.output[i] == d).collect();
    Rows {
        x: keep.iter().map(|&i| rows.x[i]).collect(),
        y: keep.iter().map(|&i| rows.y[i]).collect(),
        output: vec![0; keep.len()],
    }
}
