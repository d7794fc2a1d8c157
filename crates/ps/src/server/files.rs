//! A shard's files: its part of a checkpoint and of a serving export, written at a
//! checkpoint barrier.

use super::*;

impl Shard {
    /// Writes this shard's part of checkpoint `order` (called at a checkpoint barrier), then
    /// its part of the serving export when one is ordered.
    pub(super) fn write_part(
        &self,
        order: Order,
        export: Option<pb::ExportOrder>,
    ) -> Result<WrittenPart, PartFailure> {
        let ck = self
            .ckpt
            .as_ref()
            .ok_or_else(|| PartFailure::Skip("no checkpoint directory".into()))?;
        // Nothing is in flight: a slot move into or out of this shard switches here, before
        // the part records the rows.
        self.settle_moves(order.id.0)?;
        let tables = self.named_tables();
        let dense = self.dense.snapshot();
        let dense_values = dense.as_ref().map(|(v, _)| v.clone()).unwrap_or_default();
        let (parts, entries) = write_shard_part(&ck.writer, order, self.cfg.shard, &tables, dense)?;
        let export_order = export.clone();
        let export = export.map(|e| {
            self.write_export(&e, &tables)
                .map(|files| ExportPart {
                    files,
                    dense: dense_values,
                })
                .map_err(|why| {
                    tracing::warn!("PS shard {}: export v{}: {why}", self.cfg.shard, e.version);
                    why
                })
        });
        Ok(WrittenPart {
            order,
            parts,
            tables: entries,
            export,
            export_order,
        })
    }

    /// The tables this shard holds, by name.
    pub(super) fn named_tables(&self) -> Vec<(&str, &Table)> {
        self.tables
            .iter()
            .map(|t| (t.config().name.as_str(), &**t))
            .collect()
    }

    /// This shard's exporter for the directory and options of `e` (a new one when they
    /// changed), locked.
    pub(super) fn exporter_for(
        &self,
        e: &pb::ExportOrder,
    ) -> Result<parking_lot::MutexGuard<'_, Option<ShardExporter>>, Refusal> {
        let dir = std::path::PathBuf::from(&e.dir);
        let opts = ExportOptions {
            fp16: e.fp16,
            min_count: e.min_count,
            sync: e.sync,
            ..ExportOptions::default()
        };
        let mut slot = self.exporter.lock();
        let reuse = slot
            .as_ref()
            .is_some_and(|(d, o, _)| *d == dir && *o == opts);
        if !reuse {
            let part = Some(self.cfg.shard as u32);
            let mut ex =
                TableExporter::new(&dir, opts, part).map_err(|e| Refusal::Failed(e.to_string()))?;
            ex.set_members(self.members.clone());
            *slot = Some((dir, opts, ex));
        }
        Ok(slot)
    }

    /// Writes this shard's rows as part `shard` of export version `e.version`: a delta on top
    /// of `e.base` when this shard wrote the base's part (else an error: the coordinator
    /// abandons the version and orders a full one next).
    pub(super) fn write_export(
        &self,
        e: &pb::ExportOrder,
        tables: &[(&str, &Table)],
    ) -> Result<Vec<sparta_export::TableFile>, Refusal> {
        let mut slot = self.exporter_for(e)?;
        let (_, _, ex) = slot.as_mut().expect("set by exporter_for");
        let base = (e.base != 0).then_some(e.base);
        let (kind, files) = ex
            .write(e.version, tables, base)
            .map_err(|err| Refusal::Failed(err.to_string()))?;
        if base.is_some() && kind != ExportKind::Delta {
            return Err(Refusal::Failed(format!(
                "this shard cannot write a delta on top of version {} (it restarted, or that \
                 version was abandoned): the next export must be full",
                e.base
            )));
        }
        Ok(files)
    }
}
