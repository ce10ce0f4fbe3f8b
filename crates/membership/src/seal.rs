//! Sealed records: a member's record in etcd carries a MAC under a key only members hold and
//! the Ed25519 signature of the node that wrote it, both bound to the etcd key it sits under and
//! to the time it was sealed.
//!
//! The MAC (a key derived from the cluster secret) keeps out whoever can write to etcd but holds
//! no cluster secret (an etcd user, a compromised etcd host, anyone on its network while it
//! speaks plain HTTP), and a node that missed a secret rotation stops counting. The signature
//! keeps out the other members: every node holds the cluster secret, so the MAC alone would let
//! any of them (a compromised one) forge records for nodes that do not exist. A record counts
//! only when its signer is a node the reader pins now ([`Signers`]), so a forged entry can claim
//! no identity but its writer's own, and a revoked node's entries stop counting. Either way a
//! junk entry, an entry moved under another name or prefix, or one replayed after its
//! publisher stopped refreshing it is ignored by every reader. Publishers seal afresh at each
//! lease renewal ([`crate::publish_sealed`]), so a live entry is never older than a third of
//! its lease.
//!
//! Signing is the caller's (this crate knows no key types): [`seal`] takes a signing function,
//! [`open`] a [`Signers`] that says which signers are pinned and checks their signatures.

use serde::{Deserialize, Serialize};

/// The domain of the MAC and the signature: nothing else is ever keyed-hashed under a record
/// key or signed with a record-signing key. v2: records carry their signer's signature.
const DOMAIN: &[u8] = b"pagewarden membership record v2";

/// How old (or how far ahead, for clocks that disagree) a sealed record may be and still
/// count: far above a renewal period, so clock skew between hosts does not drop live members,
/// and short enough that a replayed record stops counting within minutes.
pub const MAX_RECORD_AGE_MS: u64 = 120_000;

/// Bytes of a signer's public key (Ed25519).
pub const SIGNER_LEN: usize = 32;
/// Bytes of a signature (Ed25519).
pub const SIGNATURE_LEN: usize = 64;

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

/// The signers a reader accepts, and the check of their signatures.
pub trait Signers {
    /// Whether records signed by `signer` may count (a node the reader pins now).
    fn pinned(&self, signer: &[u8; SIGNER_LEN]) -> bool;
    /// Whether `signature` is `signer`'s signature of `message`.
    fn verify(&self, signer: &[u8; SIGNER_LEN], message: &[u8], signature: &[u8; SIGNATURE_LEN]) -> bool;
}

/// Why an entry does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not a sealed record at all (or one of the format before signatures).
    Malformed,
    /// Sealed under no key this node holds, or for another etcd key, or altered.
    BadMac,
    /// Signed by a node this node does not pin (never was, or revoked).
    UnknownSigner,
    /// Not its signer's signature of this record, etcd key and time.
    BadSignature,
    /// Sealed too long ago (or too far ahead).
    Stale,
}

impl Rejected {
    pub fn label(self) -> &'static str {
        match self {
            Rejected::Malformed => "malformed",
            Rejected::BadMac => "bad_mac",
            Rejected::UnknownSigner => "unknown_signer",
            Rejected::BadSignature => "bad_signature",
            Rejected::Stale => "stale",
        }
    }
}

/// A record that opened, and who signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The record's JSON, as the publisher wrote it.
    pub record: String,
    /// The signer's public key (pinned by the reader).
    pub signer: [u8; SIGNER_LEN],
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    /// The record's JSON, as the publisher wrote it.
    record: String,
    issued_ms: u64,
    /// hex public key of the signer
    signer: String,
    /// hex signature over [`message`]
    sig: String,
    /// hex keyed BLAKE3 over [`message`]
    mac: String,
}

/// What the MAC and the signature cover: the domain, the etcd key, the time and the record.
fn message(etcd_key: &str, issued_ms: u64, record: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 16 + etcd_key.len() + record.len());
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(&(etcd_key.len() as u64).to_le_bytes());
    m.extend_from_slice(etcd_key.as_bytes());
    m.extend_from_slice(&issued_ms.to_le_bytes());
    m.extend_from_slice(record);
    m
}

fn mac(key: &RecordKey, message: &[u8]) -> blake3::Hash {
    blake3::keyed_hash(&key.0, message)
}

/// `record` (JSON text) sealed for `etcd_key` at `issued_ms` (Unix milliseconds) under `key`,
/// signed by `signer` through `sign` (which signs the bytes it is given).
pub fn seal<E>(
    key: &RecordKey,
    etcd_key: &str,
    record: &str,
    issued_ms: u64,
    signer: &[u8; SIGNER_LEN],
    sign: impl FnOnce(&[u8]) -> Result<[u8; SIGNATURE_LEN], E>,
) -> Result<Vec<u8>, E> {
    let m = message(etcd_key, issued_ms, record.as_bytes());
    let sig = sign(&m)?;
    let sealed = Sealed {
        record: record.to_string(),
        issued_ms,
        signer: hex(signer),
        sig: hex(&sig),
        mac: mac(key, &m).to_hex().to_string(),
    };
    Ok(serde_json::to_vec(&sealed).unwrap_or_default())
}

/// The record inside `value`, found under `etcd_key`, and its signer, if it opens under one of
/// `keys`, is signed by a signer of `signers` and is fresh at `now_ms`.
pub fn open(
    keys: &[RecordKey],
    signers: &impl Signers,
    etcd_key: &str,
    value: &[u8],
    now_ms: u64,
) -> Result<Opened, Rejected> {
    let sealed: Sealed = serde_json::from_slice(value).map_err(|_| Rejected::Malformed)?;
    let claimed = blake3::Hash::from_hex(&sealed.mac).map_err(|_| Rejected::Malformed)?;
    let signer: [u8; SIGNER_LEN] = unhex(&sealed.signer).ok_or(Rejected::Malformed)?;
    let sig: [u8; SIGNATURE_LEN] = unhex(&sealed.sig).ok_or(Rejected::Malformed)?;
    let m = message(etcd_key, sealed.issued_ms, sealed.record.as_bytes());
    // blake3::Hash compares in constant time.
    if !keys.iter().any(|k| mac(k, &m) == claimed) {
        return Err(Rejected::BadMac);
    }
    if !signers.pinned(&signer) {
        return Err(Rejected::UnknownSigner);
    }
    if !signers.verify(&signer, &m, &sig) {
        return Err(Rejected::BadSignature);
    }
    if now_ms.abs_diff(sealed.issued_ms) > MAX_RECORD_AGE_MS {
        return Err(Rejected::Stale);
    }
    Ok(Opened { record: sealed.record, signer })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from exactly `2N` hex digits.
fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let t = text.as_bytes();
    if t.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(t.chunks_exact(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
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

    /// A stand-in for Ed25519 (this crate has none): signer `s` "signs" with a keyed hash
    /// under `s`; the pinned signers are listed.
    struct Toy(Vec<[u8; SIGNER_LEN]>);

    fn toy_sign(signer: &[u8; SIGNER_LEN], m: &[u8]) -> [u8; SIGNATURE_LEN] {
        let mut sig = [0u8; SIGNATURE_LEN];
        sig[..32].copy_from_slice(blake3::keyed_hash(signer, m).as_bytes());
        sig
    }

    impl Signers for Toy {
        fn pinned(&self, signer: &[u8; SIGNER_LEN]) -> bool {
            self.0.contains(signer)
        }
        fn verify(&self, signer: &[u8; SIGNER_LEN], m: &[u8], sig: &[u8; SIGNATURE_LEN]) -> bool {
            toy_sign(signer, m) == *sig
        }
    }

    const A: [u8; 32] = [0xa; 32];
    const B: [u8; 32] = [0xb; 32];

    fn sealed_by(signer: &[u8; 32], k: &RecordKey, etcd_key: &str, record: &str, at: u64) -> Vec<u8> {
        seal(k, etcd_key, record, at, signer, |m| Ok::<_, ()>(toy_sign(signer, m))).unwrap()
    }

    #[test]
    fn a_sealed_record_opens_only_under_its_key_its_etcd_key_and_while_fresh() {
        let pinned = Toy(vec![B, A]);
        let v = sealed_by(&A, &key(1), "/p/gateways/gw-1", r#"{"id":"gw-1"}"#, 1_000_000);
        assert_eq!(
            open(&[key(2), key(1)], &pinned, "/p/gateways/gw-1", &v, 1_000_500),
            Ok(Opened { record: r#"{"id":"gw-1"}"#.into(), signer: A })
        );
        assert_eq!(open(&[key(2)], &pinned, "/p/gateways/gw-1", &v, 1_000_500), Err(Rejected::BadMac));
        assert_eq!(open(&[key(1)], &pinned, "/p/gateways/gw-2", &v, 1_000_500), Err(Rejected::BadMac), "moved");
        assert_eq!(open(&[key(1)], &pinned, "/p/workers/gw-1", &v, 1_000_500), Err(Rejected::BadMac), "moved");
        let late = 1_000_000 + MAX_RECORD_AGE_MS + 1;
        assert_eq!(open(&[key(1)], &pinned, "/p/gateways/gw-1", &v, late), Err(Rejected::Stale), "replayed later");
        assert_eq!(
            open(&[key(1)], &pinned, "/p/gateways/gw-1", br#"{"id":"x","cluster_addr":"1.2.3.4:5"}"#, 0),
            Err(Rejected::Malformed)
        );
    }

    #[test]
    fn a_record_counts_only_when_a_pinned_signer_signed_it() {
        let v = sealed_by(&A, &key(1), "/k", r#"{"a":1}"#, 5_000);
        assert_eq!(open(&[key(1)], &Toy(vec![A]), "/k", &v, 5_000).map(|o| o.signer), Ok(A));
        // Under the right MAC key (any member can make one) but by a node nobody pins, or one
        // revoked since.
        assert_eq!(open(&[key(1)], &Toy(vec![B]), "/k", &v, 5_000), Err(Rejected::UnknownSigner));
        assert_eq!(open(&[key(1)], &Toy(vec![]), "/k", &v, 5_000), Err(Rejected::UnknownSigner));
        // A pinned node named as the signer of what it did not sign.
        let text = String::from_utf8(v.clone()).unwrap();
        let claims_b = text.replace(&hex(&A), &hex(&B));
        assert_eq!(open(&[key(1)], &Toy(vec![A, B]), "/k", claims_b.as_bytes(), 5_000), Err(Rejected::BadSignature));
        // A signature altered.
        let sealed: Sealed = serde_json::from_slice(&v).unwrap();
        let flipped = if sealed.sig.starts_with('0') { "1" } else { "0" };
        let altered = text.replace(&sealed.sig, &format!("{flipped}{}", &sealed.sig[1..]));
        assert_eq!(open(&[key(1)], &Toy(vec![A]), "/k", altered.as_bytes(), 5_000), Err(Rejected::BadSignature));
        // Signer or signature missing or not hex: not a record of this version.
        for broken in [text.replace(&sealed.sig, "zz"), text.replace(&format!(r#","sig":"{}""#, sealed.sig), "")] {
            assert_eq!(open(&[key(1)], &Toy(vec![A]), "/k", broken.as_bytes(), 5_000), Err(Rejected::Malformed));
        }
        for r in
            [Rejected::Malformed, Rejected::BadMac, Rejected::UnknownSigner, Rejected::BadSignature, Rejected::Stale]
        {
            assert!(!r.label().is_empty());
        }
    }

    #[test]
    fn any_change_to_the_record_or_its_time_fails_the_mac() {
        let v = sealed_by(&A, &key(1), "/k", r#"{"a":1}"#, 5_000);
        let text = String::from_utf8(v).unwrap();
        for forged in [text.replace(r#"{\"a\":1}"#, r#"{\"a\":2}"#), text.replace("5000", "5001")] {
            assert_eq!(
                open(&[key(1)], &Toy(vec![A]), "/k", forged.as_bytes(), 5_000),
                Err(Rejected::BadMac),
                "{forged}"
            );
        }
    }

    #[test]
    fn a_failed_signature_seals_nothing() {
        assert_eq!(seal(&key(1), "/k", "{}", 1, &A, |_| Err("no key")), Err("no key"));
    }
}
