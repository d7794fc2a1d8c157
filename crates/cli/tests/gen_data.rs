//! `sparta gen-data` on the real binary: the criteo profile unchanged, the rich profile
//! deterministic with its oracle.

mod common;

use common::*;

fn gen_args(dir: &std::path::Path, name: &str, extra: &[&str]) -> (std::path::PathBuf, Vec<u8>) {
    let p = dir.join(name);
    let mut args = vec!["gen-data", "--rows", "3000", "--out", s(&p)];
    args.extend_from_slice(extra);
    let o = sparta(&args);
    ok(&o, "gen-data");
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

#[test]
fn the_criteo_profile_is_the_library_generator() {
    let dir = tempfile::tempdir().unwrap();
    let (_, default) = gen_args(dir.path(), "a.tsv", &["--seed", "3"]);
    let (_, named) = gen_args(dir.path(), "b.tsv", &["--seed", "3", "--profile", "criteo"]);
    assert_eq!(default, named);
    let mut lib = Vec::new();
    sparta_data::write_synthetic(
        &sparta_data::SynthConfig {
            rows: 3000,
            seed: 3,
            model_seed: 20261129,
            vocab_scale: 1.0,
        },
        &mut lib,
    )
    .unwrap();
    assert_eq!(default, lib);
    // no oracle for this profile: refused, naming the flag
    let o = sparta(&[
        "gen-data",
        "--rows",
        "10",
        "--oracle",
        s(&dir.path().join("o.txt")),
        "--out",
        s(&dir.path().join("c.tsv")),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--oracle"), "{}", stderr(&o));
}

#[test]
fn the_rich_profile_is_deterministic_with_an_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let oracle = |n: &str| dir.path().join(n);
    let (_, a) = gen_args(
        dir.path(),
        "a.tsv",
        &[
            "--profile",
            "rich",
            "--seed",
            "4",
            "--oracle",
            s(&oracle("a.p")),
        ],
    );
    let (_, b) = gen_args(
        dir.path(),
        "b.tsv",
        &[
            "--profile",
            "rich",
            "--seed",
            "4",
            "--oracle",
            s(&oracle("b.p")),
        ],
    );
    assert_eq!(a, b);
    let pa = std::fs::read_to_string(oracle("a.p")).unwrap();
    assert_eq!(pa, std::fs::read_to_string(oracle("b.p")).unwrap());
    assert_eq!(pa.lines().count(), 3000);
    // p_click \t p_ctcvr, with p_ctcvr <= p_click
    assert!(pa.lines().all(|l| {
        let p: Vec<f64> = l.split('\t').map(|p| p.parse().unwrap()).collect();
        p.len() == 2 && (0.0..=1.0).contains(&p[0]) && (0.0..=p[0]).contains(&p[1])
    }));
    let text = String::from_utf8(a.clone()).unwrap();
    assert_eq!(text.lines().count(), 3000);
    assert!(text.lines().all(|l| l.split('\t').count() == 10));
    let (_, c) = gen_args(dir.path(), "c.tsv", &["--profile", "rich", "--seed", "5"]);
    assert_ne!(a, c);
}
