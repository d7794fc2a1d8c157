//! The broker side of a stream: connecting, each partition's start (and end when draining),
//! one fetch task per partition (`fetch`) on a small tokio runtime, and the discovery of
//! partitions added to the topic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::brokers::{Brokers, TopicState};
use super::fetch::{self, Task, READ_COMMITTED};
use super::offsets::RecordEnd;
use super::pump::{pump, Fetched, Poll};
use super::wire::{Conn, WireError};
use super::{Assignment, KafkaConfig, LagMeter, StartAt, DISCOVER_EVERY, FETCH_AHEAD};
use crate::error::DataError;
use crate::feed::Feeder;
use crate::queue::FileRef;

/// Longest the start (connecting, partitions, offsets) is tried before the error is
/// reported.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// ListOffsets timestamps.
const EARLIEST: i64 = -2;
const LATEST: i64 = -1;

/// Longest a probe of a partition's end waits for records.
const END_PROBE_WAIT: Duration = Duration::from_millis(100);

pub(crate) fn runtime() -> Result<Runtime, DataError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sparta-kafka-io")
        .enable_all()
        .build()
        .map_err(|e| DataError::Kafka(format!("cannot start the client runtime: {e}")))
}

/// The partitions of `topic` this reader takes (an error naming `--topic` when the topic
/// does not exist).
async fn partitions(
    brokers: &Brokers,
    topic: &str,
    assign: Option<Assignment>,
) -> Result<BTreeMap<i32, Option<String>>, DataError> {
    let all = match brokers.topic(topic).await {
        Ok(TopicState::Partitions(p)) if !p.is_empty() => p,
        Ok(TopicState::Partitions(_)) => {
            return Err(DataError::Kafka(format!(
                "--topic {topic}: the topic has no partitions"
            )))
        }
        Ok(TopicState::Missing) => {
            return Err(DataError::Kafka(format!(
                "--topic {topic}: no such topic on the brokers (create it first)"
            )))
        }
        Err(e) => {
            return Err(DataError::Kafka(format!(
                "--kafka {}: {e}",
                brokers.bootstrap()
            )))
        }
    };
    Ok(all
        .into_iter()
        .filter(|(p, _)| assign.is_none_or(|a| a.takes(*p)))
        .collect())
}

/// A partition's offset at `timestamp` ([`EARLIEST`] or [`LATEST`]; read committed).
async fn list_offset(conn: &mut Conn, topic: &str, p: i32, timestamp: i64) -> Result<i64, String> {
    let req = ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_isolation_level(READ_COMMITTED)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(p)
                .with_timestamp(timestamp)])]);
    let version = conn.versions.list_offsets;
    let answer = conn
        .call(&req, version, Duration::ZERO)
        .await
        .map_err(|e| e.to_string())?;
    let part = answer
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .find(|r| r.partition_index == p)
        .ok_or("the answer to ListOffsets does not name the partition")?;
    match part.error_code.err() {
        None => Ok(part.offset),
        Some(e) => Err(format!("ListOffsets: {e}")),
    }
}

/// `(first, end)` of a partition. The end is the larger of ListOffsets "latest" and the end a
/// fetch there reports: Tansu 0.6 answers "latest" with the newest record batch's base offset
/// plus one, not the offset after its last record.
async fn bounds(conn: &mut Conn, topic: &str, p: i32) -> Result<(i64, i64), String> {
    let first = list_offset(conn, topic, p, EARLIEST).await?;
    let latest = list_offset(conn, topic, p, LATEST).await?;
    let probe = fetch::fetch_once(conn, topic, p, latest, 1, END_PROBE_WAIT)
        .await
        .map_err(|e| e.to_string())?;
    let end = match probe.error {
        None => latest.max(probe.end()),
        Some(e) => return Err(format!("Fetch at {latest}: {e}")),
    };
    Ok((first, end))
}

/// Runs `f` until it succeeds or [`START_DEADLINE`] passes (then its last error).
async fn with_retries<T, F, Fut>(what: &str, mut f: F) -> Result<T, DataError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(t) => return Ok(t),
            Err(e) if start.elapsed() >= START_DEADLINE => {
                return Err(DataError::Kafka(format!("{what}: {e}")))
            }
            Err(e) => {
                tracing::warn!("kafka: {what}: {e}; retrying");
                tokio::time::sleep(fetch::RETRY).await;
            }
        }
    }
}

/// A partition's bounds from its leader.
async fn leader_bounds(brokers: &Brokers, topic: &str, p: i32) -> Result<(i64, i64), DataError> {
    with_retries(&format!("topic {topic} partition {p}"), || async move {
        let mut conn = brokers.leader(topic, p).await.map_err(|e| match e {
            WireError::Io(m) | WireError::Protocol(m) => m,
        })?;
        bounds(&mut conn, topic, p).await
    })
    .await
}

/// One partition to read: from `start`, to `end` when draining.
#[derive(Clone, Copy, Debug)]
struct Range {
    start: i64,
    end: Option<i64>,
}

/// A connected topic: its partitions and where each starts.
pub(crate) struct Source {
    rt: Runtime,
    brokers: Arc<Brokers>,
    topic: Arc<str>,
    assign: Option<Assignment>,
    parts: BTreeMap<i32, Range>,
    fetch_bytes: i32,
    max_wait: Duration,
    drain: bool,
    lag: LagMeter,
}

impl Source {
    /// Connects and resolves every partition's start (see the module docs of `kafka`).
    pub fn connect(cfg: &KafkaConfig, lag: LagMeter) -> Result<Source, DataError> {
        let rt = runtime()?;
        let saved: BTreeMap<i32, i64> = cfg.start.offsets.iter().copied().collect();
        let brokers = Arc::new(Brokers::new(&cfg.brokers));
        let topic = cfg.topic.as_str();
        let parts = rt.block_on(async {
            let mut parts = BTreeMap::new();
            for p in partitions(&brokers, topic, cfg.assign).await?.into_keys() {
                let (first, end) = leader_bounds(&brokers, topic, p).await?;
                let start = match saved.get(&p) {
                    Some(&o) if o > end => {
                        return Err(DataError::Kafka(format!(
                            "topic {topic} partition {p}: the saved offset {o} is past its end \
                             {end}: the position is not of this topic"
                        )))
                    }
                    Some(&o) if o < first => {
                        tracing::error!(
                            "topic {topic} partition {p}: records {o}..{first} were deleted by \
                             the broker before they were trained: continuing at {first}"
                        );
                        first
                    }
                    Some(&o) => o,
                    None if cfg.start.offsets.is_empty() && cfg.from == StartAt::Latest => end,
                    // A partition created after the position was saved: all of it is new.
                    None => first,
                };
                let end = cfg.drain.then_some(end);
                parts.insert(p, Range { start, end });
            }
            Ok::<_, DataError>(parts)
        })?;
        if parts.is_empty() {
            if let Some(a) = cfg.assign {
                tracing::warn!(
                    "kafka: topic {topic}: no partition is assigned to reader {} of {}: waiting \
                     for new partitions",
                    a.rank,
                    a.workers
                );
            }
        }
        for (p, r) in &parts {
            tracing::info!(
                "kafka: topic {topic} partition {p} from offset {}{}",
                r.start,
                r.end.map_or(String::new(), |e| format!(" to {e}"))
            );
        }
        Ok(Source {
            rt,
            brokers,
            topic: Arc::from(topic),
            assign: cfg.assign,
            parts,
            fetch_bytes: i32::try_from(cfg.fetch_bytes.max(1)).unwrap_or(i32::MAX),
            max_wait: cfg.max_wait,
            drain: cfg.drain,
            lag,
        })
    }

    /// `(partition, start offset)` of every partition.
    pub fn start_offsets(&self) -> Vec<(i32, i64)> {
        self.parts.iter().map(|(&p, r)| (p, r.start)).collect()
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
        for (&p, r) in &self.parts {
            self.spawn_fetch(p, *r, tx.clone());
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

    /// New partitions (of this reader's assignment) get a fetch task from their first record.
    fn discover(&self, known: &mut Vec<i32>, tx: &mpsc::Sender<Fetched>) {
        let topic = &*self.topic;
        let found = self.rt.block_on(async {
            let all = partitions(&self.brokers, topic, self.assign).await?;
            let mut new = Vec::new();
            for p in all.into_keys().filter(|p| !known.contains(p)) {
                let (first, _) = leader_bounds(&self.brokers, topic, p).await?;
                new.push((p, first));
            }
            Ok::<_, DataError>(new)
        });
        match found {
            Ok(new) => {
                for (p, first) in new {
                    tracing::info!(
                        "kafka: topic {topic} has a new partition {p}: reading it from offset \
                         {first}"
                    );
                    known.push(p);
                    let r = Range {
                        start: first,
                        end: None,
                    };
                    self.spawn_fetch(p, r, tx.clone());
                }
            }
            Err(e) => tracing::warn!("kafka: looking for new partitions: {e}"),
        }
    }

    fn spawn_fetch(&self, partition: i32, r: Range, tx: mpsc::Sender<Fetched>) {
        self.lag.started(partition, r.start);
        let task = Task {
            lag: self.lag.clone(),
            brokers: Arc::clone(&self.brokers),
            topic: Arc::clone(&self.topic),
            partition,
            start: r.start,
            end: r.end,
            bytes: self.fetch_bytes,
            max_wait: self.max_wait,
        };
        self.rt.spawn(task.run(tx));
    }
}
