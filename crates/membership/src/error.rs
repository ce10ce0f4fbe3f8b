//! The one error type of the crate. Every variant names where it happened (the endpoint or
//! endpoints, and the call) so a log line alone says which etcd misbehaved and how.

use std::time::Duration;

/// A boxed underlying cause (an I/O or hyper error, a JSON or base64 error).
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a call to etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// The endpoint list is unusable (empty, malformed, or a scheme we do not speak).
    #[error("etcd endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// No endpoint could be reached (refused, reset, closed before answering).
    #[error("etcd unreachable at {endpoints} ({call}): {source}")]
    Unreachable {
        endpoints: String,
        call: &'static str,
        #[source]
        source: Cause,
    },
    /// The last endpoint tried did not answer within the deadline.
    #[error("etcd at {endpoints} did not answer {call} within {timeout:?}")]
    Timeout { endpoints: String, call: &'static str, timeout: Duration },
    /// etcd answered with an error status; `message` is etcd's own.
    #[error("etcd at {endpoint} answered {call} with HTTP {status}: {message}")]
    Status { endpoint: String, call: &'static str, status: u16, message: String },
    /// The answer was not what the gateway documents.
    #[error("malformed answer from etcd at {endpoint} to {call}: {reason}")]
    Malformed {
        endpoint: String,
        call: &'static str,
        reason: String,
        #[source]
        source: Option<Cause>,
    },
    /// etcd cancelled the watch or reported an error on its stream (a compacted start
    /// revision, a lost leader): the watcher must start again from a fresh range.
    #[error("watch at {endpoint} failed: {reason}")]
    WatchFailed { endpoint: String, reason: String },
}

impl MembershipError {
    /// Whether this is a timeout (a watch that merely saw nothing, or an etcd that is slow).
    pub fn is_timeout(&self) -> bool {
        matches!(self, MembershipError::Timeout { .. })
    }
}
