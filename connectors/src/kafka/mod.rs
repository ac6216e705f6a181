//! Kafka sources and sinks (rdkafka with its bundled librdkafka), free of
//! timely types: a source operator drives a [`KafkaSource`] per worker.
//!
//! - [`KafkaSource`]: this worker's share of a topic's partitions (assigned,
//!   no consumer-group join), cut into epochs by record count and time, with
//!   offsets in a [`KafkaPosition`] and an explicit [`KafkaSource::commit`].
//! - [`PredictionProducer`]: predictions as JSON keyed by record id.
//! - [`DeadLetterProducer`]: dead letters to `IN.dlq` with their reasons.
//! - [`MessageProducer`] and [`TopicReader`]: any keyed messages to a topic,
//!   and every message of a topic from its start (`dualgp produce`, `tail`).
//!
//! TLS and SASL settings go through [`KafkaConnection::options`] as
//! librdkafka keys (`security.protocol`, `ssl.ca.location`,
//! `sasl.mechanisms`, `sasl.username`, …). Built with OpenSSL: SASL PLAIN,
//! SCRAM and OAUTHBEARER work; GSSAPI (Kerberos) is not built in.

mod admin;
mod message;
mod sink;
mod source;
mod tail;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use serde::{Deserialize, Serialize};

pub use admin::{create_topic, topic_partitions, topic_partitions_noting, Waiting};
pub use message::{MessageDecoder, MessageFormat, MessageOrigin, MAX_RECORD_BYTES};
pub use sink::{dlq_topic, prediction_json, DeadLetterProducer, MessageProducer, PredictionProducer};
pub use source::{KafkaPosition, KafkaSource, KafkaSourceConfig, StartOffset};
pub use tail::TopicReader;

/// Why a Kafka source or sink cannot go on. Each message says what to check.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// librdkafka refused the connection options.
    #[error("cannot create a Kafka client for {brokers}: {source}; check the connection options")]
    Client {
        /// The bootstrap brokers.
        brokers: String,
        /// What librdkafka said.
        source: Box<rdkafka::error::KafkaError>,
    },
    /// No broker answered within the connection's timeout.
    #[error("no answer from the Kafka broker(s) at {brokers} for {:.1} s ({detail}); check that they run and are reachable", .waited.as_secs_f64())]
    BrokerUnavailable {
        /// The bootstrap brokers.
        brokers: String,
        /// How long it waited.
        waited: Duration,
        /// librdkafka's last word.
        detail: String,
    },
    /// The broker answers, but not with the topic.
    #[error("topic `{topic}` does not exist on {brokers} (waited {:.1} s); create it first", .waited.as_secs_f64())]
    TopicMissing {
        /// The topic.
        topic: String,
        /// The bootstrap brokers.
        brokers: String,
        /// How long it waited.
        waited: Duration,
    },
    /// A client operation (subscribe, commit, create a topic) failed.
    #[error("{what} on {brokers} failed: {source}")]
    Operation {
        /// The operation.
        what: String,
        /// The bootstrap brokers.
        brokers: String,
        /// What librdkafka said.
        source: Box<rdkafka::error::KafkaError>,
    },
    /// Messages the broker did not acknowledge by the end of a flush.
    #[error("{failed} message(s) to `{topic}` were not delivered (first error: {detail})")]
    Delivery {
        /// The topic.
        topic: String,
        /// Messages not delivered.
        failed: u64,
        /// The first delivery error.
        detail: String,
    },
    /// Settings that cannot work, in a sentence.
    #[error("invalid Kafka configuration: {0}")]
    Config(String),
}

/// How to reach the brokers.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConnection {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// librdkafka settings passed through as they are (TLS, SASL, tuning).
    pub options: BTreeMap<String, String>,
    /// The longest wait for a broker (metadata, delivery, an outage)
    /// before a clear error.
    pub timeout_ms: u64,
}

impl Default for KafkaConnection {
    fn default() -> Self {
        KafkaConnection {
            brokers: "127.0.0.1:9092".into(),
            options: BTreeMap::new(),
            timeout_ms: 30_000,
        }
    }
}

/// Secrets stay out of logs.
impl fmt::Debug for KafkaConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options: BTreeMap<&str, &str> = self
            .options
            .iter()
            .map(|(k, v)| {
                let secret = k.contains("password") || k.contains("secret") || k.ends_with(".pem");
                (k.as_str(), if secret { "<redacted>" } else { v.as_str() })
            })
            .collect();
        f.debug_struct("KafkaConnection")
            .field("brokers", &self.brokers)
            .field("options", &options)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl KafkaConnection {
    /// A connection to the comma-separated bootstrap `brokers`, default options.
    pub fn new(brokers: impl Into<String>) -> Self {
        KafkaConnection {
            brokers: brokers.into(),
            ..Default::default()
        }
    }

    /// Set one librdkafka option (e.g. `security.protocol` = `SASL_SSL`).
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }

    /// How long to wait for the brokers (and a topic) before giving up.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        self
    }

    /// How long it waits for the brokers.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub(crate) fn check(&self) -> Result<(), KafkaError> {
        if self.brokers.trim().is_empty() {
            return Err(KafkaError::Config("no brokers given (host:port)".into()));
        }
        if self.timeout_ms == 0 {
            return Err(KafkaError::Config("timeout_ms must be above 0".into()));
        }
        Ok(())
    }

    /// A client configuration: the brokers, quick reconnects (an outage
    /// should end as soon as the broker is back), then the caller's options.
    pub(crate) fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("reconnect.backoff.ms", "100")
            .set("reconnect.backoff.max.ms", "1000")
            .set("socket.timeout.ms", self.timeout_ms.clamp(10, 300_000).to_string());
        for (k, v) in &self.options {
            c.set(k, v);
        }
        c
    }

    pub(crate) fn client_error(&self) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaError {
        let brokers = self.brokers.clone();
        move |source| KafkaError::Client {
            brokers,
            source: Box::new(source),
        }
    }

    pub(crate) fn operation(&self, what: impl Into<String>) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaError {
        let (what, brokers) = (what.into(), self.brokers.clone());
        move |source| KafkaError::Operation {
            what,
            brokers,
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let conn = KafkaConnection::new("b:9093")
            .with_option("security.protocol", "SASL_SSL")
            .with_option("sasl.password", "hunter2")
            .with_option("ssl.key.password", "k3y");
        let text = format!("{conn:?}");
        assert!(text.contains("SASL_SSL") && text.contains("b:9093"), "{text}");
        assert!(!text.contains("hunter2") && !text.contains("k3y"), "{text}");
        let json: KafkaConnection =
            serde_json::from_str(r#"{"brokers": "h:1", "options": {"sasl.mechanisms": "PLAIN"}}"#).unwrap();
        assert_eq!(json.timeout_ms, 30_000);
        assert_eq!(json.client_config().get("sasl.mechanisms"), Some("PLAIN"));
        assert!(KafkaConnection::new(" ").check().is_err());
    }
}
