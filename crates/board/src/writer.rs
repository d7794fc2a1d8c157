//! [`EventWriter`]: one event file of a run directory, buffered.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::error::BoardError;
use crate::proto::{Event, Summary, SummaryValue, FILE_VERSION};
use crate::record::write_record;

/// Writes scalars into a new event file `events.out.tfevents.<unix secs>.<hostname>` of a
/// run directory (created when missing). Records are buffered: they reach the file on
/// [`EventWriter::flush`] and when the writer is dropped.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
    /// One encoded event, reused.
    buf: Vec<u8>,
}

impl EventWriter {
    /// Creates the event file in `run_dir` and writes its first record (the file version).
    /// A file of that name already there (another writer in the same second) is kept: this
    /// one then takes the name with `.1`, `.2`, ... appended.
    pub fn create(run_dir: impl AsRef<Path>) -> Result<Self, BoardError> {
        let dir = run_dir.as_ref();
        let create = |source| BoardError::Create {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(create)?;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let base = format!("events.out.tfevents.{secs:010}.{}", hostname());
        let mut n = 0u32;
        let (path, file) = loop {
            let name = match n {
                0 => base.clone(),
                n => format!("{base}.{n}"),
            };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
                Err(e) => return Err(create(e)),
            }
        };
        tracing::debug!("TensorBoard events to {}", path.display());
        let mut w = EventWriter {
            path,
            out: BufWriter::new(file),
            buf: Vec::new(),
        };
        w.write_event(&Event {
            wall_time: wall_time(),
            step: 0,
            file_version: Some(FILE_VERSION.into()),
            summary: None,
        })?;
        Ok(w)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the scalar `value` of series `tag` at `step` (stored as a 32-bit float, as
    /// TensorBoard keeps scalars).
    pub fn scalar(&mut self, tag: &str, step: i64, value: f64) -> Result<(), BoardError> {
        self.write_event(&Event {
            wall_time: wall_time(),
            step,
            file_version: None,
            summary: Some(Summary {
                value: vec![SummaryValue {
                    tag: tag.to_string(),
                    simple_value: Some(value as f32),
                }],
            }),
        })
    }

    /// Writes the buffered records to the file.
    pub fn flush(&mut self) -> Result<(), BoardError> {
        self.out.flush().map_err(|source| BoardError::Write {
            path: self.path.clone(),
            source,
        })
    }

    fn write_event(&mut self, e: &Event) -> Result<(), BoardError> {
        self.buf.clear();
        e.encode(&mut self.buf)
            .expect("a Vec grows to hold any message");
        write_record(&mut self.out, &self.buf).map_err(|source| BoardError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!("{e}");
        }
    }
}

/// Seconds since the Unix epoch, with fractions.
fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name as a file name part (`localhost` when it cannot be read); characters
/// other than letters, digits, `-`, `_` and `.` become `_`.
fn hostname() -> String {
    let raw = host_name().unwrap_or_default();
    let name: String = raw
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '_',
        })
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

#[cfg(unix)]
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and
    // gethostname writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    // Truncated names may lack the terminating NUL: take up to the first NUL or all.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(not(unix))]
fn host_name() -> Option<String> {
    std::env::var("COMPUTERNAME").ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::read::records;

    /// Every event of the file at `path`, checking every record's CRCs.
    fn events(path: &Path) -> Vec<Event> {
        let bytes = std::fs::read(path).unwrap();
        records(&bytes)
            .unwrap()
            .iter()
            .map(|r| Event::decode(r.as_slice()).unwrap())
            .collect()
    }

    /// The (tag, step, value) of every scalar event after the first.
    fn scalars(evs: &[Event]) -> Vec<(String, i64, f32)> {
        evs[1..]
            .iter()
            .map(|e| {
                let s = e.summary.as_ref().expect("a summary");
                assert_eq!(s.value.len(), 1);
                let v = &s.value[0];
                (
                    v.tag.clone(),
                    e.step,
                    v.simple_value.expect("a simple value"),
                )
            })
            .collect()
    }

    #[test]
    fn the_file_is_named_tfevents_and_starts_with_the_version_event() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let mut w = EventWriter::create(&run).unwrap();
        w.flush().unwrap();
        let name = w.path().file_name().unwrap().to_str().unwrap().to_string();
        let rest = name.strip_prefix("events.out.tfevents.").unwrap();
        let (secs, host) = rest.split_once('.').unwrap();
        assert_eq!(secs.len(), 10);
        assert!(secs.parse::<u64>().unwrap() > 1_600_000_000);
        assert!(!host.is_empty());
        assert_eq!(w.path().parent(), Some(run.as_path()));
        let evs = events(w.path());
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].file_version.as_deref(), Some("brain.Event:2"));
        assert!(evs[0].wall_time > 1.6e9);
        assert!(evs[0].summary.is_none());
    }

    #[test]
    fn scalars_read_back_with_their_tags_steps_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalar("train/rows", 100, 25600.0).unwrap();
        w.scalar("train/rows", 200, 0.0).unwrap();
        w.scalar("table/embedding/bytes", 200, 1.5e9).unwrap();
        w.flush().unwrap();
        let got = scalars(&events(w.path()));
        assert_eq!(
            got,
            vec![
                ("train/rows".to_string(), 100, 25600.0),
                ("train/rows".to_string(), 200, 0.0),
                ("table/embedding/bytes".to_string(), 200, 1.5e9),
            ]
        );
    }

    #[test]
    fn dropping_the_writer_flushes_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        let path = w.path().to_path_buf();
        w.scalar("a", 1, 2.0).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "still buffered");
        drop(w);
        assert_eq!(scalars(&events(&path)), vec![("a".to_string(), 1, 2.0)]);
    }

    #[test]
    fn two_writers_of_one_directory_write_two_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = EventWriter::create(dir.path()).unwrap();
        let b = EventWriter::create(dir.path()).unwrap();
        assert_ne!(a.path(), b.path());
        drop((a, b));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_run_directory_under_a_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = EventWriter::create(file.join("run"))
            .err()
            .expect("an error");
        assert!(matches!(e, BoardError::Create { .. }));
        assert!(e.to_string().contains("f/run"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_sequence_of_scalars_round_trips(
            xs in proptest::collection::vec(("[a-z/_]{0,20}", any::<i64>(), any::<f64>()), 0..40)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut w = EventWriter::create(dir.path()).unwrap();
            for (tag, step, v) in &xs {
                w.scalar(tag, *step, *v).unwrap();
            }
            w.flush().unwrap();
            let got = scalars(&events(w.path()));
            prop_assert_eq!(got.len(), xs.len());
            for ((tag, step, v), (gt, gs, gv)) in xs.iter().zip(&got) {
                prop_assert_eq!(tag, gt);
                prop_assert_eq!(step, gs);
                let want = *v as f32;
                if want.is_nan() {
                    prop_assert!(gv.is_nan());
                } else {
                    prop_assert_eq!(want.to_bits(), gv.to_bits());
                }
            }
        }
    }
}
