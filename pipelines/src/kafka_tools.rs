//! `dualgp produce` and `dualgp tail`: put a file's records on a topic as
//! the JSON messages `serve` reads, and print a topic's messages, so that
//! trying `serve` needs no other Kafka client.

use std::path::PathBuf;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dualgp_connectors::kafka::{create_topic, topic_partitions, MessageProducer, TopicReader};
use dualgp_connectors::{Column, KafkaConnection, Table};
use serde_json::{Map, Value};

use crate::column_args::ColumnArgs;

/// The broker connection flags of `produce` and `tail`.
#[derive(Debug, Clone, Args)]
pub struct ConnectionArgs {
    /// `host:port[,host:port…]`
    #[arg(long)]
    pub brokers: String,
    /// A librdkafka setting passed through (TLS, SASL): `KEY=VALUE`, repeatable.
    #[arg(long = "kafka-option", value_parser = key_value)]
    pub kafka_options: Vec<(String, String)>,
    /// The longest wait for the broker before a clear error.
    #[arg(long, default_value_t = 30.0)]
    pub broker_timeout: f64,
}

impl ConnectionArgs {
    /// The connection these flags describe (nothing is contacted yet).
    pub fn connection(&self) -> Result<KafkaConnection> {
        if !self.broker_timeout.is_finite() || self.broker_timeout <= 0.0 {
            bail!(
                "--broker-timeout {} must be a positive number of seconds",
                self.broker_timeout
            );
        }
        let conn = KafkaConnection::new(&self.brokers).with_timeout(Duration::from_secs_f64(self.broker_timeout));
        Ok(self
            .kafka_options
            .iter()
            .fold(conn, |conn, (k, v)| conn.with_option(k, v)))
    }
}

/// `KEY=VALUE`, trimmed.
pub(crate) fn key_value(s: &str) -> std::result::Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

/// `dualgp produce`'s flags.
#[derive(Debug, Clone, Args)]
pub struct ProduceArgs {
    /// The broker.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// The topic to write to (created with one partition if it does not exist).
    #[arg(long)]
    pub topic: String,
    /// A Parquet or CSV file of records.
    #[arg(long)]
    pub data: PathBuf,
    /// Which columns are the id, the features, the target and the output;
    /// the messages carry them under the same names.
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// Records per second (default: as fast as the broker takes them).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Only the first N records.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Leave the target out: records to be scored, not learned.
    #[arg(long)]
    pub unlabelled: bool,
}

/// Writes the records of `args.data` to the topic as JSON messages keyed by
/// id, paced at `args.rate`; the number written.
pub fn produce(args: &ProduceArgs) -> Result<usize> {
    if let Some(rate) = args.rate.filter(|r| !r.is_finite() || *r <= 0.0) {
        bail!("--rate {rate} must be a positive number of records a second");
    }
    let conn = args.connection.connection()?;
    let mut spec = args.columns.spec()?;
    let target = spec.label.name().unwrap_or("y").to_owned();
    // A file without the target gives records to be scored.
    spec.label = Column::IfPresent(target.clone());
    let output = spec.output.name().unwrap_or("output").to_owned();
    let table = Table::read(&args.data, &spec)?;
    if topic_partitions(&conn.clone().with_timeout(Duration::from_secs(2)), &args.topic).is_err() {
        create_topic(&conn, &args.topic, 1).with_context(|| format!("cannot create topic `{}`", args.topic))?;
    }
    let producer = MessageProducer::new(&conn, &args.topic)?;
    let n = args.limit.map_or(table.ids.len(), |limit| limit.min(table.ids.len()));
    let start = Instant::now();
    for i in 0..n {
        if let Some(rate) = args.rate {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            sleep(due.saturating_duration_since(Instant::now()));
        }
        let mut message = Map::new();
        message.insert(spec.id.clone(), table.ids[i].into());
        for (j, name) in table.feature_names.iter().enumerate() {
            message.insert(name.clone(), table.features[(i, j)].into());
        }
        if let (Some(labels), false) = (&table.labels, args.unlabelled) {
            message.insert(target.clone(), labels[i].into());
        }
        if let Some(outputs) = &table.outputs {
            message.insert(output.clone(), outputs[i].into());
        }
        producer.send(&table.ids[i].to_string(), &Value::Object(message).to_string())?;
    }
    producer.flush()?;
    Ok(n)
}

/// `dualgp tail`'s flags.
#[derive(Debug, Clone, Args)]
pub struct TailArgs {
    /// The broker.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// The topic to read, from its first message.
    #[arg(long)]
    pub topic: String,
    /// Stop after this many messages.
    #[arg(long, value_name = "N")]
    pub max: Option<usize>,
    /// Stop once no message has come for this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub idle_exit: f64,
}

impl TailArgs {
    /// The flags checked, before anything is contacted: the connection.
    pub fn checked_connection(&self) -> Result<KafkaConnection> {
        if !self.idle_exit.is_finite() || self.idle_exit <= 0.0 {
            bail!("--idle-exit {} must be a positive number of seconds", self.idle_exit);
        }
        self.connection.connection()
    }
}

/// Calls `each` with every message of the topic, from the first, until
/// `args.max` or `args.idle_exit` says stop; the number of messages.
pub fn tail(args: &TailArgs, mut each: impl FnMut(&str)) -> Result<usize> {
    let reader = TopicReader::open(&args.checked_connection()?, &args.topic)?;
    let idle = Duration::from_secs_f64(args.idle_exit);
    let (mut printed, mut last) = (0, Instant::now());
    while args.max.is_none_or(|max| printed < max) && last.elapsed() < idle {
        if let Some(message) = reader.next(Duration::from_millis(200).min(idle))? {
            each(&message);
            printed += 1;
            last = Instant::now();
        }
    }
    Ok(printed)
}
