//! Everyday data from real clients on the real binary: a UTF-8 BOM, a burst of bad lines at
//! the top of a big file, a text file named `.parquet`, a huge line, Parquet written by pandas
//! or Polars (dictionary columns, NaN), and a followed directory whose files are deleted,
//! renamed or linked from elsewhere.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, Float64Array, Int64Array, RecordBatch};
use common::{gen, json, ok, s, sparta, stderr, train_follow};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);

/// `sparta train` on `data` (plus `extra`); the output and the summary (if it succeeded).
fn train(data: &Path, extra: &[&str]) -> (std::process::Output, Option<serde_json::Value>) {
    let dir = data.parent().unwrap();
    let summary = dir.join(format!(
        "{}.json",
        data.file_name().unwrap().to_string_lossy()
    ));
    let mut args = vec![
        "train",
        "--train",
        s(data),
        "--batch-size",
        "256",
        "--threads",
        "1",
        "--reader-threads",
        "2",
        "--quiet",
        "--summary-json",
        s(&summary),
    ];
    args.extend_from_slice(extra);
    let o = sparta(&args);
    let sum = o.status.success().then(|| json(&summary));
    (o, sum)
}

#[test]
fn a_utf8_bom_at_the_top_of_a_file_is_not_a_bad_row() {
    let dir = tempfile::tempdir().unwrap();
    let plain = gen(dir.path(), "plain.tsv", 500, 1);
    let bom = dir.path().join("bom.tsv");
    let text = std::fs::read(&plain).unwrap();
    std::fs::write(&bom, [&b"\xEF\xBB\xBF"[..], &text].concat()).unwrap();
    let (o, sum) = train(&bom, &[]);
    ok(&o, "train on a file with a BOM");
    let sum = sum.unwrap();
    assert_eq!(sum["bad_lines"], 0, "{sum}");
    assert_eq!(sum["train_rows"], 500, "{sum}");
    // The same model as without the BOM.
    let (o, want) = train(&plain, &[]);
    ok(&o, "train on the same file without the BOM");
    assert_eq!(sum["train_loss"], want.unwrap()["train_loss"]);
}

/// `good` lines of `src` with `bad` malformed lines: `bad_at_top` all first, else every
/// other line bad until they are used up.
fn with_bad_lines(src: &Path, out: &Path, bad: usize, bad_at_top: bool) {
    let text = std::fs::read_to_string(src).unwrap();
    let mut lines = Vec::new();
    let mut left = bad;
    if bad_at_top {
        lines.extend(std::iter::repeat_n("garbage\tline", bad));
        left = 0;
    }
    for l in text.lines() {
        if left > 0 {
            lines.push("garbage\tline");
            left -= 1;
        }
        lines.push(l);
    }
    std::fs::write(out, lines.join("\n") + "\n").unwrap();
}

#[test]
fn a_burst_of_bad_lines_at_the_top_does_not_stop_a_job_under_the_ratio_but_bad_throughout_does() {
    let dir = tempfile::tempdir().unwrap();
    let good = gen(dir.path(), "good.tsv", 40_000, 2);
    // 300 bad lines first, then 40,000 good ones: 0.74% overall, under the default 1%.
    let burst = dir.path().join("burst.tsv");
    with_bad_lines(&good, &burst, 300, true);
    let (o, sum) = train(&burst, &[]);
    ok(&o, "train with 300 bad lines at the top");
    let sum = sum.unwrap();
    assert_eq!(sum["bad_lines"], 300, "{sum}");
    assert_eq!(sum["train_rows"], 40_000, "{sum}");

    // Every other line bad: stops mid-stream, long before the end of the 80,000 lines.
    let rotten = dir.path().join("rotten.tsv");
    with_bad_lines(&good, &rotten, 40_000, false);
    let (o, _) = train(&rotten, &[]);
    assert!(!o.status.success(), "a file bad throughout must stop");
    let e = stderr(&o);
    assert!(e.contains("too many bad lines"), "{e}");
    let seen: u64 = e
        .split("too many bad lines: ")
        .nth(1)
        .and_then(|t| t.split(" lines").next())
        .and_then(|t| t.split(" of ").nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no line count in {e}"));
    // Lines are counted by chunks of text: it stops within the first chunks, not at the end.
    assert!(seen < 40_000, "stopped early: after {seen} of 80,000 lines");
}

#[test]
fn a_text_file_named_parquet_is_said_not_to_be_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = gen(dir.path(), "day.tsv", 100, 3);
    let named = dir.path().join("day.parquet");
    std::fs::rename(&tsv, &named).unwrap();
    let (o, _) = train(&named, &[]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("day.parquet"), "{e}");
    assert!(
        e.contains("not a Parquet file: it lacks the PAR1 magic and looks like text"),
        "{e}"
    );
    assert!(!e.contains("Corrupt footer"), "{e}");
}

#[test]
fn a_huge_line_is_reported_with_its_real_size() {
    let dir = tempfile::tempdir().unwrap();
    let src = gen(dir.path(), "src.tsv", 500, 4);
    let text = std::fs::read_to_string(&src).unwrap();
    let (head, tail) = text.split_at(text.len() / 2);
    let cut = head.rfind('\n').unwrap() + 1;
    let huge = 12 << 20;
    let data = dir.path().join("huge.tsv");
    let body = format!(
        "{}{}\n{}{}",
        &head[..cut],
        "x".repeat(huge),
        &head[cut..],
        tail
    );
    std::fs::write(&data, body).unwrap();
    let (o, sum) = train(&data, &[]);
    ok(&o, "train with one huge line");
    let sum = sum.unwrap();
    assert_eq!(sum["bad_lines"], 1, "{sum}");
    let e = stderr(&o);
    assert!(e.contains(&format!("line of {huge} bytes exceeds")), "{e}");
}

/// The columns of a generated Criteo-layout TSV (label, I1..I13, C1..C26) as Parquet, as
/// pandas and Polars write them: `categorical` writes the C columns as dictionaries (C26 as
/// a list of dictionary values) with nulls for missing values; otherwise as plain strings,
/// with the missing I values as NaN (not null).
fn criteo_parquet(tsv: &Path, out: &Path, categorical: bool) {
    use arrow_array::StringArray;
    let text = std::fs::read_to_string(tsv).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    let col = |c: usize| rows.iter().map(move |r| r[c]);
    let mut fields: Vec<(String, ArrayRef)> = Vec::new();
    let labels: Int64Array = col(0).map(|v| v.parse::<i64>().unwrap()).collect();
    fields.push(("label".into(), Arc::new(labels)));
    for i in 1..=13 {
        let a: Float64Array = col(i)
            .map(|v| match (v.is_empty(), categorical) {
                (true, true) => None,
                (true, false) => Some(f64::NAN),
                _ => Some(v.parse::<f64>().unwrap()),
            })
            .collect();
        fields.push((format!("I{i}"), Arc::new(a)));
    }
    for c in 1..=26 {
        let values = col(13 + c).map(|v| (!v.is_empty()).then_some(v));
        let a: ArrayRef = if !categorical {
            Arc::new(values.collect::<StringArray>())
        } else if c < 26 {
            Arc::new(values.collect::<DictionaryArray<Int32Type>>())
        } else {
            let mut b = ListBuilder::new(StringDictionaryBuilder::<Int32Type>::new());
            for v in values {
                match v {
                    Some(v) => {
                        b.values().append_value(v);
                        b.append(true);
                    }
                    None => b.append(false),
                }
            }
            Arc::new(b.finish())
        };
        fields.push((format!("C{c}"), a));
    }
    let batch = RecordBatch::try_from_iter(fields).unwrap();
    let file = std::fs::File::create(out).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn parquet_dictionary_columns_and_nan_train_like_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = gen(dir.path(), "train.tsv", 3000, 5);
    let (o, want) = train(&tsv, &[]);
    ok(&o, "train on the text");
    let want = want.unwrap();
    for (name, categorical) in [("categorical.parquet", true), ("nan.parquet", false)] {
        let pq = dir.path().join(name);
        criteo_parquet(&tsv, &pq, categorical);
        let (o, got) = train(&pq, &[]);
        ok(&o, name);
        let got = got.unwrap();
        for key in ["train_rows", "bad_lines", "train_loss"] {
            assert_eq!(got[key], want[key], "{key} of {name}: {got}");
        }
        assert_eq!(got["train_rows"], 3000);
    }
}

/// Runs a follow job (with the stop file `stop`) to its end: the summary and the log.
fn follow_to_end(input: &Path, stop: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let json_path = stop.with_extension("json");
    let extra = [
        extra,
        &["--stop-file", s(stop), "--summary-json", s(&json_path)],
    ]
    .concat();
    let (okay, log) = train_follow(input, &extra).wait(LIMIT);
    assert!(okay, "{log}");
    (json(&json_path), log)
}

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let stop = dir.path().join("STOP");
    (dir, input, stop)
}

#[test]
fn follow_resumed_after_its_file_was_deleted_mid_way_warns_and_counts_it_bad() {
    let (dir, input, stop) = dirs();
    let ckpt = dir.path().join("ckpt");
    let a = gen(&input, "a.tsv", 30_000, 1);
    let json1 = dir.path().join("first.json");
    let first = train_follow(
        &input,
        &[
            "--checkpoint-dir",
            s(&ckpt),
            "--checkpoint-every-steps",
            "2",
            "--summary-json",
            s(&json1),
        ],
    );
    // Stopped (and checkpointed) while it trains on a.tsv.
    common::wait_for("a first checkpoint", LIMIT, || {
        (!common::committed(&ckpt).is_empty()).then_some(())
    });
    common::signal(first.pid(), "-TERM");
    let (okay, log) = first.wait(LIMIT);
    assert!(okay, "{log}");
    let s1 = json(&json1);
    let size = std::fs::metadata(&a).unwrap().len();
    assert_eq!(s1["input_position"]["file"], "a.tsv", "{s1}");
    let at = s1["input_position"]["byte_offset"].as_u64().unwrap();
    assert!(at < size, "stopped inside a.tsv: at byte {at} of {size}");
    // While the job is down, a.tsv is deleted (retention) and b.tsv arrives.
    std::fs::remove_file(&a).unwrap();
    gen(&input, "b.tsv", 500, 2);
    std::fs::write(&stop, b"").unwrap();
    let (s2, log) = follow_to_end(&input, &stop, &["--resume", s(&ckpt)]);
    assert_eq!(s2["train_rows"], 500, "{s2}");
    assert_eq!(
        s2["bad_files"], 1,
        "the lost rest of a.tsv is counted: {s2}"
    );
    assert!(
        log.contains(&format!("byte {at} of a.tsv, which is no longer in"))
            && log.contains(&format!("{} of its {size} bytes", size - at)),
        "{log}"
    );
}

#[test]
fn follow_resumed_after_a_file_it_read_was_renamed_does_not_train_it_again() {
    let (dir, input, stop) = dirs();
    let ckpt = dir.path().join("ckpt");
    gen(&input, "a.tsv", 600, 1);
    gen(&input, "b.tsv", 400, 2);
    std::fs::write(&stop, b"").unwrap();
    let (s1, _) = follow_to_end(&input, &stop, &["--checkpoint-dir", s(&ckpt)]);
    assert_eq!(s1["train_rows"], 1000, "{s1}");
    // While the job is down, the shipper renames a.tsv to a name that sorts later.
    std::fs::rename(input.join("a.tsv"), input.join("c.tsv")).unwrap();
    gen(&input, "d.tsv", 300, 3);
    let (s2, log) = follow_to_end(&input, &stop, &["--resume", s(&ckpt)]);
    assert_eq!(s2["train_rows"], 300, "only d.tsv is new: {s2}");
    assert_eq!(s2["late_files_skipped"], 1, "{s2}");
    assert!(
        log.contains("c.tsv is a.tsv") && log.contains("already read, under a new name"),
        "{log}"
    );
}

#[test]
fn follow_skips_a_file_already_read_under_a_new_later_name() {
    let (_dir, input, stop) = dirs();
    gen(&input, "a.tsv", 1000, 1);
    let json_path = stop.with_extension("json");
    let mut p = train_follow(
        &input,
        &["--stop-file", s(&stop), "--summary-json", s(&json_path)],
    );
    p.wait_line(LIMIT, |l| l.contains("follow: reading a.tsv").then_some(()));
    // Read (opened); the shipper now renames it to a name that sorts later.
    std::fs::rename(input.join("a.tsv"), input.join("z-a.tsv.done")).unwrap();
    std::fs::write(&stop, b"").unwrap();
    let (okay, log) = p.wait(LIMIT);
    assert!(okay, "{log}");
    let sum = json(&json_path);
    assert_eq!(sum["train_rows"], 1000, "trained once: {sum}");
    assert_eq!(sum["late_files_skipped"], 1, "{sum}");
    assert!(
        log.contains("z-a.tsv.done is a.tsv") && log.contains("already read, under a new name"),
        "{log}"
    );
}

#[test]
fn follow_skips_a_symlink_to_a_file_outside_the_directory() {
    let (dir, input, stop) = dirs();
    gen(&input, "a.tsv", 500, 1);
    let outside = gen(dir.path(), "secret.tsv", 700, 2);
    std::os::unix::fs::symlink(&outside, input.join("b.tsv")).unwrap();
    std::fs::write(&stop, b"").unwrap();
    let (sum, log) = follow_to_end(&input, &stop, &[]);
    assert_eq!(sum["train_rows"], 500, "{sum}");
    assert!(
        log.contains("b.tsv is a link to") && log.contains("outside the followed directory"),
        "{log}"
    );
}
