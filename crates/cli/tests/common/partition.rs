//! A network partition on loopback: a TCP proxy in front of one process's port. Everyone who
//! reaches the process through the proxy is cut off from it while the partition holds: bytes
//! are held, neither delivered nor refused (connections hang, as across a real partition),
//! and flow again once it heals. The process itself keeps running and reaches others directly.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// The proxy; dropping it stops accepting (open connections end with their processes).
pub struct Partition {
    addr: String,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Partition {
    /// A proxy on a free loopback port forwarding to `upstream` (which may start later).
    pub fn new(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (cut, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (c, st, up) = (Arc::clone(&cut), Arc::clone(&stop), upstream.to_string());
        std::thread::spawn(move || {
            while !st.load(SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(&up) else {
                            continue; // not listening (yet, or any more): the client sees EOF
                        };
                        for (from, to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            let c = Arc::clone(&c);
                            std::thread::spawn(move || pump(from, to, &c));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { addr, cut, stop }
    }

    /// Where the others reach the process.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Cuts the process off: nothing more crosses the proxy until [`Partition::heal`].
    pub fn cut(&self) {
        self.cut.store(true, SeqCst);
    }

    /// Ends the partition: held and new bytes flow again.
    pub fn heal(&self) {
        self.cut.store(false, SeqCst);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

/// Copies `from` to `to`, holding each chunk while `cut` is set.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while cut.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
