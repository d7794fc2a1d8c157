//! Classifying a failed call by what happened to the other side (timeout, restart, refused,
//! unreachable, connection lost, TLS and token mistakes): the workers decide whether to retry
//! and the coordinator what to log from the same reading.

use tonic::Code;

use crate::auth::RESTARTED;

/// What a failed call says happened to the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// No answer within the RPC deadline.
    Timeout,
    /// The shard is another process than the one first connected to.
    Restarted,
    /// Nothing listens at the address.
    Refused,
    /// Not reached (DNS, routing, connect timeout, ...).
    Unreachable,
    /// The connection closed or reset under the call (the process stopped or restarted).
    ConnectionLost,
    /// A plain connection failed before the shard ever answered: likely a TLS port.
    PlainToTls,
    /// The TLS handshake failed.
    TlsHandshake,
    /// The shard refused the token.
    Token,
    /// Anything else (the shard answered with an error).
    Other,
}

/// Classifies a failed call. `first_contact_plain`: the shard has not answered this worker
/// yet and the worker talks plain gRPC (only then can a failure mean a TLS port).
pub fn classify(code: Code, message: &str, first_contact_plain: bool) -> Cause {
    let m = message.to_ascii_lowercase();
    let connection = [
        "connection",
        "closed",
        "reset",
        "broken pipe",
        "transport error",
        "h2 protocol error",
        "frame",
        "eof",
        "canceled",
    ]
    .iter()
    .any(|w| m.contains(w));
    match code {
        Code::Unauthenticated if m.contains("token") => Cause::Token,
        Code::Aborted if message.starts_with(RESTARTED) => Cause::Restarted,
        Code::DeadlineExceeded => Cause::Timeout,
        Code::Cancelled if m.contains("timeout expired") => Cause::Timeout,
        _ if m.contains("certificate") || m.contains("handshake") => Cause::TlsHandshake,
        Code::Unavailable if m.contains("refused") => Cause::Refused,
        Code::Unknown | Code::Cancelled | Code::Internal if first_contact_plain => {
            Cause::PlainToTls
        }
        Code::Unavailable if first_contact_plain && connection && !m.contains("connect") => {
            Cause::PlainToTls
        }
        Code::Unavailable if connection && !m.contains("connect") => Cause::ConnectionLost,
        Code::Unavailable => Cause::Unreachable,
        Code::Unknown | Code::Cancelled | Code::Internal if connection => Cause::ConnectionLost,
        _ => Cause::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_what_happened() {
        let c = |code, m: &str| classify(code, m, false);
        assert_eq!(c(Code::Cancelled, "Timeout expired"), Cause::Timeout);
        assert_eq!(c(Code::DeadlineExceeded, "deadline"), Cause::Timeout);
        assert_eq!(
            c(
                Code::Aborted,
                "restarted from checkpoint ckpt-0000000000000002 at step 8"
            ),
            Cause::Restarted
        );
        assert_eq!(
            c(
                Code::Unavailable,
                "tcp connect error: Connection refused (os error 111)"
            ),
            Cause::Refused
        );
        assert_eq!(
            c(Code::Unavailable, "tcp connect error: timed out"),
            Cause::Unreachable
        );
        assert_eq!(
            c(Code::Unknown, "transport error: connection closed"),
            Cause::ConnectionLost
        );
        assert_eq!(
            c(Code::Cancelled, "operation was canceled: connection closed"),
            Cause::ConnectionLost
        );
        assert_eq!(c(Code::Unauthenticated, "wrong token"), Cause::Token);
        assert_eq!(
            c(Code::InvalidArgument, "dense vector mismatch"),
            Cause::Other
        );
        // Only a plain worker's first contact suggests a TLS port.
        assert_eq!(
            classify(
                Code::Internal,
                "h2 protocol error: frame with invalid size",
                true
            ),
            Cause::PlainToTls
        );
        assert_eq!(
            classify(Code::Unknown, "transport error: connection closed", true),
            Cause::PlainToTls
        );
        assert_eq!(
            c(Code::Internal, "h2 protocol error: frame with invalid size"),
            Cause::ConnectionLost
        );
        assert_eq!(
            classify(
                Code::Unavailable,
                "tcp connect error: Connection refused",
                true
            ),
            Cause::Refused
        );
        assert_eq!(
            c(Code::Unknown, "invalid peer certificate"),
            Cause::TlsHandshake
        );
    }
}
