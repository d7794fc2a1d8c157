//! Forming the ring over TCP. Every rank listens on its own address (the worker list of the
//! job says which), connects to rank `r + 1` (retrying until the deadline: ranks start in any
//! order) and accepts rank `r - 1`. The connecting side sends a hello (magic, protocol
//! version, its rank, the ring size, the job token); the accepting side checks all of it (the
//! token in constant time) and answers one byte. A connection that fails the checks is
//! answered with the reason and dropped, and accepting goes on until the deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use crate::ring::Ring;
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
fn check_hello(s: &mut TcpStream, cfg: &RingConfig) -> std::io::Result<(u8, String)> {
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
    for s in [&next, &prev] {
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(cfg.io_timeout))
            .and_then(|_| s.set_write_timeout(Some(cfg.io_timeout)))
            .map_err(|e| RingError::Config(format!("socket timeouts: {e}")))?;
    }
    tracing::info!(
        "ring formed: rank {} of {n}, compression {:?}",
        cfg.rank,
        cfg.compression
    );
    Ok(Ring::new(cfg.rank, n, cfg.compression, Some((next, prev))))
}

fn accept_prev(
    cfg: &RingConfig,
    listener: &TcpListener,
    deadline: Instant,
) -> Result<TcpStream, RingError> {
    let n = cfg.peers.len();
    let prev = (cfg.rank + n - 1) % n;
    listener
        .set_nonblocking(true)
        .map_err(|e| RingError::Config(format!("ring listener: {e}")))?;
    let mut last_refusal = String::new();
    loop {
        match listener.accept() {
            Ok((mut s, from)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                match check_hello(&mut s, cfg) {
                    Ok((OK, _)) => {
                        if s.write_all(&[OK]).is_ok() {
                            return Ok(s);
                        }
                    }
                    Ok((code, why)) => {
                        tracing::warn!("ring: refused a connection from {from}: {why}");
                        let _ = s.write_all(&[code]);
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

fn connect_next(cfg: &RingConfig, deadline: Instant) -> Result<TcpStream, RingError> {
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
        let attempt = TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))).and_then(
            |mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(&hello)?;
                let mut ack = [0u8; 1];
                s.read_exact(&mut ack)?;
                Ok((s, ack[0]))
            },
        );
        match attempt {
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
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
