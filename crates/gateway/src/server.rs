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
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use engine::{Engine, EngineConfig, EngineHandle};
use gguf::GgufFile;
use kv::{Capacity, KvPool, PoolConfig};
use model::{Llama, LlamaConfig, LoadOptions};
use sampling::StopTokens;
use text::{ChatTemplate, Tokenizer};

use crate::api;
use crate::config::{check_pool, effective_context, pool_capacity_tokens, Config, ConfigError, PoolSize};
use crate::error::ApiError;
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::tenants::{dev_key_path, dev_tenant, TenantError, Tenants};

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

/// What every handler shares.
pub struct AppState {
    pub config: Config,
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub stop_tokens: StopTokens,
    pub tenants: Tenants,
    pub limiter: Limiter,
    pub metrics: Metrics,
    /// The served context window (at most the model's).
    pub context: usize,
    pub draining: AtomicBool,
    /// API requests being handled (including streams still sending).
    pub inflight: AtomicUsize,
    pub next_id: AtomicU64,
    /// Unix seconds at start (`created` of the model).
    pub started_at: u64,
}

impl AppState {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
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
    } else {
        text_response(StatusCode::OK, "application/json", r#"{"status":"ready"}"#.into())
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let stats = st.engine.stats();
    let body = st
        .metrics
        .render(&stats, |t| st.tenants.by_id(t).map_or_else(|| format!("tenant-{}", t.0), |x| x.config.name.clone()));
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

fn model_err(path: &Path) -> impl Fn(String) -> ServeError + '_ {
    move |message| ServeError::Model { path: path.display().to_string(), message }
}

/// Everything loaded from the model file, checked against the configuration.
struct Loaded {
    llama: Llama,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    pool: KvPool,
    context: usize,
}

fn load(config: &Config) -> Result<Loaded, ServeError> {
    let path: PathBuf = match &config.model {
        Some(p) => p.clone(),
        None => fetch::ensure_default_model()
            .map_err(|e| ServeError::Model { path: "(default model)".into(), message: e.to_string() })?,
    };
    let err = model_err(&path);
    let file = GgufFile::open(&path).map_err(|e| err(e.to_string()))?;
    // Check the configuration against the model before loading any weight.
    let mcfg = LlamaConfig::from_gguf(&file).map_err(|e| err(e.to_string()))?;
    let context = effective_context(config.context_window, mcfg.context)?;
    let layout = mcfg.kv_layout(config.pool.page_size, config.pool.dtype);
    layout.validate().map_err(|e| ConfigError::Invalid { field: "pool".into(), message: e.to_string() })?;
    let size = config.pool.size.unwrap_or(PoolSize::Tokens(context.saturating_mul(2)));
    let capacity_tokens = pool_capacity_tokens(size, layout.page_size, layout.page_bytes());
    check_pool(capacity_tokens, context)?;
    let pool =
        KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(capacity_tokens), scrub: config.pool.scrub })
            .map_err(|e| ConfigError::Invalid { field: "pool".into(), message: e.to_string() })?;

    let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| err(e.to_string()))?;
    let template = ChatTemplate::from_gguf(&file).map_err(|e| err(e.to_string()))?;
    let mut llama = Llama::from_file(&file, LoadOptions { threads: config.threads }).map_err(|e| err(e.to_string()))?;
    // The engine's door check uses the model's context: serve the configured window.
    llama.config.context = context;
    Ok(Loaded { llama, tokenizer, template, pool, context })
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

/// Runs the server until `shutdown` completes, then drains and returns. `ready` is called with
/// the bound address (port 0 allowed) once the server accepts requests; `listening on
/// http://ADDR` is also printed to stdout.
pub async fn serve<F, R>(config: Config, shutdown: F, ready: R) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
{
    let mut tenant_configs = config.tenants.clone();
    let dev = tenant_configs.is_empty();
    if dev {
        tenant_configs.push(dev_tenant()?);
    }
    let cfg = config.clone();
    let loaded = tokio::task::spawn_blocking(move || load(&cfg))
        .await
        .map_err(|e| ServeError::Io(format!("model loading task failed: {e}")))??;

    let stop_tokens = StopTokens::new(loaded.tokenizer.stop_tokens());
    let engine = Engine::start(
        loaded.llama,
        loaded.pool,
        EngineConfig {
            max_batch_tokens: config.engine.max_batch_tokens,
            max_running: config.engine.max_running,
            max_queued: config.engine.max_queued,
            queue_timeout: config.engine.queue_timeout,
        },
    );
    let tenants = Tenants::new(tenant_configs);
    let limiter = Limiter::new(tenants.iter().map(|t| (t.id, &t.config)));
    let started_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let drain_timeout = config.limits.drain_timeout;
    let st = Arc::new(AppState {
        engine: engine.handle(),
        tokenizer: loaded.tokenizer,
        template: loaded.template,
        stop_tokens,
        tenants,
        limiter,
        metrics: Metrics::default(),
        context: loaded.context,
        draining: AtomicBool::new(false),
        inflight: AtomicUsize::new(0),
        next_id: AtomicU64::new(1),
        started_at,
        config,
    });

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

    eprintln!(
        "draining: new requests get 503; waiting up to {}s for {} in-flight request(s)",
        drain_timeout.as_secs(),
        st.inflight.load(Ordering::SeqCst)
    );
    st.draining.store(true, Ordering::SeqCst);
    st.engine.stop_admitting();
    if !wait_idle(&st, Instant::now() + drain_timeout).await {
        eprintln!("drain timeout: ending {} request(s) with an error", st.inflight.load(Ordering::SeqCst));
    }
    // Dropping the engine fails whatever is still queued or running (their clients get an error
    // response or an error event) and frees their pages.
    let _ = tokio::task::spawn_blocking(move || drop(engine)).await;
    wait_idle(&st, Instant::now() + Duration::from_secs(5)).await;
    let _ = stop_tx.send(());
    // Let open connections close (bounded: a stuck client must not hold the exit).
    let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
    eprintln!("stopped");
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

/// `pagewarden serve [--config FILE] [--listen ADDR]`: loads and validates the config (no file:
/// the defaults and a development tenant), then serves until SIGINT/SIGTERM and drains.
pub fn run_serve_cli(config_path: Option<&Path>, listen: Option<&str>) -> Result<(), ServeError> {
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(serve(config, shutdown_signal(), |_| {}))
}
