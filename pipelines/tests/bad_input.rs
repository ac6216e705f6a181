//! Random and mutated command lines and pipeline files (property tests):
//! each is taken, or refused with one line saying why; never a panic. The
//! flags come from the command's own clap definition, their values from a
//! pool of near misses, extremes and junk; what parses then goes through
//! the checks each command makes before it touches data (paths point at
//! files that do not exist, so nothing runs).

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use dualgp_pipelines::cli::{causes_once, one_line, Cli, Command};
use dualgp_pipelines::cluster::ClusterArgs;
use dualgp_pipelines::model_args::{check_workers, ModelArgs};
use dualgp_pipelines::pipeline::PipelineConfig;
use dualgp_pipelines::{curves, eval, inspect, kafka_tools, replay, suggest};
use proptest::prelude::*;
use proptest::sample::{select, Index};

const VALUES: &[&str] = &[
    "",
    "0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "0.5",
    "-0",
    "1e400",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e-320",
    "18446744073709551616",
    "99999999999999999999",
    "-9223372036854775809",
    "true",
    "false",
    "gaussian",
    "bernoulli",
    "bernoulli:logit",
    "bernoulli:probit",
    "poisson",
    "student-t",
    "softmax:0",
    "softmax:1",
    "softmax:3",
    "softmax:99999999999999999999",
    "softmax:",
    "softmax:-1",
    "matern52",
    "rbf",
    "pivoted",
    "fixed",
    "lbfgs",
    "adam",
    "message",
    "auto",
    "prequential",
    "on-arrival",
    "a=b",
    "=",
    "0,1;2,3",
    "1,0",
    "0,0",
    ";",
    ",",
    "é",
    "--",
    "-",
];

/// A value for a flag: from the pool, one of the flag's own choices, or junk.
fn value(choices: Vec<String>) -> impl Strategy<Value = String> {
    let pool: Vec<String> = VALUES.iter().map(|v| v.to_string()).chain(choices).collect();
    prop_oneof![4 => select(pool), 1 => "\\PC{0,8}"]
}

/// `dualgp SUB --flag value …` with `SUB`'s own flags, some without their
/// value, some twice, and a stray token now and then.
fn command_line() -> impl Strategy<Value = Vec<String>> {
    let cli = Cli::command();
    let subcommands: Vec<clap::Command> = cli.get_subcommands().cloned().collect();
    (
        any::<Index>(),
        proptest::collection::vec((any::<Index>(), any::<u8>()), 0..8),
    )
        .prop_flat_map(move |(which, picks)| {
            let sub = subcommands[which.index(subcommands.len())].clone();
            let args: Vec<clap::Arg> = sub
                .get_arguments()
                .filter(|a| a.get_long().is_some())
                .cloned()
                .collect();
            let name = sub.get_name().to_string();
            let tokens: Vec<BoxedStrategy<Vec<String>>> = picks
                .into_iter()
                .map(|(pick, how)| {
                    if args.is_empty() || how % 9 == 0 {
                        return value(Vec::new()).prop_map(|v| vec![v]).boxed();
                    }
                    let arg = &args[pick.index(args.len())];
                    let flag = format!("--{}", arg.get_long().unwrap_or_default());
                    let choices = arg
                        .get_possible_values()
                        .iter()
                        .map(|v| v.get_name().to_string())
                        .collect();
                    if how % 7 == 0 {
                        Just(vec![flag]).boxed()
                    } else {
                        value(choices).prop_map(move |v| vec![flag.clone(), v]).boxed()
                    }
                })
                .collect();
            tokens.prop_map(move |parts| {
                let mut line = vec!["dualgp".to_string(), name.clone()];
                line.extend(parts.into_iter().flatten());
                line
            })
        })
}

/// Files in `dir` that do not exist.
fn missing(dir: &Path, name: &str) -> PathBuf {
    dir.join("absent").join(name)
}

/// The checks a parsed command makes before it reads data, with every path
/// pointed at a missing file in `dir`: they all end in an error here.
fn check(command: Command, dir: &Path) -> anyhow::Result<()> {
    match command {
        Command::Demo { workers, .. } => check_workers(workers),
        Command::Eval(mut args) => {
            args.data = missing(dir, "train.parquet");
            args.test = args.test.map(|_| missing(dir, "test.parquet"));
            args.report = dir.join("report.json");
            args.maps = args.maps.map(|_| dir.join("maps"));
            eval::run(&args, |_, _| {}).map(|_| ())
        }
        Command::Replay(mut args) => {
            args.data = missing(dir, "data.parquet");
            args.output = dir.join("out.parquet");
            args.report = args.report.map(|_| dir.join("report.json"));
            args.dead_letters = args.dead_letters.map(|_| dir.join("dead.parquet"));
            args.cluster.hostfile = args.cluster.hostfile.map(|_| missing(dir, "hosts"));
            replay::run(&args, |_, _| {}).map(|_| ())
        }
        Command::Serve(mut args) => {
            // Serving would connect to a broker: only the checks before it.
            args.cluster.hostfile = args.cluster.hostfile.map(|_| missing(dir, "hosts"));
            args.likelihood.parse()?;
            args.model.settings()?;
            check_workers(args.workers)?;
            args.cluster.timely_config(args.workers).map(|_| ())
        }
        Command::Run {
            workers,
            mut cluster,
            model,
            ..
        } => {
            cluster.hostfile = cluster.hostfile.map(|_| missing(dir, "hosts"));
            model.settings()?;
            cluster.timely_config(workers.unwrap_or(1))?;
            PipelineConfig::read(&missing(dir, "pipeline.toml")).map(|_| ())
        }
        Command::Suggest(mut args) => {
            args.model = args.model.map(|_| missing(dir, "model"));
            args.data = args.data.map(|_| missing(dir, "evaluated.parquet"));
            suggest::run(&args).map(|_| ())
        }
        Command::Curves(mut args) => {
            let absent = missing(dir, "report.json");
            args.reports = args.reports.iter().map(|_| format!("a={}", absent.display())).collect();
            args.runs = args.runs.iter().map(|_| format!("a={}", absent.display())).collect();
            args.output = dir.join("curves.svg");
            curves::run(&args).map(|_| ())
        }
        Command::Inspect { .. } => inspect::inspect(&missing(dir, "checkpoint.json")).map(|_| ()),
        Command::Produce(mut args) => {
            // The file is read before the broker is contacted.
            args.data = missing(dir, "records.parquet");
            kafka_tools::produce(&args).map(|_| ())
        }
        // Tailing would connect to a broker: only the checks before it.
        Command::Tail(args) => args.checked_connection().map(|_| ()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_command_line_is_taken_or_refused_in_one_line(line in command_line()) {
        match Cli::try_parse_from(&line) {
            Err(e) if !e.use_stderr() => {} // --help, --version
            Err(e) => {
                let said = one_line(&e.to_string());
                prop_assert!(!said.contains('\n'), "{line:?}: {said}");
            }
            Ok(cli) => {
                let dir = tempfile::tempdir().unwrap();
                if let Err(e) = check(cli.command, dir.path()) {
                    let said = causes_once(&e);
                    prop_assert!(!said.is_empty() && !said.contains('\n'), "{line:?}: {said}");
                }
            }
        }
    }
}

// ---- pipeline files --------------------------------------------------------

fn documented() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/pipeline.toml")).unwrap()
}

/// The documented file with lines dropped, doubled or changed, and bytes changed.
fn pipeline_file() -> impl Strategy<Value = String> {
    let edits = proptest::collection::vec((any::<Index>(), any::<u8>(), value(Vec::new())), 0..5);
    (edits, proptest::collection::vec((any::<Index>(), any::<char>()), 0..3)).prop_map(|(edits, chars)| {
        let text = documented();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        for (at, how, v) in edits {
            let i = at.index(lines.len());
            match how % 4 {
                0 => {
                    lines.remove(i);
                }
                1 => lines.insert(i, lines[i].clone()),
                2 => {
                    // A key's value replaced by junk.
                    if let Some((key, _)) = lines[i].split_once('=') {
                        lines[i] = format!("{key}= {v}");
                    }
                }
                _ => lines[i] = v,
            }
            if lines.is_empty() {
                lines.push(String::new());
            }
        }
        let mut text: Vec<char> = lines.join("\n").chars().collect();
        for (at, c) in chars {
            let i = at.index(text.len().max(1));
            if i < text.len() {
                text[i] = c;
            }
        }
        text.into_iter().collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_pipeline_file_is_taken_or_refused_in_one_line(text in pipeline_file(), workers in 0usize..3) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pipeline.toml");
        std::fs::write(&path, &text).unwrap();
        let outcome = PipelineConfig::read(&path).and_then(|config| {
            config.job(Some(workers).filter(|w| *w > 0), &ClusterArgs::default(), &ModelArgs::default())?;
            config.model.settings()?;
            Ok(())
        });
        if let Err(e) = outcome {
            let said = causes_once(&e);
            prop_assert!(!said.is_empty() && !said.contains('\n'), "{text}\n---\n{said}");
        }
    }
}
