//! Why a node did not start, or stopped abnormally.

use crate::config::ConfigError;
use crate::tenant_file::TenantError;

/// Why a node did not start (or stopped abnormally).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error("loading the model {path}: {message}")]
    Model { path: String, message: String },
    #[error(transparent)]
    Http(#[from] gateway::http::HttpError),
    #[error("{0}")]
    Io(String),
}
