//! Sparta's parameter server: the server side of a PS cluster.
//!
//! A PS shard ([`server`]) hosts its part of every sparse table of a job (keys routed by the
//! stable `sparta_core::shard_of`) and one contiguous slice of the flat dense parameter
//! vector ([`dense`]), to which it applies the dense optimizer. Workers reach the shards
//! through `sparta_cluster::RemoteStore`; what both sides agree on (messages, packed wire
//! encodings, headers, token, TLS, metrics) is the protocol crate `sparta_proto`.
//!
//! Every push (sparse `Push`, dense `DensePushPull`) carries a push id, the same on every
//! attempt: a shard applies it once and answers a retry with the first answer ([`once`]).
//! Checkpoint rounds meet at a barrier on every shard ([`ckpt`]); replicated shards
//! ([`replica`], [`replicator`], [`role`]) fail over under the coordinator ([`failover`]).
//! Slots move between running shards ([`moves`], [`mover`]), and shards are added to a
//! training cluster or removed from it ([`scaler`]).

#[cfg(not(target_endian = "little"))]
compile_error!("sparta-ps sends packed little-endian bytes and supports little-endian hosts only");

pub mod ckpt;
pub mod dense;
pub mod error;
pub mod failover;
pub mod fault;
pub mod idle;
pub mod mover;
pub mod moves;
pub mod once;
pub mod replica;
pub mod replicator;
pub mod resume;
pub mod role;
pub mod scaler;
pub mod server;
pub mod stall;

pub use dense::Mode;
pub use error::PsError;
pub use fault::{DropAnswer, FaultHook};
pub use server::{PsConfig, Shard};
