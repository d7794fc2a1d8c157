//! Who may call the API: a shared bearer token (`Authorization: Bearer <token>`) required on
//! every route but `GET /health`, and the rule that a server without one listens on loopback
//! only unless told otherwise.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;

use axum::http::{header, HeaderValue};
use subtle::ConstantTimeEq;

use crate::error::ServeError;

/// Environment variable read when no `--token-file` is given.
pub const TOKEN_ENV: &str = "SPARTA_SERVE_TOKEN";

/// The `WWW-Authenticate` challenge of a 401 without (usable) credentials.
pub const CHALLENGE_MISSING: &str = "Bearer realm=\"sparta\"";
/// The `WWW-Authenticate` challenge of a 401 with a wrong token (RFC 6750 §3.1).
pub const CHALLENGE_WRONG: &str = "Bearer realm=\"sparta\", error=\"invalid_token\"";

/// The token every request but `GET /health` must carry.
#[derive(Clone)]
pub struct BearerToken(Arc<str>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

/// Why a request was refused with 401.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer ...` header.
    Missing,
    /// A bearer token that is not the server's.
    Wrong,
}

impl Refusal {
    /// The `{"error": ...}` text.
    pub fn reason(self) -> String {
        match self {
            Refusal::Missing => format!(
                "missing bearer token: send Authorization: Bearer <token> (the server's --token-file / {TOKEN_ENV})"
            ),
            Refusal::Wrong => format!(
                "wrong bearer token: send the server's --token-file / {TOKEN_ENV} as Authorization: Bearer <token>"
            ),
        }
    }

    /// The `WWW-Authenticate` header value.
    pub fn challenge(self) -> &'static str {
        match self {
            Refusal::Missing => CHALLENGE_MISSING,
            Refusal::Wrong => CHALLENGE_WRONG,
        }
    }
}

impl BearerToken {
    /// A token from its text: trimmed, non-empty, printable ASCII without spaces. `origin`
    /// names where it came from in the error.
    pub fn new(text: &str, origin: &str) -> Result<Self, ServeError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(ServeError::Auth(format!(
                "{origin} is empty: expected the bearer token (printable ASCII, no spaces)"
            )));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ServeError::Auth(format!(
                "{origin}: the token must be printable ASCII without spaces (it travels in an Authorization: Bearer header)"
            )));
        }
        Ok(Self(t.into()))
    }

    /// The server's token: read from `file` (trimmed) when given, else from `env` (the value
    /// of [`TOKEN_ENV`], when set). `Ok(None)`: neither, no authentication. A file or a set
    /// variable that holds no token is an error, never an open server.
    pub fn load(file: Option<&Path>, env: Option<&str>) -> Result<Option<Self>, ServeError> {
        if let Some(p) = file {
            let text = std::fs::read_to_string(p).map_err(|e| {
                ServeError::Auth(format!("cannot read --token-file {}: {e}", p.display()))
            })?;
            return Self::new(&text, &format!("--token-file {}", p.display())).map(Some);
        }
        env.map(|v| Self::new(v, TOKEN_ENV)).transpose()
    }

    /// Checks an `Authorization` header: the `Bearer` scheme (any case) and this token,
    /// compared in constant time.
    pub fn check(&self, authorization: Option<&HeaderValue>) -> Result<(), Refusal> {
        let presented = authorization
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim_start())
            .ok_or(Refusal::Missing)?;
        if bool::from(presented.as_bytes().ct_eq(self.0.as_bytes())) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }

    /// Checks the `Authorization` header of `headers`.
    pub fn check_headers(&self, headers: &axum::http::HeaderMap) -> Result<(), Refusal> {
        self.check(headers.get(header::AUTHORIZATION))
    }
}

/// Whether every address `listen` (`host:port`) resolves to is a loopback one (127.0.0.0/8,
/// `::1`, IPv4-mapped loopback; `localhost` when it resolves there).
pub fn listen_is_loopback(listen: &str) -> Result<bool, ServeError> {
    let addrs: Vec<SocketAddr> = listen
        .to_socket_addrs()
        .map_err(|e| {
            ServeError::Usage(format!(
                "--listen {listen}: expected host:port (e.g. 127.0.0.1:8080): {e}"
            ))
        })?
        .collect();
    Ok(!addrs.is_empty() && addrs.iter().all(|a| a.ip().to_canonical().is_loopback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn checks_the_bearer_scheme_and_the_exact_token() {
        let t = BearerToken::new("s3cret", "test").unwrap();
        assert_eq!(t.check(Some(&hv("Bearer s3cret"))), Ok(()));
        assert_eq!(t.check(Some(&hv("bearer s3cret"))), Ok(()));
        assert_eq!(t.check(Some(&hv("Bearer   s3cret"))), Ok(()));
        assert_eq!(t.check(None), Err(Refusal::Missing));
        assert_eq!(t.check(Some(&hv("s3cret"))), Err(Refusal::Missing));
        assert_eq!(t.check(Some(&hv("Basic s3cret"))), Err(Refusal::Missing));
        assert_eq!(t.check(Some(&hv("Bearer s3cre"))), Err(Refusal::Wrong));
        assert_eq!(t.check(Some(&hv("Bearer s3cret2"))), Err(Refusal::Wrong));
        assert_eq!(t.check(Some(&hv("Bearer S3CRET"))), Err(Refusal::Wrong));
        assert_eq!(t.check(Some(&hv("Bearer "))), Err(Refusal::Missing));
        assert_eq!(t.check(Some(&hv("Bearer s3cret x"))), Err(Refusal::Wrong));
        let bytes = HeaderValue::from_bytes(b"Bearer s3cr\xe9t").unwrap();
        assert_eq!(t.check(Some(&bytes)), Err(Refusal::Missing));
    }

    #[test]
    fn a_token_is_trimmed_non_empty_printable_ascii() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "  s3cret\n").unwrap();
        let t = BearerToken::load(Some(&p), Some("ignored"))
            .unwrap()
            .unwrap();
        assert_eq!(t.check(Some(&hv("Bearer s3cret"))), Ok(()));
        std::fs::write(&p, " \n").unwrap();
        let e = BearerToken::load(Some(&p), None).unwrap_err().to_string();
        assert!(e.contains("--token-file") && e.contains("empty"), "{e}");
        let e = BearerToken::load(Some(&dir.path().join("missing")), None).unwrap_err();
        assert!(e.to_string().contains("cannot read --token-file"), "{e}");
        assert!(BearerToken::load(None, None).unwrap().is_none());
        let t = BearerToken::load(None, Some("abc\n")).unwrap().unwrap();
        assert_eq!(t.check(Some(&hv("Bearer abc"))), Ok(()));
        let e = BearerToken::load(None, Some("")).unwrap_err().to_string();
        assert!(e.contains(TOKEN_ENV) && e.contains("empty"), "{e}");
        for bad in ["two words", "tab\there", "caf\u{e9}"] {
            let e = BearerToken::new(bad, "t").unwrap_err().to_string();
            assert!(e.contains("printable ASCII"), "{bad}: {e}");
        }
        assert!(!format!("{:?}", BearerToken::new("s3cret", "t").unwrap()).contains("s3cret"));
    }

    #[test]
    fn loopback_addresses() {
        for a in ["127.0.0.1:0", "127.3.2.1:80", "[::1]:8080", "localhost:0"] {
            assert!(listen_is_loopback(a).unwrap(), "{a}");
        }
        for a in ["0.0.0.0:8080", "[::]:8080", "10.1.2.3:80", "192.168.0.1:80"] {
            assert!(!listen_is_loopback(a).unwrap(), "{a}");
        }
        assert!(listen_is_loopback("[::ffff:127.0.0.1]:80").unwrap());
        let e = listen_is_loopback("no-port").unwrap_err().to_string();
        assert!(e.contains("--listen no-port"), "{e}");
    }
}
