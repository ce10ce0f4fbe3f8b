//! Tenants: API keys stored only as SHA-256 digests, looked up in constant time (invariant 11),
//! new keys for the CLI, and the development tenant used when no tenant is configured.
//!
//! Keys are never logged; logs carry tenant ids, metrics ids or (if configured) names.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use kv::TenantId;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::config::{valid_tenant_name, Config, ConfigError, TenantConfig};

/// An authenticated tenant: its engine id (index + 1) and configuration.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: TenantId,
    pub config: TenantConfig,
}

/// All tenants of the server.
#[derive(Debug, Clone)]
pub struct Tenants {
    list: Vec<Tenant>,
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Tenants {
    pub fn new(configs: Vec<TenantConfig>) -> Tenants {
        let list =
            configs.into_iter().enumerate().map(|(i, config)| Tenant { id: TenantId(i as u64 + 1), config }).collect();
        Tenants { list }
    }

    /// The tenant whose key digest equals SHA-256(`key`). Every tenant's digest is compared, in
    /// constant time, with no early exit: the time taken does not depend on which tenant (if
    /// any) matched nor on how many leading bytes of a digest agree.
    pub fn authenticate(&self, key: &str) -> Option<&Tenant> {
        let digest = sha256(key.as_bytes());
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u64;
        for (i, t) in self.list.iter().enumerate() {
            let hit = t.config.key_sha256.ct_eq(&digest);
            index.conditional_assign(&(i as u64), hit);
            found |= hit;
        }
        if bool::from(found) {
            self.list.get(index as usize)
        } else {
            None
        }
    }

    pub fn by_id(&self, id: TenantId) -> Option<&Tenant> {
        self.list.iter().find(|t| t.id == id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Tenant> {
        self.list.iter()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Why a key could not be made or stored.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("tenant name `{0}` must be 1-64 characters of A-Z a-z 0-9 - _ .")]
    BadName(String),
    #[error("tenant `{0}` already exists in the config file")]
    Exists(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{action} {path}: {source}")]
    Io { action: &'static str, path: String, source: std::io::Error },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> TenantError + 'a {
    move |source| TenantError::Io { action, path: path.display().to_string(), source }
}

/// A new random API key: `pw-` and 64 hex digits (256 bits from the OS).
pub fn generate_key() -> Result<String, TenantError> {
    let path = Path::new("/dev/urandom");
    let mut buf = [0u8; 32];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut buf)).map_err(io_err("reading", path))?;
    Ok(format!("pw-{}", hex(&buf)))
}

/// `pagewarden tenant add NAME`: makes a key, appends the tenant (name and key digest only) to
/// the config file (created if missing), and returns the key, which is shown once and stored
/// nowhere.
pub fn add_tenant(config_path: &Path, name: &str) -> Result<String, TenantError> {
    if !valid_tenant_name(name) {
        return Err(TenantError::BadName(name.to_string()));
    }
    let existing = match std::fs::read_to_string(config_path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err("reading", config_path)(e)),
    };
    let config = Config::from_toml_str(&existing)?;
    if config.tenants.iter().any(|t| t.name == name) {
        return Err(TenantError::Exists(name.to_string()));
    }
    let key = generate_key()?;
    let mut block = String::new();
    if !existing.is_empty() && !existing.ends_with('\n') {
        block.push('\n');
    }
    block.push_str(&format!("\n[[tenants]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n", hex(&sha256(key.as_bytes()))));
    // Check that the result is still a valid config before writing anything.
    Config::from_toml_str(&format!("{existing}{block}"))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(config_path)
        .map_err(io_err("opening", config_path))?;
    f.write_all(block.as_bytes()).map_err(io_err("writing", config_path))?;
    Ok(key)
}

/// Where the development tenant's key lives: `<cache dir>/dev-key`.
pub fn dev_key_path() -> PathBuf {
    fetch::cache_dir().join("dev-key")
}

/// The development tenant (used when the config names no tenant): its key is generated once
/// and kept in [`dev_key_path`] with mode 0600.
pub fn dev_tenant() -> Result<TenantConfig, TenantError> {
    let path = dev_key_path();
    let key = match std::fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => k.trim().to_string(),
        Ok(_) | Err(_) => {
            let key = generate_key()?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
            }
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(&path).map_err(io_err("creating", &path))?;
            f.write_all(key.as_bytes()).map_err(io_err("writing", &path))?;
            key
        }
    };
    Ok(TenantConfig {
        name: "dev".into(),
        key_sha256: sha256(key.as_bytes()),
        max_concurrent: 8,
        max_queued: 32,
        tokens_per_minute: 0,
        max_body_bytes: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, key: &str) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            key_sha256: sha256(key.as_bytes()),
            max_concurrent: 1,
            max_queued: 1,
            tokens_per_minute: 0,
            max_body_bytes: None,
        }
    }

    #[test]
    fn constant_time_lookup_finds_the_right_tenant() {
        let ts = Tenants::new(vec![tenant("a", "key-a"), tenant("b", "key-b"), tenant("c", "key-c")]);
        assert_eq!(ts.authenticate("key-a").map(|t| t.config.name.as_str()), Some("a"));
        assert_eq!(ts.authenticate("key-b").map(|t| t.config.name.as_str()), Some("b"));
        assert_eq!(ts.authenticate("key-c").map(|t| t.id), Some(TenantId(3)));
        assert!(ts.authenticate("key-d").is_none());
        assert!(ts.authenticate("").is_none());
        assert!(Tenants::new(vec![]).authenticate("key-a").is_none());
    }

    #[test]
    fn dev_tenant_key_is_made_once_and_kept_private() {
        // The only test of this binary that reads the cache directory.
        let dir = std::env::temp_dir().join(format!("pw-gw-devkey-{}", std::process::id()));
        std::env::set_var("PAGEWARDEN_CACHE_DIR", &dir);
        let a = dev_tenant().unwrap();
        let b = dev_tenant().unwrap();
        assert_eq!(a.key_sha256, b.key_sha256);
        let key = std::fs::read_to_string(dir.join("dev-key")).unwrap();
        assert_eq!(sha256(key.trim().as_bytes()), a.key_sha256);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("dev-key")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn add_tenant_stores_only_the_digest_and_the_key_authenticates() {
        let dir = std::env::temp_dir().join(format!("pw-gw-tenant-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pagewarden.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:0\"\n").unwrap();
        let key = add_tenant(&path, "alice").unwrap();
        let key2 = add_tenant(&path, "bob").unwrap();
        assert_ne!(key, key2);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&key), "the key itself must not be stored");
        assert!(text.contains(&hex(&sha256(key.as_bytes()))));
        let cfg = Config::load(&path).unwrap();
        let ts = Tenants::new(cfg.tenants);
        assert_eq!(ts.authenticate(&key).map(|t| t.config.name.as_str()), Some("alice"));
        assert_eq!(ts.authenticate(&key2).map(|t| t.config.name.as_str()), Some("bob"));
        assert!(matches!(add_tenant(&path, "alice"), Err(TenantError::Exists(_))));
        assert!(matches!(add_tenant(&path, "bad name"), Err(TenantError::BadName(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
