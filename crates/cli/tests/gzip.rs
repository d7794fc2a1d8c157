//! Gzip input on the real binary reads exactly like the same text in a plain file: rows, bad
//! lines and input positions (a resume from every checkpoint of a gzip input continues at the
//! same row as from the plain file's), for plain, CRLF and multi-member gzip.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::{ok, s, sparta};
use serde_json::Value;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// Generated rows with a malformed line every 1000th; `crlf`: `\r\n` line ends.
fn text(dir: &Path, rows: u64, crlf: bool) -> Vec<u8> {
    let p = common::gen(dir, "gen.tsv", rows, 7);
    let plain = std::fs::read(&p).unwrap();
    let mut out = Vec::with_capacity(plain.len() + plain.len() / 20);
    for (i, line) in plain.split_inclusive(|&b| b == b'\n').enumerate() {
        if i % 1000 == 999 {
            out.extend_from_slice(b"not\ta\tcriteo\tline");
            out.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        }
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        out.extend_from_slice(body);
        out.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
    }
    out
}

/// Four gzip members cut at arbitrary bytes (`cat a.gz b.gz ...` of the pieces).
fn multi_member(data: &[u8]) -> Vec<u8> {
    let q = data.len() / 4 + 12_345;
    let mut out = Vec::new();
    for piece in data.chunks(q) {
        out.extend(gzip(piece));
    }
    out
}

struct Run {
    summary: Value,
}

fn train(input: &Path, dir: &Path, tag: &str, resume: Option<&Path>, ckpt: &Path) -> Run {
    let summary = dir.join(format!("{tag}.json"));
    let config = dir.join("job.toml");
    std::fs::write(
        &config,
        // A small MLP: what is compared (rows, bad lines, table rows, positions) does not
        // depend on its width, and these 36 runs dominated the binary's time.
        "[model]\nhidden = [32]\n[train]\ncheckpoint_full_every = 1\ncheckpoint_keep_full = 1000\n",
    )
    .unwrap();
    let mut args = vec![
        "train",
        "--config",
        s(&config),
        "--model",
        "wdl",
        "--train",
        s(input),
        "--batch-size",
        "1000",
        "--threads",
        "1",
        "--reader-threads",
        "2",
        "--quiet",
        "--checkpoint-dir",
        s(ckpt),
        "--checkpoint-every-steps",
        "6",
        "--summary-json",
        s(&summary),
    ];
    if let Some(r) = resume {
        args.extend(["--resume", s(r)]);
    }
    ok(&sparta(&args), &format!("{tag}: train"));
    Run {
        summary: common::json(&summary),
    }
}

fn checkpoints(ckpt: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ckpt-")
        })
        .collect();
    v.sort();
    v
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Resumes `input` from checkpoint `ckpt_dir` alone; returns the resumed summary.
fn resume_from(input: &Path, dir: &Path, tag: &str, ckpt_dir: &Path) -> Value {
    let only = dir.join(format!("only-{tag}"));
    copy_dir(ckpt_dir, &only.join(ckpt_dir.file_name().unwrap()));
    let after = dir.join(format!("after-{tag}"));
    train(input, dir, &format!("resumed-{tag}"), Some(&only), &after).summary
}

#[test]
fn gzip_input_trains_and_resumes_exactly_like_plain() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for crlf in [false, true] {
        let data = text(d, 30_000, crlf);
        assert!(
            data.len() > 3 << 20,
            "the text must span several 1 MiB chunks"
        );
        let plain = d.join("train.tsv");
        std::fs::write(&plain, &data).unwrap();
        let one = d.join("train.tsv.gz");
        std::fs::write(&one, gzip(&data)).unwrap();
        let multi = d.join("multi.gz");
        std::fs::write(&multi, multi_member(&data)).unwrap();

        let p_ckpt = d.join(format!("ckpt-plain-{crlf}"));
        let want = train(&plain, d, "plain", None, &p_ckpt).summary;
        assert_eq!(want["train_rows"], 30_000, "{want}");
        assert_eq!(want["bad_lines"], 30, "{want}");
        let p_ckpts = checkpoints(&p_ckpt);
        assert!(p_ckpts.len() >= 5, "{p_ckpts:?}");
        let p_resumed: Vec<Value> = p_ckpts
            .iter()
            .enumerate()
            .map(|(k, c)| resume_from(&plain, d, &format!("plain-{crlf}-{k}"), c))
            .collect();

        for (name, input) in [("gz", &one), ("multi", &multi)] {
            let ckpt = d.join(format!("ckpt-{name}-{crlf}"));
            let got = train(input, d, name, None, &ckpt).summary;
            for key in ["train_rows", "bad_lines", "table_rows"] {
                assert_eq!(got[key], want[key], "{name} crlf={crlf}: {key}");
            }
            let ckpts = checkpoints(&ckpt);
            assert_eq!(ckpts.len(), p_ckpts.len(), "{name} crlf={crlf}");
            // A resume from every checkpoint continues exactly where the plain file's does.
            for (k, (c, rp)) in ckpts.iter().zip(&p_resumed).enumerate() {
                let tag = format!("{name}-{crlf}-{k}");
                let r = resume_from(input, d, &tag, c);
                assert_eq!(r["samples_trained"], 30_000, "{tag}: {r}");
                for key in ["train_rows", "bad_lines", "table_rows", "samples_trained"] {
                    assert_eq!(r[key], rp[key], "{tag}: {key}");
                }
            }
        }
    }
}
