//! The wire protocol of pagewarden: what crosses between the gateway, prefill workers and
//! decode workers. A pure library (no sockets): frames, their codec and MACs, the decode
//! worker's transfer checks, and the node handshake. The format is in `docs/wire.md`.
//!
//! Why it exists: in a disaggregated deployment, the KV cache of a prompt is computed on one
//! node and used on another. A transfer that is short, foreign, forged or for another prompt
//! must never be taken as complete, or the decode worker attends over pages that still hold
//! another tenant's KV (the 2026 incident in `DESIGN.md`).
//!
//! What it enforces:
//!
//! * **Bound and verified transfer (invariant 5).** Every frame names its ticket (request,
//!   tenant, generation nonce) and carries a keyed BLAKE3 MAC under a per-ticket
//!   [`TicketKey`] that never travels in frames; [`decode`] checks it in constant time before
//!   reading any other field, and checks every length against what remains ([`Codec`]).
//! * **Coverage against the receiver's reservation (invariants 4 and 5).** A
//!   [`Transfer<Receiving>`] is built from the decode worker's own ticket, geometry and the
//!   admitted prompt; it refuses duplicates, overlaps, reordering, out-of-range pages, layers
//!   and tokens, and becomes [`Transfer<Complete>`] only when the closing frame's token count
//!   and [`PromptDigest`] match the admitted prompt and every (layer, prompt token) slot was
//!   written exactly once. Any error consumes the transfer: fail closed.
//! * **Frames for unknown or closed tickets are dropped (invariant 6)**:
//!   [`WireError::UnknownTicket`], [`WireError::AfterClose`].
//! * **Authenticated, paired nodes (invariants 2 and 11).** [`Initiator`] / [`Responder`]
//!   prove knowledge of the [`ClusterSecret`] over fresh nonces from both sides;
//!   [`PairingInfo::check`] refuses peers whose model, page size, KV dtype or layout differ.
//!
//! Every rejection is a typed [`WireError`] whose [`WireError::kind`] labels the
//! `pagewarden_isolation_violations_total{kind}` counter.

mod codec;
mod error;
mod frame;
mod handshake;
mod mac;
mod transfer;

pub use codec::{decode, encode, Codec, EncodedFrame, KeyLookup, DEFAULT_MAX_FRAME, FRAME_MAGIC, HEADER_LEN};
pub use error::WireError;
pub use frame::{
    CloseFrame, Frame, FrameBody, FrameBodyRef, FrameRef, KvFrame, KvFrameRef, Ticket, TicketId, TicketNonce,
    WIRE_VERSION,
};
pub use handshake::{
    ClusterSecret, HandshakeMsg, Initiator, LayoutShape, PairingInfo, PairingMismatch, RefusalCode, Responder, Role,
    SessionKey, HANDSHAKE_MAGIC, MAX_HANDSHAKE_MSG,
};
pub use kv::{RequestId, TenantId};
pub use mac::{PromptDigest, TicketKey, TAG_LEN};
pub use transfer::{Complete, Geometry, PageWrite, Received, Receiving, Transfer};

/// Fixtures shared by the unit tests: a 3-layer model, 4-slot pages, a 10-token prompt in a
/// 4-page reservation.
#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use std::collections::HashMap;
    use std::ops::Range;

    pub const GEOM: Geometry = Geometry { page_size: 4, n_layers: 3, row_bytes: 2 };

    pub fn prompt() -> Vec<u32> {
        (100..110).collect()
    }

    pub fn ticket() -> Ticket {
        Ticket { request: RequestId(7), tenant: TenantId(3), nonce: TicketNonce([1; 16]), pages: 4, tokens: 10 }
    }

    pub fn other_ticket() -> Ticket {
        Ticket { request: RequestId(8), tenant: TenantId(4), nonce: TicketNonce([2; 16]), pages: 4, tokens: 10 }
    }

    pub fn key_of(t: &Ticket) -> TicketKey {
        TicketKey::derive(&[9; 32], t)
    }

    /// The receiver's key table: both tickets.
    pub fn keys() -> HashMap<TicketNonce, TicketKey> {
        [ticket(), other_ticket()].iter().map(|t| (t.nonce, key_of(t))).collect()
    }

    pub fn kv(t: &Ticket, seq: u32, page: u32, layers: Range<u32>, tokens: Range<u32>) -> Frame {
        let n = GEOM.payload_len(layers.end - layers.start, tokens.end - tokens.start).unwrap_or(0) as usize;
        let payload = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seq as u8)).collect();
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
