//! Sparta's cluster protocol: what the PS shards (`sparta-ps`) and the workers' side
//! (`sparta-cluster`) must agree on, and nothing either side does alone.
//!
//! - [`pb`]: the gRPC messages and services of `proto/ps.proto` (tonic/prost; keys and values
//!   as packed byte fields);
//! - [`wire`]: the packed little-endian encodings of keys and values, and the one
//!   [`Compression`] of embedding values on the wire;
//! - [`headers`]: request headers (shard, epoch) and the message prefixes by which a worker
//!   tells a refusal's kind apart; [`status`]: classifying a failed call;
//! - [`auth`]: the shared token every RPC carries and the incarnation check; [`tls`]: TLS
//!   configuration and the one endpoint builder every client uses;
//! - [`ckpt`]: the checkpoint round's order and worker positions on the wire;
//! - [`metrics`]: the Prometheus registry every cluster process serves (`/metrics`, `/health`);
//!   [`training_metrics`]: a trainer's progress gauges in it; [`exposition`]: merging the
//!   expositions of a launcher's children into one.

#[cfg(not(target_endian = "little"))]
compile_error!(
    "sparta-proto sends packed little-endian bytes and supports little-endian hosts only"
);

pub mod auth;
pub mod ckpt;
pub mod error;
pub mod exposition;
pub mod headers;
pub mod metrics;
pub mod status;
pub mod tls;
pub mod training_metrics;
pub mod wire;

/// The generated protobuf messages and gRPC stubs of `proto/ps.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("sparta.ps.v1");
}

pub use error::{ProtoError, WireError};
pub use metrics::Metrics;
pub use tls::{ClientTls, ServerTls};
pub use wire::Compression;

/// Default largest gRPC message accepted or sent (bytes).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 << 20;

/// The contiguous range `(offset, len)` of a flat dense vector of `total` values held by
/// `shard` of `num_shards`: equal slices of `ceil(total / num_shards)`, the last one shorter.
/// The shards serve these slices and the workers cut their pushes by them.
pub fn dense_slice(total: usize, shard: usize, num_shards: usize) -> (usize, usize) {
    let chunk = total.div_ceil(num_shards.max(1));
    let lo = (shard * chunk).min(total);
    let hi = (lo + chunk).min(total);
    (lo, hi - lo)
}

#[cfg(test)]
mod tests {
    use super::dense_slice;

    #[test]
    fn dense_slices_cover_the_vector_exactly() {
        for total in [0usize, 1, 7, 100, 1001] {
            for n in 1..6 {
                let mut next = 0;
                for s in 0..n {
                    let (off, len) = dense_slice(total, s, n);
                    assert_eq!(off, next, "total {total} n {n} shard {s}");
                    next = off + len;
                }
                assert_eq!(next, total);
            }
        }
    }
}
