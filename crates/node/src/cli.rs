//! The entry points the binary dispatches to: each role from a config file (or the defaults)
//! with the command line's overrides, and the tenant commands.

use std::path::Path;

use crate::config::Config;
use crate::config_error::invalid;
use crate::error::ServeError;
use crate::gateway_role::serve_gateway;
use crate::serve::serve;
use crate::signals::shutdown_signal;
use crate::tenant_file::{add_tenant, remove_tenant, rotate_key, TenantError};

/// The config file (or the defaults) with `--listen` applied.
fn cli_config(config_path: Option<&Path>, listen: Option<&str>) -> Result<Config, ServeError> {
    let mut config = match config_path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(l) = listen {
        // A command-line value: no file line to point at.
        config.listen =
            l.parse().map_err(|_| invalid("listen", format!("`{l}` is not an address such as 127.0.0.1:8080")))?;
    }
    Ok(config)
}

/// Config errors a role finds while starting (its secret files, its trusted nodes), tied to
/// their line in the config file `source`.
pub(crate) fn located(source: Option<&Path>) -> impl Fn(ServeError) -> ServeError + '_ {
    move |e| match (e, source) {
        (ServeError::Config(c), Some(path)) => ServeError::Config(crate::config_span::locate_in_file(c, path)),
        (e, _) => e,
    }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ServeError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io(format!("cannot start the async runtime: {e}")))
}

/// `pagewarden serve [--config FILE] [--listen ADDR]`: loads and validates the config (no file:
/// the defaults and a development tenant), then serves until SIGINT/SIGTERM and drains.
pub fn run_serve_cli(config_path: Option<&Path>, listen: Option<&str>) -> Result<(), ServeError> {
    let config = cli_config(config_path, listen)?;
    let source = config.source.clone();
    runtime()?.block_on(serve(config, shutdown_signal(), |_| {})).map_err(located(source.as_deref()))
}

/// `pagewarden gateway [--config FILE] [--listen ADDR] [--cluster-listen ADDR] [--node-key FILE]`.
pub fn run_gateway_cli(
    config_path: Option<&Path>,
    listen: Option<&str>,
    cluster_listen: Option<&str>,
    node_key: Option<&Path>,
) -> Result<(), ServeError> {
    let mut config = cli_config(config_path, listen)?;
    if let Some(c) = cluster_listen {
        config.cluster.listen = c.to_string();
    }
    if let Some(k) = node_key {
        config.cluster.node_key_file = Some(k.to_path_buf());
    }
    let source = config.source.clone();
    runtime()?.block_on(serve_gateway(config, shutdown_signal(), |_| {})).map_err(located(source.as_deref()))
}

/// `pagewarden node keygen --out FILE`: writes a new node key (owner-only) and prints its
/// identity (public), the line to pin in every node's `cluster.trusted_nodes`.
pub fn run_node_keygen_cli(out: &Path) -> Result<(), TenantError> {
    let identity = crate::node_keys::keygen(out)?;
    println!("{identity}");
    eprintln!(
        "node key written to {} (owner-only; point this node's cluster.node_key_file at it). Pin the identity above \
         in cluster.trusted_nodes on every node of the cluster, then SIGHUP them.",
        out.display()
    );
    Ok(())
}

/// `pagewarden node identity --node-key-file FILE`: prints the identity of an existing key
/// (public), to replace an entry of `cluster.trusted_nodes` that pins its link key alone.
pub fn run_node_identity_cli(file: &Path) -> Result<(), TenantError> {
    println!("{}", crate::node_keys::identity(file)?);
    Ok(())
}

/// `pagewarden node revoke KEY [--config FILE]`: removes the node (its identity or link key)
/// from `cluster.trusted_nodes`.
pub fn run_node_revoke_cli(config_path: Option<&Path>, key: &str) -> Result<(), TenantError> {
    let path = config_path.unwrap_or(Path::new(DEFAULT_CONFIG_FILE));
    let removed = crate::node_keys::revoke(path, key)?;
    let names: Vec<String> =
        removed.iter().map(|t| t.name.clone().unwrap_or_else(|| t.identity.link.fingerprint())).collect();
    eprintln!(
        "node key {key} ({}) removed from cluster.trusted_nodes in {}. Send SIGHUP to every node reading this file \
         (`kill -HUP PID`; copy it to other hosts first): each closes its links with that node within seconds and \
         refuses it from then on.",
        names.join(", "),
        path.display()
    );
    Ok(())
}

/// The config file `pagewarden tenant add` writes when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "pagewarden.toml";

/// `pagewarden tenant add NAME [--config FILE]`: adds the tenant to the config file (default
/// [`DEFAULT_CONFIG_FILE`], created if missing) and prints its new key once, on stdout. Only the
/// key's SHA-256 digest is stored.
pub fn run_tenant_add_cli(config_path: Option<&Path>, name: &str) -> Result<(), TenantError> {
    let path = config_path.unwrap_or(Path::new(DEFAULT_CONFIG_FILE));
    let (id, key) = add_tenant(path, name)?;
    println!("{}", key.as_str());
    eprintln!(
        "tenant `{name}` (id {}) added to {}; the key above is shown only this once (only its SHA-256 digest is \
         stored). Start the server with `pagewarden serve --config {}`, or {}",
        id.0,
        path.display(),
        path.display(),
        apply(path)
    );
    Ok(())
}

const RELOAD_HINT: &str = "send SIGHUP to a running server or gateway to apply it (`kill -HUP PID`)";

/// How the change reaches running gateways, said to the operator: with `[membership]` in the
/// file it is announced through etcd and every gateway re-reads its copy of the file (each
/// host needs the new file); otherwise, or when etcd cannot be reached, SIGHUP applies it.
/// The file is changed either way, so a failed announcement is a warning, not a failure
/// (the key `tenant add` printed must not be lost to a script that stops on errors).
fn apply(path: &Path) -> String {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            return format!("{RELOAD_HINT} (the file does not load as a config yet: {})", crate::config::Chain(&e))
        }
    };
    let Some(m) = config.membership.clone() else { return RELOAD_HINT.to_string() };
    let digest = gateway::tenants::Tenants::new(config.tenants).digest();
    let announced = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io(e.to_string()))
        .and_then(|rt| rt.block_on(crate::member::announce_tenants(&m, digest)));
    match announced {
        Ok(()) => format!(
            "announced through etcd ({}): every gateway re-reads its tenant file now and applies it once it is \
             this one (copy it to each gateway's host)",
            m.prefix
        ),
        Err(e) => format!("NOT announced ({e}): {RELOAD_HINT} on every gateway"),
    }
}

/// `pagewarden tenant remove NAME [--config FILE]`.
pub fn run_tenant_remove_cli(config_path: Option<&Path>, name: &str) -> Result<(), TenantError> {
    let path = config_path.unwrap_or(Path::new(DEFAULT_CONFIG_FILE));
    let id = remove_tenant(path, name)?;
    eprintln!(
        "tenant `{name}` (id {}) removed from {}; its id will not be given out again. Once applied its key is \
         refused, its requests end and its cached prefixes are dropped on every worker: {}.",
        id.0,
        path.display(),
        apply(path)
    );
    Ok(())
}

/// `pagewarden tenant rotate-key NAME [--config FILE]`: prints the new key once.
pub fn run_tenant_rotate_key_cli(config_path: Option<&Path>, name: &str) -> Result<(), TenantError> {
    let path = config_path.unwrap_or(Path::new(DEFAULT_CONFIG_FILE));
    let key = rotate_key(path, name)?;
    println!("{}", key.as_str());
    eprintln!(
        "tenant `{name}` has a new key (shown only this once) in {}. Once applied the old key is refused, \
         requests made with it end and the tenant's cached prefixes are dropped: {}.",
        path.display(),
        apply(path)
    );
    Ok(())
}
