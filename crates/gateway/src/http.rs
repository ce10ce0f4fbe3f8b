//! The HTTP side of a node that serves the API: the routes, `/metrics` (behind a token on the
//! public listener, open on a listener of its own), a worker's own `/metrics`, tenant table
//! updates, and the drain on shutdown (503 for new requests, the running ones given up to the
//! drain timeout, then ended with an error).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::mpsc;

use crate::api;
use crate::error::ApiError;
use crate::limits::Limiter;
use crate::listener::{self, ConnLimits, Transport};
use crate::metrics::Metrics;
use crate::served::Models;
use crate::settings::ApiSettings;
use crate::state::AppState;
use crate::tenants::{bearer_matches, TenantDirectory, Tenants};
use crate::tls::{Handshakes, ServerCertificate};
use crate::usage::{UsageLog, UsageSettings};
use cluster::exposition::{self, Exposition};

/// Why the HTTP side stopped or did not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        addr: SocketAddr,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Server(#[source] std::io::Error),
    #[error("the HTTP server stopped: {0}")]
    Stopped(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Usage(#[from] crate::usage::UsageError),
    #[error("HTTPS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

fn text_response(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

async fn health() -> Response {
    text_response(StatusCode::OK, "application/json", r#"{"status":"ok"}"#.into())
}

async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if st.is_draining() {
        text_response(StatusCode::SERVICE_UNAVAILABLE, "application/json", r#"{"status":"draining"}"#.into())
    } else if !st.backends().all(|b| b.can_route()) {
        text_response(StatusCode::SERVICE_UNAVAILABLE, "application/json", r#"{"status":"no_workers"}"#.into())
    } else {
        text_response(StatusCode::OK, "application/json", r#"{"status":"ready"}"#.into())
    }
}

/// `/metrics` on the public listener: per-tenant load and cache use are not for every API
/// client, so it is served only with the `[metrics] token_file` token (404 without one
/// configured, 401 without the right one).
async fn metrics(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let Some(token) = &st.metrics_token else {
        let e = ApiError::metrics_disabled();
        st.metrics.request(e.status.as_u16());
        return e.response();
    };
    if !bearer_matches(&headers, token) {
        let e = ApiError::unauthorized("/metrics needs `Authorization: Bearer TOKEN` with the metrics token");
        st.metrics.request(e.status.as_u16());
        return e.response();
    }
    metrics_text(&st)
}

/// `/metrics` on the `[metrics] listen` listener: no authentication (a private network).
async fn metrics_open(State(st): State<Arc<AppState>>) -> Response {
    metrics_text(&st)
}

fn metrics_text(st: &AppState) -> Response {
    let mut stats = protocol::PoolStats::default();
    for b in st.backends() {
        stats.absorb(&b.stats());
    }
    let tenants = st.tenants.current();
    let mut e = Exposition::new();
    st.metrics.expose(&mut e, &stats, |t| {
        let name = st.settings.tenant_names.then(|| tenants.by_id(t).map(|x| x.config.name.clone())).flatten();
        name.unwrap_or_else(|| t.0.to_string())
    });
    let workers: Vec<_> = st.backends().flat_map(|b| b.worker_info()).collect();
    crate::metrics::expose_workers(&mut e, &workers);
    crate::metrics::expose_gateways(&mut e, st.limiter.gateways());
    if let Some(r) = &st.membership_rejected {
        r.expose(&mut e);
    }
    let failures: Vec<_> = st.backends().flat_map(|b| b.link_failures()).collect();
    cluster::metrics::expose_link_failures(&mut e, &vec![], &failures);
    text_response(StatusCode::OK, exposition::CONTENT_TYPE, e.text())
}

async fn not_found(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let e = ApiError::not_found(req.uri().path());
    st.metrics.request(e.status.as_u16());
    e.response()
}

async fn method_not_allowed(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let e = ApiError::method_not_allowed(req.method().as_str(), req.uri().path());
    st.metrics.request(e.status.as_u16());
    e.response()
}

/// The routes.
pub fn router(st: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/admin", get(crate::admin::page))
        .route("/admin/state", get(crate::admin::state))
        .route("/v1/models", get(api::models))
        .route("/v1/chat/completions", post(api::chat::chat_completions))
        .route("/v1/completions", post(api::completions::completions))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(st)
}

/// The routes of the `[metrics] listen` listener.
fn metrics_router(st: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_open))
        .route("/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(st)
}

/// A worker's own `/metrics` (no authentication: `--metrics-listen` is for a private network)
/// and `/health`, on the same HTTP stack and connection limits as the API; `body` renders the
/// exposition at each scrape.
pub async fn serve_worker_metrics<F>(listener: tokio::net::TcpListener, limits: ConnLimits, body: F)
where
    F: Fn() -> String + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = body.clone();
                async move { text_response(StatusCode::OK, exposition::CONTENT_TYPE, body()) }
            }),
        )
        .route("/health", get(health))
        .fallback(|req: Request| async move { ApiError::not_found(req.uri().path()).response() })
        .method_not_allowed_fallback(|req: Request| async move {
            ApiError::method_not_allowed(req.method().as_str(), req.uri().path()).response()
        });
    listener::serve(listener, Transport::Plain, app, limits, std::future::pending()).await
}

/// Waits until no API request is in flight, or `deadline`.
async fn wait_idle(st: &AppState, deadline: Instant) -> bool {
    loop {
        if st.inflight.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Installs a new tenant table: the gateway's own lookups first (old keys refused at once),
/// then the limits, then the router, which ends the revoked tenants' requests and tells every
/// worker.
pub fn apply_tenants(st: &AppState, next: Tenants) {
    let table = next.table(st.settings.limits.tenant_pool_share);
    let count = next.len();
    st.limiter.reconfigure(next.iter().map(|t| (t.id, &t.config)));
    let revoked = st.tenants.replace(next);
    for b in st.backends() {
        b.set_tenants(table.clone(), &revoked);
    }
    let ids: Vec<u64> = revoked.iter().map(|t| t.0).collect();
    tracing::info!(tenants = count, revoked = ?ids, "tenants reloaded (revoked: removed or key rotated)");
}

/// What the HTTP side is started with.
pub struct HttpSetup {
    pub listen: SocketAddr,
    /// `[metrics] listen`: `/metrics` without authentication on a listener of its own.
    pub metrics_listen: Option<SocketAddr>,
    /// SHA-256 of the token `/metrics` on the public listener asks for (`None`: a 404 there).
    pub metrics_token: Option<[u8; 32]>,
    /// SHA-256 of the `[admin]` key the dashboard asks for (`None`: no dashboard).
    pub admin_key: Option<[u8; 32]>,
    pub settings: ApiSettings,
    /// The served models, each with its cluster: in-process workers (`serve`) or registered
    /// remote ones (`gateway`).
    pub models: Models,
    pub tenants: Tenants,
    /// The development tenant's key file, when it is the only tenant (printed with an example).
    pub dev_key: Option<PathBuf>,
    /// New tenant tables from the deployment (a SIGHUP reload), installed as they come.
    pub tenant_updates: Option<mpsc::UnboundedReceiver<Tenants>>,
    /// `[usage]`: the usage log, if one is kept.
    pub usage: Option<UsageSettings>,
    /// `[tls]`: serve the API over HTTPS with this (replaceable) certificate.
    pub tls: Option<Arc<ServerCertificate>>,
    /// With membership: the number of live gateways, which share every tenant's limits.
    pub gateways: Option<tokio::sync::watch::Receiver<usize>>,
    /// With membership: the entries the membership watch ignored, for `/metrics`.
    pub membership_rejected: Option<Arc<crate::metrics::RejectedEntries>>,
}

/// The HTTP side shared by `serve` and `gateway`: binds, serves, and on `shutdown` drains
/// (503 for new requests, in-flight ones get up to the drain timeout; then `on_drain_timeout`
/// ends the rest). `ready` gets the bound address (port 0 allowed); `listening on
/// http://ADDR` (`https://` with `tls`) is also printed to stdout.
pub async fn run<F, R, D>(setup: HttpSetup, shutdown: F, ready: R, on_drain_timeout: D) -> Result<(), HttpError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
    D: FnOnce(),
{
    let HttpSetup {
        listen,
        metrics_listen,
        metrics_token,
        admin_key,
        settings,
        models,
        tenants,
        dev_key,
        tenant_updates,
        usage,
        tls,
        gateways,
        membership_rejected,
    } = setup;
    let usage = usage.map(UsageLog::open).transpose()?;
    let limiter = Limiter::new(tenants.iter().map(|t| (t.id, &t.config)));
    let started_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let drain_timeout = settings.limits.drain_timeout;
    let conn_limits = settings.limits.connections;
    let st = Arc::new(AppState {
        models,
        tenants: TenantDirectory::new(tenants),
        limiter,
        metrics: Metrics::default(),
        usage,
        metrics_token,
        admin_key,
        draining: AtomicBool::new(false),
        inflight: AtomicUsize::new(0),
        next_id: AtomicU64::new(1),
        started_at,
        settings,
        membership_rejected,
    });

    let updates_task = tenant_updates.map(|mut rx| {
        let st = st.clone();
        tokio::spawn(async move {
            while let Some(next) = rx.recv().await {
                apply_tenants(&st, next);
            }
        })
    });
    let share_task = gateways.map(|mut rx| {
        let limiter = st.limiter.clone();
        tokio::spawn(async move {
            loop {
                let n = *rx.borrow_and_update();
                limiter.set_gateways(n);
                tracing::info!(gateways = n, "tenant limits shared among the live gateways");
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
    });
    let metrics_task = match metrics_listen {
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at).await.map_err(|source| HttpError::Bind {
                addr: at,
                what: "metrics.listen",
                source,
            })?;
            let bound = l.local_addr().map_err(HttpError::Server)?;
            println!("{}{bound}", types::listening::METRICS);
            let app = metrics_router(st.clone());
            Some(tokio::spawn(listener::serve(l, Transport::Plain, app, conn_limits, std::future::pending())))
        }
        None => None,
    };

    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|source| HttpError::Bind {
        addr: listen,
        what: "listen",
        source,
    })?;
    let addr = listener.local_addr().map_err(HttpError::Server)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stop_rx.await;
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let transport = match tls {
        Some(cert) => Transport::Tls(Handshakes::new(cert.server_config()?)),
        None => Transport::Plain,
    };
    let mut server_task = tokio::spawn(listener::serve(listener, transport, router(st.clone()), conn_limits, stopped));
    println!("{}{scheme}://{addr}", types::listening::API);
    if let Some(path) = dev_key {
        println!(
            "no tenants configured: the development tenant's key is in {} (mode 0600). Try:\n  curl \
             {scheme}://{addr}/v1/chat/completions -H \"Authorization: Bearer $(cat {})\" -H 'Content-Type: \
             application/json' -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hi\"}}]}}'",
            path.display(),
            path.display(),
            st.models.first().name
        );
    }
    ready(addr);

    tokio::select! {
        _ = shutdown => {}
        r = &mut server_task => {
            // The accept loop ends only when told to: it panicked.
            return r.map_err(HttpError::Stopped);
        }
    }

    tracing::info!(
        drain_timeout_s = drain_timeout.as_secs(),
        inflight = st.inflight.load(Ordering::SeqCst),
        "draining: new requests get 503"
    );
    st.draining.store(true, Ordering::SeqCst);
    st.backends().for_each(|b| b.stop_admitting());
    if !wait_idle(&st, Instant::now() + drain_timeout).await {
        tracing::warn!(
            inflight = st.inflight.load(Ordering::SeqCst),
            "drain timeout: ending the requests left with an error"
        );
    }
    on_drain_timeout();
    st.backends().for_each(|b| b.fail_all());
    wait_idle(&st, Instant::now() + Duration::from_secs(5)).await;
    let _ = stop_tx.send(());
    // Let open connections close (bounded: a stuck client must not hold the exit).
    let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
    if let Some(t) = metrics_task {
        t.abort();
    }
    for t in [updates_task, share_task].into_iter().flatten() {
        t.abort();
    }
    if st.usage.is_some() {
        // Every request has ended (or been ended): its record is queued; write it before exit.
        let st2 = st.clone();
        let flushed =
            tokio::task::spawn_blocking(move || st2.usage.as_ref().is_some_and(|u| u.flush(Duration::from_secs(10))));
        if !flushed.await.unwrap_or(false) {
            tracing::error!("the usage log did not flush within 10 s");
        }
    }
    tracing::info!("stopped");
    Ok(())
}
