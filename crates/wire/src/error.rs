//! The one error type of the crate. Every rejection is a value naming what was wrong; none
//! carries payload bytes or token ids (invariant 10: log ids, never prompt text).

use crate::node_id::NodePublicKey;
use crate::pairing::{PairingMismatch, RefusalCode, Role};
use thiserror::Error;

/// Why a frame, a transfer or a handshake was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    // ---- codec: framing ----
    #[error("truncated input: needed {needed} bytes, had {had}")]
    Truncated { needed: usize, had: usize },
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    Oversized { len: usize, max: usize },
    #[error("{extra} bytes follow the frame")]
    TrailingBytes { extra: usize },
    #[error("bad magic (not a pagewarden frame)")]
    BadMagic,
    #[error("unsupported wire version {got} (this build speaks {supported})")]
    BadVersion { got: u16, supported: u16 },
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    #[error("authentication failed (tampered, replayed, reordered or foreign bytes)")]
    BadMac,
    #[error("frame names a ticket unknown to this node")]
    UnknownTicket,
    #[error("bad {what} range {start}..{end}")]
    BadRange { what: &'static str, start: u32, end: u32 },

    // ---- transfer: checks against the receiver's reservation ----
    #[error("receiver reservation cannot hold the transfer: {0}")]
    Reservation(&'static str),
    #[error("frame belongs to another ticket")]
    WrongTicket,
    #[error("frame out of order: expected sequence {expected}, got {got}")]
    OutOfOrder { expected: u32, got: u32 },
    #[error("page index {page} outside the {pages} reserved pages")]
    PageOutOfRange { page: u32, pages: u32 },
    #[error("layer range ends at {end}, model has {layers} layers")]
    LayerOutOfRange { end: u32, layers: u32 },
    #[error("token range ends at {end}, admitted prompt has {tokens} tokens")]
    TokenOutOfRange { end: u32, tokens: u32 },
    #[error("tokens {start}..{end} are not inside page {page}")]
    TokensOutsidePage { page: u32, start: u32, end: u32 },
    #[error("payload of {got} bytes, expected {expected}")]
    PayloadLength { expected: u64, got: u64 },
    #[error("frame repeats slots already written (page {page})")]
    Duplicate { page: u32 },
    #[error("frame overlaps slots already written (layer {layer}, token {token})")]
    Overlap { layer: u32, token: u32 },
    #[error("closing frame claims {got} tokens, admitted prompt has {expected}")]
    TokenCount { expected: u32, got: u32 },
    #[error("prompt digest does not match the admitted prompt")]
    PromptDigest,
    #[error("transfer closed with {missing} reserved (layer, token) slots not written")]
    Incomplete { missing: u64 },
    #[error("frame received after the transfer was closed")]
    AfterClose,

    // ---- handshake ----
    #[error("the key exchange failed: the peer does not hold an accepted cluster secret")]
    BadProof,
    #[error("the peer claims our own role ({role:?}): a reflected handshake or a misconfigured node")]
    Reflection { role: Role },
    #[error("cryptographic operation failed: {0}")]
    Crypto(&'static str),
    #[error("refusing to pair: {0}")]
    Pairing(PairingMismatch),
    #[error("the peer refused us: {}", .0.reason())]
    Refused(RefusalCode),
    #[error("the peer's node key {} is not trusted (not in cluster.trusted_nodes)", .0.fingerprint())]
    UntrustedNode(NodePublicKey),
}

impl WireError {
    /// Short stable label, for `pagewarden_isolation_violations_total{kind}`.
    pub fn kind(&self) -> &'static str {
        use WireError::*;
        match self {
            Truncated { .. } => "truncated",
            Oversized { .. } => "oversized",
            TrailingBytes { .. } => "trailing_bytes",
            BadMagic => "bad_magic",
            BadVersion { .. } => "bad_version",
            Malformed(_) => "malformed",
            BadMac => "bad_mac",
            UnknownTicket => "unknown_ticket",
            BadRange { .. } => "bad_range",
            Reservation(_) => "reservation",
            WrongTicket => "wrong_ticket",
            OutOfOrder { .. } => "out_of_order",
            PageOutOfRange { .. } => "page_out_of_range",
            LayerOutOfRange { .. } => "layer_out_of_range",
            TokenOutOfRange { .. } => "token_out_of_range",
            TokensOutsidePage { .. } => "tokens_outside_page",
            PayloadLength { .. } => "payload_length",
            Duplicate { .. } => "duplicate",
            Overlap { .. } => "overlap",
            TokenCount { .. } => "token_count",
            PromptDigest => "prompt_digest",
            Incomplete { .. } => "incomplete",
            AfterClose => "after_close",
            BadProof => "bad_proof",
            Reflection { .. } => "reflection",
            Crypto(_) => "crypto",
            Pairing(_) => "pairing",
            Refused(_) => "refused",
            UntrustedNode(_) => "untrusted_node",
        }
    }
}
