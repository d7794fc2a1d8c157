//! Sparta's cluster worker: the worker's side of a parameter-server cluster.
//!
//! - [`store`]: [`RemoteStore`] implements the worker's `SparseStore` and `DenseStore` seams
//!   over gRPC to every PS shard: one request per shard per step and direction for all
//!   tables, sent to all shards in parallel; unreachable shards retried with backoff; each
//!   shard's primary followed through failovers ([`store::route`]);
//! - [`rounds`]: the checkpoint and export rounds (every worker enters each shard's barrier;
//!   worker 0 commits the manifest and publishes the export); [`resume`]: where the shards'
//!   checkpoint left this worker;
//! - [`ring`]: dense mode allreduce (the ring of the workers and the dense store over it);
//! - [`worker`]: a worker's whole life behind [`ClusterWorker::connect`] and
//!   [`ClusterWorker::run`], called by `sparta worker`; [`report`]: its traffic figures;
//!   [`live_metrics`]: a trainer's figures on `/metrics` (a worker's, or an embedded
//!   `sparta train`'s).
//!
//! The server side is `sparta-ps`; what both sides agree on is `sparta-proto`.

pub mod error;
pub mod live_metrics;
pub mod report;
pub mod resume;
pub mod ring;
pub mod rounds;
pub mod store;
pub mod worker;

pub use error::ClusterError;
pub use ring::{RingDense, RingOptions, RingTlsFiles};
pub use store::{ClientConfig, RemoteStore};
pub use worker::{check_job, ClusterWorker, WorkerOptions, WorkerReport};
