//! `[metrics]`: where `/metrics` is served and what its labels say, validated at start-up.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config_error::{invalid, ConfigError};
use crate::private_file::read_private_text;

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    listen: Option<String>,
    token_file: Option<PathBuf>,
    tenant_names: Option<bool>,
}

/// `[metrics]`: where `/metrics` is served and what its labels say. The exposition shows
/// per-tenant load and cache use, so the public listener serves it only with the token.
#[derive(Debug, Clone, Default)]
pub struct MetricsSettings {
    /// A listener of its own (no authentication: for a private network or a local scraper).
    pub listen: Option<SocketAddr>,
    /// A file holding the bearer token `/metrics` on the public listener asks for.
    pub token_file: Option<PathBuf>,
    /// Tenant labels are names (true) or numeric ids (false, the default).
    pub tenant_names: bool,
}

impl RawMetrics {
    pub(crate) fn settings(self) -> Result<MetricsSettings, ConfigError> {
        let listen = self
            .listen
            .map(|a| {
                a.parse()
                    .map_err(|_| invalid("metrics.listen", format!("`{a}` is not an address such as 127.0.0.1:9090")))
            })
            .transpose()?;
        Ok(MetricsSettings { listen, token_file: self.token_file, tenant_names: self.tenant_names.unwrap_or(false) })
    }
}

impl MetricsSettings {
    /// Reads the token file, if one is configured (mode 600, 32+ characters, like a cluster
    /// secret: whoever holds it sees every tenant's load).
    pub fn token(&self) -> Result<Option<zeroize::Zeroizing<String>>, ConfigError> {
        self.token_file.as_deref().map(|p| read_private_text("metrics.token_file", p)).transpose()
    }
}
