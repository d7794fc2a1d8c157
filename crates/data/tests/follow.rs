//! Following a directory: name order, completeness rules, stop file and flag, and exact
//! positions (a restart at any returned position reads exactly the remaining rows).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use sparta_data::{follow, read_all, FollowConfig, FollowPosition, ReaderConfig, Schema};

fn cfg(dir: &std::path::Path, stop_file: bool) -> FollowConfig {
    FollowConfig {
        poll: Duration::from_millis(10),
        settle: Duration::ZERO,
        stop_file: stop_file.then(|| dir.join("STOP")),
        ..FollowConfig::new(dir)
    }
}

/// Lines `from..to` of the generated Criteo text.
fn lines(from: usize, to: usize) -> String {
    criteo_text(to)
        .lines()
        .skip(from)
        .map(|l| format!("{l}\n"))
        .collect()
}

fn expected(reader: &ReaderConfig, text: &str) -> Vec<Row> {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "all.tsv", text.as_bytes());
    let single = ReaderConfig {
        threads: 1,
        ..reader.clone()
    };
    rows(&read_all(&[p], &single).unwrap().0)
}

#[test]
fn reads_complete_files_in_name_order_then_stops_at_the_stop_file() {
    let dir = tempfile::tempdir().unwrap();
    // Written out of order; a dotfile, a .tmp file and a subdirectory are ignored.
    write_file(dir.path(), "h02.tsv", lines(500, 900).as_bytes());
    write_file(dir.path(), "h01.tsv.gz", &gzip(lines(200, 500).as_bytes()));
    write_file(dir.path(), "h00.tsv", lines(0, 200).as_bytes());
    write_file(dir.path(), ".h03.tsv", lines(0, 50).as_bytes());
    write_file(dir.path(), "h04.tsv.tmp", lines(0, 50).as_bytes());
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 3);
    let got: Vec<_> = follow(cfg(dir.path(), true), &reader)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let batches: Vec<_> = got.iter().map(|b| b.batch.clone()).collect();
    assert_eq!(rows(&batches), expected(&reader, &lines(0, 900)));
    // Batches never span files: 200 = 3x64 + 8, 300 = 4x64 + 44, 400 = 6x64 + 16.
    let sizes: Vec<usize> = batches.iter().map(|b| b.rows).collect();
    assert_eq!(sizes[3], 8);
    assert_eq!(sizes[8], 44);
    assert_eq!(sizes.len(), 4 + 5 + 7);
    let last = &got.last().unwrap().position;
    assert_eq!(last.file, "h02.tsv");
    assert_eq!(last.offset, lines(500, 900).len() as u64);
    assert_eq!(last.rows, 900);
}

#[test]
fn restarting_at_any_position_reads_exactly_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema {
        header: true,
        ..Schema::criteo()
    };
    let header = "label\tI1\tC1\n";
    write_file(
        dir.path(),
        "a.tsv",
        format!("{header}{}", lines(0, 150)).as_bytes(),
    );
    // A gzip file with a malformed line and a last line without '\n'.
    let mut b = format!("{header}{}not a row\n{}", lines(150, 200), lines(200, 260));
    b.pop();
    write_file(dir.path(), "b.gz", &gzip(b.as_bytes()));
    write_file(dir.path(), "STOP", b"");
    let reader = ReaderConfig {
        max_bad_line_ratio: 0.5,
        ..config(schema.clone(), 32, 2)
    };
    let all: Vec<_> = follow(cfg(dir.path(), true), &reader)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want = expected(
        &ReaderConfig {
            schema: Schema::criteo(),
            ..reader.clone()
        },
        &lines(0, 260),
    );
    let full: Vec<_> = all.iter().map(|b| b.batch.clone()).collect();
    assert_eq!(rows(&full), want);
    for (i, at) in all.iter().enumerate() {
        let start = at.position.clone();
        let rest: Vec<_> = follow(
            FollowConfig {
                start,
                ..cfg(dir.path(), true)
            },
            &reader,
        )
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
        let rest_rows: Vec<_> = rest.iter().map(|b| b.batch.clone()).collect();
        assert_eq!(
            rows(&rest_rows),
            want[at.position.rows as usize..],
            "after batch {i}"
        );
        if let Some(last) = rest.last() {
            assert_eq!(last.position.rows, 260);
        }
    }
}

#[test]
fn follows_new_files_and_stops_on_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "0001.tsv", lines(0, 100).as_bytes());
    let reader = config(Schema::criteo(), 50, 2);
    let c = cfg(dir.path(), false);
    let stop = c.stop.clone();
    let mut f = follow(c, &reader).unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(f.next().unwrap().unwrap().batch);
    }
    // The shipper convention: write a temporary name, then rename.
    write_file(dir.path(), ".0002.tsv", lines(100, 180).as_bytes());
    std::fs::rename(dir.path().join(".0002.tsv"), dir.path().join("0002.tsv")).unwrap();
    for _ in 0..2 {
        got.push(f.next().unwrap().unwrap().batch);
    }
    assert_eq!(f.position().file, "0002.tsv");
    assert_eq!(f.position().rows, 180);
    stop.store(true, Ordering::Relaxed);
    assert!(f.next().is_none());
    assert_eq!(rows(&got), expected(&reader, &lines(0, 180)));
}

#[test]
fn the_newest_file_waits_until_complete() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "a.tsv", lines(0, 100).as_bytes());
    // Still being written: not settled for an hour, and no later file exists.
    write_file(dir.path(), "b.tsv", lines(100, 130).as_bytes());
    let reader = config(Schema::criteo(), 25, 1);
    let c = FollowConfig {
        settle: Duration::from_secs(3600),
        ..cfg(dir.path(), true)
    };
    let mut f = follow(c, &reader).unwrap();
    let mut got = Vec::new();
    // a.tsv is complete because b.tsv exists.
    while f.position().rows < 100 {
        got.push(f.next().unwrap().unwrap().batch);
    }
    assert_eq!(f.position().file, "a.tsv");
    // b.tsv grows; had it been read early, these rows would be missing.
    let mut b = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("b.tsv"))
        .unwrap();
    std::io::Write::write_all(&mut b, lines(130, 170).as_bytes()).unwrap();
    drop(b);
    // The stop file makes every present file complete.
    write_file(dir.path(), "STOP", b"");
    for batch in f {
        got.push(batch.unwrap().batch);
    }
    assert_eq!(rows(&got), expected(&reader, &lines(0, 170)));
}

#[test]
fn a_missing_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reader = config(Schema::criteo(), 25, 1);
    let e = follow(cfg(&dir.path().join("nope"), false), &reader)
        .err()
        .unwrap();
    assert!(e.to_string().contains("nope"), "{e}");
    let file = write_file(dir.path(), "f.tsv", b"");
    let e = follow(cfg(&file, false), &reader).err().unwrap();
    assert!(e.to_string().contains("not a directory"), "{e}");
}

#[test]
fn a_saved_position_in_a_deleted_file_is_counted_bad_and_continues_with_the_next() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "b.tsv", lines(0, 40).as_bytes());
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 25, 1);
    let start = FollowPosition {
        file: "a.tsv".into(),
        offset: 1234,
        rows: 7,
        ..FollowPosition::default()
    };
    let mut f = follow(
        FollowConfig {
            start,
            ..cfg(dir.path(), true)
        },
        &reader,
    )
    .unwrap();
    let got: Vec<_> = f.by_ref().collect::<Result<_, _>>().unwrap();
    // The rest of a.tsv is lost: not silently, it is a bad file.
    assert_eq!(f.stats().bad_files(), 1);
    assert_eq!(got.last().unwrap().position.rows, 47);
    let batches: Vec<_> = got.into_iter().map(|b| b.batch).collect();
    assert_eq!(rows(&batches), expected(&reader, &lines(0, 40)));
}

#[test]
fn workers_share_every_file_each_row_read_once_and_resume_in_their_part() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "h00.tsv", lines(0, 700).as_bytes());
    // A gzip file of several 64 KiB blocks of text, and one smaller than a block.
    let big = lines(700, 4700);
    assert!(big.len() as u64 > 4 * 65536, "{} bytes", big.len());
    write_file(dir.path(), "h01.tsv.gz", &gzip(big.as_bytes()));
    write_file(
        dir.path(),
        "h02.tsv.gz",
        &gzip(lines(4700, 4900).as_bytes()),
    );
    write_file(dir.path(), "h03.tsv", lines(4900, 5700).as_bytes());
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 2);
    let count = 3;
    let mut all = Vec::new();
    for index in 0..count {
        let part = Some((index, count));
        let got: Vec<_> = follow(
            FollowConfig {
                part,
                ..cfg(dir.path(), true)
            },
            &reader,
        )
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
        let mine: Vec<_> = got.iter().map(|b| b.batch.clone()).collect();
        // Plain files are cut in equal ranges, the big gzip file is shared by blocks: every
        // worker gets a part of both kinds.
        for file in ["h00.tsv", "h01.tsv.gz", "h03.tsv"] {
            let n: usize = got
                .iter()
                .filter(|b| b.position.file == file)
                .map(|b| b.batch.rows)
                .sum();
            assert!(n > 0, "worker {index}: no rows of {file}");
        }
        // A restart at any position continues inside this worker's share.
        for at in got.iter().step_by(5) {
            let rest: Vec<_> = follow(
                FollowConfig {
                    part,
                    start: at.position.clone(),
                    ..cfg(dir.path(), true)
                },
                &reader,
            )
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
            let rest: Vec<_> = rest.iter().map(|b| b.batch.clone()).collect();
            assert_eq!(
                rows(&rest),
                rows(&mine)[at.position.rows as usize..],
                "worker {index} after {:?}",
                at.position
            );
        }
        all.extend(mine);
    }
    // Together: every row exactly once.
    assert_eq!(
        sorted(rows(&all)),
        sorted(expected(&reader, &lines(0, 5700)))
    );
}

#[test]
fn idle_ticks_come_while_waiting_and_keep_the_position() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "h00.tsv", lines(0, 100).as_bytes());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = config(Schema::criteo(), 64, 1);
    let mut f = follow(
        FollowConfig {
            idle_tick: Some(Duration::from_millis(30)),
            stop: stop.clone(),
            ..cfg(dir.path(), false)
        },
        &reader,
    )
    .unwrap();
    let a = f.next().unwrap().unwrap();
    let b = f.next().unwrap().unwrap();
    assert_eq!((a.batch.rows, b.batch.rows), (64, 36));
    // Nothing more to read: empty batches at the last position.
    for _ in 0..3 {
        let t = f.next().unwrap().unwrap();
        assert_eq!(t.batch.rows, 0);
        assert_eq!(t.position, b.position);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(f.next().is_none());
}

/// Follows `dir` (with its stop file) from `start` to the end: the batches and the follower's
/// bad and late file counts.
fn follow_all(
    dir: &std::path::Path,
    start: FollowPosition,
    reader: &ReaderConfig,
) -> (Vec<sparta_data::FollowBatch>, u64, u64) {
    let mut f = follow(
        FollowConfig {
            start,
            ..cfg(dir, true)
        },
        reader,
    )
    .unwrap();
    let got: Vec<_> = f.by_ref().collect::<Result<_, _>>().unwrap();
    let st = f.stats();
    (got, st.bad_files(), st.late_files_skipped())
}

#[test]
fn positions_carry_the_identities_of_the_files_read_up_to_theirs() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "a.tsv", lines(0, 100).as_bytes());
    write_file(dir.path(), "b.tsv", lines(100, 200).as_bytes());
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 1);
    let (got, _, _) = follow_all(dir.path(), FollowPosition::default(), &reader);
    let names = |p: &FollowPosition| -> Vec<String> {
        p.recent
            .iter()
            .map(|e| e.split_once(' ').unwrap().1.to_string())
            .collect()
    };
    assert_eq!(names(&got[0].position), ["a.tsv"]);
    assert_eq!(names(&got.last().unwrap().position), ["a.tsv", "b.tsv"]);
}

#[test]
fn resuming_after_the_position_file_was_renamed_continues_its_rest_once() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "a.tsv", lines(0, 150).as_bytes());
    write_file(dir.path(), "b.tsv", lines(150, 200).as_bytes());
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 1);
    let (got, _, _) = follow_all(dir.path(), FollowPosition::default(), &reader);
    let mid = got[0].position.clone();
    assert_eq!((mid.file.as_str(), mid.rows), ("a.tsv", 64));
    // While the job is down, a.tsv is renamed to a name after b.tsv.
    std::fs::rename(dir.path().join("a.tsv"), dir.path().join("z.tsv")).unwrap();
    let (rest, bad, late) = follow_all(dir.path(), mid.clone(), &reader);
    let batches: Vec<_> = rest.iter().map(|b| b.batch.clone()).collect();
    let want = format!(
        "{}{}",
        &lines(0, 150)[mid.offset as usize..],
        lines(150, 200)
    );
    assert_eq!(rows(&batches), expected(&reader, &want));
    assert_eq!((bad, late), (0, 0));
    assert_eq!(rest.last().unwrap().position.rows, 200);
}

#[test]
fn resuming_after_the_position_file_was_deleted_counts_it_only_if_rows_were_left() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "a.tsv", lines(0, 150).as_bytes());
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 1);
    let (got, _, _) = follow_all(dir.path(), FollowPosition::default(), &reader);
    let (mid, end) = (
        got[0].position.clone(),
        got.last().unwrap().position.clone(),
    );
    std::fs::remove_file(dir.path().join("a.tsv")).unwrap();
    write_file(dir.path(), "b.tsv", lines(150, 200).as_bytes());
    // Stopped inside a.tsv: its rest is lost, and counted.
    let (rest, bad, _) = follow_all(dir.path(), mid, &reader);
    assert_eq!(bad, 1);
    assert_eq!(rest.last().unwrap().position.rows, 64 + 50);
    // Stopped at its end: nothing lost, nothing counted.
    let (rest, bad, _) = follow_all(dir.path(), end, &reader);
    assert_eq!(bad, 0);
    assert_eq!(rest.last().unwrap().position.rows, 200);
}

#[test]
fn a_file_read_before_a_restart_and_renamed_meanwhile_is_not_read_again() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "a.tsv", lines(0, 100).as_bytes());
    write_file(dir.path(), "b.tsv", lines(100, 150).as_bytes());
    write_file(dir.path(), "STOP", b"");
    let reader = config(Schema::criteo(), 64, 1);
    let (got, _, _) = follow_all(dir.path(), FollowPosition::default(), &reader);
    let end = got.last().unwrap().position.clone();
    std::fs::rename(dir.path().join("a.tsv"), dir.path().join("c.tsv")).unwrap();
    write_file(dir.path(), "d.tsv", lines(150, 170).as_bytes());
    let (rest, bad, late) = follow_all(dir.path(), end, &reader);
    let batches: Vec<_> = rest.iter().map(|b| b.batch.clone()).collect();
    assert_eq!(rows(&batches), expected(&reader, &lines(150, 170)));
    assert_eq!((bad, late), (0, 1));
}
