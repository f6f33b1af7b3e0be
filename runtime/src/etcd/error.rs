//! What went wrong talking to etcd ([`EtcdError`]), and which failures are worth another endpoint.

use std::path::PathBuf;
use std::time::Duration;

use tonic::Code;

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no etcd endpoints given")]
    NoEndpoints,
    #[error("invalid etcd endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("cannot read TLS file {}: {source}", path.display())]
    TlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Every endpoint was tried and none answered; `source` is the last failure.
    #[error("etcd unavailable (tried {endpoints}): {source}")]
    Unavailable {
        endpoints: String,
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// The revision asked for is older than the last compaction.
    #[error("etcd revision {revision} has been compacted")]
    Compacted {
        revision: i64,
        #[source]
        source: Box<etcd_client::Error>,
    },
    #[error("etcd lease {0:x} has expired")]
    LeaseExpired(i64),
    #[error("no etcd member reports a leader")]
    NoLeader,
    /// etcd answered, with an error that retrying elsewhere would not change.
    #[error("etcd request failed: {0}")]
    Request(#[source] Box<etcd_client::Error>),
}

impl EtcdError {
    /// The endpoint(s) could not serve.
    pub fn unavailable(endpoints: impl Into<String>, source: etcd_client::Error) -> Self {
        EtcdError::Unavailable {
            endpoints: endpoints.into(),
            source: Box::new(source),
        }
    }

    /// An answer that retrying elsewhere would not change (a compacted revision is told apart).
    pub fn request(source: etcd_client::Error) -> Self {
        classify(source, 0)
    }

    /// The gRPC status code etcd answered with, if it answered.
    pub fn code(&self) -> Option<Code> {
        match self {
            EtcdError::Unavailable { source, .. }
            | EtcdError::Compacted { source, .. }
            | EtcdError::Request(source) => grpc_code(source),
            _ => None,
        }
    }

    /// A connection problem: worth retrying later, perhaps elsewhere.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, EtcdError::Unavailable { .. })
    }

    pub fn is_compacted(&self) -> bool {
        matches!(self, EtcdError::Compacted { .. })
    }

    /// The endpoint's host refused the TCP connection: nothing listens there. Unlike a timeout, this is an
    /// answer from the host itself.
    pub fn is_connection_refused(&self) -> bool {
        let source = match self {
            EtcdError::Unavailable { source, .. } | EtcdError::Request(source) => source.as_ref(),
            _ => return false,
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = match source {
            etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
            etcd_client::Error::TransportError(t) => Some(t),
            etcd_client::Error::IoError(io) => Some(io),
            _ => None,
        };
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::ConnectionRefused {
                    return true;
                }
            }
            cause = c.source();
        }
        false
    }

    /// The message etcd gave (e.g. `etcdserver: too many learner members in cluster`), if it answered.
    pub fn server_message(&self) -> Option<&str> {
        match self {
            EtcdError::Unavailable { source, .. }
            | EtcdError::Compacted { source, .. }
            | EtcdError::Request(source) => match source.as_ref() {
                etcd_client::Error::GRpcStatus(s) => Some(s.message()),
                _ => None,
            },
            _ => None,
        }
    }
}

fn grpc_code(e: &etcd_client::Error) -> Option<Code> {
    match e {
        etcd_client::Error::GRpcStatus(s) => Some(s.code()),
        _ => None,
    }
}

/// Whether a failure says "this endpoint cannot serve now" rather than "the request is wrong".
pub(super) fn is_retryable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // A broken stream surfaces as a watch error from etcd-client.
        etcd_client::Error::WatchError(_) => true,
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            // Unknown is what a broken connection becomes; etcd itself answers with specific codes.
            Code::Unavailable | Code::DeadlineExceeded | Code::Unknown => true,
            // tonic's own request timeout.
            Code::Cancelled => s.message().contains("Timeout expired"),
            _ => false,
        },
        _ => false,
    }
}

pub(super) fn is_compaction(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == Code::OutOfRange || s.message().contains("required revision has been compacted"))
}

/// Maps a final (non-retried) failure into the error enum.
pub(super) fn classify(e: etcd_client::Error, revision: i64) -> EtcdError {
    if is_compaction(&e) {
        EtcdError::Compacted {
            revision,
            source: Box::new(e),
        }
    } else {
        EtcdError::Request(Box::new(e))
    }
}

/// The failure a request that got no answer in time stands for.
pub(super) fn timed_out(what: &str, after: Duration) -> etcd_client::Error {
    etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(format!(
        "{what}: no answer within {after:?}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_failures_are_retryable_and_answers_are_not() {
        let s = |c: Code, m: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(c, m));
        assert!(is_retryable(&s(Code::Unavailable, "etcdserver: no leader")));
        assert!(is_retryable(&s(Code::Unknown, "transport error")));
        assert!(is_retryable(&s(Code::Cancelled, "Timeout expired")));
        assert!(!is_retryable(&s(Code::Cancelled, "context canceled")));
        assert!(!is_retryable(&s(Code::InvalidArgument, "bad")));
        assert!(is_compaction(&s(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )));
    }
}
