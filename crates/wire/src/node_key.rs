//! A node's own identity: its static X25519 key pair, sent (encrypted) in every handshake, and
//! the public keys an operator pins (`[cluster] trusted_nodes`). The cluster secret says "a
//! member of this cluster"; the node key says "which one", so one node can be revoked without
//! re-keying all the others.

use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};

use crate::error::WireError;
use crate::node_id::{NodePublicKey, NODE_KEY_LEN};

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
        // The handshake's own X25519 and random source, as snow's key pair generation uses.
        let mut rng = DefaultResolver.resolve_rng().ok_or(WireError::Crypto("random source"))?;
        let mut dh = DefaultResolver.resolve_dh(&DHChoice::Curve25519).ok_or(WireError::Crypto("X25519"))?;
        dh.generate(&mut *rng).map_err(|_| WireError::Crypto("node key generation"))?;
        let private: [u8; NODE_KEY_LEN] = dh.privkey().try_into().map_err(|_| WireError::Crypto("node key length"))?;
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
