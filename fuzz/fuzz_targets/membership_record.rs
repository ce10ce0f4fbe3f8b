//! An etcd value as a node reads it from the membership store, where anyone who can write to
//! etcd may have put it: arbitrary bytes opened as a sealed record (`membership::seal::open`).
//! Properties: nothing panics; bytes that were not sealed under the node's key never open; a
//! record sealed under the key opens, under its own etcd key only, to the same text.
#![no_main]
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use membership::seal::{open, seal, RecordKey, Rejected};

#[derive(Debug, Arbitrary)]
struct Input {
    value: Vec<u8>,
    etcd_key: String,
    record: String,
    issued_ms: u64,
}

fuzz_target!(|input: Input| {
    let key = RecordKey::new([7; 32]);
    // Whatever was written: an error value, or (only if it carries a MAC under our key, which
    // arbitrary bytes cannot) a record.
    if let Ok(text) = open(&[key.clone()], &input.etcd_key, &input.value, input.issued_ms) {
        let resealed = seal(&key, &input.etcd_key, &text, input.issued_ms);
        assert!(open(&[key.clone()], &input.etcd_key, &resealed, input.issued_ms).is_ok());
    }
    // A record we sealed opens to itself, and not under another etcd key or another key.
    let sealed = seal(&key, &input.etcd_key, &input.record, input.issued_ms);
    assert_eq!(open(&[key.clone()], &input.etcd_key, &sealed, input.issued_ms).as_deref(), Ok(input.record.as_str()));
    let elsewhere = format!("{}/", input.etcd_key);
    assert_eq!(open(&[key], &elsewhere, &sealed, input.issued_ms), Err(Rejected::BadMac));
    assert_eq!(open(&[RecordKey::new([8; 32])], &input.etcd_key, &sealed, input.issued_ms), Err(Rejected::BadMac));
});
