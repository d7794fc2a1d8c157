//! `object_store` clients for parsed URLs: S3 (and S3-compatible services) configured from the
//! environment, and the local file system.
//!
//! [`s3`] starts from the standard `AWS_*` environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` / `AWS_DEFAULT_REGION`,
//! `AWS_ENDPOINT`, `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint, ...), read when the client
//! is built, then applies the overrides of [`S3Options`]. Building a client sends no request:
//! credentials and a missing bucket surface on the first operation.
//!
//! [`is_transient`] tells the errors worth retrying (the store unreachable, overloaded, a
//! timeout) from those that will not go away (not found, access denied, a changed object).

use std::path::Path;
use std::sync::Arc;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use crate::error::BlobError;
use crate::url::StoreId;

/// Overrides of the `AWS_*` environment for an S3 client; the default overrides nothing.
#[derive(Clone, Debug, Default)]
pub struct S3Options {
    /// S3 endpoint (an S3-compatible service such as MinIO or moto); `None`: `AWS_ENDPOINT`
    /// or AWS itself.
    pub endpoint: Option<String>,
    /// Access key id and secret; `None`: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`.
    pub credentials: Option<(String, String)>,
    /// Region; `None`: `AWS_REGION` / `AWS_DEFAULT_REGION`.
    pub region: Option<String>,
    /// Allow a plain-HTTP endpoint (also `AWS_ALLOW_HTTP=true`).
    pub allow_http: bool,
    /// The client's own retries of single requests; `None`: `object_store`'s defaults.
    pub client_retry: Option<object_store::RetryConfig>,
}

/// An S3 client for `bucket` from the environment and `opts` (see the module docs). The
/// error names `s3://bucket`.
pub fn s3(bucket: &str, opts: &S3Options) -> Result<AmazonS3, BlobError> {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Some(r) = &opts.client_retry {
        b = b.with_retry(r.clone());
    }
    if let Some(e) = &opts.endpoint {
        b = b.with_endpoint(e);
    }
    if let Some((k, s)) = &opts.credentials {
        b = b.with_access_key_id(k).with_secret_access_key(s);
    }
    if let Some(r) = &opts.region {
        b = b.with_region(r);
    }
    if opts.allow_http {
        b = b.with_allow_http(true);
    }
    b.build().map_err(|source| BlobError::Store {
        url: format!("s3://{bucket}"),
        source,
    })
}

/// The local file system with keys relative to the directory `root` (which must exist). The
/// error names `file://root`.
pub fn local_fs_at(root: &Path) -> Result<LocalFileSystem, BlobError> {
    LocalFileSystem::new_with_prefix(root).map_err(|source| BlobError::Store {
        url: format!("file://{}", root.display()),
        source,
    })
}

/// A client for the store of a parsed URL: [`s3`] for a bucket, the whole local file system
/// (keys are absolute paths without their `/`) for `file://`.
pub fn open(store: &StoreId, opts: &S3Options) -> Result<Arc<dyn ObjectStore>, BlobError> {
    Ok(match store {
        StoreId::S3 { bucket } => Arc::new(s3(bucket, opts)?),
        StoreId::File => Arc::new(LocalFileSystem::new()),
    })
}

/// Whether an error may go away by itself (the store unreachable, overloaded, a timeout):
/// everything but not found, access denied, a failed precondition (a changed object), an
/// invalid path and the unsupported.
pub fn is_transient(e: &object_store::Error) -> bool {
    !matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotModified { .. }
            | object_store::Error::InvalidPath { .. }
            | object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented
            | object_store::Error::UnknownConfigurationKey { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::url::ObjectUrl;

    #[test]
    fn stores_open_without_contacting_anything() {
        let opts = S3Options {
            endpoint: Some("http://127.0.0.1:9".into()),
            credentials: Some(("k".into(), "s".into())),
            region: Some("us-east-1".into()),
            allow_http: true,
            client_retry: None,
        };
        let url = ObjectUrl::parse("s3://bkt/logs/").unwrap();
        let s = open(&url.store, &opts).unwrap();
        assert!(s.to_string().contains("bkt"), "{s}");
        let f = open(&ObjectUrl::parse("file:///tmp").unwrap().store, &opts).unwrap();
        assert!(f.to_string().contains("LocalFileSystem"), "{f}");
        let dir = std::env::temp_dir();
        assert!(local_fs_at(&dir).is_ok());
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let nf = object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        };
        assert!(!is_transient(&nf));
        let other = object_store::Error::Generic {
            store: "S3",
            source: "connection reset".into(),
        };
        assert!(is_transient(&other));
    }
}
