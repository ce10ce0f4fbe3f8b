//! Keys, MACs and digests. All comparisons of secret-dependent values go through
//! [`subtle::ConstantTimeEq`]; keys never print (their `Debug` is redacted).

use crate::frame::Ticket;
use subtle::ConstantTimeEq;

/// Length of every MAC tag and digest in the protocol.
pub const TAG_LEN: usize = 32;

const CTX_TICKET_KEY: &str = "pagewarden wire v1 ticket key";
const CTX_PROMPT: &str = "pagewarden wire v1 prompt digest";

/// The per-ticket MAC key. It travels on the authenticated control channel (decode worker ->
/// gateway -> prefill worker), never inside a KV frame.
#[derive(Clone, PartialEq, Eq)]
pub struct TicketKey([u8; 32]);

impl TicketKey {
    /// A key from 32 bytes, which must be fresh random bytes (one key per ticket).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        TicketKey(bytes)
    }

    /// Derives the key of `ticket` from a node-local random master secret, so a decode worker
    /// need not store keys: the ticket (with its fresh nonce) selects a distinct key.
    pub fn derive(master: &[u8; 32], ticket: &Ticket) -> Self {
        let mut h = blake3::Hasher::new_derive_key(CTX_TICKET_KEY);
        h.update(master);
        h.update(&ticket.nonce.0);
        h.update(&ticket.request.0.to_le_bytes());
        h.update(&ticket.tenant.0.to_le_bytes());
        h.update(&ticket.pages.to_le_bytes());
        h.update(&ticket.tokens.to_le_bytes());
        TicketKey(*h.finalize().as_bytes())
    }

    /// The key itself, to hand to the prefill worker over the authenticated control channel.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketKey(<redacted>)")
    }
}

/// Keyed BLAKE3 of `data`.
pub fn mac(key: &[u8; 32], data: &[u8]) -> [u8; TAG_LEN] {
    *blake3::keyed_hash(key, data).as_bytes()
}

/// Constant-time check of `tag` against the keyed BLAKE3 of `data`. `tag` of the wrong length
/// is refused (the length is public).
pub fn verify(key: &[u8; 32], data: &[u8], tag: &[u8]) -> bool {
    let expected = mac(key, data);
    tag.len() == TAG_LEN && bool::from(expected[..].ct_eq(tag))
}

/// Constant-time equality of two 32-byte values.
pub fn ct_eq32(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(a[..].ct_eq(&b[..]))
}

/// BLAKE3 digest of a prompt's token ids, as carried in the closing frame.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PromptDigest(pub [u8; 32]);

impl PromptDigest {
    /// Digest of `tokens`: domain-separated, length-prefixed, each id as u32 little-endian.
    pub fn of(tokens: &[u32]) -> Self {
        let mut h = blake3::Hasher::new_derive_key(CTX_PROMPT);
        h.update(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        PromptDigest(*h.finalize().as_bytes())
    }

    /// Constant-time comparison.
    pub fn matches(&self, other: &PromptDigest) -> bool {
        ct_eq32(&self.0, &other.0)
    }
}

impl std::fmt::Debug for PromptDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PromptDigest(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_accepts_own_tag_and_refuses_any_other() {
        let key = [7u8; 32];
        let tag = mac(&key, b"hello");
        assert!(verify(&key, b"hello", &tag));
        assert!(!verify(&[8u8; 32], b"hello", &tag));
        assert!(!verify(&key, b"hellp", &tag));
        assert!(!verify(&key, b"hello", &tag[..31]));
        let mut bad = tag;
        bad[31] ^= 1;
        assert!(!verify(&key, b"hello", &bad));
    }

    #[test]
    fn prompt_digest_depends_on_every_token_and_the_length() {
        let a = PromptDigest::of(&[1, 2, 3]);
        assert!(a.matches(&PromptDigest::of(&[1, 2, 3])));
        assert!(!a.matches(&PromptDigest::of(&[1, 2, 4])));
        assert!(!a.matches(&PromptDigest::of(&[1, 2])));
        assert!(!PromptDigest::of(&[]).matches(&PromptDigest::of(&[0])));
    }

    #[test]
    fn ticket_key_debug_never_prints_the_key() {
        let k = TicketKey::from_bytes([0xab; 32]);
        assert!(!format!("{k:?}").contains("ab"));
    }
}
