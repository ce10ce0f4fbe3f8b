//! A node's public keys, as peers pin them and errors name them: its own module, below both the
//! key pair (`node_key`) and the crate's error type, which each need it.

/// Bytes of an X25519 key, public or private.
pub const NODE_KEY_LEN: usize = 32;

/// Bytes of an Ed25519 public key.
pub const SIGNING_KEY_LEN: usize = 32;

/// Bytes of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;

/// A node's public key: not secret, printed by `node keygen`, pinned by the other nodes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodePublicKey(pub [u8; NODE_KEY_LEN]);

impl NodePublicKey {
    /// Lower-case hex, the text form used in configs, logs and the CLI.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
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

/// The public half of a node's record-signing key (Ed25519, derived from its node key:
/// [`crate::NodeKey::sign_record`]). X25519 keys cannot sign, and what a node publishes about
/// itself (membership records) must say which node wrote it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SigningPublicKey(pub [u8; SIGNING_KEY_LEN]);

impl SigningPublicKey {
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Whether `signature` is this key's Ed25519 signature of `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8; SIGNATURE_LEN]) -> bool {
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &self.0).verify(message, signature).is_ok()
    }
}

impl std::fmt::Debug for SigningPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningPublicKey({})", &self.to_hex()[..8])
    }
}

/// A node's public identity, what the others pin (`cluster.trusted_nodes`): the key its links
/// prove (X25519) and the key its records are signed with (Ed25519). Text form: 128 lower-case
/// hex digits, the link key's then the signing key's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeIdentity {
    pub link: NodePublicKey,
    pub signing: SigningPublicKey,
}

impl NodeIdentity {
    /// The 64 bytes: the link key's, then the signing key's.
    pub fn to_bytes(&self) -> [u8; NODE_KEY_LEN + SIGNING_KEY_LEN] {
        let mut b = [0u8; NODE_KEY_LEN + SIGNING_KEY_LEN];
        b[..NODE_KEY_LEN].copy_from_slice(&self.link.0);
        b[NODE_KEY_LEN..].copy_from_slice(&self.signing.0);
        b
    }

    pub fn from_bytes(b: &[u8; NODE_KEY_LEN + SIGNING_KEY_LEN]) -> Self {
        let (link, signing) = b.split_at(NODE_KEY_LEN);
        let mut l = [0u8; NODE_KEY_LEN];
        let mut s = [0u8; SIGNING_KEY_LEN];
        l.copy_from_slice(link);
        s.copy_from_slice(signing);
        NodeIdentity { link: NodePublicKey(l), signing: SigningPublicKey(s) }
    }

    pub fn to_hex(&self) -> String {
        hex(&self.to_bytes())
    }
}

impl std::fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeIdentity({})", self.link.fingerprint())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
