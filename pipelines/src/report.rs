//! SVG plots of a replayed stream: the prequential figures and the
//! hyperparameters epoch by epoch, and for two inputs the posterior mean and
//! standard deviation with the inducing inputs and the memory drawn on them.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use dualgp_operators::model::{Predictive, SequentialLearner, StreamingLearner};
use nalgebra::DMatrix;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::protocol::Standardizer;
use crate::replay::ReplayReport;

/// Writes `prequential.svg`, `hyperparameters.svg` and, for 2-D inputs,
/// `posterior.svg` into `dir`; returns their paths.
pub fn write(
    dir: &Path,
    replay: &ReplayReport,
    history: &[(u64, Vec<(String, f64)>)],
    model: &SequentialLearner,
    scaling: &Standardizer,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = vec![dir.join("prequential.svg"), dir.join("hyperparameters.svg")];
    prequential(&written[0], replay)?;
    hyperparameters(&written[1], history)?;
    if scaling.x_mean.len() == 2 {
        written.push(dir.join("posterior.svg"));
        posterior(&written[2], model, scaling)?;
    }
    Ok(written)
}

/// plotters' errors carry the backend's type; the command only needs the text.
fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw the plot: {e}")
}

/// Dark violet (low) to yellow (high).
fn ramp(t: f64) -> RGBColor {
    let mix = |a: f64, b: f64| (a + (b - a) * t.clamp(0.0, 1.0)).round() as u8;
    RGBColor(mix(68.0, 253.0), mix(1.0, 231.0), mix(84.0, 37.0))
}

fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let pad = ((hi - lo) * 0.05).max(1e-9);
    (lo - pad)..(hi + pad)
}

fn prequential(path: &Path, replay: &ReplayReport) -> Result<()> {
    let root = SVGBackend::new(path, (1350, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let areas = root.split_evenly((1, 3));
    let scores = &replay.epoch_scores;
    let epochs = epoch_axis(scores.iter().map(|s| s.epoch));
    // Drift runs from a few standard errors to thousands at a jump: a signed log shows both.
    let signed_log = |z: f64| z.signum() * z.abs().ln_1p() / std::f64::consts::LN_10;
    let series: [(&str, Vec<(i64, f64)>); 3] = [
        (
            "prequential NLPD",
            scores.iter().map(|s| (s.epoch as i64, s.nlpd)).collect(),
        ),
        (
            if scores.iter().any(|s| s.accuracy.is_some()) {
                "prequential accuracy"
            } else {
                "prequential RMSE"
            },
            scores
                .iter()
                .filter_map(|s| s.rmse.or(s.accuracy).map(|v| (s.epoch as i64, v)))
                .collect(),
        ),
        (
            "drift: NLPD against the rows before, ±log10(1 + |z|)",
            scores
                .iter()
                .filter_map(|s| s.drift.map(|z| (s.epoch as i64, signed_log(z))))
                .collect(),
        ),
    ];
    for (area, (name, points)) in areas.iter().zip(series) {
        let mut chart = ChartBuilder::on(area)
            .caption(name, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(epochs.clone(), range(points.iter().map(|p| p.1)))
            .map_err(plot_error)?;
        epoch_mesh(&mut chart)?;
        chart
            .draw_series(LineSeries::new(points.clone(), &BLUE))
            .map_err(plot_error)?;
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
            .map_err(plot_error)?;
    }
    root.present().map_err(plot_error)
}

fn hyperparameters(path: &Path, history: &[(u64, Vec<(String, f64)>)]) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (plot, key) = root.split_horizontally(720);
    let names: Vec<String> = history
        .first()
        .map(|h| h.1.iter().map(|p| p.0.clone()).collect())
        .unwrap_or_default();
    let epochs = epoch_axis(history.iter().map(|h| h.0));
    let logs = range(history.iter().flat_map(|h| h.1.iter().map(|p| p.1.log10())));
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            "hyperparameters after each epoch (log10, on the standardised scale)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(epochs, logs)
        .map_err(plot_error)?;
    epoch_mesh(&mut chart)?;
    let mut entries = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let points: Vec<(i64, f64)> = history.iter().map(|(e, p)| (*e as i64, p[k].1.log10())).collect();
        chart.draw_series(LineSeries::new(points, color)).map_err(plot_error)?;
        entries.push((name.clone(), Mark::Line(color)));
    }
    draw_key(&key, &entries)?;
    root.present().map_err(plot_error)
}

/// Mean and standard deviation of `y` over the inputs' range, on the data's
/// scale, with the inducing inputs and the memory.
fn posterior(path: &Path, model: &SequentialLearner, scaling: &Standardizer) -> Result<()> {
    let memory = model.memory.data(2);
    let marks = MapMarks {
        memory: Some(memory.x()),
        ..MapMarks::default()
    };
    posterior_map(path, model, scaling, &marks)
}

/// What a [`posterior_map`] draws over the model's mean and sd, all on the
/// learner's (standardised) scale.
#[derive(Default)]
pub struct MapMarks<'a> {
    /// A caption above the two panels (e.g. which batch the map is after).
    pub title: Option<String>,
    /// Dual-memory's memory, drawn as white circles.
    pub memory: Option<&'a DMatrix<f64>>,
    /// The inputs just learned (a robot's path), drawn as small grey dots.
    pub learned: Option<&'a DMatrix<f64>>,
    /// Grid cells along each axis (60 when unset); the SVG grows with their square.
    pub cells: Option<usize>,
}

/// Dots drawn of a batch's inputs at most: enough to show its path, few
/// enough to keep the SVG small.
const LEARNED_DOTS: usize = 600;

/// Mean and standard deviation of `y` over the inputs' range (two inputs),
/// on the data's scale, with the inducing inputs and `marks` drawn on them:
/// any streaming learner's map, e.g. after each batch of `eval --maps`.
pub fn posterior_map(
    path: &Path,
    model: &dyn StreamingLearner,
    scaling: &Standardizer,
    marks: &MapMarks<'_>,
) -> Result<()> {
    let cells = marks.cells.unwrap_or(60).max(2);
    let post = model
        .posterior()
        .ok_or_else(|| anyhow!("the model has not learned yet"))?;
    // The inputs' range: three standard deviations around the mean, the scale the model learned on.
    let axis = |j: usize| {
        (
            scaling.x_mean[j] - 3.0 * scaling.x_std[j],
            scaling.x_mean[j] + 3.0 * scaling.x_std[j],
        )
    };
    let (x0, x1) = (axis(0), axis(1));
    let at = |(lo, hi): (f64, f64), i: usize| lo + (hi - lo) * (i as f64 + 0.5) / cells as f64;
    let grid = DMatrix::from_fn(cells * cells, 2, |r, j| {
        let (i, k) = (r / cells, r % cells);
        let v = if j == 0 { at(x0, i) } else { at(x1, k) };
        (v - scaling.x_mean[j]) / scaling.x_std[j]
    });
    let moments: Vec<(f64, f64)> = model
        .predict(&grid)?
        .into_iter()
        .map(|p| match p {
            Predictive::Moments { mean, var } => (mean * scaling.y_std + scaling.y_mean, var.sqrt() * scaling.y_std),
            Predictive::Classes(probs) => (probs.last().copied().unwrap_or(0.0), 0.0),
        })
        .collect();
    let back = |z: &DMatrix<f64>| -> Vec<(f64, f64)> {
        (0..z.nrows())
            .map(|i| {
                let u = z[(i, 0)] * scaling.x_std[0] + scaling.x_mean[0];
                let v = z[(i, 1)] * scaling.x_std[1] + scaling.x_mean[1];
                (u, v)
            })
            .collect()
    };
    let inducing = back(&post.z);
    let remembered = marks.memory.map(back).unwrap_or_default();
    let learned = marks.learned.map(back).unwrap_or_default();
    let every = learned.len().div_ceil(LEARNED_DOTS).max(1);
    let learned: Vec<(f64, f64)> = learned.into_iter().step_by(every).collect();

    // Room below the panels for their colour scales and a key of three rows.
    let root = SVGBackend::new(path, (1000, 580)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = match &marks.title {
        Some(title) => root.titled(title, ("sans-serif", 18)).map_err(plot_error)?,
        None => root,
    };
    let (panels_area, below) = root.split_vertically(root.dim_in_pixel().1 as i32 - 100);
    let (scales, key) = below.split_vertically(40);
    let (left, right) = panels_area.split_horizontally(500);
    let (left_scale, right_scale) = scales.split_horizontally(500);
    let panels = [("posterior mean of y", 0), ("posterior sd of y (with noise)", 1)];
    for ((area, scale), (title, which)) in [(left, left_scale), (right, right_scale)].iter().zip(panels) {
        let values: Vec<f64> = moments.iter().map(|m| if which == 0 { m.0 } else { m.1 }).collect();
        let (lo, hi) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(*v), h.max(*v)));
        draw_scale(scale, lo, hi)?;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(x0.0..x0.1, x1.0..x1.1)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc("x0")
            .y_desc("x1")
            .draw()
            .map_err(plot_error)?;
        let (w0, w1) = ((x0.1 - x0.0) / cells as f64, (x1.1 - x1.0) / cells as f64);
        chart
            .draw_series(values.iter().enumerate().map(|(r, v)| {
                let (i, k) = (r / cells, r % cells);
                let (u, w) = (x0.0 + i as f64 * w0, x1.0 + k as f64 * w1);
                let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
                Rectangle::new([(u, w), (u + w0, w + w1)], ramp(t).filled())
            }))
            .map_err(plot_error)?;
        chart
            .draw_series(
                learned
                    .iter()
                    .map(|&p| Circle::new(p, 1, RGBColor(160, 160, 160).filled())),
            )
            .map_err(plot_error)?;
        chart
            .draw_series(inducing.iter().map(|&p| Cross::new(p, 4, BLACK.stroke_width(2))))
            .map_err(plot_error)?;
        chart
            .draw_series(remembered.iter().map(|&p| Circle::new(p, 3, WHITE.stroke_width(1))))
            .map_err(plot_error)?;
    }
    let mut entries = vec![("inducing inputs".to_string(), Mark::Cross)];
    if marks.memory.is_some() {
        entries.push(("memory (white circles)".to_string(), Mark::Circle));
    }
    if marks.learned.is_some() {
        entries.push(("inputs of the batch just learned (grey dots)".to_string(), Mark::Circle));
    }
    draw_key(&key, &entries)?;
    root.present().map_err(plot_error)
}

/// A panel's colour ramp under it, from its lowest to its highest value:
/// without it the colours say nothing. Spans the panel's plotting area.
fn draw_scale<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, lo: f64, hi: f64) -> Result<()> {
    const LEFT: i32 = 52;
    const STEP: i32 = 4;
    const STEPS: i32 = 109;
    for s in 0..STEPS {
        let x = LEFT + s * STEP;
        let color = ramp(s as f64 / (STEPS - 1) as f64);
        area.draw(&Rectangle::new([(x, 4), (x + STEP, 16)], color.filled()))
            .map_err(plot_error)?;
    }
    let font = ("sans-serif", 13).into_font();
    let right = TextStyle::from(font.clone()).pos(Pos::new(HPos::Right, VPos::Top));
    area.draw(&Text::new(format!("{lo:.2}"), (LEFT, 20), font))
        .map_err(plot_error)?;
    area.draw(&Text::new(format!("{hi:.2}"), (LEFT + STEPS * STEP, 20), right))
        .map_err(plot_error)
}

/// The epochs as an integer axis: counts get integer ticks.
fn epoch_axis(epochs: impl Iterator<Item = u64>) -> std::ops::Range<i64> {
    let (lo, hi) = epochs.fold((u64::MAX, 0), |(lo, hi), e| (lo.min(e), hi.max(e)));
    (lo.min(hi) as i64)..(hi as i64 + 1)
}

fn epoch_mesh<DB: DrawingBackend>(
    chart: &mut ChartContext<
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordi64, plotters::coord::types::RangedCoordf64>,
    >,
) -> Result<()> {
    let span = chart.x_range().end - chart.x_range().start;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .x_labels(span.clamp(2, 12) as usize)
        .draw()
        .map_err(plot_error)
}

/// How a key entry is drawn.
enum Mark {
    Line(RGBAColor),
    Cross,
    Circle,
}

/// A key beside the data, not over it: one entry a row, top-down in `area`.
fn draw_key<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(String, Mark)],
) -> Result<()> {
    let font = ("sans-serif", 14).into_font();
    for (row, (name, mark)) in entries.iter().enumerate() {
        let y = 12 + 18 * row as i32;
        match mark {
            Mark::Line(color) => area.draw(&PathElement::new(vec![(10, y), (30, y)], color.stroke_width(2))),
            Mark::Cross => area.draw(&Cross::new((20, y), 4, BLACK.stroke_width(2))),
            Mark::Circle => area.draw(&Circle::new((20, y), 3, BLACK.stroke_width(1))),
        }
        .map_err(plot_error)?;
        area.draw(&Text::new(name.as_str(), (38, y - 7), font.clone()))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// One line of [`quartile_curves`]: a median and its quartiles at each `x`.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// The legend's label.
    pub name: String,
    /// Where the line is drawn.
    pub x: Vec<f64>,
    /// The median at each `x`.
    pub median: Vec<f64>,
    /// The lower quartile at each `x`.
    pub lower: Vec<f64>,
    /// The upper quartile at each `x`.
    pub upper: Vec<f64>,
}

/// `v` to its first significant digit (`0.03`, `3`, `300`): a log axis's tick.
fn one_significant(v: f64) -> String {
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// Which axes of [`quartile_curves`] are on a log scale.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogAxes {
    /// `x` (its ticks still say the values, not their logarithms).
    pub x: bool,
    /// `y` (its label says `log10`).
    pub y: bool,
}

/// `v`, or its log10 (of at least 1e-12) on a log axis.
fn log10_if(log: bool, v: f64) -> f64 {
    if log {
        v.max(1e-12).log10()
    } else {
        v
    }
}

/// A curve's `(x, value)` points on the axes' scales.
fn on_scales<'a>(x: &'a [f64], values: &'a [f64], log: LogAxes) -> impl DoubleEndedIterator<Item = (f64, f64)> + 'a {
    (x.iter().zip(values)).map(move |(&x, &v)| (log10_if(log.x, x), log10_if(log.y, v)))
}

/// Medians as lines over their interquartile bands (experiments over seeds),
/// on log scales where `log` says, the key beside the plot.
pub fn quartile_curves(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    log: LogAxes,
    curves: &[Curve],
) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (plot, key) = root.split_horizontally(720);
    let xs = range(curves.iter().flat_map(|c| c.x.iter().map(|&x| log10_if(log.x, x))));
    let ys = range(
        curves
            .iter()
            .flat_map(|c| c.lower.iter().chain(&c.upper).map(|&v| log10_if(log.y, v))),
    );
    let y_label = if log.y {
        format!("{y_label} (log10)")
    } else {
        y_label.to_string()
    };
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(xs, ys)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|&v| match log.x {
            true => one_significant(10f64.powf(v)),
            false => format!("{v:.0}"),
        })
        .draw()
        .map_err(plot_error)?;
    let mut entries = Vec::new();
    for (k, curve) in curves.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let points = |values| on_scales(&curve.x, values, log);
        let band: Vec<(f64, f64)> = points(&curve.upper).chain(points(&curve.lower).rev()).collect();
        chart
            .draw_series(std::iter::once(Polygon::new(band, color.mix(0.15).filled())))
            .map_err(plot_error)?;
        let line = points(&curve.median);
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(plot_error)?;
        entries.push((curve.name.clone(), Mark::Line(color)));
    }
    draw_key(&key, &entries)?;
    root.present().map_err(plot_error)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_log_axis_tick_says_its_value_to_one_significant_digit() {
        let ticks: Vec<String> = [0.0316, 0.1, 3.16, 316.0]
            .into_iter()
            .map(super::one_significant)
            .collect();
        assert_eq!(ticks, ["0.03", "0.1", "3", "316"]);
    }
}
