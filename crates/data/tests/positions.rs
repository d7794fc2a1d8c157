//! Deterministic batches for any thread count, and exact resume at a [`ReadPosition`].

mod common;

use std::path::{Path, PathBuf};

use common::*;
use proptest::prelude::*;
use sparta_data::{read_batches_at, Batch, PositionedBatch, ReadPosition, ReaderConfig, Schema};

/// Text of `n` lines from `first`: good Criteo rows with a blank line every 17th, a `\r`
/// line every 23rd and a malformed line every 31st; `trailing`: end with `\n`.
fn mixed_text(first: usize, n: usize, trailing: bool) -> String {
    let mut lines = Vec::with_capacity(n);
    for i in first..first + n {
        lines.push(match i {
            i if i % 17 == 5 => String::new(),
            i if i % 23 == 7 => "\r".to_string(),
            i if i % 31 == 3 => format!("bad\tline {i}"),
            i => criteo_line((i % 3 == 0) as u8, i),
        });
    }
    let mut text = lines.join("\n");
    if trailing {
        text.push('\n');
    }
    text
}

/// Plain and gzip inputs (a plain file over several 64 KiB chunks, a gzip file over two
/// 1 MiB chunks, an empty file, small files, one without a final newline).
fn inputs(dir: &Path, header: bool) -> Vec<PathBuf> {
    let head = |t: String| {
        if header {
            format!("label\tI1\tC1\n{t}")
        } else {
            t
        }
    };
    vec![
        write_file(dir, "a.tsv", head(mixed_text(0, 1500, true)).as_bytes()),
        write_file(
            dir,
            "b.gz",
            &gzip(head(mixed_text(2000, 4600, true)).as_bytes()),
        ),
        write_file(dir, "empty.tsv", b""),
        write_file(dir, "c.tsv", head(mixed_text(9000, 40, false)).as_bytes()),
        write_file(
            dir,
            "d.gz",
            &gzip(head(mixed_text(9500, 300, false)).as_bytes()),
        ),
        write_file(dir, "e.tsv", head(mixed_text(12000, 700, true)).as_bytes()),
    ]
}

fn cfg(header: bool, batch_size: usize, threads: usize) -> ReaderConfig {
    let schema = Schema {
        header,
        ..Schema::criteo()
    };
    ReaderConfig {
        max_bad_line_ratio: 0.5,
        ..config(schema, batch_size, threads)
    }
}

fn read(paths: &[PathBuf], cfg: &ReaderConfig) -> Result<Vec<PositionedBatch>, String> {
    read_at(paths, cfg, ReadPosition::default())
}

fn read_at(
    paths: &[PathBuf],
    cfg: &ReaderConfig,
    start: ReadPosition,
) -> Result<Vec<PositionedBatch>, String> {
    let mut s = read_batches_at(paths, cfg, start).map_err(|e| e.to_string())?;
    let out = s.positioned().collect::<Result<Vec<_>, _>>();
    out.map_err(|e| e.to_string())
}

fn batches(v: &[PositionedBatch]) -> Vec<Batch> {
    v.iter().map(|b| b.batch.clone()).collect()
}

fn positions(v: &[PositionedBatch]) -> Vec<ReadPosition> {
    v.iter().map(|b| b.position).collect()
}

/// Checks that `threads` give the single-threaded batches and positions; returns those.
fn same_for_all_threads(paths: &[PathBuf], base: &ReaderConfig) -> Vec<PositionedBatch> {
    let one = read(
        paths,
        &ReaderConfig {
            threads: 1,
            ..base.clone()
        },
    )
    .unwrap();
    for b in &one[..one.len().saturating_sub(1)] {
        assert_eq!(
            b.batch.rows, base.batch_size,
            "only the last batch may be short"
        );
    }
    for t in [2, 4, 7] {
        let c = ReaderConfig {
            threads: t,
            queue_batches: 2 * t + 2,
            ..base.clone()
        };
        let many = read(paths, &c).unwrap();
        assert_eq!(batches(&many), batches(&one), "{t} threads: {base:?}");
        assert_eq!(positions(&many), positions(&one), "{t} threads");
    }
    one
}

/// Checks that a reader started after each batch `k` yields exactly batches `k+1..`.
fn resume_everywhere(
    paths: &[PathBuf],
    base: &ReaderConfig,
    full: &[PositionedBatch],
    step: usize,
) {
    let mut last_bad = u64::MAX;
    for k in (0..full.len()).step_by(step) {
        let start = full[k].position;
        let mut s = read_batches_at(paths, base, start).unwrap();
        assert_eq!(s.position(), start);
        let rest = s.positioned().collect::<Result<Vec<_>, _>>().unwrap();
        assert_eq!(
            batches(&rest),
            batches(&full[k + 1..]),
            "resume after batch {k}"
        );
        assert_eq!(
            positions(&rest),
            positions(&full[k + 1..]),
            "resume after batch {k}"
        );
        let st = s.stats().snapshot();
        let left: usize = full[k + 1..].iter().map(|b| b.batch.rows).sum();
        assert_eq!(st.rows, left as u64);
        if base.max_rows.is_none() {
            // Without a row limit a reader parses everything after its start. (With one, it
            // parses to the end of the chunk holding its last row, and chunks are cut from the
            // start on.)
            assert!(
                st.bad_lines <= last_bad,
                "bad lines of a later start must not grow"
            );
        }
        last_bad = st.bad_lines;
    }
}

#[test]
fn batches_do_not_depend_on_threads() {
    let dir = tempfile::tempdir().unwrap();
    for header in [false, true] {
        let paths = inputs(dir.path(), header);
        for part in [None, Some((0, 2)), Some((1, 2)), Some((2, 3))] {
            for (batch_size, epochs) in [(100, 2), (1, 1), (4096, 2)] {
                let base = ReaderConfig {
                    part,
                    epochs,
                    ..cfg(header, batch_size, 1)
                };
                let one = same_for_all_threads(&paths, &base);
                let rows: usize = one.iter().map(|b| b.batch.rows).sum();
                if part.is_none() {
                    let (mut bad, mut good) = (0, 0);
                    for i in (0..1500).chain(2000..6600).chain(9000..9040) {
                        match i {
                            i if i % 17 == 5 || i % 23 == 7 => {}
                            i if i % 31 == 3 => bad += 1,
                            _ => good += 1,
                        }
                    }
                    for i in (9500..9800).chain(12000..12700) {
                        match i {
                            i if i % 17 == 5 || i % 23 == 7 => {}
                            i if i % 31 == 3 => bad += 1,
                            _ => good += 1,
                        }
                    }
                    assert!(bad > 0);
                    assert_eq!(rows, good * epochs, "every good row of every epoch");
                }
            }
        }
    }
}

#[test]
fn resume_after_every_batch_yields_exactly_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    for header in [false, true] {
        let paths = inputs(dir.path(), header);
        for (part, batch_size, max_rows, step) in [
            (None, 257, None, 1),
            (Some((1, 2)), 300, None, 1),
            (Some((0, 3)), 211, Some(1001), 1),
            (None, 7, Some(900), 3),
        ] {
            let base = ReaderConfig {
                part,
                epochs: 2,
                max_rows,
                ..cfg(header, batch_size, 3)
            };
            let full = same_for_all_threads(&paths, &base);
            let rows: u64 = full.iter().map(|b| b.batch.rows as u64).sum();
            if let Some(m) = max_rows {
                assert_eq!(rows, m);
            }
            assert_eq!(full.last().unwrap().position.rows, rows);
            resume_everywhere(&paths, &base, &full, step);
        }
    }
}

#[test]
fn resume_at_the_start_of_a_file_skips_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let paths = inputs(dir.path(), true);
    let base = ReaderConfig {
        epochs: 2,
        ..cfg(true, 50, 2)
    };
    let full = read(&paths, &base).unwrap();
    // Start of file 3 (c.tsv) in epoch 1: its rows come after all of a, b of epoch 1.
    let start = ReadPosition {
        epoch: 1,
        file_index: 3,
        byte_offset: 0,
        rows: 0,
    };
    let got = read_at(&paths, &base, start).unwrap();
    let expected = {
        let c = ReaderConfig {
            epochs: 1,
            ..base.clone()
        };
        read(&paths[3..], &c).unwrap()
    };
    assert_eq!(rows(&batches(&got)), rows(&batches(&expected)));
    assert_eq!(got.last().unwrap().position.file_index, 5);
    assert_eq!(got.last().unwrap().position.epoch, 1);
    let total: usize = full.iter().map(|b| b.batch.rows).sum();
    assert!(rows(&batches(&got)).len() < total);
}

#[test]
fn bad_start_positions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let paths = inputs(dir.path(), false);
    let base = ReaderConfig {
        epochs: 2,
        max_rows: Some(100),
        ..cfg(false, 10, 2)
    };
    let at = |epoch, file_index, byte_offset, rows| ReadPosition {
        epoch,
        file_index,
        byte_offset,
        rows,
    };
    let a_len = std::fs::metadata(&paths[0]).unwrap().len();
    for (c, what) in [
        (at(2, 0, 0, 0), "epoch"),
        (at(0, 6, 0, 0), "out of range"),
        (at(0, 0, a_len + 1, 0), "past the end"),
        (at(0, 0, 3, 0), "not at a line start"),
        (at(0, 2, 1, 0), "empty"),
        (at(0, 0, 0, 101), "max_rows"),
    ] {
        let err = read_at(&paths, &base, c).unwrap_err();
        assert!(err.contains(what), "{what}: {err}");
    }
    // gzip offsets are checked when the file is reached
    let err = read_at(&paths, &base, at(0, 1, 5, 0)).unwrap_err();
    assert!(err.contains("not at a line start"), "{err}");
    let err = read_at(&paths, &base, at(0, 1, 1 << 30, 0)).unwrap_err();
    assert!(err.contains("past the end"), "{err}");
    // the ends of files are fine, and so is the end of the job
    assert!(!read_at(&paths, &base, at(0, 0, a_len, 0))
        .unwrap()
        .is_empty());
    assert!(read_at(&paths, &base, at(1, 5, 0, 100)).unwrap().is_empty());
    let none: &[PathBuf] = &[];
    assert!(read_at(none, &base, at(0, 0, 0, 0)).unwrap().is_empty());
}

/// A small file: `(kind, i)` lines with kind 0 good, 1 blank, 2 bad.
fn small_text(lines: &[(u8, usize)], trailing: bool) -> String {
    let mut out: Vec<String> = lines
        .iter()
        .map(|&(kind, i)| match kind {
            0 => criteo_line((i % 2) as u8, i),
            1 => String::new(),
            _ => format!("{i}\tbad"),
        })
        .collect();
    if trailing {
        out.push(String::new());
    }
    out.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_inputs_same_batches_and_exact_resume(
        files in prop::collection::vec(
            (prop::collection::vec((0u8..3, 0usize..1000), 0..40), any::<bool>(), any::<bool>()),
            1..5,
        ),
        header in any::<bool>(),
        batch_size in 1usize..12,
        threads in 2usize..6,
        part in prop::option::of((0usize..3, 1usize..4)),
        epochs in 1usize..3,
        max_rows in prop::option::of(0u64..80),
        resume_at in any::<prop::sample::Index>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = files
            .iter()
            .enumerate()
            .map(|(j, (lines, trailing, gz))| {
                let mut text = small_text(lines, *trailing);
                if header {
                    text = format!("h\th\n{text}");
                }
                if *gz {
                    write_file(dir.path(), &format!("{j}.gz"), &gzip(text.as_bytes()))
                } else {
                    write_file(dir.path(), &format!("{j}.tsv"), text.as_bytes())
                }
            })
            .collect();
        let part = part.map(|(i, n)| (i % n, n));
        let base = ReaderConfig {
            part,
            epochs,
            max_rows,
            max_bad_line_ratio: 1.0,
            ..cfg(header, batch_size, 1)
        };
        let one = read(&paths, &base).unwrap();
        let c = ReaderConfig { threads, queue_batches: 3, ..base.clone() };
        let many = read(&paths, &c).unwrap();
        prop_assert_eq!(batches(&many), batches(&one));
        prop_assert_eq!(positions(&many), positions(&one));
        if part.is_none() {
            let good = files
                .iter()
                .flat_map(|(lines, _, _)| lines.iter().filter(|l| l.0 == 0))
                .count() as u64 * epochs as u64;
            let rows: u64 = one.iter().map(|b| b.batch.rows as u64).sum();
            prop_assert_eq!(rows, max_rows.map_or(good, |m| m.min(good)));
        }
        if !one.is_empty() {
            let k = resume_at.index(one.len());
            let rest = read_at(&paths, &c, one[k].position).unwrap();
            prop_assert_eq!(batches(&rest), batches(&one[k + 1..]));
        }
    }
}
