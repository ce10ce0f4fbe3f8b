//! The wire protocol of pagewarden: what crosses between the gateway, prefill workers and
//! decode workers. A pure library (no sockets): the node key exchange, the encrypted record
//! layer, KV frames and their codec, and the decode worker's transfer checks. The format is in
//! `docs/wire.md`.
//!
//! Why it exists: in a disaggregated deployment, the KV cache of a prompt is computed on one
//! node and used on another. A transfer that is short, foreign, forged or for another prompt
//! must never be taken as complete, or the decode worker attends over pages that still hold
//! another tenant's KV (the 2026 incident in `docs/invariants.md`); and KV, prompts and outputs on the
//! network are as readable as the prompts themselves, so nothing crosses in clear.
//!
//! What it enforces:
//!
//! * **Authenticated, confidential links (invariants 11 and 12).** [`Initiator`] and
//!   [`Responder`] run `Noise_IXpsk0_25519_AESGCM_SHA256` keyed by the [`ClusterSecret`]
//!   and each node's own [`NodeKey`]: both sides prove the secret and their pinned key, every
//!   connection gets fresh keys (forward secrecy), a peer claiming our own role is refused. Every later byte is an AES-256-GCM record
//!   ([`RecordSealer`], [`RecordOpener`]) whose nonce is a counter never sent, so nothing can
//!   be read, dropped, repeated, reordered or carried over from another connection.
//! * **Paired nodes (invariant 2).** [`PairingInfo::check`], run inside the encrypted link,
//!   refuses peers whose model, page size, KV dtype or layout differ.
//! * **Bound and verified transfer (invariant 5).** Every KV frame's header (ticket, sequence,
//!   page, token range) is sealed under the link key, its body (AEGIS-128X2) under a per-ticket
//!   [`TicketKey`] that both ends derive from the link ([`Exporter`]) and that never travels,
//!   with the header as associated data ([`KvSealer`], [`KvOpener`]).
//! * **Coverage against the receiver's reservation (invariants 4 and 5).** A
//!   [`Transfer<Receiving>`] is built from the decode worker's own ticket, geometry and the
//!   admitted prompt; it refuses duplicates, overlaps, reordering, out-of-range pages, layers
//!   and tokens, and becomes [`Transfer<Complete>`] only when the closing frame's token count
//!   and [`PromptDigest`] match the admitted prompt and every (layer, prompt token) slot was
//!   written exactly once. Any error consumes the transfer: fail closed.
//! * **Frames for unknown or closed tickets are dropped (invariant 6)**:
//!   [`WireError::UnknownTicket`], [`WireError::AfterClose`].
//!
//! Every rejection is a typed [`WireError`] whose [`WireError::kind`] labels the
//! `pagewarden_isolation_violations_total{kind}` counter.

#![forbid(unsafe_code)]

mod codec;
mod ct;
mod error;
mod frame;
mod handshake;
mod keys;
mod node_id;
mod node_key;
mod pairing;
mod reader;
mod record;
mod transfer;

pub use codec::{
    KvFrameMut, KvOpener, KvSealer, OpenedHeader, SealedParts, TicketLookup, DEFAULT_MAX_FRAME, FRAME_MAGIC,
    FRAME_OVERHEAD, HEADER_LEN, HEADER_PLAIN_LEN,
};
pub use error::WireError;
pub use frame::{
    CloseFrame, Frame, FrameBody, FrameBodyRef, FrameRef, KvFrame, KvFrameRef, PromptDigest, Ticket, TicketId,
    TicketNonce, WIRE_VERSION,
};
pub use handshake::{
    ClusterSecret, HandshakeMsg, Initiator, Responder, HANDSHAKE_MAGIC, MAX_HANDSHAKE_MSG, NOISE_MSG_LEN,
    NOISE_PROTOCOL,
};
pub use keys::{Exporter, SessionKeys, TicketKey};
pub use kv::{RequestId, TenantId};
pub use node_id::{NodeIdentity, NodePublicKey, SigningPublicKey, NODE_KEY_LEN, SIGNATURE_LEN, SIGNING_KEY_LEN};
pub use node_key::NodeKey;
pub use pairing::{LayoutShape, PairingInfo, PairingMismatch, RefusalCode, Role};
pub use record::{RecordOpener, RecordSealer, AEAD_TAG_LEN};
pub use transfer::{Complete, Geometry, PageWrite, Received, Receiving, Transfer};

/// Fixtures shared by the unit tests: a 3-layer model, 4-slot pages, a 10-token prompt in a
/// 4-page reservation.
#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use std::collections::HashSet;
    use std::ops::Range;

    pub const GEOM: Geometry = Geometry { page_size: 4, n_layers: 3, row_bytes: 2 };

    pub fn prompt() -> Vec<u32> {
        (100..110).collect()
    }

    pub fn ticket() -> Ticket {
        Ticket {
            request: RequestId(7),
            tenant: TenantId(3),
            nonce: TicketNonce([1; 16]),
            pages: 4,
            tokens: 10,
            held: 0,
        }
    }

    pub fn other_ticket() -> Ticket {
        Ticket {
            request: RequestId(8),
            tenant: TenantId(4),
            nonce: TicketNonce([2; 16]),
            pages: 4,
            tokens: 10,
            held: 0,
        }
    }

    /// Both ends' view of one session, from a seed (the initiator is the KV sender).
    pub fn session(initiator: bool, seed: [u8; 32]) -> SessionKeys {
        let mut k2 = seed;
        k2[0] ^= 0xff;
        SessionKeys::from_split(initiator, &seed, &k2, b"test handshake hash")
    }

    /// A KV link: the prefill worker's sealer and the decode worker's opener of one session.
    pub fn link_with(seed: [u8; 32]) -> (KvSealer, KvOpener) {
        let s = KvSealer::new(session(true, seed), DEFAULT_MAX_FRAME).unwrap_or_else(|e| panic!("{e}"));
        let o = KvOpener::new(session(false, seed), DEFAULT_MAX_FRAME).unwrap_or_else(|e| panic!("{e}"));
        (s, o)
    }

    pub fn link() -> (KvSealer, KvOpener) {
        link_with([3; 32])
    }

    /// The receiver's tickets: both.
    pub fn tickets() -> HashSet<TicketNonce> {
        [ticket().nonce, other_ticket().nonce].into_iter().collect()
    }

    pub fn kv(t: &Ticket, seq: u32, page: u32, layers: Range<u32>, tokens: Range<u32>) -> Frame {
        let n = GEOM.payload_len(layers.end - layers.start, tokens.end - tokens.start).unwrap_or(0) as usize;
        let payload = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seq as u8)).collect();
        kv_with(t, seq, page, layers, tokens, payload)
    }

    pub fn kv_with(t: &Ticket, seq: u32, page: u32, layers: Range<u32>, tokens: Range<u32>, payload: Vec<u8>) -> Frame {
        Frame::kv(t.id(), seq, KvFrame { page_index: page, layers, tokens, payload })
    }

    pub fn close(t: &Ticket, seq: u32, prompt: &[u32]) -> Frame {
        let close =
            CloseFrame { tokens: prompt.len() as u32, prompt_digest: PromptDigest::of(prompt), first_token: 42 };
        Frame::close(t.id(), seq, close)
    }

    /// What an honest prefill worker sends: per page, layers 0..2 then 2..3, then the close.
    pub fn honest_frames(t: &Ticket) -> Vec<Frame> {
        let mut out = Vec::new();
        for page in 0..3u32 {
            let tokens = page * 4..(page * 4 + 4).min(10);
            for layers in [0..2, 2..3] {
                out.push(kv(t, out.len() as u32, page, layers, tokens.clone()));
            }
        }
        out.push(close(t, out.len() as u32, &prompt()));
        out
    }
}
