//! A real S3-compatible server for the process tests: `moto_server` (PyPI `moto[server]`,
//! installed by `scripts/test-deps.sh`, which the README's test command runs) on a free
//! loopback port, one per test, killed when dropped; plain HTTP calls to make buckets and
//! objects; and a TCP proxy in front of it that can go down for a while (an outage).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `moto_server`.
pub struct Moto {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Starts `moto_server` (`$SPARTA_MOTO_SERVER`, else `moto_server` on the PATH) and waits
    /// until it answers.
    pub fn start() -> Moto {
        let exe = std::env::var("SPARTA_MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
        let port = super::free_port();
        let child = Command::new(&exe)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the S3 test server `{exe}`: {e}. Install it with \
                     `pip install 'moto[server]'` (scripts/test-deps.sh does it)"
                )
            });
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut moto = Moto { child, addr };
        let t = Instant::now();
        loop {
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("{exe} exited at start: {status}");
            }
            if TcpStream::connect(addr).is_ok() && request(addr, "GET", "/", &[]).0 == 200 {
                return moto;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "{exe} did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn create_bucket(&self, bucket: &str) {
        let (code, body) = request(self.addr, "PUT", &format!("/{bucket}"), &[]);
        assert_eq!(code, 200, "create bucket {bucket}: {body}");
    }

    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let (code, body) = request(self.addr, "PUT", &format!("/{bucket}/{key}"), data);
        assert_eq!(code, 200, "put {bucket}/{key}: {body}");
    }
}

/// The `AWS_*` settings that point a `sparta` process at `endpoint`.
pub fn aws_env(c: &mut Command, endpoint: &str) {
    c.env("AWS_ENDPOINT", endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE");
}

/// One HTTP/1.1 request (path-style, unsigned: moto accepts it); the status and the body.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() || s.write_all(body).is_err() {
        return (0, String::new());
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |b| b.1).to_string();
    (code, body)
}

/// A TCP proxy to `upstream` on its own loopback port. After `down_after` bytes of answers
/// it goes down for `down_for`: open connections are cut and new ones refused (the port is
/// closed), then it listens again on the same port.
pub struct Proxy {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Outages so far.
    pub outages: Arc<AtomicU64>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

impl Proxy {
    pub fn start(upstream: SocketAddr, down_after: u64, down_for: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let outages = Arc::new(AtomicU64::new(0));
        let (stop2, outages2) = (Arc::clone(&stop), Arc::clone(&outages));
        std::thread::spawn(move || {
            let answered = Arc::new(AtomicU64::new(0));
            let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
            let mut listener = Some(listener);
            let mut went_down = false;
            while !stop2.load(SeqCst) {
                if !went_down && answered.load(SeqCst) >= down_after {
                    went_down = true;
                    drop(listener.take());
                    for s in open.lock().unwrap().drain(..) {
                        let _ = s.shutdown(Shutdown::Both);
                    }
                    outages2.fetch_add(1, SeqCst);
                    std::thread::sleep(down_for);
                    listener = Some(TcpListener::bind(addr).unwrap());
                }
                let l = listener.as_ref().unwrap();
                l.set_nonblocking(true).unwrap();
                let client = match l.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                open.lock().unwrap().push(client.try_clone().unwrap());
                open.lock().unwrap().push(server.try_clone().unwrap());
                pipe(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    None,
                );
                pipe(server, client, Some(Arc::clone(&answered)));
            }
        });
        Proxy {
            addr,
            stop,
            outages,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, count: Option<Arc<AtomicU64>>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            if let Some(c) = &count {
                c.fetch_add(n as u64, SeqCst);
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
