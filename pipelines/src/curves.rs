//! `dualgp curves`: one figure of a test figure after every batch from
//! several `eval` reports (the learners of one experiment side by side), or
//! of any experiment's repeated runs, so a run's curves need no plotting
//! outside the binary.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::report::{quartile_curves, Curve, LogAxes};

/// `dualgp curves`'s flags.
#[derive(Debug, Clone, Args)]
pub struct CurvesArgs {
    /// An eval report and its label in the key, as LABEL=REPORT.json; once
    /// per line. A report of one batch (`--method offline`) is drawn as a
    /// level line across the others' batches
    #[arg(long = "report", value_name = "LABEL=FILE", required_unless_present = "runs")]
    pub reports: Vec<String>,
    /// Repeated runs of one method and its label in the key, as
    /// LABEL=RUNS.json: a JSON array of runs, each an array of values at
    /// steps 1, 2, …; drawn as the median over the runs in its
    /// interquartile band
    #[arg(long = "runs", value_name = "LABEL=FILE")]
    pub runs: Vec<String>,
    /// The x axis's label for `--runs` (with `--report`, `--against` names it)
    #[arg(long, default_value = "step")]
    pub steps: String,
    /// The batch entries' field to draw: test_rmse, test_nlpd, test_accuracy or seconds
    #[arg(long, default_value = "test_rmse")]
    pub metric: String,
    /// What the x axis counts: batches learned, or the seconds the updates
    /// took so far (on a log scale, as seed 000's Fig. 7)
    #[arg(long, value_enum, default_value_t = Against::Batches)]
    pub against: Against,
    /// The figure's title
    #[arg(long, default_value = "")]
    pub title: String,
    /// Where the SVG goes
    #[arg(long, value_name = "FIG.svg")]
    pub output: PathBuf,
}

/// The x axis of `dualgp curves`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Against {
    /// Batches learned.
    Batches,
    /// Seconds the updates took so far, on a log scale.
    Seconds,
}

/// Draws the figure; returns how many curves it holds.
pub fn run(args: &CurvesArgs) -> Result<usize> {
    let series = args
        .reports
        .iter()
        .map(|given| read_series(given, &args.metric, args.against))
        .collect::<Result<Vec<_>>>()?;
    let runs = args
        .runs
        .iter()
        .map(|given| read_runs(given))
        .collect::<Result<Vec<_>>>()?;
    let xs = series.iter().flat_map(|(_, points)| points.iter().map(|p| p.0));
    let span = (
        xs.clone().fold(f64::INFINITY, f64::min),
        xs.fold(f64::NEG_INFINITY, f64::max),
    );
    let curves: Vec<Curve> = series
        .into_iter()
        .map(|(name, points)| line(name, points, span))
        .chain(runs)
        .collect();
    // Runs alone are drawn against their steps; reports against `--against`.
    let by_steps = args.reports.is_empty();
    let title = match args.title.as_str() {
        "" if by_steps => format!("{} after each {}", args.metric, args.steps),
        "" => format!("{} after each batch", args.metric),
        given => given.to_owned(),
    };
    let x_label = match args.against {
        _ if by_steps => args.steps.as_str(),
        Against::Batches => "batches learned",
        Against::Seconds => "seconds of learning so far (log scale)",
    };
    let log = LogAxes {
        x: args.against == Against::Seconds && !by_steps,
        y: false,
    };
    quartile_curves(&args.output, &title, x_label, &args.metric, log, &curves)?;
    Ok(curves.len())
}

/// `--FLAG LABEL=FILE`'s label and the file's JSON as a `T`, or one line
/// naming the flag and what `FILE` should hold.
fn labelled_json<T: DeserializeOwned>(flag: &str, given: &str, holds: &str) -> Result<(String, T)> {
    let (label, file) = given
        .split_once('=')
        .ok_or_else(|| anyhow!("--{flag} {given}: write LABEL=FILE.json"))?;
    let text = std::fs::read_to_string(file).with_context(|| format!("--{flag} {given}: cannot read {file}"))?;
    let value = serde_json::from_str(&text).with_context(|| format!("--{flag} {given}: not {holds}"))?;
    Ok((label.to_owned(), value))
}

/// `LABEL=FILE`'s label and its `(x, metric)` points, `x` as `against` says.
fn read_series(given: &str, metric: &str, against: Against) -> Result<(String, Vec<(f64, f64)>)> {
    let (label, report): (String, Value) = labelled_json("report", given, "JSON")?;
    let batches = report["batches"]
        .as_array()
        .ok_or_else(|| anyhow!("--report {given}: no `batches`; is it an eval report?"))?;
    let mut elapsed = 0.0;
    let points = batches
        .iter()
        .map(
            |b| match (b["batch"].as_f64(), b["seconds"].as_f64(), b[metric].as_f64()) {
                (Some(batch), Some(seconds), Some(value)) => {
                    elapsed += seconds;
                    match against {
                        Against::Batches => Ok((batch, value)),
                        Against::Seconds => Ok((elapsed, value)),
                    }
                }
                _ => bail!("--report {given}: a batch entry has no `{metric}`; choose another --metric"),
            },
        )
        .collect::<Result<Vec<_>>>()?;
    if points.is_empty() {
        bail!("--report {given}: no batches");
    }
    Ok((label, points))
}

/// `LABEL=FILE`'s runs as one curve: at each step the median over the runs
/// and their quartiles.
fn read_runs(given: &str) -> Result<Curve> {
    let (name, runs): (String, Vec<Vec<f64>>) =
        labelled_json("runs", given, "a JSON array of runs, each an array of numbers")?;
    let steps = runs.first().map_or(0, Vec::len);
    if steps == 0 || runs.iter().any(|run| run.len() != steps) {
        bail!("--runs {given}: the runs must be non-empty and equally long");
    }
    let sorted: Vec<Vec<f64>> = (0..steps)
        .map(|i| {
            let mut values: Vec<f64> = runs.iter().map(|run| run[i]).collect();
            values.sort_by(f64::total_cmp);
            values
        })
        .collect();
    let at = |q: f64| -> Vec<f64> { sorted.iter().map(|values| quantile(values, q)).collect() };
    Ok(Curve {
        name,
        x: (1..=steps).map(|i| i as f64).collect(),
        median: at(0.5),
        lower: at(0.25),
        upper: at(0.75),
    })
}

/// The `q`-quantile of `sorted` values, linear between order statistics.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let at = q * (sorted.len() - 1) as f64;
    let (below, above) = (at.floor() as usize, at.ceil() as usize);
    sorted[below] + (at - below as f64) * (sorted[above] - sorted[below])
}

/// A curve without a band; one point becomes a level line across `span`
/// (the other curves' first to last `x`).
fn line(name: String, points: Vec<(f64, f64)>, (first, last): (f64, f64)) -> Curve {
    let points = match points[..] {
        [(_, level)] => vec![(first, level), (last, level)],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn against_seconds_a_batch_stands_at_the_seconds_learned_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.json");
        let batches = r#"{"batches": [{"batch": 1, "seconds": 0.5, "test_nlpd": 1.0},
                                      {"batch": 2, "seconds": 0.25, "test_nlpd": 0.5}]}"#;
        std::fs::write(&file, batches).unwrap();
        let given = format!("a={}", file.display());
        let (_, by_batch) = read_series(&given, "test_nlpd", Against::Batches).unwrap();
        assert_eq!(by_batch, [(1.0, 1.0), (2.0, 0.5)]);
        let (label, by_time) = read_series(&given, "test_nlpd", Against::Seconds).unwrap();
        assert_eq!((label.as_str(), by_time), ("a", vec![(0.5, 1.0), (0.75, 0.5)]));
        let missing = read_series(&given, "test_rmse", Against::Seconds).unwrap_err();
        assert!(missing.to_string().contains("no `test_rmse`"), "{missing}");
    }

    #[test]
    fn runs_are_drawn_as_their_median_between_their_quartiles() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("runs.json");
        std::fs::write(&file, "[[1, 10], [2, 20], [3, 30], [4, 40], [5, 50]]").unwrap();
        let curve = read_runs(&format!("batch={}", file.display())).unwrap();
        assert_eq!((curve.name.as_str(), curve.x), ("batch", vec![1.0, 2.0]));
        assert_eq!(
            (curve.median, curve.lower, curve.upper),
            (vec![3.0, 30.0], vec![2.0, 20.0], vec![4.0, 40.0])
        );
        assert_eq!(quantile(&[0.0, 1.0], 0.25), 0.25);
        std::fs::write(&file, "[[1, 10], [2]]").unwrap();
        let ragged = read_runs(&format!("batch={}", file.display())).unwrap_err();
        assert!(ragged.to_string().contains("equally long"), "{ragged}");
    }
}
