//! Predictions and dead letters to Kafka topics, with delivery checked on flush.
//!
//! Output is at least once: after a crash, the epochs since the last
//! checkpoint are scored and sent again. Predictions are keyed by record id,
//! so a compacted topic (or a consumer keeping the last value per key)
//! sees each id once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use dualgp_operators::dataflow::Prediction;
use dualgp_operators::model::Predictive;
use rdkafka::client::ClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use serde::Serialize;

use super::{KafkaConnection, KafkaError};
use crate::dead_letter::{DeadLetter, Origin, ReasonKind};

/// The dead-letter topic of input topic `input`: `input.dlq`.
pub fn dlq_topic(input: &str) -> String {
    format!("{input}.dlq")
}

/// A prediction as the `dualgp serve` output message:
/// `{"id":…, "epoch":…, "model_epoch":…, "mean":…, "var":…}` or with `"p":[…]`
/// for classes (`model_epoch` is null before the first update). A
/// multi-output model's predictions add `"output": d`, the output the
/// predictive is of, and with every output asked for, `"outputs": [{…}, …]`:
/// each output's predictive (`mean`/`var` or `p`) in output order.
pub fn prediction_json(p: &Prediction) -> String {
    let mut value = serde_json::json!({"id": p.id, "epoch": p.epoch, "model_epoch": p.model_epoch});
    put_predictive(&mut value, &p.predictive);
    if let Some(d) = p.output {
        value["output"] = d.into();
    }
    if !p.all_outputs.is_empty() {
        let every: Vec<serde_json::Value> = p
            .all_outputs
            .iter()
            .map(|predictive| {
                let mut one = serde_json::json!({});
                put_predictive(&mut one, predictive);
                one
            })
            .collect();
        value["outputs"] = every.into();
    }
    value.to_string()
}

/// `mean` and `var`, or `p`, into a JSON object.
fn put_predictive(value: &mut serde_json::Value, predictive: &Predictive) {
    match predictive {
        Predictive::Moments { mean, var } => {
            value["mean"] = (*mean).into();
            value["var"] = (*var).into();
        }
        Predictive::Classes(probs) => value["p"] = probs.clone().into(),
    }
}

/// A dead letter as a message on the dead-letter topic.
#[derive(Serialize)]
struct DeadLetterMessage<'a> {
    origin: &'a Origin,
    kind: ReasonKind,
    reason: String,
    payload: &'a str,
}

/// Counts deliveries that failed, keeping the first reason.
#[derive(Default)]
struct DeliveryReport {
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryReport {}

impl ProducerContext for DeliveryReport {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut first) = self.first_error.lock() {
                first.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// A producer to one topic.
struct TopicProducer {
    producer: BaseProducer<DeliveryReport>,
    topic: String,
    conn: KafkaConnection,
}

impl TopicProducer {
    fn new(conn: &KafkaConnection, topic: &str) -> Result<Self, KafkaError> {
        conn.check()?;
        if topic.is_empty() {
            return Err(KafkaError::Config("no output topic given".into()));
        }
        let mut config = conn.client_config();
        // A message not delivered within the timeout is reported, not retried forever.
        config.set("message.timeout.ms", conn.timeout_ms.to_string());
        for (k, v) in &conn.options {
            config.set(k, v);
        }
        let producer = config
            .create_with_context(DeliveryReport::default())
            .map_err(conn.client_error())?;
        Ok(TopicProducer {
            producer,
            topic: topic.into(),
            conn: conn.clone(),
        })
    }

    /// Queue one message; when the local queue is full, serve deliveries
    /// until there is room (bounded by the timeout).
    fn send(&self, key: &str, payload: &str) -> Result<(), KafkaError> {
        let deadline = Instant::now() + self.conn.timeout();
        let mut record = BaseRecord::to(&self.topic).key(key).payload(payload);
        loop {
            match self.producer.send(record) {
                Ok(()) => {
                    self.producer.poll(Duration::ZERO);
                    return Ok(());
                }
                Err((e, back)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    if Instant::now() >= deadline {
                        return Err(KafkaError::BrokerUnavailable {
                            brokers: self.conn.brokers.clone(),
                            waited: self.conn.timeout(),
                            detail: format!("the send queue to `{}` stayed full", self.topic),
                        });
                    }
                    record = back;
                    self.producer.poll(Duration::from_millis(50));
                    sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(self.conn.operation(format!("sending to `{}`", self.topic))(e)),
            }
        }
    }

    /// Wait until everything sent so far is delivered; an error says how
    /// many messages were not.
    fn flush(&self) -> Result<(), KafkaError> {
        // Deliveries time out after `timeout`; give them that long and a little more.
        let flushed = self.producer.flush(self.conn.timeout() + Duration::from_secs(2));
        let report = self.producer.context();
        let failed = report.failed.swap(0, Ordering::Relaxed);
        let first = report.first_error.lock().ok().and_then(|mut f| f.take());
        if failed > 0 {
            return Err(KafkaError::Delivery {
                topic: self.topic.clone(),
                failed,
                detail: first.unwrap_or_default(),
            });
        }
        flushed.map_err(|e| KafkaError::BrokerUnavailable {
            brokers: self.conn.brokers.clone(),
            waited: self.conn.timeout(),
            detail: format!(
                "{} message(s) to `{}` still in flight: {e}",
                self.producer.in_flight_count(),
                self.topic
            ),
        })
    }
}

/// Predictions to a topic as JSON, keyed by record id.
pub struct PredictionProducer {
    inner: TopicProducer,
}

impl PredictionProducer {
    /// A producer to `topic`.
    pub fn new(conn: &KafkaConnection, topic: &str) -> Result<Self, KafkaError> {
        Ok(PredictionProducer {
            inner: TopicProducer::new(conn, topic)?,
        })
    }

    /// Queue predictions; call [`flush`](Self::flush) before checkpointing the epoch.
    pub fn send(&self, predictions: &[Prediction]) -> Result<(), KafkaError> {
        for p in predictions {
            self.inner.send(&p.id.to_string(), &prediction_json(p))?;
        }
        Ok(())
    }

    /// Waits until the broker has every queued prediction, or says which failed.
    pub fn flush(&self) -> Result<(), KafkaError> {
        self.inner.flush()
    }
}

/// Any messages to a topic, keyed (what `dualgp produce` writes).
pub struct MessageProducer {
    inner: TopicProducer,
}

impl MessageProducer {
    /// A producer to `topic`.
    pub fn new(conn: &KafkaConnection, topic: &str) -> Result<Self, KafkaError> {
        Ok(MessageProducer {
            inner: TopicProducer::new(conn, topic)?,
        })
    }

    /// Queues one message (waiting, up to the timeout, while the queue is full).
    pub fn send(&self, key: &str, payload: &str) -> Result<(), KafkaError> {
        self.inner.send(key, payload)
    }

    /// Waits until the broker has every queued message, or says how many it has not.
    pub fn flush(&self) -> Result<(), KafkaError> {
        self.inner.flush()
    }
}

/// Dead letters to `IN.dlq` as JSON `{"origin", "kind", "reason", "payload"}`,
/// keyed by origin.
pub struct DeadLetterProducer {
    inner: TopicProducer,
}

impl DeadLetterProducer {
    /// A producer to the dead-letter topic of `input_topic`.
    pub fn new(conn: &KafkaConnection, input_topic: &str) -> Result<Self, KafkaError> {
        Ok(DeadLetterProducer {
            inner: TopicProducer::new(conn, &dlq_topic(input_topic))?,
        })
    }

    /// The dead-letter topic.
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Queues dead letters; call [`flush`](Self::flush) before checkpointing the epoch.
    pub fn send(&self, dead_letters: &[DeadLetter]) -> Result<(), KafkaError> {
        for d in dead_letters {
            let message = DeadLetterMessage {
                origin: &d.origin,
                kind: d.reason.kind(),
                reason: d.reason_text(),
                payload: &d.payload,
            };
            let json = serde_json::to_string(&message).unwrap_or_default();
            self.inner.send(&d.origin.to_string(), &json)?;
        }
        Ok(())
    }

    /// Waits until the broker has every queued dead letter, or says which failed.
    pub fn flush(&self) -> Result<(), KafkaError> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_follow_the_serve_contract() {
        let p = Prediction {
            id: 3,
            epoch: 7,
            model_epoch: Some(5),
            predictive: Predictive::Moments { mean: 0.5, var: 2.0 },
            log_density: None,
            output: None,
            all_outputs: Vec::new(),
        };
        let v: serde_json::Value = serde_json::from_str(&prediction_json(&p)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id": 3, "epoch": 7, "model_epoch": 5, "mean": 0.5, "var": 2.0})
        );
        let p = Prediction {
            id: -1,
            epoch: 0,
            model_epoch: None,
            predictive: Predictive::Classes(vec![0.25, 0.75]),
            log_density: None,
            output: None,
            all_outputs: Vec::new(),
        };
        let v: serde_json::Value = serde_json::from_str(&prediction_json(&p)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id": -1, "epoch": 0, "model_epoch": null, "p": [0.25, 0.75]})
        );
        // A multi-output model's: the output scored, and every output's on request.
        let gaussian = Predictive::Moments { mean: 1.5, var: 0.25 };
        let p = Prediction {
            output: Some(1),
            all_outputs: vec![gaussian, p.predictive.clone()],
            ..p
        };
        let v: serde_json::Value = serde_json::from_str(&prediction_json(&p)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id": -1, "epoch": 0, "model_epoch": null, "p": [0.25, 0.75], "output": 1,
                "outputs": [{"mean": 1.5, "var": 0.25}, {"p": [0.25, 0.75]}]})
        );
        assert_eq!(dlq_topic("in"), "in.dlq");
    }
}
