//! The cluster secrets a node holds: the one it dials with, and every one it accepts. Shared
//! by every link of a node and replaceable while it runs, so an operator can rotate the secret
//! without downtime (docs/cluster.md): accept old and new, then dial with the new, then drop
//! the old; links already up keep their session keys throughout.

use std::sync::{Arc, RwLock};

use wire::ClusterSecret;

#[derive(Clone)]
struct Ring {
    current: ClusterSecret,
    also_accepted: Vec<ClusterSecret>,
}

/// Cheap to clone; every clone sees a [`SecretRing::replace`].
#[derive(Clone)]
pub struct SecretRing(Arc<RwLock<Ring>>);

impl SecretRing {
    /// Dial with `current`; accept it and each of `also_accepted`.
    pub fn new(current: ClusterSecret, also_accepted: Vec<ClusterSecret>) -> Self {
        SecretRing(Arc::new(RwLock::new(Ring { current, also_accepted })))
    }

    /// One secret, dialled and accepted.
    pub fn single(secret: ClusterSecret) -> Self {
        Self::new(secret, Vec::new())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
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

    /// Swaps in a new set (a reload); links already established are not touched.
    pub fn replace(&self, current: ClusterSecret, also_accepted: Vec<ClusterSecret>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Ring { current, also_accepted };
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
