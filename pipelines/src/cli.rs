//! The `dualgp` command line: its subcommands and flags (clap), and how a
//! parse error becomes the one line the command prints. The binary
//! (`main.rs`) runs what is parsed; tests parse without running.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::cluster::ClusterArgs;
use crate::column_args::ColumnArgs;
use crate::model_args::ModelArgs;
use crate::{curves, eval, kafka_tools, replay, serve, suggest};

/// The whole command line: one subcommand and its flags.
#[derive(Parser)]
#[command(name = "dualgp", version, about = "Sequential sparse Gaussian processes on streams")]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands, each with its flags.
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
        /// Dataflow worker threads.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// The seed of the generated data and of the learner's random choices.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the SVG plots go.
        #[arg(long, default_value = "dualgp-demo")]
        plots: std::path::PathBuf,
    },
    /// Evaluate a learner on a data set batch by batch (../shared/docs/EVALUATION.md) and write a JSON report.
    Eval(Box<eval::EvalArgs>),
    /// Score a Parquet (or CSV) stream record by record, learning after each epoch (a backtest), and write the predictions.
    Replay(Box<replay::ReplayArgs>),
    /// Score a Kafka topic in real time and keep learning from its labelled records; stop with SIGINT/SIGTERM.
    Serve(Box<serve::ServeArgs>),
    /// Run the pipeline a TOML file describes (docs/pipeline.toml lists every key); flags override the file.
    Run {
        /// The pipeline file (TOML).
        #[arg(long)]
        config: std::path::PathBuf,
        /// Dataflow worker threads (per process), over the file's `workers`.
        #[arg(long)]
        workers: Option<usize>,
        /// The timely cluster this process is part of.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Column flags, over the file's `[columns]`.
        #[command(flatten)]
        columns: ColumnArgs,
        /// Model flags, over the file's `[model]`.
        #[command(flatten)]
        model: Box<ModelArgs>,
    },
    /// Choose the next batch of points to evaluate (batch Bayesian optimisation, active learning); prints {"points": [...]} as JSON.
    Suggest(Box<suggest::SuggestArgs>),
    /// Put a Parquet or CSV file's records on a Kafka topic as the JSON messages `serve` reads.
    Produce(Box<kafka_tools::ProduceArgs>),
    /// Print a Kafka topic's messages from its first, one a line (the predictions `serve` wrote).
    Tail(Box<kafka_tools::TailArgs>),
    /// Draw a test figure after every batch of several `eval` reports in one SVG (an experiment's learners side by side).
    Curves(Box<curves::CurvesArgs>),
    /// Show what a saved model holds: a checkpoint file, or the newest in a directory.
    Inspect {
        /// A checkpoint file, or a checkpoint directory (its newest is read).
        checkpoint: std::path::PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// The command line as `dualgp` reads it: clap's, except that a negative
/// number after a flag is that flag's value (`--workers -1` is then refused
/// as a value, not taken for an unknown flag `-1`).
pub fn command() -> clap::Command {
    let values_may_be_negative = |arg: clap::Arg| match arg.get_action().takes_values() {
        true => arg.allow_negative_numbers(true),
        false => arg,
    };
    Cli::command().mut_subcommands(move |sub| sub.mut_args(values_may_be_negative))
}

/// Parses `args` (the program's name first) with [`command`].
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command()))
}

/// clap's message on one line, without its usage block and its own hint:
/// every error is one line, its parts joined by `; ` (a list after a colon
/// by `, `), ending with the help to read: that of the subcommand the
/// message's usage names, else of `dualgp`.
pub fn one_line(message: &str) -> String {
    one_line_for(message, None)
}

/// [`one_line`], pointing at `subcommand`'s help when the message names none.
pub fn one_line_for(message: &str, subcommand: Option<&str>) -> String {
    let mut said = String::new();
    let mut listing = false;
    for line in message.lines().take_while(|l| !l.trim().starts_with("Usage:")) {
        let text = line.trim().trim_start_matches("error: ");
        if text.is_empty() || text.starts_with("For more information") {
            continue;
        }
        let item = line.starts_with(char::is_whitespace);
        let joint = match (said.is_empty(), item && (listing || said.ends_with(':'))) {
            (true, _) => "",
            (false, true) if listing => ", ",
            (false, true) => " ",
            (false, false) => "; ",
        };
        listing = item && (listing || said.ends_with(':'));
        said.push_str(joint);
        said.push_str(text);
    }
    // `Usage: dualgp replay --data <DATA> …`: the help of `dualgp replay`.
    let command = message
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .map(|usage| {
            let words: Vec<&str> = usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect();
            words.join(" ")
        })
        .filter(|c| c.starts_with("dualgp"))
        .or_else(|| subcommand.map(|s| format!("dualgp {s}")))
        .unwrap_or_else(|| "dualgp".into());
    format!("{said}; see `{command} --help`")
}

/// The subcommand `args` (the program's name first) names, if any.
pub fn subcommand_of(args: &[std::ffi::OsString]) -> Option<String> {
    let first = args.get(1)?.to_str()?;
    command()
        .get_subcommands()
        .any(|s| s.get_name() == first)
        .then(|| first.to_owned())
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
