//! What a handshake leaves behind and what is derived from it: per-direction record keys, the
//! link's exporter secret, and the per-ticket keys derived from that exporter on both ends of
//! a KV link, so that no key ever travels. Keys never print (their `Debug` is redacted).

use crate::error::WireError;
use crate::frame::TicketId;
use aegis::aegis128x2::Aegis128X2;

use crate::record::{RecordOpener, RecordSealer, AEAD_TAG_LEN};

const CTX_I2R: &str = "pagewarden wire v2 record key initiator to responder";
const CTX_R2I: &str = "pagewarden wire v2 record key responder to initiator";
const CTX_EXPORTER: &str = "pagewarden wire v2 exporter";
const CTX_TICKET_KEY: &str = "pagewarden wire v2 ticket key";

/// The secrets one handshake established, from one side's point of view: a key for each
/// direction and an exporter for per-ticket keys. Fresh per connection (ephemeral X25519), so
/// a later theft of the cluster secret does not open recorded traffic (forward secrecy).
pub struct SessionKeys {
    initiator: bool,
    i2r: [u8; 32],
    r2i: [u8; 32],
    exporter: Exporter,
}

impl SessionKeys {
    /// The keys of a finished handshake whose split gave `k1` (initiator to responder) and
    /// `k2`, with handshake hash `h`, as seen by the initiator (`initiator`) or the responder.
    /// Public so that benches and fuzzers can build a link without sockets; a node gets its
    /// keys only from [`crate::Initiator`] and [`crate::Responder`].
    pub fn from_split(initiator: bool, k1: &[u8; 32], k2: &[u8; 32], h: &[u8]) -> SessionKeys {
        let mut e = blake3::Hasher::new_derive_key(CTX_EXPORTER);
        e.update(k1);
        e.update(k2);
        e.update(h);
        SessionKeys {
            initiator,
            i2r: blake3::derive_key(CTX_I2R, k1),
            r2i: blake3::derive_key(CTX_R2I, k2),
            exporter: Exporter(*e.finalize().as_bytes()),
        }
    }

    /// The same session seen from the other end (tests and benches).
    pub fn peer_view(&self) -> SessionKeys {
        SessionKeys { initiator: !self.initiator, i2r: self.i2r, r2i: self.r2i, exporter: self.exporter.clone() }
    }

    /// Whether these are the initiator's keys.
    pub fn is_initiator(&self) -> bool {
        self.initiator
    }

    /// The sealer for what we send, the opener for what we receive, and the exporter.
    pub fn into_parts(self) -> Result<(RecordSealer, RecordOpener, Exporter), WireError> {
        let (send, recv) = if self.initiator { (&self.i2r, &self.r2i) } else { (&self.r2i, &self.i2r) };
        Ok((RecordSealer::new(send)?, RecordOpener::new(recv)?, self.exporter))
    }
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKeys {{ initiator: {}, <redacted> }}", self.initiator)
    }
}

/// A link's exporter secret: both ends derive per-ticket keys from it.
#[derive(Clone, PartialEq, Eq)]
pub struct Exporter([u8; 32]);

impl Exporter {
    /// The key of one ticket's frames on this link.
    pub fn ticket_key(&self, ticket: &TicketId) -> Result<TicketKey, WireError> {
        let mut h = blake3::Hasher::new_derive_key(CTX_TICKET_KEY);
        h.update(&self.0);
        h.update(&ticket.nonce.0);
        h.update(&ticket.request.0.to_le_bytes());
        h.update(&ticket.tenant.0.to_le_bytes());
        let mut key = [0u8; 16];
        key.copy_from_slice(&h.finalize().as_bytes()[..16]);
        Ok(TicketKey { id: *ticket, key })
    }
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporter(<redacted>)")
    }
}

/// The key of one ticket's frame bodies on one link: derived on both ends from the link's
/// [`Exporter`] and the ticket, never sent. A frame of one ticket cannot open as another's,
/// and a frame carried to another link cannot open at all.
///
/// Bodies (the KV payloads: nearly every byte a KV link carries) use AEGIS-128X2 (the `aegis`
/// crate: libaegis, with run-time AES-NI/VAES dispatch; the two-lane AEGIS-128L of the CFRG
/// draft), which runs at about twice AES-GCM's speed on this CPU class; 128-bit key, nonce the
/// frame's sequence number, unique per key.
pub struct TicketKey {
    pub(crate) id: TicketId,
    key: [u8; 16],
}

impl TicketKey {
    /// The ticket this key belongs to.
    pub fn ticket(&self) -> &TicketId {
        &self.id
    }

    fn nonce(seq: u32) -> [u8; 16] {
        let mut n = [0u8; 16];
        n[12..].copy_from_slice(&seq.to_be_bytes());
        n
    }

    /// Encrypts body `seq` in place; returns its tag over `aad` and the ciphertext.
    pub(crate) fn seal(&self, seq: u32, aad: &[u8], body: &mut [u8]) -> [u8; AEAD_TAG_LEN] {
        Aegis128X2::<AEAD_TAG_LEN>::new(&self.key, &Self::nonce(seq)).encrypt_in_place(body, aad)
    }

    /// Encrypts body `seq` from `src` into `dst` (of the same length) in one pass: the sender's
    /// copy out of its source and the encryption together.
    pub(crate) fn seal_from(
        &self,
        seq: u32,
        aad: &[u8],
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<[u8; AEAD_TAG_LEN], WireError> {
        if src.len() != dst.len() {
            return Err(WireError::Malformed("ciphertext buffer of another length than the body"));
        }
        let mut e = Aegis128X2::<AEAD_TAG_LEN>::new(&self.key, &Self::nonce(seq)).encryptor(aad);
        e.update(src, dst);
        Ok(e.finalize())
    }

    /// Decrypts body `seq` in place if `tag` authenticates it and `aad` (libaegis compares in
    /// constant time and wipes the output on failure).
    pub(crate) fn open(&self, seq: u32, aad: &[u8], body: &mut [u8], tag: &[u8]) -> Result<(), WireError> {
        let tag: [u8; AEAD_TAG_LEN] = tag.try_into().map_err(|_| WireError::BadMac)?;
        Aegis128X2::<AEAD_TAG_LEN>::new(&self.key, &Self::nonce(seq))
            .decrypt_in_place(body, &tag, aad)
            .map_err(|_| WireError::BadMac)
    }
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TicketKey {{ ticket: {:?}, <redacted> }}", self.id)
    }
}
