//! The PS crate's one error type.

use thiserror::Error;

/// Why a shard refuses a request, a change from its primary or an order of the coordinator.
/// An RPC answers it as a status whose code tells the caller what to do ([`Status::from`]).
///
/// [`Status::from`]: tonic::Status
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// Fencing: this copy must not serve or accept it at its role and epoch
    /// (`FailedPrecondition`; a worker's request is rerouted on [`NOT_PRIMARY`]).
    ///
    /// [`NOT_PRIMARY`]: sparta_proto::headers::NOT_PRIMARY
    #[error("{0}")]
    Fenced(String),
    /// A request, a replicated change or a round that cannot be applied as sent
    /// (`InvalidArgument`).
    #[error("{0}")]
    Invalid(String),
    /// Settings that do not fit (placement, peers, a test hook) (`FailedPrecondition`).
    #[error("{0}")]
    Config(String),
    /// A checkpoint round's call that does not fit the round's state (`FailedPrecondition`).
    #[error("{0}")]
    Round(String),
    /// Writing a file failed (an export part) (`Internal`).
    #[error("{0}")]
    Failed(String),
}

impl From<sparta_proto::WireError> for Refusal {
    fn from(e: sparta_proto::WireError) -> Self {
        Refusal::Invalid(e.0)
    }
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Fenced(m) | Refusal::Config(m) | Refusal::Round(m) => {
                tonic::Status::failed_precondition(m)
            }
            Refusal::Invalid(m) => tonic::Status::invalid_argument(m),
            Refusal::Failed(m) => tonic::Status::internal(m),
        }
    }
}

impl From<Refusal> for PsError {
    fn from(r: Refusal) -> Self {
        PsError::Config(r.to_string())
    }
}

/// Everything that can stop a PS shard or the coordinator from starting.
#[derive(Debug, Error)]
pub enum PsError {
    /// Invalid settings; the message names the flag or field.
    #[error("config: {0}")]
    Config(String),
    /// No usable token.
    #[error("auth: {0}")]
    Auth(String),
    /// Building a table failed.
    #[error(transparent)]
    Table(#[from] sparta_table::TableError),
    /// Building the dense model (to size the dense vector) failed.
    #[error(transparent)]
    Nn(#[from] sparta_nn::NnError),
    /// Binding or serving a socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (names the address).
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Restoring or writing a checkpoint failed; the message names the checkpoint and why.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The gRPC server failed.
    #[error("serving: {0}")]
    Serve(String),
    /// Setting up a link (token, TLS, an address) or the metrics endpoint failed.
    #[error(transparent)]
    Proto(#[from] sparta_proto::ProtoError),
}
