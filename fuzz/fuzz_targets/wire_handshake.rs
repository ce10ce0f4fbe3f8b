//! Handshake messages from a peer without the cluster secret. `Raw`: arbitrary bytes read as up
//! to four length-prefixed messages. `Messages`: messages of every kind with arbitrary fields,
//! encoded, some bytes flipped, parsed again; genuine hellos and replies among them, so flips
//! of real Noise messages are tried too.
//!
//! Properties: parsing never panics and a parsed message re-encodes to its own bytes; no
//! parsed message other than an untouched genuine one finishes a key exchange at the
//! responder or the initiator; a responder never pairs with its own role.
//!
//! Each execution draws its own cluster secret. Noise's first message can be replayed (the
//! replayer gets keys it cannot use: the handshake unit tests), so with one fixed secret a
//! genuine hello the fuzzer copied from an earlier execution would be taken, as a run of 170k
//! executions showed; under a fresh secret any hello from elsewhere is a forgery.
#![no_main]
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use wire::{
    ClusterSecret, HandshakeMsg, Initiator, LayoutShape, PairingInfo, RefusalCode, Responder, Role, NOISE_MSG_LEN,
};

thread_local! {
    static SECRET: Cell<[u8; 32]> = const { Cell::new([0; 32]) };
}

/// This execution's secret (see the module doc).
fn secret() -> ClusterSecret {
    ClusterSecret::from_bytes(SECRET.with(Cell::get))
}

/// A new secret for the next execution, from std's randomly keyed hasher.
fn new_secret() {
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    SECRET.with(|s| s.set(out));
}

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(Vec<u8>),
    Messages(Vec<(Msg, Vec<(u16, u8)>)>),
}

#[derive(Debug, Arbitrary)]
enum Msg {
    /// A genuine hello of this role, or arbitrary bytes as a hello.
    Hello(u8, Option<[u8; NOISE_MSG_LEN]>),
    /// A genuine reply to a genuine hello, or arbitrary bytes as a reply.
    Reply(Option<[u8; NOISE_MSG_LEN]>),
    Pairing {
        role: u8,
        info: ([u8; 32], u32, bool, [u32; 3]),
    },
    Refused(u8),
}

/// One node key for both ends, trusted by itself: the target drives the messages, not the
/// allow-list.
fn key() -> wire::NodeKey {
    wire::NodeKey::from_private([0x42; 32]).expect("node key")
}

fn trusts(k: &wire::NodePublicKey) -> bool {
    *k == key().public()
}

fn role(r: u8) -> Role {
    [Role::Gateway, Role::Prefill, Role::Decode][r as usize % 3]
}

impl Msg {
    fn build(&self) -> HandshakeMsg {
        match self {
            Msg::Hello(r, None) => Initiator::start(&secret(), &key(), role(*r)).expect("hello").1,
            Msg::Hello(_, Some(b)) => HandshakeMsg::Hello(*b),
            Msg::Reply(None) => {
                let (_, hello) = Initiator::start(&secret(), &key(), Role::Prefill).expect("hello");
                Responder::on_hello(&[secret()], &key(), Role::Decode, &hello, &trusts).expect("genuine hello").0
            }
            Msg::Reply(Some(b)) => HandshakeMsg::Reply(*b),
            Msg::Pairing { role: r, info: (digest, page_size, f32, l) } => HandshakeMsg::Pairing {
                role: role(*r),
                info: PairingInfo {
                    model_digest: *digest,
                    page_size: *page_size,
                    kv_dtype: if *f32 { kv::KvDtype::F32 } else { kv::KvDtype::F16 },
                    layout: LayoutShape { n_layers: l[0], n_kv_heads: l[1], head_dim: l[2] },
                },
            },
            Msg::Refused(c) => {
                use RefusalCode::*;
                let codes = [BadProof, Version, ModelDigest, PageSize, KvDtype, Layout, Reflection, Busy];
                HandshakeMsg::Refused(codes[*c as usize % codes.len()])
            }
        }
    }

    fn genuine(&self) -> bool {
        matches!(self, Msg::Hello(_, None) | Msg::Reply(None))
    }
}

fuzz_target!(|input: Input| {
    new_secret();
    match input {
        Input::Raw(data) => {
            let _ = HandshakeMsg::decode(&data);
            let mut rest = &data[..];
            let mut n = 0;
            while rest.len() >= 4 && n < 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let (m, tail) = rest.split_at(len.saturating_add(4).min(rest.len()));
                rest = tail;
                n += 1;
                if let Some(msg) = parse(m) {
                    drive(&msg, false);
                }
            }
        }
        Input::Messages(specs) => {
            for (spec, flips) in specs.iter().take(4) {
                let genuine = spec.build().encode();
                let mut bytes = genuine.clone();
                let n = bytes.len();
                for (at, x) in flips {
                    bytes[*at as usize % n] ^= x;
                }
                if let Some(msg) = parse(&bytes) {
                    drive(&msg, spec.genuine() && bytes == genuine);
                }
            }
        }
    }
});

fn parse(bytes: &[u8]) -> Option<HandshakeMsg> {
    let msg = HandshakeMsg::decode(bytes).ok()?;
    assert_eq!(msg.encode(), bytes, "parsing is not canonical");
    Some(msg)
}

/// Offers `msg` to a responder of every role and to a fresh initiator.
fn drive(msg: &HandshakeMsg, genuine: bool) {
    for me in [Role::Gateway, Role::Prefill, Role::Decode] {
        match Responder::on_hello(&[secret()], &key(), me, msg, &trusts) {
            Ok((_, _, peer, _)) => {
                assert!(genuine, "the responder took a forged hello");
                assert_ne!(peer, me, "the responder paired with its own role");
            }
            Err(_) => {}
        }
    }
    let (init, _) = Initiator::start(&secret(), &key(), Role::Prefill).expect("hello");
    // A fresh initiator's ephemeral is new: no reply, genuine or not, was made for it.
    assert!(init.on_reply(msg, &trusts).is_err(), "the initiator took a reply made for another hello");
}
