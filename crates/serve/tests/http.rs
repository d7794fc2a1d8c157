//! The HTTP API on loopback: rows and tsv inputs, 400s with reasons, 413, /v1/model,
//! /metrics, and a delta picked up by the poller without a restart.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{batch_of, lines, Live};
use serde_json::{json, Value};
use sparta_serve::{ExportOptions, Exporter, ModelHandle, ServeConfig};

/// One request on a fresh connection; returns (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // The server may answer (413) and close before reading a large body.
    let _ = s
        .write_all(req.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()));
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn row_object(line: &str) -> Value {
    let cols: Vec<&str> = line.split('\t').collect();
    let mut m = serde_json::Map::new();
    m.insert("label".into(), json!(cols[0]));
    for (i, v) in cols[1..14].iter().enumerate() {
        if !v.is_empty() {
            m.insert(format!("I{}", i + 1), json!(v.parse::<i64>().unwrap()));
        }
    }
    for (i, v) in cols[14..].iter().enumerate() {
        if !v.is_empty() {
            m.insert(format!("C{}", i + 1), json!(v));
        }
    }
    Value::Object(m)
}

#[test]
fn http_api() {
    let dir = tempfile::tempdir().unwrap();
    let ls = lines(20, 5);
    let (batch, ids) = batch_of(&ls);
    let mut live = Live::new("deepfm", "");
    live.touch(&ids);
    let mut ex = Exporter::open(
        dir.path(),
        ExportOptions {
            sync: false,
            ..ExportOptions::default()
        },
    )
    .unwrap();
    ex.export(&live.text, &live.model, &live.tables(), 7)
        .unwrap();
    let handle = Arc::new(ModelHandle::open(dir.path()).unwrap());
    let want = handle.current().unwrap().predict(batch);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = ServeConfig {
        max_body_bytes: 64 << 10,
        max_rows: 10,
        poll: Duration::from_millis(20),
        ..ServeConfig::default()
    };
    let server = rt
        .block_on(sparta_serve::start("127.0.0.1:0", Arc::clone(&handle), cfg))
        .unwrap();
    let addr = server.addr;

    // tsv lines and JSON rows of the same samples score the same, equal to the snapshot.
    let (code, body) = http(
        addr,
        "POST",
        "/v1/predict",
        &json!({"tsv": &ls[..10]}).to_string(),
    );
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["version"], 1);
    let got: Vec<f32> = v["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, want[..10]);
    let rows: Vec<Value> = ls[10..].iter().map(|l| row_object(l)).collect();
    let (code, body) = http(
        addr,
        "POST",
        "/v1/predict",
        &json!({ "rows": rows }).to_string(),
    );
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let got: Vec<f32> = v["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, want[10..]);

    // Bad requests: 400 with the reason.
    for (body, reason) in [
        (
            json!({"rows": [{"I1": 1, "C99": "x"}]}).to_string(),
            "unknown field \\\"C99\\\"",
        ),
        (
            json!({"rows": [{"I1": [1]}]}).to_string(),
            "expected a finite number",
        ),
        (json!({"tsv": ["1\t2\t3"]}).to_string(), "too few columns"),
        (
            json!({"tsv": vec![ls[0].clone(); 11]}).to_string(),
            "at most 10",
        ),
        ("{\"rows\": [".to_string(), "invalid JSON"),
    ] {
        let (code, text) = http(addr, "POST", "/v1/predict", &body);
        assert_eq!(code, 400, "{body} -> {text}");
        assert!(text.contains(reason), "{text} lacks {reason}");
    }
    // Too large: 413.
    let big = json!({"tsv": vec!["x".repeat(1000); 100]}).to_string();
    let (code, text) = http(addr, "POST", "/v1/predict", &big);
    assert_eq!(code, 413, "{text}");

    // Model info and metrics.
    let (code, body) = http(addr, "GET", "/v1/model", "");
    assert_eq!(code, 200);
    let m: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(m["version"], 1);
    assert_eq!(m["step"], 7);
    assert_eq!(m["rows"]["embedding"], ids.len());
    assert_eq!(m["rows"]["wide"], ids.len());
    assert!(m["age_seconds"].as_f64().unwrap() >= 0.0);
    let (code, text) = http(addr, "GET", "/metrics", "");
    assert_eq!(code, 200);
    for needle in [
        "sparta_serve_requests_total{endpoint=\"predict\",code=\"200\"} 2",
        "sparta_serve_requests_total{endpoint=\"predict\",code=\"400\"} 5",
        "sparta_serve_requests_total{endpoint=\"predict\",code=\"413\"} 1",
        "sparta_serve_rows_total 20",
        "sparta_serve_predict_latency_seconds_count 2",
        "sparta_serve_predict_latency_seconds_bucket{le=\"+Inf\"} 2",
        "sparta_serve_model_version 1",
    ] {
        assert!(text.contains(needle), "metrics lack {needle}:\n{text}");
    }
    assert_eq!(http(addr, "GET", "/health", "").0, 200);

    // A new delta is picked up by the poller, without a restart.
    live.touch(&ids);
    ex.export(&live.text, &live.model, &live.tables(), 8)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = http(addr, "GET", "/v1/model", "");
        let m: Value = serde_json::from_str(&body).unwrap();
        if m["version"] == 2 {
            assert_eq!(m["step"], 8);
            break;
        }
        assert!(Instant::now() < deadline, "delta not picked up: {m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, body) = http(
        addr,
        "POST",
        "/v1/predict",
        &json!({"tsv": &ls[..1]}).to_string(),
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["version"], 2);
    assert_ne!(v["probabilities"][0].as_f64().unwrap() as f32, want[0]);
    server.abort();
}

/// One sample of the Prometheus text exposition.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// Parses the exposition line by line: every `# HELP` / `# TYPE` pair names a family, every
/// sample belongs to a declared family (histograms: `_bucket`, `_sum`, `_count`).
fn parse_exposition(text: &str) -> (std::collections::HashMap<String, String>, Vec<Sample>) {
    let mut types = std::collections::HashMap::new();
    let mut helped = std::collections::HashSet::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!help.is_empty(), "{line}");
            helped.insert(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment: {line}");
        if line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("series value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => {
                let l = l.strip_suffix('}').expect("closing brace");
                let labels = l
                    .split(',')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').expect("label k=v");
                        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
                        (k.to_string(), v.expect("quoted label value").to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), Vec::new()),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(&name);
        assert!(types.contains_key(family), "sample of no family: {line}");
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    (types, samples)
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0].value
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `/metrics` through prometheus-client: every line parses, the values follow known requests
/// and the chain's state (a gap: stale 1, one chain break; the next full: stale 0).
#[test]
fn metrics_exposition_counts_requests_and_chain_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let ls = lines(12, 8);
    let (_, ids) = batch_of(&ls);
    let mut live = Live::new("wdl", "");
    let opts = ExportOptions {
        sync: false,
        ..ExportOptions::default()
    };
    let mut ex = Exporter::open(dir.path(), opts).unwrap();
    for s in 0..4 {
        live.touch(&ids);
        ex.export(&live.text, &live.model, &live.tables(), s)
            .unwrap();
    }
    std::fs::remove_dir_all(dir.path().join(sparta_serve::format::version_dir(3))).unwrap();
    let handle = Arc::new(ModelHandle::open(dir.path()).unwrap());
    let rt = runtime();
    let cfg = ServeConfig {
        max_body_bytes: 64 << 10,
        max_rows: 10,
        poll: Duration::from_millis(20),
        ..ServeConfig::default()
    };
    let server = rt
        .block_on(sparta_serve::start("127.0.0.1:0", Arc::clone(&handle), cfg))
        .unwrap();
    let addr = server.addr;
    for (body, want) in [
        (json!({"tsv": &ls[..3]}).to_string(), 200),
        (json!({"tsv": &ls[3..10]}).to_string(), 200),
        (json!({"tsv": ["1\t2"]}).to_string(), 400),
        (json!({"tsv": vec![ls[0].clone(); 11]}).to_string(), 400),
    ] {
        assert_eq!(http(addr, "POST", "/v1/predict", &body).0, want);
    }
    assert_eq!(http(addr, "GET", "/v1/model", "").0, 200);
    let (code, health) = http(addr, "GET", "/health", "");
    assert_eq!(code, 200);
    let h: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["version"], 2);
    assert_eq!(h["stale"]["since_version"], 2);

    let (code, text) = http(addr, "GET", "/metrics", "");
    assert_eq!(code, 200);
    let (types, samples) = parse_exposition(&text);
    for (family, kind) in [
        ("sparta_serve_requests_total", "counter"),
        ("sparta_serve_predict_latency_seconds", "histogram"),
        ("sparta_serve_stale", "gauge"),
        ("sparta_serve_chain_breaks_total", "counter"),
        ("sparta_serve_bad_versions_total", "counter"),
        ("sparta_serve_lineage_changes_total", "counter"),
    ] {
        assert_eq!(
            types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    let predict = |code| [("endpoint", "predict"), ("code", code)];
    assert_eq!(
        value(&samples, "sparta_serve_requests_total", &predict("200")),
        2.0
    );
    assert_eq!(
        value(&samples, "sparta_serve_requests_total", &predict("400")),
        2.0
    );
    assert_eq!(
        value(&samples, "sparta_serve_requests_total", &predict("413")),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "sparta_serve_requests_total",
            &[("endpoint", "model"), ("code", "200")]
        ),
        1.0
    );
    assert_eq!(value(&samples, "sparta_serve_errors_total", &[]), 2.0);
    assert_eq!(value(&samples, "sparta_serve_rows_total", &[]), 10.0);
    assert_eq!(
        value(&samples, "sparta_serve_predict_latency_seconds_count", &[]),
        2.0
    );
    assert_eq!(
        value(&samples, "sparta_serve_predict_rows_bucket", &[("le", "4")]),
        1.0,
        "3 rows fall in le=4, 7 rows do not"
    );
    assert_eq!(
        value(
            &samples,
            "sparta_serve_predict_rows_bucket",
            &[("le", "+Inf")]
        ),
        2.0
    );
    assert_eq!(value(&samples, "sparta_serve_predict_rows_sum", &[]), 10.0);
    assert_eq!(value(&samples, "sparta_serve_model_version", &[]), 2.0);
    assert_eq!(value(&samples, "sparta_serve_model_loaded", &[]), 1.0);
    assert_eq!(value(&samples, "sparta_serve_stale", &[]), 1.0);
    assert_eq!(value(&samples, "sparta_serve_chain_breaks_total", &[]), 1.0);
    assert_eq!(value(&samples, "sparta_serve_bad_versions_total", &[]), 0.0);
    assert_eq!(
        value(&samples, "sparta_serve_newest_version_on_disk", &[]),
        4.0
    );
    assert_eq!(
        value(&samples, "sparta_serve_model_reload_errors_total", &[]),
        0.0
    );

    // The next full export: the poller recovers, stale goes back to 0.
    live.touch(&ids);
    Exporter::open(dir.path(), opts)
        .unwrap()
        .export(&live.text, &live.model, &live.tables(), 9)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = http(addr, "GET", "/metrics", "");
        let (_, samples) = parse_exposition(&text);
        if value(&samples, "sparta_serve_model_version", &[]) == 5.0 {
            assert_eq!(value(&samples, "sparta_serve_stale", &[]), 0.0);
            assert_eq!(value(&samples, "sparta_serve_chain_breaks_total", &[]), 1.0);
            break;
        }
        assert!(Instant::now() < deadline, "full export not picked up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, health) = http(addr, "GET", "/health", "");
    let h: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(h["status"], "ok", "{h}");
    rt.block_on(server.shutdown());
}

/// Started on a directory with no export: not ready (503 everywhere that needs a model) until
/// the first export lands; then ready without a restart.
#[test]
fn a_server_starts_before_the_first_export() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("export");
    let handle = Arc::new(ModelHandle::open(&dir).unwrap());
    let rt = runtime();
    let cfg = ServeConfig {
        poll: Duration::from_millis(20),
        ..ServeConfig::default()
    };
    let server = rt
        .block_on(sparta_serve::start("127.0.0.1:0", Arc::clone(&handle), cfg))
        .unwrap();
    let addr = server.addr;
    let ls = lines(5, 3);
    let body = json!({"tsv": &ls}).to_string();
    let (code, text) = http(addr, "GET", "/health", "");
    assert_eq!(code, 503, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["status"],
        "loading"
    );
    let (code, text) = http(addr, "POST", "/v1/predict", &body);
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("no model loaded yet"), "{text}");
    let (code, text) = http(addr, "GET", "/v1/model", "");
    assert_eq!(code, 503, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["loaded"],
        false
    );
    let (code, text) = http(addr, "GET", "/metrics", "");
    assert_eq!(code, 200);
    let (_, samples) = parse_exposition(&text);
    assert_eq!(value(&samples, "sparta_serve_model_loaded", &[]), 0.0);
    assert_eq!(
        value(
            &samples,
            "sparta_serve_requests_total",
            &[("endpoint", "predict"), ("code", "503")]
        ),
        1.0
    );

    let (_, ids) = batch_of(&ls);
    let mut live = Live::new("wdl", "");
    live.touch(&ids);
    Exporter::open(
        &dir,
        ExportOptions {
            sync: false,
            ..ExportOptions::default()
        },
    )
    .unwrap()
    .export(&live.text, &live.model, &live.tables(), 3)
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http(addr, "GET", "/health", "").0 != 200 {
        assert!(Instant::now() < deadline, "first export not picked up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, text) = http(addr, "POST", "/v1/predict", &body);
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["version"], 1);
    let (code, text) = http(addr, "GET", "/v1/model", "");
    assert_eq!(code, 200, "{text}");
    let m: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (m["loaded"].clone(), m["step"].clone()),
        (json!(true), json!(3))
    );
    rt.block_on(server.shutdown());
}
