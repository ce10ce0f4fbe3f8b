//! The operator's live view of isolation: `GET /admin` (one self-contained page, no external
//! asset) and `GET /admin/state` (what it draws, as JSON): every worker's KV pages coloured by
//! the tenant holding them (free, leased to a request, sealed prefix), each tenant's load and
//! usage, the workers, and isolation violations.
//!
//! Both need `Authorization: Bearer ADMIN_KEY` with the `[admin] key_file` key, which is never
//! a tenant's (the node refuses a config where it is); without `[admin]` both are 404. The
//! state names tenants and sizes only: never a prompt, an output or a key.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::AppState;
use crate::tenants::bearer_matches;

/// The page: markup, style and script in one file, compiled in.
const PAGE: &str = include_str!("admin.html");

/// The admin key's check: 404 without `[admin]`, 401 without its key (a tenant's included).
fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(digest) = &st.admin_key else {
        return Err(ApiError::not_found("/admin/state"));
    };
    if !bearer_matches(headers, digest) {
        return Err(ApiError::unauthorized("the admin page needs `Authorization: Bearer ADMIN_KEY`, the [admin] key"));
    }
    Ok(())
}

/// `GET /admin`: the page. It holds no data, so it is served to anyone when `[admin]` is set;
/// it asks for the key and sends it with every state request.
pub async fn page(State(st): State<Arc<AppState>>) -> Response {
    if st.admin_key.is_none() {
        let e = ApiError::not_found("/admin");
        st.metrics.request(e.status.as_u16());
        return e.response();
    }
    st.metrics.request(200);
    let mut r = Response::new(axum::body::Body::from(PAGE));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    // Nothing may load from elsewhere, and no other site may frame it.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; \
             frame-ancestors 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `GET /admin/state`.
pub async fn state(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        st.metrics.request(e.status.as_u16());
        return e.response();
    }
    st.metrics.request(200);
    let body = snapshot(&st).to_string();
    let mut r = Response::new(axum::body::Body::from(body));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// What the page draws, now.
pub fn snapshot(st: &AppState) -> Value {
    // Workers sharing one engine (the roles of `serve`) share one pool: one map for them.
    let mut engines: Vec<(u64, Vec<Value>, &cluster::proto::Stats)> = Vec::new();
    let workers: Vec<_> = st.backends().flat_map(|b| b.worker_info()).collect();
    let mut list = Vec::new();
    let mut violations: std::collections::BTreeMap<String, u64> =
        st.metrics.violation_counts().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    for w in &workers {
        list.push(json!({
            // As a string: an engine id is a u64, and a JSON number loses digits above 2^53 in
            // JavaScript.
            "name": w.name, "role": w.role, "inflight": w.inflight, "engine": w.stats.engine.to_string(),
            "running": w.stats.pool.running, "queued": w.stats.pool.queued,
        }));
        for (k, n) in &w.stats.violations {
            *violations.entry(k.label().to_string()).or_default() += n;
        }
        match engines.iter_mut().find(|(id, _, _)| *id == w.stats.engine) {
            Some((_, names, _)) => names.push(json!(w.name)),
            None => engines.push((w.stats.engine, vec![json!(w.name)], &w.stats)),
        }
    }
    let pools: Vec<Value> = engines
        .iter()
        .map(|(id, names, s)| {
            let runs: Vec<Value> = s.page_map.iter().map(|r| json!([r.kind, r.tenant, r.pages])).collect();
            // Counted from the map itself (every pool of the engine, the prefill pool included).
            let total: u64 = s.page_map.iter().map(|r| u64::from(r.pages)).sum();
            let used: u64 =
                s.page_map.iter().filter(|r| r.kind != protocol::PageKind::Free).map(|r| u64::from(r.pages)).sum();
            json!({
                "engine": id.to_string(), "workers": names, "pages_total": total, "pages_used": used,
                "cached_pages": s.pool.cached_pages, "runs": runs,
            })
        })
        .collect();
    let tenants: Vec<Value> = st
        .tenants
        .current()
        .iter()
        .map(|t| {
            let (running, queued) = st.limiter.load(t.id);
            let [requests, prompt, cached, completion] = st.metrics.usage_of(t.id);
            json!({
                "id": t.id.0, "name": t.config.name, "running": running, "queued": queued,
                "requests": requests, "prompt_tokens": prompt, "cached_tokens": cached,
                "completion_tokens": completion,
            })
        })
        .collect();
    json!({
        "model": st.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
        "time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default(),
        "draining": st.is_draining(),
        "workers": list,
        "pools": pools,
        "tenants": tenants,
        "violations": violations,
    })
}
