//! How every HTTP listener of a node takes its connections (the API, `[metrics] listen`, a
//! worker's `/metrics`): HTTP/1.1 with a deadline on each request head, a cap on the
//! connections one source address holds open, the TLS handshake (on an HTTPS listener) on the
//! connection's own task, and a graceful stop.
//!
//! A bare `axum::serve` has neither deadline nor cap: clients sending their headers a byte
//! every few seconds, or connecting and sending nothing, held their connections for as long
//! as they liked, and enough of them held the server.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::tls::Handshakes;

/// The default of `[limits] header_timeout_ms`: real clients send a request head in
/// milliseconds; above ureq's 15 s pool idle time, so its kept-alive connections are not cut
/// under it.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// The default of `[limits] max_connections_per_address`: well above what one host's clients
/// use (`bench serve` runs 64, the audit fewer), well below what the process can hold.
pub const DEFAULT_MAX_PER_ADDRESS: usize = 256;

/// What a listener allows each connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// A connection must deliver a complete request head within this, counted from when it
    /// opened (after its TLS handshake) or its previous response ended; so it is also how long
    /// an idle kept-alive connection stays open. A streaming response is not bounded by it.
    pub header_timeout: Duration,
    /// Connections one source address (one IPv6 /64) may hold open, TLS handshakes included;
    /// beyond it a new connection is closed as soon as it is accepted.
    pub max_per_address: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits { header_timeout: DEFAULT_HEADER_TIMEOUT, max_per_address: DEFAULT_MAX_PER_ADDRESS }
    }
}

/// Plain HTTP, or HTTPS with these handshakes.
#[derive(Clone)]
pub enum Transport {
    Plain,
    Tls(Handshakes),
}

/// Serves `app` on `tcp` until `stop` resolves; then stops accepting, lets each connection
/// finish the request it is serving (idle ones close at once) and returns when all are closed.
pub async fn serve<F>(tcp: TcpListener, transport: Transport, app: Router, limits: ConnLimits, stop: F)
where
    F: Future<Output = ()> + Send,
{
    let open = Arc::new(OpenCounts::default());
    let (stopping_tx, stopping) = watch::channel(false);
    // Each connection task holds a clone; `recv` answers `None` once every one has ended.
    let (alive, mut all_closed) = mpsc::channel::<()>(1);
    let mut stop = pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut stop => break,
            accepted = tcp.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = OpenCounts::admit(&open, peer.ip(), limits.max_per_address) else {
            tracing::debug!(%peer, cap = limits.max_per_address, "connection closed: its address holds the cap");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (transport, app, stopping, alive) = (transport.clone(), app.clone(), stopping.clone(), alive.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let _alive = alive;
            match transport {
                Transport::Plain => serve_connection(stream, peer, app, limits, stopping).await,
                Transport::Tls(tls) => {
                    let mut stopped = stopping.clone();
                    let tls_stream = tokio::select! {
                        s = tls.accept(stream, peer) => s,
                        _ = stopped.wait_for(|s| *s) => None,
                    };
                    if let Some(s) = tls_stream {
                        serve_connection(s, peer, app, limits, stopping).await;
                    }
                }
            }
        });
    }
    drop(tcp);
    let _ = stopping_tx.send(true);
    drop(alive);
    let _ = all_closed.recv().await;
}

async fn serve_connection<I>(
    io: I,
    peer: SocketAddr,
    app: Router,
    limits: ConnLimits,
    mut stopping: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    let mut conn = pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => Some(r),
        _ = stopping.wait_for(|s| *s) => None,
    };
    let result = match ended {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    // A client that timed out, reset or spoke garbage is its own business: a debug line.
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended");
    }
}

/// Open connections per source address.
#[derive(Default)]
struct OpenCounts(Mutex<HashMap<IpAddr, usize>>);

impl OpenCounts {
    /// A slot for one more connection from `ip`, or `None` when it holds `cap` already.
    fn admit(this: &Arc<Self>, ip: IpAddr, cap: usize) -> Option<OpenSlot> {
        let key = source_key(ip);
        let mut map = this.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(key).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(OpenSlot { counts: this.clone(), key })
    }
}

/// One open connection, counted against its address until dropped.
struct OpenSlot {
    counts: Arc<OpenCounts>,
    key: IpAddr,
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        let mut map = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// What the cap counts by: an IPv4 address, or the /64 of an IPv6 one (a single host is
/// commonly given a whole /64, so counting its addresses one by one would cap nothing).
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_cap_and_a_closed_connection_gives_its_slot_back() {
        let open = Arc::new(OpenCounts::default());
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| OpenCounts::admit(&open, a, 3)).collect();
        assert!(held.iter().all(Option::is_some));
        assert!(OpenCounts::admit(&open, a, 3).is_none(), "a fourth from the same address");
        assert!(OpenCounts::admit(&open, b, 3).is_some(), "another address is not held by it");
        drop(held);
        assert!(OpenCounts::admit(&open, a, 3).is_some());
    }

    #[test]
    fn ipv6_addresses_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(source_key(one), source_key(other));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }
}
