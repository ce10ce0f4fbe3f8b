//! A node's public key, as peers pin it and errors name it: its own module, below both the
//! key pair (`node_key`) and the crate's error type, which each need it.

/// Bytes of an X25519 key, public or private.
pub const NODE_KEY_LEN: usize = 32;

/// A node's public key: not secret, printed by `node keygen`, pinned by the other nodes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodePublicKey(pub [u8; NODE_KEY_LEN]);

impl NodePublicKey {
    /// Lower-case hex, the text form used in configs, logs and the CLI.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 8 hex digits, for log lines ("which node is this?").
    pub fn fingerprint(&self) -> String {
        self.to_hex()[..8].to_string()
    }
}

impl std::fmt::Display for NodePublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Debug for NodePublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodePublicKey({})", self.fingerprint())
    }
}
