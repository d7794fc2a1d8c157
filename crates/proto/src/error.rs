//! The protocol crate's one error type.

use thiserror::Error;

/// What can go wrong setting up a link of the cluster (token, TLS, an address) or serving
/// its metrics.
#[derive(Debug, Error)]
pub enum ProtoError {
    /// Invalid settings; the message names the flag.
    #[error("config: {0}")]
    Config(String),
    /// No usable token.
    #[error("auth: {0}")]
    Auth(String),
    /// Reading a file or binding a socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (names the file or address).
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An address that is no gRPC endpoint, or a TLS setting it refuses.
    #[error("{0}")]
    Endpoint(String),
}

/// A message that does not decode (packed bytes of the wrong length, an unknown enum value).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct WireError(pub String);

impl From<WireError> for tonic::Status {
    /// A message that does not decode is the sender's mistake: `InvalidArgument`.
    fn from(e: WireError) -> Self {
        tonic::Status::invalid_argument(e.0)
    }
}
