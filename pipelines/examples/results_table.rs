//! Writes docs/RESULTS.md from the reports `scripts/results.sh` leaves under
//! target/results/ (`dualgp eval` JSON, `../shared/docs/EVALUATION.md`):
//!
//!     main/DATA/ORDER/METHOD/foldK.json    the paper-uci grid
//!     ablation/DATA/VARIANT/foldK.json     dual-memory variants, shuffle:0
//!     banana/ORDER/METHOD.json             train/test files
//!
//! Usage: results_table RESULTS_DIR OUT.md COMMAND DATE
//!
//! Only the tables above [`BY_HAND`] are written: what OUT.md holds from
//! that line on (the dated sections written by hand) is kept as it is.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

const DATASETS: [&str; 4] = ["bank", "mammographic", "elevators", "bike"];
const ORDERS: [&str; 2] = ["shuffle-0", "sorted-x0"];
const METHODS: [&str; 3] = ["dual-memory", "osgpr", "offline"];

/// The line from which OUT.md is written by hand.
const BY_HAND: &str = "<!-- Written by hand from here on: results_table keeps it. -->";

/// Paper Table 1 (test NLPD, 10-fold mean): its method, Bui et al., offline.
fn paper(data: &str) -> &'static str {
    match data {
        "elevators" => ".57 / .57 / .50",
        "bike" => ".44 / .49 / .24",
        "mammographic" => ".41 / .42 / .40",
        "bank" => ".26 / .28 / .25",
        _ => "",
    }
}

/// The figures one report gives.
struct Run {
    nlpd: f64,
    /// `("RMSE", …)` or `("accuracy", …)`.
    score: Option<(&'static str, f64)>,
    seconds_per_batch: f64,
}

fn read_run(path: &Path) -> Result<Run> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let json: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let fin = &json["final"];
    let number = |v: &Value, what: &str| v.as_f64().with_context(|| format!("{}: no {what}", path.display()));
    let score = match (fin["test_rmse"].as_f64(), fin["test_accuracy"].as_f64()) {
        (Some(r), _) => Some(("RMSE", r)),
        (_, Some(a)) => Some(("accuracy", a)),
        _ => None,
    };
    let batches = json["batches"].as_array().map_or(1, Vec::len).max(1);
    Ok(Run {
        nlpd: number(&fin["test_nlpd"], "final.test_nlpd")?,
        score,
        seconds_per_batch: number(&fin["seconds_total"], "final.seconds_total")? / batches as f64,
    })
}

/// Every `*.json` report directly in `dir` (none if it does not exist).
fn read_dir_runs(dir: &Path) -> Result<Vec<Run>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths.iter().map(|p| read_run(p)).collect()
}

/// Mean and sample standard deviation.
fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// `mean ± std [folds]`, or `—`.
fn nlpd_cell(runs: &[Run]) -> String {
    if runs.is_empty() {
        return "—".into();
    }
    let (mean, std) = mean_std(&runs.iter().map(|r| r.nlpd).collect::<Vec<_>>());
    format!("{mean:.3} ± {std:.3} [{}]", runs.len())
}

fn score_cell(runs: &[Run]) -> String {
    let scores: Vec<f64> = runs.iter().filter_map(|r| r.score.map(|s| s.1)).collect();
    if scores.is_empty() {
        return "—".into();
    }
    format!("{:.3}", mean_std(&scores).0)
}

fn seconds_cell(runs: &[Run]) -> String {
    if runs.is_empty() {
        return "—".into();
    }
    format!(
        "{:.2}",
        mean_std(&runs.iter().map(|r| r.seconds_per_batch).collect::<Vec<_>>()).0
    )
}

fn score_name(runs: &BTreeMap<&str, Vec<Run>>) -> &'static str {
    runs.values()
        .flatten()
        .find_map(|r| r.score.map(|s| s.0))
        .unwrap_or("score")
}

/// The grid's reports of one data set and order, by method; offline ignores
/// the order, so its shuffled runs stand for both.
fn grid_cell(results: &Path, data: &str, order: &str) -> Result<BTreeMap<&'static str, Vec<Run>>> {
    let mut by_method = BTreeMap::new();
    for method in METHODS {
        let order_dir = if method == "offline" { "shuffle-0" } else { order };
        let dir = results.join("main").join(data).join(order_dir).join(method);
        by_method.insert(method, read_dir_runs(&dir)?);
    }
    Ok(by_method)
}

fn main_tables(results: &Path, out: &mut String) -> Result<()> {
    let mut nlpd = String::from(
        "| data | order | dual-memory | osgpr | offline | paper: dual / Bui / offline |\n|---|---|---|---|---|---|\n",
    );
    let mut score =
        String::from("| data | order | metric | dual-memory | osgpr | offline |\n|---|---|---|---|---|---|\n");
    let mut seconds =
        String::from("| data | order | dual-memory | osgpr | offline (whole fit) |\n|---|---|---|---|---|\n");
    for data in DATASETS {
        for order in ORDERS {
            let cell = grid_cell(results, data, order)?;
            if cell.values().all(Vec::is_empty) {
                continue;
            }
            let order_name = order.replacen('-', ":", 1);
            let by = |f: fn(&[Run]) -> String| METHODS.map(|m| f(&cell[m])).join(" | ");
            writeln!(nlpd, "| {data} | {order_name} | {} | {} |", by(nlpd_cell), paper(data))?;
            writeln!(
                score,
                "| {data} | {order_name} | {} | {} |",
                score_name(&cell),
                by(score_cell)
            )?;
            writeln!(seconds, "| {data} | {order_name} | {} |", by(seconds_cell))?;
        }
    }
    out.push_str("## Test NLPD after the last batch\n\nMean ± standard deviation over folds, [number of folds]. ");
    out.push_str("The paper's Table 1 figures (10-fold means) are beside them. Offline training ignores the order: ");
    out.push_str("its shuffled runs fill both rows.\n\n");
    out.push_str(&nlpd);
    out.push_str("\n## RMSE (regression) or accuracy (classification)\n\nMean over the same folds.\n\n");
    out.push_str(&score);
    out.push_str("\n## Seconds per batch\n\nThe learner's update only (`seconds` in the report), mean over ");
    out.push_str("batches and folds; offline: the whole fit on all training rows.\n\n");
    out.push_str(&seconds);
    Ok(())
}

/// Dual-memory on shuffle:0 with one setting changed; the defaults (a uniform memory, past as a
/// message, pivoted inducing inputs) are the grid's own runs.
fn ablation_table(results: &Path, out: &mut String) -> Result<()> {
    let variants = [
        ("defaults (memory uniform)", None),
        ("memory bls", Some("memory-bls")),
        ("memory none", Some("memory-none")),
        ("inducing fixed", Some("inducing-fixed")),
        ("past as scaled memory", Some("past-scaled-memory")),
    ];
    let mut table = String::from("| data |");
    for (name, _) in variants {
        write!(table, " {name} |")?;
    }
    table.push('\n');
    table.push_str(&"|---".repeat(variants.len() + 1));
    table.push_str("|\n");
    let mut any = false;
    for data in ["bike", "bank"] {
        let mut row = format!("| {data} |");
        let mut found = false;
        for (_, dir) in variants {
            let path = match dir {
                None => results.join("main").join(data).join("shuffle-0").join("dual-memory"),
                Some(d) => results.join("ablation").join(data).join(d),
            };
            let runs = read_dir_runs(&path)?;
            found |= dir.is_some() && !runs.is_empty();
            write!(row, " {} |", nlpd_cell(&runs))?;
        }
        if found {
            any = true;
            table.push_str(&row);
            table.push('\n');
        }
    }
    if any {
        out.push_str("\n## Ablation: dual-memory, shuffle:0, test NLPD\n\n");
        out.push_str("`--memory-policy random|bls|none`, `--inducing-policy pivoted|fixed` and ");
        out.push_str("`--m-past message|scaled-memory`, one setting changed at a time from the defaults ");
        out.push_str("(memory random, inducing pivoted, past as a message).\n\n");
        out.push_str(&table);
    }
    Ok(())
}

fn banana_table(results: &Path, out: &mut String) -> Result<()> {
    let mut rows = String::new();
    for order in ORDERS {
        for method in METHODS {
            let order_dir = if method == "offline" { "shuffle-0" } else { order };
            let path = results.join("banana").join(order_dir).join(format!("{method}.json"));
            if !path.exists() {
                continue;
            }
            let run = read_run(&path)?;
            let accuracy = run.score.map_or("—".into(), |s| format!("{:.3}", s.1));
            writeln!(
                rows,
                "| {} | {method} | {:.3} | {accuracy} | {:.2} |",
                order.replacen('-', ":", 1),
                run.nlpd,
                run.seconds_per_batch
            )?;
        }
    }
    if !rows.is_empty() {
        out.push_str("\n## Banana (banana_train / banana_test, 10 batches)\n\n");
        out.push_str("| order | method | test NLPD | accuracy | seconds per batch |\n|---|---|---|---|---|\n");
        out.push_str(&rows);
    }
    Ok(())
}

fn main() {
    if let Err(err) = run() {
        eprintln!("results_table: {err:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [results, out_path, command, date] = args.as_slice() else {
        bail!("usage: results_table RESULTS_DIR OUT.md COMMAND DATE");
    };
    let results = Path::new(results);
    let mut out = String::from("# Results: the paper-uci protocol\n\n");
    writeln!(
        out,
        "Written by `scripts/results.sh` on {date}; the tables cover every report under `{}`, \
         including those of earlier runs (the script resumes). Last command:\n\n    {command}\n",
        results.display()
    )?;
    out.push_str("Protocol: `../shared/docs/EVALUATION.md` (10 batches, m = 100, each method's defaults, ");
    out.push_str("`dualgp eval --help`). osgpr is Bui et al. 2017 (`operators/src/model/baselines/osgpr.rs`).\n\n");
    main_tables(results, &mut out)?;
    ablation_table(results, &mut out)?;
    banana_table(results, &mut out)?;
    let old = std::fs::read_to_string(out_path).unwrap_or_default();
    if let Some(at) = old.find(BY_HAND) {
        out.push('\n');
        out.push_str(&old[at..]);
    }
    std::fs::write(out_path, out).with_context(|| format!("cannot write {out_path}"))?;
    Ok(())
}
