//! Serving benchmark: export size (full vs delta after ~1 % of rows changed, f32 and f16),
//! delta apply time, and HTTP latency (p50/p99) and throughput for batches of 1 and 100 rows
//! with a few concurrent keep-alive clients, against an in-process server on loopback.
//!
//! `cargo run --release -p sparta-serve --example serve_bench -- [--rows 1000000]
//!  [--clients 4] [--seconds 5] [--server-threads 2] [--model wdl]`

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparta_core::JobConfig;
use sparta_data::{write_synthetic, SynthConfig};
use sparta_nn::Model;
use sparta_serve::{ExportOptions, Exporter, ModelHandle, RequestParser, ServeConfig};
use sparta_table::Table;

struct Args {
    rows: u64,
    clients: usize,
    seconds: f64,
    server_threads: usize,
    model: String,
}

fn args() -> Args {
    let mut a = Args {
        rows: 1_000_000,
        clients: 4,
        seconds: 5.0,
        server_threads: 2,
        model: "wdl".into(),
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for p in v.chunks(2) {
        let val = p.get(1).map(String::as_str).unwrap_or("");
        match p[0].as_str() {
            "--rows" => a.rows = val.parse().expect("--rows N"),
            "--clients" => a.clients = val.parse().expect("--clients N"),
            "--seconds" => a.seconds = val.parse().expect("--seconds S"),
            "--server-threads" => a.server_threads = val.parse().expect("--server-threads N"),
            "--model" => a.model = val.to_string(),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// Pulls (creating) `keys` and pushes a random gradient to them.
fn touch(t: &Table, keys: &[u64], rng: &mut Rng) {
    for chunk in keys.chunks(1 << 16) {
        let mut rows = vec![0f32; chunk.len() * t.dim()];
        t.pull(chunk, &mut rows);
        let g: Vec<f32> = (0..rows.len()).map(|_| rng.unit()).collect();
        t.push(chunk, &g);
    }
}

fn dir_bytes(dir: &std::path::Path, v: u64) -> u64 {
    let d = dir.join(sparta_serve::format::version_dir(v));
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// One keep-alive HTTP/1.1 connection.
struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        let w = TcpStream::connect(addr).unwrap();
        w.set_nodelay(true).unwrap();
        Client {
            r: BufReader::new(w.try_clone().unwrap()),
            w,
        }
    }

    fn post(&mut self, body: &str) -> Vec<u8> {
        write!(
            self.w,
            "POST /v1/predict HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut len = 0usize;
        let mut line = String::new();
        let mut status = 0;
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            if status == 0 {
                status = line[9..12].parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        self.r.read_exact(&mut body).unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        body
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn load(addr: SocketAddr, lines: &Arc<Vec<String>>, batch: usize, clients: usize, secs: f64) {
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let lines = Arc::clone(lines);
            std::thread::spawn(move || {
                let mut cl = Client::new(addr);
                let mut rng = Rng(0x9E37_79B9 + c as u64);
                let mut lat = Vec::new();
                let deadline = Instant::now() + Duration::from_secs_f64(secs);
                while Instant::now() < deadline {
                    let pick: Vec<&str> = (0..batch)
                        .map(|_| lines[(rng.next() % lines.len() as u64) as usize].as_str())
                        .collect();
                    let body = serde_json::json!({ "tsv": pick }).to_string();
                    let t = Instant::now();
                    cl.post(&body);
                    lat.push(t.elapsed().as_secs_f64());
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<f64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let wall = start.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = lat.len() as f64;
    println!(
        "| {batch} | {clients} | {:.3} | {:.3} | {:.0} | {:.0} |",
        pct(&lat, 0.5) * 1e3,
        pct(&lat, 0.99) * 1e3,
        n / wall,
        n * batch as f64 / wall
    );
}

fn main() {
    let a = args();
    let text = format!("[model]\nkind = \"{}\"\n[train]\nthreads = 1\n", a.model);
    let job = JobConfig::from_toml(&text).unwrap().validate().unwrap();
    let model = Model::new(job.model.clone()).unwrap();
    let f = &job.features;
    let emb = Table::new(f.physical[0].config.clone()).unwrap();
    let wide = f
        .wide_table
        .map(|w| Table::new(f.physical[w].config.clone()).unwrap());

    // Requests come from synthetic lines; their ids are in the table, the rest is filler.
    let mut buf = Vec::new();
    write_synthetic(
        &SynthConfig {
            rows: 20_000,
            seed: 9,
            ..SynthConfig::default()
        },
        &mut buf,
    )
    .unwrap();
    let lines: Arc<Vec<String>> = Arc::new(
        String::from_utf8(buf)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
    );
    let b = RequestParser::new(
        &job.schema,
        &sparta_data::features::InputPlan::legacy(&job.schema),
    )
    .lines(&lines)
    .unwrap();
    let mut keys = b.ids.clone();
    keys.sort_unstable();
    keys.dedup();
    let mut rng = Rng(42);
    while (keys.len() as u64) < a.rows {
        keys.push(rng.next());
    }
    let t = Instant::now();
    touch(&emb, &keys, &mut rng);
    if let Some(w) = &wide {
        touch(w, &keys, &mut rng);
    }
    println!(
        "# tables: {} embedding rows (dim {}), {} wide rows; filled in {:.1}s",
        emb.len(),
        emb.dim(),
        wide.as_ref().map_or(0, |w| w.len()),
        t.elapsed().as_secs_f64()
    );
    let tabs: Vec<(&str, &Table)> = std::iter::once(("embedding", &emb))
        .chain(wide.iter().map(|w| ("wide", w)))
        .collect();

    println!("\n| export | kind | rows | removed | bytes | seconds |\n| --- | --- | --- | --- | --- | --- |");
    let dir = tempfile::tempdir().unwrap();
    let mut ex = Exporter::open(dir.path(), ExportOptions::default()).unwrap();
    let report = |name: &str, i: &sparta_serve::ExportInfo| {
        println!(
            "| {name} | {:?} | {} | {} | {} | {:.3} |",
            i.kind, i.rows, i.removed, i.bytes, i.seconds
        )
    };
    let full = ex.export(&text, &model, &tabs, 1).unwrap();
    report("f32 full", &full);
    let changed: Vec<u64> = (0..keys.len() / 100)
        .map(|_| keys[(rng.next() % keys.len() as u64) as usize])
        .collect();
    touch(&emb, &changed, &mut rng);
    if let Some(w) = &wide {
        touch(w, &changed, &mut rng);
    }
    let delta = ex.export(&text, &model, &tabs, 2).unwrap();
    report("f32 delta (1 % of rows pushed)", &delta);
    assert_eq!(dir_bytes(dir.path(), 2), delta.bytes);
    let dir16 = tempfile::tempdir().unwrap();
    let mut ex16 = Exporter::open(
        dir16.path(),
        ExportOptions {
            fp16: true,
            ..ExportOptions::default()
        },
    )
    .unwrap();
    report("f16 full", &ex16.export(&text, &model, &tabs, 1).unwrap());
    touch(&emb, &changed, &mut rng);
    report("f16 delta", &ex16.export(&text, &model, &tabs, 2).unwrap());
    let dense = model.num_params() as u64 * 4;
    println!(
        "\ndelta / full bytes (f32): {:.4}; dense parameters in every version: {dense} bytes; \
         without them: {:.4}",
        delta.bytes as f64 / full.bytes as f64,
        (delta.bytes - dense) as f64 / (full.bytes - dense) as f64
    );

    // Load the full export, then time delta installs (copy, then in place).
    let t = Instant::now();
    drop(sparta_serve::Snapshot::load_latest(dir.path()).unwrap());
    println!(
        "load of version 1 + delta 2: {:.2}s",
        t.elapsed().as_secs_f64()
    );
    let handle = Arc::new(ModelHandle::open(dir.path()).unwrap());
    for round in 0..3 {
        touch(&emb, &changed, &mut rng);
        if let Some(w) = &wide {
            touch(w, &changed, &mut rng);
        }
        ex.export(&text, &model, &tabs, 3 + round).unwrap();
        let t = Instant::now();
        handle.poll().unwrap();
        println!(
            "delta install {}: {:.3}s (in place so far: {})",
            round,
            t.elapsed().as_secs_f64(),
            handle.applied_in_place()
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.server_threads)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(sparta_serve::start(
            "127.0.0.1:0",
            Arc::clone(&handle),
            ServeConfig::default(),
        ))
        .unwrap();
    println!(
        "\nserver: {} runtime threads; {} keep-alive clients (in this process); {:.0}s per measurement; tsv bodies\n",
        a.server_threads, a.clients, a.seconds
    );
    println!("| rows/request | clients | p50 ms | p99 ms | requests/s | rows/s |\n| --- | --- | --- | --- | --- | --- |");
    for batch in [1usize, 100] {
        load(server.addr, &lines, batch, 1, a.seconds);
        load(server.addr, &lines, batch, a.clients, a.seconds);
    }
    server.abort();
}
