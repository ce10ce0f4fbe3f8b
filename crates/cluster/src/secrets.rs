//! What a node trusts, in one versioned state shared by all its links: the cluster secret it
//! dials with and every one it accepts, its own node key, and the node identities it trusts
//! (the operator's allow-list, `[cluster] trusted_nodes`: each node's link key, which links
//! pin, and its record-signing key, which membership records are checked against). Secrets and allow-list are replaceable
//! while the node runs, so an operator can rotate the secret without downtime (docs/cluster.md:
//! accept old and new, then dial with the new, then drop the old) and revoke one node. Each
//! change is announced ([`SecretRing::changed`]): a link made with a secret that is no longer
//! accepted, or with a peer whose node key is no longer trusted, closes, and a worker whose
//! dialling secret changed opens a link with the new one before it retires the old
//! (make-before-break), so a node that only holds a withdrawn secret, or whose key was
//! revoked, is out within seconds while the others lose nothing.

use std::sync::{Arc, RwLock};

use tokio::sync::watch;
use wire::{ClusterSecret, NodeIdentity, NodeKey, NodePublicKey, SigningPublicKey};

#[derive(Clone)]
struct Ring {
    current: ClusterSecret,
    also_accepted: Vec<ClusterSecret>,
    /// An empty list trusts nobody: the config refuses to start a node without one.
    trusted: Vec<NodeIdentity>,
}

/// Cheap to clone; every clone sees a [`SecretRing::replace`].
#[derive(Clone)]
pub struct SecretRing {
    ring: Arc<RwLock<Ring>>,
    /// This node's own static key: fixed for the life of the process (a new key is a restart,
    /// pinned by the others first).
    key: Arc<NodeKey>,
    /// Bumped by every replace.
    version: Arc<watch::Sender<u64>>,
}

impl SecretRing {
    /// Dial with `current`; accept it and each of `also_accepted`; be the node of `key`, and
    /// link only with the nodes of `trusted`.
    pub fn new(
        current: ClusterSecret,
        also_accepted: Vec<ClusterSecret>,
        key: NodeKey,
        trusted: Vec<NodeIdentity>,
    ) -> Self {
        SecretRing {
            ring: Arc::new(RwLock::new(Ring { current, also_accepted, trusted })),
            key: Arc::new(key),
            version: Arc::new(watch::channel(0).0),
        }
    }

    /// This node's static key.
    pub fn node_key(&self) -> &NodeKey {
        &self.key
    }

    /// Whether the node of `key` may link with us (now: a revocation makes it false).
    pub fn trusts(&self, key: &NodePublicKey) -> bool {
        self.read().trusted.iter().any(|t| t.link == *key)
    }

    /// Whether records signed by `key` may count (now: a revocation makes it false, so a
    /// revoked node's membership entries stop counting at the same reload as its links close).
    pub fn trusts_signer(&self, key: &SigningPublicKey) -> bool {
        self.read().trusted.iter().any(|t| t.signing == *key)
    }

    /// Whether a link made with `secret` to the node of `peer` may stay up.
    pub fn admits(&self, secret: &ClusterSecret, peer: &NodePublicKey) -> Result<(), &'static str> {
        if !self.accepts(secret) {
            Err("secret_withdrawn")
        } else if !self.trusts(peer) {
            Err("untrusted_node")
        } else {
            Ok(())
        }
    }

    /// Wakes on every [`SecretRing::replace`] after this call.
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Whether a link made with `secret` may stay up.
    pub fn accepts(&self, secret: &ClusterSecret) -> bool {
        let r = self.read();
        &r.current == secret || r.also_accepted.iter().any(|s| s == secret)
    }

    /// One secret, dialled and accepted.
    pub fn single(secret: ClusterSecret, key: NodeKey, trusted: Vec<NodeIdentity>) -> Self {
        Self::new(secret, Vec::new(), key, trusted)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.ring.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The secret new connections are dialled with.
    pub fn current(&self) -> ClusterSecret {
        self.read().current.clone()
    }

    /// Every accepted secret, the current one first.
    pub fn accepted(&self) -> Vec<ClusterSecret> {
        let r = self.read();
        std::iter::once(r.current.clone()).chain(r.also_accepted.iter().cloned()).collect()
    }

    /// Swaps in new secrets and a new allow-list (a reload) and announces them: links whose
    /// secret left the set, or whose peer's key left the allow-list, close; links dialled with
    /// a secret that is no longer the current one are replaced.
    pub fn replace(&self, current: ClusterSecret, also_accepted: Vec<ClusterSecret>, trusted: Vec<NodeIdentity>) {
        *self.ring.write().unwrap_or_else(|e| e.into_inner()) = Ring { current, also_accepted, trusted };
        self.version.send_modify(|v| *v += 1);
    }

    /// Public fingerprints of the dialled and the other accepted secrets, for logs.
    pub fn describe(&self) -> String {
        let r = self.read();
        let others: Vec<String> = r.also_accepted.iter().map(ClusterSecret::fingerprint).collect();
        let secrets = if others.is_empty() {
            format!("cluster secret {}", r.current.fingerprint())
        } else {
            format!("cluster secret {} (also accepting {})", r.current.fingerprint(), others.join(", "))
        };
        format!("{secrets}; node key {}; {} trusted node keys", self.key.public(), r.trusted.len())
    }
}

impl std::fmt::Debug for SecretRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretRing({})", self.describe())
    }
}
