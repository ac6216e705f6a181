//! The `dualgp` command line: its subcommands and flags (clap), and how a
//! parse error becomes the one line the command prints. The binary
//! (`main.rs`) runs what is parsed; tests parse without running.

use clap::{Parser, Subcommand};

use crate::cluster::ClusterArgs;
use crate::model_args::ModelArgs;
use crate::{eval, replay, serve, suggest};

#[derive(Parser)]
#[command(name = "dualgp", version, about = "Sequential sparse Gaussian processes on streams")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Stream generated data through the operator, print the prequential figures and held-out accuracy (no setup needed).
    Demo {
        /// Points in the stream (10 epochs).
        #[arg(long, default_value_t = 3000)]
        n: usize,
        /// Inducing points.
        #[arg(long, default_value_t = 50)]
        inducing: usize,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the SVG plots go.
        #[arg(long, default_value = "dualgp-demo")]
        plots: std::path::PathBuf,
    },
    /// Evaluate a learner on a data set batch by batch (../shared/docs/EVALUATION.md) and write a JSON report.
    Eval(Box<eval::EvalArgs>),
    /// Score a Parquet stream record by record, learning after each epoch (a backtest), and write the predictions.
    Replay(Box<replay::ReplayArgs>),
    /// Score a Kafka topic in real time and keep learning from its labelled records; stop with SIGINT/SIGTERM.
    Serve(Box<serve::ServeArgs>),
    /// Run the pipeline a TOML file describes (docs/pipeline.toml lists every key); flags override the file.
    Run {
        #[arg(long)]
        config: std::path::PathBuf,
        #[arg(long)]
        workers: Option<usize>,
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        model: Box<ModelArgs>,
    },
    /// Choose the next batch of points to evaluate (batch Bayesian optimisation, active learning); prints {"points": [...]} as JSON.
    Suggest(Box<suggest::SuggestArgs>),
    /// Show what a saved model holds: a checkpoint file, or the newest in a directory.
    Inspect {
        checkpoint: std::path::PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// clap's message without its usage block, on one line: every error is one line.
pub fn one_line(message: &str) -> String {
    let said: Vec<&str> = message
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(|l| l.trim().trim_start_matches("error: "))
        .filter(|l| !l.is_empty())
        .collect();
    format!("{}; see `dualgp --help`", said.join(" "))
}

/// The error and its causes joined by `: `, each cause left out where the
/// message before it already says it (errors that name their cause in their
/// own message would otherwise say it twice).
pub fn causes_once(err: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in err.chain().map(ToString::to_string) {
        if !said.contains(&cause) {
            if !said.is_empty() {
                said.push_str(": ");
            }
            said.push_str(&cause);
        }
    }
    said
}
