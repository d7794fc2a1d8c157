//! `sparta serve` on the real binary against requests that are wrong or slow: a dense value
//! beyond the training range is named as such (not as "not finite"), a field given twice in
//! a row is refused by name, and a client that stalls mid-request is dropped after
//! `--read-timeout-ms` while other clients are served.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{cmd, gen, ok, s, Proc};

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);

/// An export of a small trained model, shared by the tests of this file.
fn export() -> &'static Path {
    static EXPORT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &EXPORT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let data = gen(dir.path(), "train.tsv", 400, 1);
            let export = dir.path().join("export");
            let o = cmd(&["train", "--model", "wdl", "--train", s(&data)])
                .args(["--batch-size", "200", "--threads", "1", "--quiet"])
                .args(["--export-dir", s(&export), "--export-every-steps", "2"])
                .current_dir(dir.path())
                .output()
                .unwrap();
            ok(&o, "train");
            (dir, export)
        })
        .1
}

/// `sparta serve` of the shared export with `extra` flags, once it has loaded the model.
fn serve(extra: &[&str]) -> (Proc, SocketAddr) {
    let mut c = cmd(&["serve", "--model", s(export()), "--listen", "127.0.0.1:0"]);
    c.args(["--poll-ms", "50", "--threads", "2"]).args(extra);
    let mut p = Proc::start(c);
    let addr = p.wait_line(LIMIT, |l| {
        l.trim()
            .strip_prefix("listening on http://")
            .map(|a| a.parse().unwrap())
    });
    common::wait_for("the model to load", LIMIT, || common::http::model(addr));
    (p, addr)
}

fn predict(addr: SocketAddr, body: &str) -> (u16, serde_json::Value) {
    let (code, text) = common::http::post(addr, "/v1/predict", body);
    (code, serde_json::from_str(&text).unwrap())
}

#[test]
fn a_dense_value_above_2_pow_50_is_refused_as_out_of_range_not_as_infinite() {
    let (_server, addr) = serve(&[]);
    // 2^50 is the largest dense value training accepts: scored.
    let (code, v) = predict(addr, r#"{"rows": [{"I1": 1125899906842624}]}"#);
    assert_eq!(code, 200, "{v}");
    for body in [
        r#"{"rows": [{"I1": 1125899906842625}]}"#,
        r#"{"rows": [{"I1": 1e20}]}"#,
    ] {
        let (code, v) = predict(addr, body);
        assert_eq!(code, 400, "{body}: {v}");
        let e = v["error"].as_str().unwrap();
        assert!(
            e.contains("row 0: field \"I1\"") && e.contains("out of range") && e.contains("2^50"),
            "{body}: {e}"
        );
        assert!(!e.contains("finite"), "{body}: {e}");
    }
}

#[test]
fn a_field_given_twice_in_a_row_is_refused_with_400_naming_it() {
    let (_server, addr) = serve(&[]);
    let (code, v) = predict(
        addr,
        r#"{"rows": [{"I1": 1}, {"C3": "a", "I2": 5, "C3": "b"}]}"#,
    );
    assert_eq!(code, 400, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("row 1: duplicate field \"C3\""), "{e}");
    // The same rows without the repeat are scored.
    let (code, v) = predict(addr, r#"{"rows": [{"I1": 1}, {"C3": "b", "I2": 5}]}"#);
    assert_eq!(code, 200, "{v}");
}

/// Connects and sends `part` of a request, then stalls (the read guard: `guard`).
fn stall(addr: SocketAddr, part: &str, guard: Duration) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(guard)).unwrap();
    c.write_all(part.as_bytes()).unwrap();
    c
}

/// Everything the server sends until it closes the connection; a panic when it holds the
/// connection open past the socket's read guard.
fn until_closed(mut c: TcpStream, what: &str) -> String {
    let mut out = Vec::new();
    match c.read_to_end(&mut out) {
        Ok(_) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            String::from_utf8_lossy(&out).into_owned()
        }
        Err(e) => panic!("{what}: the server still held the connection ({e})"),
    }
}

#[test]
fn a_client_stalling_mid_request_is_dropped_after_the_read_timeout_while_others_are_served() {
    let (_server, addr) = serve(&["--read-timeout-ms", "1000"]);
    // Far beyond the timeout: a connection still open then was never dropped.
    let guard = Duration::from_secs(30);
    let start = Instant::now();
    let half_header = stall(
        addr,
        "POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Ty",
        guard,
    );
    let half_body = stall(
        addr,
        "POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{\"rows\": [",
        guard,
    );
    // Meanwhile other clients are answered at once.
    let (code, v) = predict(addr, r#"{"rows": [{"I1": 3}]}"#);
    assert_eq!(code, 200, "{v}");
    assert!(common::http::model(addr).is_some());

    let got = until_closed(half_header, "a client with half a header");
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got}");
    let got = until_closed(half_body, "a client with half a body");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request body not received within 1s"), "{got}");
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "dropped before the timeout"
    );
    // Still serving after dropping them.
    let (code, v) = predict(addr, r#"{"rows": [{"I1": 3}]}"#);
    assert_eq!(code, 200, "{v}");
}

#[test]
fn a_zero_read_timeout_is_refused() {
    let o = common::sparta(&["serve", "--model", "nowhere", "--read-timeout-ms", "0"]);
    assert!(!o.status.success());
    let err = common::stderr(&o);
    assert!(err.contains("--read-timeout-ms 0"), "{err}");
}
