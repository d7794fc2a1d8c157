//! Forgetting on request (`sparta forget --ps`): keys removed from every shard's primary, which
//! forwards the removal to its backups before answering.

use super::*;

impl RemoteStore {
    /// The job's physical tables by name, in `TableId` order (what [`RemoteStore::forget`]'s
    /// `keys` are indexed by).
    pub fn table_names(&self) -> &[String] {
        &self.names
    }

    /// Removes `keys[t]` from physical table `t` on the shard owning each key (its primary,
    /// followed through failovers as every request is); each shard answers once its backups
    /// applied the removal. Returns, per shard that was sent keys, the rows it removed per
    /// table (`keys.len()` entries; keys no copy held count nothing).
    pub fn forget(&self, keys: &[Vec<u64>]) -> Result<Vec<(usize, Vec<u64>)>, CoreError> {
        if keys.len() != self.dims.len() {
            return Err(CoreError::Config(format!(
                "keys of {} tables to forget, the job has {}",
                keys.len(),
                self.dims.len()
            )));
        }
        let n = self.shards().len();
        let mut per: Vec<Vec<Vec<u64>>> = vec![vec![Vec::new(); keys.len()]; n];
        let routing = sparta_core::SparseStore::routing(self);
        for (t, ks) in keys.iter().enumerate() {
            for &k in ks {
                per[routing.shard_of(k)][t].push(k);
            }
        }
        // The tables each shard's request names, in request order.
        let asked: Vec<Vec<usize>> = per
            .iter()
            .map(|tables| {
                (0..tables.len())
                    .filter(|&t| !tables[t].is_empty())
                    .collect()
            })
            .collect();
        let reqs = per
            .iter()
            .enumerate()
            .filter(|(i, _)| !asked[*i].is_empty())
            .map(|(i, tables)| {
                let tables: Vec<pb::ForgetKeys> = asked[i]
                    .iter()
                    .map(|&t| pb::ForgetKeys {
                        table: t as u32,
                        keys: wire::keys_to_bytes(&tables[t]),
                    })
                    .collect();
                let rows = tables.iter().map(|t| t.keys.len() as u64 / 8).sum();
                (i, pb::ForgetRequest { tables }, rows)
            })
            .collect();
        // Counted with the `Info` calls in this client's metrics (a tool's, never served).
        let resps = self.fan_out(Rpc::Info, "forget", reqs, |mut c, r| async move {
            c.forget(r).await
        })?;
        resps
            .into_iter()
            .map(|(i, r)| {
                if r.removed.len() != asked[i].len() {
                    return Err(transport(format!(
                        "PS shard {i} at {}: forget reply counts {} tables, {} were asked (an \
                         older PS?)",
                        self.routes.addr(i),
                        r.removed.len(),
                        asked[i].len()
                    )));
                }
                let mut out = vec![0u64; keys.len()];
                for (&t, &m) in asked[i].iter().zip(&r.removed) {
                    out[t] = m;
                }
                Ok((i, out))
            })
            .collect()
    }
}
