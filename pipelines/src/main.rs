//! The `dualgp` command.

use anyhow::Context;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use dualgp_operators::model::StreamingLearner;
use dualgp_pipelines::cli::{causes_once, one_line_for, parse_from, subcommand_of, Cli, Command};
use dualgp_pipelines::wording::counted;
use dualgp_pipelines::{curves, demo, eval, inspect, kafka_tools, pipeline, replay, report, serve, suggest};
use indicatif::{ProgressBar, ProgressStyle};

fn main() {
    // Warnings and errors of a running job on stderr; RUST_LOG=info (or a
    // per-module filter) says more.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = parse_from(&args).unwrap_or_else(|e| {
        if !e.use_stderr() {
            e.exit() // --help and --version
        }
        eprintln!(
            "dualgp: {}",
            one_line_for(&e.to_string(), subcommand_of(&args).as_deref())
        );
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
            let Some(outcome) = outcome else {
                println!("dualgp replay: {}", replay::elsewhere(&args));
                return Ok(());
            };
            if let Some(dir) = &args.plots {
                let model = outcome
                    .learner
                    .as_ref()
                    .context("--plots: the stream taught the model nothing")?;
                for plot in report::write(dir, &outcome.report, &outcome.hyperparameters, model, &outcome.scaling)? {
                    println!("plot: {}", plot.display());
                }
            }
            let report = outcome.report;
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
            columns,
            model,
        } => {
            let job = pipeline::PipelineConfig::read(&config)?
                .with_columns(&columns)
                .job(workers, &cluster, &model)?;
            println!("{}", pipeline::run(&job, stop_on_signals()?)?);
            Ok(())
        }
        Command::Suggest(args) => {
            println!("{}", serde_json::to_string(&suggest::run(&args)?)?);
            Ok(())
        }
        Command::Produce(args) => {
            let n = kafka_tools::produce(&args)?;
            eprintln!("produced {} to `{}`", counted(n as u64, "record"), args.topic);
            Ok(())
        }
        Command::Tail(args) => {
            let n = kafka_tools::tail(&args, |message| println!("{message}"))?;
            eprintln!("read {n} messages from `{}`", args.topic);
            Ok(())
        }
        Command::Curves(args) => {
            let n = curves::run(&args)?;
            println!("{n} curves in {}", args.output.display());
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
    let summary = serve::run(args, stop_on_signals()?)?;
    println!("dualgp serve: {}", summary.line(&args.cluster));
    Ok(())
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
