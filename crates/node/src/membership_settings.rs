//! `[membership]`: where the cluster's members find each other (etcd), validated at start-up.
//! Without it a worker dials the one gateway at `cluster.gateway` (the static mode).

use std::time::Duration;

use serde::Deserialize;

use crate::config_error::{invalid, ConfigError};

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMembership {
    etcd: Option<Vec<String>>,
    prefix: Option<String>,
    lease_ttl_s: Option<u64>,
    advertise: Option<String>,
    timeout_ms: Option<u64>,
}

/// Membership through etcd: every gateway and worker publishes itself under `prefix` with a
/// lease, gateways route to the workers that are live, workers register with every live
/// gateway (docs/cluster.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipSettings {
    /// etcd client endpoints (`HOST:PORT` or `http://HOST:PORT`), tried in order.
    pub etcd: Vec<String>,
    /// The cluster's root key: one etcd can hold several clusters.
    pub prefix: String,
    /// A member whose process or host is gone leaves the membership this long after its last
    /// renewal.
    pub lease_ttl: Duration,
    /// Gateway: the cluster address workers are told to dial (default: the bound
    /// `cluster.listen`, refused when it is a wildcard address).
    pub advertise: Option<String>,
    /// Each call to etcd ends within this.
    pub timeout: Duration,
}

pub const DEFAULT_PREFIX: &str = "/pagewarden";

impl RawMembership {
    /// `None` when the section is absent.
    pub(crate) fn settings(raw: Option<RawMembership>) -> Result<Option<MembershipSettings>, ConfigError> {
        let Some(m) = raw else { return Ok(None) };
        let etcd = m.etcd.unwrap_or_default();
        if etcd.is_empty() {
            return Err(invalid(
                "membership.etcd",
                "lists no endpoint: give etcd's client address, e.g. [\"127.0.0.1:2379\"]",
            ));
        }
        if let Some(e) = etcd.iter().find(|e| e.trim().is_empty() || e.starts_with("https://")) {
            return Err(invalid(
                "membership.etcd",
                format!("{e:?}: an endpoint is HOST:PORT or http://HOST:PORT (TLS to etcd is not supported yet: keep etcd on the private network)"),
            ));
        }
        let prefix = m.prefix.unwrap_or_else(|| DEFAULT_PREFIX.into());
        let plain = prefix.len() > 1
            && prefix.len() <= 128
            && prefix.starts_with('/')
            && !prefix.ends_with('/')
            && prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b));
        if !plain {
            return Err(invalid(
                "membership.prefix",
                format!("{prefix:?}: a key like /pagewarden/prod (a leading /, no trailing /, A-Z a-z 0-9 / - _ .)"),
            ));
        }
        let lease_ttl_s = m.lease_ttl_s.unwrap_or(5);
        if !(2..=3600).contains(&lease_ttl_s) {
            return Err(invalid("membership.lease_ttl_s", format!("must be 2..3600 seconds, got {lease_ttl_s}")));
        }
        let timeout_ms = m.timeout_ms.unwrap_or(2000);
        if timeout_ms == 0 {
            return Err(invalid("membership.timeout_ms", "must be at least 1, got 0"));
        }
        Ok(Some(MembershipSettings {
            etcd,
            prefix,
            lease_ttl: Duration::from_secs(lease_ttl_s),
            advertise: m.advertise,
            timeout: Duration::from_millis(timeout_ms),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Result<Option<MembershipSettings>, ConfigError> {
        #[derive(Deserialize)]
        struct Doc {
            membership: Option<RawMembership>,
        }
        let d: Doc = toml::from_str(toml).expect("toml");
        RawMembership::settings(d.membership)
    }

    #[test]
    fn no_section_is_the_static_mode_and_an_endpoint_alone_takes_the_defaults() {
        assert_eq!(parse("").unwrap(), None);
        let m = parse("[membership]\netcd = [\"127.0.0.1:2379\"]").unwrap().unwrap();
        assert_eq!((m.prefix.as_str(), m.lease_ttl, m.advertise), (DEFAULT_PREFIX, Duration::from_secs(5), None));
    }

    #[test]
    fn bad_membership_fields_are_refused_by_name() {
        for (toml, field) in [
            ("[membership]\nprefix = \"/x\"", "membership.etcd"),
            ("[membership]\netcd = [\"https://e:2379\"]", "membership.etcd"),
            ("[membership]\netcd = [\"e:2379\"]\nprefix = \"x/\"", "membership.prefix"),
            ("[membership]\netcd = [\"e:2379\"]\nprefix = \"/a b\"", "membership.prefix"),
            ("[membership]\netcd = [\"e:2379\"]\nlease_ttl_s = 1", "membership.lease_ttl_s"),
            ("[membership]\netcd = [\"e:2379\"]\ntimeout_ms = 0", "membership.timeout_ms"),
        ] {
            match parse(toml) {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{toml}"),
                other => panic!("{toml}: {other:?}"),
            }
        }
    }
}
