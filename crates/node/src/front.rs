//! The API front of a node that serves it (`serve`, `gateway`): the router's identity and
//! timeouts, the initial tenant table, and the HTTP side's setup from the configuration.

use std::path::PathBuf;
use std::sync::Arc;

use cluster::{Identity, RouterConfig, SecretRing};
use gateway::http::HttpSetup;
use gateway::served::{Models, ServedModel};
use gateway::settings::ApiSettings;
use gateway::tenants::{sha256, Tenants};
use gateway::tls::ServerCertificate;
use tokio::sync::watch;
use wire::Role;

use crate::config::Config;
use crate::error::ServeError;
use crate::model::ModelInfo;
use crate::signals::reload_tenants;
use crate::tenant_file::{dev_key_path, dev_tenant};

pub(crate) fn router_config(
    config: &Config,
    info: &ModelInfo,
    secrets: SecretRing,
) -> Result<RouterConfig, ServeError> {
    Ok(RouterConfig {
        identity: Identity { secrets, role: Role::Gateway, pairing: info.pairing()? },
        context: info.context,
        vocab: info.config.vocab,
        handshake_timeout: config.cluster.handshake_timeout,
        transfer_timeout: config.cluster.transfer_timeout,
        max_pending_handshakes: config.cluster.max_pending_handshakes,
        max_pending_handshakes_per_source: config.cluster.max_pending_handshakes_per_source,
        routing: config.cluster.routing,
    })
}

/// The configured tenants, or the development tenant when none is configured (`true`).
pub(crate) fn initial_tenants(config: &Config) -> Result<(Tenants, bool), ServeError> {
    if config.tenants.is_empty() {
        return Ok((Tenants::new(vec![dev_tenant()?]), true));
    }
    Ok((Tenants::new(config.tenants.clone()), false))
}

/// The HTTP side's setup: `config`'s listeners, limits and tenants (reloaded on SIGHUP when
/// the config came from a file), the metrics token read once (a missing, loose or short token
/// file fails here); `tls` from [`tls_certificate`].
pub(crate) fn http_setup(
    config: &Config,
    models: Vec<ServedModel>,
    (tenants, dev): (Tenants, bool),
    tls: Option<Arc<ServerCertificate>>,
    announced: Option<watch::Receiver<Option<String>>>,
) -> Result<HttpSetup, ServeError> {
    let models = Models::new(models).ok_or_else(|| ServeError::Io("no models, or two with one name".into()))?;
    let metrics_token = config.metrics.token()?.map(|t| sha256(t.as_bytes()));
    let dev_key: Option<PathBuf> = dev.then(dev_key_path);
    Ok(HttpSetup {
        listen: config.listen,
        metrics_listen: config.metrics.listen,
        metrics_token,
        admin_key: config.admin_key()?,
        settings: ApiSettings { limits: config.limits.clone(), tenant_names: config.metrics.tenant_names },
        models,
        tenant_updates: reload_tenants(config.source.clone(), dev, tenants.digest(), announced),
        tenants,
        dev_key,
        usage: config.usage.clone(),
        tls,
        gateways: None,
        membership_rejected: None,
    })
}

/// `[tls]`'s certificate, checked before anything slow starts (a bad file fails at once) and
/// reloaded on every SIGHUP from then on.
pub(crate) fn tls_certificate(config: &Config) -> Result<Option<Arc<ServerCertificate>>, ServeError> {
    Ok(config.tls.as_ref().map(|t| t.serve()).transpose()?)
}
