//! An etcd value as a node reads it from the membership store, where anyone who can write to
//! etcd may have put it: arbitrary bytes opened as a sealed record (`membership::seal::open`).
//! Properties: nothing panics; bytes that were not sealed under the node's key and signed by a
//! pinned node never open; a record sealed under the key by a pinned node opens, under its own
//! etcd key only, to the same text and signer; one signed by an unpinned node does not.
#![no_main]
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use membership::seal::{open, seal, Opened, RecordKey, Rejected, Signers, SIGNATURE_LEN, SIGNER_LEN};

#[derive(Debug, Arbitrary)]
struct Input {
    value: Vec<u8>,
    etcd_key: String,
    record: String,
    issued_ms: u64,
}

/// The signers pinned: their Ed25519 keys, checked as nodes check them.
struct Pinned(Vec<wire::SigningPublicKey>);

impl Signers for Pinned {
    fn pinned(&self, signer: &[u8; SIGNER_LEN]) -> bool {
        self.0.iter().any(|k| k.0 == *signer)
    }
    fn verify(&self, signer: &[u8; SIGNER_LEN], message: &[u8], signature: &[u8; SIGNATURE_LEN]) -> bool {
        wire::SigningPublicKey(*signer).verify(message, signature)
    }
}

fn sealed_by(node: &wire::NodeKey, key: &RecordKey, etcd_key: &str, record: &str, at: u64) -> Vec<u8> {
    seal(key, etcd_key, record, at, &node.identity().signing.0, |m| node.sign_record(m)).expect("signs")
}

fuzz_target!(|input: Input| {
    let key = RecordKey::new([7; 32]);
    let node = wire::NodeKey::from_private([9; 32]).expect("node key");
    let stranger = wire::NodeKey::from_private([10; 32]).expect("node key");
    let pinned = Pinned(vec![node.identity().signing]);
    // Whatever was written: an error value, or (only if it carries a MAC under our key and our
    // node's signature, which arbitrary bytes cannot) a record.
    if let Ok(o) = open(&[key.clone()], &pinned, &input.etcd_key, &input.value, input.issued_ms) {
        let resealed = sealed_by(&node, &key, &input.etcd_key, &o.record, input.issued_ms);
        assert!(open(&[key.clone()], &pinned, &input.etcd_key, &resealed, input.issued_ms).is_ok());
    }
    // A record we sealed opens to itself, and not under another etcd key or another key.
    let sealed = sealed_by(&node, &key, &input.etcd_key, &input.record, input.issued_ms);
    assert_eq!(
        open(&[key.clone()], &pinned, &input.etcd_key, &sealed, input.issued_ms),
        Ok(Opened { record: input.record.clone(), signer: node.identity().signing.0 })
    );
    let elsewhere = format!("{}/", input.etcd_key);
    assert_eq!(open(&[key.clone()], &pinned, &elsewhere, &sealed, input.issued_ms), Err(Rejected::BadMac));
    let other = RecordKey::new([8; 32]);
    assert_eq!(open(&[other], &pinned, &input.etcd_key, &sealed, input.issued_ms), Err(Rejected::BadMac));
    // Under the right key but by a node nobody pins.
    let forged = sealed_by(&stranger, &key, &input.etcd_key, &input.record, input.issued_ms);
    assert_eq!(open(&[key], &pinned, &input.etcd_key, &forged, input.issued_ms), Err(Rejected::UnknownSigner));
});
