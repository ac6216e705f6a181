//! The `dualgp` command.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use dualgp_operators::model::StreamingLearner;
use dualgp_pipelines::cluster::ClusterArgs;
use dualgp_pipelines::model_args::ModelArgs;
use dualgp_pipelines::{demo, eval, inspect, pipeline, replay, serve, suggest};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(name = "dualgp", version, about = "Sequential sparse Gaussian processes on streams")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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

fn main() {
    // Warnings and errors of a running job on stderr; RUST_LOG=info (or a
    // per-module filter) says more.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        if !e.use_stderr() {
            e.exit() // --help and --version
        }
        eprintln!("dualgp: {}", one_line(&e.to_string()));
        std::process::exit(2);
    });
    if let Err(err) = run(cli) {
        eprintln!("dualgp: {}", causes_once(&err));
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo {
            n,
            inducing,
            workers,
            seed,
            plots,
        } => {
            let report = demo::run(n, inducing, workers, seed, &plots).context("the demo failed")?;
            let r = &report.replay;
            println!(
                "dualgp demo: a stream of {} noisy points of a smooth 2-D field (noise sd 0.1), {} epochs on {} workers",
                r.records, r.epochs, r.workers
            );
            println!("  epoch  prequential NLPD  RMSE   (each epoch scored before it is learned)");
            for e in &r.epoch_scores {
                println!("  {:>5}  {:>16.4}  {:.4}", e.epoch, e.nlpd, e.rmse.unwrap_or(f64::NAN));
            }
            println!("  {:.0} records/s through the operator", r.records_per_second);
            println!(
                "  held out (1000 points): test NLPD {:.4}, test RMSE {:.4}",
                report.test_nlpd, report.test_rmse
            );
            let kernel = report.model.kernel();
            println!("  hyperparameters on the standardised scale:");
            for (name, value) in kernel.param_names().iter().zip(kernel.log_params()) {
                println!("    {name} = {:.4}", value.exp());
            }
            for plot in &report.plots {
                println!("  plot: {}", plot.display());
            }
            Ok(())
        }
        Command::Eval(args) => {
            let bar = progress_bar(args.batches as u64, "batches", format!("eval {}", args.data.display()));
            let report = eval::run(&args, |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            })?;
            bar.finish_and_clear();
            let f = &report.final_.scores;
            println!(
                "{} on {}: test NLPD {:.4}, {}, {:.2} s learning; report in {}",
                report.method,
                report.data,
                f.test_nlpd,
                score(f.test_rmse, f.test_accuracy),
                report.final_.seconds_total,
                args.report.display()
            );
            Ok(())
        }
        Command::Replay(args) => {
            let bar = progress_bar(0, "epochs", format!("replay {}", args.data.display()));
            let ticks = bar.clone();
            let outcome = replay::run(&args, move |done, total| {
                ticks.set_length(total);
                ticks.set_position(done);
            })?;
            bar.finish_and_clear();
            let Some(report) = outcome.map(|o| o.report) else {
                println!("dualgp replay: {}", replay::elsewhere(&args));
                return Ok(());
            };
            println!(
                "replayed {} records in {} epochs ({:.0} records/s): prequential NLPD {:.4}, {}; {} dead letters; predictions in {}",
                report.records,
                report.epochs,
                report.records_per_second,
                report.prequential_nlpd,
                score(report.prequential_rmse, report.prequential_accuracy),
                report.dead_letters,
                args.output.display()
            );
            Ok(())
        }
        Command::Serve(args) => serve(&args),
        Command::Run {
            config,
            workers,
            cluster,
            model,
        } => {
            let job = pipeline::PipelineConfig::read(&config)?.job(workers, &cluster, &model)?;
            println!("{}", pipeline::run(&job, stop_on_signals()?)?);
            Ok(())
        }
        Command::Suggest(args) => {
            println!("{}", serde_json::to_string(&suggest::run(&args)?)?);
            Ok(())
        }
        Command::Inspect { checkpoint, json } => {
            let summary = inspect::inspect(&checkpoint)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print!("{summary}");
            }
            Ok(())
        }
    }
}

/// The second figure of a summary line: the RMSE of a regression, else the
/// accuracy of a classifier (else nothing).
fn score(rmse: Option<f64>, accuracy: Option<f64>) -> String {
    rmse.map(|r| format!("RMSE {r:.4}"))
        .or(accuracy.map(|a| format!("accuracy {a:.4}")))
        .unwrap_or_default()
}

/// Serves until SIGINT or SIGTERM (then finishes the epoch, checkpoints and
/// commits) or `--idle-exit`.
fn serve(args: &serve::ServeArgs) -> anyhow::Result<()> {
    let s = serve::run(args, stop_on_signals()?)?;
    let committed = s.committed_epoch.map_or("no offsets committed".into(), |e| {
        format!("offsets committed through epoch {e}")
    });
    println!(
        "dualgp serve: {} records scored, {} predictions sent, {} dead letters, {} updates over {} epochs ({} failed); {committed}",
        s.records, s.predictions, s.dead_letters, s.updates, s.epochs, s.failed_updates
    );
    Ok(())
}

/// The error and its causes joined by `: `, each cause left out where the
/// message before it already says it (errors that name their cause in their
/// own message would otherwise say it twice).
fn causes_once(err: &anyhow::Error) -> String {
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

/// clap's message without its usage block, on one line: every error is one line.
fn one_line(message: &str) -> String {
    let said: Vec<&str> = message
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(|l| l.trim().trim_start_matches("error: "))
        .filter(|l| !l.is_empty())
        .collect();
    format!("{}; see `dualgp --help`", said.join(" "))
}

/// A flag SIGINT and SIGTERM set; a second signal exits at once.
fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 1, Arc::clone(&stop))?;
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    Ok(stop)
}

/// A progress bar that draws only on a terminal, so logs and CI stay quiet.
fn progress_bar(len: u64, unit: &str, message: String) -> ProgressBar {
    let bar = ProgressBar::new(len).with_style(
        ProgressStyle::with_template(&format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}})"))
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(message);
    bar
}
