//! One partition's fetch task: Fetch requests to the partition's leader (read committed),
//! the answer's batches decoded (`batches`) and filtered by their transaction markers
//! (`txn`), the released records and the position after them sent to the driver.
//!
//! Transient failures (a connection lost or timed out, the leader moved or unknown for now,
//! a retriable broker error) are logged and tried again after [`RETRY`], asking the brokers
//! for the leader again when it may have moved. A batch that cannot be read, an offset out
//! of range (records deleted before they were trained) or an error the broker calls final
//! stop the stream with an error naming the topic, partition and offset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::mpsc;

use super::batches::{self, Content, Control};
use super::brokers::Brokers;
use super::pump::Fetched;
use super::txn::Committed;
use super::wire::{Conn, WireError};
use super::LagMeter;
use crate::error::DataError;

/// Pause before a failed fetch is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(1);

/// `isolation_level` of a read-committed request.
pub(crate) const READ_COMMITTED: i8 = 1;

/// One partition's part of a fetch answer.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub error: Option<ResponseError>,
    pub high_watermark: i64,
    /// `-1` when the broker does not say.
    pub last_stable_offset: i64,
    pub records: bytes::Bytes,
}

impl Answer {
    /// The offset after the last record a read-committed reader may get now.
    pub fn end(&self) -> i64 {
        if self.last_stable_offset >= 0 {
            self.last_stable_offset.min(self.high_watermark)
        } else {
            self.high_watermark
        }
    }
}

/// Reads one fetch answer's record bytes, fetched at `*offset`, into `filter`: records and
/// markers from `*offset` on and below `end` go in in offset order; `*offset` moves past the
/// last batch read. Returns the size of a batch cut short at the end of the answer.
pub(crate) fn read_answer(
    records: bytes::Bytes,
    offset: &mut i64,
    end: Option<i64>,
    filter: &mut Committed<Option<bytes::Bytes>>,
) -> Result<Option<usize>, batches::BadBatch> {
    let decoded = batches::decode(records)?;
    let before = *offset;
    for b in decoded.batches.into_iter().filter(|b| b.next > before) {
        // In order: a batch overlapping what was read already gives only what is new
        // (a record's offset comes from its batch's base plus a delta the batch carries).
        let fresh = |o: i64| o >= *offset && o < b.next && end.is_none_or(|e| o < e);
        match b.content {
            Content::Records(records) => {
                let mut last = *offset - 1;
                for (o, value) in records {
                    if fresh(o) && o > last {
                        filter.record(o, value, b.transaction);
                        last = o;
                    }
                }
            }
            Content::Control(o, control) if fresh(o) => match (control, b.transaction) {
                (Control::Commit, Some(p)) => filter.marker(o, p, true),
                (Control::Abort, Some(p)) => filter.marker(o, p, false),
                _ => filter.saw(o + 1),
            },
            Content::Control(..) => {}
        }
        let next = end.map_or(b.next, |e| b.next.min(e));
        filter.saw(next);
        *offset = (*offset).max(b.next);
    }
    Ok(decoded.cut_short)
}

/// One Fetch request for one partition.
pub(crate) async fn fetch_once(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
    offset: i64,
    bytes: i32,
    wait: Duration,
) -> Result<Answer, WireError> {
    let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    let req = FetchRequest::default()
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(bytes)
        .with_isolation_level(READ_COMMITTED)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(bytes)])]);
    let version = conn.versions.fetch;
    let answer = conn.call(&req, version, wait).await?;
    if let Some(e) = answer.error_code.err() {
        return Ok(Answer {
            error: Some(e),
            ..Answer::default()
        });
    }
    let part = answer
        .responses
        .into_iter()
        .filter(|t| t.topic.0.as_str() == topic)
        .flat_map(|t| t.partitions)
        .find(|p| p.partition_index == partition);
    // Tansu 0.6 leaves the topic out of an answer that found nothing at the end.
    let Some(p) = part else {
        return Ok(Answer {
            high_watermark: offset,
            last_stable_offset: -1,
            ..Answer::default()
        });
    };
    Ok(Answer {
        error: p.error_code.err(),
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        records: p.records.unwrap_or_default(),
    })
}

/// Errors after which the partition's leader is asked for again.
fn leader_moved(e: ResponseError) -> bool {
    matches!(
        e,
        ResponseError::NotLeaderOrFollower
            | ResponseError::UnknownTopicOrPartition
            | ResponseError::LeaderNotAvailable
            | ResponseError::ReplicaNotAvailable
            | ResponseError::FencedLeaderEpoch
            | ResponseError::UnknownLeaderEpoch
            | ResponseError::KafkaStorageError
            | ResponseError::PreferredLeaderNotAvailable
    )
}

/// What one partition's task reads.
pub(crate) struct Task {
    pub brokers: Arc<Brokers>,
    pub topic: Arc<str>,
    pub partition: i32,
    /// The first offset to read.
    pub start: i64,
    /// Read up to here, then end (draining).
    pub end: Option<i64>,
    /// Most bytes per fetch (a larger batch is asked for whole).
    pub bytes: i32,
    pub max_wait: Duration,
    /// Gets every answer's high watermark (the partition's lag).
    pub lag: LagMeter,
}

impl Task {
    fn fail(&self, offset: i64, what: impl std::fmt::Display) -> DataError {
        DataError::Kafka(format!(
            "topic {} partition {} offset {offset}: {what}",
            self.topic, self.partition
        ))
    }

    /// Fetches from `start` on (to `end` when given) into `tx` until `tx` is closed; a
    /// failure that cannot heal is sent as [`Fetched::Err`] and ends the task.
    pub async fn run(self, tx: mpsc::Sender<Fetched>) {
        if let Err(e) = self.fetch_all(&tx).await {
            let _ = tx.send(Fetched::Err(e)).await;
        }
    }

    async fn fetch_all(&self, tx: &mpsc::Sender<Fetched>) -> Result<(), DataError> {
        let (topic, partition) = (&*self.topic, self.partition);
        let mut offset = self.start;
        let mut filter = Committed::new(self.start);
        let mut sent = self.start;
        let mut conn: Option<Conn> = None;
        let mut bytes = self.bytes.max(1);
        loop {
            if self.end.is_some_and(|e| offset >= e) || tx.is_closed() {
                if filter.held() > 0 {
                    tracing::info!(
                        "kafka: topic {topic} partition {partition}: {} records from offset {} \
                         wait for their transaction's end, not read",
                        filter.held(),
                        filter.position()
                    );
                }
                return Ok(());
            }
            let c = match conn.as_mut() {
                Some(c) => c,
                None => match self.brokers.leader(topic, partition).await {
                    Ok(c) => conn.insert(c),
                    Err(e) => {
                        self.retry(offset, e.to_string()).await;
                        continue;
                    }
                },
            };
            let asked = Instant::now();
            let answer = match fetch_once(c, topic, partition, offset, bytes, self.max_wait).await {
                Ok(a) => a,
                Err(WireError::Protocol(e)) => return Err(self.fail(offset, e)),
                Err(e @ WireError::Io(_)) => {
                    conn = None;
                    self.retry(offset, e.to_string()).await;
                    continue;
                }
            };
            match answer.error {
                None => {}
                Some(ResponseError::OffsetOutOfRange) => {
                    return Err(self.fail(
                        offset,
                        "out of range (records deleted by retention before they were trained?)",
                    ))
                }
                Some(e) if leader_moved(e) => {
                    conn = None;
                    self.retry(offset, format!("{e}; asking for the leader again"))
                        .await;
                    continue;
                }
                Some(e) if e.is_retriable() => {
                    self.retry(offset, e.to_string()).await;
                    continue;
                }
                Some(e) => return Err(self.fail(offset, format!("the broker answered {e}"))),
            }
            self.lag.high_watermark(partition, answer.high_watermark);
            let before = offset;
            let cut_short = read_answer(answer.records, &mut offset, self.end, &mut filter)
                .map_err(|b| {
                    self.fail(b.offset, format!("{}: the batch cannot be read", b.reason))
                })?;
            bytes = match cut_short {
                // A batch larger than asked for: ask for all of it.
                Some(size) if offset == before => {
                    i32::try_from(size).unwrap_or(i32::MAX).max(self.bytes)
                }
                _ => self.bytes.max(1),
            };
            let (records, position) = filter.take();
            if !records.is_empty() || position > sent {
                sent = position;
                if tx
                    .send(Fetched::Records {
                        partition,
                        records,
                        next: position,
                    })
                    .await
                    .is_err()
                {
                    return Ok(());
                }
            }
            if offset == before {
                // Draining, and nothing left below the end the broker reports.
                if self.end.is_some() && answer.high_watermark <= offset {
                    return Ok(());
                }
                // A broker that answers at once instead of waiting: no busy loop.
                if cut_short.is_none() {
                    if let Some(rest) = self.max_wait.checked_sub(asked.elapsed()) {
                        tokio::time::sleep(rest).await;
                    }
                }
            }
        }
    }

    async fn retry(&self, offset: i64, e: String) {
        tracing::warn!(
            "kafka: topic {} partition {}: fetch at offset {offset}: {e}; retrying",
            self.topic,
            self.partition
        );
        tokio::time::sleep(RETRY).await;
    }
}
