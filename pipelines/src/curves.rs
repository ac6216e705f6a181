//! `dualgp curves`: one figure of a test figure after every batch from
//! several `eval` reports (the learners of one experiment side by side), so
//! a run's curves need no plotting outside the binary.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::Value;

use crate::report::{quartile_curves, Curve};

/// `dualgp curves`'s flags.
#[derive(Debug, Clone, Args)]
pub struct CurvesArgs {
    /// An eval report and its label in the key, as LABEL=REPORT.json; once
    /// per line. A report of one batch (`--method offline`) is drawn as a
    /// level line across the others' batches
    #[arg(long = "report", value_name = "LABEL=FILE", required = true)]
    pub reports: Vec<String>,
    /// The batch entries' field to draw: test_rmse, test_nlpd, test_accuracy or seconds
    #[arg(long, default_value = "test_rmse")]
    pub metric: String,
    /// The figure's title
    #[arg(long, default_value = "")]
    pub title: String,
    /// Where the SVG goes
    #[arg(long, value_name = "FIG.svg")]
    pub output: PathBuf,
}

/// Draws the figure; returns how many curves it holds.
pub fn run(args: &CurvesArgs) -> Result<usize> {
    let series = args
        .reports
        .iter()
        .map(|given| read_series(given, &args.metric))
        .collect::<Result<Vec<_>>>()?;
    let last_batch = series
        .iter()
        .filter_map(|(_, points)| points.last())
        .map(|p| p.0)
        .fold(1.0, f64::max);
    let curves: Vec<Curve> = series
        .into_iter()
        .map(|(name, points)| line(name, points, last_batch))
        .collect();
    let title = match args.title.as_str() {
        "" => format!("{} after each batch", args.metric),
        given => given.to_owned(),
    };
    quartile_curves(&args.output, &title, "batches learned", &args.metric, false, &curves)?;
    Ok(curves.len())
}

/// `LABEL=FILE`'s label and its `(batch, metric)` points.
fn read_series(given: &str, metric: &str) -> Result<(String, Vec<(f64, f64)>)> {
    let (label, file) = given
        .split_once('=')
        .ok_or_else(|| anyhow!("--report {given}: write LABEL=REPORT.json"))?;
    let text = std::fs::read_to_string(file).with_context(|| format!("--report {given}: cannot read {file}"))?;
    let report: Value = serde_json::from_str(&text).with_context(|| format!("--report {given}: not JSON"))?;
    let batches = report["batches"]
        .as_array()
        .ok_or_else(|| anyhow!("--report {given}: no `batches`; is it an eval report?"))?;
    let points = batches
        .iter()
        .map(|b| match (b["batch"].as_f64(), b[metric].as_f64()) {
            (Some(batch), Some(value)) => Ok((batch, value)),
            _ => bail!("--report {given}: a batch entry has no `{metric}`; choose another --metric"),
        })
        .collect::<Result<Vec<_>>>()?;
    if points.is_empty() {
        bail!("--report {given}: no batches");
    }
    Ok((label.to_owned(), points))
}

/// A curve without a band; one point becomes a level line to `last_batch`.
fn line(name: String, points: Vec<(f64, f64)>, last_batch: f64) -> Curve {
    let points = match points[..] {
        [(_, level)] => vec![(1.0, level), (last_batch, level)],
        _ => points,
    };
    let (x, values): (Vec<f64>, Vec<f64>) = points.into_iter().unzip();
    Curve {
        name,
        x,
        median: values.clone(),
        lower: values.clone(),
        upper: values,
    }
}
