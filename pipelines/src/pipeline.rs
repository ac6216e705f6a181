//! `dualgp run --config pipeline.toml`: a whole pipeline (source → learner →
//! sinks) in one file. `docs/pipeline.toml` lists every key with its default.
//! A Parquet source runs as `replay`, a Kafka source as `serve`; flags given
//! on the command line override the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use dualgp_operators::dataflow::Scoring;
use serde::Deserialize;

use crate::cluster::ClusterArgs;
use crate::column_args::ColumnArgs;
use crate::likelihood_args::LikelihoodArgs;
use crate::model_args::ModelArgs;
use crate::replay::ReplayArgs;
use crate::serve::ServeArgs;

/// A pipeline file (`dualgp run --config`): one source, the model, the sinks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// gaussian | bernoulli[:logit] | poisson | student-t | softmax:C, or a
    /// comma-separated list, one per output (a multi-output model)
    pub likelihood: String,
    /// Shared latent GPs of a multi-output model (default: one per output).
    pub latents: Option<usize>,
    /// A multi-output model's predictions also hold every output's predictive.
    #[serde(default)]
    pub predict_all_outputs: bool,
    /// Dataflow worker threads per process.
    #[serde(default = "one")]
    pub workers: usize,
    /// Epochs read ahead of the learner at most (default: as `replay` for
    /// Parquet, 2; as `serve` for Kafka, 16).
    #[serde(default)]
    pub epochs_in_flight: Option<u64>,
    /// Kafka, scoring on arrival: the most epochs a record's model lags
    /// behind it, about (as `serve --max-staleness`; default: unbounded).
    #[serde(default)]
    pub max_staleness: Option<u64>,
    /// prequential | on-arrival (default: prequential for Parquet, on-arrival for Kafka).
    pub scoring: Option<Scoring>,
    /// Kafka, scoring on arrival: the learner takes only idle cores (as
    /// `serve --learn-in-background`, default false).
    #[serde(default)]
    pub learn_in_background: Option<bool>,
    /// Where records come from.
    pub source: Source,
    /// Which columns (or JSON fields) are the id, the features, the target
    /// and the output: the column flags' names (`id`, `features`, `target`,
    /// `output_column`); flags given on the command line override them.
    #[serde(default)]
    pub columns: ColumnArgs,
    /// The model flags, by their long names.
    #[serde(default)]
    pub model: ModelArgs,
    /// Where results go.
    #[serde(default)]
    pub sinks: Sinks,
}

/// Where records come from: exactly one table, `[source.parquet]` or `[source.kafka]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Source {
    /// A backtest of a Parquet (or CSV) file, as `dualgp replay`.
    Parquet {
        /// The file.
        path: PathBuf,
        /// Rows per epoch.
        #[serde(default = "thousand")]
        batch_size: u64,
    },
    /// A Kafka topic served, as `dualgp serve`.
    Kafka {
        /// `host:port[,host:port…]`.
        brokers: String,
        /// The input topic.
        topic: String,
        /// Records per epoch and worker.
        #[serde(default = "thousand")]
        batch_size: u64,
        /// An epoch also ends after this long.
        #[serde(default = "thousand")]
        batch_timeout_ms: u64,
        /// The consumer group offsets are committed under.
        #[serde(default = "dualgp")]
        group_id: String,
        /// librdkafka settings passed through (TLS, SASL).
        #[serde(default)]
        options: BTreeMap<String, String>,
        /// Seconds to wait for the brokers before giving up.
        #[serde(default = "thirty")]
        broker_timeout: f64,
        /// A message larger than this many bytes is a dead letter.
        #[serde(default = "max_record_bytes")]
        max_record_bytes: usize,
        /// Stop once no worker has had input for this many seconds.
        idle_exit: Option<f64>,
        /// Prometheus metrics on 127.0.0.1:PORT.
        metrics_port: Option<u16>,
    },
}

/// Where results go. A Parquet source writes `predictions` (a Parquet file);
/// a Kafka source writes to `topic`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Sinks {
    /// The predictions file (a Parquet source).
    pub predictions: Option<PathBuf>,
    /// The output topic (a Kafka source).
    pub topic: Option<String>,
    /// The dead-letter file (a Parquet source).
    pub dead_letters: Option<PathBuf>,
    /// The JSON report (a Parquet source).
    pub report: Option<PathBuf>,
    /// Checkpoints after every update (a Kafka source).
    pub checkpoint_dir: Option<PathBuf>,
}

fn one() -> usize {
    1
}
fn thousand() -> u64 {
    1000
}
fn thirty() -> f64 {
    30.0
}
fn max_record_bytes() -> usize {
    dualgp_connectors::kafka::MAX_RECORD_BYTES
}
fn dualgp() -> String {
    "dualgp".into()
}

/// The command a pipeline file amounts to.
pub enum Job {
    /// A Parquet source: a replay.
    Replay(ReplayArgs),
    /// A Kafka source: serving.
    Serve(ServeArgs),
}

impl PipelineConfig {
    /// The file's `likelihood` and `latents`, as the commands take them.
    fn likelihood(&self) -> LikelihoodArgs {
        LikelihoodArgs {
            spec: self.likelihood.clone(),
            latents: self.latents,
        }
    }

    /// Reads and parses the file at `path`; a parse error is one line.
    pub fn read(path: &Path) -> Result<PipelineConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        // toml's messages span lines; the command's errors are one line.
        toml::from_str(&text).map_err(|e| {
            let message: Vec<&str> = e.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect();
            let message = message.join("; ");
            let at = e.span().map(|s| {
                let line = text[..s.start].matches('\n').count() + 1;
                format!(" (line {line})")
            });
            anyhow::anyhow!("{}{}: {message}", path.display(), at.unwrap_or_default())
        })
    }

    /// The file's columns with the column flags given on the command line
    /// (`--id`, `--features`, `--target`, `--output-column`) taking precedence.
    pub fn with_columns(mut self, flags: &ColumnArgs) -> PipelineConfig {
        self.columns = self.columns.overridden_by(flags);
        self
    }

    /// The job, with `workers` and the model flags given on the command line
    /// taking precedence; `cluster` (flags only: each process has its own
    /// `--process`) says which process of the cluster this is.
    pub fn job(&self, workers: Option<usize>, cluster: &ClusterArgs, model: &ModelArgs) -> Result<Job> {
        let workers = workers.unwrap_or(self.workers);
        let model = self.model.overridden_by(model);
        let columns = self.columns.clone();
        let sinks = &self.sinks;
        Ok(match &self.source {
            Source::Parquet { path, batch_size } => {
                let Some(output) = sinks.predictions.clone() else {
                    bail!("a Parquet source needs sinks.predictions, the Parquet file to write predictions to");
                };
                if sinks.topic.is_some() || sinks.checkpoint_dir.is_some() {
                    bail!(
                        "a Parquet source writes sinks.predictions only; remove sinks.topic and sinks.checkpoint_dir"
                    );
                }
                Job::Replay(ReplayArgs {
                    data: path.clone(),
                    columns,
                    output,
                    likelihood: self.likelihood(),
                    predict_all_outputs: self.predict_all_outputs,
                    batch_size: *batch_size,
                    workers,
                    cluster: cluster.clone(),
                    model,
                    report: sinks.report.clone(),
                    dead_letters: sinks.dead_letters.clone(),
                    epochs_in_flight: self.epochs_in_flight.unwrap_or(crate::replay::EPOCHS_IN_FLIGHT),
                    scoring: self.scoring.unwrap_or(Scoring::Prequential),
                    warm_start: None,
                    save_model: None,
                    plots: None,
                })
            }
            Source::Kafka {
                brokers,
                topic,
                batch_size,
                batch_timeout_ms,
                group_id,
                options,
                broker_timeout,
                max_record_bytes,
                idle_exit,
                metrics_port,
            } => {
                let Some(output_topic) = sinks.topic.clone() else {
                    bail!("a Kafka source needs sinks.topic, the topic to write predictions to");
                };
                if sinks.predictions.is_some() || sinks.report.is_some() || sinks.dead_letters.is_some() {
                    bail!("a Kafka source writes to sinks.topic (dead letters to TOPIC.dlq); remove sinks.predictions, sinks.report and sinks.dead_letters");
                }
                Job::Serve(ServeArgs {
                    brokers: brokers.clone(),
                    input_topic: topic.clone(),
                    output_topic,
                    columns,
                    likelihood: self.likelihood(),
                    predict_all_outputs: self.predict_all_outputs,
                    batch_size: *batch_size as usize,
                    batch_timeout_ms: *batch_timeout_ms,
                    workers,
                    cluster: cluster.clone(),
                    idle_exit: *idle_exit,
                    model,
                    checkpoint_dir: sinks.checkpoint_dir.clone(),
                    group_id: group_id.clone(),
                    kafka_options: options.clone().into_iter().collect(),
                    broker_timeout: *broker_timeout,
                    peer_timeout: crate::serve::PEER_TIMEOUT_SECONDS,
                    max_record_bytes: *max_record_bytes,
                    epochs_in_flight: self.epochs_in_flight.unwrap_or(crate::serve::EPOCHS_IN_FLIGHT),
                    max_staleness: self.max_staleness,
                    scoring: self.scoring.unwrap_or(Scoring::OnArrival),
                    learn_in_background: self.learn_in_background.unwrap_or(false),
                    metrics_port: *metrics_port,
                    metrics_host: std::net::IpAddr::from([127, 0, 0, 1]),
                    warm_start: None,
                    create_topics: false,
                    progress: crate::serve::PROGRESS_SECONDS,
                    quiet: false,
                })
            }
        })
    }
}

/// Runs a pipeline file's job; `stop` ends a Kafka job (SIGINT/SIGTERM).
pub fn run(job: &Job, stop: Arc<AtomicBool>) -> Result<String> {
    Ok(match job {
        Job::Replay(args) => match crate::replay::run(args, |_, _| {})? {
            Some(outcome) => {
                let r = outcome.report;
                format!(
                    "replayed {} records in {} epochs: prequential NLPD {:.4}; predictions in {}",
                    r.records,
                    r.epochs,
                    r.prequential_nlpd,
                    args.output.display()
                )
            }
            None => crate::replay::elsewhere(args),
        },
        Job::Serve(args) => {
            let s = crate::serve::run(args, stop)?;
            format!(
                "served {} records, {} predictions, {} dead letters",
                s.records, s.predictions, s.dead_letters
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The job of a pipeline file holding `toml`, no flags given.
    fn job_of(toml: &str) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, toml).unwrap();
        let config = PipelineConfig::read(&path).unwrap();
        config
            .job(None, &ClusterArgs::default(), &ModelArgs::default())
            .unwrap()
    }

    #[test]
    fn the_documented_pipeline_file_reads_and_flags_override_it() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/pipeline.toml");
        let config = PipelineConfig::read(&path).unwrap();
        let flags = ModelArgs {
            inducing: Some(7),
            ..ModelArgs::default()
        };
        let Job::Replay(args) = config.job(Some(3), &ClusterArgs::default(), &flags).unwrap() else {
            panic!("a Parquet source is a replay");
        };
        assert_eq!((args.workers, args.batch_size, args.model.inducing), (3, 1000, Some(7)));
        assert_eq!(args.output, PathBuf::from("predictions.parquet"));
    }

    /// A multi-output pipeline file reaches replay and serve with its
    /// latents and whether every output is predicted.
    #[test]
    fn a_multi_output_pipeline_file_passes_its_outputs_on() {
        let parquet = "likelihood = \"gaussian,bernoulli\"\nlatents = 2\npredict_all_outputs = true\n\
                       [source.parquet]\npath = \"a\"\n[sinks]\npredictions = \"p.parquet\"\n";
        let Job::Replay(args) = job_of(parquet) else {
            panic!("a Parquet source is a replay");
        };
        assert_eq!(
            (
                args.likelihood.spec.as_str(),
                args.likelihood.latents,
                args.predict_all_outputs
            ),
            ("gaussian,bernoulli", Some(2), true)
        );
        let kafka = "likelihood = \"gaussian,bernoulli\"\n[source.kafka]\nbrokers = \"b\"\ntopic = \"in\"\n\
                     [sinks]\ntopic = \"out\"\n";
        let Job::Serve(args) = job_of(kafka) else {
            panic!("a Kafka source is a serve");
        };
        assert_eq!((args.likelihood.latents, args.predict_all_outputs), (None, false));
    }

    /// A pipeline file's `[columns]` reach replay and serve; the column
    /// flags override them one by one.
    #[test]
    fn a_pipeline_files_columns_pass_on_and_flags_override_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        let text = "likelihood = \"gaussian\"\n[source.parquet]\npath = \"a.csv\"\n\
                    [columns]\nid = \"key\"\nfeatures = [\"a\", \"b\"]\ntarget = \"target\"\ntime_column = \"when\"\n\
                    [sinks]\npredictions = \"p.parquet\"\n";
        std::fs::write(&path, text).unwrap();
        let flags = ColumnArgs {
            target: Some("t2".into()),
            ..ColumnArgs::default()
        };
        let config = PipelineConfig::read(&path).unwrap().with_columns(&flags);
        let Job::Replay(args) = config
            .job(None, &ClusterArgs::default(), &ModelArgs::default())
            .unwrap()
        else {
            panic!("a Parquet source is a replay");
        };
        let expected = ColumnArgs {
            id: Some("key".into()),
            features: Some("a,b".into()),
            target: Some("t2".into()),
            output_column: None,
            time_column: Some("when".into()),
        };
        assert_eq!(args.columns, expected);
        std::fs::write(&path, text.replace("target = ", "label = ")).unwrap();
        let err = PipelineConfig::read(&path).unwrap_err().to_string();
        assert!(err.contains("label") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn mistakes_in_the_file_are_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        let cases = [
            (
                "likelihood = \"gaussian\"\n[source.parquet]\npath = \"a\"\n[model]\ninducin = 3\n",
                "inducin",
            ),
            ("likelihood = \"gaussian\"\n", "source"),
            (
                "likelihood = \"gaussian\"\n[source.parquet]\npath = \"a\"\n",
                "sinks.predictions",
            ),
        ];
        for (text, needle) in cases {
            std::fs::write(&path, text).unwrap();
            let err = PipelineConfig::read(&path)
                .and_then(|c| c.job(None, &ClusterArgs::default(), &ModelArgs::default()).map(|_| ()))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle) && !err.contains('\n'), "{err:?}");
        }
    }
}
