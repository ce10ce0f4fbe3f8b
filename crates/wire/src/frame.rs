//! The values that travel: tickets and frames. Byte layout is in `codec.rs` and `docs/wire.md`.

use crate::ct::ct_eq32;
use kv::{RequestId, TenantId};
use std::ops::Range;

/// The wire format version written in every frame and handshake header. Version 5: a route's
/// spec carries the router's route tags and a prefill worker reports the tags it caches
/// (`ToGateway::CacheTags`), for cache-aware routing. Version 4: control messages carry the request contract as itself (`protocol::RouteRequest` in a route's spec,
/// `protocol::RequestError` for a failure, `protocol::PoolStats` in a worker's stats). Version
/// 3 brought the Noise IXpsk0 handshake, each node proving its own static key (version 2 ran
/// NNpsk0, the cluster secret only; version 1 sent MAC'd plaintext). Bumped so an older peer is
/// refused by name ([`crate::WireError::BadVersion`]) at the handshake, rather than failing
/// every route on messages it cannot read.
pub const WIRE_VERSION: u16 = 5;

const CTX_PROMPT: &str = "pagewarden wire v1 prompt digest";

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

/// A fresh random nonce chosen by the decode worker for each reservation: it names the ticket
/// in frames and makes every ticket (and its derived key) distinct even when ids repeat.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TicketNonce(pub [u8; 16]);

impl std::fmt::Debug for TicketNonce {
    /// Its first four bytes only: enough to follow a ticket in logs, not to name it in a frame.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TicketNonce(")?;
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// What a decode worker returns for a reservation: the request, its tenant, the generation
/// nonce, how many pages it reserved and how many prompt tokens it expects to receive.
/// The nonce is a capability: it travels only inside encrypted links, and a frame naming a
/// ticket the receiver does not hold is dropped. Its key ([`crate::TicketKey`]) is derived on
/// both ends of the KV link and never travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub request: RequestId,
    pub tenant: TenantId,
    pub nonce: TicketNonce,
    /// Pages reserved by the receiver, for the whole sequence (prompt and generation).
    pub pages: u32,
    /// Prompt tokens the receiver expects to be transferred.
    pub tokens: u32,
    /// Leading prompt tokens the receiver already holds, verified earlier (whole pages of its
    /// own tenant-scoped prefix cache): the sender sends only the pages after them, and the
    /// receiver counts them as covered. A multiple of the page size, below `tokens`.
    pub held: u32,
}

impl Ticket {
    /// What every frame of this ticket names.
    pub fn id(&self) -> TicketId {
        TicketId { nonce: self.nonce, request: self.request, tenant: self.tenant }
    }
}

/// The ticket identity carried in every frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TicketId {
    pub nonce: TicketNonce,
    pub request: RequestId,
    pub tenant: TenantId,
}

/// One decoded (or to-be-encoded) frame: the header fields common to every kind, then a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ticket: TicketId,
    /// Position of this frame in its ticket's stream, from 0; the closing frame comes last.
    pub seq: u32,
    pub body: FrameBody,
}

/// What a frame carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameBody {
    Kv(KvFrame),
    Close(CloseFrame),
}

/// KV of some layers for some tokens of one page.
///
/// `tokens` are absolute prompt positions and must lie inside page `page_index` (slots
/// `page_index * page_size ..`). Payload layout: for each layer of `layers` in order, the K
/// rows of `tokens` then the V rows of `tokens`, each row `n_kv_heads * head_dim` elements of
/// the paired KV dtype, little-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvFrame {
    /// Index into the ticket's reserved pages (0..ticket.pages), not a physical page.
    pub page_index: u32,
    pub layers: Range<u32>,
    pub tokens: Range<u32>,
    pub payload: Vec<u8>,
}

/// The last frame of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseFrame {
    /// Prompt tokens the sender computed KV for.
    pub tokens: u32,
    /// Digest of the prompt token ids the sender computed KV for.
    pub prompt_digest: PromptDigest,
    /// The first token sampled by the prefill worker.
    pub first_token: u32,
}

impl Frame {
    /// This frame as a [`FrameRef`] borrowing its payload.
    pub fn borrowed(&self) -> FrameRef<'_> {
        let body = match &self.body {
            FrameBody::Kv(kv) => FrameBodyRef::Kv(KvFrameRef {
                page_index: kv.page_index,
                layers: kv.layers.clone(),
                tokens: kv.tokens.clone(),
                payload: &kv.payload,
            }),
            FrameBody::Close(c) => FrameBodyRef::Close(*c),
        };
        FrameRef { ticket: self.ticket, seq: self.seq, body }
    }

    /// A KV frame of `ticket`.
    pub fn kv(ticket: TicketId, seq: u32, kv: KvFrame) -> Self {
        Frame { ticket, seq, body: FrameBody::Kv(kv) }
    }

    /// A closing frame of `ticket`.
    pub fn close(ticket: TicketId, seq: u32, close: CloseFrame) -> Self {
        Frame { ticket, seq, body: FrameBody::Close(close) }
    }
}

/// A frame whose KV payload borrows the bytes it was decoded from
/// ([`crate::Codec::decode_borrowed`]): the receive path without copying the payload, which
/// the caller writes into its pages straight from its read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRef<'a> {
    pub ticket: TicketId,
    pub seq: u32,
    pub body: FrameBodyRef<'a>,
}

/// What a [`FrameRef`] carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameBodyRef<'a> {
    Kv(KvFrameRef<'a>),
    Close(CloseFrame),
}

/// [`KvFrame`] with a borrowed payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvFrameRef<'a> {
    pub page_index: u32,
    pub layers: Range<u32>,
    pub tokens: Range<u32>,
    pub payload: &'a [u8],
}

impl FrameRef<'_> {
    /// The owned frame (copies the payload).
    pub fn into_owned(self) -> Frame {
        let body = match self.body {
            FrameBodyRef::Kv(kv) => FrameBody::Kv(KvFrame {
                page_index: kv.page_index,
                layers: kv.layers,
                tokens: kv.tokens,
                payload: kv.payload.to_vec(),
            }),
            FrameBodyRef::Close(c) => FrameBody::Close(c),
        };
        Frame { ticket: self.ticket, seq: self.seq, body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_digest_depends_on_every_token_and_the_length() {
        let a = PromptDigest::of(&[1, 2, 3]);
        assert!(a.matches(&PromptDigest::of(&[1, 2, 3])));
        assert!(!a.matches(&PromptDigest::of(&[1, 2, 4])));
        assert!(!a.matches(&PromptDigest::of(&[1, 2])));
        assert!(!PromptDigest::of(&[]).matches(&PromptDigest::of(&[0])));
    }
}
