//! A worker's share of a Kafka topic, epoch by epoch.
//!
//! Partitions are dealt round-robin to workers and assigned directly (no
//! consumer-group join: joins are slow and rebalance under load). Each epoch
//! part ends after `epoch_records` records or `epoch_ms` milliseconds and
//! carries the offsets after it. The caller checkpoints, then calls
//! [`KafkaSource::commit`]; a restart resumes from the checkpointed
//! [`KafkaPosition`], so no record is lost (records after the checkpoint are
//! read again).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::thread::sleep;
use std::time::{Duration, Instant};

use dualgp_operators::dataflow::Record;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::admin::wait_for_partitions;
use super::message::{MessageDecoder, MessageFormat, MessageOrigin, MAX_RECORD_BYTES};
use super::{KafkaConnection, KafkaError};
use crate::dead_letter::{Counters, DeadLetter};
use crate::epoch::{EpochPart, WorkerShare};
use crate::mapping::ColumnMapping;

/// Where partitions start that a resume position does not name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartOffset {
    /// The group's committed offsets, else the earliest.
    #[default]
    Committed,
    /// The oldest message the broker keeps.
    Earliest,
    /// The next message to arrive.
    Latest,
}

/// How to read a topic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// How to reach the brokers.
    pub connection: KafkaConnection,
    /// The topic read.
    pub topic: String,
    /// The group offsets are committed under (never joined).
    pub group_id: String,
    /// Which fields make a record.
    pub mapping: ColumnMapping,
    /// How payloads are encoded.
    pub format: MessageFormat,
    /// An epoch part ends once it holds this many records (a multi-row
    /// Arrow message may take it past).
    pub epoch_records: usize,
    /// … or after this long, whichever comes first.
    pub epoch_ms: u64,
    /// Where partitions without a resume offset start.
    pub start: StartOffset,
    /// A message larger than this many bytes is a `too_large` dead letter,
    /// never parsed.
    pub max_record_bytes: usize,
}

impl Default for KafkaSourceConfig {
    fn default() -> Self {
        KafkaSourceConfig {
            connection: KafkaConnection::default(),
            topic: String::new(),
            group_id: "dualgp".into(),
            mapping: ColumnMapping::default(),
            format: MessageFormat::Auto,
            epoch_records: 1000,
            epoch_ms: 1000,
            start: StartOffset::Committed,
            max_record_bytes: MAX_RECORD_BYTES,
        }
    }
}

/// Where to resume: the next epoch number and, per partition, the next
/// offset to read. One worker's position names only its partitions;
/// [`KafkaPosition::merge`] makes the checkpoint of all workers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaPosition {
    /// The topic.
    pub topic: String,
    /// The first epoch not yet processed.
    pub next_epoch: u64,
    /// Per partition, the next offset to read.
    pub offsets: BTreeMap<i32, i64>,
}

impl KafkaPosition {
    /// The positions of all workers after the same epoch, as one: every
    /// partition's offset (the lowest, if named twice) and the lowest epoch.
    pub fn merge<'a>(positions: impl IntoIterator<Item = &'a KafkaPosition>) -> Option<KafkaPosition> {
        let mut merged: Option<KafkaPosition> = None;
        for p in positions {
            let m = merged.get_or_insert_with(|| KafkaPosition {
                topic: p.topic.clone(),
                next_epoch: p.next_epoch,
                offsets: BTreeMap::new(),
            });
            m.next_epoch = m.next_epoch.min(p.next_epoch);
            for (&partition, &offset) in &p.offsets {
                let o = m.offsets.entry(partition).or_insert(offset);
                *o = (*o).min(offset);
            }
        }
        merged
    }
}

/// How often an idle or failing source asks the broker whether it is there.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// The longest a read waits on the broker before it calls back (see
/// [`KafkaSource::next_epoch_streaming`]).
const POLL_SLICE: Duration = Duration::from_millis(1);

/// A worker's reader of its partitions of one topic.
pub struct KafkaSource {
    consumer: BaseConsumer,
    /// The newest commit sent: its epoch and offsets.
    sent: Option<(u64, KafkaPosition)>,
    config: KafkaSourceConfig,
    partitions: Vec<i32>,
    /// Next offset per partition, for those read from or resumed at.
    offsets: BTreeMap<i32, i64>,
    next_epoch: u64,
    decoder: MessageDecoder,
    /// The epoch being filled; kept across an error so nothing read is lost.
    records: Vec<Record>,
    dead_letters: Vec<DeadLetter>,
    counters: Counters,
    /// Since when the broker has not answered, and its last error.
    trouble: Option<(Instant, String)>,
    last_contact: Instant,
    last_probe: Instant,
}

impl KafkaSource {
    /// Connect, find the topic's partitions (bounded wait), take this
    /// worker's share and start each at `resume`'s offset, or by `config.start`.
    pub fn open(
        config: &KafkaSourceConfig,
        share: WorkerShare,
        resume: Option<&KafkaPosition>,
    ) -> Result<KafkaSource, KafkaError> {
        check(config, share, resume)?;
        let conn = &config.connection;
        let mut client = conn.client_config();
        client
            .set("group.id", &config.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // Records are scored on arrival: a fetch should not wait for more
            // (librdkafka's default is 500 ms; `--kafka-option` overrides).
            .set("fetch.wait.max.ms", "10")
            // Closing waits for commits still out up to the session timeout
            // (45 s by default); with a broker that is gone, the broker timeout is enough.
            .set(
                "session.timeout.ms",
                conn.timeout_ms.clamp(6_000, 3_600_000).to_string(),
            )
            .set(
                "auto.offset.reset",
                if config.start == StartOffset::Latest {
                    "latest"
                } else {
                    "earliest"
                },
            );
        for (k, v) in &conn.options {
            client.set(k, v);
        }
        let consumer: BaseConsumer = client.create().map_err(conn.client_error())?;
        let partitions: Vec<i32> = wait_for_partitions(consumer.client(), conn, &config.topic)?
            .into_iter()
            .filter(|&p| share.owns(p as usize))
            .collect();

        let mut offsets = BTreeMap::new();
        let mut assignment = TopicPartitionList::new();
        let committed = if config.start == StartOffset::Committed && !partitions.is_empty() {
            committed_offsets(&consumer, config, &partitions)?
        } else {
            BTreeMap::new()
        };
        for &p in &partitions {
            let resumed = resume.and_then(|r| r.offsets.get(&p)).copied();
            let start = match resumed.or_else(|| committed.get(&p).copied()) {
                Some(o) => {
                    offsets.insert(p, o);
                    Offset::Offset(o)
                }
                None if config.start == StartOffset::Latest => Offset::End,
                // Offset 0, not the broker's "earliest": tansu 0.6.0 names the
                // batch it stored first, which is not the lowest when producers
                // wrote at once. A broker without offset 0 any more resets to
                // its earliest (auto.offset.reset).
                None => Offset::Offset(0),
            };
            assignment
                .add_partition_offset(&config.topic, p, start)
                .map_err(conn.operation("assigning partitions"))?;
        }
        consumer
            .assign(&assignment)
            .map_err(conn.operation(format!("assigning partitions {partitions:?} of `{}`", config.topic)))?;

        let now = Instant::now();
        Ok(KafkaSource {
            consumer,
            sent: None,
            partitions,
            offsets,
            next_epoch: resume.map_or(0, |r| r.next_epoch),
            decoder: MessageDecoder::new(&config.mapping, config.format).with_max_bytes(config.max_record_bytes),
            config: config.clone(),
            records: Vec::new(),
            dead_letters: Vec::new(),
            counters: Counters::default(),
            trouble: None,
            last_contact: now,
            last_probe: now,
        })
    }

    /// While the broker does not answer: for how long, and why (as
    /// librdkafka says it); `None` while it does. A read gives up once this
    /// lasts the connection's timeout.
    pub fn broker_trouble(&self) -> Option<(Duration, &str)> {
        self.trouble
            .as_ref()
            .map(|(since, detail)| (since.elapsed(), detail.as_str()))
    }

    /// This worker's partitions.
    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }

    /// Records decoded and rejected so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The feature names, once the first record has fixed them (or as configured).
    pub fn feature_names(&self) -> Option<&[String]> {
        self.decoder.feature_names()
    }

    /// Where this worker stands: the next epoch and offsets.
    pub fn position(&self) -> KafkaPosition {
        KafkaPosition {
            topic: self.config.topic.clone(),
            next_epoch: self.next_epoch,
            offsets: self.offsets.clone(),
        }
    }

    /// The next epoch part: up to `epoch_records` records, or what came in
    /// `epoch_ms` (possibly nothing). An error (the broker gone for longer
    /// than the connection's timeout) keeps what was read: call again to
    /// go on once the broker is back, or reopen from the last checkpoint.
    pub fn next_epoch(&mut self) -> Result<EpochPart<KafkaPosition>, KafkaError> {
        self.next_epoch_streaming(|_| ControlFlow::Continue(()))
    }

    /// The epoch being read.
    pub fn epoch(&self) -> u64 {
        self.next_epoch
    }

    /// [`next_epoch`](Self::next_epoch), handing records to `arrived` as they
    /// come (whenever no further message is waiting), for scoring on
    /// arrival; what `arrived` drains is not in the returned part. `arrived`
    /// is also called, with nothing, at least every few milliseconds while
    /// the partitions are quiet: a dataflow worker steps there, so that
    /// work that waits for it (the learner's questions, other workers'
    /// records) is not held up until the epoch ends. `Break` ends the epoch
    /// at once with what it has (a stop asked for).
    pub fn next_epoch_streaming(
        &mut self,
        mut arrived: impl FnMut(&mut Vec<Record>) -> ControlFlow<()>,
    ) -> Result<EpochPart<KafkaPosition>, KafkaError> {
        let deadline = Instant::now() + Duration::from_millis(self.config.epoch_ms);
        // Records kept from a call that failed count towards this epoch.
        let mut read = self.records.len();
        while read < self.config.epoch_records {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let slice = (deadline - now).min(POLL_SLICE);
            if self.partitions.is_empty() {
                if arrived(&mut self.records).is_break() {
                    break;
                }
                sleep(slice);
                continue;
            }
            // Hand over what came once nothing more is waiting: one record at
            // a time when the stream is slow, in batches when it is fast.
            let waiting = match self.consumer.poll(Duration::ZERO) {
                Some(message) => Some(message),
                None => {
                    if arrived(&mut self.records).is_break() {
                        break;
                    }
                    self.consumer.poll(slice)
                }
            };
            match waiting {
                Some(Ok(message)) => {
                    let (partition, offset) = (message.partition(), message.offset());
                    let origin = MessageOrigin {
                        topic: message.topic(),
                        partition,
                        offset,
                    };
                    let before = self.records.len();
                    self.decoder
                        .decode(message.payload(), origin, &mut self.records, &mut self.dead_letters);
                    let new = self.records.len() - before;
                    read += new;
                    self.counters.add(new, &[]);
                    self.offsets.insert(partition, offset + 1);
                    self.trouble = None;
                    self.last_contact = Instant::now();
                }
                Some(Err(e)) => {
                    self.note_trouble(&e);
                    self.check_broker()?;
                }
                None => self.check_broker()?,
            }
        }
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let records = std::mem::take(&mut self.records);
        let dead_letters = std::mem::take(&mut self.dead_letters);
        self.counters.add(0, &dead_letters);
        Ok(EpochPart {
            epoch,
            records,
            dead_letters,
            position: self.position(),
        })
    }

    /// Sends a commit of `position`'s offsets (where reading resumes after
    /// epoch `epoch`) as the group's (all partitions it names, so one worker can commit the merged
    /// checkpoint), without waiting for the broker: a synchronous commit to a
    /// broker that is gone never returns, and would hold up the worker that
    /// reads and scores. Call it only after the epochs before `position` are
    /// checkpointed; [`settle_commits`](Self::settle_commits) waits for the
    /// newest. An epoch no newer than the last one sent is not sent again.
    pub fn commit(&mut self, epoch: u64, position: &KafkaPosition) -> Result<(), KafkaError> {
        if self.sent.as_ref().is_some_and(|(sent, _)| *sent >= epoch) {
            return Ok(());
        }
        if position.topic != self.config.topic {
            return Err(KafkaError::Config(format!(
                "a position of topic `{}` cannot be committed for `{}`",
                position.topic, self.config.topic
            )));
        }
        if position.offsets.is_empty() {
            return Ok(());
        }
        let list = self.offset_list(position, Offset::Offset)?;
        self.consumer
            .commit(&list, CommitMode::Async)
            .map_err(self.config.connection.operation(format!(
                "committing offsets of `{}` for group `{}`",
                position.topic, self.config.group_id
            )))?;
        self.sent = Some((epoch, position.clone()));
        Ok(())
    }

    /// The epoch of the newest commit sent, once the group's offsets on the
    /// broker are that commit's; waits at most the connection's timeout (a
    /// broker that is gone does not hold up the end of a run).
    pub fn settle_commits(&self) -> Option<u64> {
        let (epoch, position) = self.sent.as_ref()?;
        let list = self.offset_list(position, |_| Offset::Invalid).ok()?;
        let deadline = Instant::now() + self.config.connection.timeout();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(committed) = self.consumer.committed_offsets(list.clone(), left) {
                let there = committed.elements().iter().all(
                    |e| matches!(e.offset(), Offset::Offset(o) if position.offsets.get(&e.partition()) == Some(&o)),
                );
                if there {
                    return Some(*epoch);
                }
            }
            if Instant::now() + POLL_SLICE >= deadline {
                return None;
            }
            sleep(POLL_SLICE);
        }
    }

    fn offset_list(
        &self,
        position: &KafkaPosition,
        offset: impl Fn(i64) -> Offset,
    ) -> Result<TopicPartitionList, KafkaError> {
        let mut list = TopicPartitionList::new();
        for (&p, &o) in &position.offsets {
            list.add_partition_offset(&position.topic, p, offset(o)).map_err(
                self.config
                    .connection
                    .operation(format!("listing offsets of `{}`", position.topic)),
            )?;
        }
        Ok(list)
    }

    fn note_trouble(&mut self, e: &RdError) {
        let now = Instant::now();
        match &mut self.trouble {
            Some((_, last)) => *last = e.to_string(),
            None => self.trouble = Some((now, e.to_string())),
        }
    }

    /// While idle or failing, ask the broker (at most once a second) whether
    /// it is there; after the timeout without an answer, give up clearly.
    fn check_broker(&mut self) -> Result<(), KafkaError> {
        let now = Instant::now();
        let quiet = now.duration_since(self.last_contact) >= PROBE_EVERY;
        if (quiet || self.trouble.is_some()) && now.duration_since(self.last_probe) >= PROBE_EVERY {
            self.last_probe = now;
            let probe = self.consumer.fetch_metadata(Some(&self.config.topic), PROBE_EVERY / 2);
            let answered = match &probe {
                Ok(m) => m
                    .topics()
                    .iter()
                    .any(|t| t.name() == self.config.topic && t.error().is_none() && !t.partitions().is_empty()),
                Err(_) => false,
            };
            if answered {
                self.trouble = None;
                self.last_contact = Instant::now();
            } else if self.trouble.is_none() {
                let detail = match probe {
                    Err(e) => e.to_string(),
                    Ok(_) => format!("topic `{}` is not there", self.config.topic),
                };
                self.trouble = Some((now, detail));
            }
        }
        if let Some((since, detail)) = &self.trouble {
            let waited = since.elapsed();
            if waited >= self.config.connection.timeout() {
                let err = KafkaError::BrokerUnavailable {
                    brokers: self.config.connection.brokers.clone(),
                    waited,
                    detail: detail.clone(),
                };
                // A call after this one waits afresh.
                self.trouble = None;
                return Err(err);
            }
        }
        Ok(())
    }
}

fn check(config: &KafkaSourceConfig, share: WorkerShare, resume: Option<&KafkaPosition>) -> Result<(), KafkaError> {
    config.connection.check()?;
    if config.topic.is_empty() {
        return Err(KafkaError::Config("no input topic given".into()));
    }
    share.check().map_err(KafkaError::Config)?;
    if config.max_record_bytes == 0 {
        return Err(KafkaError::Config("max_record_bytes must be above 0".into()));
    }
    if config.epoch_records == 0 || config.epoch_ms == 0 {
        return Err(KafkaError::Config(
            "epoch_records and epoch_ms must both be above 0".into(),
        ));
    }
    if let Some(r) = resume {
        if r.topic != config.topic {
            return Err(KafkaError::Config(format!(
                "cannot resume topic `{}` from a position of topic `{}`",
                config.topic, r.topic
            )));
        }
    }
    Ok(())
}

/// The group's committed offsets of `partitions` (those it has).
fn committed_offsets(
    consumer: &BaseConsumer,
    config: &KafkaSourceConfig,
    partitions: &[i32],
) -> Result<BTreeMap<i32, i64>, KafkaError> {
    let mut list = TopicPartitionList::new();
    for &p in partitions {
        list.add_partition(&config.topic, p);
    }
    let committed = consumer.committed_offsets(list, config.connection.timeout()).map_err(
        config
            .connection
            .operation(format!("reading the committed offsets of group `{}`", config.group_id)),
    )?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}
