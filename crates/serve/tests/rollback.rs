//! Pinning and rollback on loopback: `POST /v1/rollback` answers with the previous version's
//! scores and stays pinned until `POST /v1/unpin`; `--pin-version` (`ModelHandle::open_pinned`)
//! serves one version exactly; refusals without the token; every response counted by status;
//! a delta written over an older version (after a held-back one) loads.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{assert_matches, batch_of, lines, Live};
use serde_json::{json, Value};
use sparta_serve::{
    BearerToken, ExportKind, ExportOptions, Exporter, ModelHandle, PollOutcome, Security,
    ServeConfig, Snapshot,
};

const TOKEN: &str = "s3cret-token";

/// One request on a fresh connection (with `Authorization: Bearer auth` when given).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    auth: Option<&str>,
) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = auth.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(body.into())),
    )
}

fn probabilities(v: &Value) -> Vec<f32> {
    v["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap() as f32)
        .collect()
}

fn opts() -> ExportOptions {
    ExportOptions {
        sync: false,
        ..ExportOptions::default()
    }
}

/// Versions 1 (full) and 2 (delta) with different weights; returns the live trainer.
fn two_versions(dir: &Path, ids: &[u64]) -> (Live, Exporter) {
    let mut live = Live::new("wdl", "");
    live.touch(ids);
    let mut ex = Exporter::open(dir, opts()).unwrap();
    ex.export(&live.text, &live.model, &live.tables(), 1)
        .unwrap();
    live.touch(ids);
    let info = ex
        .export(&live.text, &live.model, &live.tables(), 2)
        .unwrap();
    assert_eq!(info.kind, ExportKind::Delta);
    (live, ex)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A server over `handle` that polls only when the test calls `handle.poll()`.
fn serve(
    rt: &tokio::runtime::Runtime,
    handle: &Arc<ModelHandle>,
    token: Option<&str>,
) -> sparta_serve::server::RunningServer {
    let cfg = ServeConfig {
        poll: Duration::from_secs(3600),
        ..ServeConfig::default()
    };
    let security = Security {
        token: token.map(|t| BearerToken::new(t, "test").unwrap()),
        tls: None,
    };
    rt.block_on(sparta_serve::start_secured(
        "127.0.0.1:0",
        Arc::clone(handle),
        cfg,
        security,
    ))
    .unwrap()
}

/// The value of the series `name{labels}` in a Prometheus text.
fn series(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name_and_labels} not in\n{text}"))
}

#[test]
fn a_rollback_serves_the_previous_versions_scores_and_stays_pinned_until_unpin() {
    let dir = tempfile::tempdir().unwrap();
    let ls = lines(20, 9);
    let (batch, ids) = batch_of(&ls);
    let (mut live, mut ex) = two_versions(dir.path(), &ids);
    let want_v1 = Snapshot::load_version(dir.path(), 1)
        .unwrap()
        .predict(batch.clone());
    let handle = Arc::new(ModelHandle::open(dir.path()).unwrap());
    let want_v2 = handle.current().unwrap().predict(batch);
    assert_ne!(want_v1, want_v2, "the two versions must score differently");
    let rt = runtime();
    let server = serve(&rt, &handle, Some(TOKEN));
    let addr = server.addr;
    let body = json!({ "tsv": ls }).to_string();

    let (code, v) = http(addr, "POST", "/v1/predict", &body, Some(TOKEN));
    assert_eq!((code, v["version"].as_u64()), (200, Some(2)), "{v}");
    assert_eq!(probabilities(&v), want_v2);

    let (code, v) = http(addr, "POST", "/v1/rollback", "", Some(TOKEN));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, json!({"version": 1, "rolled_back_from": 2, "pinned": 1}));
    let (code, v) = http(addr, "POST", "/v1/predict", &body, Some(TOKEN));
    assert_eq!((code, v["version"].as_u64()), (200, Some(1)), "{v}");
    assert_eq!(
        probabilities(&v),
        want_v1,
        "version 1's scores after the rollback"
    );

    // Pinned: a new version on disk is not loaded.
    live.touch(&ids);
    ex.export(&live.text, &live.model, &live.tables(), 3)
        .unwrap();
    assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    let (_, v) = http(addr, "GET", "/v1/model", "", Some(TOKEN));
    assert_eq!(
        (v["version"].as_u64(), v["pinned"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    // Nothing before version 1: a second rollback is refused and changes nothing.
    let (code, v) = http(addr, "POST", "/v1/rollback", "", Some(TOKEN));
    assert_eq!(code, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("before 1"), "{v}");
    assert_eq!(handle.current().unwrap().version(), 1);

    let (code, v) = http(addr, "POST", "/v1/unpin", "", Some(TOKEN));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, json!({"version": 1, "pinned": null, "was_pinned": 1}));
    // Unpinned, the deltas after version 1 apply again.
    assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(3));
    assert_matches(&handle.current().unwrap(), &live);
    let (_, v) = http(addr, "GET", "/metrics", "", Some(TOKEN));
    let text = v.as_str().unwrap();
    assert_eq!(series(text, "sparta_serve_rollbacks_total"), 1.0);
    assert_eq!(series(text, "sparta_serve_pinned_version"), 0.0);
    rt.block_on(server.shutdown());
}

#[test]
fn a_rollback_without_the_token_is_refused_and_every_response_is_counted_by_status() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ids) = batch_of(&lines(10, 3));
    two_versions(dir.path(), &ids);
    let handle = Arc::new(ModelHandle::open(dir.path()).unwrap());
    let rt = runtime();
    let server = serve(&rt, &handle, Some(TOKEN));
    let addr = server.addr;
    assert_eq!(http(addr, "POST", "/v1/rollback", "", None).0, 401);
    assert_eq!(http(addr, "POST", "/v1/rollback", "", Some("wrong")).0, 401);
    assert_eq!(http(addr, "POST", "/v1/unpin", "", Some("wrong")).0, 401);
    assert_eq!(
        handle.current().unwrap().version(),
        2,
        "nothing rolled back"
    );
    assert_eq!(handle.pinned(), None);
    assert_eq!(http(addr, "GET", "/health", "", None).0, 200);
    assert_eq!(http(addr, "GET", "/no/such/route", "", Some(TOKEN)).0, 404);
    let (code, _) = http(
        addr,
        "POST",
        "/v1/predict",
        "{\"tsv\": [\"x\"]}",
        Some(TOKEN),
    );
    assert_eq!(code, 400);
    let (code, v) = http(addr, "GET", "/metrics", "", Some(TOKEN));
    assert_eq!(code, 200);
    let text = v.as_str().unwrap();
    // The scrape counts the responses before it.
    assert_eq!(
        series(text, "sparta_serve_responses_total{code=\"401\"}"),
        3.0
    );
    assert_eq!(
        series(text, "sparta_serve_responses_total{code=\"200\"}"),
        1.0
    );
    assert_eq!(
        series(text, "sparta_serve_responses_total{code=\"404\"}"),
        1.0
    );
    assert_eq!(
        series(text, "sparta_serve_responses_total{code=\"400\"}"),
        1.0
    );
    assert_eq!(
        series(
            text,
            "sparta_serve_requests_total{endpoint=\"rollback\",code=\"401\"}"
        ),
        2.0
    );
    rt.block_on(server.shutdown());

    // A server without a token refuses the admin routes altogether.
    let open = serve(&rt, &handle, None);
    let (code, v) = http(open.addr, "POST", "/v1/rollback", "", None);
    assert_eq!(code, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("--token-file"), "{v}");
    assert_eq!(http(open.addr, "POST", "/v1/unpin", "", None).0, 403);
    assert_eq!(handle.current().unwrap().version(), 2);
    let (_, v) = http(open.addr, "GET", "/metrics", "", None);
    assert_eq!(
        series(
            v.as_str().unwrap(),
            "sparta_serve_responses_total{code=\"403\"}"
        ),
        2.0
    );
    rt.block_on(open.shutdown());
}

#[test]
fn a_pinned_handle_serves_that_version_exactly_and_loads_no_newer_one() {
    let dir = tempfile::tempdir().unwrap();
    let ls = lines(20, 4);
    let (batch, ids) = batch_of(&ls);
    let (mut live, mut ex) = two_versions(dir.path(), &ids);
    let v2 = ModelHandle::open(dir.path()).unwrap().current().unwrap();
    live.touch(&ids);
    ex.export(&live.text, &live.model, &live.tables(), 3)
        .unwrap();
    let h = ModelHandle::open_pinned(dir.path(), 2).unwrap();
    let snap = h.current().unwrap();
    assert_eq!((snap.version(), h.pinned()), (2, Some(2)));
    assert_eq!(snap.predict(batch.clone()), v2.predict(batch));
    assert_eq!(snap.dense(), v2.dense());
    assert_eq!(h.poll().unwrap(), PollOutcome::Unchanged);
    assert_eq!(h.current().unwrap().version(), 2);
    let e = ModelHandle::open_pinned(dir.path(), 9)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("version 9 is not in"), "{e}");
}

#[test]
fn a_delta_over_the_last_published_version_after_a_held_back_one_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ids) = batch_of(&lines(30, 6));
    let (mut live, mut ex) = two_versions(dir.path(), &ids[..10]);
    let handle = ModelHandle::open(dir.path()).unwrap();
    // A version held back by the gate is never written: the trainer trains on.
    live.touch(&ids[10..20]);
    live.touch(&ids[20..]);
    let info = ex
        .export(&live.text, &live.model, &live.tables(), 4)
        .unwrap();
    assert_eq!((info.version, info.kind), (3, ExportKind::Delta));
    assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(3));
    assert_matches(&handle.current().unwrap(), &live);
    assert_matches(&Snapshot::load_latest(dir.path()).unwrap(), &live);
    assert_matches(&Snapshot::load_version(dir.path(), 3).unwrap(), &live);
}
