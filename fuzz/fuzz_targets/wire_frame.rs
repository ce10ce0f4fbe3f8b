//! KV frames at a decode worker holding two tickets. `Raw`: arbitrary bytes as from any peer;
//! without the key only the checks before the MAC are reachable. `Authenticated`: frames with
//! arbitrary fields (kinds, flags, ids, sequence numbers, ranges, payload lengths), laid out by
//! hand and MAC'd with the ticket key, as a sender holding the key could (a compromised
//! prefill worker), so the authenticated parser and the transfer checks see them all.
//!
//! Properties: nothing panics; the borrowed decode agrees with the owned one; a decoded frame
//! re-encodes to its own bytes; every write the transfer accepts stays inside the reservation
//! and writes fresh slots; the transfer completes only with every reserved slot written.
#![no_main]
use std::collections::HashSet;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use wire::{
    Codec, Frame, FrameRef, Geometry, PromptDigest, Received, RequestId, TenantId, Ticket, TicketKey, TicketNonce,
    Transfer, FRAME_MAGIC, WIRE_VERSION,
};

/// 3 layers, 4-slot pages, 2-byte rows; a 10-token prompt in 4 reserved pages.
const GEOM: Geometry = Geometry { page_size: 4, n_layers: 3, row_bytes: 2 };
const KEY: [u8; 32] = [9; 32];
const OTHER_KEY: [u8; 32] = [8; 32];

fn ticket() -> Ticket {
    Ticket { request: RequestId(7), tenant: TenantId(3), nonce: TicketNonce([1; 16]), pages: 4, tokens: 10 }
}

fn other_ticket() -> Ticket {
    Ticket { request: RequestId(8), tenant: TenantId(4), nonce: TicketNonce([2; 16]), pages: 4, tokens: 10 }
}

fn prompt() -> Vec<u32> {
    (100..110).collect()
}

fn key_bytes(nonce: &[u8]) -> Option<[u8; 32]> {
    if nonce == ticket().nonce.0 {
        Some(KEY)
    } else if nonce == other_ticket().nonce.0 {
        Some(OTHER_KEY)
    } else {
        None
    }
}

fn keys(nonce: &TicketNonce) -> Option<TicketKey> {
    key_bytes(&nonce.0).map(TicketKey::from_bytes)
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
    /// Overrides the KV payload length field.
    payload_len_field: Option<u32>,
}

fuzz_target!(|input: Input| {
    let codec = Codec::default();
    match input {
        Input::Raw(bytes) => {
            if let Some(frame) = decode_checked(&codec, &bytes) {
                feed(&[frame]);
            }
        }
        Input::Authenticated(specs) => {
            let frames: Vec<Frame> = specs
                .iter()
                .take(32)
                .enumerate()
                .filter_map(|(i, spec)| decode_checked(&codec, &authentic_bytes(spec, i as u32)))
                .collect();
            feed(&frames);
        }
    }
});

/// The frame `spec` describes, laid out by hand (so it may be malformed) and MAC'd with the
/// key of the nonce it names (ours for an unknown nonce).
fn authentic_bytes(spec: &Spec, index: u32) -> Vec<u8> {
    let (nonce, request, tenant) = match spec.who {
        Who::Ours => (ticket().nonce.0, ticket().request.0, ticket().tenant.0),
        Who::Other => (other_ticket().nonce.0, other_ticket().request.0, other_ticket().tenant.0),
        Who::OursRelabelled(r, t) => (ticket().nonce.0, r, t),
        Who::Unknown(n) => (n, 0, 0),
    };
    let mut b = vec![0u8; 4];
    b.extend_from_slice(&FRAME_MAGIC);
    b.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    let (kind, body) = match &spec.body {
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
            let mut body = Vec::new();
            for v in fields.into_iter().chain([spec.payload_len_field.unwrap_or(payload.len() as u32)]) {
                body.extend_from_slice(&v.to_le_bytes());
            }
            body.extend_from_slice(&payload);
            (1u8, body)
        }
        Body::Close { tokens, other_prompt, first_token } => {
            let digest = PromptDigest::of(other_prompt.as_deref().unwrap_or(&prompt()));
            let mut body = tokens.unwrap_or(10).to_le_bytes().to_vec();
            body.extend_from_slice(&digest.0);
            body.extend_from_slice(&first_token.to_le_bytes());
            (2u8, body)
        }
        Body::Bytes { kind, body } => (*kind, body.clone()),
    };
    b.push(kind);
    b.push(spec.flags.unwrap_or(0));
    b.extend_from_slice(&nonce);
    b.extend_from_slice(&request.to_le_bytes());
    b.extend_from_slice(&tenant.to_le_bytes());
    b.extend_from_slice(&spec.seq.unwrap_or(index).to_le_bytes());
    b.extend_from_slice(&body);
    let len = (b.len() + 32 - 4) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    let tag = blake3::keyed_hash(&key_bytes(&nonce).unwrap_or(KEY), &b);
    b.extend_from_slice(tag.as_bytes());
    b
}

/// Decodes both ways; they must agree, and a decoded frame must re-encode to its own bytes.
fn decode_checked(codec: &Codec, bytes: &[u8]) -> Option<Frame> {
    let owned = codec.decode(bytes, &keys);
    assert_eq!(owned, codec.decode_borrowed(bytes, &keys).map(FrameRef::into_owned));
    let frame = owned.ok()?;
    let key = keys(&frame.ticket.nonce).expect("decoded frames have a known ticket");
    assert_eq!(codec.encode(&frame, &key).as_deref(), Ok(bytes), "decoding is not canonical");
    Some(frame)
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
