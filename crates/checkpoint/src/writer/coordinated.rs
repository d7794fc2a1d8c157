//! Checkpoints written by several processes (the shards of a PS cluster): each writes its
//! share with [`Checkpointer::begin_at`] and [`PendingCheckpoint::into_parts`]; a coordinator
//! collects the parts and commits the manifest.

use parking_lot::Mutex;
use std::collections::HashMap;

use super::{Chain, Checkpointer, Cursor, PendingCheckpoint};
use crate::error::{CheckpointError, Result};
use crate::manifest::{CheckpointId, CheckpointKind, Manifest, PartContent, PartEntry, TableEntry};

impl Checkpointer {
    /// Starts this process's share of a checkpoint whose id, base and predecessor were chosen
    /// by a coordinator (one PS shard of a cluster checkpoint). An incremental share needs this
    /// process's chain to end at `prev`, else it fails with [`CheckpointError::NeedFull`].
    /// Finish it with [`PendingCheckpoint::into_parts`]; the coordinator commits the manifest.
    pub fn begin_at(
        &self,
        id: CheckpointId,
        kind: CheckpointKind,
        base: CheckpointId,
        prev: Option<CheckpointId>,
    ) -> Result<PendingCheckpoint<'_>> {
        let chain = self.chain.lock().clone();
        let since = match kind {
            CheckpointKind::Full => HashMap::new(),
            CheckpointKind::Incremental => match chain {
                Some(c) if Some(c.last) == prev && c.base == base => c.cursors,
                other => {
                    return Err(CheckpointError::NeedFull {
                        table: String::new(),
                        part: String::new(),
                        reason: format!(
                        "the coordinator extends {} (base {base}), this process's chain ends at {}",
                        prev.map_or("nothing".to_string(), |p| p.to_string()),
                        other.map_or("nothing".to_string(), |c| c.last.to_string())
                    ),
                    })
                }
            },
        };
        Ok(PendingCheckpoint {
            ck: self,
            id,
            kind,
            base: if kind == CheckpointKind::Full {
                id
            } else {
                base
            },
            prev: if kind == CheckpointKind::Full {
                None
            } else {
                prev
            },
            since,
            parts: Mutex::new(Vec::new()),
            tables: Mutex::new(Vec::new()),
            members: Mutex::new(self.members.lock().clone()),
            cursors: Mutex::new(HashMap::new()),
        })
    }

    /// Continues the chain ending at a committed checkpoint whose manifest is `m` (a cluster
    /// coordinator, which holds no tables: the part cursors come from the manifest).
    pub fn resume_manifest(&self, m: &Manifest) {
        self.resume_parts(m.base, m.id, &m.parts);
    }

    /// Continues the chain (base `base`) at checkpoint `last`, whose table parts `parts` this
    /// process's tables stand at: the next incremental share holds the rows changed after
    /// each part's version. A backup copy of a PS shard follows its primary's chain so, once
    /// promoted, the next share it writes is incremental (its rows carry the primary's
    /// versions).
    pub fn resume_parts(&self, base: CheckpointId, last: CheckpointId, parts: &[PartEntry]) {
        let mut cursors = HashMap::new();
        for p in parts {
            if let PartContent::Table {
                table,
                version,
                table_step,
                ..
            } = &p.content
            {
                let c = Cursor {
                    version: *version,
                    step: *table_step,
                };
                cursors.insert((table.clone(), p.part.clone()), c);
            }
        }
        *self.chain.lock() = Some(Chain {
            base,
            last,
            cursors,
        });
    }
}

impl PendingCheckpoint<'_> {
    /// Ends this process's share of a coordinated checkpoint ([`Checkpointer::begin_at`]): the
    /// parts written and their table entries (configs, and logical tables where set), for
    /// the coordinator's manifest ([`PendingCheckpoint::add_table_part`]). This process's
    /// chain moves on to this checkpoint (a later incremental share must name it as `prev`).
    pub fn into_parts(mut self) -> (Vec<PartEntry>, Vec<TableEntry>) {
        let parts = std::mem::take(self.parts.get_mut());
        let tables = self.take_tables();
        self.advance_chain();
        (parts, tables)
    }
}
