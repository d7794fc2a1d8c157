//! The copies of replicated shards (`--replicas`), as the `Checksum` RPC of each describes
//! them.

use sparta_proto::pb::ChecksumRequest;

/// One copy of a shard: (shard, process, primary, tables (name, rows, sum), dense hash).
pub type ShardCopy = (u32, usize, bool, Vec<(String, u64, u64)>, u64);

/// Checksums of every copy of every shard the PS processes at `addrs` (in shard order,
/// plain gRPC) hold, asked with `token`.
pub fn checksums(addrs: &[String], token: &str) -> Vec<ShardCopy> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut out = Vec::new();
        for (p, addr) in addrs.iter().enumerate() {
            let mut c = sparta_ps::replica::peer_client(addr, token, 64 << 20, None).unwrap();
            for shard in 0..addrs.len() as u32 {
                if let Ok(r) = c.checksum(ChecksumRequest { shard }).await {
                    let r = r.into_inner();
                    let tables = r.tables.iter().map(|t| (t.name.clone(), t.rows, t.sum));
                    out.push((shard, p, r.primary, tables.collect(), r.dense));
                }
            }
        }
        out
    })
}
