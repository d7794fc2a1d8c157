//! The reading engine (`read_all`: input detection, line-aligned feeding, gzip decoding,
//! parser threads, in-order assembly) over the fuzz input written as a plain file and as gzip:
//! one member, several members, or a corrupt stream. The plain and gzip reads of the same
//! text give the same rows and the same bad-line count; a plain file read in 2 or 3 parts
//! gives, joined, the rows of the whole; a corrupt gzip file gives an error or rows, never a
//! panic.
#![no_main]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use flate2::write::GzEncoder;
use flate2::Compression;
use libfuzzer_sys::fuzz_target;
use sparta_data::{read_all, Batch, DataError, ReadStatsSnapshot, ReaderConfig};
use sparta_fuzz::{layouts, Layout};

fn dir() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("sparta-fuzz-feeder-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    })
}

fn all_layouts() -> &'static [Layout] {
    static L: OnceLock<Vec<Layout>> = OnceLock::new();
    L.get_or_init(layouts)
}

fn gzip(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(p).expect("gzip to memory");
        out.extend(e.finish().expect("gzip to memory"));
    }
    out
}

type Read = Result<(Batch, ReadStatsSnapshot), DataError>;

fn read(path: &Path, cfg: &ReaderConfig) -> Read {
    let (batches, stats) = read_all(&[path.to_path_buf()], cfg)?;
    for b in &batches {
        assert!(
            b.rows >= 1 && b.rows <= cfg.batch_size,
            "batch of {} rows",
            b.rows
        );
        b.check().expect("well-formed batch");
    }
    // An empty list concatenates to a batch of shape 0x0: no rows to check.
    Ok((Batch::concat(&batches), stats))
}

/// Rows compared with weights made explicit (a batch whose weights are all 1 may omit them).
fn same_rows(a: &Batch, b: &Batch) -> bool {
    let ones = |x: &Batch| {
        if x.weights.is_empty() {
            vec![1.0; x.ids.len()]
        } else {
            x.weights.clone()
        }
    };
    a.rows == b.rows
        && (a.rows == 0
            || (a.labels == b.labels
                && a.dense == b.dense
                && a.ids == b.ids
                && a.offsets == b.offsets
                && ones(a) == ones(b)))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, text)) = data.split_first() else {
        return;
    };
    let ls = all_layouts();
    let layout = &ls[(mode & 7) as usize % ls.len()];
    let mut cfg = ReaderConfig::new(layout.schema.clone());
    cfg.plan = Some(std::sync::Arc::new(layout.plan.clone()));
    cfg.batch_size = 1 + (mode >> 3 & 3) as usize * 3;
    cfg.threads = 1 + (mode >> 5 & 1) as usize;
    cfg.queue_batches = 2;
    cfg.max_bad_line_ratio = 1.0;
    let d = dir();
    let (plain, gz) = (d.join("plain.txt"), d.join("text.gz"));

    if mode >> 6 == 3 {
        // A corrupt gzip stream: the gzip magic, then the fuzz bytes.
        let mut bytes = vec![0x1f, 0x8b];
        bytes.extend_from_slice(text);
        std::fs::write(&gz, &bytes).expect("write");
        if let Ok((b, _)) = read(&gz, &cfg) {
            if b.rows > 0 {
                b.check_tags(&layout.tags())
                    .expect("rows of a corrupt stream");
            }
        }
        return;
    }
    if text.starts_with(&[0x1f, 0x8b]) {
        return; // a "plain" file with the gzip magic is read as gzip
    }
    std::fs::write(&plain, text).expect("write");
    let whole = read(&plain, &cfg);

    // Valid gzip of the same text: one member, or two cut at a byte the input picks.
    let members = if mode >> 6 == 0 || text.is_empty() {
        gzip(&[text])
    } else {
        let cut = text[0] as usize % text.len();
        gzip(&[&text[..cut], &text[cut..]])
    };
    std::fs::write(&gz, &members).expect("write");
    let zipped = read(&gz, &cfg);
    match (&whole, &zipped) {
        (Ok((a, sa)), Ok((b, sb))) => {
            assert!(same_rows(a, b), "plain and gzip rows differ");
            assert_eq!(
                (sa.rows, sa.lines, sa.bad_lines),
                (sb.rows, sb.lines, sb.bad_lines)
            );
            if a.rows > 0 {
                a.check_tags(&layout.tags()).expect("plain rows");
            }
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!(
            "plain and gzip disagree: {:?} vs {:?}",
            a.as_ref().map(|r| r.0.rows),
            b.as_ref().map(|r| r.0.rows)
        ),
    }

    // The plain file in parts: joined, the rows of the whole.
    if let Ok((w, _)) = &whole {
        let count = 2 + (mode >> 7) as usize;
        let mut batches = Vec::new();
        for index in 0..count {
            let mut c = cfg.clone();
            c.part = Some((index, count));
            let (b, _) = read(&plain, &c).expect("a part reads when the whole does");
            if b.rows > 0 {
                batches.push(b);
            }
        }
        assert!(
            same_rows(w, &Batch::concat(&batches)),
            "parts differ from the whole"
        );
    }
});
