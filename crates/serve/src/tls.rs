//! HTTPS: a rustls server config from PEM files (the ring provider, the one tonic's TLS
//! already compiles), and a [`TlsListener`] that hands `axum::serve` connections whose
//! handshake is done. Handshakes run in their own tasks (at most [`MAX_HANDSHAKES`] at once,
//! each within [`HANDSHAKE_TIMEOUT`]), so a slow or silent client never holds up the others.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::error::ServeError;

/// Longest wait for a client to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress at once (further connections wait in the kernel's backlog).
pub const MAX_HANDSHAKES: usize = 256;

/// A server config for the PEM certificate chain `cert` and private key `key` (PKCS#8,
/// PKCS#1 or SEC1), offering HTTP/1.1 over ALPN.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, ServeError> {
    let bad = |flag: &str, p: &Path, what: String| {
        ServeError::Tls(format!("{flag} {}: {what}", p.display()))
    };
    let pem = std::fs::read(cert).map_err(|e| bad("--tls-cert", cert, format!("{e}")))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            bad(
                "--tls-cert",
                cert,
                format!("expected PEM certificates: {e}"),
            )
        })?;
    if chain.is_empty() {
        return Err(bad(
            "--tls-cert",
            cert,
            "no certificate in it (expected PEM `BEGIN CERTIFICATE` blocks)".into(),
        ));
    }
    let pem = std::fs::read(key).map_err(|e| bad("--tls-key", key, format!("{e}")))?;
    let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        bad(
            "--tls-key",
            key,
            format!("expected a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(format!("TLS protocol versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            ServeError::Tls(format!(
                "--tls-cert {} with --tls-key {}: {e}",
                cert.display(),
                key.display()
            ))
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepted TCP connections, handed on once their TLS handshake succeeded.
pub struct TlsListener {
    done: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `tcp` (on the current runtime). Dropping the listener stops the
    /// accept loop and the handshakes in progress.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, done) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, TlsAcceptor::from(config), tx));
        Ok(Self { done, local })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&slots).acquire_owned() => p.expect("the semaphore is never closed"),
            _ = tx.closed() => return,
        };
        let (stream, peer) = tokio::select! {
            r = tcp.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = tx.closed() => return,
        };
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let shake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
            let tls = tokio::select! {
                r = shake => r,
                _ = tx.closed() => return,
            };
            drop(permit);
            match tls {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!("TLS handshake with {peer} failed: {e}"),
                Err(_) => tracing::debug!(
                    "TLS handshake with {peer}: no answer within {HANDSHAKE_TIMEOUT:?}"
                ),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.done.recv().await {
            Some(c) => c,
            // The accept loop ends only once this receiver is gone: never reached.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_pem_files_and_names_the_flag_of_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let (cert, key) = (d.join("c.pem"), d.join("k.pem"));
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.key_pair.serialize_pem()).unwrap();
        let config = server_config(&cert, &key).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);

        let err = |c: &Path, k: &Path| server_config(c, k).unwrap_err().to_string();
        let e = err(&d.join("missing"), &key);
        assert!(e.starts_with("--tls-cert "), "{e}");
        let e = err(&key, &key);
        assert!(
            e.contains("--tls-cert") && e.contains("no certificate"),
            "{e}"
        );
        let e = err(&cert, &cert);
        assert!(e.contains("--tls-key") && e.contains("private key"), "{e}");
        // A key that is not the certificate's.
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(d.join("other.pem"), other.serialize_pem()).unwrap();
        let e = err(&cert, &d.join("other.pem"));
        assert!(e.contains("--tls-cert") && e.contains("--tls-key"), "{e}");
    }
}
