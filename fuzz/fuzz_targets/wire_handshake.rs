//! Handshake messages from a peer without the cluster secret. `Raw`: arbitrary bytes read as
//! up to four length-prefixed messages. `Messages`: messages of every kind with arbitrary
//! fields, encoded, some bytes flipped, parsed again.
//!
//! Properties: parsing never panics and a parsed message re-encodes to its own bytes; parsed
//! messages drive the responder, the initiator and the pairing check without a panic, and
//! none of them authenticates.
#![no_main]
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use wire::{ClusterSecret, HandshakeMsg, Initiator, LayoutShape, PairingInfo, RefusalCode, Responder, Role};

const NI: [u8; 32] = [1; 32];
const NR: [u8; 32] = [2; 32];

fn secret() -> ClusterSecret {
    ClusterSecret::from_bytes([5; 32])
}

fn info() -> PairingInfo {
    let layout = LayoutShape { n_layers: 30, n_kv_heads: 3, head_dim: 64 };
    PairingInfo { model_digest: [3; 32], page_size: 16, kv_dtype: kv::KvDtype::F16, layout }
}

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(Vec<u8>),
    Messages(Vec<(Msg, Vec<(u16, u8)>)>),
}

#[derive(Debug, Arbitrary)]
enum Msg {
    Hello {
        role: u8,
        nonce: Option<[u8; 32]>,
    },
    Challenge {
        role: u8,
        nonce: Option<[u8; 32]>,
        proof: [u8; 32],
    },
    Proof {
        proof: [u8; 32],
    },
    /// Our pairing info, or arbitrary fields.
    Pairing {
        role: u8,
        info: Option<([u8; 32], u32, bool, [u32; 3])>,
        mac: [u8; 32],
    },
    Refused(u8),
}

fn role(r: u8) -> Role {
    [Role::Gateway, Role::Prefill, Role::Decode][r as usize % 3]
}

impl Msg {
    /// The message; an absent nonce echoes one of the handshake's own, to try reflections.
    fn build(&self) -> HandshakeMsg {
        let echo = |n: &Option<[u8; 32]>, r: u8| n.unwrap_or(if r % 2 == 0 { NI } else { NR });
        match self {
            Msg::Hello { role: r, nonce } => HandshakeMsg::Hello { role: role(*r), nonce: echo(nonce, *r) },
            Msg::Challenge { role: r, nonce, proof } => {
                HandshakeMsg::Challenge { role: role(*r), nonce: echo(nonce, *r), proof: *proof }
            }
            Msg::Proof { proof } => HandshakeMsg::Proof { proof: *proof },
            Msg::Pairing { role: r, info: fields, mac } => {
                let info = match fields {
                    None => info(),
                    Some((digest, page_size, f32, l)) => PairingInfo {
                        model_digest: *digest,
                        page_size: *page_size,
                        kv_dtype: if *f32 { kv::KvDtype::F32 } else { kv::KvDtype::F16 },
                        layout: LayoutShape { n_layers: l[0], n_kv_heads: l[1], head_dim: l[2] },
                    },
                };
                HandshakeMsg::Pairing { role: role(*r), info, mac: *mac }
            }
            Msg::Refused(c) => {
                use RefusalCode::*;
                HandshakeMsg::Refused([BadProof, Version, ModelDigest, PageSize, KvDtype, Layout][*c as usize % 6])
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let mut msgs = Vec::new();
    match input {
        Input::Raw(data) => {
            let _ = HandshakeMsg::decode(&data);
            let mut rest = &data[..];
            while rest.len() >= 4 && msgs.len() < 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let (m, tail) = rest.split_at(len.saturating_add(4).min(rest.len()));
                rest = tail;
                if let Some(msg) = parse(m) {
                    msgs.push(msg);
                }
            }
        }
        Input::Messages(specs) => {
            for (spec, flips) in specs.iter().take(4) {
                let mut bytes = spec.build().encode();
                let n = bytes.len();
                for (at, x) in flips {
                    bytes[*at as usize % n] ^= x;
                }
                if let Some(msg) = parse(&bytes) {
                    msgs.push(msg);
                }
            }
        }
    }
    drive(&msgs);
});

fn parse(bytes: &[u8]) -> Option<HandshakeMsg> {
    let msg = HandshakeMsg::decode(bytes).ok()?;
    assert_eq!(msg.encode(), bytes, "parsing is not canonical");
    Some(msg)
}

fn drive(msgs: &[HandshakeMsg]) {
    // A genuine session between two holders of the secret, to attack its later steps.
    let (_, hello) = Initiator::start(secret(), Role::Prefill, NI);
    let (genuine_resp, challenge) = Responder::on_hello(secret(), Role::Decode, NR, &hello).expect("genuine hello");
    let (_, session, _) = Initiator::start(secret(), Role::Prefill, NI).0.on_challenge(&challenge).expect("genuine");
    let mut genuine_resp = Some(genuine_resp);
    for (i, msg) in msgs.iter().enumerate() {
        let (init, _) = Initiator::start(secret(), Role::Prefill, NI);
        assert!(init.on_challenge(msg).is_err(), "initiator accepted a forged challenge");
        for peer in [Role::Gateway, Role::Prefill, Role::Decode] {
            assert!(info().open_and_check(msg, peer, &session).is_err(), "forged pairing accepted");
        }
        // The responder answers any fresh hello, then must refuse whatever proof follows.
        if let Ok((resp, _)) = Responder::on_hello(secret(), Role::Decode, NR, msg) {
            if let Some(next) = msgs.get(i + 1) {
                assert!(resp.on_proof(next).is_err(), "responder accepted a forged proof");
            }
        }
        if let Some(resp) = genuine_resp.take() {
            assert!(resp.on_proof(msg).is_err(), "responder accepted a forged proof");
        }
    }
}
