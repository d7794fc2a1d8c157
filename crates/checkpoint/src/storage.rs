//! Where checkpoint files live: the [`Storage`] trait and the local-directory backend.
//!
//! Names are relative paths with `/` separators (`ckpt-0000000000000007/manifest.ckpt`).
//! Writes are atomic: a blob becomes visible under its name only when its writer is
//! finished (local directories: temporary file + `fsync` + rename); a writer dropped without
//! [`BlobWriter::finish`] leaves nothing behind.

use std::fs;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CheckpointError, Result};

/// A blob being written; visible under its name only after [`BlobWriter::finish`].
pub trait BlobWriter: Write + Send {
    /// Flushes and publishes the blob atomically.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// A stored blob and its size in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobInfo {
    /// Relative name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// Named-blob storage used by checkpoints (local directory, object store, ...).
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// Starts writing `name` (replacing any existing blob when finished).
    fn create(&self, name: &str) -> Result<Box<dyn BlobWriter + '_>>;
    /// Opens `name` for streaming reads; returns the reader and the blob size.
    fn open(&self, name: &str) -> Result<(Box<dyn Read + Send + '_>, u64)>;
    /// All blobs whose name starts with `prefix`, sorted by name.
    fn list(&self, prefix: &str) -> Result<Vec<BlobInfo>>;
    /// Deletes `name`; deleting a missing blob is not an error.
    fn delete(&self, name: &str) -> Result<()>;
    /// A human-readable location (for reports).
    fn location(&self) -> String;

    /// Removes what unfinished writes left behind (a process killed while writing) for which
    /// `remove(final_name, last_modified)` says so; returns the final names removed. A
    /// backend whose writes leave nothing behind removes nothing.
    fn remove_unfinished(
        &self,
        remove: &dyn Fn(&str, std::time::SystemTime) -> bool,
    ) -> Result<Vec<String>> {
        let _ = remove;
        Ok(Vec::new())
    }

    /// Removes the (local) directory `dir` when it is empty: what a failed write whose files
    /// were all deleted leaves. Stores without directories do nothing.
    fn prune_dir(&self, dir: &str) -> Result<()> {
        let _ = dir;
        Ok(())
    }

    /// Writes a whole blob atomically.
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        let mut w = self.create(name)?;
        w.write_all(data)
            .map_err(|e| CheckpointError::io(name, e))?;
        w.finish()
    }

    /// Checks that blobs can be written here by writing and deleting a small probe blob, so an
    /// unwritable location (read-only, full, wrong permissions) stops a job before its first
    /// step, not at its first checkpoint or export.
    fn check_writable(&self) -> Result<()> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("write-probe-{}-{nanos}", std::process::id());
        self.put(&name, b"sparta write probe\n")?;
        self.delete(&name)
    }

    /// Reads a whole blob.
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let (mut r, size) = self.open(name)?;
        let mut out = Vec::with_capacity(size as usize);
        r.read_to_end(&mut out)
            .map_err(|e| CheckpointError::io(name, e))?;
        Ok(out)
    }
}

/// Checks that a blob name is a relative path of plain components.
pub(crate) fn check_blob_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(CheckpointError::InvalidName(name.to_string()))
    }
}

/// Blobs as files under a local directory.
#[derive(Debug)]
pub struct LocalDir {
    root: PathBuf,
    /// Makes temporary file names unique within this process.
    tmp_seq: AtomicU64,
    /// Whether finished files are `fsync`ed before the rename (durability vs. speed).
    sync: bool,
}

impl LocalDir {
    /// Uses (and creates if needed) the directory `root`; finished files are `fsync`ed.
    pub fn new(root: impl Into<PathBuf>) -> Result<LocalDir> {
        let root = root.into();
        // Not `CheckpointError::io`: a missing parent here is a failed creation, not a
        // missing checkpoint file.
        fs::create_dir_all(&root).map_err(|source| CheckpointError::CreateDir {
            dir: root.display().to_string(),
            source,
        })?;
        Ok(LocalDir {
            root,
            tmp_seq: AtomicU64::new(0),
            sync: true,
        })
    }

    /// Turns `fsync` of finished files on or off (off: faster, not crash-durable).
    pub fn with_sync(mut self, sync: bool) -> LocalDir {
        self.sync = sync;
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        check_blob_name(name)?;
        Ok(self.root.join(name))
    }

    fn walk(&self, dir: &Path, rel: &str, out: &mut Vec<BlobInfo>) -> Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(CheckpointError::io(&dir.display().to_string(), e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io(&dir.display().to_string(), e))?;
            let Ok(file_name) = entry.file_name().into_string() else {
                continue;
            };
            if file_name.starts_with(".tmp-") {
                continue; // an unfinished write
            }
            let name = if rel.is_empty() {
                file_name
            } else {
                format!("{rel}/{file_name}")
            };
            let ft = entry
                .file_type()
                .map_err(|e| CheckpointError::io(&name, e))?;
            if ft.is_dir() {
                self.walk(&entry.path(), &name, out)?;
            } else if ft.is_file() {
                let size = entry
                    .metadata()
                    .map_err(|e| CheckpointError::io(&name, e))?
                    .len();
                out.push(BlobInfo { name, size });
            }
        }
        Ok(())
    }
}

/// A temporary file renamed to its final name on `finish`; removed if dropped unfinished.
struct LocalWriter {
    file: Option<BufWriter<fs::File>>,
    tmp: PathBuf,
    dest: PathBuf,
    name: String,
    sync: bool,
}

impl Write for LocalWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file
            .as_mut()
            .expect("LocalWriter used after finish")
            .write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.file
            .as_mut()
            .expect("LocalWriter used after finish")
            .write_all(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.as_mut().map_or(Ok(()), |f| f.flush())
    }
}

impl BlobWriter for LocalWriter {
    fn finish(mut self: Box<Self>) -> Result<()> {
        let name = self.name.clone();
        let io = |e| CheckpointError::io(&name, e);
        let file = self.file.take().expect("LocalWriter finished twice");
        let tmp = self.tmp.clone();
        // A failed finish (full disk at the flush or sync, a blocked rename) leaves nothing.
        let cleanup = |e: CheckpointError| {
            let _ = fs::remove_file(&tmp);
            e
        };
        let file = file.into_inner().map_err(|e| cleanup(io(e.into_error())))?;
        if self.sync {
            file.sync_all().map_err(|e| cleanup(io(e)))?;
        }
        drop(file);
        fs::rename(&self.tmp, &self.dest).map_err(|e| cleanup(io(e)))?;
        if self.sync {
            if let Some(dir) = self.dest.parent() {
                // Make the rename itself durable.
                if let Ok(d) = fs::File::open(dir) {
                    let _ = d.sync_all();
                }
            }
        }
        Ok(())
    }
}

impl Drop for LocalWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl Storage for LocalDir {
    fn create(&self, name: &str) -> Result<Box<dyn BlobWriter + '_>> {
        let dest = self.path(name)?;
        let dir = dest.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io(name, e))?;
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let base = dest.file_name().and_then(|s| s.to_str()).unwrap_or("blob");
        let tmp = dir.join(format!(".tmp-{}-{seq}-{base}", std::process::id()));
        let file = fs::File::create(&tmp).map_err(|e| CheckpointError::io(name, e))?;
        Ok(Box::new(LocalWriter {
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            tmp,
            dest,
            name: name.to_string(),
            sync: self.sync,
        }))
    }

    fn open(&self, name: &str) -> Result<(Box<dyn Read + Send + '_>, u64)> {
        let path = self.path(name)?;
        let file = fs::File::open(&path).map_err(|e| CheckpointError::io(name, e))?;
        let size = file
            .metadata()
            .map_err(|e| CheckpointError::io(name, e))?
            .len();
        Ok((
            Box::new(std::io::BufReader::with_capacity(1 << 20, file)),
            size,
        ))
    }

    fn list(&self, prefix: &str) -> Result<Vec<BlobInfo>> {
        let mut out = Vec::new();
        self.walk(&self.root, "", &mut out)?;
        out.retain(|b| b.name.starts_with(prefix));
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.path(name)?;
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(CheckpointError::io(name, e)),
        }
        // Remove directories left empty (best effort).
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == self.root || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn prune_dir(&self, dir: &str) -> Result<()> {
        let path = self.path(dir)?;
        if path != self.root {
            // Fails when not empty (another writer's files) or already gone: both fine.
            let _ = fs::remove_dir(&path);
        }
        Ok(())
    }

    fn remove_unfinished(
        &self,
        remove: &dyn Fn(&str, std::time::SystemTime) -> bool,
    ) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.walk_unfinished(&self.root, "", remove, &mut out)?;
        Ok(out)
    }
}

impl LocalDir {
    /// The temporary files of unfinished writes under `dir`: removes those `remove` selects.
    fn walk_unfinished(
        &self,
        dir: &Path,
        rel: &str,
        remove: &dyn Fn(&str, std::time::SystemTime) -> bool,
        out: &mut Vec<String>,
    ) -> Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(CheckpointError::io(&dir.display().to_string(), e)),
        };
        for entry in entries.flatten() {
            let Ok(file_name) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(ft) = entry.file_type() else { continue };
            let child = if rel.is_empty() {
                file_name.clone()
            } else {
                format!("{rel}/{file_name}")
            };
            if ft.is_dir() {
                self.walk_unfinished(&entry.path(), &child, remove, out)?;
                continue;
            }
            // `.tmp-<pid>-<seq>-<final file name>`
            let Some(base) = file_name
                .strip_prefix(".tmp-")
                .and_then(|r| r.splitn(3, '-').nth(2))
            else {
                continue;
            };
            let name = if rel.is_empty() {
                base.to_string()
            } else {
                format!("{rel}/{base}")
            };
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            if remove(&name, modified) {
                match fs::remove_file(entry.path()) {
                    Ok(()) => out.push(name),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(CheckpointError::io(&child, e)),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_atomic_and_names_checked() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDir::new(dir.path()).unwrap().with_sync(false);
        let mut w = s.create("a/b.bin").unwrap();
        w.write_all(b"half").unwrap();
        drop(w);
        assert!(
            s.list("").unwrap().is_empty(),
            "an unfinished write leaves nothing"
        );
        s.put("a/b.bin", b"whole").unwrap();
        assert_eq!(s.get("a/b.bin").unwrap(), b"whole");
        assert_eq!(
            s.list("a/").unwrap(),
            vec![BlobInfo {
                name: "a/b.bin".into(),
                size: 5
            }]
        );
        s.delete("a/b.bin").unwrap();
        s.delete("a/b.bin").unwrap();
        assert!(!dir.path().join("a").exists());
        // What a process killed mid-write leaves: found by its final name, removed on demand.
        let w = s.create("c/d.rows").unwrap();
        std::mem::forget(w);
        let w = s.create("c/e.rows").unwrap();
        std::mem::forget(w);
        assert!(s.list("").unwrap().is_empty());
        let gone = s.remove_unfinished(&|n, _| n == "c/d.rows").unwrap();
        assert_eq!(gone, vec!["c/d.rows".to_string()]);
        let left: Vec<_> = fs::read_dir(dir.path().join("c")).unwrap().collect();
        assert_eq!(left.len(), 1);
        assert_eq!(
            s.remove_unfinished(&|_, _| true).unwrap(),
            vec!["c/e.rows".to_string()]
        );
        assert_eq!(fs::read_dir(dir.path().join("c")).unwrap().count(), 0);
        assert!(matches!(
            s.get("a/b.bin"),
            Err(CheckpointError::NotFound(_))
        ));
        for bad in ["", "../x", "a//b", "/abs", "a/./b", "sp ace"] {
            assert!(s.put(bad, b"x").is_err(), "{bad:?} accepted");
        }
    }
}
