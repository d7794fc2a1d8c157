//! Optional TLS (rustls, through tonic) on the PS gRPC port.
//!
//! A PS presents a certificate + private key (PEM); workers trust a CA certificate (PEM) and
//! check the PS's name against it. The shared token still authenticates every RPC: TLS adds
//! privacy and server authentication on the wire. Metrics and health stay plain HTTP.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::error::ProtoError;

/// A PS's TLS identity.
#[derive(Clone)]
pub struct ServerTls {
    /// Certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// Private key, PEM.
    pub key_pem: Vec<u8>,
}

/// What a worker trusts.
#[derive(Clone)]
pub struct ClientTls {
    /// CA certificate(s), PEM.
    pub ca_pem: Vec<u8>,
    /// Name to check the PS certificate against (default: the host of each PS address).
    pub domain: Option<String>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.write_str("ServerTls { .. }")
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

fn read_pem(path: &Path, flag: &str, marker: &str) -> Result<Vec<u8>, ProtoError> {
    let bytes = std::fs::read(path).map_err(|source| ProtoError::Io {
        what: format!("reading {flag} {}", path.display()),
        source,
    })?;
    if !String::from_utf8_lossy(&bytes).contains(marker) {
        return Err(ProtoError::Config(format!(
            "{flag} {}: not a PEM file with a {marker} block",
            path.display()
        )));
    }
    Ok(bytes)
}

impl ServerTls {
    /// Reads `--tls-cert` and `--tls-key`.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, ProtoError> {
        Ok(Self {
            cert_pem: read_pem(cert, "--tls-cert", "CERTIFICATE")?,
            key_pem: read_pem(key, "--tls-key", "PRIVATE KEY")?,
        })
    }

    /// [`Self::from_files`] when `--tls-cert` and `--tls-key` are both given; `None` (plain
    /// gRPC) otherwise.
    pub fn from_flags(cert: Option<&Path>, key: Option<&Path>) -> Result<Option<Self>, ProtoError> {
        match (cert, key) {
            (Some(c), Some(k)) => Self::from_files(c, k).map(Some),
            _ => Ok(None),
        }
    }

    /// The tonic server config.
    pub fn config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
    }
}

impl ClientTls {
    /// Reads `--tls-ca`.
    pub fn from_file(ca: &Path, domain: Option<String>) -> Result<Self, ProtoError> {
        Ok(Self {
            ca_pem: read_pem(ca, "--tls-ca", "CERTIFICATE")?,
            domain,
        })
    }

    /// [`Self::from_file`] when `--tls-ca` is given; `None` (plain gRPC) otherwise.
    pub fn from_flag(
        ca: Option<&Path>,
        domain: Option<String>,
    ) -> Result<Option<Self>, ProtoError> {
        ca.map(|ca| Self::from_file(ca, domain)).transpose()
    }

    /// The tonic client config for a PS whose address has host `host`.
    pub fn config(&self, host: &str) -> ClientTlsConfig {
        let domain = self.domain.clone().unwrap_or_else(|| host.to_string());
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(domain)
    }
}

/// An endpoint for the gRPC port at `addr`: `https` verified with `tls` (the name checked is
/// `tls.domain`, else the address's host), plain `http` without; `what` names the address in
/// errors (e.g. `--peers`).
pub fn endpoint(addr: &str, tls: Option<&ClientTls>, what: &str) -> Result<Endpoint, ProtoError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let ep = Endpoint::from_shared(uri_of(scheme, addr))
        .map_err(|e| ProtoError::Endpoint(format!("{what} address {addr:?}: {e}")))?;
    match tls {
        Some(tls) => ep
            .tls_config(tls.config(host_of(addr)))
            .map_err(|e| ProtoError::Endpoint(format!("TLS to {what} {addr}: {e}"))),
        None => Ok(ep),
    }
}

/// `addr` (`host:port` or `any://host:port`) as a URI of `scheme` (`http` or `https`).
pub fn uri_of(scheme: &str, addr: &str) -> String {
    let rest = addr.split_once("://").map_or(addr, |(_, r)| r);
    format!("{scheme}://{rest}")
}

/// The host part of `host:port`, `[v6]:port` or `scheme://host:port/...`.
pub fn host_of(addr: &str) -> &str {
    let rest = addr.split_once("://").map_or(addr, |(_, r)| r);
    let rest = rest.split('/').next().unwrap_or(rest);
    if let Some(v6) = rest.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    rest.rsplit_once(':').map_or(rest, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts_are_parsed_from_addresses() {
        assert_eq!(host_of("127.0.0.1:7000"), "127.0.0.1");
        assert_eq!(host_of("ps-0.ps.default.svc:7000"), "ps-0.ps.default.svc");
        assert_eq!(host_of("https://ps-1:7000"), "ps-1");
        assert_eq!(host_of("[::1]:7000"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }
}
