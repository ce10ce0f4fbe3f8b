//! What members publish about themselves, as JSON: public facts only (addresses, role, model
//! digest, sizes), never a secret. Trust comes from the authenticated handshake every link
//! runs, so a forged entry can at worst point a node at an address that then fails it.

use serde::{Deserialize, Serialize};

/// A gateway, as workers find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayRecord {
    pub id: String,
    /// where workers dial the gateway's cluster listener
    pub cluster_addr: String,
}

/// A worker, as gateways find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub name: String,
    /// "prefill" | "decode"
    pub role: String,
    /// hex BLAKE3 of the model file
    pub model: String,
    pub kv_addr: Option<String>,
    pub capacity_tokens: usize,
    pub context: usize,
}

/// Where gateways publish: `{root}/gateways/` (`root` like "/pagewarden/prod"; a trailing
/// slash is tolerated).
pub fn gateways_prefix(root: &str) -> String {
    format!("{}/gateways/", root.trim_end_matches('/'))
}

/// Where workers publish: `{root}/workers/`.
pub fn workers_prefix(root: &str) -> String {
    format!("{}/workers/", root.trim_end_matches('/'))
}

/// Where a tenant change is announced: `{root}/tenants/`, one key ([`TENANTS_CHANGED`]).
pub fn tenants_prefix(root: &str) -> String {
    format!("{}/tenants/", root.trim_end_matches('/'))
}

/// The key under [`tenants_prefix`] that `pagewarden tenant add / remove / rotate-key`
/// overwrite (no lease: the last change stays announced).
pub const TENANTS_CHANGED: &str = "changed";

/// A tenant change: the digest of the tenant table every gateway should now serve. Each
/// gateway reads its own copy of the tenant file when it sees a new one (the table never
/// travels through etcd, so an etcd writer can make gateways re-read their files, never
/// add a tenant); the digest tells a gateway whether its copy is the announced one yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantsRecord {
    /// hex SHA-256 over the table's ids, names, key digests and limits
    pub digest: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_sit_under_the_root_with_or_without_its_slash() {
        assert_eq!(gateways_prefix("/pagewarden/prod"), "/pagewarden/prod/gateways/");
        assert_eq!(workers_prefix("/pagewarden/prod/"), "/pagewarden/prod/workers/");
    }

    #[test]
    fn records_are_plain_json() {
        let w = WorkerRecord {
            name: "decode-1".into(),
            role: "decode".into(),
            model: "ab12".into(),
            kv_addr: Some("10.0.0.2:7001".into()),
            capacity_tokens: 4096,
            context: 2048,
        };
        let text = serde_json::to_string(&w).expect("json");
        assert_eq!(
            text,
            r#"{"name":"decode-1","role":"decode","model":"ab12","kv_addr":"10.0.0.2:7001","capacity_tokens":4096,"context":2048}"#
        );
        assert_eq!(serde_json::from_str::<WorkerRecord>(&text).expect("back"), w);
        let g = GatewayRecord { id: "gw-1".into(), cluster_addr: "10.0.0.1:7000".into() };
        assert_eq!(serde_json::from_slice::<GatewayRecord>(&serde_json::to_vec(&g).expect("json")).expect("back"), g);
    }
}
