//! A minimal HTTP/1.1 client for `sparta serve` (one request per connection).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// Sends `request` (a whole HTTP/1.1 request with `Connection: close`); returns the status
/// and the body.
pub fn http(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    (status, out.split_once("\r\n\r\n").unwrap().1.to_string())
}

/// `GET path` → status and JSON body.
pub fn get_json(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let (code, text) = http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
    );
    (
        code,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// The served model (`GET /v1/model`), when one is loaded.
pub fn model(addr: SocketAddr) -> Option<serde_json::Value> {
    let (code, v) = get_json(addr, "/v1/model");
    (code == 200 && v["version"].is_u64()).then_some(v)
}

/// `POST path` with a JSON `body` → status and body.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Scores TSV lines; returns the version that scored them and one probability per line.
pub fn predict(addr: SocketAddr, lines: &[&str]) -> (u64, Vec<f32>) {
    let body = serde_json::json!({ "tsv": lines }).to_string();
    let (code, text) = post(addr, "/v1/predict", &body);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let probs = v["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap() as f32)
        .collect();
    (v["version"].as_u64().unwrap(), probs)
}
