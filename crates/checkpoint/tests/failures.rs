//! Failing checkpoint writes (a full disk): the partial checkpoint is removed after each failed
//! attempt, the write is retried, and after `max_failures` consecutive failures it gives up.
//! Unfinished files of a killed writer are removed by retention.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{make_table, table_config, train, Rng};
use sparta_checkpoint::{
    list_ids, restore_latest, BlobInfo, BlobWriter, CheckpointError, CheckpointState, Checkpointer,
    InputPosition, LocalDir, Result, RetentionPolicy, RetryPolicy, Storage,
};
use sparta_table::Table;

/// A local directory whose n-th blob creation fails ("no space left") when `fails(n)` says.
struct Full {
    inner: LocalDir,
    creates: AtomicU64,
    fails: Mutex<Box<dyn Fn(u64) -> bool + Send>>,
}

impl std::fmt::Debug for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Full {
    fn new(dir: &std::path::Path) -> Full {
        Full {
            inner: LocalDir::new(dir).unwrap().with_sync(false),
            creates: AtomicU64::new(0),
            fails: Mutex::new(Box::new(|_| false)),
        }
    }

    /// From now on, creation `n` (counted from now) fails when `fails(n)`.
    fn fail(&self, fails: impl Fn(u64) -> bool + Send + 'static) {
        self.creates.store(0, Ordering::SeqCst);
        *self.fails.lock().unwrap() = Box::new(fails);
    }
}

impl Storage for Full {
    fn create(&self, name: &str) -> Result<Box<dyn BlobWriter + '_>> {
        let n = self.creates.fetch_add(1, Ordering::SeqCst);
        if (self.fails.lock().unwrap())(n) {
            return Err(CheckpointError::Io {
                name: name.to_string(),
                source: std::io::Error::from_raw_os_error(28), // ENOSPC
            });
        }
        self.inner.create(name)
    }
    fn open(&self, name: &str) -> Result<(Box<dyn std::io::Read + Send + '_>, u64)> {
        self.inner.open(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<BlobInfo>> {
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name)
    }
    fn location(&self) -> String {
        self.inner.location()
    }
    fn remove_unfinished(
        &self,
        remove: &dyn Fn(&str, std::time::SystemTime) -> bool,
    ) -> Result<Vec<String>> {
        self.inner.remove_unfinished(remove)
    }
}

fn state<'a>(tables: Vec<(&'a str, &'a Table)>, step: u64) -> CheckpointState<'a> {
    CheckpointState {
        tables,
        dense: None,
        step,
        position: InputPosition {
            rows_consumed: step * 10,
            ..InputPosition::default()
        },
        job_config: "",
    }
}

#[test]
fn a_full_disk_removes_each_partial_checkpoint_and_gives_up_after_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(Full::new(dir.path()));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 })
        .with_retry(RetryPolicy::new(3).with_backoff(Duration::from_millis(1)));
    let a = Table::new(table_config("a")).unwrap();
    let b = Table::new(table_config("b")).unwrap();
    let mut rng = Rng(5);
    train(&a, &mut rng, 20);
    train(&b, &mut rng, 20);
    let first = ck
        .write_full(&state(vec![("a", &a), ("b", &b)], 1))
        .unwrap();
    // The disk is full after one more file: the first attempt leaves table a's part.
    storage.fail(|n| n >= 1);
    let e = ck
        .write_full(&state(vec![("a", &a), ("b", &b)], 2))
        .unwrap_err();
    assert_eq!(storage.creates.load(Ordering::SeqCst), 4, "3 attempts");
    assert!(
        matches!(&e, CheckpointError::GaveUp { failures: 3, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("No space left"), "{e}");
    // Nothing of the failed checkpoint is left: the one committed before is the newest.
    assert_eq!(list_ids(storage.as_ref()).unwrap(), vec![first]);
    let leftovers: Vec<_> = walk(dir.path());
    assert!(
        leftovers.iter().all(|p| p.contains(&first.dir())),
        "{leftovers:?}"
    );
    // The disk has room again: the next checkpoint commits and restores.
    storage.fail(|_| false);
    let next = ck
        .write_full(&state(vec![("a", &a), ("b", &b)], 3))
        .unwrap();
    let r = restore_latest(storage.as_ref(), make_table)
        .unwrap()
        .unwrap();
    assert_eq!((r.id, r.step), (next, 3));
}

#[test]
fn a_transient_failure_is_retried_without_leaving_a_partial_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(Full::new(dir.path()));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 0 })
        .with_retry(RetryPolicy::new(3).with_backoff(Duration::from_millis(1)));
    let a = Table::new(table_config("a")).unwrap();
    let b = Table::new(table_config("b")).unwrap();
    train(&a, &mut Rng(1), 10);
    train(&b, &mut Rng(2), 10);
    // The first attempt writes table a, then fails on b; the second one goes through.
    storage.fail(|n| n == 1);
    let id = ck
        .write_full(&state(vec![("a", &a), ("b", &b)], 1))
        .unwrap();
    assert_eq!(storage.creates.load(Ordering::SeqCst), 5, "2 attempts");
    assert_eq!(list_ids(storage.as_ref()).unwrap(), vec![id]);
    let r = restore_latest(storage.as_ref(), make_table)
        .unwrap()
        .unwrap();
    assert_eq!(r.tables.len(), 2);
}

#[test]
fn retention_removes_unfinished_files_older_than_the_newest_commit() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(LocalDir::new(dir.path()).unwrap().with_sync(false));
    let ck = Checkpointer::new(storage.clone(), RetentionPolicy { keep_full: 2 });
    let a = Table::new(table_config("a")).unwrap();
    train(&a, &mut Rng(3), 10);
    let first = ck.write_full(&state(vec![("a", &a)], 1)).unwrap();
    // A writer killed mid-write of the next checkpoint's part.
    let mut w = storage
        .create("ckpt-0000000000000002/table-a.ps-1.rows")
        .unwrap();
    w.write_all(b"half a part").unwrap();
    std::mem::forget(w);
    assert_eq!(
        walk(dir.path())
            .iter()
            .filter(|p| p.contains(".tmp-"))
            .count(),
        1
    );
    // Not removed while it may still be written (newer than the newest commit)...
    ck.apply_retention().unwrap();
    assert_eq!(
        walk(dir.path())
            .iter()
            .filter(|p| p.contains(".tmp-"))
            .count(),
        1
    );
    // ...but once a later checkpoint committed.
    wait_for_clock_tick(dir.path());
    let next = ck.write_full(&state(vec![("a", &a)], 2)).unwrap();
    assert!(next > first);
    let tmp: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| p.contains(".tmp-"))
        .collect();
    assert!(tmp.is_empty(), "{tmp:?}");
}

/// Waits until a file written now gets a later modification time than the files written
/// before (coarse file system clocks).
fn wait_for_clock_tick(dir: &std::path::Path) {
    let probe = dir.join("probe");
    std::fs::write(&probe, b"x").unwrap();
    let t0 = std::fs::metadata(&probe).unwrap().modified().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        std::fs::write(&probe, b"x").unwrap();
        let now = std::time::SystemTime::now();
        if now > t0 + Duration::from_millis(5) {
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
    std::fs::remove_file(&probe).unwrap();
}

/// Every file under `dir`, relative.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(
                    e.path()
                        .strip_prefix(dir)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out
}
