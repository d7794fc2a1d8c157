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
    /// The identities of the files read (or present before the start position at the first
    /// listing): a later name with one of them is a file already read, renamed.
    read_ids: HashMap<FileId, String>,
    /// The followed directory, resolved (symlinks followed): a listed file must resolve
    /// inside it. `None` for an object-store prefix (or if it cannot be resolved).
    real_dir: Option<PathBuf>,
    /// Names already warned about as links out of the directory.
    outside: HashSet<String>,
    /// The identities of the files started, in order, as [`super::FollowPosition::recent`]
    /// entries (shared with the follower, which saves those up to each batch's file).
    started: Arc<std::sync::Mutex<Vec<String>>>,
    /// The identities saved in the start position: `(identity, name)`, the file of the
    /// position last.
    start_recent: Vec<(FileId, String)>,
    /// Resuming: the file of the start position was renamed to this name; its rest is read
    /// under its first name before anything else.
    continue_as: Option<String>,
    /// Identities whose rest was read that way (their new names are not news).
    continued: HashSet<FileId>,
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
    /// Who the file is, across renames (`None` for an object).
    id: Option<FileId>,
}

/// A local file's identity: its device and inode (kept by a rename), size and modification
/// time (so a new file that reuses a freed inode is not taken for the old one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileId {
    /// As saved in a position: `dev:inode:size:mtime` (mtime as `secs.nanos`, or `-`).
    fn entry(&self, name: &str) -> String {
        let mtime = match self
            .modified
            .and_then(|m| m.duration_since(SystemTime::UNIX_EPOCH).ok())
        {
            Some(d) => format!("{}.{:09}", d.as_secs(), d.subsec_nanos()),
            None => "-".into(),
        };
        format!("{}:{}:{}:{mtime} {name}", self.dev, self.ino, self.len)
    }

    /// An entry written by [`FileId::entry`]: the identity and the name.
    fn parse(entry: &str) -> Option<(FileId, String)> {
        let (id, name) = entry.split_once(' ')?;
        let mut parts = id.split(':');
        let mut num = || parts.next()?.parse::<u64>().ok();
        let (dev, ino, len) = (num()?, num()?, num()?);
        let modified = match parts.next()? {
            "-" => None,
            t => {
                let (secs, nanos) = t.split_once('.')?;
                let d = Duration::new(secs.parse().ok()?, nanos.parse().ok()?);
                Some(SystemTime::UNIX_EPOCH + d)
            }
        };
        let id = FileId {
            dev,
            ino,
            len,
            modified,
        };
        Some((id, name.to_string()))
    }

    fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

impl Lister {
    /// A lister of `cfg.dir` that starts at `cfg.start` (no file: the first one), opening
    /// what it reads with `opener`.
    pub(super) fn new(
        cfg: &FollowConfig,
        header: bool,
        opener: Opener,
        started: Arc<std::sync::Mutex<Vec<String>>>,
    ) -> Self {
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
            read_ids: HashMap::new(),
            real_dir: if is_url(&cfg.dir) {
                None
            } else {
                cfg.dir.canonicalize().ok()
            },
            outside: HashSet::new(),
            started,
            start_recent: cfg
                .start
                .recent
                .iter()
                .filter_map(|e| FileId::parse(e))
                .collect(),
            continue_as: None,
            continued: HashSet::new(),
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
            if !self.listed_once {
                self.check_start(&files, feeder);
            }
            self.note_late(&files, feeder);
            if let Some(actual) = self.continue_as.take() {
                let (logical, offset) = (self.last.clone(), self.resume_offset.unwrap_or(0));
                if !self.read_file(feeder, &actual, &logical, offset)? {
                    return Ok(());
                }
                self.resume_offset = None;
            }
            let pending: Vec<&Listed> = files
                .iter()
                .filter(|f| {
                    f.name > self.last || (f.name == self.last && self.resume_offset.is_some())
                })
                .collect();
            let mut to_read = Vec::new();
            for (i, f) in pending.iter().enumerate() {
                if stopping || i + 1 < pending.len() || self.complete(f) {
                    to_read.push((f.name.clone(), f.id));
                } else {
                    break;
                }
            }
            for (name, id) in to_read {
                if let Some(id) = id {
                    if name != self.last {
                        if self.continued.contains(&id) {
                            tracing::info!("follow: {name}: its rest was read already");
                            self.known.insert(name);
                            continue;
                        }
                        if let Some(old) = self.read_ids.get(&id) {
                            tracing::warn!(
                                "follow: {name} is {old} (same file: device, inode, size and \
                                 modification time), already read, under a new name: skipped, \
                                 not trained twice"
                            );
                            feeder.shared.stats.add_late_file();
                            self.observed.remove(&name);
                            self.known.insert(name);
                            continue;
                        }
                    }
                    self.read_ids.insert(id, name.clone());
                    self.note_started(id.entry(&name));
                }
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
                if !self.read_file(feeder, &name, &name, offset)? {
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

    /// Records that a file was started (its identity entry), keeping the list short. The file
    /// a resumed follower continues is the last entry of the saved list already: its entry is
    /// replaced (it may have grown since), not listed twice.
    fn note_started(&mut self, entry: String) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        let name = |e: &str| e.split_once(' ').map(|(_, n)| n.to_string());
        if let Some(last) = started.last_mut() {
            if name(last) == name(&entry) {
                *last = entry;
                return;
            }
        }
        started.push(entry);
        if started.len() > 4 * super::RECENT_FILES {
            let cut = started.len() - super::RECENT_FILES;
            started.drain(..cut);
        }
    }

    /// At the first listing of a resumed follower. The identities saved in the position and
    /// those of the files present up to its file count as read (one of them under a later
    /// name is not read again). The file of the position must still be there: renamed, its
    /// rest is read under the new name; gone, the rest of it (after the saved offset) can
    /// never be read: an error-level log naming it, and it is counted as a bad file, instead
    /// of silently going on with the next file.
    fn check_start(&mut self, files: &[Listed], feeder: &Feeder) {
        for (id, name) in &self.start_recent {
            self.read_ids.insert(*id, name.clone());
        }
        for f in files.iter().filter(|f| f.name <= self.last) {
            if let Some(id) = f.id {
                self.read_ids.insert(id, f.name.clone());
            }
        }
        let Some(offset) = self.resume_offset else {
            return;
        };
        if files.iter().any(|f| f.name == self.last) {
            return;
        }
        let saved = self
            .start_recent
            .iter()
            .rev()
            .find(|(_, n)| *n == self.last)
            .map(|(id, _)| *id);
        if let Some(id) = saved {
            if let Some(f) = files.iter().find(|f| f.id == Some(id)) {
                tracing::warn!(
                    "follow: {} was renamed to {} (same file: device, inode, size and \
                     modification time): continuing it at byte {offset}",
                    self.last,
                    f.name
                );
                self.continued.insert(id);
                self.continue_as = Some(f.name.clone());
                return;
            }
            if id.len == offset {
                tracing::warn!(
                    "follow: {}, the file of the start position, is no longer in {}; it was \
                     read to its end: nothing lost",
                    self.last,
                    self.dir.display()
                );
                self.resume_offset = None;
                return;
            }
        }
        tracing::error!(
            "follow: the start position is byte {offset} of {}, which is no longer in {}: the \
             rest of that file (after byte {offset}{}) cannot be trained; counted as a bad \
             file, going on with the next file",
            self.last,
            self.dir.display(),
            match saved {
                Some(id) if id.len > offset =>
                    format!(", {} of its {} bytes", id.len - offset, id.len),
                _ => String::new(),
            }
        );
        feeder.shared.stats.add_bad_file();
        self.resume_offset = None;
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
    fn list(&mut self) -> Result<Vec<Listed>, DataError> {
        if is_url(&self.dir) {
            return self.list_objects();
        }
        let dir = self.dir.clone();
        let io_err = |source| DataError::Io {
            path: dir.clone(),
            source,
        };
        let stop_name = self
            .stop_file
            .as_ref()
            .filter(|p| p.parent().is_some_and(|d| same_dir(d, &self.dir)))
            .and_then(|p| p.file_name())
            .map(|n| n.to_os_string());
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err)? {
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
            if !self.inside(&entry.path(), &name) {
                continue;
            }
            out.push(Listed {
                name,
                len: meta.len(),
                modified: meta.modified().ok(),
                id: Some(FileId::of(&meta)),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Whether the entry `path` (named `name`) resolves to a file inside the followed
    /// directory. A symlink to a file elsewhere is skipped with a warning (once): following a
    /// directory must not read what lies outside it.
    fn inside(&mut self, path: &Path, name: &str) -> bool {
        let Some(real_dir) = &self.real_dir else {
            return true;
        };
        let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            return true;
        }
        match path.canonicalize() {
            Ok(target) if target.starts_with(real_dir) => true,
            Ok(target) => {
                if self.outside.insert(name.to_string()) {
                    tracing::warn!(
                        "follow: {name} is a link to {}, outside the followed directory {}: \
                         skipped",
                        target.display(),
                        real_dir.display()
                    );
                }
                false
            }
            // Gone between the listing and now: not listed.
            Err(_) => false,
        }
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
                id: None,
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

    /// Reads the file `actual` (named `name` in positions: its first name if it was renamed
    /// meanwhile) from `offset`. `Ok(false)` if it must stop.
    fn read_file(
        &mut self,
        feeder: &Feeder,
        actual: &str,
        name: &str,
        offset: u64,
    ) -> Result<bool, DataError> {
        let path = if is_url(&self.dir) {
            PathBuf::from(format!(
                "{}/{actual}",
                self.dir.to_string_lossy().trim_end_matches('/')
            ))
        } else {
            self.dir.join(actual)
        };
        let input = match self.opener.open(&path) {
            Ok(i) => i,
            Err(DataError::NotFound { .. }) => {
                tracing::error!(
                    "follow: {} disappeared before it was read: not trained; counted as a bad \
                     file",
                    path.display()
                );
                feeder.shared.stats.add_bad_file();
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
