//! Topic metadata and creation, each with a bounded wait.

use std::ops::ControlFlow;
use std::thread::sleep;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{Client, ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use super::{KafkaConnection, KafkaError};

/// The partition ids of `topic`, sorted, waiting up to the connection's
/// timeout for the broker to answer and the topic to exist.
pub fn topic_partitions(conn: &KafkaConnection, topic: &str) -> Result<Vec<i32>, KafkaError> {
    conn.check()?;
    let consumer: BaseConsumer = conn.client_config().create().map_err(conn.client_error())?;
    wait_for_partitions(consumer.client(), conn, topic)
}

/// What a wait for a topic's partitions is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting<'a> {
    /// The broker has not answered (yet): why, as librdkafka says it.
    Broker {
        /// librdkafka's last word.
        detail: &'a str,
    },
    /// The broker answers, but the topic does not exist (or has no partitions).
    Topic,
}

/// [`topic_partitions`], telling `noting` after every attempt that found
/// nothing (the first within half a second) what it is waiting for; `Break`
/// gives up at once with the error the wait would end with.
pub fn topic_partitions_noting(
    conn: &KafkaConnection,
    topic: &str,
    noting: impl FnMut(Waiting<'_>) -> ControlFlow<()>,
) -> Result<Vec<i32>, KafkaError> {
    conn.check()?;
    let consumer: BaseConsumer = conn.client_config().create().map_err(conn.client_error())?;
    wait_noting(consumer.client(), conn, topic, Duration::from_millis(500), noting)
}

pub(crate) fn wait_for_partitions<C: ClientContext>(
    client: &Client<C>,
    conn: &KafkaConnection,
    topic: &str,
) -> Result<Vec<i32>, KafkaError> {
    wait_noting(client, conn, topic, Duration::from_secs(2), |_| {
        ControlFlow::Continue(())
    })
}

/// The wait: the first metadata request waits at most `first_ask` for an
/// answer, later ones up to two seconds.
fn wait_noting<C: ClientContext>(
    client: &Client<C>,
    conn: &KafkaConnection,
    topic: &str,
    first_ask: Duration,
    mut noting: impl FnMut(Waiting<'_>) -> ControlFlow<()>,
) -> Result<Vec<i32>, KafkaError> {
    let start = Instant::now();
    let mut deadline = start + conn.timeout();
    let mut last_error = "no answer yet".to_owned();
    let mut topic_missing = false;
    let mut ask = first_ask;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(if topic_missing {
                KafkaError::TopicMissing {
                    topic: topic.into(),
                    brokers: conn.brokers.clone(),
                    waited: start.elapsed(),
                }
            } else {
                KafkaError::BrokerUnavailable {
                    brokers: conn.brokers.clone(),
                    waited: start.elapsed(),
                    detail: last_error,
                }
            });
        }
        // Whether the broker answered this time (`topic_missing` keeps that it once did).
        let answered = match client.fetch_metadata(Some(topic), remaining.min(ask)) {
            Ok(metadata) => match metadata.topics().iter().find(|t| t.name() == topic) {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                    let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
                    ids.sort_unstable();
                    return Ok(ids);
                }
                found => {
                    topic_missing = true;
                    last_error = match found.and_then(|t| t.error()) {
                        Some(e) => format!("topic `{topic}`: {}", RDKafkaErrorCode::from(e)),
                        None => format!("topic `{topic}` has no partitions"),
                    };
                    true
                }
            },
            Err(e) => {
                last_error = e.to_string();
                false
            }
        };
        ask = Duration::from_secs(2);
        let waiting = match answered {
            true => Waiting::Topic,
            false => Waiting::Broker { detail: &last_error },
        };
        if noting(waiting).is_break() {
            // Given up now: said as if the wait had run out.
            deadline = Instant::now();
            continue;
        }
        sleep(Duration::from_millis(200).min(remaining));
    }
}

/// Create `topic` with `partitions` partitions (replication 1) unless it
/// exists, and wait until its metadata shows it.
pub fn create_topic(conn: &KafkaConnection, topic: &str, partitions: i32) -> Result<(), KafkaError> {
    conn.check()?;
    if partitions < 1 {
        return Err(KafkaError::Config(format!(
            "topic `{topic}` needs at least 1 partition"
        )));
    }
    let admin: AdminClient<DefaultClientContext> = conn.client_config().create().map_err(conn.client_error())?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new()
        .request_timeout(Some(conn.timeout()))
        .operation_timeout(Some(conn.timeout()));
    let results = futures_executor::block_on(admin.create_topics([&new], &options))
        .map_err(conn.operation(format!("creating topic `{topic}`")))?;
    for result in results {
        match result {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(KafkaError::Operation {
                    what: format!("creating topic `{topic}`"),
                    brokers: conn.brokers.clone(),
                    source: Box::new(rdkafka::error::KafkaError::AdminOp(code)),
                })
            }
        }
    }
    wait_for_partitions(admin.inner(), conn, topic).map(|_| ())
}
