//! The shared token every RPC carries (metadata header `x-sparta-token`), and the PS
//! incarnation a worker expects (`x-sparta-incarnation`): a shard refuses a request meant
//! for an earlier start of itself, so a worker never trains on a PS that restarted under it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::error::ProtoError;
use crate::metrics::Metrics;

/// The metadata header carrying the token.
pub const TOKEN_HEADER: &str = "x-sparta-token";
/// The metadata header carrying the incarnation of the shard the worker first connected to.
pub const INCARNATION_HEADER: &str = "x-sparta-incarnation";
/// Start of the status message of a request refused for a restarted shard.
pub const RESTARTED: &str = "restarted";
/// Environment variable read when no token file is given.
pub const TOKEN_ENV: &str = "SPARTA_TOKEN";

/// Loads the token from `file` (trimmed) or, without one, from `SPARTA_TOKEN`.
pub fn load_token(file: Option<&Path>) -> Result<String, ProtoError> {
    let token = match file {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| {
                ProtoError::Auth(format!("cannot read --token-file {}: {e}", p.display()))
            })?
            .trim()
            .to_string(),
        None => std::env::var(TOKEN_ENV)
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    if token.is_empty() {
        return Err(ProtoError::Auth(format!(
            "no token: pass --token-file FILE or set {TOKEN_ENV} (the same on every PS and worker)"
        )));
    }
    if MetadataValue::try_from(token.as_str()).is_err() {
        return Err(ProtoError::Auth(
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
    origin: Option<crate::pb::OriginResponse>,
}

impl CheckToken {
    /// A checker for `token`, counting refusals in `metrics`.
    pub fn new(token: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            token: token.into(),
            metrics,
            origin: None,
        }
    }

    /// Also refuses requests that expect another incarnation than `origin`'s (`Aborted`,
    /// with a message starting with [`RESTARTED`] that says where this start came from).
    pub fn with_origin(mut self, origin: crate::pb::OriginResponse) -> Self {
        self.origin = Some(origin);
        self
    }

    fn check_incarnation(&self, req: &Request<()>) -> Result<(), Status> {
        let (Some(o), Some(v)) = (&self.origin, req.metadata().get(INCARNATION_HEADER)) else {
            return Ok(());
        };
        let expected = v.to_str().ok().and_then(|v| v.parse::<u64>().ok());
        if expected.is_none_or(|e| e == 0 || e == o.incarnation) {
            return Ok(());
        }
        Err(Status::aborted(restarted_message(o)))
    }
}

/// What a shard found restarted says about itself: `restarted empty` or `restarted from
/// checkpoint ckpt-… at step N`.
pub fn restarted_message(o: &crate::pb::OriginResponse) -> String {
    if o.resumed_from == 0 {
        format!("{RESTARTED} empty")
    } else {
        format!(
            "{RESTARTED} from checkpoint {} at step {}",
            sparta_checkpoint::CheckpointId(o.resumed_from),
            o.resumed_step
        )
    }
}

impl tonic::service::Interceptor for CheckToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match req.metadata().get(TOKEN_HEADER) {
            Some(v) if same(v.as_bytes(), self.token.as_bytes()) => {
                self.check_incarnation(&req)?;
                Ok(req)
            }
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

/// Client-side: adds the token to every request, and the incarnation of the shard first
/// connected to once it is known.
#[derive(Clone)]
pub struct AddToken {
    value: MetadataValue<tonic::metadata::Ascii>,
    incarnation: Arc<AtomicU64>,
    /// Failover: the shard every request is for, and the epoch of its primary expected.
    copy: Option<(u32, Arc<AtomicU64>)>,
}

impl AddToken {
    /// Adds `token` (checked by [`load_token`]).
    pub fn new(token: &str) -> Result<Self, ProtoError> {
        let value = MetadataValue::try_from(token)
            .map_err(|_| ProtoError::Auth("the token must be printable ASCII".into()))?;
        Ok(Self {
            value,
            incarnation: Arc::new(AtomicU64::new(0)),
            copy: None,
        })
    }

    /// The same token with its own expected incarnation (one per shard).
    pub fn for_shard(&self) -> Self {
        Self {
            value: self.value.clone(),
            incarnation: Arc::new(AtomicU64::new(0)),
            copy: None,
        }
    }

    /// [`AddToken::for_shard`] naming the shard in every request (`x-sparta-shard`) and the
    /// epoch of its primary (`x-sparta-epoch`, see [`AddToken::expect_epoch`]): a cluster
    /// with failover, where one process holds copies of several shards.
    pub fn for_copy(&self, shard: u32, epoch: u64) -> Self {
        Self {
            value: self.value.clone(),
            incarnation: Arc::new(AtomicU64::new(0)),
            copy: Some((shard, Arc::new(AtomicU64::new(epoch)))),
        }
    }

    /// From now on every request expects the shard's primary of `epoch` or newer.
    pub fn expect_epoch(&self, epoch: u64) {
        if let Some((_, e)) = &self.copy {
            e.store(epoch, Relaxed);
        }
    }

    /// From now on every request expects the shard instance `incarnation` (0: any).
    pub fn expect_incarnation(&self, incarnation: u64) {
        self.incarnation.store(incarnation, Relaxed);
    }
}

impl tonic::service::Interceptor for AddToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(TOKEN_HEADER, self.value.clone());
        let inc = self.incarnation.load(Relaxed);
        if inc != 0 {
            req.metadata_mut()
                .insert(INCARNATION_HEADER, MetadataValue::from(inc));
        }
        if let Some((shard, epoch)) = &self.copy {
            let m = req.metadata_mut();
            m.insert(crate::headers::SHARD_HEADER, MetadataValue::from(*shard));
            m.insert(
                crate::headers::EPOCH_HEADER,
                MetadataValue::from(epoch.load(Relaxed)),
            );
        }
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
    fn a_request_for_another_incarnation_is_refused_as_restarted() {
        use tonic::service::Interceptor;
        let origin = crate::pb::OriginResponse {
            incarnation: 77,
            resumed_from: 3,
            resumed_step: 40,
        };
        let mut check = CheckToken::new("t", Arc::new(Metrics::new("ps"))).with_origin(origin);
        let add = AddToken::new("t").unwrap().for_shard();
        // Before the worker knows the incarnation, nothing is checked.
        let req = add.clone().call(Request::new(())).unwrap();
        assert!(check.call(req).is_ok());
        add.expect_incarnation(77);
        let req = add.clone().call(Request::new(())).unwrap();
        assert!(check.call(req).is_ok());
        add.expect_incarnation(76);
        let req = add.clone().call(Request::new(())).unwrap();
        let e = check.call(req).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        assert_eq!(
            e.message(),
            "restarted from checkpoint ckpt-0000000000000003 at step 40"
        );
        // Another shard's interceptor expects its own instance.
        let other = add.for_shard();
        let req = other.clone().call(Request::new(())).unwrap();
        assert!(check.call(req).is_ok());
    }

    #[test]
    fn comparison_is_exact() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
