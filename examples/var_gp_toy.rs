//! The toy of seed 004's Figures 2 and 7: four Gaussian classes on the plane
//! [−3, 3]², 50 points each, learned as two tasks (classes 0/1, then 2/3) by
//! VAR-GP and by the dual method with its memory, each with the command
//! line's defaults for `softmax:4` and `--inducing M`. Draws each class's
//! predictive probability after each task, and prints the accuracy on 200
//! fresh points a class after each task.
//!
//!     cargo run --release --example var_gp_toy -- [--inducing 10] [--seed 0] [--out docs/figures/var-gp]
//!
//! Writes `OUT/{var-gp,dual-memory}.svg`: two rows (after task 0, after task
//! 1), four columns (classes 0–3), probability 0 (dark) to 1 (yellow), the
//! training points of the tasks seen so far marked.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use clap::Parser;
use dualgp::model::{Data, Likelihood, Predictive, StreamingLearner};
use dualgp::pipelines::model_args::{Method, ModelArgs};
use nalgebra::{DMatrix, DVector};
use plotters::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// The classes' means (chosen here; the seed shows its figure, not its data):
/// the second task's classes lie beside the first's, not on them.
const MEANS: [(f64, f64); 4] = [(-1.5, 1.5), (1.5, 1.5), (-1.5, -1.5), (1.5, -1.5)];
const SD: f64 = 0.6;
const CELLS: usize = 36;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10)]
    inducing: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value = "docs/figures/var-gp")]
    out: PathBuf,
}

/// `per_class` points of each class in `classes`.
fn sample(classes: &[usize], per_class: usize, rng: &mut ChaCha8Rng) -> Result<Data> {
    let noise = Normal::new(0.0, SD)?;
    let n = classes.len() * per_class;
    let mut x = DMatrix::zeros(n, 2);
    let mut y = DVector::zeros(n);
    for (k, &c) in classes.iter().enumerate() {
        for i in 0..per_class {
            let r = k * per_class + i;
            x[(r, 0)] = (MEANS[c].0 + noise.sample(rng)).clamp(-3.0, 3.0);
            x[(r, 1)] = (MEANS[c].1 + noise.sample(rng)).clamp(-3.0, 3.0);
            y[r] = c as f64;
        }
    }
    Ok(Data::new(x, y)?)
}

fn grid() -> DMatrix<f64> {
    let at = |i: usize| -3.0 + 6.0 * (i as f64 + 0.5) / CELLS as f64;
    DMatrix::from_fn(
        CELLS * CELLS,
        2,
        |r, j| if j == 0 { at(r / CELLS) } else { at(r % CELLS) },
    )
}

fn probabilities(learner: &dyn StreamingLearner, x: &DMatrix<f64>) -> Result<Vec<Vec<f64>>> {
    learner
        .predict(x)?
        .into_iter()
        .map(|p| match p {
            Predictive::Classes(p) => Ok(p),
            Predictive::Moments { .. } => Err(anyhow!("a softmax predicts classes")),
        })
        .collect()
}

fn accuracy_by_class(learner: &dyn StreamingLearner, test: &Data) -> Result<Vec<f64>> {
    let probs = probabilities(learner, test.x())?;
    let mut hits = [0.0; 4];
    let mut counts = [0.0; 4];
    for (p, &y) in probs.iter().zip(test.y().iter()) {
        let best = (0..4).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap_or(0);
        counts[y as usize] += 1.0;
        hits[y as usize] += f64::from(best as f64 == y);
    }
    Ok(hits.iter().zip(counts).map(|(h, c)| h / c).collect())
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let tasks = [sample(&[0, 1], 50, &mut rng)?, sample(&[2, 3], 50, &mut rng)?];
    let test = sample(&[0, 1, 2, 3], 200, &mut rng)?;
    let model = ModelArgs {
        inducing: Some(args.inducing),
        seed: Some(args.seed),
        ..ModelArgs::default()
    };
    let settings = model.settings()?;
    let likelihood = Likelihood::parse("softmax:4")?;
    let x = grid();
    for method in [Method::VarGp, Method::DualMemory] {
        let mut learner = settings.streaming_learner(method, settings.kernel(2), likelihood.clone(), None, 1)?;
        let mut rows = Vec::new();
        for (t, task) in tasks.iter().enumerate() {
            learner.learn_batch(task)?;
            let accuracy = accuracy_by_class(learner.as_ref(), &test)?;
            let inducing = learner.posterior().map_or(0, |p| p.m());
            println!(
                "{} after task {t}: accuracy by class {:.2} {:.2} {:.2} {:.2}, {inducing} inducing inputs",
                method.name(),
                accuracy[0],
                accuracy[1],
                accuracy[2],
                accuracy[3]
            );
            rows.push(probabilities(learner.as_ref(), &x)?);
        }
        draw(
            &args.out.join(format!("{}.svg", method.name())),
            method.name(),
            &rows,
            &tasks,
        )?;
    }
    Ok(())
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw the plot: {e}")
}

/// Dark violet (0) to yellow (1), as the demo's plots.
fn ramp(t: f64) -> RGBColor {
    let mix = |a: f64, b: f64| (a + (b - a) * t.clamp(0.0, 1.0)).round() as u8;
    RGBColor(mix(68.0, 253.0), mix(1.0, 231.0), mix(84.0, 37.0))
}

fn draw(path: &Path, name: &str, rows: &[Vec<Vec<f64>>], tasks: &[Data]) -> Result<()> {
    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root
        .titled(&format!("{name}: p(class | x) after each task"), ("sans-serif", 20))
        .map_err(plot_error)?;
    let panels = root.split_evenly((rows.len(), 4));
    let w = 6.0 / CELLS as f64;
    for (k, area) in panels.iter().enumerate() {
        let (t, class) = (k / 4, k % 4);
        let mut chart = ChartBuilder::on(area)
            .caption(format!("after task {t}, class {class}"), ("sans-serif", 14))
            .margin(6)
            .x_label_area_size(20)
            .y_label_area_size(24)
            .build_cartesian_2d(-3.0..3.0, -3.0..3.0)
            .map_err(plot_error)?;
        chart.configure_mesh().disable_mesh().draw().map_err(plot_error)?;
        chart
            .draw_series(rows[t].iter().enumerate().map(|(r, p)| {
                let (u, v) = (-3.0 + (r / CELLS) as f64 * w, -3.0 + (r % CELLS) as f64 * w);
                Rectangle::new([(u, v), (u + w, v + w)], ramp(p[class]).filled())
            }))
            .map_err(plot_error)?;
        for task in &tasks[..=t] {
            let points = (0..task.n()).filter(|&i| task.y()[i] as usize == class);
            chart
                .draw_series(points.map(|i| Circle::new((task.x()[(i, 0)], task.x()[(i, 1)]), 2, WHITE.filled())))
                .map_err(plot_error)?;
        }
    }
    root.present().map_err(plot_error)
}
