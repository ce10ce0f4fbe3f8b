//! The values that travel: tickets and frames. Byte layout is in `codec.rs` and `docs/wire.md`.

use crate::mac::PromptDigest;
use kv::{RequestId, TenantId};
use std::ops::Range;

/// The wire format version written in every frame and handshake header.
pub const WIRE_VERSION: u16 = 1;

/// A fresh random nonce chosen by the decode worker for each reservation: it names the ticket
/// on the wire and makes every ticket (and its derived key) distinct even when ids repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TicketNonce(pub [u8; 16]);

/// What a decode worker returns for a reservation: the request, its tenant, the generation
/// nonce, how many pages it reserved and how many prompt tokens it expects to receive.
/// The per-ticket MAC key ([`crate::TicketKey`]) is handed beside it, never inside frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub request: RequestId,
    pub tenant: TenantId,
    pub nonce: TicketNonce,
    /// Pages reserved by the receiver, for the whole sequence (prompt and generation).
    pub pages: u32,
    /// Prompt tokens the receiver expects to be transferred.
    pub tokens: u32,
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
