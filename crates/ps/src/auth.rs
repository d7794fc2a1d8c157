//! The shared token every RPC carries (metadata header `x-sparta-token`).

use std::path::Path;
use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::error::PsError;
use crate::metrics::Metrics;

/// The metadata header carrying the token.
pub const TOKEN_HEADER: &str = "x-sparta-token";
/// Environment variable read when no token file is given.
pub const TOKEN_ENV: &str = "SPARTA_TOKEN";

/// Loads the token from `file` (trimmed) or, without one, from `SPARTA_TOKEN`.
pub fn load_token(file: Option<&Path>) -> Result<String, PsError> {
    let token = match file {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| PsError::Auth(format!("cannot read --token-file {}: {e}", p.display())))?
            .trim()
            .to_string(),
        None => std::env::var(TOKEN_ENV)
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    if token.is_empty() {
        return Err(PsError::Auth(format!(
            "no token: pass --token-file FILE or set {TOKEN_ENV} (the same on every PS and worker)"
        )));
    }
    if MetadataValue::try_from(token.as_str()).is_err() {
        return Err(PsError::Auth(
            "the token must be printable ASCII (it travels in a gRPC header)".into(),
        ));
    }
    Ok(token)
}

/// Compares without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Server-side check: refuses requests without the right token with `Unauthenticated`.
#[derive(Clone)]
pub struct CheckToken {
    token: Arc<str>,
    metrics: Arc<Metrics>,
}

impl CheckToken {
    /// A checker for `token`, counting refusals in `metrics`.
    pub fn new(token: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            token: token.into(),
            metrics,
        }
    }
}

impl tonic::service::Interceptor for CheckToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match req.metadata().get(TOKEN_HEADER) {
            Some(v) if same(v.as_bytes(), self.token.as_bytes()) => Ok(req),
            Some(_) => {
                self.metrics.auth_failure();
                Err(Status::unauthenticated(
                    "wrong token (x-sparta-token); use the cluster's --token-file / SPARTA_TOKEN",
                ))
            }
            None => {
                self.metrics.auth_failure();
                Err(Status::unauthenticated(
                    "missing token (x-sparta-token); use the cluster's --token-file / SPARTA_TOKEN",
                ))
            }
        }
    }
}

/// Client-side: adds the token to every request.
#[derive(Clone)]
pub struct AddToken {
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl AddToken {
    /// Adds `token` (checked by [`load_token`]).
    pub fn new(token: &str) -> Result<Self, PsError> {
        let value = MetadataValue::try_from(token)
            .map_err(|_| PsError::Auth("the token must be printable ASCII".into()))?;
        Ok(Self { value })
    }
}

impl tonic::service::Interceptor for AddToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(TOKEN_HEADER, self.value.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_is_trimmed_and_empty_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "s3cret\n").unwrap();
        assert_eq!(load_token(Some(&p)).unwrap(), "s3cret");
        std::fs::write(&p, "  \n").unwrap();
        assert!(load_token(Some(&p))
            .unwrap_err()
            .to_string()
            .contains("no token"));
        assert!(load_token(Some(&dir.path().join("missing"))).is_err());
    }

    #[test]
    fn comparison_is_exact() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
