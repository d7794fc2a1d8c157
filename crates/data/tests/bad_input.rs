//! Malformed inputs are counted and skipped, or fail with an error naming the file.

mod common;

use common::*;
use proptest::prelude::*;
use sparta_data::{read_all, read_batches, DataError, Schema};

#[test]
fn bad_lines_are_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (0..200).map(|i| criteo_line(0, i)).collect();
    lines[3].truncate(40); // truncated line
    lines[10] = lines[10].replacen("\t", "\tabc", 2); // non-numeric integer in I1.. (label stays)
    lines[20].push_str("\textra"); // extra column
    lines[30] = lines[30].rsplit_once('\t').unwrap().0.to_string(); // missing column
    lines[40] = lines[40].replacen('0', "7", 1); // label 7
    let mut text = lines.join("\n").into_bytes();
    text.extend_from_slice(b"\n\x00\xff\xfe\x01garbage\tbytes\n");
    let p = write_file(dir.path(), "bad.tsv", &text);
    let mut cfg = config(Schema::criteo(), 64, 1);
    cfg.max_bad_line_ratio = 0.1;
    let (b, st) = read_all(std::slice::from_ref(&p), &cfg).unwrap();
    assert_eq!(st.bad_lines, 6);
    assert_eq!(st.rows, 195);
    assert_eq!(b.iter().map(|b| b.rows).sum::<usize>(), 195);
    let first = st.first_bad_lines;
    assert_eq!(first.len(), 5);
    let name = p.display().to_string();
    assert!(
        first[0].starts_with(&format!("{name}:4: too few columns")),
        "{}",
        first[0]
    );
    assert!(
        first[1].starts_with(&format!("{name}:11: dense value \"I1\"")),
        "{}",
        first[1]
    );
    assert!(
        first[2].starts_with(&format!("{name}:21: too many columns")),
        "{}",
        first[2]
    );
    assert!(
        first[3].starts_with(&format!("{name}:31: too few columns")),
        "{}",
        first[3]
    );
    assert!(
        first[4].starts_with(&format!("{name}:41: label")),
        "{}",
        first[4]
    );
    assert!(first[0].contains('"'), "quoted copy: {}", first[0]);
}

#[test]
fn line_numbers_in_later_chunks_and_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (0..5000).map(|i| criteo_line(0, i)).collect();
    lines[4321] = "not a row".into();
    let p = write_file(dir.path(), "x.tsv", (lines.join("\n") + "\n").as_bytes());
    let gz = write_file(
        dir.path(),
        "x.gz",
        &gzip((lines.join("\n") + "\n").as_bytes()),
    );
    for path in [p, gz] {
        let (_, st) = read_all(
            std::slice::from_ref(&path),
            &config(Schema::criteo(), 100, 3),
        )
        .unwrap();
        assert_eq!(st.bad_lines, 1);
        let want = format!(
            "{}:4322: too few columns (1, expected 40): \"not a row\"",
            path.display()
        );
        assert_eq!(st.first_bad_lines, vec![want]);
    }
}

#[test]
fn too_many_bad_lines_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    // small file: checked at the end of input
    let p = write_file(
        dir.path(),
        "small.tsv",
        format!("{}\nbad\n", criteo_line(1, 0)).as_bytes(),
    );
    let err = read_all(std::slice::from_ref(&p), &config(Schema::criteo(), 10, 1)).unwrap_err();
    match err {
        DataError::TooManyBadLines {
            bad,
            seen,
            max,
            ref first,
            ..
        } => {
            assert_eq!((bad, seen, max), (1, 2, 0.01));
            assert!(first.contains("small.tsv:2:"), "{first}");
        }
        e => panic!("unexpected {e}"),
    }
    // large file with 10% bad lines: fails mid-stream, long before the end
    let text: String = (0..40_000)
        .map(|i| {
            if i % 10 == 0 {
                "x\n".to_string()
            } else {
                criteo_line(0, i) + "\n"
            }
        })
        .collect();
    let p = write_file(dir.path(), "big.tsv", text.as_bytes());
    let mut s = read_batches(&[p], &config(Schema::criteo(), 100, 2)).unwrap();
    let stats = s.stats();
    let err = s.by_ref().find_map(|b| b.err()).expect("an error");
    assert!(err.to_string().contains("too many bad lines"), "{err}");
    assert!(s.next().is_none());
    assert!(
        stats.lines_seen() < 40_000,
        "stopped early: {}",
        stats.lines_seen()
    );
}

#[test]
fn up_front_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.tsv");
    let cfg = config(Schema::criteo(), 10, 2);
    let e = read_batches(std::slice::from_ref(&missing), &cfg)
        .err()
        .unwrap();
    assert!(matches!(e, DataError::NotFound { .. }));
    assert!(e.to_string().contains("nope.tsv"), "{e}");
    let e = read_batches(&[dir.path().to_path_buf()], &cfg)
        .err()
        .unwrap();
    assert!(matches!(e, DataError::IsDirectory { .. }), "{e}");
    let mut bad_cfg = cfg.clone();
    bad_cfg.batch_size = 0;
    let empty = write_file(dir.path(), "empty.tsv", b"");
    assert!(matches!(
        read_batches(std::slice::from_ref(&empty), &bad_cfg)
            .err()
            .unwrap(),
        DataError::Config(_)
    ));
    let (b, st) = read_all(&[empty], &cfg).unwrap();
    assert!(b.is_empty());
    assert_eq!((st.rows, st.files), (0, 1));
}

#[test]
fn corrupt_gzip_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let z = gzip(criteo_text(3000).as_bytes());
    let p = write_file(dir.path(), "cut.gz", &z[..z.len() / 2]);
    let r = read_all(&[p], &config(Schema::criteo(), 100, 2));
    let e = r.expect_err("truncated gzip must fail");
    assert!(matches!(e, DataError::Gzip { .. }), "{e}");
    assert!(e.to_string().contains("cut.gz:"), "{e}");
}

#[test]
fn overlong_lines_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let long = "9".repeat((1 << 20) + 10);
    let text = format!("{}\n{long}\n{}\n", criteo_line(0, 1), criteo_line(1, 2));
    let p = write_file(dir.path(), "long.tsv", text.as_bytes());
    let g = write_file(dir.path(), "long.gz", &gzip(text.as_bytes()));
    let mut cfg = config(Schema::criteo(), 10, 1);
    cfg.max_bad_line_ratio = 0.5;
    for path in [p, g] {
        let (b, st) = read_all(std::slice::from_ref(&path), &cfg).unwrap();
        assert_eq!((st.rows, st.bad_lines), (2, 1), "{}", path.display());
        assert_eq!(b[0].labels, vec![0.0, 1.0]);
        assert!(
            st.first_bad_lines[0].contains(":2: line of"),
            "{}",
            st.first_bad_lines[0]
        );
    }
}

#[test]
fn an_overlong_line_is_reported_with_its_real_length() {
    let dir = tempfile::tempdir().unwrap();
    // Far longer than any chunk the feeder holds: the report must not stop at what it held.
    let (a, b) = (9 << 20, (3 << 20) + 5);
    let text = format!(
        "{}\n{}\n{}\n{}",
        criteo_line(0, 1),
        "7".repeat(a),
        criteo_line(1, 2),
        "8".repeat(b)
    );
    let p = write_file(dir.path(), "long.tsv", text.as_bytes());
    let g = write_file(dir.path(), "long.gz", &gzip(text.as_bytes()));
    let mut cfg = config(Schema::criteo(), 10, 1);
    cfg.max_bad_line_ratio = 0.5;
    for path in [p, g] {
        let (_, st) = read_all(std::slice::from_ref(&path), &cfg).unwrap();
        assert_eq!((st.rows, st.bad_lines), (2, 2), "{}", path.display());
        let first = &st.first_bad_lines;
        assert!(
            first[0].contains(&format!(":2: line of {a} bytes")),
            "{}",
            first[0]
        );
        // The last line has no line end: its length is counted to the end of the file.
        assert!(
            first[1].contains(&format!(":4: line of {b} bytes")),
            "{}",
            first[1]
        );
        assert_eq!(st.bytes, text.len() as u64, "{}", path.display());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn byte_soup_never_panics(soup in proptest::collection::vec(
        prop_oneof![Just(b'\t'), Just(b'\n'), Just(b'1'), Just(b'0'), Just(b'\r'), Just(b'|'), any::<u8>()],
        0..3000,
    ), threads in 1usize..4, gz in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let data = if gz { gzip(&soup) } else { soup.clone() };
        let p = write_file(dir.path(), "soup", &data);
        let mut cfg = config(Schema::criteo(), 7, threads);
        cfg.max_bad_line_ratio = 1.0;
        let (b, st) = read_all(&[p], &cfg).unwrap();
        prop_assert_eq!(b.iter().map(|b| b.rows as u64).sum::<u64>(), st.rows);
        prop_assert!(st.rows + st.bad_lines <= soup.iter().filter(|&&c| c == b'\n').count() as u64 + 1);
    }
}
