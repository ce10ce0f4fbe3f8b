//! Node keys on disk and in the config file: `pagewarden node keygen` writes a node's private
//! key (owner-only, never over an existing file) and prints its identity (link key and
//! record-signing key, both public) for the others to pin; `pagewarden node identity` prints it
//! again from an existing key file; `pagewarden node revoke` removes a node from
//! `cluster.trusted_nodes`, edited in place like the tenant table (comments and layout kept,
//! written atomically), so a SIGHUP then evicts that node everywhere the file is read.

use std::io::Write;
use std::path::Path;

use base64::Engine;
use zeroize::Zeroizing;

use crate::config::{parse_node_public_key, TrustedNode};
use crate::private_file::read_node_key_file;
use crate::tenant_file::{io_err, read_document, write_document, TenantError};

/// Makes a key pair and writes its private half to `out` (base64, mode 0600, created new: an
/// existing file, perhaps another node's key, is never overwritten). Returns its identity.
pub fn keygen(out: &Path) -> Result<wire::NodeIdentity, TenantError> {
    let key = wire::NodeKey::generate().map_err(|e| TenantError::NodeKey(e.to_string()))?;
    let mut text = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(*key.private_bytes()));
    text.push('\n');
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(out).map_err(io_err("creating", out))?;
    let written = f.write_all(text.as_bytes()).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(out);
        return Err(io_err("writing", out)(e));
    }
    Ok(key.identity())
}

/// The identity of the node key in `file` (owner-only, as the node reads it): what configs
/// that pinned its bare link key now pin instead.
pub fn identity(file: &Path) -> Result<wire::NodeIdentity, TenantError> {
    Ok(read_node_key_file("--node-key-file", file)?.identity())
}

/// Removes every `cluster.trusted_nodes` entry of the node `key` names (its identity or its
/// link key alone) from the config file; returns the entries removed. Refused when the node is
/// not there, or is the last one.
pub fn revoke(config_path: &Path, key: &str) -> Result<Vec<TrustedNode>, TenantError> {
    let key = parse_node_public_key(key).ok_or_else(|| TenantError::BadNodeKey(key.to_string()))?;
    let (_, mut doc) = read_document(config_path)?;
    let array = doc
        .get_mut("cluster")
        .and_then(|c| c.get_mut("trusted_nodes"))
        .and_then(|t| t.as_array_mut())
        .ok_or_else(|| TenantError::NodeKeyNotTrusted(key.to_string()))?;
    let entry = |v: &toml_edit::Value| v.as_str().and_then(|s| s.parse::<TrustedNode>().ok());
    let removed: Vec<TrustedNode> = array.iter().filter_map(entry).filter(|t| t.identity.link == key).collect();
    if removed.is_empty() {
        return Err(TenantError::NodeKeyNotTrusted(key.to_string()));
    }
    if removed.len() == array.len() {
        return Err(TenantError::LastNodeKey(key.to_string()));
    }
    array.retain(|v| entry(v).is_none_or(|t| t.identity.link != key));
    write_document(config_path, &doc)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_an_owner_only_key_that_loads_and_never_overwrites_a_file() {
        let dir = launch::scratch_dir("pw-keygen").unwrap();
        let path = dir.join("node.key");
        let identity = keygen(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let c = crate::Config::from_toml_str(&format!("[cluster]\nnode_key_file = \"{}\"\n", path.display())).unwrap();
        assert_eq!(c.cluster.node_key().unwrap().identity(), identity);
        assert!(matches!(keygen(&path), Err(TenantError::Io { .. })));
        assert_eq!(c.cluster.node_key().unwrap().identity(), identity, "the first key is kept");
        assert_eq!(super::identity(&path).unwrap(), identity, "`node identity` prints what keygen printed");
        assert!(super::identity(&dir.join("missing.key")).is_err());
    }

    #[test]
    fn revoke_removes_the_node_from_trusted_nodes_by_identity_or_link_key_keeping_the_rest_of_the_file() {
        let dir = launch::scratch_dir("pw-revoke").unwrap();
        let (a, b, c) = ("11".repeat(64), "22".repeat(64), "33".repeat(64));
        let path = dir.join("pagewarden.toml");
        let text = format!(
            "# our cluster\n[cluster]\n# pinned\ntrusted_nodes = [\"gw:{a}\", \"decode-1:{b}\", \"decode-2:{c}\"]\n"
        );
        std::fs::write(&path, text).unwrap();
        let removed = revoke(&path, &b).unwrap();
        assert_eq!(removed[0].name.as_deref(), Some("decode-1"));
        // By the link key alone (what an older config or a log line names).
        let removed = revoke(&path, &"33".repeat(32)).unwrap();
        assert_eq!(removed[0].name.as_deref(), Some("decode-2"));
        let after = std::fs::read_to_string(&path).unwrap();
        assert!(after.contains("# our cluster") && after.contains("# pinned"), "{after}");
        assert!(!after.contains(&b) && !after.contains(&c), "{after}");
        let cfg = crate::Config::from_toml_str(&after).unwrap();
        assert_eq!(cfg.cluster.trusted_identities().unwrap(), vec![crate::config::parse_node_identity(&a).unwrap()]);
        assert!(matches!(revoke(&path, &b), Err(TenantError::NodeKeyNotTrusted(_))));
        assert!(matches!(revoke(&path, &a), Err(TenantError::LastNodeKey(_))));
        assert!(matches!(revoke(&path, "nope"), Err(TenantError::BadNodeKey(_))));
    }
}
