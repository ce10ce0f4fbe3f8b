//! A node's part in the membership (`[membership]`, etcd): what it publishes about itself,
//! and what it does with what the others publish. Entries are public facts (addresses, role,
//! model digest, pool size), never a secret, sealed under a key derived from the cluster
//! secret (`membership::seal`): a node counts and dials only the entries that open under a
//! secret it accepts, so whoever writes to etcd without one cannot add a gateway (to be
//! dialled, or to divide every tenant's limits) or replay one that left. Trust between nodes
//! still comes from the authenticated handshake every link runs (see SECURITY.md).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cluster::SecretRing;
use membership::seal::{self, RecordKey};
use membership::{
    gateways_prefix, publish_sealed, tenants_prefix, watch_members, workers_prefix, EtcdClient, GatewayRecord, Members,
    Publication, TenantsRecord, WorkerRecord, TENANTS_CHANGED,
};
use tokio::sync::watch;

use crate::config::MembershipSettings;
use crate::error::ServeError;

fn client(m: &MembershipSettings) -> Result<EtcdClient, ServeError> {
    EtcdClient::new(&m.etcd, m.timeout).map_err(|e| ServeError::Io(format!("membership: {e}")))
}

fn key(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}

/// The purpose a record key is derived for from a cluster secret.
const RECORD_KEY_CONTEXT: &str = "pagewarden 2026-12 membership record key";

/// Sealed records age; readers look again this often even when etcd says nothing new.
const RECHECK: Duration = Duration::from_secs(2);

fn record_key(secret: &wire::ClusterSecret) -> RecordKey {
    RecordKey::new(secret.derive_key(RECORD_KEY_CONTEXT))
}

/// Publishes `record` under `etcd_key`, sealed afresh (with the secret dialled with at the
/// time) at every put and renewal.
fn publish_record(c: EtcdClient, etcd_key: String, record: String, secrets: &SecretRing, ttl: Duration) -> Publication {
    let (secrets, sealed_key) = (secrets.clone(), etcd_key.clone());
    publish_sealed(
        c,
        etcd_key,
        move || seal::seal(&record_key(&secrets.current()), &sealed_key, &record, seal::now_ms()),
        ttl,
    )
}

/// The entries under `prefix` that open under a secret this node accepts now, as their
/// records' JSON text by name; the others are logged by key (never their content) and skipped.
fn opened(members: &Members, prefix: &str, secrets: &SecretRing) -> BTreeMap<String, String> {
    let keys: Vec<RecordKey> = secrets.accepted().iter().map(record_key).collect();
    let now = seal::now_ms();
    members
        .entries
        .iter()
        .filter_map(|(name, value)| match seal::open(&keys, &key(prefix, name), value, now) {
            Ok(record) => Some((name.clone(), record)),
            Err(why) => {
                tracing::warn!(key = %name, prefix = %prefix, reason = why.label(), "membership: an entry that does not open under our cluster secret; ignored");
                None
            }
        })
        .collect()
}

/// A worker joins: publishes its record under a lease (kept while the returned publication
/// lives) and watches the gateways. The set stays empty until etcd answered once: a worker
/// started while etcd is away waits.
pub fn join_as_worker(
    m: &MembershipSettings,
    record: &WorkerRecord,
    secrets: &SecretRing,
) -> Result<(Publication, watch::Receiver<BTreeSet<String>>), ServeError> {
    let c = client(m)?;
    let value = serde_json::to_string(record).map_err(|e| ServeError::Io(e.to_string()))?;
    let publication =
        publish_record(c.clone(), key(&workers_prefix(&m.prefix), &record.name), value, secrets, m.lease_ttl);
    let prefix = gateways_prefix(&m.prefix);
    let mut members = watch_members(c, prefix.clone());
    let (tx, rx) = watch::channel(BTreeSet::new());
    let secrets = secrets.clone();
    tokio::spawn(async move {
        let mut recheck = tokio::time::interval(RECHECK);
        loop {
            let addrs = gateway_addrs(&opened(&members.borrow_and_update(), &prefix, &secrets));
            tx.send_if_modified(|now| {
                let changed = *now != addrs;
                *now = addrs;
                changed
            });
            // Ends when the worker drops the receiver or the watch task stops.
            tokio::select! {
                r = members.changed() => if r.is_err() { return },
                _ = recheck.tick() => {}
                () = tx.closed() => return,
            }
        }
    });
    Ok((publication, rx))
}

/// The cluster addresses of the listed gateways; an entry that is not a gateway record is
/// skipped (and logged by its key, never dialled).
fn gateway_addrs(records: &BTreeMap<String, String>) -> BTreeSet<String> {
    records
        .iter()
        .filter_map(|(k, v)| match serde_json::from_str::<GatewayRecord>(v) {
            Ok(g) => Some(g.cluster_addr),
            Err(e) => {
                tracing::warn!(key = %k, error = %e, "membership: not a gateway record; skipped");
                None
            }
        })
        .collect()
}

/// A gateway joins: publishes where workers reach it, closes the links of the workers that
/// leave the membership (their lease expired: the process or its host is gone, or cut off)
/// so their routes fail over at once (a worker that drains says so over its link first), and
/// counts the live gateways (the receiver), which share every tenant's limits.
pub fn join_as_gateway(
    m: &MembershipSettings,
    record: &GatewayRecord,
    routers: Vec<cluster::Router>,
    secrets: &SecretRing,
) -> Result<(Publication, watch::Receiver<usize>), ServeError> {
    let c = client(m)?;
    let value = serde_json::to_string(record).map_err(|e| ServeError::Io(e.to_string()))?;
    let prefix = gateways_prefix(&m.prefix);
    let publication = publish_record(c.clone(), key(&prefix, &record.id), value, secrets, m.lease_ttl);
    let mut gateways = watch_members(c.clone(), prefix.clone());
    let (count_tx, count) = watch::channel(1usize);
    let ring = secrets.clone();
    tokio::spawn(async move {
        let mut recheck = tokio::time::interval(RECHECK);
        loop {
            let n = {
                let g = gateways.borrow_and_update();
                // Only sealed gateway entries share the limits; itself included even before its
                // own entry shows (never a share of zero).
                g.synced.then(|| opened(&g, &prefix, &ring).len().max(1))
            };
            if let Some(n) = n {
                count_tx.send_if_modified(|c| std::mem::replace(c, n) != n);
            }
            tokio::select! {
                r = gateways.changed() => if r.is_err() { return },
                _ = recheck.tick() => {}
                () = count_tx.closed() => return,
            }
        }
    });
    let mut members = watch_members(c, workers_prefix(&m.prefix));
    tokio::spawn(async move {
        let mut live: Option<BTreeSet<String>> = None;
        loop {
            let now = {
                let m = members.borrow_and_update();
                m.synced.then(|| m.entries.keys().cloned().collect::<BTreeSet<String>>())
            };
            if let Some(now) = now {
                for gone in live.iter().flat_map(|before| before.difference(&now)) {
                    for r in &routers {
                        r.evict(gone);
                    }
                }
                live = Some(now);
            }
            if members.changed().await.is_err() {
                return;
            }
        }
    });
    Ok((publication, count))
}

/// Announces a tenant change to every gateway of the membership: each re-reads its tenant
/// file and checks it against `digest` (the table it should now serve). The announcement is
/// a key without a lease: the last one stays, and a gateway that starts later compares its
/// file with it.
pub async fn announce_tenants(m: &MembershipSettings, digest: [u8; 32]) -> Result<(), ServeError> {
    let c = client(m)?;
    let record = TenantsRecord { digest: gateway::tenants::hex(&digest) };
    let value = serde_json::to_vec(&record).map_err(|e| ServeError::Io(e.to_string()))?;
    c.put(&key(&tenants_prefix(&m.prefix), TENANTS_CHANGED), &value, None)
        .await
        .map_err(|e| ServeError::Io(format!("membership: announcing the tenant change: {e}")))
}

/// The announced tenant table digest, as it changes (`None` until etcd answered with one). An
/// entry that is no announcement is skipped and logged.
pub fn tenant_announcements(m: &MembershipSettings) -> Result<watch::Receiver<Option<String>>, ServeError> {
    let mut members = watch_members(client(m)?, tenants_prefix(&m.prefix));
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            let digest = members.borrow_and_update().entries.get(TENANTS_CHANGED).and_then(|v| {
                serde_json::from_slice::<TenantsRecord>(v)
                    .map_err(|e| tracing::warn!(error = %e, "membership: not a tenant announcement; skipped"))
                    .ok()
                    .map(|r| r.digest)
            });
            if digest.is_some() {
                tx.send_if_modified(|now| std::mem::replace(now, digest.clone()) != digest);
            }
            tokio::select! {
                r = members.changed() => if r.is_err() { return },
                () = tx.closed() => return,
            }
        }
    });
    Ok(rx)
}

/// A default member name: the role, the process id and a random suffix (two hosts may run
/// the same process id, and two members under one name would evict each other).
pub fn default_name(role: &str) -> Result<String, ServeError> {
    let b = cluster::random::<4>().map_err(|e| ServeError::Io(e.to_string()))?;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!("{role}-{}-{hex}", std::process::id()))
}

/// Withdraws a publication (its key disappears at once) and logs a failure: the lease then
/// expires on its own.
pub async fn withdraw(p: Publication, what: &str) {
    if let Err(e) = p.withdraw().await {
        tracing::warn!(member = %what, error = %e, "membership: withdrawing failed; the entry expires with its lease");
    }
}
