//! The one error type of the blob layer: a malformed object URL, a store that cannot be built
//! or answered with an error, the blocking adapter's runtime.

/// What is wrong with an object URL (see [`crate::url`]). The callers (`sparta-data` inputs,
/// `sparta-checkpoint` locations) word the fix for their users from it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not `scheme://...`.
    #[error("not a URL: expected scheme://...")]
    NotAUrl,
    /// A scheme other than `s3`, `s3a` and `file` (lowercased).
    #[error("unsupported scheme `{0}://`: supported are s3://bucket/key and file:///abs/path")]
    UnsupportedScheme(String),
    /// `s3://` without a bucket.
    #[error("no bucket: expected s3://bucket/key-or-prefix")]
    NoBucket,
    /// `file://` with a relative path (`file://dir/x`: `dir` would be a host).
    #[error("a file:// URL needs an absolute path: file:///abs/path")]
    NotAbsolute,
}

/// Errors of the blob layer. Every variant about an object names its URL.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// A malformed or unsupported object URL.
    #[error("`{url}`: {kind}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong.
        kind: UrlError,
    },
    /// The runtime of the blocking adapter could not be started.
    #[error("object store runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A task run through the blocking adapter panicked or was cancelled (its runtime shut
    /// down).
    #[error("object store task panicked or was cancelled")]
    TaskLost,
    /// The store (its client or a request) failed for an object.
    #[cfg(feature = "object-store")]
    #[error("`{url}`: {source}")]
    Store {
        /// The object (or bucket) URL.
        url: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = BlobError> = std::result::Result<T, E>;
