//! Every message of a topic from its first offset, all partitions (what
//! `dualgp tail` prints): assigned, never a group member, nothing committed.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::admin::topic_partitions;
use super::{KafkaConnection, KafkaError};

/// A reader of one topic's messages, from the start of every partition.
pub struct TopicReader {
    consumer: BaseConsumer,
    conn: KafkaConnection,
    topic: String,
}

impl TopicReader {
    /// Reads `topic` from offset 0 of each partition, waiting up to the
    /// connection's timeout for the broker and the topic. (From offset 0,
    /// not from "the earliest": tansu 0.6 answers the latter with the batch
    /// it stored first, which need not be the lowest.)
    pub fn open(conn: &KafkaConnection, topic: &str) -> Result<Self, KafkaError> {
        let partitions = topic_partitions(conn, topic)?;
        let mut config = conn.client_config();
        config
            .set("group.id", "dualgp-tail")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest");
        let consumer: BaseConsumer = config.create().map_err(conn.client_error())?;
        let mut list = TopicPartitionList::new();
        for p in partitions {
            list.add_partition_offset(topic, p, Offset::Offset(0))
                .map_err(conn.operation(format!("assigning `{topic}`")))?;
        }
        consumer
            .assign(&list)
            .map_err(conn.operation(format!("assigning `{topic}`")))?;
        Ok(TopicReader {
            consumer,
            conn: conn.clone(),
            topic: topic.into(),
        })
    }

    /// The next message's payload (as text, lossily), waiting up to `wait`;
    /// `None` when none came.
    pub fn next(&self, wait: Duration) -> Result<Option<String>, KafkaError> {
        match self.consumer.poll(wait) {
            None => Ok(None),
            Some(Ok(message)) => Ok(Some(
                String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
            )),
            Some(Err(e)) => Err(self.conn.operation(format!("reading `{}`", self.topic))(e)),
        }
    }
}
