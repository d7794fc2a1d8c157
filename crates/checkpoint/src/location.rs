//! Checkpoint locations: one string in the job config names where every process (embedded
//! trainer, PS shards, workers, `sparta checkpoint inspect`) reads and writes checkpoints.
//!
//! | Form | Storage |
//! |------|---------|
//! | `/abs/dir`, `rel/dir` (no scheme) | [`LocalDir`]: temporary file + `fsync` + rename |
//! | `file:///abs/dir` | `ObjectStorage` over `object_store`'s local file system |
//! | `s3://bucket` or `s3://bucket/prefix/path` | `ObjectStorage` on S3 or an S3-compatible store |
//!
//! The `file://` and `s3://` forms need the crate feature `object-store`; without it
//! [`open_storage`] refuses them with an error saying so.
//!
//! `s3://` takes its configuration from the standard environment variables, read when the
//! storage is opened: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION` / `AWS_DEFAULT_REGION`; for S3-compatible services (MinIO, Ceph, ...)
//! `AWS_ENDPOINT=http://host:9000` and, for a plain-HTTP endpoint, `AWS_ALLOW_HTTP=true`
//! (path-style requests are the default; `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true` switches).
//! Opening does not contact the service: errors (credentials, missing bucket) surface on the
//! first operation.
//!
//! `file://` is meant for a directory shared by the processes of one job (one machine or a
//! shared file system) when the object-store code path is wanted; its writes are atomic
//! (staging file + rename) but not `fsync`ed, so the plain-path form is the durable choice
//! for local disks.
//!
//! Opening a location that holds no checkpoints yet is not an error: [`Storage::list`]
//! returns an empty list (plain paths and `file://` directories are created). Callers that
//! want to know whether checkpoints exist call [`crate::list_ids`] or
//! [`crate::newest_valid`] on the opened storage instead of checking that a directory exists.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use sparta_blob::{BlobError, ObjectUrl, StoreId, UrlError};

use crate::error::{CheckpointError, Result};
use crate::storage::{check_blob_name, LocalDir, Storage};

/// A parsed checkpoint location (see the [module docs](self) for the accepted forms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A plain path: a local directory written through [`LocalDir`].
    Local(PathBuf),
    /// `file:///abs/dir`: an absolute directory written through the object-store backend.
    File(PathBuf),
    /// `s3://bucket/prefix`: an S3 (or S3-compatible) bucket and a key prefix (may be empty).
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix without leading or trailing `/` (empty: the bucket root).
        prefix: String,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::File(p) => write!(f, "file://{}", p.display()),
            Location::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Location::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

impl Location {
    /// The local directory of a plain-path or `file://` location; `None` for remote stores.
    pub fn local_path(&self) -> Option<&std::path::Path> {
        match self {
            Location::Local(p) | Location::File(p) => Some(p),
            Location::S3 { .. } => None,
        }
    }
}

const SUPPORTED: &str =
    "supported forms: a directory path, file:///absolute/dir, s3://bucket[/prefix]";

fn bad(location: &str, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Location {
        location: location.to_string(),
        reason: reason.into(),
    }
}

/// Parses a checkpoint location without touching any storage.
///
/// A string is a URL when it starts with `scheme://` (scheme: a letter, then letters, digits,
/// `+`, `-`, `.`); anything else is a plain path. URLs are split by the blob layer's one
/// parser ([`sparta_blob::ObjectUrl`]); the bucket and key-prefix rules of checkpoint
/// locations are checked here.
pub fn parse_location(location: &str) -> Result<Location> {
    if location.is_empty() {
        return Err(bad(location, format!("empty; {SUPPORTED}")));
    }
    if !sparta_blob::is_url(location) {
        return Ok(Location::Local(PathBuf::from(location)));
    }
    let url = ObjectUrl::parse(location).map_err(|e| match e {
        BlobError::Url { kind, .. } => bad(location, url_reason(&kind)),
        other => bad(location, other.to_string()),
    })?;
    match url.store {
        StoreId::File => {
            if url.key.contains(['?', '#', '%']) {
                return Err(bad(
                    location,
                    "file:// paths are taken literally: no query, fragment or %-escapes",
                ));
            }
            Ok(Location::File(PathBuf::from(format!("/{}", url.key))))
        }
        StoreId::S3 { bucket } => {
            let bucket_ok = (3..=63).contains(&bucket.len())
                && bucket
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b));
            if !bucket_ok {
                return Err(bad(location, invalid_bucket(&bucket)));
            }
            let prefix = url.key.trim_end_matches('/');
            if !prefix.is_empty() && check_blob_name(prefix).is_err() {
                return Err(bad(
                    location,
                    format!(
                        "invalid key prefix `{prefix}`: `/`-separated components of \
                         [A-Za-z0-9_.-], no empty, `.` or `..` components"
                    ),
                ));
            }
            Ok(Location::S3 {
                bucket,
                prefix: prefix.to_string(),
            })
        }
    }
}

fn invalid_bucket(bucket: &str) -> String {
    format!(
        "invalid bucket name `{bucket}`: 3-63 characters of [a-z0-9.-] (s3://bucket/optional/prefix)"
    )
}

/// What a checkpoint location's URL error means for the user.
fn url_reason(kind: &UrlError) -> String {
    match kind {
        UrlError::NotAbsolute => "a file:// location needs an absolute path: file:///abs/dir \
                                  (or use the plain path for a relative directory)"
            .to_string(),
        UrlError::NoBucket => invalid_bucket(""),
        UrlError::UnsupportedScheme(other) => {
            format!("unsupported scheme `{other}://`; {SUPPORTED}")
        }
        UrlError::NotAUrl => format!("not a URL; {SUPPORTED}"),
    }
}

/// Opens the checkpoint storage named by a configured checkpoint directory (`[train]
/// checkpoint_dir`, `--checkpoint-dir`, `--resume`): a path, or a `file://` / `s3://` URL
/// kept verbatim in the path.
pub fn open_dir(dir: &std::path::Path) -> Result<Arc<dyn Storage>> {
    open_storage(&dir.to_string_lossy())
}

/// Opens the checkpoint storage at `location` (see the [module docs](self) for the forms).
///
/// Plain paths and `file://` directories are created if missing; `s3://` is configured from
/// the `AWS_*` environment variables and not contacted until the first operation. A location
/// without checkpoints lists as empty.
pub fn open_storage(location: &str) -> Result<Arc<dyn Storage>> {
    let parsed = parse_location(location)?;
    tracing::debug!(%parsed, "opening checkpoint storage");
    open_parsed(location, parsed)
}

#[cfg(feature = "object-store")]
fn open_parsed(_location: &str, parsed: Location) -> Result<Arc<dyn Storage>> {
    use crate::object::ObjectStorage;
    Ok(match parsed {
        Location::Local(dir) => Arc::new(LocalDir::new(dir)?),
        Location::File(dir) => Arc::new(ObjectStorage::local_fs(&dir)?),
        Location::S3 { bucket, prefix } => Arc::new(ObjectStorage::s3_from_env(&bucket, &prefix)?),
    })
}

#[cfg(not(feature = "object-store"))]
fn open_parsed(location: &str, parsed: Location) -> Result<Arc<dyn Storage>> {
    match parsed {
        Location::Local(dir) => Ok(Arc::new(LocalDir::new(dir)?)),
        Location::File(_) | Location::S3 { .. } => Err(bad(
            location,
            "this build has no object-store support (file://, s3://): rebuild with the \
             `object-store` feature of sparta-checkpoint, or use a plain directory path",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: &str, prefix: &str) -> Location {
        Location::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn parses_the_supported_forms() {
        let cases = [
            ("/data/ckpt", Location::Local("/data/ckpt".into())),
            ("runs/a", Location::Local("runs/a".into())),
            ("./odd://name", Location::Local("./odd://name".into())),
            ("C:\\ckpt", Location::Local("C:\\ckpt".into())),
            ("file:///data/ckpt", Location::File("/data/ckpt".into())),
            ("FILE:///x", Location::File("/x".into())),
            ("file://localhost/data", Location::File("/data".into())),
            ("s3://my-bucket", s3("my-bucket", "")),
            ("s3://my-bucket/", s3("my-bucket", "")),
            ("s3://my.bucket/team/run-1/", s3("my.bucket", "team/run-1")),
            ("s3a://bkt/p", s3("bkt", "p")),
        ];
        for (text, want) in cases {
            assert_eq!(parse_location(text).unwrap(), want, "{text}");
        }
        assert_eq!(s3("b-1", "x/y").to_string(), "s3://b-1/x/y");
        assert_eq!(s3("b-1", "").to_string(), "s3://b-1");
        assert_eq!(
            Location::File("/d".into()).local_path(),
            Some(std::path::Path::new("/d"))
        );
        assert_eq!(s3("b-1", "").local_path(), None);
    }

    #[test]
    fn refuses_malformed_and_unknown_locations() {
        for (text, needle) in [
            ("", "empty"),
            ("gs://bucket/x", "unsupported scheme `gs://`"),
            ("http://host/x", "supported forms"),
            ("file://relative/dir", "absolute path"),
            ("file:///a%20b", "literally"),
            ("s3://", "invalid bucket"),
            ("s3://Upper", "invalid bucket"),
            ("s3://ab", "invalid bucket"),
            ("s3://bkt//x", "invalid key prefix"),
            ("s3://bkt/a/../b", "invalid key prefix"),
            ("s3://bkt/sp ace", "invalid key prefix"),
        ] {
            let err = parse_location(text).unwrap_err();
            assert!(
                matches!(err, CheckpointError::Location { .. }),
                "{text}: {err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(needle), "{text}: `{msg}` lacks `{needle}`");
        }
    }

    #[test]
    fn plain_path_opens_a_local_dir_created_on_demand_and_lists_empty() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("not/yet");
        let s = open_storage(root.to_str().unwrap()).unwrap();
        assert!(root.is_dir());
        assert!(s.list("").unwrap().is_empty());
        assert!(crate::list_ids(&*s).unwrap().is_empty());
        assert_eq!(crate::newest_valid(&*s).unwrap(), None);
        s.put("a/b", b"x").unwrap();
        assert_eq!(std::fs::read(root.join("a/b")).unwrap(), b"x");
        assert_eq!(s.location(), root.display().to_string());
    }

    #[cfg(not(feature = "object-store"))]
    #[test]
    fn object_store_locations_need_the_feature() {
        for text in ["file:///tmp/x", "s3://bucket/p"] {
            let msg = open_storage(text).unwrap_err().to_string();
            assert!(msg.contains("no object-store support"), "{msg}");
            assert!(msg.contains("object-store` feature"), "{msg}");
        }
    }

    #[cfg(feature = "object-store")]
    #[test]
    fn object_store_locations_open_without_contacting_anything() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fs-store");
        let url = format!("file://{}", root.display());
        let s = open_storage(&url).unwrap();
        assert!(root.is_dir());
        assert!(s.list("").unwrap().is_empty());
        assert_eq!(s.location(), url);
        // Building the S3 client reads the environment only; no request is sent.
        let s = open_storage("s3://sparta-test-bucket/runs/a").unwrap();
        assert_eq!(s.location(), "s3://sparta-test-bucket/runs/a");
    }
}
