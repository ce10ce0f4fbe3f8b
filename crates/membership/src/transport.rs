//! One HTTP/1.1 exchange with one etcd endpoint: a fresh TCP connection per call. Calls are
//! rare (a renewal every ttl/3, a range on resync), so a pool would buy nothing and would add
//! the question of half-dead pooled connections after etcd restarts.

use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::error::Cause;

/// The most an answer may hold: membership lists are small; this only bounds a broken peer.
pub(crate) const MAX_BODY: usize = 16 << 20;

/// The task driving a connection, aborted with its owner: an abandoned call (deadline passed,
/// watch dropped) closes its socket at once rather than when etcd next writes.
pub(crate) struct ConnGuard(JoinHandle<()>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An answer whose body has not been read yet.
pub(crate) struct Answer {
    pub status: u16,
    pub body: Incoming,
    pub conn: ConnGuard,
}

/// POSTs `body` (JSON) to `path` at `authority` ("host:port"); returns once the status line
/// and headers are in. No deadline here: callers put one around the whole exchange.
pub(crate) async fn post(authority: &str, path: &str, body: String) -> Result<Answer, Cause> {
    let tcp = TcpStream::connect(authority).await?;
    // Small requests answered at once: Nagle would only add latency.
    tcp.set_nodelay(true)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let conn = ConnGuard(tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "etcd connection ended with an error");
        }
    }));
    let request = Request::post(path).header(HOST, authority).header(CONTENT_TYPE, "application/json").body(body)?;
    let response = sender.send_request(request).await?;
    Ok(Answer { status: response.status().as_u16(), body: response.into_body(), conn })
}

/// The whole body, at most [`MAX_BODY`] bytes.
pub(crate) async fn read_all(body: Incoming) -> Result<Vec<u8>, Cause> {
    Ok(Limited::new(body, MAX_BODY).collect().await?.to_bytes().to_vec())
}
