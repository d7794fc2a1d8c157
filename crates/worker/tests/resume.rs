//! Checkpoint + resume of an embedded job: an interrupted run resumed from its checkpoints ends
//! bit-identical to an uninterrupted one.

mod common;

use std::path::{Path, PathBuf};

use sparta_checkpoint::ResumePolicy;
use sparta_worker::{JobConfig, RunOptions, Summary, Trainer};

fn job(extra: &str) -> sparta_worker::Job {
    job_read_by(1, extra)
}

/// The job with `readers` parser threads (batches do not depend on it).
fn job_read_by(readers: usize, extra: &str) -> sparta_worker::Job {
    job_of("wdl", readers, extra)
}

/// The job of model `kind` with `readers` parser threads and `extra` `[train]` keys; the
/// sequential loop unless `extra` sets `pipeline` (a resume equals an uninterrupted run bit
/// for bit only there: a pipelined run drains at checkpoint steps only).
fn job_of(kind: &str, readers: usize, extra: &str) -> sparta_worker::Job {
    let exact = if extra.contains("pipeline") {
        ""
    } else {
        "pipeline = false\n"
    };
    JobConfig::from_toml(&format!(
        "[data]\nbatch_size = 256\nreader_threads = {readers}\n[train]\nthreads = 1\nseed = 3\n{exact}{extra}\n[model]\nkind = {kind:?}\n"
    ))
    .unwrap()
    .validate()
    .unwrap()
}

fn run(mut t: Trainer, train: &Path, test: &Path) -> Summary {
    t.run(&RunOptions {
        train: vec![train.to_path_buf()],
        test: vec![test.to_path_buf()],
        progress: false,
        follow: None,
        ..RunOptions::default()
    })
    .unwrap()
}

#[test]
fn interrupted_and_resumed_equals_uninterrupted() {
    interrupted_and_resumed("wdl");
}

#[test]
fn interrupted_and_resumed_dcnv2_and_dlrm_equal_uninterrupted() {
    interrupted_and_resumed("dcnv2");
    interrupted_and_resumed("dlrm");
}

/// A job of model `kind` "killed" after 20 steps and resumed ends exactly as one run through.
fn interrupted_and_resumed(kind: &str) {
    let sample_dir = tempfile::tempdir().unwrap();
    let src = common::sample(sample_dir.path());
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(src).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    std::fs::write(&train, lines[..10_000].join("\n") + "\n").unwrap();
    std::fs::write(&test, lines[10_000..].join("\n") + "\n").unwrap();

    let whole = run(
        Trainer::embedded(job_of(kind, 1, "")).unwrap(),
        &train,
        &test,
    );

    let ckpt = dir.path().join("ckpt");
    let ck = format!(
        "checkpoint_dir = {:?}\ncheckpoint_every_steps = 7\ncheckpoint_full_every = 2\n",
        ckpt.to_str().unwrap()
    );
    // "Killed" after 20 steps: checkpoints at steps 7 (full), 14 (incremental), 20 (final, full).
    // Three reader threads: the batches and the saved positions do not depend on them.
    let first = run(
        Trainer::embedded(job_of(kind, 3, &format!("max_rows = {}\n{ck}", 20 * 256))).unwrap(),
        &train,
        &test,
    );
    assert_eq!(first.train_rows, 20 * 256);
    assert!(first.last_checkpoint.is_some());
    // The checkpoint holds where the next line starts, not only a row count.
    let line_end: u64 = lines[..20 * 256].iter().map(|l| l.len() as u64 + 1).sum();
    let pos = first.input_position.clone().expect("the end position");
    assert_eq!((pos.byte_offset, pos.rows_consumed), (line_end, 20 * 256));
    let resumed = run(
        Trainer::embedded_resume(job_of(kind, 2, &ck), &ckpt, ResumePolicy::Required).unwrap(),
        &train,
        &test,
    );
    assert!(resumed.resumed_from.is_some());
    assert_eq!(resumed.train_rows, 10_000 - 20 * 256);
    assert_eq!(resumed.samples_trained, 10_000);
    assert_eq!(
        resumed.test_auc, whole.test_auc,
        "{kind}: resumed run must equal the uninterrupted one"
    );
    assert_eq!(resumed.test_logloss, whole.test_logloss);
    assert_eq!(resumed.table_rows, whole.table_rows);
}

#[test]
fn resume_without_a_checkpoint_starts_fresh_only_if_asked() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none");
    let t = Trainer::embedded_resume(job(""), &missing, ResumePolicy::IfPresent).unwrap();
    assert!(t.model().num_params() > 0);
    // `--resume` alone: a missing or empty directory is an error naming it.
    for d in [missing.as_path(), dir.path()] {
        let e = Trainer::embedded_resume(job(""), d, ResumePolicy::Required)
            .err()
            .expect("no checkpoint to resume from");
        let msg = e.to_string();
        assert!(msg.contains(&d.display().to_string()), "{msg}");
        assert!(msg.contains("--resume-if-present"), "{msg}");
    }
}

#[test]
fn pipelined_checkpoints_drain_the_pipeline_and_resume_exactly() {
    let sample_dir = tempfile::tempdir().unwrap();
    let src = common::sample(sample_dir.path());
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(src).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    std::fs::write(&train, lines[..10_000].join("\n") + "\n").unwrap();
    std::fs::write(&test, lines[10_000..].join("\n") + "\n").unwrap();
    let ck = |d: &Path| {
        format!(
            "pipeline = true\npipeline_staleness = 0\ncheckpoint_dir = {:?}\n\
             checkpoint_every_steps = 7\ncheckpoint_full_every = 2\n",
            d.to_str().unwrap()
        )
    };
    let whole = run(
        Trainer::embedded(job(&ck(&dir.path().join("a")))).unwrap(),
        &train,
        &test,
    );
    assert!(whole.pipeline);
    let ckpt = dir.path().join("b");
    let first = run(
        Trainer::embedded(job(&format!("max_rows = {}\n{}", 20 * 256, ck(&ckpt)))).unwrap(),
        &train,
        &test,
    );
    assert_eq!(first.train_rows, 20 * 256);
    // Drop the final checkpoint (written after the pipeline stopped): the resume starts from
    // step 14's, written while the pipeline ran.
    let mut ids: Vec<PathBuf> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    ids.sort();
    std::fs::remove_dir_all(ids.last().unwrap()).unwrap();
    let resumed = run(
        Trainer::embedded_resume(job(&ck(&ckpt)), &ckpt, ResumePolicy::Required).unwrap(),
        &train,
        &test,
    );
    assert_eq!(resumed.train_rows, 10_000 - 14 * 256);
    assert_eq!(resumed.samples_trained, 10_000);
    // Checkpoints are taken with no push in flight and nothing of later batches pulled, so the
    // resumed pipelined run trains exactly what the uninterrupted one does.
    assert_eq!(resumed.test_auc, whole.test_auc);
    assert_eq!(resumed.test_logloss, whole.test_logloss);
}
