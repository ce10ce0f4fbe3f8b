//! What both ends of `bench transfer` agree on: the KV geometry, the modes, the plan of a run
//! (ticket and prompt), the `mac` mode's frame layout (wire version 1), the handshake's framing
//! and the receiver's reply.

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use kv::{KvDtype, KvLayout, RequestId, TenantId};
use serde::{Deserialize, Serialize};
use wire::{CloseFrame, Geometry, HandshakeMsg, PromptDigest, Ticket, TicketNonce, MAX_HANDSHAKE_MSG};

use crate::ToolError;

/// The default model's KV geometry (SmolLM2-135M: 30 layers, 3 KV heads of 64, f16), 16-token
/// pages: one frame per page carries 30 x 16 x 2 x 3 x 64 x 2 = 368,640 payload bytes.
pub(super) const LAYOUT: KvLayout =
    KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: KvDtype::F16 };

/// Distinct source payloads the sender cycles through (about 23 MiB), so it does not send
/// one page that sits in its cache the whole time.
pub(super) const SOURCES: usize = 64;

/// The `mac` mode's key, known to both ends (a bench need not keep it secret).
pub(super) const BENCH_MAC_KEY: [u8; 32] = [0x5a; 32];
/// The `encrypted` mode's cluster secret; each run's link keys come from a real handshake.
pub(super) const BENCH_SECRET: [u8; 32] = [0xa5; 32];

/// The node key both ends of the benchmark use (one key, trusted by itself): the benchmark
/// measures the handshake and the transfer, not key management.
pub(super) fn bench_node_key() -> Result<wire::NodeKey, wire::WireError> {
    wire::NodeKey::from_private([0x5a; 32])
}

/// Trusts only the benchmark's own node key.
pub(super) fn bench_trusts(k: &wire::NodePublicKey) -> bool {
    bench_node_key().is_ok_and(|b| b.public() == *k)
}

/// `mac` mode frames: len u32, kind u32, seq u32, page u32, token start u32, token end u32,
/// the body, then a 32-byte keyed BLAKE3 over everything before it (version 1's layout, in
/// short: the cost is the MAC's pass over the payload).
pub(super) const MAC_HEAD: usize = 24;
pub(super) const MAC_TAG: usize = 32;
pub(super) const CLOSE_BODY: usize = 40;

/// Bound on every wait on the peer: a dead or stuck process ends the bench, never hangs it.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Mode {
    Raw,
    Framed,
    Mac,
    Encrypted,
}

pub(super) const MODES: [Mode; 4] = [Mode::Raw, Mode::Framed, Mode::Mac, Mode::Encrypted];

impl Mode {
    pub(super) fn code(self) -> u8 {
        self as u8
    }

    pub(super) fn from_code(c: u8) -> Result<Self, ToolError> {
        MODES.into_iter().find(|m| m.code() == c).ok_or_else(|| ToolError::Transfer(format!("unknown mode {c}")))
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Mode::Raw => "raw TCP",
            Mode::Framed => "framed, unprotected",
            Mode::Mac => "MAC only (wire v1)",
            Mode::Encrypted => "encrypted (wire v3)",
        }
    }

    pub(super) fn parse(s: &str) -> Result<Self, ToolError> {
        MODES
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| ToolError::Usage(format!("unknown mode {s:?} (raw, framed, mac, encrypted)")))
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::Framed => "framed",
            Mode::Mac => "mac",
            Mode::Encrypted => "encrypted",
        }
    }

    pub(super) fn verifies(self) -> bool {
        matches!(self, Mode::Mac | Mode::Encrypted)
    }
}

/// The receiver's answer to one run.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Reply {
    pub(super) ok: bool,
    /// Frames read (framed), or opened and accepted by the transfer, close included.
    pub(super) frames: u64,
    pub(super) payload_bytes: u64,
    /// CPU time of the receiving thread during the run, where the OS tells it.
    pub(super) cpu_ns: Option<u64>,
    pub(super) error: Option<String>,
}

pub(super) fn geometry() -> Result<Geometry, ToolError> {
    Ok(Geometry::from_layout(&LAYOUT)?)
}

pub(super) fn payload_len(g: &Geometry) -> Result<usize, ToolError> {
    let n = g.payload_len(g.n_layers, g.page_size).and_then(|n| usize::try_from(n).ok());
    n.ok_or_else(|| ToolError::Transfer("page payload size".into()))
}

/// What both ends know of run `run`: one ticket per run (a fresh nonce, as a decode worker
/// issues), one reserved page per frame, and the admitted prompt filling them.
pub(super) struct Plan {
    pub(super) ticket: Ticket,
    pub(super) prompt: Vec<u32>,
}

pub(super) fn plan(frames: u32, run: u64, g: &Geometry) -> Result<Plan, ToolError> {
    let tokens =
        frames.checked_mul(g.page_size).ok_or_else(|| ToolError::Usage("prompt too long for one ticket".into()))?;
    let mut nonce = [0u8; 16];
    nonce[..8].copy_from_slice(&run.to_le_bytes());
    nonce[8..].copy_from_slice(b"benchxfr");
    let ticket = Ticket {
        request: RequestId(run),
        tenant: TenantId(1),
        nonce: TicketNonce(nonce),
        pages: frames,
        tokens,
        held: 0,
    };
    let prompt = (0..tokens).map(|i| i.wrapping_mul(7919) % 49_152).collect();
    Ok(Plan { ticket, prompt })
}

pub(super) fn close_of(p: &Plan) -> CloseFrame {
    CloseFrame { tokens: p.ticket.tokens, prompt_digest: PromptDigest::of(&p.prompt), first_token: 1 }
}

/// CPU time of the calling thread so far, in ns, where Linux's schedstat is available.
pub(super) fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

pub(super) fn configure(stream: TcpStream) -> Result<TcpStream, ToolError> {
    // The header and the reply are small messages each waited on: send them at once.
    stream.set_nodelay(true).map_err(ToolError::Link)?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(ToolError::Link)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(ToolError::Link)?;
    Ok(stream)
}

pub(super) fn mac_head(kind: u32, seq: u32, page: u32, tokens: std::ops::Range<u32>, body: usize) -> [u8; MAC_HEAD] {
    let mut h = [0u8; MAC_HEAD];
    let len = (MAC_HEAD - 4 + body + MAC_TAG) as u32;
    for (i, v) in [len, kind, seq, page, tokens.start, tokens.end].into_iter().enumerate() {
        h[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    h
}

pub(super) fn mac_of(head: &[u8], body: &[u8]) -> [u8; MAC_TAG] {
    let mut h = blake3::Hasher::new_keyed(&BENCH_MAC_KEY);
    h.update(head);
    h.update(body);
    *h.finalize().as_bytes()
}

pub(super) fn close_body(c: &CloseFrame) -> [u8; CLOSE_BODY] {
    let mut b = [0u8; CLOSE_BODY];
    b[..4].copy_from_slice(&c.tokens.to_le_bytes());
    b[4..36].copy_from_slice(&c.prompt_digest.0);
    b[36..].copy_from_slice(&c.first_token.to_le_bytes());
    b
}

pub(super) fn read_handshake(r: &mut impl Read) -> Result<HandshakeMsg, ToolError> {
    let mut buf = [0u8; MAX_HANDSHAKE_MSG];
    r.read_exact(&mut buf[..4]).map_err(ToolError::Link)?;
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let all = buf.get_mut(..4 + len).ok_or_else(|| ToolError::Transfer("handshake message too long".into()))?;
    r.read_exact(&mut all[4..]).map_err(ToolError::Link)?;
    Ok(HandshakeMsg::decode(all)?)
}
