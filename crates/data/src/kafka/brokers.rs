//! The brokers behind a topic: its partitions and the leader of each (a Metadata request to
//! any broker that answers: the bootstrap list first, then every broker named since), and
//! connections to a partition's leader. A caller whose leader moved or went away asks again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::wire::{Conn, WireError};

/// What the brokers say of a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TopicState {
    /// The topic does not exist.
    Missing,
    /// Partition -> the address of its leader (`None`: no leader right now).
    Partitions(BTreeMap<i32, Option<String>>),
}

/// The brokers a client knows.
#[derive(Debug)]
pub(crate) struct Brokers {
    bootstrap: Vec<String>,
    /// Node id -> `host:port`, as the last metadata answers named them.
    nodes: Mutex<BTreeMap<i32, String>>,
}

impl Brokers {
    pub fn new(bootstrap: &[String]) -> Brokers {
        Brokers {
            bootstrap: bootstrap.to_vec(),
            nodes: Mutex::new(BTreeMap::new()),
        }
    }

    /// The bootstrap list, as given.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.join(",")
    }

    /// Every address to ask, bootstrap first, each once.
    fn candidates(&self) -> Vec<String> {
        let mut all = self.bootstrap.clone();
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        for a in nodes.values() {
            if !all.contains(a) {
                all.push(a.clone());
            }
        }
        all
    }

    /// Asks the brokers, one after another, for `topic`'s partitions and leaders. Fails when
    /// none answers (the error of the last one tried).
    pub async fn topic(&self, topic: &str) -> Result<TopicState, WireError> {
        let mut last = WireError::Io(format!("no broker to ask ({})", self.bootstrap()));
        for addr in self.candidates() {
            match self.ask(&addr, topic).await {
                Ok(t) => return Ok(t),
                Err(e @ WireError::Protocol(_)) => return Err(e),
                Err(e) => {
                    tracing::debug!("kafka: metadata from {addr}: {e}");
                    last = e;
                }
            }
        }
        Err(last)
    }

    async fn ask(&self, addr: &str, topic: &str) -> Result<TopicState, WireError> {
        let mut conn = Conn::open(addr).await?;
        let version = conn.versions.metadata;
        let name = TopicName(StrBytes::from_string(topic.to_string()));
        let mut req = MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name)),
        ]));
        // Never create the topic by asking (the field exists from version 4 on).
        req.allow_auto_topic_creation = version < 4;
        let answer = conn.call(&req, version, Duration::ZERO).await?;
        let nodes: BTreeMap<i32, String> = answer
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        {
            let mut known = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            known.extend(nodes.clone());
        }
        let Some(t) = answer
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        else {
            return Ok(TopicState::Missing);
        };
        match t.error_code.err() {
            None => {}
            Some(ResponseError::UnknownTopicOrPartition) => return Ok(TopicState::Missing),
            Some(e) => {
                return Err(WireError::Io(format!(
                    "{addr}: metadata of topic {topic}: {e:?}"
                )))
            }
        }
        let partitions = t
            .partitions
            .iter()
            .map(|p| {
                let leader = (p.error_code.is_ok() && p.leader_id.0 >= 0)
                    .then(|| nodes.get(&p.leader_id.0).cloned())
                    .flatten();
                (p.partition_index, leader)
            })
            .collect();
        Ok(TopicState::Partitions(partitions))
    }

    /// A connection to the leader of `topic` partition `p` (its metadata asked anew).
    pub async fn leader(&self, topic: &str, p: i32) -> Result<Conn, WireError> {
        match self.topic(topic).await? {
            TopicState::Partitions(parts) => match parts.get(&p) {
                Some(Some(addr)) => Conn::open(addr).await,
                Some(None) => Err(WireError::Io(format!(
                    "topic {topic} partition {p} has no leader right now"
                ))),
                None => Err(WireError::Io(format!(
                    "topic {topic} has no partition {p} right now"
                ))),
            },
            TopicState::Missing => Err(WireError::Io(format!(
                "topic {topic} is missing on the brokers right now"
            ))),
        }
    }
}
