//! Hostile input on the real binary: a `--train` file truncated while it is read ends the
//! run with an error naming the file (not a SIGBUS), and a FIFO trains like the same file.

mod common;

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::{cmd, committed, gen, json, ok, s, sparta, wait_for, Proc};

#[test]
fn a_train_file_truncated_while_read_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = gen(dir.path(), "shrinks.tsv", 5000, 3);
    let ckpt = dir.path().join("ckpt");
    // Many epochs: still reading the file long after the first checkpoint.
    let p = Proc::start(cmd(&[
        "train",
        "--train",
        s(&data),
        "--epochs",
        "100000",
        "--batch-size",
        "256",
        "--reader-threads",
        "1",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every-steps",
        "5",
        "--quiet",
    ]));
    wait_for("a first checkpoint", Duration::from_secs(120), || {
        (!committed(&ckpt).is_empty()).then_some(())
    });
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(0)
        .unwrap();
    // A SIGBUS would end it without a word: the message is the proof it was an error.
    let (okay, log) = p.wait(Duration::from_secs(120));
    assert!(!okay, "a truncated input must fail the run:\n{log}");
    assert!(log.contains("shrinks.tsv"), "names the file:\n{log}");
    assert!(log.contains("changed while read"), "{log}");
}

#[test]
fn a_fifo_trains_like_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = gen(dir.path(), "t.tsv", 3000, 5);
    let fifo = dir.path().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let text = std::fs::read(&data).unwrap();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut w = std::fs::OpenOptions::new().write(true).open(fifo).unwrap();
            w.write_all(&text).unwrap();
        })
    };
    let summary = dir.path().join("sum.json");
    let o = sparta(&[
        "train",
        "--train",
        s(&fifo),
        "--batch-size",
        "256",
        "--quiet",
        "--summary-json",
        s(&summary),
    ]);
    assert!(o.status.signal().is_none(), "killed by a signal");
    ok(&o, "train on a FIFO");
    writer.join().unwrap();
    let sum = json(&summary);
    assert_eq!(sum["train_rows"], 3000, "{sum}");
    assert_eq!(sum["bad_lines"], 0, "{sum}");
}

#[test]
fn zero_values_that_mean_nothing_are_refused_with_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::gen(dir.path(), "t.tsv", 50, 1);
    let config = dir.path().join("job.toml");
    std::fs::write(&config, "[model]\nkind = \"wdl\"\nhidden = []\n").unwrap();
    let train = common::s(&data);
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec!["train", "--train", train, "--checkpoint-every-steps", "0"],
            "--checkpoint-every-steps 0",
        ),
        (
            vec!["train", "--train", train, "--config", common::s(&config)],
            "model.hidden = []",
        ),
        (
            vec!["serve", "--model", train, "--max-rows", "0"],
            "--max-rows 0",
        ),
        (
            vec!["serve", "--model", train, "--max-body-bytes", "0"],
            "--max-body-bytes 0",
        ),
    ];
    for (args, why) in cases {
        let o = common::sparta(&args);
        let err = common::stderr(&o);
        assert!(!o.status.success(), "{args:?} accepted");
        assert!(err.contains(why), "{args:?}: {err}");
    }
}
