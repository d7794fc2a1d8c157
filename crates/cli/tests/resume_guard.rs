//! What a job may ask for, checked on the real binary before it trains: a resume with another
//! model or optimizer than the checkpoint's is refused naming each difference (what may
//! change, learning rates and batch size, is accepted); config bounds (eviction after zero
//! idle steps, a dense model beyond memory) name the field; an embedding learning rate that
//! explodes the rows stops training naming the table; `sparta config show` prints an
//! invalid config as the user's error and floats in their shortest form.

mod common;

use std::path::Path;

use common::{committed, gen, s, sparta, stderr};

/// `sparta train` on `train`, one thread, small batches, with `extra` flags.
fn train(train: &Path, test: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "train",
        "--train",
        s(train),
        "--test",
        s(test),
        "--threads",
        "1",
        "--batch-size",
        "128",
        "--seed",
        "7",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    sparta(&args)
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_resume_with_another_model_or_optimizer_is_refused_naming_each_difference() {
    let dir = tempfile::tempdir().unwrap();
    let tr = gen(dir.path(), "train.tsv", 1500, 1);
    let te = gen(dir.path(), "test.tsv", 300, 2);
    let ckpt = dir.path().join("ckpt");
    let o = train(&tr, &te, &["--model", "wdl", "--checkpoint-dir", s(&ckpt)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let written = committed(&ckpt);
    // Another model: wdl's dense weights are not DeepFM's.
    let o = train(&tr, &te, &["--model", "deepfm", "--resume", s(&ckpt)]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("model.kind: the checkpoint has \"wdl\", the job says \"deepfm\""),
        "{e}"
    );
    // Another embedding optimizer (its state per row differs) and dense optimizer: each is
    // named, in one error.
    let adam = write(
        dir.path(),
        "adam.toml",
        "[embedding.optimizer]\ntype = \"adam\"\nlr = 0.001\nbeta1 = 0.9\nbeta2 = 0.999\n\
         eps = 1e-8\n\n[model.optimizer]\ntype = \"sgd\"\nlr = 0.01\n",
    );
    let o = train(
        &tr,
        &te,
        &["--model", "wdl", "--config", s(&adam), "--resume", s(&ckpt)],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("embedding.optimizer: the checkpoint has adagrad, the job says adam"),
        "{e}"
    );
    assert!(
        e.contains("model.optimizer: the checkpoint has adam, the job says sgd"),
        "{e}"
    );
    assert!(!e.contains("model.kind"), "{e}");
    // Refused before anything was written.
    assert_eq!(committed(&ckpt), written);
    // What may change: learning rates, batch size, threads.
    let lr = write(
        dir.path(),
        "lr.toml",
        "[embedding.optimizer]\ntype = \"adagrad\"\nlr = 0.01\ninitial_accumulator = 0.1\n\
         eps = 1e-8\n\n[model.optimizer]\ntype = \"adam\"\nlr = 0.0005\nbeta1 = 0.9\n\
         beta2 = 0.999\neps = 1e-8\n",
    );
    let o = sparta(&[
        "train",
        "--train",
        s(&tr),
        "--test",
        s(&te),
        "--model",
        "wdl",
        "--config",
        s(&lr),
        "--resume",
        s(&ckpt),
        "--threads",
        "2",
        "--batch-size",
        "64",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn an_embedding_lr_that_explodes_the_rows_stops_training_naming_the_table_and_lr() {
    let dir = tempfile::tempdir().unwrap();
    let tr = gen(dir.path(), "train.tsv", 1500, 1);
    let te = gen(dir.path(), "test.tsv", 300, 2);
    let big = write(
        dir.path(),
        "big.toml",
        "[embedding.optimizer]\ntype = \"adagrad\"\nlr = 1e30\ninitial_accumulator = 0.1\n\
         eps = 1e-8\n",
    );
    let o = train(&tr, &te, &["--model", "wdl", "--config", s(&big)]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains("training diverged"), "{e}");
    assert!(e.contains("(stored in \"embedding\") diverged"), "{e}");
    assert!(e.contains("lr: 1e30"), "{e}");
    // The wide table's lr alike.
    let wide = write(
        dir.path(),
        "wide.toml",
        "[wide.optimizer]\ntype = \"sgd\"\nlr = 1e30\n",
    );
    let o = train(&tr, &te, &["--model", "wdl", "--config", s(&wide)]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(
        e.contains("the rows of table \"wide\" diverged") && e.contains("Sgd { lr: 1e30 }"),
        "{e}"
    );
}

#[test]
fn config_bounds_name_the_field_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let tr = gen(dir.path(), "train.tsv", 500, 1);
    let te = gen(dir.path(), "test.tsv", 100, 2);
    let evict = write(
        dir.path(),
        "evict.toml",
        "[embedding]\neviction = { max_idle_steps = 0 }\n",
    );
    let o = train(&tr, &te, &["--config", s(&evict)]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("embedding.eviction.max_idle_steps = 0"), "{e}");
    // Far beyond any machine's memory: refused from the config, nothing allocated.
    let huge = write(
        dir.path(),
        "huge.toml",
        "[model]\nhidden = [1000000, 1000000]\n",
    );
    let o = train(&tr, &te, &["--config", s(&huge)]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("model.hidden = [1000000, 1000000]"), "{e}");
    assert!(e.contains("GB of memory is available"), "{e}");
}

#[test]
fn config_show_prints_shortest_floats_and_names_the_users_invalid_field() {
    let o = sparta(&["config", "show"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("\nlr = 0.001\n"), "{text}");
    assert!(text.contains("\nbeta2 = 0.999\n"), "{text}");
    assert!(text.contains("\nlr = 0.05\n"), "{text}");
    assert!(!text.contains("0.0010000000474974513"), "{text}");
    // An explicit config (its tables and features written out) with an invalid field: the
    // user's error, naming the field; not "a bug".
    let dir = tempfile::tempdir().unwrap();
    let bad = text.replace("batch_size = 4096", "batch_size = 0");
    assert_ne!(bad, text);
    let p = write(dir.path(), "bad.toml", &bad);
    let o = sparta(&["config", "show", "--config", s(&p)]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("data.batch_size = 0"), "{e}");
    assert!(e.contains("invalid job config"), "{e}");
    assert!(!e.contains("a bug"), "{e}");
    // The printed text means the same job: shown again, it is the same text.
    let p = write(dir.path(), "shown.toml", &text);
    let o = sparta(&["config", "show", "--config", s(&p)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap(), text);
}

#[test]
fn a_cluster_resume_with_another_model_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let tr = gen(dir.path(), "train.tsv", 1000, 1);
    let ckpt = dir.path().join("ckpt");
    let launch = |model: &str, ckpt_flag: &str| {
        sparta(&[
            "launch",
            "--ps",
            "1",
            "--workers",
            "1",
            "--mode",
            "sync",
            "--model",
            model,
            "--batch-size",
            "128",
            "--threads",
            "1",
            "--train",
            s(&tr),
            ckpt_flag,
            s(&ckpt),
            "--max-restarts",
            "0",
            "--quiet",
        ])
    };
    let o = launch("wdl", "--checkpoint-dir");
    assert!(o.status.success(), "{}", stderr(&o));
    let written = committed(&ckpt);
    let o = launch("deepfm", "--resume");
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("model.kind: the checkpoint has \"wdl\", the job says \"deepfm\""),
        "{e}"
    );
    assert_eq!(committed(&ckpt), written);
}

#[test]
fn a_resume_with_a_new_embedding_learning_rate_trains_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let tr = gen(dir.path(), "train.tsv", 1500, 1);
    let te = gen(dir.path(), "test.tsv", 300, 2);
    let ckpt = dir.path().join("ckpt");
    let o = train(
        &tr,
        &te,
        &["--model", "wdl", "--exact", "--checkpoint-dir", s(&ckpt)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(&ckpt).unwrap() {
        let e = e.unwrap();
        std::fs::create_dir(copy.join(e.file_name())).unwrap();
        for f in std::fs::read_dir(e.path()).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), copy.join(e.file_name()).join(f.file_name())).unwrap();
        }
    }
    let resume = |from: &Path, config: Option<&Path>, out: &Path| {
        let mut extra = vec!["--model", "wdl", "--exact", "--epochs", "2"];
        extra.extend(["--resume", s(from), "--summary-json", s(out)]);
        if let Some(c) = config {
            extra.extend(["--config", s(c)]);
        }
        let o = train(&tr, &te, &extra);
        assert!(o.status.success(), "{}", stderr(&o));
        common::json(out)
    };
    let same = resume(&ckpt, None, &dir.path().join("same.json"));
    let lr = write(
        dir.path(),
        "lr.toml",
        "[embedding.optimizer]\ntype = \"adagrad\"\nlr = 0.5\ninitial_accumulator = 0.1\n\
         eps = 1e-8\n",
    );
    let faster = resume(&copy, Some(&lr), &dir.path().join("faster.json"));
    assert_eq!(same["samples_trained"], faster["samples_trained"]);
    assert_ne!(
        same["test_logloss"], faster["test_logloss"],
        "the new learning rate was ignored: {same} vs {faster}"
    );
}
