//! A node's own identity: its static X25519 key pair, sent (encrypted) in every handshake, and
//! the public keys an operator pins (`[cluster] trusted_nodes`). The cluster secret says "a
//! member of this cluster"; the node key says "which one", so one node can be revoked without
//! re-keying all the others.

use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};

use crate::error::WireError;

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

/// A node's static key pair. The private half is never printed and is wiped when dropped.
#[derive(Clone)]
pub struct NodeKey {
    private: [u8; NODE_KEY_LEN],
    public: NodePublicKey,
}

impl Drop for NodeKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.private);
    }
}

impl NodeKey {
    /// A fresh key pair from the OS's random source.
    pub fn generate() -> Result<Self, WireError> {
        let params = crate::handshake::noise_params()?;
        let kp = snow::Builder::new(params).generate_keypair().map_err(|_| WireError::Crypto("node key generation"))?;
        let private: [u8; NODE_KEY_LEN] =
            kp.private.as_slice().try_into().map_err(|_| WireError::Crypto("node key length"))?;
        Self::from_private(private)
    }

    /// The key pair of a stored private key (its public half is derived, so a key file holds
    /// only the private half and can never disagree with itself).
    pub fn from_private(private: [u8; NODE_KEY_LEN]) -> Result<Self, WireError> {
        let mut dh = DefaultResolver.resolve_dh(&DHChoice::Curve25519).ok_or(WireError::Crypto("X25519"))?;
        dh.set(&private);
        let public: [u8; NODE_KEY_LEN] = dh.pubkey().try_into().map_err(|_| WireError::Crypto("node key length"))?;
        Ok(NodeKey { private, public: NodePublicKey(public) })
    }

    pub fn public(&self) -> NodePublicKey {
        self.public
    }

    pub(crate) fn private(&self) -> &[u8; NODE_KEY_LEN] {
        &self.private
    }

    /// The private half, to be written to an owner-only key file.
    pub fn private_bytes(&self) -> zeroize::Zeroizing<[u8; NODE_KEY_LEN]> {
        zeroize::Zeroizing::new(self.private)
    }
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeKey({:?}, <private redacted>)", self.public)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_private_key_gives_back_the_same_public_key_and_never_prints() {
        let k = NodeKey::generate().unwrap_or_else(|e| panic!("{e}"));
        let again = NodeKey::from_private(*k.private_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.public(), again.public());
        assert_ne!(k.public(), NodeKey::generate().unwrap_or_else(|e| panic!("{e}")).public());
        let shown = format!("{k:?}");
        let private_hex: String = k.private_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert!(!shown.contains(&private_hex[..16]) && shown.contains(&k.public().fingerprint()));
        assert_eq!(k.public().to_hex().len(), 64);
    }
}
