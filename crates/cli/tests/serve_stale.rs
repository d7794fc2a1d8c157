//! `sparta serve` never goes silently stale, on the real binary: a deleted delta is reported
//! (`/v1/model` stale, `/health` degraded, `sparta predict` warns) until the next full export
//! (`sparta export`), which it loads by itself; it starts before the first export exists; it
//! exits 0 on SIGTERM and SIGINT.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use common::{cmd, gen, ok, s, signal, sparta, Proc};
use serde_json::Value;

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);

/// One request on a fresh connection: (status, JSON body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1;
    (
        status,
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}")),
    )
}

fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    http(addr, "GET", path, "")
}

/// Complete export versions of `dir` (with a manifest), ascending.
fn versions(dir: &Path) -> Vec<u64> {
    sparta_serve::list_versions(dir)
        .unwrap()
        .into_iter()
        .filter(|&v| {
            dir.join(sparta_serve::format::version_dir(v))
                .join("manifest.json")
                .exists()
        })
        .collect()
}

/// Sends `sig` and waits for the exit; asserts status 0.
fn stop(p: Proc, sig: &str) {
    signal(p.pid(), sig);
    let (success, log) = p.wait(LIMIT);
    assert!(success, "serve did not exit 0 on {sig}:\n{log}");
}

fn train(dir: &Path, data: &Path, export: &Path, ckpt: Option<&Path>) {
    let mut args = vec![
        "train",
        "--model",
        "wdl",
        "--train",
        s(data),
        "--batch-size",
        "200",
        "--threads",
        "1",
        "--export-dir",
        s(export),
        "--export-every-steps",
        "2",
        "--quiet",
    ];
    if let Some(c) = ckpt {
        args.extend(["--checkpoint-dir", s(c)]);
    }
    let o = cmd(&args).current_dir(dir).output().unwrap();
    ok(&o, "train");
}

#[test]
fn a_deleted_delta_is_reported_until_the_next_full_export() {
    let dir = tempfile::tempdir().unwrap();
    let data = gen(dir.path(), "train.tsv", 3000, 1);
    let test = gen(dir.path(), "test.tsv", 200, 2);
    let export = dir.path().join("export");
    let ckpt = dir.path().join("ckpt");
    train(dir.path(), &data, &export, Some(&ckpt));
    let vs = versions(&export);
    assert!(vs.len() >= 5, "{vs:?}");
    let newest = *vs.last().unwrap();
    // Version 1 is the full export; 2.. are deltas. Delete one in the middle.
    std::fs::remove_dir_all(export.join(sparta_serve::format::version_dir(3))).unwrap();

    // `sparta predict` scores with the chain up to 2 and names the gap.
    let preds = dir.path().join("preds.txt");
    let (o, _) = common::predict_file(&export, &test, &preds);
    let err = common::stderr(&o);
    assert!(err.contains("with export version 2"), "{err}");
    assert!(
        err.contains(&format!(
            "warning: scoring with export version 2 although versions up to {newest} exist"
        )),
        "{err}"
    );
    assert!(err.contains("delta 4 applies on version 3"), "{err}");

    // The server serves 2, and says so loudly.
    let (server, addr) = common::serve(&export, 50, LIMIT);
    let (code, m) = get(addr, "/v1/model");
    assert_eq!(code, 200, "{m}");
    assert_eq!(m["version"], 2, "{m}");
    assert_eq!(m["stale"]["since_version"], 2, "{m}");
    assert_eq!(m["stale"]["newest_on_disk"], newest, "{m}");
    assert_eq!(m["newest_on_disk"], newest, "{m}");
    assert_eq!(m["status"], "degraded", "{m}");
    let (code, h) = get(addr, "/health");
    assert_eq!(code, 200, "{h}");
    assert_eq!(h["status"], "degraded", "{h}");
    let mut server = server;
    server.wait_line(LIMIT, |l| {
        l.contains("serving stale export version 2").then_some(())
    });

    // A new full export from the checkpoint: the server catches up by itself.
    let o = sparta(&["export", "--checkpoint", s(&ckpt), "--out", s(&export)]);
    ok(&o, "export");
    let full = newest + 1;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("as version {full}")),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let m = server.wait_until("the server to load the full export", LIMIT, || {
        let (_, m) = get(addr, "/v1/model");
        (m["version"] == full).then_some(m)
    });
    assert!(m["stale"].is_null(), "{m}");
    assert_eq!(m["status"], "ok", "{m}");
    let (code, h) = get(addr, "/health");
    assert_eq!((code, h["status"].as_str()), (200, Some("ok")), "{h}");
    let text = std::fs::read_to_string(&test).unwrap();
    let lines: Vec<&str> = text.lines().take(5).collect();
    let (code, p) = http(
        addr,
        "POST",
        "/v1/predict",
        &serde_json::json!({ "tsv": lines }).to_string(),
    );
    assert_eq!(code, 200, "{p}");
    assert_eq!(p["version"], full);
    stop(server, "-TERM");
}

#[test]
fn serve_starts_before_the_first_export_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    let (server, addr) = common::serve(&export, 50, LIMIT);
    let (code, h) = get(addr, "/health");
    assert_eq!((code, h["status"].as_str()), (503, Some("loading")), "{h}");
    let (code, e) = http(addr, "POST", "/v1/predict", "{\"tsv\": []}");
    assert_eq!(code, 503, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("no model loaded yet"),
        "{e}"
    );
    let (code, m) = get(addr, "/v1/model");
    assert_eq!((code, m["loaded"].as_bool()), (503, Some(false)), "{m}");

    let data = gen(dir.path(), "train.tsv", 1000, 3);
    train(dir.path(), &data, &export, None);
    let mut server = server;
    let newest = *versions(&export).last().unwrap();
    server.wait_until("the server to load the exports", LIMIT, || {
        let (code, h) = get(addr, "/health");
        (code == 200 && h["version"] == newest).then_some(())
    });
    let (_, m) = get(addr, "/v1/model");
    assert!(m["stale"].is_null(), "{m}");
    assert_eq!(m["loaded"], true);
    stop(server, "-INT");
}

#[test]
fn serve_answers_in_flight_requests_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    let data = gen(dir.path(), "train.tsv", 600, 4);
    train(dir.path(), &data, &export, None);
    let (server, addr) = common::serve(&export, 50, LIMIT);
    // A request whose body is still on its way when SIGTERM arrives is answered in full.
    let text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<&str> = text.lines().take(3).collect();
    let body = serde_json::json!({ "tsv": lines }).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/predict HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    let (half, rest) = body.split_at(body.len() / 2);
    s.write_all(half.as_bytes()).unwrap();
    s.flush().unwrap();
    // The server has the request's head once the connection is accepted and read; give the
    // signal, then finish the body.
    let pid = server.pid();
    let mut server = server;
    server.wait_until("the request to be accepted", LIMIT, || {
        // A second connection answered proves the accept loop ran past the first.
        (get(addr, "/health").0 == 200).then_some(())
    });
    signal(pid, "-TERM");
    s.write_all(rest.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"probabilities\""), "{out}");
    let (success, log) = server.wait(LIMIT);
    assert!(success, "serve did not exit 0 on SIGTERM:\n{log}");
}

#[test]
fn a_corrupt_delta_is_skipped_once_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let data = gen(dir.path(), "train.tsv", 2000, 5);
    let export = dir.path().join("export");
    let ckpt = dir.path().join("ckpt");
    train(dir.path(), &data, &export, Some(&ckpt));
    let newest = *versions(&export).last().unwrap();
    assert!(newest >= 5, "{newest}");
    // One flipped byte in delta 4's rows: the checksum fails.
    let rows = export
        .join(sparta_serve::format::version_dir(4))
        .join("table-embedding.rows");
    let mut b = std::fs::read(&rows).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x20;
    std::fs::write(&rows, &b).unwrap();

    let (mut server, addr) = common::serve(&export, 50, LIMIT);
    let (_, m) = get(addr, "/v1/model");
    assert_eq!(m["version"], 3, "{m}");
    assert_eq!(m["bad_versions"], serde_json::json!([4]), "{m}");
    assert!(
        m["stale"]["reason"]
            .as_str()
            .unwrap()
            .contains("version 4 failed verification"),
        "{m}"
    );
    // Many polls later (poll every 50 ms): still one bad version, one break, no poll error.
    let metric = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in:\n{text}"))
    };
    let text = server.wait_until("twenty polls", LIMIT, || {
        let text = raw_get(addr, "/metrics");
        (metric(&text, "sparta_serve_uptime_seconds") > 1.0).then_some(text)
    });
    assert_eq!(metric(&text, "sparta_serve_bad_versions_total"), 1.0);
    assert_eq!(metric(&text, "sparta_serve_chain_breaks_total"), 1.0);
    assert_eq!(metric(&text, "sparta_serve_model_reload_errors_total"), 0.0);
    assert_eq!(metric(&text, "sparta_serve_stale"), 1.0);
    let log = server.log();
    assert_eq!(
        log.matches("export version 4 is bad").count(),
        1,
        "one warning for the bad version:\n{log}"
    );

    let o = sparta(&["export", "--checkpoint", s(&ckpt), "--out", s(&export)]);
    ok(&o, "export");
    server.wait_until("the server to load the full export", LIMIT, || {
        let (_, m) = get(addr, "/v1/model");
        (m["version"] == newest + 1 && m["stale"].is_null()).then_some(())
    });
    let text = raw_get(addr, "/metrics");
    assert_eq!(metric(&text, "sparta_serve_stale"), 0.0);
    stop(server, "-TERM");
}

/// The body of a GET, as text.
fn raw_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}
