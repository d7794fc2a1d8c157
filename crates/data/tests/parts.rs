//! `ReaderConfig::part`: the parts of M workers partition the rows of the input exactly.

mod common;

use common::*;
use sparta_data::{read_all, Schema};

#[test]
fn parts_of_m_workers_partition_the_rows_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let text = criteo_text(1001);
    let plain = write_file(dir.path(), "a.tsv", text.as_bytes());
    let small = write_file(dir.path(), "tiny.tsv", criteo_line(1, 7).as_bytes());
    let gz1 = write_file(dir.path(), "b.gz", &gzip(criteo_text(37).as_bytes()));
    let gz2 = write_file(dir.path(), "c.gz", &gzip(criteo_text(11).as_bytes()));
    let inputs = [plain, small, gz1, gz2];
    let cfg = config(Schema::criteo(), 64, 2);
    let (all, _) = read_all(&inputs, &cfg).unwrap();
    let all = sorted(rows(&all));
    assert_eq!(all.len(), 1001 + 1 + 37 + 11);
    for m in [1usize, 2, 3, 5, 8] {
        let mut union = Vec::new();
        let mut sizes = Vec::new();
        for j in 0..m {
            let mut c = cfg.clone();
            c.part = Some((j, m));
            let (b, st) = read_all(&inputs, &c).unwrap();
            assert_eq!(st.bad_lines, 0, "part {j} of {m} cut a line");
            let r = rows(&b);
            sizes.push(r.len());
            union.extend(r);
        }
        assert_eq!(sorted(union), all, "{m} parts");
        if m == 2 {
            // The plain file is split about evenly; gzip files go whole, round-robin.
            let plain_rows = [sizes[0] - 37, sizes[1] - 11];
            assert!(
                plain_rows.iter().all(|&n| (450..=560).contains(&n)),
                "{sizes:?}"
            );
        }
    }
}

#[test]
fn header_is_read_once_and_bad_parts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema {
        header: true,
        ..Schema::criteo()
    };
    let text = format!("label\theader\n{}", criteo_text(100));
    let p = write_file(dir.path(), "h.tsv", text.as_bytes());
    let cfg = config(schema, 16, 1);
    let mut total = 0;
    for j in 0..3 {
        let mut c = cfg.clone();
        c.part = Some((j, 3));
        let (b, st) = read_all(std::slice::from_ref(&p), &c).unwrap();
        assert_eq!(st.bad_lines, 0);
        total += rows(&b).len();
    }
    assert_eq!(total, 100);
    let mut c = cfg.clone();
    c.part = Some((3, 3));
    assert!(read_all(std::slice::from_ref(&p), &c).is_err());
}
