//! Request headers beside the token (see [`crate::auth`] for the token, the incarnation and its `RESTARTED` refusal), and
//! the message prefixes of refusals the workers act on.

use tonic::metadata::MetadataMap;

/// Request header: the shard a request is for (a process holds copies of several).
pub const SHARD_HEADER: &str = "x-sparta-shard";
/// Request header: the epoch of the shard's primary the worker believes in (0: any).
pub const EPOCH_HEADER: &str = "x-sparta-epoch";
/// The start of a refusal by a copy that is not (or no longer) the shard's primary: the
/// worker asks the coordinator where the primary is and retries there.
pub const NOT_PRIMARY: &str = "not the primary:";
/// The start of a refusal of a push carrying NaN or infinite gradients (`InvalidArgument`):
/// the worker reports the step as diverged instead of retrying.
pub const NON_FINITE: &str = "non-finite gradients";

/// A `u64` request header, when present and numeric.
pub fn header(meta: &MetadataMap, name: &str) -> Option<u64> {
    meta.get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}
