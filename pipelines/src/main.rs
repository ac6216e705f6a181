//! The `dualgp` command.

use anyhow::Context;
use clap::{Parser, Subcommand};
use dualgp_pipelines::demo;

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
    }
}
