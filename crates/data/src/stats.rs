//! Counters of a running reader, shared between its threads and the consumer.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::error::DataError;
use crate::parse::BadLine;

/// The fewest lines the bad-line ratio is judged on before the end of the input: while
/// fewer lines were read, reading stops only when the bad lines exceed `max_bad_line_ratio`
/// of this many (1,000 at the default 1%). So a burst of bad lines at the top of a big file
/// (300 at the top of 300,000 rows) does not stop a job its whole input would pass, while a
/// file bad throughout still stops after a few thousand lines; at the end of the input the
/// ratio is checked over all its lines, however few.
pub const MIN_LINES_FOR_RATIO: u64 = 100_000;

/// How many bad lines are logged and kept in [`ReadStats::first_bad_lines`].
pub const REPORTED_BAD_LINES: usize = 5;

/// Longest excerpt of a bad line kept in a report (bytes).
const EXCERPT_BYTES: usize = 120;

/// Live counters of a reader (all atomics; cheap to read at any time).
#[derive(Debug, Default)]
pub struct ReadStats {
    rows: AtomicU64,
    lines: AtomicU64,
    bad_lines: AtomicU64,
    bytes: AtomicU64,
    files: AtomicU64,
    bad_files: AtomicU64,
    late_files: AtomicU64,
    source_bytes: AtomicU64,
    source_wait_ns: AtomicU64,
    source_retries: AtomicU64,
    reported: AtomicU64,
    first_bad: Mutex<Vec<String>>,
}

/// A point-in-time copy of [`ReadStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadStatsSnapshot {
    /// Rows delivered in batches.
    pub rows: u64,
    /// Lines parsed (good and bad; blank lines and headers excluded).
    pub lines: u64,
    /// Malformed lines skipped.
    pub bad_lines: u64,
    /// Bytes of (decompressed) text parsed.
    pub bytes: u64,
    /// File passes completed (a file read in 2 epochs counts twice).
    pub files: u64,
    /// Bad files skipped (follow mode: corrupt or truncated gzip, a file changed while read, a
    /// saved offset that does not fit the file).
    pub bad_files: u64,
    /// Files that arrived late in a followed directory (their name sorts before a file
    /// already read) and were skipped.
    pub late_files_skipped: u64,
    /// Bytes fetched from object storage (compressed bytes as stored; 0 for local files).
    pub source_bytes: u64,
    /// Time the reader waited on object storage (a block not there yet, a small read).
    pub source_wait: std::time::Duration,
    /// Object-storage requests retried after a transient error.
    pub source_retries: u64,
    /// The first few bad lines, `file:line: reason: "text"`.
    pub first_bad_lines: Vec<String>,
}

impl ReadStats {
    /// Rows delivered to the consumer in batches.
    pub fn rows(&self) -> u64 {
        self.rows.load(Relaxed)
    }

    /// Lines parsed so far (good and bad).
    pub fn lines_seen(&self) -> u64 {
        self.lines.load(Relaxed)
    }

    /// Malformed lines skipped so far.
    pub fn bad_lines(&self) -> u64 {
        self.bad_lines.load(Relaxed)
    }

    /// Bytes of (decompressed) text parsed so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    /// File passes completed so far.
    pub fn files(&self) -> u64 {
        self.files.load(Relaxed)
    }

    /// Bad files skipped so far (follow mode).
    pub fn bad_files(&self) -> u64 {
        self.bad_files.load(Relaxed)
    }

    /// Late files skipped so far (follow mode).
    pub fn late_files_skipped(&self) -> u64 {
        self.late_files.load(Relaxed)
    }

    /// Bytes fetched from object storage so far.
    pub fn source_bytes(&self) -> u64 {
        self.source_bytes.load(Relaxed)
    }

    /// Seconds the reader has waited on object storage so far.
    pub fn source_wait_seconds(&self) -> f64 {
        self.source_wait_ns.load(Relaxed) as f64 * 1e-9
    }

    /// Object-storage requests retried so far.
    pub fn source_retries(&self) -> u64 {
        self.source_retries.load(Relaxed)
    }

    /// The first few bad lines, each `file:line: reason: "text"`.
    pub fn first_bad_lines(&self) -> Vec<String> {
        self.first_bad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A copy of all counters.
    pub fn snapshot(&self) -> ReadStatsSnapshot {
        ReadStatsSnapshot {
            rows: self.rows(),
            lines: self.lines_seen(),
            bad_lines: self.bad_lines(),
            bytes: self.bytes(),
            files: self.files(),
            bad_files: self.bad_files(),
            late_files_skipped: self.late_files_skipped(),
            source_bytes: self.source_bytes(),
            source_wait: std::time::Duration::from_nanos(self.source_wait_ns.load(Relaxed)),
            source_retries: self.source_retries(),
            first_bad_lines: self.first_bad_lines(),
        }
    }

    pub(crate) fn add_rows(&self, n: u64) {
        self.rows.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_file(&self) {
        self.files.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_bad_file(&self) {
        self.bad_files.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_late_file(&self) {
        self.late_files.fetch_add(1, Relaxed);
    }

    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn add_source_bytes(&self, n: u64) {
        self.source_bytes.fetch_add(n, Relaxed);
    }

    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn add_source_wait(&self, d: std::time::Duration) {
        self.source_wait_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn add_source_retry(&self) {
        self.source_retries.fetch_add(1, Relaxed);
    }

    /// Adds a parsed range's counts; returns the totals `(bad, seen)` after it.
    pub(crate) fn add_lines(&self, seen: u64, bad: u64, bytes: u64) -> (u64, u64) {
        self.bytes.fetch_add(bytes, Relaxed);
        let bad = self.bad_lines.fetch_add(bad, Relaxed) + bad;
        let seen = self.lines.fetch_add(seen, Relaxed) + seen;
        (bad, seen)
    }

    /// Reports a bad line (logged and kept if it is among the first few). `line_no` is only
    /// evaluated then, so it may be expensive. Counting is done by [`ReadStats::add_lines`].
    pub(crate) fn report_bad(
        &self,
        path: &Path,
        line_no: impl FnOnce() -> u64,
        reason: &BadLine,
        text: &[u8],
    ) {
        if self.reported.fetch_add(1, Relaxed) >= REPORTED_BAD_LINES as u64 {
            return;
        }
        let msg = format!(
            "{}:{}: {reason}: {}",
            path.display(),
            line_no(),
            excerpt(text)
        );
        tracing::warn!("skipping bad line {msg}");
        self.first_bad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
    }
}

/// The error when `bad` of `seen` lines exceeds the ratio `max` (the one bad-line rule).
pub(crate) fn too_many_bad(bad: u64, seen: u64, max: f64, stats: &ReadStats) -> Option<DataError> {
    if seen == 0 {
        return None;
    }
    let ratio = bad as f64 / seen as f64;
    (ratio > max).then(|| DataError::TooManyBadLines {
        bad,
        seen,
        ratio,
        max,
        first: stats
            .first_bad_lines()
            .into_iter()
            .next()
            .unwrap_or_default(),
    })
}

/// Adds a parsed chunk's line counts to `stats`; returns the error when the bad lines so far
/// exceed `max_ratio` of the lines read, or of [`MIN_LINES_FOR_RATIO`] while fewer were read.
pub(crate) fn account_lines(
    stats: &ReadStats,
    seen: u64,
    bad: u64,
    bytes: u64,
    max_ratio: f64,
) -> Option<DataError> {
    let (bad_total, seen_total) = stats.add_lines(seen, bad, bytes);
    if bad_total as f64 <= max_ratio * seen_total.max(MIN_LINES_FOR_RATIO) as f64 {
        return None;
    }
    too_many_bad(bad_total, seen_total, max_ratio, stats)
}

/// A quoted, truncated, lossy copy of a line.
fn excerpt(text: &[u8]) -> String {
    let cut = text.len().min(EXCERPT_BYTES);
    let mut s = format!("{:?}", String::from_utf8_lossy(&text[..cut]));
    if cut < text.len() {
        s.push_str(&format!("... ({} bytes)", text.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_bad_lines_at_the_top_is_judged_on_at_least_the_minimum_lines() {
        // 300 bad lines in the first 1,000 (30%) at max 1%: not a stop (300 <= 1% of 100k).
        let st = ReadStats::default();
        assert!(account_lines(&st, 1000, 300, 0, 0.01).is_none());
        assert!(account_lines(&st, 50_000, 0, 0, 0.01).is_none());
        // A file bad throughout stops once its bad lines pass 1% of 100k.
        let st = ReadStats::default();
        assert!(account_lines(&st, 1000, 1000, 0, 0.01).is_none());
        let e = account_lines(&st, 1, 1, 0, 0.01).expect("1001 bad lines stop");
        assert!(
            matches!(
                e,
                DataError::TooManyBadLines {
                    bad: 1001,
                    seen: 1001,
                    ..
                }
            ),
            "{e}"
        );
        // Past the minimum: the ratio over the lines read.
        let st = ReadStats::default();
        assert!(account_lines(&st, 200_000, 2000, 0, 0.01).is_none());
        assert!(account_lines(&st, 1, 1, 0, 0.01).is_some());
        // max 0: the first bad line stops.
        let st = ReadStats::default();
        assert!(account_lines(&st, 10, 1, 0, 0.0).is_some());
    }

    #[test]
    fn reports_first_few() {
        let st = ReadStats::default();
        for i in 0..8u64 {
            st.report_bad(
                Path::new("f.tsv"),
                || i + 1,
                &BadLine::InvalidUtf8,
                &[b'x'; 200],
            );
        }
        let first = st.first_bad_lines();
        assert_eq!(first.len(), REPORTED_BAD_LINES);
        assert!(
            first[0].starts_with("f.tsv:1: invalid UTF-8: \"xxx"),
            "{}",
            first[0]
        );
        assert!(first[0].ends_with("... (200 bytes)"), "{}", first[0]);
        assert_eq!(st.add_lines(10, 2, 100), (2, 10));
        assert_eq!(st.add_lines(5, 1, 50), (3, 15));
        let s = st.snapshot();
        assert_eq!((s.lines, s.bad_lines, s.bytes), (15, 3, 150));
    }
}
