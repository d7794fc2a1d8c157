//! Sparta's parameter-server cluster.
//!
//! A PS shard ([`server`]) hosts its part of every sparse table of a job (keys routed by the
//! stable `sparta_core::shard_of`) and one contiguous slice of the flat dense parameter
//! vector, to which it applies the dense optimizer. Workers reach the shards through
//! [`client::RemoteStore`], which implements the worker's `SparseStore` and `DenseStore`
//! seams over gRPC (tonic): one request per shard per step and direction for all tables (the
//! step's distinct keys travel once), sent to all shards in parallel, with keys and values as packed little-endian bytes ([`wire`]).
//!
//! Every push (sparse `Push`, dense `DensePushPull`) carries a push id, the same on every
//! attempt: a shard applies it once and answers a retry with the first answer ([`once`]).
//!
//! Every RPC carries a shared token ([`auth`]); the gRPC port can use TLS ([`tls`]); every process can serve Prometheus metrics and
//! a health check ([`metrics`]).

#[cfg(not(target_endian = "little"))]
compile_error!("sparta-ps sends packed little-endian bytes and supports little-endian hosts only");

pub mod auth;
pub mod ckpt;
pub mod client;
pub mod coord;
pub mod dense;
pub mod error;
pub mod failover;
pub mod fault;
pub mod idle;
pub mod metrics;
pub mod once;
pub mod replica;
pub mod replicator;
pub mod resume;
pub mod role;
pub mod server;
pub mod stall;
pub mod tls;
pub mod wire;

/// The generated protobuf messages and gRPC stubs of `proto/ps.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("sparta.ps.v1");
}

pub use client::{ClientConfig, RemoteStore};
pub use dense::Mode;
pub use error::PsError;
pub use fault::{DropAnswer, FaultHook};
pub use metrics::Metrics;
pub use server::{PsConfig, Shard};
pub use tls::{ClientTls, ServerTls};
pub use wire::Compression;

/// Default largest gRPC message accepted or sent (bytes).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 << 20;

/// The contiguous range `(offset, len)` of a flat dense vector of `total` values held by
/// `shard` of `num_shards`: equal slices of `ceil(total / num_shards)`, the last one shorter.
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
