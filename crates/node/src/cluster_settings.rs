//! `[cluster]`: how the roles of a disaggregated deployment find and trust each other: the
//! addresses they listen on and dial, the shared secrets, this node's key and the identities
//! it pins (`trusted_nodes`), and the handshake and link limits. The secret and key files are
//! read when a role starts, not here, so `serve` and the tenant commands never need them.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config_error::{invalid, positive, positive_u64, ConfigError};
use crate::private_file::{read_node_key_file, read_secret_file};
use crate::tenants_settings::valid_tenant_name;

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    listen: Option<String>,
    gateway: Option<String>,
    secret_file: Option<PathBuf>,
    accept_secret_files: Option<Vec<PathBuf>>,
    node_key_file: Option<PathBuf>,
    trusted_nodes: Option<Vec<String>>,
    kv_listen: Option<String>,
    kv_advertise: Option<String>,
    name: Option<String>,
    metrics_listen: Option<String>,
    transfer_timeout_ms: Option<u64>,
    handshake_timeout_ms: Option<u64>,
    max_pending_handshakes: Option<usize>,
    link_lifetime_s: Option<u64>,
    max_pending_handshakes_per_source: Option<usize>,
    routing: Option<cluster::RoutingPolicy>,
}

/// How the roles of a disaggregated deployment find and trust each other.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Gateway: where workers register.
    pub listen: String,
    /// Workers: the gateway's `listen` address.
    pub gateway: String,
    /// A file holding the shared cluster secret (32+ random bytes in hex or base64); required by the
    /// gateway, prefill and decode roles. `serve` uses a random in-memory secret.
    pub secret_file: Option<PathBuf>,
    /// Secrets accepted from peers besides `secret_file`, never dialled with: set during a
    /// rotation (docs/cluster.md), reloaded on SIGHUP.
    pub accept_secret_files: Vec<PathBuf>,
    /// This node's own static key (written by `pagewarden node keygen`, owner-only); required
    /// by the gateway, prefill and decode roles. `serve` uses a random in-memory key.
    pub node_key_file: Option<PathBuf>,
    /// The identities of the nodes this node links with and counts the membership records of
    /// (every node's, its own may be among them); required
    /// and non-empty for the gateway, prefill and decode roles: a node with no pinned key would
    /// refuse every peer. Reloaded on SIGHUP: a key removed here is revoked.
    pub trusted_nodes: Vec<TrustedNode>,
    /// Handshakes a listener (the gateway's cluster port, a decode worker's KV port) runs at
    /// once; further connections are refused and counted.
    pub max_pending_handshakes: usize,
    /// Of those, how many one source address (an IPv6 /64) may hold; further connections from
    /// it are refused and counted.
    pub max_pending_handshakes_per_source: usize,
    /// Decode: where prefill workers connect to send KV.
    pub kv_listen: String,
    /// Decode: the address prefill workers are given (default: the bound `kv_listen`).
    pub kv_advertise: Option<String>,
    /// Workers: the name in logs and the gateway's metrics (default: role and process id).
    pub name: Option<String>,
    /// Workers: serve `/metrics` here (default: none).
    pub metrics_listen: Option<String>,
    pub transfer_timeout: Duration,
    pub handshake_timeout: Duration,
    /// Workers: a gateway link is replaced by a freshly handshaken one (new link first) after
    /// this long.
    pub link_lifetime: Duration,
    /// Gateway: how a route's prefill worker is chosen, `"cache_aware"` (default: where the
    /// request's own tenant has the longest cached prefix, weighed against the work queued
    /// there) or `"least_loaded"`.
    pub routing: cluster::RoutingPolicy,
}

impl ClusterSettings {
    /// Reads the cluster secret files: the one to dial with (`secret_file`) and the others to
    /// accept (`accept_secret_files`).
    pub fn secrets(&self) -> Result<(wire::ClusterSecret, Vec<wire::ClusterSecret>), ConfigError> {
        let path = self.secret_file.as_ref().ok_or_else(|| {
            invalid("cluster.secret_file", "is required for the gateway, prefill and decode roles (a file with 32+ random bytes in hex or base64, the same on every node: `(umask 077; head -c 48 /dev/urandom | base64 > FILE)`)")
        })?;
        let current = read_secret_file("cluster.secret_file", path)?;
        let others = self
            .accept_secret_files
            .iter()
            .map(|p| read_secret_file("cluster.accept_secret_files", p))
            .collect::<Result<_, _>>()?;
        Ok((current, others))
    }

    /// Reads this node's key file (`node_key_file`).
    pub fn node_key(&self) -> Result<wire::NodeKey, ConfigError> {
        let path = self.node_key_file.as_ref().ok_or_else(|| {
            invalid(
                "cluster.node_key_file",
                "is required for the gateway, prefill and decode roles: make one per node with \
                 `pagewarden node keygen --out FILE` and pin the identity it prints in every node's cluster.trusted_nodes",
            )
        })?;
        read_node_key_file("cluster.node_key_file", path)
    }

    /// The pinned node identities, refused when there are none (such a node could link with
    /// nobody).
    pub fn trusted_identities(&self) -> Result<Vec<wire::NodeIdentity>, ConfigError> {
        if self.trusted_nodes.is_empty() {
            return Err(invalid(
                "cluster.trusted_nodes",
                "is empty: list the identity of every node of the cluster (`pagewarden node keygen` prints it); \
                 a node trusting no key would refuse every peer",
            ));
        }
        Ok(self.trusted_nodes.iter().map(|t| t.identity).collect())
    }
}

/// One entry of `cluster.trusted_nodes`: `"IDENTITY"` or `"NAME:IDENTITY"`, the node's identity
/// (its link key and its record-signing key) as `pagewarden node keygen` and `node identity`
/// print it: 128 hex digits, or standard base64 of its 64 bytes; the name only labels it for
/// operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedNode {
    pub name: Option<String>,
    pub identity: wire::NodeIdentity,
}

/// The bytes of a key written as hex (64 or 128 digits) or standard base64 (padding optional).
fn key_bytes(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let text = text.trim();
    if (text.len() == 64 || text.len() == 128) && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..text.len() / 2).map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()).collect()
    } else {
        base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT.decode(text.as_bytes()).ok()
    }
}

/// A node identity written as 128 hex digits or base64 of its 64 bytes.
pub fn parse_node_identity(text: &str) -> Option<wire::NodeIdentity> {
    let bytes: [u8; 64] = key_bytes(text)?.try_into().ok()?;
    Some(wire::NodeIdentity::from_bytes(&bytes))
}

/// A node's link key, written either alone (64 hex digits or base64 of 32 bytes: what configs
/// pinned before records were signed) or as part of its full identity.
pub fn parse_node_public_key(text: &str) -> Option<wire::NodePublicKey> {
    let bytes = key_bytes(text)?;
    match <[u8; 32]>::try_from(bytes.as_slice()) {
        Ok(link) => Some(wire::NodePublicKey(link)),
        Err(_) => parse_node_identity(text).map(|i| i.link),
    }
}

impl std::str::FromStr for TrustedNode {
    type Err = ConfigError;

    fn from_str(entry: &str) -> Result<Self, ConfigError> {
        let (name, key) = match entry.rsplit_once(':') {
            Some((n, k)) => (Some(n.trim().to_string()), k),
            None => (None, entry),
        };
        let bad = |why: &str| invalid("cluster.trusted_nodes", format!("entry `{entry}`: {why}"));
        if name.as_deref().is_some_and(|n| !valid_tenant_name(n)) {
            return Err(bad("a name must be 1-64 characters of A-Z a-z 0-9 - _ ."));
        }
        if key_bytes(key).is_some_and(|b| b.len() == wire::NODE_KEY_LEN) {
            // A link key alone cannot check the node's signed membership records: refused
            // rather than half-trusted.
            return Err(bad(
                "pins only a link key (64 hex digits, the format before signed membership records): pin the node's \
                 full identity, which `pagewarden node identity --node-key-file FILE` prints from its key file",
            ));
        }
        let identity = parse_node_identity(key).ok_or_else(|| {
            bad("not a node identity (128 hex digits or base64, as `pagewarden node keygen` or `node identity` prints)")
        })?;
        Ok(TrustedNode { name, identity })
    }
}

/// An empty `[cluster]`.
pub(crate) fn defaults() -> ClusterSettings {
    ClusterSettings {
        listen: "127.0.0.1:7100".into(),
        gateway: "127.0.0.1:7100".into(),
        secret_file: None,
        accept_secret_files: Vec::new(),
        node_key_file: None,
        trusted_nodes: Vec::new(),
        max_pending_handshakes: cluster::MAX_PENDING_HANDSHAKES,
        max_pending_handshakes_per_source: cluster::MAX_PENDING_HANDSHAKES_PER_SOURCE,
        kv_listen: "127.0.0.1:0".into(),
        kv_advertise: None,
        name: None,
        metrics_listen: None,
        transfer_timeout: Duration::from_secs(30),
        handshake_timeout: Duration::from_secs(10),
        link_lifetime: Duration::from_secs(3600),
        routing: cluster::RoutingPolicy::CacheAware,
    }
}

impl RawCluster {
    pub(crate) fn settings(c: RawCluster) -> Result<ClusterSettings, ConfigError> {
        let d = defaults();
        Ok(ClusterSettings {
            listen: c.listen.unwrap_or(d.listen),
            gateway: c.gateway.unwrap_or(d.gateway),
            secret_file: c.secret_file,
            accept_secret_files: c.accept_secret_files.unwrap_or_default(),
            node_key_file: c.node_key_file,
            trusted_nodes: c
                .trusted_nodes
                .unwrap_or_default()
                .iter()
                .map(|e| e.parse())
                .collect::<Result<Vec<TrustedNode>, ConfigError>>()?,
            max_pending_handshakes: positive(
                "cluster.max_pending_handshakes",
                c.max_pending_handshakes,
                d.max_pending_handshakes,
            )?,
            max_pending_handshakes_per_source: positive(
                "cluster.max_pending_handshakes_per_source",
                c.max_pending_handshakes_per_source,
                d.max_pending_handshakes_per_source,
            )?,
            kv_listen: c.kv_listen.unwrap_or(d.kv_listen),
            kv_advertise: c.kv_advertise,
            name: c.name,
            metrics_listen: c.metrics_listen,
            transfer_timeout: Duration::from_millis(positive_u64(
                "cluster.transfer_timeout_ms",
                c.transfer_timeout_ms,
                30_000,
            )?),
            handshake_timeout: Duration::from_millis(positive_u64(
                "cluster.handshake_timeout_ms",
                c.handshake_timeout_ms,
                10_000,
            )?),
            link_lifetime: Duration::from_secs(positive_u64("cluster.link_lifetime_s", c.link_lifetime_s, 3600)?),
            routing: c.routing.unwrap_or(d.routing),
        })
    }
}
