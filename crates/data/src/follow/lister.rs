//! The follower's driver: lists the directory, decides which files are complete and hands
//! them, in name order, to the engine's feeder.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::FollowConfig;
use crate::error::DataError;
use crate::feed::{Feeder, FileJob, STREAM_CHUNK};
use crate::input::{footer_written, is_url, Opener};
use crate::queue::FileRef;

/// Lists the directory and hands complete files to the feeder.
pub(super) struct Lister {
    dir: PathBuf,
    stop_file: Option<PathBuf>,
    settle: Duration,
    poll: Duration,
    header: bool,
    /// The last file started (empty: none yet).
    last: String,
    /// `Some(offset)`: `last` is not finished; continue it at `offset`.
    resume_offset: Option<u64>,
    /// (size, mtime) of waiting files and since when they were seen unchanged.
    observed: HashMap<String, (u64, Option<SystemTime>, Instant)>,
    /// Names sorting before `last` that are accounted for: read, present before the start
    /// position at the first listing, or already reported late.
    known: HashSet<String>,
    /// Whether the directory was listed before.
    listed_once: bool,
    stop: Arc<AtomicBool>,
    /// This worker's share of every file (`(index, count)`), see the follow module docs.
    part: Option<(usize, usize)>,
    /// Opens the files (local) or objects (`dir` is an object-store prefix URL).
    opener: Opener,
}

/// An eligible file of the directory.
struct Listed {
    name: String,
    len: u64,
    modified: Option<SystemTime>,
}

impl Lister {
    /// A lister of `cfg.dir` that starts at `cfg.start` (no file: the first one), opening
    /// what it reads with `opener`.
    pub(super) fn new(cfg: &FollowConfig, header: bool, opener: Opener) -> Self {
        let (last, resume_offset) = if cfg.start.file.is_empty() {
            (String::new(), None)
        } else {
            (cfg.start.file.clone(), Some(cfg.start.offset))
        };
        let (dir, stop_file, settle, poll) =
            (cfg.dir.clone(), cfg.stop_file.clone(), cfg.settle, cfg.poll);
        let (stop, part) = (Arc::clone(&cfg.stop), cfg.part);
        Lister {
            dir,
            stop_file,
            settle,
            poll,
            header,
            last,
            resume_offset,
            observed: HashMap::new(),
            known: HashSet::new(),
            listed_once: false,
            stop,
            part: part.filter(|&(_, count)| count > 1),
            opener,
        }
    }

    fn stopped(&self, feeder: &Feeder) -> bool {
        feeder.shared.stopped() || self.stop.load(Relaxed)
    }

    /// Lists, reads complete files, sleeps; returns when stopped, when `wake` is
    /// disconnected, or after the stop file.
    pub(super) fn run(&mut self, feeder: &Feeder, wake: &Receiver<()>) -> Result<(), DataError> {
        loop {
            if self.stopped(feeder) {
                return Ok(());
            }
            // Look for the stop file before listing: every file written before it is listed.
            let stopping = self.stop_file.as_ref().is_some_and(|p| p.exists());
            let files = self.list()?;
            self.note_late(&files, feeder);
            let pending: Vec<&Listed> = files
                .iter()
                .filter(|f| {
                    f.name > self.last || (f.name == self.last && self.resume_offset.is_some())
                })
                .collect();
            let mut to_read = Vec::new();
            for (i, f) in pending.iter().enumerate() {
                if stopping || i + 1 < pending.len() || self.complete(f) {
                    to_read.push(f.name.clone());
                } else {
                    break;
                }
            }
            for name in to_read {
                let offset = if name == self.last {
                    self.resume_offset.unwrap_or(0)
                } else {
                    0
                };
                if !self.last.is_empty() && self.last != name {
                    self.known.insert(std::mem::take(&mut self.last));
                }
                self.last = name.clone();
                self.resume_offset = Some(offset);
                if !self.read_file(feeder, &name, offset)? {
                    return Ok(());
                }
                self.resume_offset = None;
                self.observed.remove(&name);
            }
            self.listed_once = true;
            if stopping {
                tracing::info!("follow: stop file found; all files read");
                return Ok(());
            }
            match wake.recv_timeout(self.poll) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return Ok(()),
            }
        }
    }

    /// Warns about (once) and counts the files sorting before the last one started that are
    /// new since the last listing: they arrived too late to be read in order. Names before the
    /// start position present at the first listing are old files, not late ones.
    fn note_late(&mut self, files: &[Listed], feeder: &Feeder) {
        let present: HashSet<&str> = files.iter().map(|f| f.name.as_str()).collect();
        self.known.retain(|n| present.contains(n.as_str()));
        for f in files.iter().filter(|f| f.name < self.last) {
            if self.known.insert(f.name.clone()) && self.listed_once {
                tracing::warn!(
                    "follow: {} arrived after {} was started and sorts before it: skipped",
                    f.name,
                    self.last
                );
                feeder.shared.stats.add_late_file();
            }
        }
    }

    /// The eligible files of the directory, sorted by name.
    fn list(&self) -> Result<Vec<Listed>, DataError> {
        if is_url(&self.dir) {
            return self.list_objects();
        }
        let io_err = |source| DataError::Io {
            path: self.dir.clone(),
            source,
        };
        let stop_name = self
            .stop_file
            .as_ref()
            .filter(|p| p.parent().is_some_and(|d| same_dir(d, &self.dir)))
            .and_then(|p| p.file_name())
            .map(|n| n.to_os_string());
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let Ok(name) = entry.file_name().into_string() else {
                tracing::warn!("follow: skipping non-UTF-8 name {:?}", entry.file_name());
                continue;
            };
            if name.starts_with('.')
                || name.ends_with(".tmp")
                || stop_name.as_deref() == Some(std::ffi::OsStr::new(&name))
            {
                continue;
            }
            // Follow symlinks: a shipper may link files in.
            let meta = match std::fs::metadata(entry.path()) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(DataError::Io {
                        path: entry.path(),
                        source,
                    })
                }
            };
            if !meta.is_file() {
                continue;
            }
            out.push(Listed {
                name,
                len: meta.len(),
                modified: meta.modified().ok(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The objects directly under the followed prefix, sorted by name. An object is complete
    /// once it is listed (a PUT is atomic): no settle time applies.
    #[cfg(feature = "object-store")]
    fn list_objects(&self) -> Result<Vec<Listed>, DataError> {
        Ok(self
            .opener
            .list_prefix(&self.dir)?
            .into_iter()
            .filter(|(name, _)| !name.starts_with('.') && !name.ends_with(".tmp"))
            .map(|(name, len)| Listed {
                name,
                len,
                modified: None,
            })
            .collect())
    }

    #[cfg(not(feature = "object-store"))]
    fn list_objects(&self) -> Result<Vec<Listed>, DataError> {
        self.opener.open(&self.dir).map(|_| Vec::new())
    }

    /// Whether the newest file is complete: settled, and for a Parquet file with its footer
    /// written.
    fn complete(&mut self, f: &Listed) -> bool {
        if is_url(&self.dir) {
            // A listed object is whole (a PUT is atomic).
            return true;
        }
        self.settled(f) && footer_written(&self.dir.join(&f.name)).unwrap_or(false)
    }

    /// Whether the newest file has stopped changing for `settle`.
    fn settled(&mut self, f: &Listed) -> bool {
        if self.settle.is_zero() || is_url(&self.dir) {
            return true;
        }
        let old = f
            .modified
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age >= self.settle);
        let now = Instant::now();
        let entry = self
            .observed
            .entry(f.name.clone())
            .or_insert((f.len, f.modified, now));
        if (entry.0, entry.1) != (f.len, f.modified) {
            *entry = (f.len, f.modified, now);
        }
        old || now.duration_since(entry.2) >= self.settle
    }

    /// Reads one file from `offset`. `Ok(false)` if it must stop.
    fn read_file(&mut self, feeder: &Feeder, name: &str, offset: u64) -> Result<bool, DataError> {
        let path = if is_url(&self.dir) {
            PathBuf::from(format!(
                "{}/{name}",
                self.dir.to_string_lossy().trim_end_matches('/')
            ))
        } else {
            self.dir.join(name)
        };
        let input = match self.opener.open(&path) {
            Ok(i) => i,
            Err(DataError::NotFound { .. }) => {
                tracing::warn!("follow: {} disappeared before it was read", path.display());
                return Ok(true);
            }
            Err(e) => return Err(e),
        };
        tracing::info!("follow: reading {name} from byte {offset}");
        let job = FileJob {
            file: Arc::new(FileRef {
                path,
                name: Arc::from(name),
                epoch: 0,
                index: 0,
            }),
            input: &input,
            offset,
            header: self.header,
            // A plain file is cut in ranges; gzip is shared by blocks (see `feed`).
            part: self.part,
            chunk_bytes: STREAM_CHUNK,
        };
        Ok(feeder.file(job))
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
