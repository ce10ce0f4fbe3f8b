//! Files that must stay private: a cluster secret, the metrics token or a TLS key. Refused when readable
//! by group or others (naming the file and `chmod 600`); a cluster secret must be at least
//! [`MIN_SECRET_BYTES`] random bytes written as hex or base64, a token at least
//! [`MIN_SECRET_LEN`] characters; every error names the configuration field. What is read is
//! wiped from memory when dropped.

use std::path::Path;

use base64::Engine;
use zeroize::Zeroizing;

use crate::config_error::{invalid, ConfigError};

/// The fewest characters a token (metrics, admin) may have.
pub const MIN_SECRET_LEN: usize = 32;
/// The fewest bytes a cluster secret file may encode.
pub const MIN_SECRET_BYTES: usize = 32;
/// What a cluster secret file holds, and how to make one: said in every refusal.
const SECRET_RULE: &str = "a cluster secret file must hold at least 32 random bytes written as hex or base64; \
                           make one with `(umask 077; head -c 48 /dev/urandom | base64 > FILE)`";

/// One cluster secret file: readable by its owner only (anyone who can read it can join the
/// cluster and read its traffic), and [`MIN_SECRET_BYTES`] or more bytes in hex or base64.
/// A length in characters let passphrases through whose guessable words made them weak; the
/// format is checked instead, so the file can only be what a generator writes. The secret is
/// derived from the file's text as it always was, so files that pass keep their secret.
pub(crate) fn read_secret_file(field: &'static str, path: &Path) -> Result<wire::ClusterSecret, ConfigError> {
    check_private(field, path)?;
    let text = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?,
    );
    let secret = text.trim();
    match encoded_bytes(secret) {
        Some(n) if n >= MIN_SECRET_BYTES => Ok(wire::ClusterSecret::from_passphrase(secret.as_bytes())),
        Some(n) => Err(invalid(field, format!("{} encodes {n} bytes; {SECRET_RULE}", path.display()))),
        None => Err(invalid(field, format!("{} is neither hex nor base64; {SECRET_RULE}", path.display()))),
    }
}

/// A node's key file (`pagewarden node keygen` writes it): readable by its owner only (whoever
/// reads it can pose as this node), holding the 32-byte X25519 private key in base64.
pub(crate) fn read_node_key_file(field: &'static str, path: &Path) -> Result<wire::NodeKey, ConfigError> {
    check_private(field, path)?;
    let text = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?,
    );
    let rule =
        "a node key file holds a 32-byte private key in base64; make one with `pagewarden node keygen --out FILE`";
    let decoded = Zeroizing::new(
        base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(text.trim().as_bytes())
            .map_err(|_| invalid(field, format!("{} is not base64; {rule}", path.display())))?,
    );
    let private: Zeroizing<[u8; wire::NODE_KEY_LEN]> = Zeroizing::new(
        decoded
            .as_slice()
            .try_into()
            .map_err(|_| invalid(field, format!("{} holds {} bytes; {rule}", path.display(), decoded.len())))?,
    );
    wire::NodeKey::from_private(*private).map_err(|e| invalid(field, format!("{}: {e}", path.display())))
}

/// How many bytes `text` encodes: as hex when every character is a hex digit (so a short hex
/// string never counts as more bytes read as base64), else as standard base64, padding
/// optional, lines allowed (`base64` wraps long output); `None` when it is neither.
fn encoded_bytes(text: &str) -> Option<usize> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return text.len().is_multiple_of(2).then_some(text.len() / 2);
    }
    let joined = Zeroizing::new(text.lines().map(str::trim_end).collect::<String>());
    let decoded = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT.decode(joined.as_bytes()).ok()?;
    Some(Zeroizing::new(decoded).len())
}

/// The trimmed text of a file that must be private (mode 600) and hold at least
/// [`MIN_SECRET_LEN`] characters: the metrics token or the admin key.
pub(crate) fn read_private_text(field: &'static str, path: &Path) -> Result<Zeroizing<String>, ConfigError> {
    check_private(field, path)?;
    let text = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?,
    );
    let secret = text.trim();
    if secret.len() < MIN_SECRET_LEN {
        return Err(invalid(
            field,
            format!("the secret in {} has {} characters; use at least {MIN_SECRET_LEN}", path.display(), secret.len()),
        ));
    }
    Ok(Zeroizing::new(secret.to_string()))
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

#[cfg(test)]
mod tests {
    use super::encoded_bytes;

    #[test]
    fn a_secret_counts_the_bytes_its_hex_or_base64_encodes() {
        assert_eq!(encoded_bytes(&"ab".repeat(32)), Some(32));
        // `head -c 48 /dev/urandom | base64`, and the same without padding or wrapped.
        assert_eq!(encoded_bytes("q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJCrze8SNFZ4kKvN7xI0VniQ"), Some(48));
        assert_eq!(encoded_bytes("q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJCrze8SNFZ4kKvN7xI0Vg=="), Some(46));
        assert_eq!(encoded_bytes("q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJCrze8SNFZ4kKvN7xI0Vg"), Some(46));
        assert_eq!(encoded_bytes("q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQ\nq83vEjRWeJCrze8SNFZ4kKvN7xI0VniQ"), Some(48));
        // 48 hex digits are 24 bytes, never 36 read as base64.
        assert_eq!(encoded_bytes(&"0f".repeat(24)), Some(24));
        assert_eq!(encoded_bytes(&"a".repeat(63)), None, "odd hex");
        assert_eq!(encoded_bytes("correct horse battery staple, correct horse battery staple"), None);
        assert_eq!(encoded_bytes("test-cluster-secret-0123456789abcdef-0123456789"), None);
        assert_eq!(encoded_bytes(""), Some(0));
    }
}
