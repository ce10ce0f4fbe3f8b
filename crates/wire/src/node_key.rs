//! A node's own identity: its static X25519 key pair, sent (encrypted) in every handshake, and
//! the public keys an operator pins (`[cluster] trusted_nodes`). The cluster secret says "a
//! member of this cluster"; the node key says "which one", so one node can be revoked without
//! re-keying all the others.
//!
//! X25519 cannot sign, so what a node publishes about itself (membership records in etcd) is
//! signed with an Ed25519 key derived from the same private key ([`NodeKey::sign_record`]): a
//! key file stays one 32-byte secret, and existing files keep their link identity.

use ring::signature::{Ed25519KeyPair, KeyPair};
use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};
use zeroize::Zeroize;

use crate::error::WireError;
use crate::node_id::{NodeIdentity, NodePublicKey, SigningPublicKey, NODE_KEY_LEN, SIGNATURE_LEN, SIGNING_KEY_LEN};

/// The purpose the record-signing seed is derived for from the node's private key: nothing else
/// is ever derived under it.
const RECORD_SIGNING_CONTEXT: &str = "pagewarden 2026-12 node record signing key";

/// A node's static key pair. The private half is never printed and is wiped when dropped.
#[derive(Clone)]
pub struct NodeKey {
    private: [u8; NODE_KEY_LEN],
    public: NodePublicKey,
    signing: SigningPublicKey,
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
        let signing: [u8; SIGNING_KEY_LEN] = record_signer(&private)?
            .public_key()
            .as_ref()
            .try_into()
            .map_err(|_| WireError::Crypto("signing key length"))?;
        Ok(NodeKey { private, public: NodePublicKey(public), signing: SigningPublicKey(signing) })
    }

    /// The key links prove.
    pub fn public(&self) -> NodePublicKey {
        self.public
    }

    /// What the other nodes pin: the link key and the record-signing key.
    pub fn identity(&self) -> NodeIdentity {
        NodeIdentity { link: self.public, signing: self.signing }
    }

    /// `message` signed with this node's record-signing key (Ed25519), which any node pinning
    /// [`NodeKey::identity`] can check ([`SigningPublicKey::verify`]).
    pub fn sign_record(&self, message: &[u8]) -> Result<[u8; SIGNATURE_LEN], WireError> {
        let sig = record_signer(&self.private)?.sign(message);
        sig.as_ref().try_into().map_err(|_| WireError::Crypto("signature length"))
    }

    pub(crate) fn private(&self) -> &[u8; NODE_KEY_LEN] {
        &self.private
    }

    /// The private half, to be written to an owner-only key file.
    pub fn private_bytes(&self) -> zeroize::Zeroizing<[u8; NODE_KEY_LEN]> {
        zeroize::Zeroizing::new(self.private)
    }
}

/// The Ed25519 key pair of a node's private key; the seed is wiped once the pair is made (the
/// pair lives only as long as one signature).
fn record_signer(private: &[u8; NODE_KEY_LEN]) -> Result<Ed25519KeyPair, WireError> {
    let mut seed = blake3::derive_key(RECORD_SIGNING_CONTEXT, private);
    let pair = Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|_| WireError::Crypto("record signing key"));
    seed.zeroize();
    pair
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

    #[test]
    fn the_record_signing_key_is_derived_from_the_node_key_and_its_signatures_verify_only_for_their_message() {
        let k = NodeKey::from_private([0x11; 32]).unwrap_or_else(|e| panic!("{e}"));
        let again = NodeKey::from_private([0x11; 32]).unwrap_or_else(|e| panic!("{e}"));
        let other = NodeKey::from_private([0x12; 32]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.identity(), again.identity(), "the same key file, the same identity");
        assert_eq!(k.identity().link, k.public());
        assert_ne!(k.identity().signing, other.identity().signing);
        assert_ne!(k.identity().signing.0, k.public().0, "not the X25519 key");
        let sig = k.sign_record(b"record").unwrap_or_else(|e| panic!("{e}"));
        assert!(k.identity().signing.verify(b"record", &sig));
        assert!(!k.identity().signing.verify(b"recorD", &sig));
        assert!(!other.identity().signing.verify(b"record", &sig));
        let mut bad = sig;
        bad[10] ^= 1;
        assert!(!k.identity().signing.verify(b"record", &bad));
        let text = k.identity().to_hex();
        assert_eq!(text.len(), 128);
        assert!(text.starts_with(&k.public().to_hex()));
        assert_eq!(NodeIdentity::from_bytes(&k.identity().to_bytes()), k.identity());
    }
}
