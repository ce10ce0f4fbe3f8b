//! Sealed records: a member's record in etcd carries a MAC under a key only members hold, bound
//! to the etcd key it sits under and to the time it was sealed. Whoever can write to etcd but
//! holds no member key (an etcd user, a compromised etcd host, anyone on its network while it
//! speaks plain HTTP) can still delete entries, but cannot add one that counts: a junk entry, an
//! entry moved under another name or prefix, or one replayed after its publisher stopped
//! refreshing it is ignored by every reader. Publishers seal afresh at each lease renewal
//! ([`crate::publish_sealed`]), so a live entry is never older than a third of its lease.

use serde::{Deserialize, Serialize};

/// The domain of the MAC: nothing else is ever keyed-hashed under a record key.
const DOMAIN: &[u8] = b"pagewarden membership record v1";

/// How old (or how far ahead, for clocks that disagree) a sealed record may be and still
/// count: far above a renewal period, so clock skew between hosts does not drop live members,
/// and short enough that a replayed record stops counting within minutes.
pub const MAX_RECORD_AGE_MS: u64 = 120_000;

/// A key records are sealed and opened with (the node derives it from the cluster secret).
#[derive(Clone)]
pub struct RecordKey([u8; 32]);

impl RecordKey {
    pub fn new(bytes: [u8; 32]) -> Self {
        RecordKey(bytes)
    }
}

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(<redacted>)")
    }
}

/// Why an entry does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not a sealed record at all.
    Malformed,
    /// Sealed under no key this node holds, or for another etcd key, or altered.
    BadMac,
    /// Sealed too long ago (or too far ahead).
    Stale,
}

impl Rejected {
    pub fn label(self) -> &'static str {
        match self {
            Rejected::Malformed => "malformed",
            Rejected::BadMac => "bad_mac",
            Rejected::Stale => "stale",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    /// The record's JSON, as the publisher wrote it.
    record: String,
    issued_ms: u64,
    /// hex keyed BLAKE3 over the domain, the etcd key, the time and the record
    mac: String,
}

fn mac(key: &RecordKey, etcd_key: &str, issued_ms: u64, record: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(&key.0);
    h.update(DOMAIN);
    h.update(&(etcd_key.len() as u64).to_le_bytes());
    h.update(etcd_key.as_bytes());
    h.update(&issued_ms.to_le_bytes());
    h.update(record);
    h.finalize()
}

/// `record` (JSON text) sealed for `etcd_key` at `issued_ms` (Unix milliseconds).
pub fn seal(key: &RecordKey, etcd_key: &str, record: &str, issued_ms: u64) -> Vec<u8> {
    let mac = mac(key, etcd_key, issued_ms, record.as_bytes()).to_hex().to_string();
    let sealed = Sealed { record: record.to_string(), issued_ms, mac };
    serde_json::to_vec(&sealed).unwrap_or_default()
}

/// The record inside `value`, found under `etcd_key`, if it opens under one of `keys` and is
/// fresh at `now_ms`.
pub fn open(keys: &[RecordKey], etcd_key: &str, value: &[u8], now_ms: u64) -> Result<String, Rejected> {
    let sealed: Sealed = serde_json::from_slice(value).map_err(|_| Rejected::Malformed)?;
    let claimed = blake3::Hash::from_hex(&sealed.mac).map_err(|_| Rejected::Malformed)?;
    // blake3::Hash compares in constant time.
    if !keys.iter().any(|k| mac(k, etcd_key, sealed.issued_ms, sealed.record.as_bytes()) == claimed) {
        return Err(Rejected::BadMac);
    }
    if now_ms.abs_diff(sealed.issued_ms) > MAX_RECORD_AGE_MS {
        return Err(Rejected::Stale);
    }
    Ok(sealed.record)
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> RecordKey {
        RecordKey::new([b; 32])
    }

    #[test]
    fn a_sealed_record_opens_only_under_its_key_its_etcd_key_and_while_fresh() {
        let v = seal(&key(1), "/p/gateways/gw-1", r#"{"id":"gw-1"}"#, 1_000_000);
        assert_eq!(open(&[key(2), key(1)], "/p/gateways/gw-1", &v, 1_000_500).as_deref(), Ok(r#"{"id":"gw-1"}"#));
        assert_eq!(open(&[key(2)], "/p/gateways/gw-1", &v, 1_000_500), Err(Rejected::BadMac));
        assert_eq!(open(&[key(1)], "/p/gateways/gw-2", &v, 1_000_500), Err(Rejected::BadMac), "moved");
        assert_eq!(open(&[key(1)], "/p/workers/gw-1", &v, 1_000_500), Err(Rejected::BadMac), "moved");
        let late = 1_000_000 + MAX_RECORD_AGE_MS + 1;
        assert_eq!(open(&[key(1)], "/p/gateways/gw-1", &v, late), Err(Rejected::Stale), "replayed later");
        assert_eq!(
            open(&[key(1)], "/p/gateways/gw-1", br#"{"id":"x","cluster_addr":"1.2.3.4:5"}"#, 0),
            Err(Rejected::Malformed)
        );
    }

    #[test]
    fn any_change_to_the_record_or_its_time_fails_the_mac() {
        let v = seal(&key(1), "/k", r#"{"a":1}"#, 5_000);
        let text = String::from_utf8(v).unwrap();
        for forged in [text.replace(r#"{\"a\":1}"#, r#"{\"a\":2}"#), text.replace("5000", "5001")] {
            assert_eq!(open(&[key(1)], "/k", forged.as_bytes(), 5_000), Err(Rejected::BadMac), "{forged}");
        }
    }
}
