//! The gateway: pagewarden's OpenAI-compatible HTTP server.
//!
//! A request's path: [`api`] authenticates the key ([`tenants`], constant-time digest lookup),
//! takes the tenant's concurrency and queue slots ([`limits`]) before any work for it, reads
//! the body (size-limited, with a deadline), parses and validates it into a request only the
//! validator can build ([`api::validate`]: bad JSON or a bad field is a 400 naming it; the
//! engine's door check runs there, so a request that cannot be served whole is refused before
//! any page is reserved), charges the tenant's tokens per minute, submits to the engine, and waits for the first
//! result before answering, so that errors up to then are proper HTTP errors built by one
//! function ([`error::ApiError::response`]). Streams are server-sent events in OpenAI's chunk
//! format; a failure after streaming began ends with an error event and no `[DONE]`. A client
//! that disconnects drops its `RequestStream`, which cancels the request in the engine.
//!
//! Entry points for the binary: [`run_serve_cli`] (`pagewarden serve`) and
//! [`run_tenant_add_cli`] (`pagewarden tenant add NAME`). Tests and embedders use
//! [`server::serve`] with their own shutdown future.

#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod error;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod state;
pub mod tenants;

use std::path::Path;

pub use config::{Config, ConfigError};
pub use server::{
    engine_config, load_model, model_path, run_gateway_cli, run_serve_cli, serve, serve_gateway, LoadedModel,
    ModelInfo, ServeError,
};
pub use tenants::{add_tenant, remove_tenant, rotate_key, TenantError};

/// The config file `pagewarden tenant add` writes when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "pagewarden.toml";

/// `pagewarden tenant add NAME [--config FILE]`: adds the tenant to the config file (default
/// [`DEFAULT_CONFIG_FILE`], created if missing) and prints its new key once, on stdout. Only the
/// key's SHA-256 digest is stored.
pub fn run_tenant_add_cli(config_path: Option<&Path>, name: &str) -> Result<(), TenantError> {
    let path = config_path.unwrap_or(Path::new(DEFAULT_CONFIG_FILE));
    let (id, key) = add_tenant(path, name)?;
    println!("{key}");
    eprintln!(
        "tenant `{name}` (id {}) added to {}; the key above is shown only this once (only its SHA-256 digest is \
         stored). Start the server with `pagewarden serve --config {}`, or {RELOAD_HINT}",
        id.0,
        path.display(),
        path.display()
    );
    Ok(())
}

const RELOAD_HINT: &str = "send SIGHUP to a running server or gateway to apply it (`kill -HUP PID`)";

/// `pagewarden tenant remove NAME [--config FILE]`.
pub fn run_tenant_remove_cli(config_path: Option<&Path>, name: &str) -> Result<(), TenantError> {
    let path = config_path.unwrap_or(Path::new(DEFAULT_CONFIG_FILE));
    let id = remove_tenant(path, name)?;
    eprintln!(
        "tenant `{name}` (id {}) removed from {}; its id will not be given out again. {RELOAD_HINT}: its key is \
         refused at once, its requests end and its cached prefixes are dropped on every worker.",
        id.0,
        path.display()
    );
    Ok(())
}

/// `pagewarden tenant rotate-key NAME [--config FILE]`: prints the new key once.
pub fn run_tenant_rotate_key_cli(config_path: Option<&Path>, name: &str) -> Result<(), TenantError> {
    let path = config_path.unwrap_or(Path::new(DEFAULT_CONFIG_FILE));
    let key = rotate_key(path, name)?;
    println!("{key}");
    eprintln!(
        "tenant `{name}` has a new key (shown only this once) in {}. {RELOAD_HINT}: the old key is refused at \
         once, requests made with it end and the tenant's cached prefixes are dropped.",
        path.display()
    );
    Ok(())
}
