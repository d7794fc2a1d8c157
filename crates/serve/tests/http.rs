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
    let want = handle.current().predict(batch);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = ServeConfig {
        max_body_bytes: 64 << 10,
        max_rows: 10,
        poll: Duration::from_millis(20),
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
