//! The broker side: connecting, start offsets, one fetch task per partition, partition
//! discovery, and a producer of lines (benchmarks and tests).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::offsets::RecordEnd;
use super::pump::{pump, Fetched, Poll};
use super::{KafkaConfig, StartAt, DISCOVER_EVERY, FETCH_AHEAD};
use crate::error::DataError;
use crate::feed::Feeder;
use crate::queue::FileRef;

/// Longest a request is retried before the error is reported (and, for fetches, retried
/// again after a pause).
const REQUEST_DEADLINE: Duration = Duration::from_secs(20);

/// Pause before a failed fetch is tried again.
const FETCH_RETRY: Duration = Duration::from_secs(1);

fn kafka_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> DataError {
    DataError::Kafka(format!("{what}: {e}"))
}

fn runtime() -> Result<Runtime, DataError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sparta-kafka-io")
        .enable_all()
        .build()
        .map_err(|e| kafka_err("cannot start the client runtime", e))
}

async fn connect(brokers: &[String]) -> Result<Client, DataError> {
    let backoff = BackoffConfig {
        deadline: Some(REQUEST_DEADLINE),
        ..BackoffConfig::default()
    };
    let build = ClientBuilder::new(brokers.to_vec())
        .client_id("sparta")
        .backoff_config(backoff)
        .build();
    match tokio::time::timeout(REQUEST_DEADLINE, build).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(kafka_err(format_args!("--kafka {}", brokers.join(",")), e)),
        Err(_) => Err(DataError::Kafka(format!(
            "--kafka {}: no broker answered within {REQUEST_DEADLINE:?}",
            brokers.join(",")
        ))),
    }
}

/// The partitions of `topic` (an error naming `--topic` when it does not exist).
async fn partitions(client: &Client, topic: &str) -> Result<Vec<i32>, DataError> {
    let topics = client
        .list_topics()
        .await
        .map_err(|e| kafka_err("listing topics", e))?;
    match topics.into_iter().find(|t| t.name == topic) {
        Some(t) if !t.partitions.is_empty() => Ok(t.partitions.into_iter().collect()),
        Some(_) => Err(DataError::Kafka(format!(
            "--topic {topic}: the topic has no partitions"
        ))),
        None => Err(DataError::Kafka(format!(
            "--topic {topic}: no such topic on the brokers (create it first)"
        ))),
    }
}

async fn partition_client(
    client: &Client,
    topic: &str,
    p: i32,
) -> Result<PartitionClient, DataError> {
    client
        .partition_client(topic, p, UnknownTopicHandling::Retry)
        .await
        .map_err(|e| kafka_err(format_args!("topic {topic} partition {p}"), e))
}

/// The offset after a partition's last record: the high watermark of a fetch at `latest`
/// (the list-offsets answer). Tansu 0.6 answers list-offsets "latest" with the base offset of
/// the newest record batch plus one, not the end; a fetch reports the true end.
async fn end_offset(pc: &PartitionClient, latest: i64) -> Result<i64, KafkaError> {
    match pc.fetch_records(latest, 1..64 << 10, 100).await {
        Ok((_, high_watermark)) => Ok(latest.max(high_watermark)),
        // Tansu answers a fetch at the end that found nothing without the topic.
        Err(KafkaError::InvalidResponse(_)) => Ok(latest),
        Err(e) => Err(e),
    }
}

/// A connected topic: its partitions and where each starts.
pub(crate) struct Source {
    rt: Runtime,
    client: Arc<Client>,
    topic: String,
    /// Partition -> (client, start offset, end offset when draining).
    parts: BTreeMap<i32, (Arc<PartitionClient>, i64, Option<i64>)>,
    fetch_bytes: i32,
    max_wait: Duration,
    drain: bool,
}

impl Source {
    /// Connects and resolves every partition's start (see the module docs of `kafka`).
    pub fn connect(cfg: &KafkaConfig) -> Result<Source, DataError> {
        let rt = runtime()?;
        let saved: BTreeMap<i32, i64> = cfg.start.offsets.iter().copied().collect();
        let (client, parts) = rt.block_on(async {
            let client = connect(&cfg.brokers).await?;
            let mut parts = BTreeMap::new();
            for p in partitions(&client, &cfg.topic).await? {
                let pc = partition_client(&client, &cfg.topic, p).await?;
                let at = |what: OffsetAt| {
                    let pc = &pc;
                    async move {
                        pc.get_offset(what).await.map_err(|e| {
                            kafka_err(format_args!("topic {} partition {p}", cfg.topic), e)
                        })
                    }
                };
                let first = at(OffsetAt::Earliest).await?;
                let end = end_offset(&pc, at(OffsetAt::Latest).await?)
                    .await
                    .map_err(|e| kafka_err(format_args!("topic {} partition {p}", cfg.topic), e))?;
                let start = match saved.get(&p) {
                    Some(&o) if o > end => {
                        return Err(DataError::Kafka(format!(
                            "topic {} partition {p}: the saved offset {o} is past its end {end}: \
                             the position is not of this topic",
                            cfg.topic
                        )))
                    }
                    Some(&o) if o < first => {
                        tracing::error!(
                            "topic {} partition {p}: records {o}..{first} were deleted by the \
                             broker before they were trained: continuing at {first}",
                            cfg.topic
                        );
                        first
                    }
                    Some(&o) => o,
                    None if cfg.start.offsets.is_empty() && cfg.from == StartAt::Latest => end,
                    // A partition created after the position was saved: all of it is new.
                    None => first,
                };
                let stop_at = cfg.drain.then_some(end);
                parts.insert(p, (Arc::new(pc), start, stop_at));
            }
            Ok::<_, DataError>((client, parts))
        })?;
        for (p, (_, start, end)) in &parts {
            tracing::info!(
                "kafka: topic {} partition {p} from offset {start}{}",
                cfg.topic,
                end.map_or(String::new(), |e| format!(" to {e}"))
            );
        }
        Ok(Source {
            rt,
            client: Arc::new(client),
            topic: cfg.topic.clone(),
            parts,
            fetch_bytes: i32::try_from(cfg.fetch_bytes.max(1)).unwrap_or(i32::MAX),
            max_wait: cfg.max_wait,
            drain: cfg.drain,
        })
    }

    /// `(partition, start offset)` of every partition.
    pub fn start_offsets(&self) -> Vec<(i32, i64)> {
        self.parts.iter().map(|(&p, &(_, o, _))| (p, o)).collect()
    }

    /// The engine's driver: fetch tasks feed `pump` until the engine stops (or, draining,
    /// every partition reached its end).
    pub fn run(
        self,
        feeder: &Feeder,
        file: &Arc<FileRef>,
        linger: Duration,
        ends: &Sender<Vec<RecordEnd>>,
    ) {
        let n = self.parts.len();
        let (tx, mut rx) = mpsc::channel::<Fetched>(FETCH_AHEAD * n.max(1));
        let mut known: Vec<i32> = self.parts.keys().copied().collect();
        for (&p, (pc, start, end)) in &self.parts {
            self.spawn_fetch(Arc::clone(pc), p, *start, *end, tx.clone());
        }
        // Draining: the channel closes once every fetch task has reached its end.
        let discover = (!self.drain).then(|| tx.clone());
        drop(tx);
        let mut next_discovery = Instant::now() + DISCOVER_EVERY;
        let next = |wait: Duration| {
            if let Some(tx) = discover
                .as_ref()
                .filter(|_| Instant::now() >= next_discovery)
            {
                next_discovery = Instant::now() + DISCOVER_EVERY;
                self.discover(&mut known, tx);
            }
            if wait.is_zero() {
                return match rx.try_recv() {
                    Ok(f) => Poll::Ready(f),
                    Err(mpsc::error::TryRecvError::Empty) => Poll::Empty,
                    Err(mpsc::error::TryRecvError::Disconnected) => Poll::Closed,
                };
            }
            // The timer is made inside the runtime (it needs its time driver).
            match self
                .rt
                .block_on(async { tokio::time::timeout(wait, rx.recv()).await })
            {
                Ok(Some(f)) => Poll::Ready(f),
                Ok(None) => Poll::Closed,
                Err(_) => Poll::Empty,
            }
        };
        pump(feeder, file, linger, next, ends);
        self.rt.shutdown_background();
    }

    /// New partitions of the topic get a fetch task from their first record.
    fn discover(&self, known: &mut Vec<i32>, tx: &mpsc::Sender<Fetched>) {
        let found = self.rt.block_on(async {
            let all = partitions(&self.client, &self.topic).await?;
            let mut new = Vec::new();
            for p in all.into_iter().filter(|p| !known.contains(p)) {
                let pc = partition_client(&self.client, &self.topic, p).await?;
                let first = pc
                    .get_offset(OffsetAt::Earliest)
                    .await
                    .map_err(|e| kafka_err(format_args!("partition {p}"), e))?;
                new.push((p, pc, first));
            }
            Ok::<_, DataError>(new)
        });
        match found {
            Ok(new) => {
                for (p, pc, first) in new {
                    tracing::info!(
                        "kafka: topic {} has a new partition {p}: reading it from offset {first}",
                        self.topic
                    );
                    known.push(p);
                    self.spawn_fetch(Arc::new(pc), p, first, None, tx.clone());
                }
            }
            Err(e) => tracing::warn!("kafka: looking for new partitions: {e}"),
        }
    }

    fn spawn_fetch(
        &self,
        pc: Arc<PartitionClient>,
        partition: i32,
        start: i64,
        end: Option<i64>,
        tx: mpsc::Sender<Fetched>,
    ) {
        let (bytes, wait) = (self.fetch_bytes, self.max_wait);
        self.rt
            .spawn(fetch_partition(pc, partition, start, end, bytes, wait, tx));
    }
}

/// Fetches one partition from `offset` on (to `end` when given) into `tx`, until `tx` is
/// closed. Transient errors are logged and retried; records deleted under the reader end
/// the stream with an error (they cannot be trained exactly once any more).
async fn fetch_partition(
    pc: Arc<PartitionClient>,
    partition: i32,
    mut offset: i64,
    end: Option<i64>,
    bytes: i32,
    max_wait: Duration,
    tx: mpsc::Sender<Fetched>,
) {
    let wait_ms = i32::try_from(max_wait.as_millis()).unwrap_or(i32::MAX);
    loop {
        if end.is_some_and(|e| offset >= e) || tx.is_closed() {
            return;
        }
        let asked = Instant::now();
        match pc.fetch_records(offset, 1..bytes, wait_ms).await {
            Ok((records, high_watermark)) => {
                let records: Vec<_> = records
                    .into_iter()
                    .filter(|r| r.offset >= offset && end.is_none_or(|e| r.offset < e))
                    .map(|r| (r.offset, r.record.value))
                    .collect();
                match records.last() {
                    Some(&(last, _)) => {
                        offset = last + 1;
                        if tx
                            .send(Fetched::Records { partition, records })
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    // Draining and nothing left below the end (e.g. control records).
                    None if end.is_some() && high_watermark <= offset => return,
                    None => {
                        // A broker that answers at once instead of waiting: no busy loop.
                        if let Some(rest) = max_wait.checked_sub(asked.elapsed()) {
                            tokio::time::sleep(rest).await;
                        }
                    }
                }
            }
            Err(KafkaError::ServerError {
                protocol_error: ProtocolError::OffsetOutOfRange,
                ..
            }) => {
                let e = DataError::Kafka(format!(
                    "topic {} partition {partition}: offset {offset} is out of range (records \
                     deleted by retention before they were trained?)",
                    pc.topic()
                ));
                let _ = tx.send(Fetched::Err(e)).await;
                return;
            }
            Err(e) => {
                tracing::warn!(
                    "kafka: topic {} partition {partition}: fetch at offset {offset}: {e}; \
                     retrying",
                    pc.topic()
                );
                tokio::time::sleep(FETCH_RETRY).await;
            }
        }
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

/// Writes every line of `lines` (without its `\n`) as one record, `batch` records per request:
/// one request to each partition at once, in partition order, at most `rate` records per second.
pub fn produce_lines(
    cfg: &ProducerConfig,
    lines: impl Iterator<Item = Vec<u8>>,
) -> Result<ProduceReport, DataError> {
    let rt = runtime()?;
    rt.block_on(async {
        let client = connect(&cfg.brokers).await?;
        let mut clients = Vec::new();
        for p in partitions(&client, &cfg.topic).await? {
            clients.push((p, Arc::new(partition_client(&client, &cfg.topic, p).await?)));
        }
        let mut report = ProduceReport::default();
        let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
        let start = Instant::now();
        let batch = cfg.batch.max(1);
        let mut lines = lines.peekable();
        while lines.peek().is_some() {
            // chrono is built without its clock here: the time comes from std.
            let millis = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let timestamp =
                rskafka::chrono::DateTime::from_timestamp_millis(millis).unwrap_or_default();
            // One request per partition at once: `batch` records each, in turn.
            let mut sent = Vec::new();
            for (p, pc) in &clients {
                let records: Vec<Record> = lines
                    .by_ref()
                    .take(batch)
                    .map(|line| Record {
                        key: None,
                        value: Some(line),
                        headers: BTreeMap::new(),
                        timestamp,
                    })
                    .collect();
                if records.is_empty() {
                    break;
                }
                report.bytes += records
                    .iter()
                    .map(|r| r.value.as_ref().map_or(0, |v| v.len()) as u64)
                    .sum::<u64>();
                report.records += records.len() as u64;
                let (p, pc) = (*p, Arc::clone(pc));
                sent.push((
                    p,
                    tokio::spawn(
                        async move { pc.produce(records, Compression::NoCompression).await },
                    ),
                ));
            }
            for (p, task) in sent {
                let what = || format!("producing to {} partition {p}", cfg.topic);
                let offsets = match task.await {
                    Ok(r) => r.map_err(|e| kafka_err(what(), e))?,
                    Err(e) => return Err(kafka_err(what(), e)),
                };
                if let Some(&last) = offsets.last() {
                    ends.insert(p, last + 1);
                }
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
        Ok(report)
    })
}
