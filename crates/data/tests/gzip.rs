//! A gzip input reads exactly like the same text in a plain file: rows, bad lines and byte
//! offsets, for inputs over several decompressed chunks (1 MiB each), CRLF line ends and
//! multi-member files (`cat a.gz b.gz`).

mod common;

use std::path::PathBuf;

use common::*;
use sparta_data::{read_batches_at, PositionedBatch, ReadPosition, ReaderConfig, Schema};

/// ~4.5 MiB of Criteo text with a malformed line every 97th; `crlf`: `\r\n` line ends.
fn text(n: usize, crlf: bool) -> Vec<u8> {
    let end = if crlf { "\r\n" } else { "\n" };
    let mut out = String::new();
    for i in 0..n {
        if i % 97 == 11 {
            out.push_str(&format!("bad\tline {i}"));
        } else {
            out.push_str(&criteo_line((i % 3 == 0) as u8, i));
        }
        out.push_str(end);
    }
    out.into_bytes()
}

fn read(path: &PathBuf, start: ReadPosition) -> (Vec<PositionedBatch>, u64, u64) {
    let cfg = ReaderConfig {
        max_bad_line_ratio: 0.5,
        ..config(Schema::criteo(), 1000, 2)
    };
    let mut s = read_batches_at(std::slice::from_ref(path), &cfg, start).unwrap();
    let out = s.positioned().collect::<Result<Vec<_>, _>>().unwrap();
    let st = s.stats().snapshot();
    (out, st.rows, st.bad_lines)
}

fn multi_member(data: &[u8], parts: usize) -> Vec<u8> {
    // Cut at line ends so each member holds whole lines, as `cat a.gz b.gz` of files would;
    // the last cut falls mid-line to check that a line may span two members too.
    let mut out = Vec::new();
    let step = data.len() / parts;
    let mut start = 0;
    for p in 1..parts {
        let mut cut = p * step;
        if p < parts - 1 {
            while data[cut - 1] != b'\n' {
                cut += 1;
            }
        }
        out.extend(gzip(&data[start..cut]));
        start = cut;
    }
    out.extend(gzip(&data[start..]));
    out
}

#[test]
fn gzip_reads_exactly_like_plain() {
    let dir = tempfile::tempdir().unwrap();
    for crlf in [false, true] {
        let data = text(20_000, crlf);
        assert!(data.len() > 4 << 20, "must span several 1 MiB chunks");
        let plain = write_file(dir.path(), "p.tsv", &data);
        let (want, want_rows, want_bad) = read(&plain, ReadPosition::default());
        assert_eq!(want_rows + want_bad, 20_000);
        assert_eq!(
            want_bad,
            (0..20_000).filter(|i| i % 97 == 11).count() as u64
        );
        for (name, bytes) in [
            ("one.gz", gzip(&data)),
            ("multi.gz", multi_member(&data, 4)),
        ] {
            let gz = write_file(dir.path(), name, &bytes);
            let (got, rows, bad) = read(&gz, ReadPosition::default());
            assert_eq!((rows, bad), (want_rows, want_bad), "{name} crlf={crlf}");
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.position, w.position, "{name} crlf={crlf}");
                assert_eq!(rows_of(g), rows_of(w), "{name} crlf={crlf}");
            }
            // Resume after a batch in every chunk: exactly the rest.
            for k in (0..got.len() - 1).step_by(3) {
                let (rest, r, _) = read(&gz, got[k].position);
                assert_eq!(
                    r,
                    want_rows - got[k].position.rows,
                    "{name} after batch {k}"
                );
                assert_eq!(rest.len(), got.len() - k - 1);
                assert_eq!(rows_of(&rest[0]), rows_of(&got[k + 1]));
            }
        }
    }
}

fn rows_of(b: &PositionedBatch) -> Vec<Row> {
    rows(std::slice::from_ref(&b.batch))
}
