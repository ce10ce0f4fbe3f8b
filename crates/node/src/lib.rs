//! A pagewarden node: the deployment around the request path. It reads the configuration
//! every role shares, loads the model and the KV pool (refusing a pool that cannot hold one
//! request of the context window), and runs one topology until a signal drains it:
//!
//! * [`serve`]: the gateway, a prefill and a decode worker in one process over in-memory
//!   links;
//! * [`gateway_role`]: the HTTP API and the cluster listener workers register on;
//! * [`worker`]: a prefill or a decode worker registered with a gateway.
//!
//! SIGINT/SIGTERM drain; SIGHUP re-reads the tenant table, the cluster secrets and the TLS certificate. The
//! tenant commands edit the configuration file ([`tenant_file`]). The HTTP API itself lives in
//! the `gateway` crate, the request path below it in `cluster` and `engine`.

#![forbid(unsafe_code)]

pub mod cli;
mod cluster_settings;
pub mod config;
mod config_error;
mod config_span;
mod engine_settings;
mod error;
mod front;
pub mod gateway_role;
mod limits_settings;
pub mod member;
mod membership_settings;
mod metrics_settings;
pub mod model;
mod model_list;
pub mod node_keys;
mod pool_settings;
mod private_file;
pub mod secrets;
pub mod serve;
pub mod signals;
pub mod tenant_file;
mod tenants_settings;
pub mod tls_files;
pub mod usage_cli;
mod usage_settings;
pub mod worker;

pub use cli::{
    run_gateway_cli, run_node_identity_cli, run_node_keygen_cli, run_node_revoke_cli, run_serve_cli,
    run_tenant_add_cli, run_tenant_remove_cli, run_tenant_rotate_key_cli,
};
pub use config::{Config, ConfigError};
pub use error::ServeError;
pub use gateway_role::serve_gateway;
pub use model::{engine_config, load_model, model_path, LoadedModel, ModelInfo};
pub use serve::serve;
pub use tenant_file::{add_tenant, remove_tenant, rotate_key, TenantError};
