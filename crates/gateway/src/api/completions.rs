//! `POST /v1/completions`: a raw text prompt (control-token text stays plain text).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;

use super::endpoint::Endpoint;
use crate::state::AppState;

pub async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    super::generate(st, Endpoint::Completions, req).await
}
