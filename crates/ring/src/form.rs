//! Forming the ring over TCP. Every rank listens on its own address (the worker list of the
//! job says which), connects to rank `r + 1` (retrying until the deadline: ranks start in any
//! order) and accepts rank `r - 1`. The connecting side sends a hello (magic, protocol
//! version, its rank, the ring size, the job token); the accepting side checks all of it (the
//! token in constant time) and answers one byte. A connection that fails the checks is
//! answered with the reason and dropped, and accepting goes on until the deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection, StreamOwned};

use subtle::ConstantTimeEq;

use crate::ring::{Link, Ring};
use crate::wire::Compression;
use crate::RingError;

const HELLO: [u8; 4] = *b"SPRH";
const VERSION: u8 = 1;
const OK: u8 = 0;
const BAD_TOKEN: u8 = 1;
const BAD_PLACE: u8 = 2;

/// How to form a ring.
#[derive(Clone, Debug)]
pub struct RingConfig {
    /// This worker's rank (`0..peers.len()`).
    pub rank: usize,
    /// The ring address of every rank, in rank order.
    pub peers: Vec<SocketAddr>,
    /// The job's shared token (the same on every rank).
    pub token: String,
    /// Wire compression (the same on every rank).
    pub compression: Compression,
    /// How long forming may take (all ranks must be up within it).
    pub form_timeout: Duration,
    /// A neighbour silent for this long during a call fails it (a dead or stopped worker).
    pub io_timeout: Duration,
    /// TLS on every link (the hello with the token then travels encrypted); `None`: plain TCP.
    pub tls: Option<RingTls>,
}

/// TLS of the ring's links: each rank is the server of the link from its previous rank and
/// the client of the link to its next one.
#[derive(Clone, Debug)]
pub struct RingTls {
    /// This rank's certificate and key, for the link it accepts.
    pub server: Arc<ServerConfig>,
    /// The roots the next rank's certificate is checked against.
    pub client: Arc<ClientConfig>,
    /// The name every rank's certificate carries; `None`: the IP address of its `--ring` entry.
    pub domain: Option<String>,
}

impl RingTls {
    /// From PEM files: this rank's certificate chain `cert` and private key `key` (PKCS#8,
    /// PKCS#1 or SEC1), and the CA certificate(s) `ca` the next rank's certificate must chain
    /// to. Errors name the file.
    pub fn from_pem_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
        domain: Option<String>,
    ) -> Result<RingTls, RingError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |p: &std::path::Path, what: String| {
            RingError::Config(format!("ring TLS: {}: {what}", p.display()))
        };
        let certs = |p: &std::path::Path| -> Result<Vec<CertificateDer<'static>>, RingError> {
            let pem = std::fs::read(p).map_err(|e| bad(p, e.to_string()))?;
            let v = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(p, format!("expected PEM certificates: {e}")))?;
            if v.is_empty() {
                return Err(bad(p, "no PEM certificate in it".into()));
            }
            Ok(v)
        };
        let chain = certs(cert)?;
        let pem = std::fs::read(key).map_err(|e| bad(key, e.to_string()))?;
        let key_der = PrivateKeyDer::from_pem_slice(&pem)
            .map_err(|e| bad(key, format!("expected a PEM private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| RingError::Config(format!("ring TLS: {e}")))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| bad(cert, e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca)? {
            roots.add(c).map_err(|e| bad(ca, e.to_string()))?;
        }
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| RingError::Config(format!("ring TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(RingTls {
            server: Arc::new(server),
            client: Arc::new(client),
            domain,
        })
    }

    fn name_of(&self, addr: SocketAddr) -> Result<ServerName<'static>, RingError> {
        match &self.domain {
            Some(d) => ServerName::try_from(d.clone())
                .map_err(|e| RingError::Config(format!("TLS name {d:?}: {e}"))),
            None => Ok(ServerName::from(addr.ip())),
        }
    }
}

fn tls_err(e: rustls::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// The link's stream after the TLS handshake (driven by the first read or write), or as is.
fn wrap_client(
    s: TcpStream,
    tls: Option<&RingTls>,
    addr: SocketAddr,
) -> Result<Box<dyn Link>, RingError> {
    Ok(match tls {
        None => Box::new(s),
        Some(t) => {
            let conn = ClientConnection::new(Arc::clone(&t.client), t.name_of(addr)?)
                .map_err(|e| RingError::Config(format!("TLS client: {e}")))?;
            Box::new(StreamOwned::new(conn, s))
        }
    })
}

fn wrap_server(s: TcpStream, tls: Option<&RingTls>) -> std::io::Result<Box<dyn Link>> {
    Ok(match tls {
        None => Box::new(s),
        Some(t) => {
            let conn = ServerConnection::new(Arc::clone(&t.server)).map_err(tls_err)?;
            Box::new(StreamOwned::new(conn, s))
        }
    })
}

/// Sets the link's socket options for calls: no delay, `io_timeout` both ways.
fn call_options(s: &TcpStream, io_timeout: Duration) -> std::io::Result<()> {
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(io_timeout))?;
    s.set_write_timeout(Some(io_timeout))
}

fn hello(cfg: &RingConfig) -> Vec<u8> {
    let mut h = Vec::with_capacity(16 + cfg.token.len());
    h.extend_from_slice(&HELLO);
    h.push(VERSION);
    h.extend_from_slice(&(cfg.rank as u32).to_le_bytes());
    h.extend_from_slice(&(cfg.peers.len() as u32).to_le_bytes());
    h.extend_from_slice(&(cfg.token.len() as u16).to_le_bytes());
    h.extend_from_slice(cfg.token.as_bytes());
    h
}

/// Reads a hello and checks it; the reply byte and, on refusal, why.
fn check_hello(s: &mut dyn Link, cfg: &RingConfig) -> std::io::Result<(u8, String)> {
    let mut head = [0u8; 15];
    s.read_exact(&mut head)?;
    let n = cfg.peers.len();
    let want_rank = (cfg.rank + n - 1) % n;
    if head[..4] != HELLO || head[4] != VERSION {
        return Ok((BAD_PLACE, "not a Sparta ring hello of this version".into()));
    }
    let rank = u32::from_le_bytes(head[5..9].try_into().expect("4")) as usize;
    let size = u32::from_le_bytes(head[9..13].try_into().expect("4")) as usize;
    let tlen = u16::from_le_bytes(head[13..15].try_into().expect("2")) as usize;
    let mut token = vec![0u8; tlen];
    s.read_exact(&mut token)?;
    if !bool::from(token.ct_eq(cfg.token.as_bytes())) {
        return Ok((BAD_TOKEN, "wrong token".into()));
    }
    if rank != want_rank || size != n {
        return Ok((
            BAD_PLACE,
            format!("rank {rank} of {size} connected; expected rank {want_rank} of {n}"),
        ));
    }
    Ok((OK, String::new()))
}

/// Forms the ring (see the module docs) on `listener`, which listens on `peers[rank]`.
pub fn form_ring(cfg: &RingConfig, listener: TcpListener) -> Result<Ring, RingError> {
    let n = cfg.peers.len();
    if n == 0 || cfg.rank >= n {
        return Err(RingError::Config(format!(
            "rank {} of a ring of {n}",
            cfg.rank
        )));
    }
    if n == 1 {
        return Ok(Ring::new(0, 1, cfg.compression, None));
    }
    let deadline = Instant::now() + cfg.form_timeout;
    let acfg = cfg.clone();
    let acceptor = std::thread::Builder::new()
        .name("sparta-ring-accept".into())
        .spawn(move || accept_prev(&acfg, &listener, deadline))
        .map_err(|e| RingError::Config(format!("cannot start the ring acceptor: {e}")))?;
    let next = connect_next(cfg, deadline);
    let prev = acceptor
        .join()
        .map_err(|_| RingError::Protocol("the ring acceptor panicked".into()))?;
    let (next, prev) = (next?, prev?);
    tracing::info!(
        "ring formed: rank {} of {n}, compression {:?}, {}",
        cfg.rank,
        cfg.compression,
        if cfg.tls.is_some() {
            "TLS"
        } else {
            "plain TCP"
        }
    );
    Ok(Ring::new(cfg.rank, n, cfg.compression, Some((next, prev))))
}

fn accept_prev(
    cfg: &RingConfig,
    listener: &TcpListener,
    deadline: Instant,
) -> Result<Box<dyn Link>, RingError> {
    let n = cfg.peers.len();
    let prev = (cfg.rank + n - 1) % n;
    listener
        .set_nonblocking(true)
        .map_err(|e| RingError::Config(format!("ring listener: {e}")))?;
    let mut last_refusal = String::new();
    loop {
        match listener.accept() {
            Ok((s, from)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                let tcp = match s.try_clone() {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!("ring: a connection from {from}: {e}");
                        continue;
                    }
                };
                let mut s = match wrap_server(s, cfg.tls.as_ref()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("ring: a connection from {from}: {e}");
                        continue;
                    }
                };
                match check_hello(s.as_mut(), cfg) {
                    Ok((OK, _)) => {
                        if s.write_all(&[OK]).and_then(|_| s.flush()).is_ok()
                            && call_options(&tcp, cfg.io_timeout).is_ok()
                        {
                            return Ok(s);
                        }
                    }
                    Ok((code, why)) => {
                        tracing::warn!("ring: refused a connection from {from}: {why}");
                        let _ = s.write_all(&[code]).and_then(|_| s.flush());
                        last_refusal = why;
                    }
                    Err(e) => tracing::warn!("ring: a connection from {from} failed: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => tracing::warn!("ring: accept failed: {e}"),
        }
        if Instant::now() >= deadline {
            let also = if last_refusal.is_empty() {
                String::new()
            } else {
                format!(" (last refusal: {last_refusal})")
            };
            return Err(RingError::Timeout(format!(
                "rank {prev} did not join before the deadline{also}"
            )));
        }
    }
}

fn connect_next(cfg: &RingConfig, deadline: Instant) -> Result<Box<dyn Link>, RingError> {
    let n = cfg.peers.len();
    let next = (cfg.rank + 1) % n;
    let addr = cfg.peers[next];
    let hello = hello(cfg);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RingError::Timeout(format!(
                "cannot reach rank {next} at {addr} before the deadline"
            )));
        }
        let tcp = match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
            Ok(s) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let opts = tcp
            .set_read_timeout(Some(Duration::from_secs(5)))
            .and_then(|_| tcp.set_write_timeout(Some(Duration::from_secs(5))))
            .and_then(|_| tcp.try_clone());
        let Ok(handle) = opts else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let mut s = wrap_client(tcp, cfg.tls.as_ref(), addr)?;
        let attempt = (|| {
            s.write_all(&hello)?;
            s.flush()?;
            let mut ack = [0u8; 1];
            s.read_exact(&mut ack)?;
            call_options(&handle, cfg.io_timeout)?;
            Ok::<u8, std::io::Error>(ack[0])
        })();
        match attempt.map(|a| (s, a)) {
            Ok((s, OK)) => return Ok(s),
            Ok((_, BAD_TOKEN)) => {
                return Err(RingError::Auth(format!(
                    "rank {next} at {addr} refused this rank's token (every worker needs the \
                     same SPARTA_TOKEN)"
                )))
            }
            Ok((_, _)) => {
                return Err(RingError::Protocol(format!(
                    "rank {next} at {addr} refused this rank's place in the ring (rank {} of \
                     {n}): the worker lists differ",
                    cfg.rank
                )))
            }
            Err(e) if cfg.tls.is_some() && e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(RingError::Auth(format!(
                    "TLS with rank {next} at {addr} failed: {e}"
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
