//! Tests only: a scripted cluster of Kafka-API brokers on loopback, for what a real one-node
//! broker cannot show: a leader moving to another broker, a connection dropped mid-fetch, a
//! corrupt batch in the log. Each broker answers ApiVersions, Metadata, ListOffsets and Fetch
//! from one shared state, which a test changes while a stream reads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{
    decode_request_header_from_buffer, Decodable, Encodable, HeaderVersion, StrBytes,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the brokers hold and do.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub topic: String,
    /// Partition -> its record batches `(base, next, bytes)`, in offset order.
    pub logs: BTreeMap<i32, Vec<(i64, i64, Bytes)>>,
    /// Partition -> the broker (index) leading it.
    pub leader: BTreeMap<i32, usize>,
    /// Every fetch answered or dropped: (broker, partition, offset).
    pub fetches: Vec<(usize, i32, i64)>,
    /// After this many fetches, every partition's leader becomes the next broker.
    pub move_leaders_after: Option<usize>,
    /// Closes the connection instead of answering fetch number `n` (counted from 0), once.
    pub drop_fetch: Option<usize>,
}

impl State {
    /// Appends a batch (its bytes from `batches::tests::encode`) to `partition`'s log.
    pub fn append(&mut self, partition: i32, batch: Bytes) {
        let d = super::batches::decode(batch.clone()).unwrap();
        let b = &d.batches[0];
        self.logs
            .entry(partition)
            .or_default()
            .push((b.base, b.next, batch));
        self.leader.entry(partition).or_insert(0);
    }

    fn end(&self, p: i32) -> i64 {
        self.logs.get(&p).and_then(|l| l.last()).map_or(0, |b| b.1)
    }
}

/// Brokers on loopback, serving until dropped.
pub(crate) struct FakeCluster {
    pub state: Arc<Mutex<State>>,
    pub addrs: Vec<String>,
    _rt: tokio::runtime::Runtime,
}

impl FakeCluster {
    pub fn start(brokers: usize, state: State) -> FakeCluster {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(Mutex::new(state));
        let listeners: Vec<TcpListener> = (0..brokers)
            .map(|_| rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap())
            .collect();
        let addrs: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        for (node, l) in listeners.into_iter().enumerate() {
            let (state, addrs) = (Arc::clone(&state), addrs.clone());
            rt.spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    let (state, addrs) = (Arc::clone(&state), addrs.clone());
                    tokio::spawn(serve(node, s, state, addrs));
                }
            });
        }
        FakeCluster {
            state,
            addrs,
            _rt: rt,
        }
    }
}

/// Answers one connection's requests until it closes (or a fetch is to be dropped).
async fn serve(node: usize, mut s: TcpStream, state: Arc<Mutex<State>>, addrs: Vec<String>) {
    loop {
        let Ok(len) = s.read_i32().await else { return };
        let mut body = vec![0; len as usize];
        if s.read_exact(&mut body).await.is_err() {
            return;
        }
        let mut body = Bytes::from(body);
        let header = decode_request_header_from_buffer(&mut body).unwrap();
        let (key, v) = (header.request_api_key, header.request_api_version);
        let mut out = BytesMut::new();
        out.put_i32(0);
        let head = |out: &mut BytesMut, hv: i16| {
            ResponseHeader::default()
                .with_correlation_id(header.correlation_id)
                .encode(out, hv)
                .unwrap()
        };
        match ApiKey::try_from(key).unwrap() {
            ApiKey::ApiVersions => {
                let _ = ApiVersionsRequest::decode(&mut body, v).unwrap();
                head(&mut out, ApiVersionsResponse::header_version(v));
                let api = |k: ApiKey, lo, hi| {
                    ApiVersion::default()
                        .with_api_key(k as i16)
                        .with_min_version(lo)
                        .with_max_version(hi)
                };
                ApiVersionsResponse::default()
                    .with_api_keys(vec![
                        api(ApiKey::ApiVersions, 0, 3),
                        api(ApiKey::Metadata, 0, 12),
                        api(ApiKey::ListOffsets, 0, 9),
                        api(ApiKey::Fetch, 4, 12),
                    ])
                    .encode(&mut out, v)
                    .unwrap();
            }
            ApiKey::Metadata => {
                let _ = MetadataRequest::decode(&mut body, v).unwrap();
                head(&mut out, MetadataResponse::header_version(v));
                let st = state.lock().unwrap();
                let brokers = addrs
                    .iter()
                    .enumerate()
                    .map(|(i, a)| {
                        let (host, port) = a.rsplit_once(':').unwrap();
                        MetadataResponseBroker::default()
                            .with_node_id(BrokerId(i as i32))
                            .with_host(StrBytes::from_string(host.into()))
                            .with_port(port.parse().unwrap())
                    })
                    .collect();
                let partitions = st
                    .leader
                    .iter()
                    .map(|(&p, &l)| {
                        MetadataResponsePartition::default()
                            .with_partition_index(p)
                            .with_leader_id(BrokerId(l as i32))
                    })
                    .collect();
                MetadataResponse::default()
                    .with_brokers(brokers)
                    .with_topics(vec![MetadataResponseTopic::default()
                        .with_name(Some(name(&st.topic)))
                        .with_partitions(partitions)])
                    .encode(&mut out, v)
                    .unwrap();
            }
            ApiKey::ListOffsets => {
                let req = ListOffsetsRequest::decode(&mut body, v).unwrap();
                head(&mut out, ListOffsetsResponse::header_version(v));
                let st = state.lock().unwrap();
                let parts = req.topics[0]
                    .partitions
                    .iter()
                    .map(|q| {
                        let p = q.partition_index;
                        let r = ListOffsetsPartitionResponse::default().with_partition_index(p);
                        if st.leader.get(&p) != Some(&node) {
                            return r.with_error_code(ResponseError::NotLeaderOrFollower.code());
                        }
                        let first = st.logs.get(&p).and_then(|l| l.first()).map_or(0, |b| b.0);
                        r.with_offset(if q.timestamp == -2 { first } else { st.end(p) })
                    })
                    .collect();
                ListOffsetsResponse::default()
                    .with_topics(vec![ListOffsetsTopicResponse::default()
                        .with_name(name(&st.topic))
                        .with_partitions(parts)])
                    .encode(&mut out, v)
                    .unwrap();
            }
            ApiKey::Fetch => {
                let req = FetchRequest::decode(&mut body, v).unwrap();
                let fp = &req.topics[0].partitions[0];
                let (p, offset) = (fp.partition, fp.fetch_offset);
                let answer = {
                    let mut st = state.lock().unwrap();
                    let n = st.fetches.len();
                    st.fetches.push((node, p, offset));
                    if st.drop_fetch == Some(n) {
                        st.drop_fetch = None;
                        return;
                    }
                    if st.move_leaders_after == Some(n) {
                        for l in st.leader.values_mut() {
                            *l = (*l + 1) % addrs.len();
                        }
                    }
                    let part = PartitionData::default().with_partition_index(p);
                    let part = if st.leader.get(&p) != Some(&node) {
                        part.with_error_code(ResponseError::NotLeaderOrFollower.code())
                    } else {
                        let mut records = BytesMut::new();
                        for (_, next, b) in st.logs.get(&p).into_iter().flatten() {
                            if *next > offset && records.len() < fp.partition_max_bytes as usize {
                                records.extend_from_slice(b);
                            }
                        }
                        part.with_high_watermark(st.end(p))
                            .with_last_stable_offset(st.end(p))
                            .with_records(Some(records.freeze()))
                    };
                    FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
                        .with_topic(name(&st.topic))
                        .with_partitions(vec![part])])
                };
                head(&mut out, FetchResponse::header_version(v));
                answer.encode(&mut out, v).unwrap();
            }
            other => panic!("the fake broker does not answer {other:?}"),
        }
        let len = (out.len() - 4) as i32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}
