//! `POST /v1/chat/completions`: messages rendered with the model's chat template.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;

use super::endpoint::Endpoint;
use crate::state::AppState;

pub async fn chat_completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    super::generate(st, Endpoint::Chat, req).await
}
