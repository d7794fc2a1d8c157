//! TLS between real `sparta ps` and `sparta worker` processes on loopback, with a throwaway
//! self-signed certificate: training works with the CA, and a worker without it is refused
//! with a message that says what to pass.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_sparta");

fn start_tls_ps(dir: &Path, config: &Path) -> (Child, String) {
    let mut child = Command::new(EXE)
        .args([
            "ps",
            "--shard",
            "0",
            "--num-shards",
            "1",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(config)
        .arg("--tls-cert")
        .arg(dir.join("ps.crt"))
        .arg("--tls-key")
        .arg(dir.join("ps.key"))
        .env("SPARTA_TOKEN", "tok")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    for line in out.lines() {
        let line = line.unwrap();
        if let Some(a) = line.split("listening on ").nth(1) {
            return (child, a.trim().to_string());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("ps exited without listening");
}

fn worker(
    addr: &str,
    config: &Path,
    data: &Path,
    tls: &[&std::ffi::OsStr],
) -> std::process::Output {
    Command::new(EXE)
        .args(["worker", "--rank", "0", "--num-workers", "1", "--ps", addr])
        .arg("--config")
        .arg(config)
        .arg("--train")
        .arg(data)
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
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(d.join("ps.crt"), c.cert.pem()).unwrap();
    std::fs::write(d.join("ps.key"), c.key_pair.serialize_pem()).unwrap();
    let config = d.join("job.toml");
    std::fs::write(
        &config,
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nhidden = [8]\n[train]\nthreads = 1\n",
    )
    .unwrap();
    let data = d.join("train.tsv");
    let o = Command::new(EXE)
        .args(["gen-data", "--rows", "600", "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let (mut ps, addr) = start_tls_ps(d, &config);
    let ca = d.join("ps.crt");
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
    let _ = ps.kill();
    let _ = ps.wait();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("s.json")).unwrap()).unwrap();
    assert_eq!(s["train_rows"], 600, "{s}");
    assert!(!plain.status.success());
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(err.contains("--tls-ca") && err.contains(&addr), "{err}");
}
