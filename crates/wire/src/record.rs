//! The AEAD that every byte between nodes travels under once the handshake is done:
//! AES-256-GCM from `ring` (VAES/AVX2 or AES-NI with carry-less multiply on x86_64).
//!
//! A link has one key per direction. Its records take their nonce from a counter that both
//! ends keep and that never travels (as Noise and TLS 1.3 do), so a record that is dropped,
//! repeated, reordered, or carried over from another connection fails to open: the next record
//! the receiver opens must be exactly the next one the sender sealed.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

use crate::error::WireError;

/// Bytes of every AEAD tag.
pub const AEAD_TAG_LEN: usize = 16;

/// One AES-256-GCM key. Never printed.
struct AeadKey(LessSafeKey);

impl AeadKey {
    pub(crate) fn new(bytes: &[u8; 32]) -> Result<Self, WireError> {
        let key = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| WireError::Crypto("AES-256-GCM key setup"))?;
        Ok(AeadKey(LessSafeKey::new(key)))
    }

    /// Encrypts `data` in place; returns the tag over `aad` and the ciphertext. `nonce` must
    /// never repeat under this key.
    pub(crate) fn seal(&self, nonce: [u8; 12], aad: &[u8], data: &mut [u8]) -> Result<[u8; AEAD_TAG_LEN], WireError> {
        let tag = self
            .0
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), data)
            .map_err(|_| WireError::Crypto("AES-256-GCM seal"))?;
        let mut out = [0u8; AEAD_TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Decrypts `data` in place if `tag` authenticates it and `aad` (ring compares the tag in
    /// constant time); on failure `data` is left unusable and the caller must drop it.
    pub(crate) fn open(&self, nonce: [u8; 12], aad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<(), WireError> {
        let tag = Tag::try_from(tag).map_err(|_| WireError::BadMac)?;
        self.0
            .open_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), tag, data, 0..)
            .map_err(|_| WireError::BadMac)?;
        Ok(())
    }
}

impl std::fmt::Debug for AeadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AeadKey(<redacted>)")
    }
}

/// Noise's nonce layout: four zero bytes, then the counter big-endian.
fn counter_nonce(n: u64) -> [u8; 12] {
    let mut nonce = [0u8; 12];
    nonce[4..].copy_from_slice(&n.to_be_bytes());
    nonce
}

/// The sending direction of a link.
#[derive(Debug)]
pub struct RecordSealer {
    key: AeadKey,
    next: u64,
}

/// The receiving direction of a link.
#[derive(Debug)]
pub struct RecordOpener {
    key: AeadKey,
    next: u64,
}

impl RecordSealer {
    pub(crate) fn new(key: &[u8; 32]) -> Result<Self, WireError> {
        Ok(RecordSealer { key: AeadKey::new(key)?, next: 0 })
    }

    /// Encrypts the next record in place and returns its tag.
    pub fn seal(&mut self, aad: &[u8], data: &mut [u8]) -> Result<[u8; AEAD_TAG_LEN], WireError> {
        // 2^64 records never happen; refusing beats wrapping a nonce.
        let n = self.next;
        self.next = n.checked_add(1).ok_or(WireError::Crypto("record counter exhausted"))?;
        self.key.seal(counter_nonce(n), aad, data)
    }
}

impl RecordOpener {
    pub(crate) fn new(key: &[u8; 32]) -> Result<Self, WireError> {
        Ok(RecordOpener { key: AeadKey::new(key)?, next: 0 })
    }

    /// Decrypts the next record in place. Any failure ([`WireError::BadMac`]) means the stream
    /// was tampered with or is not this link's: the caller must drop the link.
    pub fn open(&mut self, aad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<(), WireError> {
        let n = self.next;
        self.next = n.checked_add(1).ok_or(WireError::Crypto("record counter exhausted"))?;
        self.key.open(counter_nonce(n), aad, data, tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (RecordSealer, RecordOpener) {
        (
            RecordSealer::new(&[3; 32]).unwrap_or_else(|e| panic!("{e}")),
            RecordOpener::new(&[3; 32]).unwrap_or_else(|e| panic!("{e}")),
        )
    }

    #[test]
    fn records_open_in_order_and_hide_their_plaintext() {
        let (mut s, mut o) = pair();
        for i in 0..3u8 {
            let mut data = vec![i; 40];
            let tag = s.seal(b"aad", &mut data).unwrap_or_else(|e| panic!("{e}"));
            assert_ne!(data, vec![i; 40]);
            o.open(b"aad", &mut data, &tag).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(data, vec![i; 40]);
        }
    }

    #[test]
    fn a_skipped_repeated_or_tampered_record_fails_to_open() {
        let (mut s, mut o) = pair();
        let mut first = vec![1u8; 16];
        let t1 = s.seal(b"", &mut first).unwrap_or_else(|e| panic!("{e}"));
        let mut second = vec![2u8; 16];
        let t2 = s.seal(b"", &mut second).unwrap_or_else(|e| panic!("{e}"));
        // Skipping the first: the second does not open as record 0.
        assert_eq!(o.open(b"", &mut second.clone(), &t2), Err(WireError::BadMac));
        let (_, mut o) = pair();
        let mut c = first.clone();
        assert_eq!(o.open(b"", &mut c, &t1), Ok(()));
        // Repeating the first: it does not open as record 1.
        assert_eq!(o.open(b"", &mut first.clone(), &t1), Err(WireError::BadMac));
        let (_, mut o) = pair();
        let mut flipped = first.clone();
        flipped[3] ^= 1;
        assert_eq!(o.open(b"", &mut flipped, &t1), Err(WireError::BadMac));
        let (_, mut o) = pair();
        assert_eq!(o.open(b"other aad", &mut first.clone(), &t1), Err(WireError::BadMac));
        let (_, mut o) = pair();
        assert_eq!(o.open(b"", &mut first.clone(), &t1[..15]), Err(WireError::BadMac));
    }

    #[test]
    fn keys_never_print() {
        let (s, _) = pair();
        assert!(!format!("{s:?}").contains("3, 3"));
    }
}
