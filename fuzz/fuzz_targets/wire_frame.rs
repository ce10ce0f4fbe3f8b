//! KV frames at a decode worker holding two tickets, on one KV link. `Raw`: arbitrary bytes
//! as from anyone on the network; without the link's keys nothing opens, and only the length
//! checks are reachable. `Authenticated`: frames with arbitrary header fields (kinds, flags,
//! ids, sequence numbers, ranges, body lengths), laid out by hand and sealed with the link's
//! keys (`KvSealer::seal_raw`), as a sender holding them could (a compromised prefill
//! worker), so the authenticated parser and the transfer checks see them all.
//!
//! Properties: nothing panics; a frame that opens has exactly the fields that were sealed;
//! every write the transfer accepts stays inside the reservation and writes fresh slots; the
//! transfer completes only with every reserved slot written.
#![no_main]
use std::collections::HashSet;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use wire::{
    Frame, FrameRef, Geometry, KvOpener, KvSealer, PromptDigest, Received, RequestId, SessionKeys, TenantId, Ticket,
    TicketNonce, Transfer, DEFAULT_MAX_FRAME, FRAME_MAGIC, HEADER_PLAIN_LEN, WIRE_VERSION,
};

/// 3 layers, 4-slot pages, 2-byte rows; a 10-token prompt in 4 reserved pages.
const GEOM: Geometry = Geometry { page_size: 4, n_layers: 3, row_bytes: 2 };
fn ticket() -> Ticket {
    Ticket { request: RequestId(7), tenant: TenantId(3), nonce: TicketNonce([1; 16]), pages: 4, tokens: 10, held: 0 }
}

fn other_ticket() -> Ticket {
    Ticket { request: RequestId(8), tenant: TenantId(4), nonce: TicketNonce([2; 16]), pages: 4, tokens: 10, held: 0 }
}

fn prompt() -> Vec<u32> {
    (100..110).collect()
}

fn session(initiator: bool) -> SessionKeys {
    SessionKeys::from_split(initiator, &[9; 32], &[8; 32], b"fuzz")
}

fn held(nonce: &TicketNonce) -> bool {
    *nonce == ticket().nonce || *nonce == other_ticket().nonce
}

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(Vec<u8>),
    Authenticated(Vec<Spec>),
}

#[derive(Debug, Arbitrary)]
enum Who {
    Ours,
    Other,
    /// Our nonce with another request or tenant.
    OursRelabelled(u64, u64),
    Unknown([u8; 16]),
}

#[derive(Debug, Arbitrary)]
enum Body {
    /// Small page, layer and token numbers (the fixture's scale), or any u32 when `big`.
    Kv {
        page: u8,
        layers: (u8, u8),
        tokens: (u8, u8),
        big: Option<[u32; 5]>,
        payload: Payload,
    },
    Close {
        tokens: Option<u32>,
        other_prompt: Option<Vec<u32>>,
        first_token: u32,
    },
    /// Any kind byte and body bytes.
    Bytes {
        kind: u8,
        body: Vec<u8>,
    },
}

#[derive(Debug, Arbitrary)]
enum Payload {
    /// The size the receiver expects for the ranges, filled with this byte.
    Exact(u8),
    /// Any bytes.
    Given(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
struct Spec {
    who: Who,
    /// None: the next sequence number of the stream.
    seq: Option<u32>,
    flags: Option<u8>,
    body: Body,
    /// Overrides the body length field.
    payload_len_field: Option<u32>,
}

fuzz_target!(|input: Input| {
    let mut opener = KvOpener::new(session(false), DEFAULT_MAX_FRAME).expect("opener");
    match input {
        Input::Raw(mut bytes) => {
            // Nobody without the link's keys gets a frame opened.
            assert!(opener.open(&mut bytes, &held).is_err(), "raw bytes opened");
        }
        Input::Authenticated(specs) => {
            let mut sealer = KvSealer::new(session(true), DEFAULT_MAX_FRAME).expect("sealer");
            let mut frames = Vec::new();
            for (i, spec) in specs.iter().take(32).enumerate() {
                let (plain, mut body) = lay_out(spec, i as u32);
                let Ok(mut bytes) = sealer.seal_raw(&plain, &mut body.clone()) else { return };
                match opener.open(&mut bytes, &held) {
                    Ok(frame) => {
                        check_fields(&frame, &plain, &mut body);
                        frames.push(frame.into_owned());
                    }
                    // A refused frame ends the link, as the decode worker drops it.
                    Err(_) => break,
                }
            }
            feed(&frames);
        }
    }
});

/// The header in clear and the body `spec` describes, laid out by hand (so it may be
/// malformed).
fn lay_out(spec: &Spec, index: u32) -> ([u8; HEADER_PLAIN_LEN], Vec<u8>) {
    let (nonce, request, tenant) = match spec.who {
        Who::Ours => (ticket().nonce.0, ticket().request.0, ticket().tenant.0),
        Who::Other => (other_ticket().nonce.0, other_ticket().request.0, other_ticket().tenant.0),
        Who::OursRelabelled(r, t) => (ticket().nonce.0, r, t),
        Who::Unknown(n) => (n, 0, 0),
    };
    let (kind, fields, body) = match &spec.body {
        Body::Kv { page, layers, tokens, big, payload } => {
            let mut fields = [*page as u32, layers.0 as u32, layers.1 as u32, tokens.0 as u32, tokens.1 as u32];
            if let Some(big) = big {
                fields = *big;
            }
            let payload = match payload {
                Payload::Exact(fill) => {
                    let n = GEOM
                        .payload_len(fields[2].saturating_sub(fields[1]), fields[4].saturating_sub(fields[3]))
                        .unwrap_or(0)
                        .min(4096);
                    vec![*fill; n as usize]
                }
                Payload::Given(p) => p.clone(),
            };
            (1u8, fields, payload)
        }
        Body::Close { tokens, other_prompt, first_token } => {
            let digest = PromptDigest::of(other_prompt.as_deref().unwrap_or(&prompt()));
            let mut body = tokens.unwrap_or(10).to_le_bytes().to_vec();
            body.extend_from_slice(&digest.0);
            body.extend_from_slice(&first_token.to_le_bytes());
            (2u8, [0; 5], body)
        }
        Body::Bytes { kind, body } => (*kind, [0; 5], body.clone()),
    };
    let mut h = Vec::with_capacity(HEADER_PLAIN_LEN);
    h.extend_from_slice(&FRAME_MAGIC);
    h.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    h.push(kind);
    h.push(spec.flags.unwrap_or(0));
    h.extend_from_slice(&nonce);
    h.extend_from_slice(&request.to_le_bytes());
    h.extend_from_slice(&tenant.to_le_bytes());
    h.extend_from_slice(&spec.seq.unwrap_or(index).to_le_bytes());
    for v in fields {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(&spec.payload_len_field.unwrap_or(body.len() as u32).to_le_bytes());
    let mut plain = [0u8; HEADER_PLAIN_LEN];
    plain.copy_from_slice(&h);
    (plain, body)
}

/// A frame that opened says exactly what was sealed.
fn check_fields(frame: &FrameRef<'_>, plain: &[u8; HEADER_PLAIN_LEN], body: &mut [u8]) {
    let word = |at: usize| u32::from_le_bytes([plain[at], plain[at + 1], plain[at + 2], plain[at + 3]]);
    assert_eq!(frame.ticket.nonce.0[..], plain[8..24]);
    assert_eq!(frame.seq, word(40));
    match &frame.body {
        wire::FrameBodyRef::Kv(kv) => {
            assert_eq!(plain[6], 1);
            assert_eq!(
                (kv.page_index, kv.layers.clone(), kv.tokens.clone()),
                (word(44), word(48)..word(52), word(56)..word(60))
            );
            assert_eq!(kv.payload, &body[..]);
        }
        wire::FrameBodyRef::Close(c) => {
            assert_eq!(plain[6], 2);
            assert_eq!(c.tokens.to_le_bytes()[..], body[..4]);
        }
    }
}

/// Feeds frames to a transfer for `ticket()`, skipping those it refuses (as if dropped), and
/// checks every accepted write and the completion.
fn feed(frames: &[Frame]) {
    let mut transfer = Transfer::new(ticket(), GEOM, &prompt()).expect("fixture reservation");
    let mut seen = HashSet::new();
    for frame in frames {
        match transfer.receive_ref(&frame.borrowed()) {
            Ok(Received::Written(next, w)) => {
                assert!(w.page_index < 4 && w.slots.end <= 4 && w.layers.end <= 3);
                for layer in w.layers.clone() {
                    for slot in w.slots.clone() {
                        let token = w.page_index * 4 + slot;
                        assert!(token < 10, "write beyond the admitted prompt");
                        assert!(seen.insert((layer, token)), "slot written twice");
                    }
                }
                let expected = GEOM.payload_len(w.layers.len() as u32, w.slots.len() as u32);
                assert_eq!(Some(w.payload.len() as u64), expected);
                transfer = next;
            }
            Ok(Received::Complete(done)) => {
                assert_eq!(seen.len(), 30, "completed with unwritten slots");
                assert!(done.reject(frame) == wire::WireError::AfterClose);
                return;
            }
            // A refused frame consumes the transfer: start again, as the next request would.
            Err(_) => {
                transfer = Transfer::new(ticket(), GEOM, &prompt()).expect("fixture reservation");
                seen.clear();
            }
        }
    }
}
