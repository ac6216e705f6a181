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
use dualgp_operators::model::likelihood::{Likelihood, Link};
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

/// Seed 002's second latent of its synchronous two-channel toy (appendix):
/// `4.5 cos(1.5πx + π/2) + 5 sin(3πx + 1.5π) − 5.5 cos(8πx + π/4)`.
pub fn seed_second_latent(x: f64) -> f64 {
    4.5 * (1.5 * PI * x + 0.5 * PI).cos() + 5.0 * (3.0 * PI * x + 1.5 * PI).sin()
        - 5.5 * (8.0 * PI * x + 0.25 * PI).cos()
}

/// Rows of a one-input multi-output data set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    /// Each row's input.
    pub x: Vec<f64>,
    /// Each row's label.
    pub y: Vec<f64>,
    /// The output each row observes.
    pub output: Vec<i64>,
    /// The region of `[0, 1)` each row's x lies in (written as the `task`
    /// column, which eval scores separately); empty: no regions.
    pub task: Vec<i64>,
}

/// `per_region` inputs drawn uniformly in each of `regions` equal parts of
/// `[0, 1)`, region after region, with the region's index: streamed in x
/// order in `regions` batches, each batch is exactly one region.
fn stratified(regions: usize, per_region: usize, rng: &mut ChaCha8Rng) -> Vec<(f64, i64)> {
    let width = 1.0 / regions as f64;
    (0..regions)
        .flat_map(|r| (0..per_region).map(move |_| r))
        .map(|r| (width * (r as f64 + rng.random::<f64>()), r as i64))
        .collect()
}

/// Seed 002's streaming toy (its Table 1): `y = seed_toy(x) + 1.5 ε` on
/// `per_region` inputs in each of `regions` parts of `[0, 1)` (the seed
/// does not give the range).
pub fn streaming_toy(regions: usize, per_region: usize, seed: u64) -> Rows {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Rows::default();
    for (x, region) in stratified(regions, per_region, &mut rng) {
        let noise: f64 = StandardNormal.sample(&mut rng);
        rows.push(x, seed_toy(x) + 1.5 * noise, 0, region);
    }
    rows
}

/// The loadings of seed 002's two-channel toy, `w_q` over the outputs:
/// `w₁ = [−0.5, 0.1]`, `w₂ = [−0.1, 0.6]`, so `f₀ = −0.5u₁ − 0.1u₂` and
/// `f₁ = 0.1u₁ + 0.6u₂`.
pub const TWO_CHANNEL_LOADINGS: [[f64; 2]; 2] = [[-0.5, -0.1], [0.1, 0.6]];

/// Seed 002's synchronous two-channel toy (its Table 5): every input is
/// observed on both outputs, `y_d = f_d(x) + σ_d ε` with `σ = (1, 2)`,
/// `u₁` [`seed_toy`] and `u₂` [`seed_second_latent`].
pub fn two_channels(regions: usize, per_region: usize, seed: u64) -> Rows {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Rows::default();
    for (x, region) in stratified(regions, per_region, &mut rng) {
        let (u1, u2) = (seed_toy(x), seed_second_latent(x));
        for (d, (w, sd)) in TWO_CHANNEL_LOADINGS.iter().zip([1.0, 2.0]).enumerate() {
            let noise: f64 = StandardNormal.sample(&mut rng);
            rows.push(x, w[0] * u1 + w[1] * u2 + sd * noise, d as i64, region);
        }
    }
    rows
}

/// The asynchronous channels of seed 002's Fig. 8: of [`two_channels`]'
/// rows, region `r` keeps only output `r mod 2`'s (the channels take turns).
pub fn alternating_channels(rows: &Rows) -> Rows {
    rows.filter(|i| rows.output[i] == rows.task[i] % 2)
}

impl Rows {
    fn push(&mut self, x: f64, y: f64, output: i64, task: i64) {
        self.x.push(x);
        self.y.push(y);
        self.output.push(output);
        self.task.push(task);
    }

    /// The rows `keep` accepts (by index), in order.
    fn filter(&self, keep: impl Fn(usize) -> bool) -> Rows {
        let rows: Vec<usize> = (0..self.x.len()).filter(|&i| keep(i)).collect();
        let pick = |v: &[i64]| match v.is_empty() {
            true => Vec::new(),
            false => rows.iter().map(|&i| v[i]).collect(),
        };
        Rows {
            x: rows.iter().map(|&i| self.x[i]).collect(),
            y: rows.iter().map(|&i| self.y[i]).collect(),
            output: pick(&self.output),
            task: pick(&self.task),
        }
    }
}

/// The heterogeneous stream's output 0 latent, `f₀ = −0.5u₁ + 0.1u₂`.
pub fn heterogeneous_f0(x: f64) -> f64 {
    -0.5 * seed_toy(x) + 0.1 * smooth_latent(x)
}

/// The heterogeneous stream's output 1 latent, `f₁ = −0.1u₁ + 0.6u₂`.
pub fn heterogeneous_f1(x: f64) -> f64 {
    -0.1 * seed_toy(x) + 0.6 * smooth_latent(x)
}

/// The heterogeneous stream: `x ~ U(0, 1)`, `u₁` the seed's toy,
/// `u₂` [`smooth_latent`]; 80 % of the rows observe [`heterogeneous_f0`]
/// with Gaussian noise of sd 0.5, 20 % observe [`heterogeneous_f1`]
/// through a probit Bernoulli.
pub fn heterogeneous(n: usize, seed: u64) -> Rows {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Rows::default();
    for _ in 0..n {
        let x: f64 = rng.random_range(0.0..1.0);
        let noise: f64 = StandardNormal.sample(&mut rng);
        let (y, output) = if rng.random::<f64>() < 0.8 {
            (heterogeneous_f0(x) + 0.5 * noise, 0)
        } else {
            (f64::from(heterogeneous_f1(x) + noise > 0.0), 1)
        };
        rows.x.push(x);
        rows.y.push(y);
        rows.output.push(output);
    }
    rows
}

/// The test NLPD, over `rows`' output-1 rows, of an oracle that knows
/// output 1's latent exactly: the probit Bernoulli's log predictive at
/// `f₁(x)` with no variance, as eval scores a model. No model of output 1,
/// multi-output or not, does better in expectation: it is the floor under
/// what learning output 0 can gain output 1.
pub fn heterogeneous_oracle_nlpd(rows: &Rows) -> f64 {
    let probit = Likelihood::Bernoulli { link: Link::Probit };
    let scores: Vec<f64> = (0..rows.x.len())
        .filter(|&i| rows.output[i] == 1)
        .map(|i| -probit.log_predictive(&[heterogeneous_f1(rows.x[i])], &[0.0], rows.y[i]))
        .collect();
    scores.iter().sum::<f64>() / scores.len().max(1) as f64
}

/// Writes `id`, `x0`, `y` and `output` (ids from 0, in row order), and
/// `task` when the rows have regions.
pub fn write(path: &Path, rows: &Rows) -> Result<()> {
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..rows.x.len() as i64)),
        Arc::new(Float64Array::from(rows.x.clone())),
        Arc::new(Float64Array::from(rows.y.clone())),
        Arc::new(Int64Array::from(rows.output.clone())),
    ];
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x0", DataType::Float64, false),
        Field::new("y", DataType::Float64, false),
        Field::new("output", DataType::Int64, false),
    ];
    if !rows.task.is_empty() {
        columns.push(Arc::new(Int64Array::from(rows.task.clone())));
        fields.push(Field::new("task", DataType::Int64, false));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path)?, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

/// The rows of `rows` whose output is `d`, as output 0 (a single-output
/// learner's view of one channel).
pub fn only_output(rows: &Rows, d: i64) -> Rows {
    let mut own = rows.filter(|i| rows.output[i] == d);
    own.output.fill(0);
    own
}

/// The rows of `rows` whose output is `d`, keeping their output index (a
/// multi-output model's test set of one output).
pub fn of_output(rows: &Rows, d: i64) -> Rows {
    rows.filter(|i| rows.output[i] == d)
}

/// Mean and population standard deviation of output `d`'s targets: what
/// eval standardises that output's targets with, so what turns a test NLPD
/// on the standardised scale back to the data's (add `ln sd`).
pub fn target_scale(rows: &Rows, d: i64) -> (f64, f64) {
    let y: Vec<f64> = (0..rows.y.len())
        .filter(|&i| rows.output[i] == d)
        .map(|i| rows.y[i])
        .collect();
    let mean = y.iter().sum::<f64>() / y.len().max(1) as f64;
    let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / y.len().max(1) as f64;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_toys_fill_each_region_and_the_channels_take_turns() {
        let toy = streaming_toy(10, 14, 1);
        assert_eq!(toy.x.len(), 140);
        for (i, &x) in toy.x.iter().enumerate() {
            assert_eq!((x * 10.0).floor() as i64, toy.task[i]);
        }
        assert!(toy.task.windows(2).all(|w| w[0] <= w[1]), "region after region");

        let sync = two_channels(5, 4, 2);
        assert_eq!(sync.x.len(), 40);
        // Each input on both outputs, in turn.
        assert!(sync.x.chunks(2).all(|pair| pair[0] == pair[1]));
        assert_eq!(&sync.output[..4], [0, 1, 0, 1]);
        let async_ = alternating_channels(&sync);
        assert_eq!(async_.x.len(), 20);
        assert!((0..20).all(|i| async_.output[i] == async_.task[i] % 2));
        assert_eq!(of_output(&sync, 1).output, vec![1; 20]);
        assert_eq!(only_output(&sync, 1).output, vec![0; 20]);
    }

    /// Far from the noise, the channels' targets are the seed's mixtures.
    #[test]
    fn the_two_channel_toy_mixes_the_seeds_latents_with_its_loadings() {
        let rows = two_channels(5, 2000, 3);
        for d in 0..2 {
            let (w, sd) = (TWO_CHANNEL_LOADINGS[d as usize], [1.0, 2.0][d as usize]);
            let residual: Vec<f64> = (0..rows.x.len())
                .filter(|&i| rows.output[i] == d)
                .map(|i| rows.y[i] - (w[0] * seed_toy(rows.x[i]) + w[1] * seed_second_latent(rows.x[i])))
                .collect();
            let (n, mean) = (
                residual.len() as f64,
                residual.iter().sum::<f64>() / residual.len() as f64,
            );
            let var = residual.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
            assert!(
                mean.abs() < 0.1 && (var.sqrt() - sd).abs() < 0.1 * sd,
                "output {d}: {mean} {var}"
            );
        }
    }

    /// The oracle's NLPD on a large sample is its expectation: the mean over
    /// `x ~ U(0, 1)` of the entropy of `Φ(f₁(x))` (midpoint rule).
    #[test]
    fn the_heterogeneous_oracle_scores_the_entropy_of_output_one() {
        let rows = heterogeneous(200_000, 4);
        let share = rows.output.iter().filter(|&&d| d == 1).count() as f64 / rows.x.len() as f64;
        assert!((share - 0.2).abs() < 0.005, "{share}");
        let probit = Likelihood::Bernoulli { link: Link::Probit };
        let cells = 20_000;
        let entropy = (0..cells)
            .map(|k| {
                let f = heterogeneous_f1((k as f64 + 0.5) / cells as f64);
                let p = probit.log_predictive(&[f], &[0.0], 1.0).exp();
                -(p * p.ln() + (1.0 - p) * (1.0 - p).ln())
            })
            .sum::<f64>()
            / cells as f64;
        let oracle = heterogeneous_oracle_nlpd(&rows);
        // About 40 000 labels: the sample mean's sd is about 0.0025.
        assert!(
            (oracle - entropy).abs() < 0.01,
            "oracle {oracle}, expectation {entropy}"
        );
    }
}
