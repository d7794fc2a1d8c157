//! What a worker's traffic cost: RPCs per step and bytes per sample on the wire, against the
//! least the sparse traffic could be (each distinct id's key once and its row both ways).

use prost::Message;
use sparta_core::features::{Features, PhysicalTable};
use sparta_core::{Job, KeyParts, TableId};
use sparta_proto::metrics::{Rpc, Totals, GRPC_FRAME_BYTES};
use sparta_proto::pb;
use sparta_proto::wire::{self, Compression};

use crate::store::{requests, RemoteStore};

/// A worker's wire figures over its training (before it left: evaluation traffic excluded).
#[derive(Clone, Debug)]
pub struct WireReport {
    /// Every RPC's totals.
    pub totals: Totals,
    /// Distinct ids pulled (one pull carries them once for all tables).
    pub unique_ids: u64,
    /// Bytes of one id's row on the wire (its table's dim, +1 with a wide weight, 4 bytes
    /// each; with tables of several dims, their mean: the minimum is then approximate).
    pub row_bytes: u64,
    /// Bytes of sparse pulls and pushes.
    pub sparse_bytes: u64,
    /// Sparse RPCs (pulls and pushes).
    pub sparse_rpcs: u64,
    /// Bytes of the dense traffic (PS dense push-pulls, or the ring's both ways).
    pub dense_bytes: u64,
    /// Training steps (at least 1).
    pub steps: u64,
}

/// The figures of `store`'s metrics after `steps` steps of `job`.
pub fn wire_report(store: &RemoteStore, job: &Job, steps: u64) -> WireReport {
    let met = store.metrics();
    let tables = &job.features.tables;
    let floats: usize = tables.iter().map(|t| t.dim + usize::from(t.wide)).sum();
    WireReport {
        totals: met.totals(),
        unique_ids: met.rows(Rpc::Pull),
        row_bytes: (4 * floats / tables.len().max(1)) as u64,
        sparse_bytes: met.bytes(Rpc::Pull) + met.bytes(Rpc::Push),
        sparse_rpcs: met.requests(Rpc::Pull) + met.requests(Rpc::Push),
        dense_bytes: met.bytes(Rpc::DensePushPull),
        steps: steps.max(1),
    }
}

impl WireReport {
    /// The least sparse bytes: every distinct id's key (8 bytes) and its row pulled and pushed.
    fn sparse_min_bytes(&self) -> u64 {
        self.unique_ids * (8 + 2 * self.row_bytes)
    }

    /// The summary's `wire` object, per `samples` trained.
    pub fn json(&self, samples: f64) -> serde_json::Value {
        let t = &self.totals;
        serde_json::json!({
            "unique_ids": self.unique_ids,
            "sparse_bytes_per_sample": self.sparse_bytes as f64 / samples,
            "sparse_min_bytes_per_sample": self.sparse_min_bytes() as f64 / samples,
            "dense_bytes_per_sample": self.dense_bytes as f64 / samples,
            "bytes_sent": t.bytes_out,
            "bytes_received": t.bytes_in,
            "rpcs": t.requests,
            "rpcs_per_step": t.requests as f64 / self.steps as f64,
            "sparse_rpcs_per_step": self.sparse_rpcs as f64 / self.steps as f64,
            "bytes_per_sample": (t.bytes_out + t.bytes_in) as f64 / samples,
        })
    }

    /// The line the binary prints.
    pub fn line(&self, rank: usize, samples: f64) -> String {
        format!(
            "worker {rank}: {} RPCs ({:.2}/step, {:.2} sparse), bytes per sample on the wire: {:.0} sparse (minimum {:.0}) + {:.0} dense",
            self.totals.requests,
            self.totals.requests as f64 / self.steps as f64,
            self.sparse_rpcs as f64 / self.steps as f64,
            self.sparse_bytes as f64 / samples,
            self.sparse_min_bytes() as f64 / samples,
            self.dense_bytes as f64 / samples,
        )
    }
}

/// The bytes one step's sparse traffic puts on the wire, counted as [`wire_report`] counts a
/// worker's (every request and answer: protobuf body and gRPC framing): the pull and the push
/// of every shard holding some of `keys` (a step's distinct keys, grouped by shard and class
/// as the dedup groups them), for every table of `features`, values encoded as `compression`.
/// A prediction made without a cluster (`sparta plan`): the requests are those
/// [`RemoteStore`] sends (built by the same functions), the answers those the PS makes.
pub fn sparse_step_bytes(
    features: &Features,
    keys: &KeyParts<'_>,
    compression: Compression,
) -> u64 {
    let tables: Vec<pb::TableSpec> = features
        .physical
        .iter()
        .enumerate()
        .map(|(t, p)| pb::TableSpec {
            table: t as u32,
            dim: p.config.dim as u32,
            classes: p.classes,
        })
        .collect();
    // A session is a random 64-bit number (its varint is 10 bytes at most); sequence numbers
    // and the steps per push stay small.
    let id = Some(pb::PushId {
        rank: 0,
        session: u64::MAX,
        seq: 1,
    });
    let mut bytes = 0;
    for shard in (0..keys.num_shards()).filter(|&i| !keys.shard_range(i).is_empty()) {
        let rows = |p: &PhysicalTable| vec![0.0f32; keys.count(shard, p.classes) * p.config.dim];
        let pull = requests::pull(keys, shard, &tables, true, compression);
        // The PS answers with every table's rows (`ps::server::rpc`'s pull).
        let answer = pb::PullResponse {
            values: features
                .physical
                .iter()
                .map(|p| wire::values_to_bytes(&rows(p), compression))
                .collect(),
            compression: compression.to_proto() as i32,
        };
        let grads = features
            .physical
            .iter()
            .enumerate()
            .map(|(t, p)| {
                requests::table_grads(
                    TableId(t as u16),
                    p.config.dim,
                    p.classes,
                    &rows(p),
                    compression,
                )
            })
            .collect();
        let push = requests::push(keys, shard, grads, compression, id, 1);
        let pushed = pb::PushResponse {};
        bytes += (pull.encoded_len() + answer.encoded_len()) as u64
            + (push.encoded_len() + pushed.encoded_len()) as u64
            + 4 * GRPC_FRAME_BYTES;
    }
    bytes
}

/// The bytes one step's dense traffic puts on the wire in the PS dense modes, counted as
/// [`wire_report`] counts a worker's: one push-pull per shard, the gradients of its slice of
/// the `total` dense parameters out, the slice's values back (f32 both ways).
pub fn dense_step_bytes(total: usize, num_shards: usize) -> u64 {
    (0..num_shards)
        .map(|s| sparta_proto::dense_slice(total, s, num_shards).1)
        .filter(|&len| len > 0)
        .map(|len| {
            let slice = vec![0.0f32; len];
            let id = Some(pb::PushId {
                rank: 0,
                session: u64::MAX,
                seq: 1,
            });
            let req = requests::dense_push_pull(0, 1, total as u64, &slice, id);
            // The PS answers with the slice's new values (`ps::server::rpc`'s push-pull).
            let answer = pb::DenseResponse {
                values: wire::values_to_bytes(&slice, Compression::None),
            };
            (req.encoded_len() + answer.encoded_len()) as u64 + 2 * GRPC_FRAME_BYTES
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_sparse_traffic_is_each_key_once_and_its_row_both_ways() {
        let r = WireReport {
            totals: Totals::default(),
            unique_ids: 10,
            row_bytes: 36,
            sparse_bytes: 2000,
            sparse_rpcs: 8,
            dense_bytes: 400,
            steps: 4,
        };
        let j = r.json(100.0);
        assert_eq!(
            j["sparse_min_bytes_per_sample"],
            10.0 * (8.0 + 72.0) / 100.0
        );
        assert_eq!(j["sparse_rpcs_per_step"], 2.0);
        assert!(r
            .line(1, 100.0)
            .starts_with("worker 1: 0 RPCs (0.00/step, 2.00 sparse)"));
    }
}
