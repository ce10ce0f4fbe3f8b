//! A key kept in etcd for as long as its owner lives, through a lease: if the process dies or
//! is cut off, renewals stop and etcd deletes the key within the TTL, which is how the others
//! learn that a member left without it having to say so.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::client::{EtcdClient, LeaseId};
use crate::error::MembershipError;

/// The shortest wait between tries while etcd fails.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest: short enough to come back soon after etcd does.
const RETRY_CAP: Duration = Duration::from_secs(2);

/// A key kept in etcd under a lease; see [`publish`].
pub struct Publication {
    client: EtcdClient,
    key: String,
    task: JoinHandle<()>,
    published: Arc<watch::Sender<bool>>,
    /// The lease the key is under now (0: none yet), for `withdraw`.
    lease: Arc<AtomicI64>,
}

impl std::fmt::Debug for Publication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publication").field("key", &self.key).field("published", &*self.published.borrow()).finish()
    }
}

/// Keeps `key` = `value` in etcd under a lease of `ttl` for as long as the handle lives:
/// grants, puts, renews every ttl/3; if the lease is lost (expired while etcd was
/// unreachable) grants a new one and puts again; while etcd is unreachable retries with a
/// capped backoff. Logs name the key and sizes, never the value. Spawns on the current tokio
/// runtime.
pub fn publish(client: EtcdClient, key: String, value: Vec<u8>, ttl: Duration) -> Publication {
    start(client, key, Value::Fixed(value), ttl)
}

/// [`publish`] for a value made afresh by `make` at every put and at every renewal (a sealed
/// record: [`crate::seal`]), so the entry in etcd is never older than a renewal period.
pub fn publish_sealed(
    client: EtcdClient,
    key: String,
    make: impl Fn() -> Vec<u8> + Send + Sync + 'static,
    ttl: Duration,
) -> Publication {
    start(client, key, Value::Fresh(Box::new(make)), ttl)
}

fn start(client: EtcdClient, key: String, value: Value, ttl: Duration) -> Publication {
    let (tx, _) = watch::channel(false);
    let published = Arc::new(tx);
    let lease = Arc::new(AtomicI64::new(0));
    let keeper = Keeper {
        client: client.clone(),
        key: key.clone(),
        value,
        ttl,
        published: published.clone(),
        lease: lease.clone(),
    };
    let task = tokio::spawn(keeper.run());
    Publication { client, key, task, published, lease }
}

impl Publication {
    /// true while the key is known to be in etcd (after a successful put, until a renewal fails).
    pub fn published(&self) -> watch::Receiver<bool> {
        self.published.subscribe()
    }

    /// Stops renewing and revokes the lease (the key disappears at once), within the client's timeout.
    pub async fn withdraw(mut self) -> Result<(), MembershipError> {
        self.task.abort();
        // The task is stopped for good before the lease is read: it cannot grant another after.
        let _ = (&mut self.task).await;
        self.published.send_replace(false);
        let lease = self.lease.load(Ordering::Acquire);
        if lease == 0 {
            return Ok(());
        }
        match self.client.revoke(lease).await {
            Ok(()) => Ok(()),
            // Expired already: the key is gone all the same.
            Err(e) if e.is_lease_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Publication {
    /// The key then expires with its lease.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a publication puts.
enum Value {
    Fixed(Vec<u8>),
    /// Made again for every put; put again at every renewal.
    Fresh(Box<dyn Fn() -> Vec<u8> + Send + Sync>),
}

impl Value {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Value::Fixed(v) => v.clone(),
            Value::Fresh(make) => make(),
        }
    }
}

struct Keeper {
    client: EtcdClient,
    key: String,
    value: Value,
    ttl: Duration,
    published: Arc<watch::Sender<bool>>,
    lease: Arc<AtomicI64>,
}

impl Keeper {
    async fn run(self) {
        // Two renewals can fail before the lease runs out.
        let period = (self.ttl / 3).max(Duration::from_millis(50));
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_CAP.min(period));
        let mut failing = false;
        loop {
            let lease = match self.acquire().await {
                Ok(lease) => lease,
                Err(e) => {
                    self.failed(&mut failing, "publishing", &e);
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
            };
            backoff.reset();
            self.set(true);
            if failing {
                tracing::info!(key = %self.key, "membership: published again");
            } else {
                tracing::debug!(key = %self.key, "membership: published");
            }
            failing = false;
            self.renew(lease, period, &mut backoff, &mut failing).await;
            self.set(false);
        }
    }

    /// A new lease with the key under it.
    async fn acquire(&self) -> Result<LeaseId, MembershipError> {
        let lease = self.client.grant(self.ttl).await?;
        // Recorded before the put: `withdraw` revokes whatever lease the key may be under.
        self.lease.store(lease, Ordering::Release);
        // A failed put leaves this lease with no key; it expires on its own.
        self.client.put(&self.key, &self.value.bytes(), Some(lease)).await?;
        Ok(lease)
    }

    /// Renews `lease` until it is lost (returns then, for a new one).
    async fn renew(&self, lease: LeaseId, period: Duration, backoff: &mut Backoff, failing: &mut bool) {
        loop {
            let wait = if *failing { backoff.next_delay() } else { period };
            tokio::time::sleep(wait).await;
            match self.client.keep_alive(lease).await {
                Ok(Some(_)) if *failing => {
                    // Back after a failure: put again, in case the key went while we were away.
                    match self.client.put(&self.key, &self.value.bytes(), Some(lease)).await {
                        Ok(()) => {
                            tracing::info!(key = %self.key, "membership: renewing again");
                            *failing = false;
                            backoff.reset();
                            self.set(true);
                        }
                        Err(e) if e.is_lease_not_found() => return,
                        Err(e) => self.failed(failing, "renewing", &e),
                    }
                }
                Ok(Some(_)) => {
                    if let Value::Fresh(make) = &self.value {
                        match self.client.put(&self.key, &make(), Some(lease)).await {
                            Ok(()) => {}
                            Err(e) if e.is_lease_not_found() => return,
                            Err(e) => self.failed(failing, "refreshing", &e),
                        }
                    }
                }
                Ok(None) => {
                    tracing::warn!(key = %self.key, "membership: lease lost (expired or revoked); publishing again");
                    *failing = true;
                    return;
                }
                Err(e) => {
                    self.failed(failing, "renewing", &e);
                    self.set(false);
                }
            }
        }
    }

    /// Logs a failure: the first of a run as a warning, the retries quietly.
    fn failed(&self, failing: &mut bool, doing: &str, e: &MembershipError) {
        if *failing {
            tracing::debug!(key = %self.key, error = %e, "membership: {doing} failed again; retrying");
        } else {
            tracing::warn!(key = %self.key, error = %e, "membership: {doing} failed; retrying");
        }
        *failing = true;
    }

    fn set(&self, published: bool) {
        self.published.send_if_modified(|now| std::mem::replace(now, published) != published);
    }
}
