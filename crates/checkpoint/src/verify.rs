//! Verifying a checkpoint's files against its manifest: the checks shared by restoring
//! ([`crate::restore_latest`], [`crate::newest_valid`]) and [`crate::inspect`].

use std::collections::HashMap;

use crate::error::{CheckpointError, Result};
use crate::manifest::{Manifest, PartContent, PartEntry};
use crate::rows::{read_part, PartSinks, Rows};
use crate::state::read_dense;
use crate::storage::Storage;

/// Cheap pre-check of a checkpoint: every listed file exists with the listed size.
pub(crate) fn check_sizes(storage: &dyn Storage, m: &Manifest) -> Result<()> {
    let present: HashMap<String, u64> = storage
        .list(&format!("{}/", m.id.dir()))?
        .into_iter()
        .map(|b| (b.name, b.size))
        .collect();
    for p in &m.parts {
        let name = m.id.file(&p.file);
        match present.get(&name) {
            None => return Err(CheckpointError::corrupt(&name, "missing part file")),
            Some(&s) if s != p.bytes => {
                return Err(CheckpointError::corrupt(
                    &name,
                    format!(
                        "{s} bytes, manifest says {} (truncated or overwritten)",
                        p.bytes
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Checks a read part against its manifest entry.
pub(crate) fn check_entry(
    name: &str,
    p: &PartEntry,
    rows: u64,
    removed: u64,
    sum: u64,
) -> Result<()> {
    let want = format!("{sum:016x}");
    if want != p.checksum {
        return Err(CheckpointError::corrupt(
            name,
            format!("checksum {want}, manifest says {}", p.checksum),
        ));
    }
    if rows != p.rows || removed != p.removed {
        return Err(CheckpointError::corrupt(
            name,
            format!(
                "{rows} rows / {removed} removed, manifest says {} / {}",
                p.rows, p.removed
            ),
        ));
    }
    Ok(())
}

/// Reads one part file whole and checks it against its manifest entry (checksum, rows,
/// size); the rows are not kept.
pub(crate) fn verify_part(storage: &dyn Storage, m: &Manifest, p: &PartEntry) -> Result<()> {
    let name = m.id.file(&p.file);
    if p.file.contains('/') {
        return Err(CheckpointError::corrupt(
            &name,
            "part file outside the checkpoint directory",
        ));
    }
    match &p.content {
        PartContent::Dense { params } => {
            let (d, sum) = read_dense(storage, &name)?;
            check_entry(&name, p, 0, 0, sum)?;
            if d.params.len() != *params {
                return Err(CheckpointError::corrupt(
                    &name,
                    "dense parameter count differs from the manifest",
                ));
            }
        }
        PartContent::Table {
            table, row_stride, ..
        } => {
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
            let stats = read_part(
                storage,
                &name,
                (table, &p.part, *row_stride),
                threads,
                PartSinks {
                    removed: |_: &[u64]| Ok(()),
                    rows: |_: Rows| Ok(()),
                    sketch: |_: usize, _: &[u16], _: u64| Ok(()),
                },
            )?;
            check_entry(&name, p, stats.rows, stats.removed, stats.checksum)?;
            if stats.bytes != p.bytes {
                return Err(CheckpointError::corrupt(
                    &name,
                    format!("{} bytes, manifest says {}", stats.bytes, p.bytes),
                ));
            }
        }
    }
    Ok(())
}

/// Checks a whole checkpoint: every listed file present with its size, then every part read
/// and verified ([`verify_part`]).
pub(crate) fn verify_all(storage: &dyn Storage, m: &Manifest) -> Result<()> {
    check_sizes(storage, m)?;
    for p in &m.parts {
        verify_part(storage, m, p)?;
    }
    Ok(())
}
