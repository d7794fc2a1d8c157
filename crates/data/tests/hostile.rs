//! Hostile input through the library: files that shrink while read, pipes, corrupt gzip files
//! in a followed directory, late files, saved positions that do not fit.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use sparta_data::{
    follow, read_all, read_batches, read_batches_at, DataError, FollowConfig, FollowPosition,
    ReadPosition, ReaderConfig, Schema,
};

/// A plain file far larger than what the reader's bounded queues hold (about 7 chunks of at
/// most 4 MiB), made of `copies` copies of 10,000 lines.
fn big_file(dir: &Path, name: &str, copies: usize) -> (PathBuf, usize) {
    let block = criteo_text(10_000);
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    for _ in 0..copies {
        f.write_all(block.as_bytes()).unwrap();
    }
    (p, 10_000 * copies)
}

/// A reader that stalls after each batch: the consumer is this test.
fn slow(threads: usize) -> ReaderConfig {
    ReaderConfig {
        queue_batches: 1,
        ..config(Schema::criteo(), 100, threads)
    }
}

#[test]
fn a_file_truncated_while_read_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = big_file(dir.path(), "shrinks.tsv", 32); // ~77 MB
    let mut s = read_batches(std::slice::from_ref(&p), &slow(1)).unwrap();
    s.next().unwrap().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(0)
        .unwrap();
    let err = s
        .find_map(|b| b.err())
        .expect("a file truncated under the reader must give an error");
    assert!(matches!(err, DataError::Changed { .. }), "{err}");
    assert!(err.to_string().contains("shrinks.tsv"), "{err}");
}

#[test]
fn a_followed_file_truncated_while_read_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    big_file(dir.path(), "a.tsv", 32);
    let tail = criteo_text(250);
    write_file(dir.path(), "b.tsv", tail.as_bytes());
    write_file(dir.path(), "STOP", b"");
    let cfg = FollowConfig {
        poll: Duration::from_millis(10),
        settle: Duration::ZERO,
        stop_file: Some(dir.path().join("STOP")),
        ..FollowConfig::new(dir.path())
    };
    let mut f = follow(cfg, &slow(2)).unwrap();
    f.next().unwrap().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("a.tsv"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let stats = f.stats();
    let rest: Vec<_> = f.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(stats.bad_files(), 1);
    let last = &rest.last().unwrap().position;
    assert_eq!(last.file, "b.tsv");
    assert_eq!(last.offset, tail.len() as u64);
    let b_rows: Vec<_> = rest
        .iter()
        .filter(|b| b.position.file == "b.tsv")
        .map(|b| b.batch.clone())
        .collect();
    assert_eq!(
        rows(&b_rows),
        rows(&read_all(&[dir.path().join("b.tsv")], &slow(1)).unwrap().0)
    );
}

fn mkfifo(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let ok = Command::new("mkfifo").arg(&p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
    p
}

/// Writes `data` into the FIFO `p` from a thread (opening it blocks until a reader opens it).
fn feed_fifo(p: &Path, data: Vec<u8>) -> std::thread::JoinHandle<()> {
    let p = p.to_path_buf();
    std::thread::spawn(move || {
        let mut w = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        let _ = w.write_all(&data);
    })
}

#[test]
fn a_fifo_is_read_as_a_stream_plain_or_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let text = criteo_text(3000);
    let plain = write_file(dir.path(), "t.tsv", text.as_bytes());
    let want = read_all(&[plain], &config(Schema::criteo(), 64, 1))
        .unwrap()
        .0;
    for gz in [false, true] {
        let p = mkfifo(dir.path(), if gz { "pipe-gz" } else { "pipe" });
        let data = if gz {
            gzip(text.as_bytes())
        } else {
            text.clone().into_bytes()
        };
        let writer = feed_fifo(&p, data);
        let mut s =
            read_batches(std::slice::from_ref(&p), &config(Schema::criteo(), 64, 2)).unwrap();
        let got: Vec<_> = s.positioned().collect::<Result<_, _>>().unwrap();
        writer.join().unwrap();
        let batches: Vec<_> = got.iter().map(|b| b.batch.clone()).collect();
        assert_eq!(rows(&batches), rows(&want), "gzip {gz}");
        // Positions still count bytes of the text.
        assert_eq!(
            got.last().unwrap().position.byte_offset,
            text.len() as u64,
            "gzip {gz}"
        );
    }
}

#[test]
fn a_fifo_whose_writer_dies_ends_with_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = mkfifo(dir.path(), "pipe");
    // The writer sends 100 lines and a cut line, then goes away.
    let mut data = criteo_text(100).into_bytes();
    data.extend_from_slice(b"1\t2\t3");
    let writer = feed_fifo(&p, data);
    let cfg = ReaderConfig {
        max_bad_line_ratio: 0.5,
        ..config(Schema::criteo(), 64, 1)
    };
    let (b, st) = read_all(std::slice::from_ref(&p), &cfg).unwrap();
    writer.join().unwrap();
    assert_eq!(b.iter().map(|b| b.rows).sum::<usize>(), 100);
    assert_eq!(st.bad_lines, 1);
}

#[test]
fn a_fifo_cannot_be_resumed_inside_or_read_twice() {
    let dir = tempfile::tempdir().unwrap();
    let p = mkfifo(dir.path(), "pipe");
    let at = ReadPosition {
        byte_offset: 10,
        ..ReadPosition::default()
    };
    let e = read_batches_at(
        std::slice::from_ref(&p),
        &config(Schema::criteo(), 8, 1),
        at,
    )
    .err()
    .expect("a resume inside a pipe is refused");
    assert!(matches!(e, DataError::BadStart { .. }), "{e}");
    assert!(e.to_string().contains("pipe"), "{e}");
    let two = ReaderConfig {
        epochs: 2,
        ..config(Schema::criteo(), 8, 1)
    };
    let e = read_batches(std::slice::from_ref(&p), &two).err().unwrap();
    assert!(e.to_string().contains("pipe"), "{e}");
}

#[test]
fn dropping_a_reader_that_waits_for_a_fifo_writer_returns() {
    let dir = tempfile::tempdir().unwrap();
    let p = mkfifo(dir.path(), "pipe");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = read_batches(std::slice::from_ref(&p), &config(Schema::criteo(), 8, 1)).unwrap();
    std::thread::spawn(move || {
        drop(reader);
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("dropping a reader blocked on a FIFO without a writer must not hang");
}

fn follow_cfg(dir: &Path, start: FollowPosition) -> FollowConfig {
    FollowConfig {
        poll: Duration::from_millis(10),
        settle: Duration::ZERO,
        stop_file: Some(dir.join("STOP")),
        start,
        ..FollowConfig::new(dir)
    }
}

#[test]
fn a_corrupt_gzip_in_a_followed_directory_is_skipped_and_a_restart_gets_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let text = criteo_text(3000);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    write_file(dir.path(), "a.tsv", lines[..500].concat().as_bytes());
    let z = gzip(lines[500..2500].concat().as_bytes());
    write_file(dir.path(), "b.gz", &z[..z.len() / 2]);
    write_file(dir.path(), "c.tsv", lines[2500..].concat().as_bytes());
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 2);
    let mut f = follow(follow_cfg(dir.path(), FollowPosition::default()), &reader).unwrap();
    let all: Vec<_> = f.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(f.stats().bad_files(), 1);
    let got = rows(&all.iter().map(|b| b.batch.clone()).collect::<Vec<_>>());
    let want = |from: usize, to: usize| {
        let p = write_file(dir.path(), ".want", lines[from..to].concat().as_bytes());
        rows(&read_all(&[p], &config(Schema::criteo(), 64, 1)).unwrap().0)
    };
    // a, then the lines of b before the fault (some, not all), then c.
    let (a, c) = (want(0, 500), want(2500, 3000));
    let from_b = got.len() - a.len() - c.len();
    assert!(from_b > 0 && from_b < 2000, "{from_b} rows of b");
    assert_eq!(got[..500], a[..]);
    assert_eq!(got[500..500 + from_b], want(500, 500 + from_b)[..]);
    assert_eq!(got[500 + from_b..], c[..]);
    // A restart from every position skips b again (counted again) and reads exactly the rest.
    for (i, b) in all.iter().enumerate() {
        let mut r = follow(follow_cfg(dir.path(), b.position.clone()), &reader).unwrap();
        let rest: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
        let rest = rows(&rest.into_iter().map(|b| b.batch).collect::<Vec<_>>());
        assert_eq!(rest[..], got[b.position.rows as usize..], "after batch {i}");
        let in_or_before_b = b.position.file.as_str() <= "b.gz";
        assert_eq!(
            r.stats().bad_files(),
            u64::from(in_or_before_b),
            "after batch {i}"
        );
    }
}

#[test]
fn a_saved_offset_past_the_end_of_a_followed_file_is_a_bad_file_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let text = criteo_text(200);
    write_file(dir.path(), "a.tsv", &text.as_bytes()[..1000]);
    write_file(dir.path(), "b.gz", &gzip(text.as_bytes()));
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 1);
    for (file, offset) in [("a.tsv", 5000), ("b.gz", 1 << 30)] {
        let start = FollowPosition {
            file: file.into(),
            offset,
            rows: 10,
            ..FollowPosition::default()
        };
        let mut f = follow(follow_cfg(dir.path(), start), &reader).unwrap();
        let got: Vec<_> = f.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(f.stats().bad_files(), 1, "{file}");
        let n: usize = got.iter().map(|b| b.batch.rows).sum();
        assert_eq!(n, if file == "a.tsv" { 200 } else { 0 }, "{file}");
    }
}

#[test]
fn late_files_are_counted_once_and_read_files_are_not_late() {
    let dir = tempfile::tempdir().unwrap();
    let text = criteo_text(40);
    write_file(dir.path(), "a.tsv", text.as_bytes());
    write_file(dir.path(), "c.tsv", text.as_bytes());
    let cfg = FollowConfig {
        poll: Duration::from_millis(10),
        settle: Duration::ZERO,
        ..FollowConfig::new(dir.path())
    };
    let stop = cfg.stop.clone();
    let mut f = follow(cfg, &config(Schema::criteo(), 100, 1)).unwrap();
    let stats = f.stats();
    assert_eq!(f.next().unwrap().unwrap().position.file, "a.tsv");
    assert_eq!(f.next().unwrap().unwrap().position.file, "c.tsv");
    // b arrives after c was read: late. d comes after it and is read; the listing that finds
    // d also sees b, and several listings pass meanwhile (a and c must never count).
    write_file(dir.path(), "b.tsv", text.as_bytes());
    write_file(dir.path(), "d.tsv", text.as_bytes());
    assert_eq!(f.next().unwrap().unwrap().position.file, "d.tsv");
    assert_eq!(stats.late_files_skipped(), 1);
    write_file(dir.path(), "e.tsv", text.as_bytes());
    assert_eq!(f.next().unwrap().unwrap().position.file, "e.tsv");
    assert_eq!(stats.late_files_skipped(), 1);
    assert_eq!(stats.snapshot().late_files_skipped, 1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(f.next().is_none());
}
