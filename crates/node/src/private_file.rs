//! Files that must stay private: a cluster secret, the metrics token or a TLS key. Refused when readable
//! by group or others (naming the file and `chmod 600`) or shorter than [`MIN_SECRET_LEN`]
//! characters; every error names the configuration field.

use std::path::Path;

use crate::config_error::{invalid, ConfigError};

/// The fewest characters a cluster secret may have.
pub const MIN_SECRET_LEN: usize = 32;

/// One secret file: at least [`MIN_SECRET_LEN`] characters, and readable by its owner only
/// (anyone who can read it can join the cluster and read its traffic).
pub(crate) fn read_secret_file(field: &'static str, path: &Path) -> Result<wire::ClusterSecret, ConfigError> {
    let secret = read_private_text(field, path)?;
    Ok(wire::ClusterSecret::from_passphrase(secret.as_bytes()))
}

/// The trimmed text of a file that must be private (mode 600) and hold at least
/// [`MIN_SECRET_LEN`] characters: a cluster secret or the metrics token.
pub(crate) fn read_private_text(field: &'static str, path: &Path) -> Result<String, ConfigError> {
    check_private(field, path)?;
    let text =
        std::fs::read_to_string(path).map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?;
    let secret = text.trim();
    if secret.len() < MIN_SECRET_LEN {
        return Err(invalid(
            field,
            format!("the secret in {} has {} characters; use at least {MIN_SECRET_LEN}", path.display(), secret.len()),
        ));
    }
    Ok(secret.to_string())
}

/// Refuses a file that group or others may read (naming it and `chmod 600`): a secret, or a
/// TLS private key.
pub(crate) fn check_private(field: &'static str, path: &Path) -> Result<(), ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(invalid(
                field,
                format!(
                    "{} is readable by group or others (mode {mode:04o}); run `chmod 600 {}`",
                    path.display(),
                    path.display()
                ),
            ));
        }
    }
    let _ = meta;
    Ok(())
}
