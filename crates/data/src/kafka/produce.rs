//! A producer of lines (`sparta kafka-produce`, tests and benchmarks): one record per line,
//! one record batch per request and partition, compressed with the chosen codec, written
//! with `acks = -1` (every in-sync replica).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{self, Record, RecordBatchEncoder, RecordEncodeOptions};

use super::brokers::{Brokers, TopicState};
use super::wire::{self, Conn};
use crate::error::DataError;

/// How long the broker may take to replicate a request.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Times a request refused because the leader moved is sent again (to the new leader).
const LEADER_RETRIES: usize = 5;

/// The codec of the record batches written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Lz4,
    Snappy,
    Zstd,
}

impl Compression {
    /// Every codec, in the order of `--compression`'s list.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Lz4,
        Compression::Snappy,
        Compression::Zstd,
    ];

    fn codec(self) -> records::Compression {
        match self {
            Compression::None => records::Compression::None,
            Compression::Gzip => records::Compression::Gzip,
            Compression::Lz4 => records::Compression::Lz4,
            Compression::Snappy => records::Compression::Snappy,
            Compression::Zstd => records::Compression::Zstd,
        }
    }

    /// The name Kafka gives it (`compression.type`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Lz4 => "lz4",
            Compression::Snappy => "snappy",
            Compression::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Compression::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("{s:?}: expected none, gzip, lz4, snappy or zstd"))
    }
}

/// How to write lines to a topic.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// The topic (it must exist).
    pub topic: String,
    /// Records per produce request.
    pub batch: usize,
    /// Records per second (`None`: as fast as the broker takes them).
    pub rate: Option<f64>,
    /// The codec of the record batches.
    pub compression: Compression,
}

/// What [`produce_lines`] wrote.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProduceReport {
    /// Records written.
    pub records: u64,
    /// Bytes of record values written.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// `(partition, offset after its last record)` as the broker acknowledged them.
    pub ends: Vec<(i32, i64)>,
}

/// One record batch of `lines` (offsets from 0; the broker assigns the real ones).
pub(crate) fn batch_of(lines: Vec<Vec<u8>>, codec: Compression) -> Result<Bytes, String> {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let records: Vec<Record> = lines
        .into_iter()
        .enumerate()
        .map(|(i, line)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: records::NO_PARTITION_LEADER_EPOCH,
            producer_id: records::NO_PRODUCER_ID,
            producer_epoch: records::NO_PRODUCER_EPOCH,
            timestamp_type: records::TimestampType::Creation,
            offset: i as i64,
            // No sequence (-1 for the first record): offset - sequence stays constant, so
            // the encoder keeps every record in one batch.
            sequence: i as i32 - 1,
            timestamp: millis,
            key: None,
            value: Some(Bytes::from(line)),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: codec.codec(),
        },
    )
    .map_err(wire::text)?;
    Ok(buf.freeze())
}

/// Writes one batch to partition `p`, through `conn` (reconnected to the leader when it
/// moved). Returns the offset after the batch's last record.
async fn send(
    brokers: &Brokers,
    conn: &mut Option<Conn>,
    topic: &str,
    p: i32,
    batch: Bytes,
    count: usize,
) -> Result<i64, DataError> {
    let what = |e: &dyn fmt::Display| {
        DataError::Kafka(format!("producing to topic {topic} partition {p}: {e}"))
    };
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(PRODUCE_TIMEOUT.as_millis() as i32)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(p)
                .with_records(Some(batch))])]);
    for _ in 0..=LEADER_RETRIES {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => conn.insert(brokers.leader(topic, p).await.map_err(|e| what(&e))?),
        };
        let version = c.versions.produce.ok_or_else(|| {
            what(&"the broker does not take Produce requests of any version this client speaks")
        })?;
        // A failed connection may or may not have written the batch: not sent again.
        let answer = c
            .call(&req, version, PRODUCE_TIMEOUT)
            .await
            .map_err(|e| what(&e))?;
        let part = answer
            .responses
            .iter()
            .flat_map(|t| &t.partition_responses)
            .find(|r| r.index == p)
            .ok_or_else(|| what(&"the answer does not name the partition"))?;
        match part.error_code.err() {
            None => return Ok(part.base_offset + count as i64),
            // Refused before writing: the leader moved; ask for it again.
            Some(e) if e.is_retriable() => {
                tracing::warn!("kafka: producing to {topic} partition {p}: {e}; retrying");
                *conn = None;
                tokio::time::sleep(super::fetch::RETRY).await;
            }
            Some(e) => return Err(what(&e)),
        }
    }
    Err(what(&format!("refused {} times", LEADER_RETRIES + 1)))
}

/// Writes every line of `lines` (without its `\n`) as one record, `batch` records per
/// request: one request to each partition at once, in partition order, at most `rate`
/// records per second.
pub fn produce_lines(
    cfg: &ProducerConfig,
    lines: impl Iterator<Item = Vec<u8>>,
) -> Result<ProduceReport, DataError> {
    let rt = super::client::runtime()?;
    rt.block_on(async {
        let brokers = std::sync::Arc::new(Brokers::new(&cfg.brokers));
        let partitions: Vec<i32> = match brokers.topic(&cfg.topic).await {
            Ok(TopicState::Partitions(p)) if !p.is_empty() => p.into_keys().collect(),
            Ok(_) => {
                return Err(DataError::Kafka(format!(
                    "--topic {}: no such topic on the brokers (create it first)",
                    cfg.topic
                )))
            }
            Err(e) => {
                return Err(DataError::Kafka(format!(
                    "--kafka {}: {e}",
                    brokers.bootstrap()
                )))
            }
        };
        let mut conns: Vec<Option<Conn>> = partitions.iter().map(|_| None).collect();
        let mut report = ProduceReport::default();
        let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
        let start = Instant::now();
        let per = cfg.batch.max(1);
        let mut lines = lines.peekable();
        while lines.peek().is_some() {
            // One request per partition at once: `batch` records each, in turn.
            let mut sent = Vec::new();
            for (&p, conn) in partitions.iter().zip(conns.iter_mut()) {
                let chunk: Vec<Vec<u8>> = lines.by_ref().take(per).collect();
                if chunk.is_empty() {
                    break;
                }
                let count = chunk.len();
                report.bytes += chunk.iter().map(|l| l.len() as u64).sum::<u64>();
                report.records += count as u64;
                let batch = batch_of(chunk, cfg.compression).map_err(DataError::Kafka)?;
                let mut taken = conn.take();
                let (brokers, topic) = (std::sync::Arc::clone(&brokers), cfg.topic.clone());
                sent.push((
                    p,
                    tokio::spawn(async move {
                        let r = send(&brokers, &mut taken, &topic, p, batch, count).await;
                        (r, taken)
                    }),
                ));
            }
            for ((p, task), conn) in sent.into_iter().zip(conns.iter_mut()) {
                let (end, back) = task.await.map_err(|e| {
                    DataError::Kafka(format!("producing to {} partition {p}: {e}", cfg.topic))
                })?;
                *conn = back;
                ends.insert(p, end?);
            }
            if let Some(rate) = cfg.rate.filter(|r| *r > 0.0) {
                let due = Duration::from_secs_f64(report.records as f64 / rate);
                if let Some(rest) = due.checked_sub(start.elapsed()) {
                    tokio::time::sleep(rest).await;
                }
            }
        }
        report.seconds = start.elapsed().as_secs_f64();
        report.ends = ends.into_iter().collect();
        Ok::<_, DataError>(report)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::batches::{decode, Content};

    #[test]
    fn compression_names_round_trip() {
        for c in Compression::ALL {
            assert_eq!(c.name().parse::<Compression>(), Ok(c));
        }
        let e = "brotli".parse::<Compression>().unwrap_err();
        assert!(
            e.contains("expected none, gzip, lz4, snappy or zstd"),
            "{e}"
        );
    }

    #[test]
    fn a_batch_of_any_codec_holds_every_line_in_one_batch() {
        for c in Compression::ALL {
            let lines: Vec<Vec<u8>> = (0..100).map(|i| format!("1\tx{i}").into_bytes()).collect();
            let d = decode(batch_of(lines.clone(), c).unwrap()).unwrap();
            assert_eq!(d.batches.len(), 1, "{c}");
            let Content::Records(r) = &d.batches[0].content else {
                panic!("{c}")
            };
            let got: Vec<Vec<u8>> = r.iter().map(|(_, v)| v.clone().unwrap().to_vec()).collect();
            assert_eq!(got, lines, "{c}");
            assert_eq!(d.batches[0].transaction, None);
        }
    }
}
