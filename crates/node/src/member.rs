//! A node's part in the membership (`[membership]`, etcd): what it publishes about itself,
//! and what it does with what the others publish. Entries are public facts (addresses, role,
//! model digest, pool size), never a secret, sealed (`membership::seal`) under a key derived
//! from the cluster secret and signed with the publisher's record-signing key (derived from its
//! node key: `wire::NodeKey::sign_record`). A node counts and dials only the entries that open
//! under a secret it accepts AND are signed by a node it pins now (`cluster.trusted_nodes`,
//! reloaded on SIGHUP): whoever writes to etcd without the secret, and any member with it (a
//! compromised node), cannot add a gateway in another node's name (to be dialled, or to divide
//! every tenant's limits) or replay one that left. A gateway counts live gateways by distinct
//! signer: one node, one limit share, however many entries it publishes. Rejected entries are
//! logged by key and reason, never content. Trust between nodes still comes from the
//! authenticated handshake every link runs (see SECURITY.md).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cluster::SecretRing;
use membership::seal::{self, Opened, RecordKey, Signers};
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

/// `record` sealed for `etcd_key` at `issued_ms` (Unix milliseconds): MAC'd under `secret`'s
/// record key and signed by the node of `key`, as members publish it.
pub fn seal_record(
    secret: &wire::ClusterSecret,
    key: &wire::NodeKey,
    etcd_key: &str,
    record: &str,
    issued_ms: u64,
) -> Result<Vec<u8>, wire::WireError> {
    seal::seal(&record_key(secret), etcd_key, record, issued_ms, &key.identity().signing.0, |m| key.sign_record(m))
}

/// The signers whose records count: the nodes the ring pins at the time of the check.
struct Pinned<'a>(&'a SecretRing);

impl Signers for Pinned<'_> {
    fn pinned(&self, signer: &[u8; seal::SIGNER_LEN]) -> bool {
        self.0.trusts_signer(&wire::SigningPublicKey(*signer))
    }

    fn verify(&self, signer: &[u8; seal::SIGNER_LEN], message: &[u8], signature: &[u8; seal::SIGNATURE_LEN]) -> bool {
        wire::SigningPublicKey(*signer).verify(message, signature)
    }
}

/// Publishes `record` under `etcd_key`, sealed afresh (with the secret dialled with at the
/// time, signed by this node) at every put and renewal.
fn publish_record(c: EtcdClient, etcd_key: String, record: String, secrets: &SecretRing, ttl: Duration) -> Publication {
    let (secrets, sealed_key) = (secrets.clone(), etcd_key.clone());
    let make = move || {
        seal_record(&secrets.current(), secrets.node_key(), &sealed_key, &record, seal::now_ms()).unwrap_or_else(|e| {
            // Never expected (the key was checked when loaded); an empty value counts nowhere.
            tracing::error!(key = %sealed_key, error = %e, "membership: cannot sign our record; published empty");
            Vec::new()
        })
    };
    publish_sealed(c, etcd_key, make, ttl)
}

/// The entries rejected at the last look, by name, with their value and why: an entry is
/// logged (and, at a gateway, counted) when its value is first rejected, not at every recheck.
#[derive(Default)]
struct Rejections {
    seen: BTreeMap<String, (Vec<u8>, &'static str)>,
    counter: Option<Arc<gateway::metrics::RejectedEntries>>,
}

impl Rejections {
    fn counted(counter: Arc<gateway::metrics::RejectedEntries>) -> Self {
        Rejections { seen: BTreeMap::new(), counter: Some(counter) }
    }
}

/// The entries under `prefix` that open under a secret this node accepts now and are signed
/// by a node it pins now, with their signers, by name; the others are skipped, and logged by
/// key and reason (never their content) and counted once per value.
fn opened(
    members: &Members,
    prefix: &str,
    secrets: &SecretRing,
    rejected: &mut Rejections,
) -> BTreeMap<String, Opened> {
    let keys: Vec<RecordKey> = secrets.accepted().iter().map(record_key).collect();
    let now = seal::now_ms();
    let mut out = BTreeMap::new();
    let mut now_rejected = BTreeMap::new();
    for (name, value) in &members.entries {
        match seal::open(&keys, &Pinned(secrets), &key(prefix, name), value, now) {
            Ok(o) => {
                out.insert(name.clone(), o);
            }
            Err(why) => {
                let reason = why.label();
                let before = rejected.seen.get(name);
                if before.is_none_or(|(v, r)| v != value || *r != reason) {
                    tracing::warn!(key = %name, prefix = %prefix, reason, "membership: an entry not sealed by a node we trust; ignored");
                    if let Some(c) = &rejected.counter {
                        c.count(reason);
                    }
                }
                now_rejected.insert(name.clone(), (value.clone(), reason));
            }
        }
    }
    rejected.seen = now_rejected;
    out
}

/// How many gateways share the limits: one per distinct signer among the gateway entries that
/// opened (a node publishing many entries still holds one share), never fewer than one.
fn live_gateways(opened: &BTreeMap<String, Opened>) -> usize {
    opened.values().map(|o| o.signer).collect::<BTreeSet<_>>().len().max(1)
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
        let mut rejected = Rejections::default();
        loop {
            let addrs = gateway_addrs(&opened(&members.borrow_and_update(), &prefix, &secrets, &mut rejected));
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
fn gateway_addrs(records: &BTreeMap<String, Opened>) -> BTreeSet<String> {
    records
        .iter()
        .filter_map(|(k, v)| match serde_json::from_str::<GatewayRecord>(&v.record) {
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
/// counts the live gateways (the receiver), which share every tenant's limits, and the
/// entries it ignores (`rejected`).
pub fn join_as_gateway(
    m: &MembershipSettings,
    record: &GatewayRecord,
    routers: Vec<cluster::Router>,
    secrets: &SecretRing,
    rejected: Arc<gateway::metrics::RejectedEntries>,
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
        let mut rejected = Rejections::counted(rejected);
        loop {
            let n = {
                let g = gateways.borrow_and_update();
                // Only gateway entries signed by pinned nodes share the limits, one share per
                // node; itself included even before its own entry shows (never a share of zero).
                g.synced.then(|| live_gateways(&opened(&g, &prefix, &ring, &mut rejected)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{ClusterSecret, NodeKey};

    fn node(b: u8) -> NodeKey {
        NodeKey::from_private([b; 32]).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn gateways_count_once_per_pinned_signer_and_an_unpinned_or_revoked_one_not_at_all() {
        let secret = ClusterSecret::from_bytes([5; 32]);
        let (me, other, stranger) = (node(1), node(2), node(3));
        let ring = SecretRing::single(secret.clone(), node(1), vec![me.identity(), other.identity()]);
        let prefix = "/p/gateways/";
        let now = seal::now_ms();
        let entry = |name: &str, by: &NodeKey, under: &ClusterSecret| {
            let record = format!(r#"{{"id":"{name}","cluster_addr":"10.0.0.1:7000"}}"#);
            (name.to_string(), seal_record(under, by, &key(prefix, name), &record, now).unwrap_or_default())
        };
        let members = Members {
            entries: [
                entry("me", &me, &secret),
                entry("other", &other, &secret),
                // The same pinned node under more names: still one share.
                entry("other-again", &other, &secret),
                // Under the real secret, by a node nobody pins.
                entry("forged", &stranger, &secret),
                // By a pinned node, under a secret nobody accepts.
                entry("old-secret", &other, &ClusterSecret::from_bytes([6; 32])),
            ]
            .into_iter()
            .collect(),
            synced: true,
        };
        let counter = Arc::new(gateway::metrics::RejectedEntries::default());
        let mut rejected = Rejections::counted(counter.clone());
        let counted = |reason: &str| {
            let mut e = cluster::exposition::Exposition::new();
            counter.expose(&mut e);
            launch::metric(&e.text(), "pagewarden_membership_entries_rejected_total", &format!("reason=\"{reason}\""))
        };
        let open = opened(&members, prefix, &ring, &mut rejected);
        assert_eq!((counted("unknown_signer"), counted("bad_mac")), (1.0, 1.0), "forged and old-secret");
        opened(&members, prefix, &ring, &mut rejected);
        assert_eq!((counted("unknown_signer"), counted("bad_mac")), (1.0, 1.0), "counted once, not per look");
        assert_eq!(open.keys().map(String::as_str).collect::<Vec<_>>(), ["me", "other", "other-again"]);
        assert_eq!(open["me"].signer, me.identity().signing.0);
        assert_eq!(live_gateways(&open), 2);
        assert_eq!(gateway_addrs(&open).len(), 1, "one address, dialled once");
        // `other` revoked (a reload): its entries stop counting at once.
        ring.replace(secret.clone(), Vec::new(), vec![me.identity()]);
        let open = opened(&members, prefix, &ring, &mut rejected);
        assert_eq!(open.keys().map(String::as_str).collect::<Vec<_>>(), ["me"]);
        assert_eq!(counted("unknown_signer"), 3.0, "other's two entries, newly rejected");
        assert_eq!(live_gateways(&open), 1);
        assert_eq!(live_gateways(&BTreeMap::new()), 1, "never a share of zero");
    }
}
