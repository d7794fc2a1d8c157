//! TLS between real `sparta ps` and `sparta worker` processes on loopback, with a throwaway
//! self-signed certificate: training works with the CA, and a worker without it is refused
//! with a message that says what to pass.

mod common;

use std::path::Path;

use common::{cmd, gen, json, s, start_ps};

fn worker(
    addr: &str,
    config: &Path,
    data: &Path,
    tls: &[&std::ffi::OsStr],
) -> std::process::Output {
    cmd(&["worker", "--rank", "0", "--num-workers", "1", "--ps", addr])
        .args(["--config", s(config), "--train", s(data)])
        .args(["--quiet", "--retries", "0"])
        .args(tls)
        .env("SPARTA_TOKEN", "tok")
        .output()
        .unwrap()
}

#[test]
fn workers_train_over_tls_and_plain_workers_are_told_to_pass_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (crt, key) = common::self_signed(d);
    let config = d.join("job.toml");
    std::fs::write(
        &config,
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [8]\n[train]\nthreads = 1\n",
    )
    .unwrap();
    let data = gen(d, "train.tsv", 600, 1);

    let (ps, addr) = start_ps(
        &[
            "--shard",
            "0",
            "--num-shards",
            "1",
            "--config",
            s(&config),
            "--tls-cert",
            s(&crt),
            "--tls-key",
            s(&key),
        ],
        Some("tok"),
    );
    let ca = crt;
    let summary = d.join("s.json");
    let ok = worker(
        &addr,
        &config,
        &data,
        &[
            "--tls-ca".as_ref(),
            ca.as_os_str(),
            "--tls-domain".as_ref(),
            "localhost".as_ref(),
            "--summary-json".as_ref(),
            summary.as_os_str(),
        ],
    );
    let plain = worker(&addr, &config, &data, &[]);
    drop(ps);
    common::ok(&ok, "worker over TLS");
    let summary = json(&summary);
    assert_eq!(summary["train_rows"], 600, "{summary}");
    assert!(!plain.status.success());
    let err = common::stderr(&plain);
    assert!(err.contains("--tls-ca") && err.contains(&addr), "{err}");
}
