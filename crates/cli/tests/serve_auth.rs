//! `sparta serve` secured, on the real binary: a bearer token on every route but
//! `GET /health` (401 without it or with a wrong one, counted), 415 for non-JSON bodies,
//! HTTPS with a self-signed certificate (a rustls client that trusts it; plain HTTP refused;
//! in-flight requests answered on SIGTERM), and no unauthenticated start on a non-loopback
//! address unless asked for.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{cmd, gen, ok, s, signal, Proc};
use rustls::pki_types::CertificateDer;
use serde_json::Value;

/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);
const TOKEN: &str = "s3cret-Token_42";

/// A `sparta serve` command without any token from the environment.
fn serve_cmd(model: &Path, listen: &str, extra: &[&str]) -> Command {
    let mut c = cmd(&["serve", "--model", s(model), "--listen", listen]);
    c.args(["--poll-ms", "50", "--threads", "2"])
        .args(extra)
        .env_remove("SPARTA_SERVE_TOKEN");
    c
}

/// Starts `c`; returns it with the port it printed (`listening on {scheme}://addr`).
fn start(c: Command, scheme: &str) -> (Proc, u16) {
    let mut p = Proc::start(c);
    let prefix = format!("listening on {scheme}://");
    let addr: SocketAddr = p.wait_line(LIMIT, |l| l.trim().strip_prefix(&prefix)?.parse().ok());
    (p, addr.port())
}

/// A short training run that leaves an export in `dir/export`; returns it and three TSV
/// lines to score.
fn export(dir: &Path) -> (std::path::PathBuf, Vec<String>) {
    let data = gen(dir, "train.tsv", 600, 3);
    let export = dir.join("export");
    let o = cmd(&[
        "train",
        "--model",
        "wdl",
        "--train",
        s(&data),
        "--batch-size",
        "200",
        "--threads",
        "1",
        "--export-dir",
        s(&export),
        "--export-every-steps",
        "2",
        "--quiet",
    ])
    .current_dir(dir)
    .output()
    .unwrap();
    ok(&o, "train");
    let text = std::fs::read_to_string(&data).unwrap();
    let lines = text.lines().take(3).map(str::to_string).collect();
    (export, lines)
}

/// An answer: status, headers (lowercase names) and body.
struct Answer {
    code: u16,
    head: String,
    body: String,
}

impl Answer {
    fn parse(raw: &[u8]) -> Answer {
        let text = String::from_utf8_lossy(raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
        Answer {
            code: head[9..12].parse().unwrap(),
            head: head.to_ascii_lowercase(),
            body: body.to_string(),
        }
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    }
}

/// One request text with `Connection: close`; `headers` are extra lines.
fn request(method: &str, path: &str, headers: &[String], body: &str) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    r
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

const JSON: &str = "Content-Type: application/json";

/// One plain-HTTP request on a fresh connection.
fn http(port: u16, req: &str) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    Answer::parse(&out)
}

fn predict_body(lines: &[String]) -> String {
    serde_json::json!({ "tsv": lines }).to_string()
}

#[test]
fn a_token_guards_every_route_but_health_and_non_json_bodies_get_415() {
    let dir = tempfile::tempdir().unwrap();
    let (export, lines) = export(dir.path());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let (mut server, port) = start(
        serve_cmd(&export, "127.0.0.1:0", &["--token-file", s(&token_file)]),
        "http",
    );
    // /health is open (probes carry no token).
    server.wait_until("the model to load", LIMIT, || {
        let a = http(port, &request("GET", "/health", &[], ""));
        (a.code == 200).then_some(())
    });
    let body = predict_body(&lines);

    let a = http(port, &request("POST", "/v1/predict", &[JSON.into()], &body));
    assert_eq!(a.code, 401, "{}", a.body);
    assert_eq!(
        a.header("www-authenticate"),
        Some("bearer realm=\"sparta\"")
    );
    let e = a.json()["error"].as_str().unwrap().to_string();
    assert!(e.contains("missing bearer token"), "{e}");
    let wrong = [JSON.into(), bearer("s3cret-token_42")];
    let a = http(port, &request("POST", "/v1/predict", &wrong, &body));
    assert_eq!(a.code, 401, "{}", a.body);
    assert!(
        a.header("www-authenticate")
            .is_some_and(|h| h.starts_with("bearer") && h.contains("invalid_token")),
        "{}",
        a.head
    );
    assert!(a.json()["error"]
        .as_str()
        .unwrap()
        .contains("wrong bearer token"));
    let basic = [JSON.into(), format!("Authorization: Basic {TOKEN}")];
    assert_eq!(
        http(port, &request("POST", "/v1/predict", &basic, &body)).code,
        401
    );

    let good = [JSON.into(), bearer(TOKEN)];
    let a = http(port, &request("POST", "/v1/predict", &good, &body));
    assert_eq!(a.code, 200, "{}", a.body);
    assert_eq!(a.json()["probabilities"].as_array().unwrap().len(), 3);

    for path in ["/v1/model", "/metrics"] {
        let a = http(port, &request("GET", path, &[], ""));
        assert_eq!(a.code, 401, "{path}: {}", a.body);
        assert!(a.json()["error"].is_string(), "{path}");
        let a = http(port, &request("GET", path, &[bearer(TOKEN)], ""));
        assert_eq!(a.code, 200, "{path}: {}", a.body);
    }

    // Content types: JSON (any case, with parameters) or none are scored; others are 415.
    for (ct, want) in [
        (Some("text/plain"), 415),
        (Some("application/x-www-form-urlencoded"), 415),
        (Some("application/json; charset=utf-8"), 200),
        (Some("Application/JSON"), 200),
        (None, 200),
    ] {
        let mut h = vec![bearer(TOKEN)];
        h.extend(ct.map(|c| format!("Content-Type: {c}")));
        let a = http(port, &request("POST", "/v1/predict", &h, &body));
        assert_eq!(a.code, want, "{ct:?}: {}", a.body);
        if want == 415 {
            let e = a.json()["error"].as_str().unwrap().to_string();
            assert!(e.contains("expected application/json"), "{e}");
        }
    }
    // Refusals are counted by endpoint and answer.
    let text = http(port, &request("GET", "/metrics", &[bearer(TOKEN)], "")).body;
    for (series, want) in [
        ("{endpoint=\"predict\",code=\"401\"}", 3),
        ("{endpoint=\"model\",code=\"401\"}", 1),
        ("{endpoint=\"metrics\",code=\"401\"}", 1),
        ("{endpoint=\"predict\",code=\"415\"}", 2),
        ("{endpoint=\"predict\",code=\"200\"}", 4),
    ] {
        let line = format!("sparta_serve_requests_total{series} {want}");
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    drop(server);

    // SPARTA_SERVE_TOKEN instead of a file; with a token a non-loopback address is fine.
    let mut c = serve_cmd(&export, "0.0.0.0:0", &[]);
    c.env("SPARTA_SERVE_TOKEN", TOKEN);
    let (mut server, port) = start(c, "http");
    server.wait_until("the model to load", LIMIT, || {
        (http(port, &request("GET", "/health", &[], "")).code == 200).then_some(())
    });
    let a = http(port, &request("POST", "/v1/predict", &[JSON.into()], &body));
    assert_eq!(a.code, 401, "{}", a.body);
    let a = http(port, &request("POST", "/v1/predict", &good, &body));
    assert_eq!(a.code, 200, "{}", a.body);
}

#[test]
fn an_open_server_listens_on_loopback_only_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("no-export-yet");
    let fails = |listen: &str, extra: &[&str]| -> String {
        let o = serve_cmd(&model, listen, extra).output().unwrap();
        assert!(!o.status.success(), "serve {listen} {extra:?} started");
        common::stderr(&o)
    };
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let e = fails(listen, &[]);
        assert!(
            e.contains("refusing to serve")
                && e.contains("--token-file")
                && e.contains("--insecure-no-auth"),
            "{e}"
        );
    }
    // A token that is not there is an error, never an open server.
    std::fs::write(d.join("empty"), "\n").unwrap();
    let e = fails("127.0.0.1:0", &["--token-file", s(&d.join("empty"))]);
    assert!(e.contains("--token-file") && e.contains("empty"), "{e}");
    let o = serve_cmd(&model, "127.0.0.1:0", &[])
        .env("SPARTA_SERVE_TOKEN", " ")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(common::stderr(&o).contains("SPARTA_SERVE_TOKEN is empty"));
    // TLS needs both files.
    let e = fails("127.0.0.1:0", &["--tls-cert", s(&d.join("c.pem"))]);
    assert!(e.contains("--tls-cert given without --tls-key"), "{e}");
    let e = fails("127.0.0.1:0", &["--tls-key", s(&d.join("k.pem"))]);
    assert!(e.contains("--tls-key given without --tls-cert"), "{e}");

    // Asked for explicitly, it serves open; loopback is open by default.
    for (listen, extra) in [
        ("0.0.0.0:0", &["--insecure-no-auth"][..]),
        ("127.0.0.1:0", &[]),
    ] {
        let (server, port) = start(serve_cmd(&model, listen, extra), "http");
        let a = http(port, &request("GET", "/v1/model", &[], ""));
        assert_eq!(a.code, 503, "{listen}: {}", a.body);
        assert_eq!(a.json()["loaded"], false);
        signal(server.pid(), "-TERM");
        let (success, log) = server.wait(LIMIT);
        assert!(success, "{listen}: {log}");
        if listen.starts_with("0.0.0.0") {
            assert!(log.contains("without authentication"), "{log}");
        }
    }
}

/// A TLS client that trusts `ca` only, connected to `port` (handshake on first use).
fn tls(
    port: u16,
    ca: &CertificateDer<'static>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(LIMIT)).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// The whole answer of a TLS stream (a missing close_notify after it is not an error here).
fn read_answer(s: &mut impl Read) -> Answer {
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        assert!(!out.is_empty(), "reading the answer: {e}");
    }
    Answer::parse(&out)
}

fn https(port: u16, ca: &CertificateDer<'static>, req: &str) -> Answer {
    let mut s = tls(port, ca);
    s.write_all(req.as_bytes()).unwrap();
    read_answer(&mut s)
}

#[test]
fn https_with_a_self_signed_certificate_answers_in_flight_requests_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (export, lines) = export(d);
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(d.join("c.pem"), cert.cert.pem()).unwrap();
    std::fs::write(d.join("k.pem"), cert.key_pair.serialize_pem()).unwrap();
    std::fs::write(d.join("token"), TOKEN).unwrap();
    let ca = cert.cert.der().clone();
    let (c, k, t) = (d.join("c.pem"), d.join("k.pem"), d.join("token"));
    let flags = [
        "--tls-cert",
        s(&c),
        "--tls-key",
        s(&k),
        "--token-file",
        s(&t),
    ];
    let (mut server, port) = start(serve_cmd(&export, "127.0.0.1:0", &flags), "https");
    server.wait_until("the model to load", LIMIT, || {
        (https(port, &ca, &request("GET", "/health", &[], "")).code == 200).then_some(())
    });
    let body = predict_body(&lines);
    let good = [JSON.into(), bearer(TOKEN)];
    let a = https(port, &ca, &request("POST", "/v1/predict", &good, &body));
    assert_eq!(a.code, 200, "{}", a.body);
    assert_eq!(a.json()["probabilities"].as_array().unwrap().len(), 3);
    let a = https(
        port,
        &ca,
        &request("POST", "/v1/predict", &[JSON.into()], &body),
    );
    assert_eq!(a.code, 401, "{}", a.body);

    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(LIMIT)).unwrap();
    plain
        .write_all(request("GET", "/health", &[], "").as_bytes())
        .unwrap();
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out);
    assert!(
        !out.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&out)
    );

    // A request whose body is still on its way when SIGTERM arrives is answered in full.
    let head = request("POST", "/v1/predict", &good, &body);
    let (half, rest) = head.split_at(head.len() - body.len() / 2);
    let mut s = tls(port, &ca);
    s.write_all(half.as_bytes()).unwrap();
    s.flush().unwrap();
    server.wait_until("the request to be accepted", LIMIT, || {
        // A second connection answered proves the accept loop ran past the first.
        (https(port, &ca, &request("GET", "/health", &[], "")).code == 200).then_some(())
    });
    signal(server.pid(), "-TERM");
    s.write_all(rest.as_bytes()).unwrap();
    let a = read_answer(&mut s);
    assert_eq!(a.code, 200, "{}", a.body);
    assert!(a.json()["probabilities"].is_array(), "{}", a.body);
    let (success, log) = server.wait(LIMIT);
    assert!(success, "serve did not exit 0 on SIGTERM:\n{log}");
}
