//! The blob layer of Sparta: what `sparta-data` (object inputs) and `sparta-checkpoint`
//! (object checkpoint locations) share to reach object storage.
//!
//! * [`url`] - the one parser of object URLs (`s3://bucket/key`, `file:///abs/path`):
//!   scheme, store ([`StoreId`]) and key; [`split_url`] tells a URL from a local path.
//! * [`retry`] - [`Backoff`]: attempts and exponential waits (on the `backon` crate), for
//!   blocking callers and, with `object-store`, async ones.
//! * `runtime` (feature `object-store`) - `BlockingRuntime`: the small tokio runtime through
//!   which sync code calls `object_store`.
//! * `store` (feature `object-store`) - `object_store` clients from the `AWS_*` environment
//!   (S3 and S3-compatible services) and for the local file system; which errors are
//!   transient.
//! * [`error`] - [`BlobError`], the crate's one error type; every error about an object
//!   names its URL.
//!
//! Without the `object-store` feature the crate is the URL parser and the blocking retries
//! only (no `object_store`, no tokio), which both users need in every build.

pub mod error;
pub mod retry;
#[cfg(feature = "object-store")]
pub mod runtime;
#[cfg(feature = "object-store")]
pub mod store;
pub mod url;

pub use error::{BlobError, Result, UrlError};
pub use retry::Backoff;
#[cfg(feature = "object-store")]
pub use runtime::BlockingRuntime;
pub use url::{is_url, split_url, ObjectUrl, StoreId};

/// The `object_store` crate this layer is built on, for the users' own requests.
#[cfg(feature = "object-store")]
pub use object_store;
