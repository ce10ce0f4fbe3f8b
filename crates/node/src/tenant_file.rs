//! The tenant table in the configuration file: `pagewarden tenant add | remove | rotate-key`
//! edit it in place (comments and layout kept, written atomically), and the development tenant
//! `serve` uses when the file names none.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use gateway::settings::TenantConfig;
use gateway::tenants::{hex, sha256};
use types::TenantId;
use zeroize::Zeroizing;

use crate::config::{valid_tenant_name, Config, ConfigError};

/// Why a key could not be made or stored.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("tenant name `{0}` must be 1-64 characters of A-Z a-z 0-9 - _ .")]
    BadName(String),
    #[error("tenant `{0}` already exists in the config file")]
    Exists(String),
    #[error("there is no tenant `{0}` in the config file")]
    NotFound(String),
    #[error("the config file is not valid TOML: {0}")]
    Toml(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "`{0}` is not a node identity or link key (128 or 64 hex digits or base64, as `pagewarden node keygen` prints)"
    )]
    BadNodeKey(String),
    #[error("node key {0} is not in cluster.trusted_nodes of the config file")]
    NodeKeyNotTrusted(String),
    #[error("node key {0} is the last one in cluster.trusted_nodes: an empty allow-list would refuse every peer")]
    LastNodeKey(String),
    #[error("cannot make a node key: {0}")]
    NodeKey(String),
    /// The OS error is the source, not part of this message: the CLI prints the chain, and
    /// putting it in both printed it twice.
    #[error("{action} {path}")]
    Io { action: &'static str, path: String, source: std::io::Error },
}

pub(crate) fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> TenantError + 'a {
    move |source| TenantError::Io { action, path: path.display().to_string(), source }
}

/// A new random API key: `pw-` and 64 hex digits (256 bits from the OS), wiped when dropped.
pub fn generate_key() -> Result<Zeroizing<String>, TenantError> {
    use std::fmt::Write as _;
    let bytes = Zeroizing::new(random_bytes::<32>()?);
    // Sized up front: a growing string would leave copies of the key behind.
    let mut key = Zeroizing::new(String::with_capacity(3 + 64));
    key.push_str("pw-");
    for b in bytes.iter() {
        let _ = write!(key, "{b:02x}");
    }
    Ok(key)
}

/// The config file as an editable document (comments and layout kept), empty if missing.
pub(crate) fn read_document(path: &Path) -> Result<(String, toml_edit::DocumentMut), TenantError> {
    let text = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err("reading", path)(e)),
    };
    // Validate as a config first, so an edit never starts from a file the server would refuse.
    Config::parse(&text, &path.display().to_string())?;
    let doc = text.parse::<toml_edit::DocumentMut>().map_err(|e| TenantError::Toml(e.to_string()))?;
    Ok((text, doc))
}

/// Writes `doc` back after checking the result is a valid config. Written to a temporary file
/// in the same directory and renamed over the old one, so a running gateway reloading on
/// SIGHUP reads either the old file or the new one, never half of one.
pub(crate) fn write_document(path: &Path, doc: &toml_edit::DocumentMut) -> Result<(), TenantError> {
    let text = doc.to_string();
    Config::from_toml_str(&text)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // A name nobody can guess or have left behind (a crashed run leaves its own, never ours),
    // created new (O_EXCL: never a file or link someone put there) and owner-only until
    // it is whole.
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("config"),
        std::process::id(),
        hex(&random_bytes::<8>()?)
    ));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(io_err("creating", &tmp))?;
    let written = fill_and_replace(&mut f, &tmp, path, text.as_bytes());
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn fill_and_replace(f: &mut std::fs::File, tmp: &Path, path: &Path, text: &[u8]) -> Result<(), TenantError> {
    f.write_all(text).map_err(io_err("writing", tmp))?;
    // The old file's permissions when there is one (the operator chose them); a new file is
    // owner-only: it names every tenant.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o600);
        f.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io_err("writing", tmp))?;
    }
    f.sync_all().map_err(io_err("writing", tmp))?;
    std::fs::rename(tmp, path).map_err(io_err("replacing", path))
}

fn random_bytes<const N: usize>() -> Result<[u8; N], TenantError> {
    let path = Path::new("/dev/urandom");
    let mut buf = [0u8; N];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut buf)).map_err(io_err("reading", path))?;
    Ok(buf)
}

/// The `[[tenants]]` array of `doc`, created if missing.
fn tenant_tables(doc: &mut toml_edit::DocumentMut) -> Result<&mut toml_edit::ArrayOfTables, TenantError> {
    doc.entry("tenants")
        .or_insert_with(|| toml_edit::Item::ArrayOfTables(toml_edit::ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| TenantError::Toml("`tenants` must be an array of tables ([[tenants]])".into()))
}

fn key_digest_value(key: &str) -> toml_edit::Item {
    toml_edit::value(hex(&sha256(key.as_bytes())))
}

/// `pagewarden tenant add NAME`: makes a key, appends the tenant (its new id, name and key
/// digest only) to the config file (created if missing), and returns the id and the key,
/// which is shown once and stored nowhere. The id is one above every id ever given out
/// (`last_tenant_id`, which it raises), so a removed tenant's id is never reused.
pub fn add_tenant(config_path: &Path, name: &str) -> Result<(TenantId, Zeroizing<String>), TenantError> {
    if !valid_tenant_name(name) {
        return Err(TenantError::BadName(name.to_string()));
    }
    let (text, mut doc) = read_document(config_path)?;
    let config = Config::from_toml_str(&text)?;
    if config.tenants.iter().any(|t| t.name == name) {
        return Err(TenantError::Exists(name.to_string()));
    }
    let id = config.last_tenant_id + 1;
    let key = generate_key()?;
    doc["last_tenant_id"] = toml_edit::value(id as i64);
    let mut t = toml_edit::Table::new();
    t["id"] = toml_edit::value(id as i64);
    t["name"] = toml_edit::value(name);
    t["key_sha256"] = key_digest_value(&key);
    tenant_tables(&mut doc)?.push(t);
    write_document(config_path, &doc)?;
    Ok((TenantId(id), key))
}

/// The index of tenant `name` in the file's `[[tenants]]`.
fn find_tenant(doc: &mut toml_edit::DocumentMut, name: &str) -> Result<usize, TenantError> {
    tenant_tables(doc)?
        .iter()
        .position(|t| t.get("name").and_then(|v| v.as_str()) == Some(name))
        .ok_or_else(|| TenantError::NotFound(name.to_string()))
}

/// `pagewarden tenant remove NAME`: removes the tenant from the config file; `last_tenant_id`
/// keeps its id from being given out again. A running gateway applies it on SIGHUP.
pub fn remove_tenant(config_path: &Path, name: &str) -> Result<TenantId, TenantError> {
    let (text, mut doc) = read_document(config_path)?;
    let config = Config::from_toml_str(&text)?;
    let id = config
        .tenants
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.id)
        .ok_or_else(|| TenantError::NotFound(name.to_string()))?;
    let at = find_tenant(&mut doc, name)?;
    doc["last_tenant_id"] = toml_edit::value(config.last_tenant_id as i64);
    tenant_tables(&mut doc)?.remove(at);
    write_document(config_path, &doc)?;
    Ok(id)
}

/// `pagewarden tenant rotate-key NAME`: gives the tenant a new key (same id, limits and
/// name) and returns it; the old key stops working when the gateway reloads.
pub fn rotate_key(config_path: &Path, name: &str) -> Result<Zeroizing<String>, TenantError> {
    let (_, mut doc) = read_document(config_path)?;
    let at = find_tenant(&mut doc, name)?;
    let key = generate_key()?;
    let table = tenant_tables(&mut doc)?.get_mut(at).ok_or_else(|| TenantError::NotFound(name.to_string()))?;
    table["key_sha256"] = key_digest_value(&key);
    write_document(config_path, &doc)?;
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
    let key = match std::fs::read_to_string(&path).map(Zeroizing::new) {
        Ok(k) if !k.trim().is_empty() => Zeroizing::new(k.trim().to_string()),
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
        id: TenantId(1),
        name: "dev".into(),
        key_sha256: sha256(key.as_bytes()),
        max_concurrent: 8,
        max_queued: 32,
        tokens_per_minute: 0,
        max_body_bytes: None,
        models: None,
    })
}

#[cfg(test)]
mod tests {
    use gateway::tenants::{TenantDirectory, Tenants};

    use super::*;

    #[test]
    fn a_file_that_cannot_be_written_says_its_os_error_once() {
        let p = std::env::temp_dir().join(format!("pw-tenant-{}-absent-dir", std::process::id())).join("pw.toml");
        let e = add_tenant(&p, "acme").err().unwrap();
        assert!(matches!(e, TenantError::Io { .. }), "{e:?}");
        let text = crate::config_error::Chain(&e).to_string();
        assert!(text.contains("absent-dir"), "{text}");
        assert_eq!(text.matches("os error 2").count(), 1, "{text}");
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
        let (id, key) = add_tenant(&path, "alice").unwrap();
        let (id2, key2) = add_tenant(&path, "bob").unwrap();
        assert_eq!((id, id2), (TenantId(1), TenantId(2)));
        assert_ne!(key, key2);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(key.as_str()), "the key itself must not be stored");
        assert!(text.contains(&hex(&sha256(key.as_bytes()))));
        let cfg = Config::load(&path).unwrap();
        let ts = Tenants::new(cfg.tenants);
        assert_eq!(ts.authenticate(&key).map(|t| t.config.name.as_str()), Some("alice"));
        assert_eq!(ts.authenticate(&key2).map(|t| t.config.name.as_str()), Some("bob"));
        assert!(matches!(add_tenant(&path, "alice"), Err(TenantError::Exists(_))));
        assert!(matches!(add_tenant(&path, "bad name"), Err(TenantError::BadName(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ids_are_never_reused_after_removal_and_rotation_keeps_the_id() {
        let dir = std::env::temp_dir().join(format!("pw-gw-tenant-ids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pagewarden.toml");
        std::fs::write(&path, "# operator's note, kept\nlisten = \"127.0.0.1:0\"\n").unwrap();
        let (alice, _) = add_tenant(&path, "alice").unwrap();
        let (bob, bob_key) = add_tenant(&path, "bob").unwrap();
        assert_eq!(remove_tenant(&path, "bob").unwrap(), bob);
        assert!(matches!(remove_tenant(&path, "bob"), Err(TenantError::NotFound(_))));
        let (carol, _) = add_tenant(&path, "carol").unwrap();
        assert_eq!(carol, TenantId(3), "bob's id 2 is not given out again");
        let (bob_again, _) = add_tenant(&path, "bob").unwrap();
        assert_eq!(bob_again, TenantId(4), "not even to a tenant of the same name");
        let cfg = Config::load(&path).unwrap();
        let old = Tenants::new(cfg.tenants);
        assert!(old.authenticate(&bob_key).is_none());
        let old_alice_key_digest = old.by_id(alice).unwrap().config.key_sha256;
        let new_key = rotate_key(&path, "alice").unwrap();
        let cfg = Config::load(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# operator's note, kept"), "{text}");
        let next = Tenants::new(cfg.tenants);
        assert_eq!(next.authenticate(&new_key).map(|t| t.id), Some(alice), "same id after rotation");
        assert_ne!(next.by_id(alice).unwrap().config.key_sha256, old_alice_key_digest);
        let dir_ = TenantDirectory::new(old);
        assert_eq!(dir_.replace(next), vec![alice], "a rotated key revokes its tenant's state");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn the_config_is_rewritten_through_a_fresh_owner_only_temp_file_and_keeps_the_mode_it_had() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pw-gw-tenant-tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pagewarden.toml");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        add_tenant(&path, "alice").unwrap();
        assert_eq!(mode(&path), 0o600, "a new config file names tenants: owner-only");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        add_tenant(&path, "bob").unwrap();
        assert_eq!(mode(&path), 0o640, "the operator's mode is kept");

        // A link planted at the temporary name earlier versions used, pointing at a file of
        // the victim's, and a crashed run's leftover: neither is written nor in the way.
        let victim = dir.join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let planted = dir.join(format!(".pagewarden.toml.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let stale = dir.join(".pagewarden.toml.tmp-1-0011223344556677");
        std::fs::write(&stale, "half a config").unwrap();
        add_tenant(&path, "carol").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(Config::load(&path).unwrap().tenants.len(), 3);
        let mut left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        let mut expected = vec![
            planted.file_name().unwrap(),
            stale.file_name().unwrap(),
            "pagewarden.toml".as_ref(),
            "victim".as_ref(),
        ];
        expected.sort();
        assert_eq!(left, expected, "no temporary file of ours is left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
