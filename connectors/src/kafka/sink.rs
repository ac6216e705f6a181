//! Predictions and dead letters to Kafka topics, each message counted
//! against its epoch until the broker acknowledges it, so a caller can ask
//! whether an epoch is delivered without waiting (or flush and wait).
//!
//! Output is at least once: after a crash, the epochs since the last
//! checkpoint are scored and sent again. Predictions are keyed by record id,
//! so a compacted topic (or a consumer keeping the last value per key)
//! sees each id once.

use std::collections::BTreeMap;
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

/// Counts deliveries that failed, keeping the first reason, and the
/// messages of each epoch the broker has not acknowledged yet.
#[derive(Default)]
struct DeliveryReport {
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    unacknowledged: Mutex<BTreeMap<u64, u64>>,
}

impl DeliveryReport {
    fn sending(&self, epoch: u64) {
        *self.unacknowledged_map().entry(epoch).or_default() += 1;
    }

    /// A message of `epoch` is acknowledged, failed, or was never queued.
    fn settled(&self, epoch: u64) {
        let mut waiting = self.unacknowledged_map();
        if let Some(n) = waiting.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&epoch);
            }
        }
    }

    /// Whether every message of the epochs before `epoch` is settled.
    fn settled_before(&self, epoch: u64) -> bool {
        self.unacknowledged_map()
            .first_key_value()
            .is_none_or(|(e, _)| *e >= epoch)
    }

    fn unacknowledged_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, u64>> {
        self.unacknowledged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ClientContext for DeliveryReport {}

impl ProducerContext for DeliveryReport {
    /// The epoch the message belongs to.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, epoch: usize) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut first) = self.first_error.lock() {
                first.get_or_insert_with(|| e.to_string());
            }
        }
        self.settled(epoch as u64);
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

    /// Queue one message of `epoch`; when the local queue is full, serve
    /// deliveries until there is room (bounded by the timeout).
    fn send(&self, key: &str, payload: &str, epoch: u64) -> Result<(), KafkaError> {
        let report = self.producer.context();
        report.sending(epoch);
        let sent = self.queue(key, payload, epoch);
        if sent.is_err() {
            report.settled(epoch);
        }
        sent
    }

    fn queue(&self, key: &str, payload: &str, epoch: u64) -> Result<(), KafkaError> {
        let deadline = Instant::now() + self.conn.timeout();
        let mut record = BaseRecord::with_opaque_to(&self.topic, epoch as usize)
            .key(key)
            .payload(payload);
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

    /// Without waiting: whether every message of the epochs before `epoch`
    /// is delivered; an error says how many messages were not.
    fn delivered_before(&self, epoch: u64) -> Result<bool, KafkaError> {
        self.producer.poll(Duration::ZERO);
        self.failures()?;
        Ok(self.producer.context().settled_before(epoch))
    }

    /// Wait until everything sent so far is delivered; an error says how
    /// many messages were not.
    fn flush(&self) -> Result<(), KafkaError> {
        // Deliveries time out after `timeout`; give them that long and a little more.
        let flushed = self.producer.flush(self.conn.timeout() + Duration::from_secs(2));
        self.failures()?;
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

    /// The deliveries that failed since the last call, as an error.
    fn failures(&self) -> Result<(), KafkaError> {
        let report = self.producer.context();
        let failed = report.failed.swap(0, Ordering::Relaxed);
        let first = report.first_error.lock().ok().and_then(|mut f| f.take());
        match failed {
            0 => Ok(()),
            _ => Err(KafkaError::Delivery {
                topic: self.topic.clone(),
                failed,
                detail: first.unwrap_or_default(),
            }),
        }
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

    /// Queue predictions, each counted against its epoch; before
    /// checkpointing an epoch, see [`delivered_before`](Self::delivered_before)
    /// or [`flush`](Self::flush).
    pub fn send(&self, predictions: &[Prediction]) -> Result<(), KafkaError> {
        for p in predictions {
            self.inner.send(&p.id.to_string(), &prediction_json(p), p.epoch)?;
        }
        Ok(())
    }

    /// Without waiting: whether the broker acknowledged every prediction of
    /// the epochs before `epoch`, or which failed.
    pub fn delivered_before(&self, epoch: u64) -> Result<bool, KafkaError> {
        self.inner.delivered_before(epoch)
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
        self.inner.send(key, payload, 0)
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

    /// Queues dead letters of `epoch`; before checkpointing the epoch, see
    /// [`delivered_before`](Self::delivered_before) or [`flush`](Self::flush).
    pub fn send(&self, dead_letters: &[DeadLetter], epoch: u64) -> Result<(), KafkaError> {
        for d in dead_letters {
            let message = DeadLetterMessage {
                origin: &d.origin,
                kind: d.reason.kind(),
                reason: d.reason_text(),
                payload: &d.payload,
            };
            let json = serde_json::to_string(&message).unwrap_or_default();
            self.inner.send(&d.origin.to_string(), &json, epoch)?;
        }
        Ok(())
    }

    /// Without waiting: whether the broker acknowledged every dead letter of
    /// the epochs before `epoch`, or which failed.
    pub fn delivered_before(&self, epoch: u64) -> Result<bool, KafkaError> {
        self.inner.delivered_before(epoch)
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
    fn an_epoch_is_delivered_once_every_message_of_it_and_before_it_is_settled() {
        let report = DeliveryReport::default();
        assert!(report.settled_before(u64::MAX), "nothing sent, nothing awaited");
        for epoch in [3, 3, 5] {
            report.sending(epoch);
        }
        assert!(report.settled_before(3) && !report.settled_before(4));
        report.settled(3);
        assert!(!report.settled_before(4), "one message of epoch 3 is still out");
        report.settled(3);
        assert!(report.settled_before(5) && !report.settled_before(6));
        report.settled(5);
        assert!(report.settled_before(u64::MAX));
    }

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
