//! The cluster secrets a node holds: the one it dials with, and every one it accepts. Shared
//! by every link of a node and replaceable while it runs, so an operator can rotate the secret
//! without downtime (docs/cluster.md): accept old and new, then dial with the new, then drop
//! the old. Each change is announced ([`SecretRing::changed`]): a link made with a secret that
//! is no longer accepted closes, and a worker whose dialling secret changed opens a link with
//! the new one before it retires the old (make-before-break), so a node that only holds a
//! withdrawn secret is out within seconds while the others lose nothing.

use std::sync::{Arc, RwLock};

use tokio::sync::watch;
use wire::ClusterSecret;

#[derive(Clone)]
struct Ring {
    current: ClusterSecret,
    also_accepted: Vec<ClusterSecret>,
}

/// Cheap to clone; every clone sees a [`SecretRing::replace`].
#[derive(Clone)]
pub struct SecretRing {
    ring: Arc<RwLock<Ring>>,
    /// Bumped by every replace.
    version: Arc<watch::Sender<u64>>,
}

impl SecretRing {
    /// Dial with `current`; accept it and each of `also_accepted`.
    pub fn new(current: ClusterSecret, also_accepted: Vec<ClusterSecret>) -> Self {
        SecretRing {
            ring: Arc::new(RwLock::new(Ring { current, also_accepted })),
            version: Arc::new(watch::channel(0).0),
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
    pub fn single(secret: ClusterSecret) -> Self {
        Self::new(secret, Vec::new())
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

    /// Swaps in a new set (a reload) and announces it: links whose secret left the set close,
    /// links dialled with a secret that is no longer the current one are replaced.
    pub fn replace(&self, current: ClusterSecret, also_accepted: Vec<ClusterSecret>) {
        *self.ring.write().unwrap_or_else(|e| e.into_inner()) = Ring { current, also_accepted };
        self.version.send_modify(|v| *v += 1);
    }

    /// Public fingerprints of the dialled and the other accepted secrets, for logs.
    pub fn describe(&self) -> String {
        let r = self.read();
        let others: Vec<String> = r.also_accepted.iter().map(ClusterSecret::fingerprint).collect();
        if others.is_empty() {
            format!("cluster secret {}", r.current.fingerprint())
        } else {
            format!("cluster secret {} (also accepting {})", r.current.fingerprint(), others.join(", "))
        }
    }
}

impl std::fmt::Debug for SecretRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretRing({})", self.describe())
    }
}
