//! Ring all-reduce of dense gradients among the workers of a job (the AIACC way): every worker
//! ends with the same average of everybody's vector, each link carrying `2 (n - 1) / n` of the
//! vector per call instead of the whole vector to and from a parameter server.
//!
//! * [`wire`] - the frames on a link (header + packed little-endian values, f32 or
//!   fp16/bf16-compressed).
//! * [`form`] - forming the ring over TCP: each rank listens, connects to the next and accepts
//!   the previous one, both sides checking the job token, the rank and the ring size.
//! * [`ring`] - [`Ring::allreduce`]: reduce-scatter then all-gather over `n` chunks, sending to
//!   the next rank while receiving from the previous one.
//!
//! **Same bits everywhere.** Chunk `k` is summed in one order only, along the ring from rank
//! `k + 1`, by one rank, which then divides by `n` and (compressed) rounds it to the wire type;
//! the all-gather hands out exactly those values, and the owner keeps the rounded values too.
//! So after every call all ranks hold bit-identical vectors, whatever the compression.

pub mod form;
pub mod ring;
pub mod wire;

pub use form::{form_ring, RingConfig, RingTls};
pub use ring::{Link, Ring};
pub use wire::Compression;

/// Errors of forming or using a ring.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// A link failed: the peer died, closed the connection or did not answer in time.
    #[error("ring link to {peer} ({what}): {source}")]
    Link {
        /// Which neighbour (`next rank 2`, `previous rank 1`).
        peer: String,
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A peer sent something that is not the expected frame (another job, another step).
    #[error("ring protocol: {0}")]
    Protocol(String),
    /// A peer presented a wrong token.
    #[error("ring: {0}")]
    Auth(String),
    /// Forming the ring took longer than allowed.
    #[error("ring: {0}")]
    Timeout(String),
    /// The configuration is inconsistent.
    #[error("ring config: {0}")]
    Config(String),
}
