//! Rings of real TCP connections on loopback, one thread per rank: the average on every rank,
//! bit-identical across ranks (fp32, fp16, bf16), many calls in a row, chunks larger than the
//! socket buffers, a wrong token, mismatched worker lists, and a dead neighbour failing the
//! call instead of hanging it.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use std::sync::Arc;

use sparta_ring::{form_ring, Compression, Ring, RingConfig, RingError, RingTls};

fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

fn config(rank: usize, peers: &[SocketAddr], c: Compression) -> RingConfig {
    RingConfig {
        rank,
        peers: peers.to_vec(),
        token: "tok".into(),
        compression: c,
        form_timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(20),
        tls: None,
    }
}

/// Forms a ring of `n` and runs `f(rank, ring)` on every rank; the results in rank order.
fn on_ring<T: Send>(n: usize, c: Compression, f: impl Fn(usize, &mut Ring) -> T + Sync) -> Vec<T> {
    let (ls, addrs) = listeners(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let (addrs, f) = (&addrs, &f);
                s.spawn(move || {
                    let mut ring = form_ring(&config(r, addrs, c), l).unwrap();
                    f(r, &mut ring)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn vector(rank: usize, call: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = (i * 31 + rank * 7919 + call * 104_729) % 2003;
            (x as f32 - 1001.0) / 337.0
        })
        .collect()
}

#[test]
fn every_rank_gets_the_same_average() {
    for n in 1..=4 {
        for len in [0usize, 1, 3, 5, 1000, 200_003] {
            let calls = 3;
            let got = on_ring(n, Compression::None, |r, ring| {
                (0..calls)
                    .map(|call| {
                        let mut v = vector(r, call, len);
                        ring.allreduce(&mut v).unwrap();
                        v
                    })
                    .collect::<Vec<_>>()
            });
            for (call, first) in got[0].iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..n).map(|r| vector(r, call, len)).collect();
                for (i, &v) in first.iter().enumerate() {
                    let exact: f64 = inputs.iter().map(|v| v[i] as f64).sum::<f64>() / n as f64;
                    assert!(
                        (v as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                        "n {n} len {len} call {call} [{i}]: {v} vs {exact}"
                    );
                }
                for (r, other) in got.iter().enumerate().skip(1) {
                    let same = other[call]
                        .iter()
                        .zip(first)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "n {n} len {len} call {call}: rank {r} differs from rank 0"
                    );
                }
            }
        }
    }
}

#[test]
fn compressed_rings_stay_bit_identical_and_close() {
    for c in [Compression::Fp16, Compression::Bf16] {
        let n = 3;
        let len = 10_007;
        let got = on_ring(n, c, |r, ring| {
            let mut v = vector(r, 0, len);
            ring.allreduce(&mut v).unwrap();
            (v, ring.bytes_sent())
        });
        let tol = if c == Compression::Fp16 { 4e-3 } else { 3e-2 };
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| vector(r, 0, len)).collect();
        for i in 0..len {
            let exact: f64 = inputs.iter().map(|v| v[i] as f64).sum::<f64>() / n as f64;
            let v = got[0].0[i] as f64;
            assert!(
                (v - exact).abs() <= tol * (1.0 + exact.abs()),
                "{c:?} [{i}]: {v} vs {exact}"
            );
        }
        for r in 1..n {
            assert!(got[r]
                .0
                .iter()
                .zip(&got[0].0)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        // 2 (n - 1) chunks of about len / n values, 2 bytes each, plus headers.
        let want = 2 * (n as u64 - 1) * (len as u64 / n as u64) * 2;
        let sent = got[0].1;
        assert!(
            sent >= want && sent <= want + 64 + 8 * len as u64 / 1000,
            "{sent} vs {want}"
        );
    }
}

#[test]
fn a_wrong_token_or_a_different_worker_list_is_refused() {
    let (mut ls, addrs) = listeners(2);
    let l1 = ls.pop().unwrap();
    let l0 = ls.pop().unwrap();
    let mut bad = config(1, &addrs, Compression::None);
    bad.token = "other".into();
    bad.form_timeout = Duration::from_secs(2);
    let mut good = config(0, &addrs, Compression::None);
    good.form_timeout = Duration::from_secs(2);
    let (a, b) = std::thread::scope(|s| {
        let h = s.spawn(move || form_ring(&bad, l1));
        (form_ring(&good, l0), h.join().unwrap())
    });
    let (a, b) = (a.unwrap_err(), b.unwrap_err());
    assert!(
        matches!(a, RingError::Auth(_)) || matches!(b, RingError::Auth(_)),
        "{a} / {b}"
    );
    // Rank 0 of a 3-ring where a 2-ring's rank 1 connects: refused with the reason.
    let (mut ls, addrs) = listeners(3);
    let l0 = ls.remove(0);
    let mut two = config(1, &[addrs[0], addrs[0]], Compression::None);
    two.form_timeout = Duration::from_secs(2);
    let mut three = config(0, &addrs, Compression::None);
    three.form_timeout = Duration::from_secs(2);
    // The 2-ring's rank 1 connects to its "next", rank 0 of the 3-ring.
    let l_two = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = std::thread::scope(|s| {
        let h = s.spawn(move || form_ring(&two, l_two));
        let _ = form_ring(&three, l0);
        h.join().unwrap()
    })
    .unwrap_err();
    assert!(e.to_string().contains("worker lists differ"), "{e}");
}

#[test]
fn a_dead_neighbour_fails_the_call_in_time() {
    let (ls, addrs) = listeners(3);
    let errs = std::thread::scope(|s| {
        let hs: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let addrs = &addrs;
                s.spawn(move || {
                    let mut cfg = config(r, addrs, Compression::None);
                    cfg.io_timeout = Duration::from_secs(2);
                    let mut ring = form_ring(&cfg, l).unwrap();
                    let mut v = vector(r, 0, 50_000);
                    ring.allreduce(&mut v).unwrap();
                    if r == 2 {
                        return None; // dies: its links close
                    }
                    let t = std::time::Instant::now();
                    let e = ring.allreduce(&mut v).unwrap_err();
                    assert!(t.elapsed() < Duration::from_secs(10));
                    Some(e.to_string())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for e in errs.into_iter().flatten() {
        assert!(e.contains("ring link to rank"), "{e}");
    }
}

/// TLS for a ring: a self-signed certificate for `name` (every rank's), trusted through `ca`.
fn tls(cert: &rcgen::CertifiedKey, ca: &rcgen::CertifiedKey, name: &str) -> RingTls {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der())),
        )
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca.cert.der().to_vec()))
        .unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    RingTls {
        server: Arc::new(server),
        client: Arc::new(client),
        domain: Some(name.to_string()),
    }
}

#[test]
fn a_tls_ring_averages_like_a_plain_one_and_refuses_an_untrusted_certificate() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let good = tls(&cert, &cert, "localhost");
    // Three ranks over TLS: the same bits as the plain ring gives.
    let (ls, addrs) = listeners(3);
    let tls_out: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let (addrs, good) = (&addrs, good.clone());
                s.spawn(move || {
                    let mut cfg = config(r, addrs, Compression::None);
                    cfg.tls = Some(good);
                    let mut ring = form_ring(&cfg, l).unwrap();
                    let mut v = vector(r, 0, 100_003);
                    ring.allreduce(&mut v).unwrap();
                    assert!(ring.bytes_received() > 0);
                    v
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let plain = on_ring(3, Compression::None, |r, ring| {
        let mut v = vector(r, 0, 100_003);
        ring.allreduce(&mut v).unwrap();
        v
    });
    assert_eq!(tls_out, plain);
    // Rank 0 trusts another certificate than the one rank 1 presents: rank 0 refuses to go on.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (mut ls, addrs) = listeners(2);
    let (l1, l0) = (ls.pop().unwrap(), ls.pop().unwrap());
    let mut c0 = config(0, &addrs, Compression::None);
    c0.tls = Some(tls(&cert, &other, "localhost"));
    c0.form_timeout = Duration::from_secs(3);
    let mut c1 = config(1, &addrs, Compression::None);
    c1.tls = Some(good);
    c1.form_timeout = Duration::from_secs(3);
    let (a, b) = std::thread::scope(|s| {
        let h = s.spawn(move || form_ring(&c1, l1));
        (form_ring(&c0, l0), h.join().unwrap())
    });
    let a = a.unwrap_err();
    assert!(matches!(a, RingError::Auth(_)), "{a}");
    assert!(a.to_string().contains("TLS"), "{a}");
    assert!(b.is_err());
}
