//! The `dualgp` command.

use anyhow::Context;
use clap::{Parser, Subcommand};
use dualgp_pipelines::{demo, eval};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(name = "dualgp", version, about = "Sequential sparse Gaussian processes on streams")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fit a model to a generated stream and report held-out accuracy (no setup needed).
    Demo {
        /// Training points to generate.
        #[arg(long, default_value_t = 3000)]
        n: usize,
        /// Inducing points.
        #[arg(long, default_value_t = 50)]
        inducing: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Evaluate a learner on a data set batch by batch (docs/EVALUATION.md) and write a JSON report.
    Eval(Box<eval::EvalArgs>),
}

fn main() {
    if let Err(err) = run(Cli::parse()) {
        eprintln!("dualgp: {err:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo { n, inducing, seed } => {
            let report = demo::run(n, inducing, seed).context("the demo failed")?;
            let post = &report.model.posterior;
            println!(
                "dualgp demo: {} training points, m = {} inducing inputs",
                report.train,
                post.m()
            );
            println!("  fitted in {:.2} s", report.seconds);
            println!(
                "  test NLPD {:.4}, test RMSE {:.4} (noise sd 0.1)",
                report.test_nlpd, report.test_rmse
            );
            println!("  likelihood: {:?}", report.model.likelihood);
            for (name, value) in post.kernel.param_names().iter().zip(post.kernel.log_params()) {
                println!("  {name} = {:.4}", value.exp());
            }
            Ok(())
        }
        Command::Eval(args) => {
            // indicatif draws only on a terminal, so logs and CI stay quiet.
            let bar = ProgressBar::new(args.batches as u64).with_style(
                ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} batches ({elapsed})")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(format!("eval {}", args.data.display()));
            let report = eval::run(&args, |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            })?;
            bar.finish_and_clear();
            let f = &report.final_;
            let score = f
                .test_rmse
                .map(|r| format!("RMSE {r:.4}"))
                .or(f.test_accuracy.map(|a| format!("accuracy {a:.4}")));
            println!(
                "{} on {}: test NLPD {:.4}, {}, {:.2} s learning; report in {}",
                report.method,
                report.data,
                f.test_nlpd,
                score.unwrap_or_default(),
                f.seconds_total,
                args.report.display()
            );
            Ok(())
        }
    }
}
