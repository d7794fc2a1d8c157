//! One connection to one broker: size-framed requests and responses of the Kafka protocol
//! (messages from `kafka-protocol`), one request at a time, at the newest version of each API
//! that both this client and the broker support (asked with ApiVersions on connecting).

use std::fmt;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest wait for a connection to open.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for an answer, on top of the time the request asks the broker to wait.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest response accepted (a fetch answers at most `fetch_bytes` per partition, or
/// one whole record batch when that is larger).
const MAX_RESPONSE: usize = 1 << 30;

/// The client id sent with every request.
const CLIENT_ID: &str = "sparta";

/// Why a request failed.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The connection failed, closed or timed out: try again (on a new connection).
    Io(String),
    /// The answer cannot be decoded, or the broker supports none of the versions this client
    /// speaks: trying again will not help.
    Protocol(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Io(m) | WireError::Protocol(m) => f.write_str(m),
        }
    }
}

/// The versions of an API this client can speak: the lowest has what the client needs (Fetch
/// 4: isolation level and record batches; ListOffsets 2: isolation level; Produce 3: record
/// batches), the highest names topics by name (Fetch and Produce 13 name them by id).
fn ours(key: ApiKey) -> (i16, i16) {
    match key {
        ApiKey::ApiVersions => (0, 0),
        ApiKey::Metadata => (1, 12),
        ApiKey::ListOffsets => (2, 9),
        ApiKey::Fetch => (4, 12),
        ApiKey::Produce => (3, 12),
        // Not sent by this client.
        _ => (0, -1),
    }
}

/// The version of each API used on one connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Versions {
    pub metadata: i16,
    pub list_offsets: i16,
    pub fetch: i16,
    /// `None`: the broker takes no records from this client (reading needs none).
    pub produce: Option<i16>,
}

impl Versions {
    /// The newest version of each API both sides support; an error naming the first API the
    /// broker does not support in any version this client speaks.
    pub fn pick(broker: &ApiVersionsResponse) -> Result<Versions, String> {
        let pick = |key: ApiKey| {
            let (lo, hi) = ours(key);
            let theirs = broker.api_keys.iter().find(|a| a.api_key == key as i16);
            match theirs {
                Some(a) if a.min_version <= hi && lo <= a.max_version => Ok(hi.min(a.max_version)),
                Some(a) => Err(format!(
                    "the broker speaks {key:?} versions {}..={}, this client {lo}..={hi}",
                    a.min_version, a.max_version
                )),
                None => Err(format!("the broker does not support {key:?}")),
            }
        };
        Ok(Versions {
            metadata: pick(ApiKey::Metadata)?,
            list_offsets: pick(ApiKey::ListOffsets)?,
            fetch: pick(ApiKey::Fetch)?,
            produce: pick(ApiKey::Produce).ok(),
        })
    }
}

/// A connection to one broker.
pub(crate) struct Conn {
    stream: TcpStream,
    addr: String,
    next_id: i32,
    /// The versions picked for this broker.
    pub versions: Versions,
}

impl Conn {
    /// Connects to `addr` (`host:port`) and asks which API versions it supports.
    pub async fn open(addr: &str) -> Result<Conn, WireError> {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(WireError::Io(format!("connecting to {addr}: {e}"))),
            Err(_) => {
                return Err(WireError::Io(format!(
                    "connecting to {addr}: no answer within {CONNECT_TIMEOUT:?}"
                )))
            }
        };
        // Requests are small and waited on: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            addr: addr.to_string(),
            next_id: 0,
            versions: Versions::default(),
        };
        let answer = conn
            .call(&ApiVersionsRequest::default(), 0, Duration::ZERO)
            .await?;
        if answer.error_code != 0 {
            return Err(WireError::Protocol(format!(
                "{addr}: ApiVersions answered error {}",
                answer.error_code
            )));
        }
        conn.versions =
            Versions::pick(&answer).map_err(|e| WireError::Protocol(format!("{addr}: {e}")))?;
        tracing::debug!("kafka: connected to {addr}: {:?}", conn.versions);
        Ok(conn)
    }

    /// Sends `req` at `version` and waits for its answer (at most `wait` plus
    /// [`ANSWER_TIMEOUT`]). After an error the connection must not be used again.
    pub async fn call<R: Request>(
        &mut self,
        req: &R,
        version: i16,
        wait: Duration,
    ) -> Result<R::Response, WireError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let frame = encode(req, version, id).map_err(|e| {
            WireError::Protocol(format!("{}: encoding {:?}: {e}", self.addr, key_of::<R>()))
        })?;
        let deadline = wait + ANSWER_TIMEOUT;
        let body = match tokio::time::timeout(deadline, self.exchange(&frame)).await {
            Ok(r) => {
                r.map_err(|e| WireError::Io(format!("{}: {:?}: {e}", self.addr, key_of::<R>())))?
            }
            Err(_) => {
                return Err(WireError::Io(format!(
                    "{}: no answer to {:?} within {deadline:?}",
                    self.addr,
                    key_of::<R>()
                )))
            }
        };
        decode::<R>(body, version, id)
            .map_err(|e| WireError::Protocol(format!("{}: {:?}: {e}", self.addr, key_of::<R>())))
    }

    /// Writes one frame and reads one back.
    async fn exchange(&mut self, frame: &[u8]) -> std::io::Result<Bytes> {
        self.stream.write_all(frame).await?;
        let len = self.stream.read_i32().await?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= MAX_RESPONSE)
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("an answer of {len} bytes"),
                )
            })?;
        let mut body = vec![0; len];
        self.stream.read_exact(&mut body).await?;
        Ok(Bytes::from(body))
    }
}

fn key_of<R: Request>() -> ApiKey {
    ApiKey::try_from(R::KEY).unwrap_or(ApiKey::ApiVersions)
}

/// A request frame: size, header, body.
pub(crate) fn encode<R: Request>(req: &R, version: i16, id: i32) -> Result<Bytes, String> {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(id)
        .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header
        .encode(&mut buf, R::header_version(version))
        .map_err(text)?;
    req.encode(&mut buf, version).map_err(text)?;
    let len = i32::try_from(buf.len() - 4).map_err(text)?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// The answer to request `id` (a frame's body, without its size).
pub(crate) fn decode<R: Request>(
    mut body: Bytes,
    version: i16,
    id: i32,
) -> Result<R::Response, String> {
    let header =
        ResponseHeader::decode(&mut body, R::Response::header_version(version)).map_err(text)?;
    if header.correlation_id != id {
        return Err(format!(
            "the answer is to request {}, not {id}",
            header.correlation_id
        ));
    }
    let answer = R::Response::decode(&mut body, version).map_err(text)?;
    if body.has_remaining() {
        tracing::debug!("kafka: {} bytes after an answer ignored", body.remaining());
    }
    Ok(answer)
}

/// An error of `kafka-protocol` (an `anyhow` error) as text, with its causes.
pub(crate) fn text(e: impl fmt::Display) -> String {
    format!("{e:#}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::MetadataRequest;

    fn broker(apis: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
        ApiVersionsResponse::default().with_api_keys(
            apis.iter()
                .map(|&(k, lo, hi)| {
                    ApiVersion::default()
                        .with_api_key(k as i16)
                        .with_min_version(lo)
                        .with_max_version(hi)
                })
                .collect(),
        )
    }

    #[test]
    fn the_newest_version_both_sides_speak_is_picked() {
        let v = Versions::pick(&broker(&[
            (ApiKey::Metadata, 0, 9),
            (ApiKey::ListOffsets, 0, 11),
            (ApiKey::Fetch, 0, 17),
            (ApiKey::Produce, 0, 8),
        ]))
        .unwrap();
        assert_eq!(
            v,
            Versions {
                metadata: 9,
                list_offsets: 9,
                fetch: 12,
                produce: Some(8)
            }
        );
    }

    #[test]
    fn a_broker_without_a_common_version_is_named() {
        let e = Versions::pick(&broker(&[
            (ApiKey::Metadata, 0, 9),
            (ApiKey::ListOffsets, 0, 11),
            (ApiKey::Fetch, 0, 3),
            (ApiKey::Produce, 0, 8),
        ]))
        .unwrap_err();
        assert!(e.contains("Fetch versions 0..=3"), "{e}");
        let e = Versions::pick(&broker(&[(ApiKey::Metadata, 0, 9)])).unwrap_err();
        assert!(e.contains("does not support ListOffsets"), "{e}");
    }

    #[test]
    fn a_broker_without_produce_can_still_be_read() {
        let v = Versions::pick(&broker(&[
            (ApiKey::Metadata, 0, 9),
            (ApiKey::ListOffsets, 0, 11),
            (ApiKey::Fetch, 4, 17),
        ]))
        .unwrap();
        assert_eq!((v.fetch, v.produce), (12, None));
    }

    #[test]
    fn a_frame_is_its_size_then_header_then_body() {
        let f = encode(&MetadataRequest::default(), 4, 77).unwrap();
        assert_eq!(
            i32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
            f.len() - 4
        );
        assert_eq!(i16::from_be_bytes([f[4], f[5]]), ApiKey::Metadata as i16);
        assert_eq!(i16::from_be_bytes([f[6], f[7]]), 4);
        assert_eq!(i32::from_be_bytes(f[8..12].try_into().unwrap()), 77);
    }

    #[test]
    fn an_answer_to_another_request_is_refused() {
        let mut body = BytesMut::new();
        body.put_i32(5); // correlation id
        let e = decode::<MetadataRequest>(body.freeze(), 4, 6).unwrap_err();
        assert!(e.contains("request 5, not 6"), "{e}");
    }
}
