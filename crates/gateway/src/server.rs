//! The server: loads the model, builds the pool and the engine, binds, routes, and drains on
//! shutdown (stop admitting with 503, let in-flight requests finish up to the drain timeout,
//! then end the rest with an error).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use cluster::{run_worker, Identity, Net, RouterConfig, SecretRing, WorkerConfig, WorkerMetrics};
use engine::{Engine, EngineConfig};
use gguf::GgufFile;
use kv::{Capacity, KvLayout, KvPool, PoolConfig};
use model::{Llama, LlamaConfig, LoadOptions};
use sampling::StopTokens;
use text::{ChatTemplate, Tokenizer};
use wire::{ClusterSecret, Role};

use crate::api;
use crate::config::{effective_context, pool_capacity_tokens, Config, ConfigError, PoolSize};
use crate::error::ApiError;
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::tenants::{dev_key_path, dev_tenant, TenantDirectory, TenantError, Tenants};

/// Why the server did not start (or stopped abnormally).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error("loading the model {path}: {message}")]
    Model { path: String, message: String },
    #[error("{0}")]
    Io(String),
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
    } else if !st.backend.can_route() {
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

/// Whether the request carries `Authorization: Bearer T` with SHA-256(T) equal to `digest`,
/// compared in constant time (comparing digests also hides the token's length).
fn bearer_matches(headers: &HeaderMap, digest: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    let text = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default().trim();
    let presented = match text.split_once(' ') {
        Some((scheme, t)) if scheme.eq_ignore_ascii_case("bearer") => t.trim(),
        _ => return false,
    };
    bool::from(crate::tenants::sha256(presented.as_bytes()).ct_eq(digest))
}

/// `/metrics` on the `[metrics] listen` listener: no authentication (a private network).
async fn metrics_open(State(st): State<Arc<AppState>>) -> Response {
    metrics_text(&st)
}

fn metrics_text(st: &AppState) -> Response {
    let stats = st.backend.stats();
    let tenants = st.tenants.current();
    let mut body = st.metrics.render(&stats, |t| {
        let name = st.config.metrics.tenant_names.then(|| tenants.by_id(t).map(|x| x.config.name.clone())).flatten();
        name.unwrap_or_else(|| t.0.to_string())
    });
    body.push_str(&crate::metrics::render_workers(&st.backend.worker_info()));
    body.push_str(&cluster::metrics::render_link_failures("", &st.backend.link_failures()));
    text_response(StatusCode::OK, "text/plain; version=0.0.4", body)
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
/// and `/health`, on the same HTTP stack as the API; `body` renders the exposition at each scrape.
pub async fn serve_worker_metrics<F>(listener: tokio::net::TcpListener, body: F) -> std::io::Result<()>
where
    F: Fn() -> String + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = body.clone();
                async move { text_response(StatusCode::OK, "text/plain; version=0.0.4", body()) }
            }),
        )
        .route("/health", get(health))
        .fallback(|req: Request| async move { ApiError::not_found(req.uri().path()).response() })
        .method_not_allowed_fallback(|req: Request| async move {
            ApiError::method_not_allowed(req.method().as_str(), req.uri().path()).response()
        });
    axum::serve(listener, app).await
}

fn model_err(path: &Path) -> impl Fn(String) -> ServeError {
    let path = path.display().to_string();
    move |message| ServeError::Model { path: path.clone(), message }
}

/// The model file to use: the configured one or the fetched default.
pub fn model_path(config: &Config) -> Result<PathBuf, ServeError> {
    match &config.model {
        Some(p) => Ok(p.clone()),
        None => fetch::ensure_default_model()
            .map_err(|e| ServeError::Model { path: "(default model)".into(), message: e.to_string() }),
    }
}

/// What every role reads from the model file (no weights), checked against the configuration.
pub struct ModelInfo {
    pub path: PathBuf,
    pub config: LlamaConfig,
    /// The served context window (at most the model's).
    pub context: usize,
    pub layout: KvLayout,
    /// BLAKE3 of the file, compared at pairing.
    pub digest: [u8; 32],
}

impl ModelInfo {
    pub fn read(config: &Config) -> Result<(ModelInfo, GgufFile), ServeError> {
        let path = model_path(config)?;
        let err = model_err(&path);
        let file = GgufFile::open(&path).map_err(|e| err(e.to_string()))?;
        let mcfg = LlamaConfig::from_gguf(&file).map_err(|e| err(e.to_string()))?;
        let context = effective_context(config.context_window, mcfg.context)?;
        let layout = mcfg.kv_layout(config.pool.page_size, config.pool.dtype);
        layout.validate().map_err(|e| ConfigError::Invalid { field: "pool".into(), message: e.to_string() })?;
        let digest = cluster::model_digest(&path).map_err(|e| err(e.to_string()))?;
        Ok((ModelInfo { path, config: mcfg, context, layout, digest }, file))
    }

    pub fn pairing(&self) -> Result<wire::PairingInfo, ServeError> {
        wire::PairingInfo::new(self.digest, &self.layout)
            .ok_or_else(|| ServeError::Io("the model's KV layout does not fit the wire format".into()))
    }
}

/// A KV pool of `tokens` slots of this layout and the configured scrub policy.
fn pool_of(config: &Config, layout: KvLayout, tokens: usize) -> Result<KvPool, ServeError> {
    Ok(KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(tokens), scrub: config.pool.scrub })
        .map_err(|e| ConfigError::Invalid { field: "pool".into(), message: e.to_string() })?)
}

/// A worker's model and pool, refusing to start when the pool cannot hold one request of the
/// context window (invariant 2).
pub struct LoadedModel {
    pub info: ModelInfo,
    pub llama: Llama,
    pub pool: KvPool,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

pub fn load_model(config: &Config) -> Result<LoadedModel, ServeError> {
    let (info, file) = ModelInfo::read(config)?;
    let err = model_err(&info.path);
    let size = config.pool.size.unwrap_or(PoolSize::Tokens(info.context.saturating_mul(2)));
    let capacity_tokens = pool_capacity_tokens(size, info.layout.page_size, info.layout.page_bytes());
    #[cfg(not(feature = "incident-replay"))]
    crate::config::check_pool(capacity_tokens, info.context)?;
    let pool = pool_of(config, info.layout, capacity_tokens)?;
    let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| err(e.to_string()))?;
    let template = ChatTemplate::from_gguf(&file).map_err(|e| err(e.to_string()))?;
    let mut llama = Llama::from_file(&file, LoadOptions { threads: config.threads }).map_err(|e| err(e.to_string()))?;
    // The engine's door check uses the model's context: serve the configured window.
    llama.config.context = info.context;
    Ok(LoadedModel { info, llama, pool, tokenizer, template })
}

pub fn engine_config(config: &Config) -> EngineConfig {
    EngineConfig {
        max_batch_tokens: config.engine.max_batch_tokens,
        max_running: config.engine.max_running,
        max_queued: config.engine.max_queued,
        queue_timeout: config.engine.queue_timeout,
        prefix_cache: config.engine.prefix_cache,
    }
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

fn router_config(config: &Config, info: &ModelInfo, secrets: SecretRing) -> Result<RouterConfig, ServeError> {
    Ok(RouterConfig {
        identity: Identity { secrets, role: Role::Gateway, pairing: info.pairing()? },
        context: info.context,
        vocab: info.config.vocab,
        handshake_timeout: config.cluster.handshake_timeout,
        transfer_timeout: config.cluster.transfer_timeout,
        max_pending_handshakes: config.cluster.max_pending_handshakes,
    })
}

/// The node's cluster secrets from its config (read once, so a bad file fails at start-up).
pub fn cluster_secrets(config: &Config) -> Result<SecretRing, ServeError> {
    let (current, others) = config.cluster.secrets()?;
    let ring = SecretRing::new(current, others);
    println!("cluster: {}", ring.describe());
    Ok(ring)
}

/// Reloads `ring` from the config file on every SIGHUP (when the config came from a file): how
/// a secret is rotated without a restart. A reload that fails (unreadable file, loose
/// permissions, short secret) keeps the secrets in use. Needs a running Tokio runtime.
pub fn reload_secrets_on_sighup(config: &Config, ring: &SecretRing) {
    #[cfg(unix)]
    if let Some(path) = config.source.clone() {
        let ring = ring.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                match Config::load(&path).map_err(ServeError::from).and_then(|c| Ok(c.cluster.secrets()?)) {
                    Ok((current, others)) => {
                        ring.replace(current, others);
                        println!("cluster: reloaded: {}", ring.describe());
                    }
                    Err(e) => tracing::error!(error = %e, "cluster secrets: reload failed, keeping the secrets in use"),
                }
            }
        });
    }
}

/// Runs the single-process server until `shutdown` completes, then drains and returns: the
/// gateway, a prefill worker and a decode worker sharing one engine, talking the cluster
/// protocol over in-memory links (handshake, tickets, MAC'd frames, transfer checks: the same
/// code as between processes). `ready` is called with the bound address (port 0 allowed) once
/// the server accepts requests; `listening on http://ADDR` is also printed to stdout.
pub async fn serve<F, R>(config: Config, shutdown: F, ready: R) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
{
    let cfg = config.clone();
    let loaded = tokio::task::spawn_blocking(move || load_model(&cfg))
        .await
        .map_err(|e| ServeError::Io(format!("model loading task failed: {e}")))??;
    let LoadedModel { info, llama, pool, tokenizer, template } = loaded;
    // Prompts being prefilled get a pool of their own (one full context window), so decode
    // reservations waiting for transfers can never starve the prefills they wait for.
    let prefill_pool = pool_of(&config, info.layout, info.context)?;
    let engine = Engine::start_with_prefill_pool(llama, pool, prefill_pool, engine_config(&config));

    // In one process the links are in-memory pipes; they run the same handshake and
    // encryption under a secret that never leaves the process.
    let secrets =
        SecretRing::single(ClusterSecret::from_bytes(cluster::random().map_err(|e| ServeError::Io(e.to_string()))?));
    let rcfg = router_config(&config, &info, secrets.clone())?;
    let router = cluster::Router::new(rcfg);
    let tenants = initial_tenants(&config)?;
    router.set_tenants(tenants.0.table(config.limits.tenant_pool_share), &[]);
    let net = Net::default();
    let (listener, _) = net.listen("mem:gateway").await.map_err(|e| ServeError::Io(e.to_string()))?;
    tokio::spawn(router.clone().serve(listener));
    let pairing = info.pairing()?;
    let mut workers = Vec::new();
    for (role, name) in [(Role::Prefill, "prefill-0"), (Role::Decode, "decode-0")] {
        let wcfg = WorkerConfig {
            name: name.into(),
            gateway: "mem:gateway".into(),
            identity: Identity { secrets: secrets.clone(), role, pairing },
            kv_listen: Some(format!("mem:{name}")),
            kv_advertise: None,
            handshake_timeout: config.cluster.handshake_timeout,
            transfer_timeout: config.cluster.transfer_timeout,
            max_pending_handshakes: config.cluster.max_pending_handshakes,
        };
        let (h, net) = (engine.handle(), net.clone());
        let metrics = Arc::new(WorkerMetrics::default());
        workers.push(tokio::spawn(async move {
            if let Err(e) = run_worker(wcfg, h, net, metrics).await {
                tracing::error!(error = %e, "in-process worker stopped");
            }
        }));
    }
    if !router.wait_for_workers(1, 1, Duration::from_secs(30)).await {
        return Err(ServeError::Io("the in-process workers did not register".into()));
    }
    let handle = engine.handle();
    let on_drain = move || {
        handle.stop_admitting();
    };
    let result =
        run_http(config, router.clone(), tenants, tokenizer, template, info.context, shutdown, ready, on_drain).await;
    // Dropping the engine fails whatever is still queued or running (their clients get an error
    // response or an error event) and frees their pages.
    let _ = tokio::task::spawn_blocking(move || drop(engine)).await;
    for w in workers {
        w.abort();
    }
    result
}

/// `pagewarden gateway`: the HTTP API, and the cluster listener where prefill and decode workers
/// register. Loads the tokenizer and chat template, not the weights.
pub async fn serve_gateway<F, R>(config: Config, shutdown: F, ready: R) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
{
    let secrets = cluster_secrets(&config)?;
    reload_secrets_on_sighup(&config, &secrets);
    let cfg = config.clone();
    let (info, tokenizer, template) = tokio::task::spawn_blocking(move || -> Result<_, ServeError> {
        let (info, file) = ModelInfo::read(&cfg)?;
        let err = model_err(&info.path);
        let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| err(e.to_string()))?;
        let template = ChatTemplate::from_gguf(&file).map_err(|e| err(e.to_string()))?;
        Ok((info, tokenizer, template))
    })
    .await
    .map_err(|e| ServeError::Io(format!("model loading task failed: {e}")))??;
    let router = cluster::Router::new(router_config(&config, &info, secrets)?);
    let tenants = initial_tenants(&config)?;
    // Set before the listener opens: every worker registers with the real table.
    router.set_tenants(tenants.0.table(config.limits.tenant_pool_share), &[]);
    let net = Net::default();
    let (listener, bound) = net
        .listen(&config.cluster.listen)
        .await
        .map_err(|e| ServeError::Io(format!("cannot listen on {}: {e}", config.cluster.listen)))?;
    println!("cluster listening on {bound}");
    tokio::spawn(router.clone().serve(listener));
    let r2 = router.clone();
    run_http(config, router, tenants, tokenizer, template, info.context, shutdown, ready, move || r2.fail_all()).await
}

/// The configured tenants, or the development tenant when none is configured (`true`).
fn initial_tenants(config: &Config) -> Result<(Tenants, bool), ServeError> {
    if config.tenants.is_empty() {
        return Ok((Tenants::new(vec![dev_tenant()?]), true));
    }
    Ok((Tenants::new(config.tenants.clone()), false))
}

/// Re-reads the tenants from the config file on every SIGHUP (when it came from a file): a
/// removed tenant's or a rotated key's old key is refused from then on, the tenant's requests
/// in flight end with an error and every worker drops its cached prefixes. A file that fails
/// to load keeps the tenants in use. Needs a running Tokio runtime.
fn reload_tenants_on_sighup(st: &Arc<AppState>, dev: bool) {
    #[cfg(unix)]
    if let Some(path) = st.config.source.clone() {
        let st = st.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                let config = match Config::load(&path) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(error = %e, "tenants: reload failed, keeping the tenants in use");
                        continue;
                    }
                };
                if dev && config.tenants.is_empty() {
                    continue;
                }
                apply_tenants(&st, Tenants::new(config.tenants));
            }
        });
    }
}

/// Installs a new tenant table: the gateway's own lookups first (old keys refused at once),
/// then the limits, then the router, which ends the revoked tenants' requests and tells every
/// worker.
pub fn apply_tenants(st: &AppState, next: Tenants) {
    let table = next.table(st.config.limits.tenant_pool_share);
    let count = next.len();
    st.limiter.reconfigure(next.iter().map(|t| (t.id, &t.config)));
    let revoked = st.tenants.replace(next);
    st.backend.set_tenants(table, &revoked);
    let ids: Vec<u64> = revoked.iter().map(|t| t.0).collect();
    tracing::info!(tenants = count, revoked = ?ids, "tenants reloaded (revoked: removed or key rotated)");
}

/// The HTTP side shared by `serve` and `gateway`: binds, serves, and on `shutdown` drains
/// (503 for new requests, in-flight ones get up to the drain timeout; then `on_drain_timeout`
/// ends the rest).
#[allow(clippy::too_many_arguments)]
async fn run_http<F, R, D>(
    config: Config,
    backend: cluster::Router,
    (tenants, dev): (Tenants, bool),
    tokenizer: Tokenizer,
    template: ChatTemplate,
    context: usize,
    shutdown: F,
    ready: R,
    on_drain_timeout: D,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
    D: FnOnce(),
{
    let stop_tokens = StopTokens::new(tokenizer.stop_tokens());
    // Read once at start-up, so that a missing, loose or short token file fails here.
    let metrics_token = config.metrics.token()?.map(|t| crate::tenants::sha256(t.as_bytes()));
    let limiter = Limiter::new(tenants.iter().map(|t| (t.id, &t.config)));
    let started_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let drain_timeout = config.limits.drain_timeout;
    let st = Arc::new(AppState {
        backend,
        tokenizer,
        template,
        stop_tokens,
        tenants: TenantDirectory::new(tenants),
        limiter,
        metrics: Metrics::default(),
        metrics_token,
        context,
        draining: AtomicBool::new(false),
        inflight: AtomicUsize::new(0),
        next_id: AtomicU64::new(1),
        started_at,
        config,
    });

    reload_tenants_on_sighup(&st, dev);
    let metrics_task = match st.config.metrics.listen {
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| ServeError::Io(format!("cannot listen on {at} (metrics.listen): {e}")))?;
            let bound = l.local_addr().map_err(|e| ServeError::Io(e.to_string()))?;
            println!("metrics listening on http://{bound}");
            let app = metrics_router(st.clone());
            Some(tokio::spawn(async move { axum::serve(l, app).await }))
        }
        None => None,
    };

    let listener = tokio::net::TcpListener::bind(st.config.listen)
        .await
        .map_err(|e| ServeError::Io(format!("cannot listen on {}: {e}", st.config.listen)))?;
    let addr = listener.local_addr().map_err(|e| ServeError::Io(e.to_string()))?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router(st.clone())).with_graceful_shutdown(async move {
        let _ = stop_rx.await;
    });
    let mut server_task = tokio::spawn(async move { server.await });
    println!("listening on http://{addr}");
    if dev {
        let path = dev_key_path();
        println!(
            "no tenants configured: the development tenant's key is in {} (mode 0600). Try:\n  curl \
             http://{addr}/v1/chat/completions -H \"Authorization: Bearer $(cat {})\" -H 'Content-Type: \
             application/json' -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hi\"}}]}}'",
            path.display(),
            path.display(),
            st.config.model_name
        );
    }
    ready(addr);

    tokio::select! {
        _ = shutdown => {}
        r = &mut server_task => {
            // The server stopped on its own: an I/O failure.
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(ServeError::Io(e.to_string())),
                Err(e) => Err(ServeError::Io(e.to_string())),
            };
        }
    }

    tracing::info!(
        drain_timeout_s = drain_timeout.as_secs(),
        inflight = st.inflight.load(Ordering::SeqCst),
        "draining: new requests get 503"
    );
    st.draining.store(true, Ordering::SeqCst);
    st.backend.stop_admitting();
    if !wait_idle(&st, Instant::now() + drain_timeout).await {
        tracing::warn!(
            inflight = st.inflight.load(Ordering::SeqCst),
            "drain timeout: ending the requests left with an error"
        );
    }
    on_drain_timeout();
    st.backend.fail_all();
    wait_idle(&st, Instant::now() + Duration::from_secs(5)).await;
    let _ = stop_tx.send(());
    // Let open connections close (bounded: a stuck client must not hold the exit).
    let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
    if let Some(t) = metrics_task {
        t.abort();
    }
    tracing::info!("stopped");
    Ok(())
}

/// A future that completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The config file (or the defaults) with `--listen` applied.
fn cli_config(config_path: Option<&Path>, listen: Option<&str>) -> Result<Config, ServeError> {
    let mut config = match config_path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(l) = listen {
        config.listen = l.parse().map_err(|_| ConfigError::Invalid {
            field: "listen".into(),
            message: format!("`{l}` is not an address such as 127.0.0.1:8080"),
        })?;
    }
    Ok(config)
}

fn runtime() -> Result<tokio::runtime::Runtime, ServeError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io(format!("cannot start the async runtime: {e}")))
}

/// `pagewarden serve [--config FILE] [--listen ADDR]`: loads and validates the config (no file:
/// the defaults and a development tenant), then serves until SIGINT/SIGTERM and drains.
pub fn run_serve_cli(config_path: Option<&Path>, listen: Option<&str>) -> Result<(), ServeError> {
    let config = cli_config(config_path, listen)?;
    runtime()?.block_on(serve(config, shutdown_signal(), |_| {}))
}

/// `pagewarden gateway [--config FILE] [--listen ADDR] [--cluster-listen ADDR]`.
pub fn run_gateway_cli(
    config_path: Option<&Path>,
    listen: Option<&str>,
    cluster_listen: Option<&str>,
) -> Result<(), ServeError> {
    let mut config = cli_config(config_path, listen)?;
    if let Some(c) = cluster_listen {
        config.cluster.listen = c.to_string();
    }
    runtime()?.block_on(serve_gateway(config, shutdown_signal(), |_| {}))
}
