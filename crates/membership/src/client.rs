//! The etcd calls the membership needs, each one POST of JSON to the v3 gateway with a
//! deadline. Endpoints are tried in order, starting from the last one that answered, so a
//! client settles on a live member instead of waiting out a dead one on every call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::error::MembershipError;
use crate::json::{
    b64, error_message, prefix_range_end, unb64, GrantResponse, KeepAliveResult, RangeResponse, StreamLine,
};
use crate::transport::{post, read_all, Answer};
use crate::watch::Watch;

/// An etcd lease id (etcd's int64; never 0, which means "no lease").
pub type LeaseId = i64;

/// A handle on an etcd cluster; cheap to clone (clones share the endpoint preference).
#[derive(Clone)]
pub struct EtcdClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// "host:port", in the order given.
    endpoints: Vec<String>,
    /// The endpoints as errors name them.
    listed: String,
    timeout: Duration,
    /// Where the next call starts: the last endpoint that answered.
    preferred: AtomicUsize,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdClient")
            .field("endpoints", &self.inner.endpoints)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

/// "host:port" out of "host:port" or "http://host:port[/]".
fn authority(endpoint: &str) -> Result<String, MembershipError> {
    let bad = |reason: &str| MembershipError::Endpoint { endpoint: endpoint.to_string(), reason: reason.to_string() };
    let e = endpoint.trim();
    let rest = if let Some(rest) = e.strip_prefix("http://") {
        rest
    } else if e.starts_with("https://") {
        return Err(bad("TLS to etcd is not supported yet: give an http:// endpoint on a trusted network"));
    } else if e.contains("://") {
        return Err(bad("only http:// endpoints are supported"));
    } else {
        e
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') || rest.contains('@') {
        return Err(bad("expected host:port"));
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(bad("expected host:port (the port is required)"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad("expected host:port"));
    }
    Ok(rest.to_string())
}

impl EtcdClient {
    /// endpoints: "host:port" or "http://host:port" (https:// refused with a clear error: TLS
    /// to etcd is not supported yet); several are tried in order until one answers. `timeout`
    /// bounds each call on each endpoint (connect and the whole answer; for a watch, until it
    /// is in place).
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Self, MembershipError> {
        if endpoints.is_empty() {
            return Err(MembershipError::Endpoint { endpoint: String::new(), reason: "no etcd endpoint given".into() });
        }
        let endpoints = endpoints.iter().map(|e| authority(e)).collect::<Result<Vec<_>, _>>()?;
        let listed = endpoints.join(", ");
        Ok(EtcdClient { inner: Arc::new(Inner { endpoints, listed, timeout, preferred: AtomicUsize::new(0) }) })
    }

    /// The deadline of each call.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Grants a lease of `ttl`, in whole seconds rounded up (at least 1; etcd may grant more:
    /// its minimum follows its election timeout).
    pub async fn grant(&self, ttl: Duration) -> Result<LeaseId, MembershipError> {
        let secs = (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1);
        let (endpoint, body) = self.unary("lease grant", "/v3/lease/grant", json!({ "TTL": secs })).await?;
        let r: GrantResponse = parse(&endpoint, "lease grant", &body)?;
        if !r.error.is_empty() {
            return Err(MembershipError::Status { endpoint, call: "lease grant", status: 200, message: r.error });
        }
        if r.id == 0 {
            return Err(malformed(&endpoint, "lease grant", "no lease id"));
        }
        Ok(r.id)
    }

    /// Renews once; Ok(None) when the lease no longer exists.
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, MembershipError> {
        const CALL: &str = "lease keepalive";
        // A stream of one: the gateway answers each request message with a line, then closes.
        let (endpoint, body) = self.unary(CALL, "/v3/lease/keepalive", json!({ "ID": lease.to_string() })).await?;
        let line = body.split(|&b| b == b'\n').find(|l| !l.iter().all(u8::is_ascii_whitespace)).unwrap_or_default();
        let r: StreamLine<KeepAliveResult> = parse(&endpoint, CALL, line)?;
        if let Some(error) = r.error {
            let message = crate::json::message_of(&error).unwrap_or_else(|| error.to_string());
            if is_lease_not_found(&message) {
                return Ok(None);
            }
            return Err(MembershipError::Status { endpoint, call: CALL, status: 200, message });
        }
        let Some(result) = r.result else {
            return Err(malformed(&endpoint, CALL, "neither result nor error"));
        };
        Ok(u64::try_from(result.ttl).ok().filter(|&t| t > 0).map(Duration::from_secs))
    }

    /// Sets `key` to `value`, attached to `lease` when given (the key goes with the lease).
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<LeaseId>) -> Result<(), MembershipError> {
        let mut request = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        if let Some(lease) = lease {
            request["lease"] = json!(lease.to_string());
        }
        self.unary("put", "/v3/kv/put", request).await.map(drop)
    }

    /// Revokes `lease`: every key attached to it is deleted at once.
    pub async fn revoke(&self, lease: LeaseId) -> Result<(), MembershipError> {
        self.unary("lease revoke", "/v3/lease/revoke", json!({ "ID": lease.to_string() })).await.map(drop)
    }

    /// Every key under `prefix` with its value, and the store's revision. Keys that are not
    /// UTF-8 are skipped (membership keys are names this crate wrote).
    pub async fn range_prefix(&self, prefix: &str) -> Result<(i64, Vec<(String, Vec<u8>)>), MembershipError> {
        const CALL: &str = "range";
        let request = json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&prefix_range_end(prefix.as_bytes())) });
        let (endpoint, body) = self.unary(CALL, "/v3/kv/range", request).await?;
        let r: RangeResponse = parse(&endpoint, CALL, &body)?;
        if r.more {
            // No limit is sent, so etcd returns everything; `more` would mean a silent cut.
            return Err(malformed(&endpoint, CALL, "a partial range"));
        }
        let mut kvs = Vec::with_capacity(r.kvs.len());
        for kv in r.kvs {
            let key = unb64(&kv.key).map_err(|e| malformed_by(&endpoint, CALL, "a key that is not base64", e))?;
            let value = unb64(&kv.value).map_err(|e| malformed_by(&endpoint, CALL, "a value that is not base64", e))?;
            match String::from_utf8(key) {
                Ok(key) => kvs.push((key, value)),
                Err(_) => tracing::warn!(revision = kv.mod_revision, "membership: a key that is not UTF-8; skipped"),
            }
        }
        Ok((r.header.revision, kvs))
    }

    /// Watches every key under `prefix` from `start_revision` (0: from now). Returns once
    /// etcd confirmed the watch, within the client's timeout.
    pub async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> Result<Watch, MembershipError> {
        const CALL: &str = "watch";
        let request = json!({ "create_request": {
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_range_end(prefix.as_bytes())),
            "start_revision": start_revision.to_string(),
        }});
        let timeout = self.inner.timeout;
        let (endpoint, answer) = self.reach(CALL, "/v3/watch", request).await?;
        let mut watch = Watch::new(endpoint, answer.body, answer.conn);
        watch.created(timeout).await?;
        Ok(watch)
    }

    /// One whole call: the endpoint that answered and the body of its 2xx answer.
    async fn unary(
        &self,
        call: &'static str,
        path: &'static str,
        request: serde_json::Value,
    ) -> Result<(String, Vec<u8>), MembershipError> {
        self.try_endpoints(call, path, request, |answer| async move {
            let Answer { body, conn, .. } = answer;
            let body = read_all(body).await;
            // The body is whole: the connection has nothing more to do.
            drop(conn);
            body
        })
        .await
    }

    /// A call whose body is read later (a watch): the endpoint and the open 2xx answer.
    async fn reach(
        &self,
        call: &'static str,
        path: &'static str,
        request: serde_json::Value,
    ) -> Result<(String, Answer), MembershipError> {
        self.try_endpoints(call, path, request, |answer| async move { Ok(answer) }).await
    }

    /// Runs `finish` on each endpoint's answer, in order from the preferred one, each within
    /// the deadline. An endpoint that cannot be reached, times out or answers 5xx (a member cut
    /// off from its quorum says so with a 503) passes the call to the next; any other answer is
    /// final. Error answers are read for etcd's message.
    async fn try_endpoints<T, F, Fut>(
        &self,
        call: &'static str,
        path: &'static str,
        request: serde_json::Value,
        finish: F,
    ) -> Result<(String, T), MembershipError>
    where
        F: Fn(Answer) -> Fut,
        Fut: std::future::Future<Output = Result<T, crate::error::Cause>>,
    {
        let inner = &self.inner;
        let text = request.to_string();
        let n = inner.endpoints.len();
        let first = inner.preferred.load(Ordering::Relaxed) % n;
        let mut last = None;
        for i in (0..n).map(|k| (first + k) % n) {
            let endpoint = &inner.endpoints[i];
            let attempt = async {
                let answer = post(endpoint, path, text.clone()).await?;
                if (200..300).contains(&answer.status) {
                    finish(answer).await.map(Ok)
                } else {
                    let status = answer.status;
                    let body = read_all(answer.body).await.unwrap_or_default();
                    Ok(Err((status, error_message(&body))))
                }
            };
            let error = match tokio::time::timeout(inner.timeout, attempt).await {
                Ok(Ok(Ok(t))) => {
                    inner.preferred.store(i, Ordering::Relaxed);
                    return Ok((endpoint.clone(), t));
                }
                Ok(Ok(Err((status, message)))) => {
                    let e = MembershipError::Status { endpoint: endpoint.clone(), call, status, message };
                    if status < 500 {
                        inner.preferred.store(i, Ordering::Relaxed);
                        return Err(e);
                    }
                    e
                }
                Ok(Err(source)) => MembershipError::Unreachable { endpoints: inner.listed.clone(), call, source },
                Err(_) => MembershipError::Timeout { endpoints: inner.listed.clone(), call, timeout: inner.timeout },
            };
            tracing::debug!(endpoint = %endpoint, call, error = %error, "etcd endpoint failed");
            last = Some(error);
        }
        Err(last.unwrap_or_else(|| MembershipError::Endpoint {
            endpoint: String::new(),
            reason: "no etcd endpoint given".into(),
        }))
    }
}

fn is_lease_not_found(message: &str) -> bool {
    message.contains("requested lease not found")
}

impl MembershipError {
    /// Whether etcd said the lease does not exist (revoked or expired).
    pub(crate) fn is_lease_not_found(&self) -> bool {
        matches!(self, MembershipError::Status { message, .. } if is_lease_not_found(message))
    }
}

fn parse<'a, T: serde::Deserialize<'a>>(
    endpoint: &str,
    call: &'static str,
    body: &'a [u8],
) -> Result<T, MembershipError> {
    serde_json::from_slice(body).map_err(|e| malformed_by(endpoint, call, "not the expected JSON", e))
}

fn malformed(endpoint: &str, call: &'static str, reason: &str) -> MembershipError {
    MembershipError::Malformed { endpoint: endpoint.to_string(), call, reason: reason.to_string(), source: None }
}

fn malformed_by(
    endpoint: &str,
    call: &'static str,
    reason: &str,
    source: impl std::error::Error + Send + Sync + 'static,
) -> MembershipError {
    MembershipError::Malformed {
        endpoint: endpoint.to_string(),
        call,
        reason: reason.to_string(),
        source: Some(Box::new(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_host_and_port_over_plain_http() {
        assert_eq!(authority("127.0.0.1:2379").expect("plain"), "127.0.0.1:2379");
        assert_eq!(authority(" http://etcd-0:2379/ ").expect("http"), "etcd-0:2379");
        assert_eq!(authority("[::1]:2379").expect("v6"), "[::1]:2379");
        for bad in ["etcd-0", "http://etcd-0", "etcd:port", ":2379", "unix://x:1", "http://a:1/v3"] {
            assert!(authority(bad).is_err(), "{bad}");
        }
        let e = authority("https://etcd-0:2379").expect_err("https");
        assert!(e.to_string().contains("TLS to etcd is not supported yet"), "{e}");
    }
}
