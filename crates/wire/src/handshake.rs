//! Node-to-node key exchange: `Noise_NNpsk0_25519_AESGCM_SHA256` (the `snow` crate), keyed by
//! the cluster secret, then a pairing check inside the encrypted link (invariants 2, 11, 12).
//!
//! ```text
//! initiator                                     responder
//!   Hello   = Noise msg 1 (psk, e; role)   ───▶  tries each accepted secret
//!                                          ◀───  Reply = Noise msg 2 (e, ee; role)
//!   ══════ every later byte is an AES-256-GCM record under the split keys ══════
//!   Pairing (role, model, page size, …)    ───▶  checks it; Refused(code) or
//!                                          ◀───  Pairing (role, model, page size, …)
//! ```
//!
//! Why NNpsk0: both sides prove knowledge of the pre-shared cluster secret (the PSK is mixed
//! before the first message, so message 1 already fails without it), and the ephemeral-
//! ephemeral X25519 gives every connection fresh keys (forward secrecy: a secret stolen later
//! does not open recorded traffic). The responder learns that the initiator is live (not a
//! replayed message 1) only when its first record opens, so a link is established only after
//! the initiator's pairing record opened on the responder. Roles travel inside the Noise
//! payloads; a peer claiming our own role is refused ([`WireError::Reflection`]).
//!
//! Clear-text framing of every handshake message: `len u32 LE | "PWHS" | version u16 LE |
//! kind u8 | body` (fixed size per kind), at most [`MAX_HANDSHAKE_MSG`] bytes. Pairing
//! messages and refusals after the key exchange use the same encoding inside a record.

use snow::params::NoiseParams;

use crate::error::WireError;
use crate::frame::WIRE_VERSION;
use crate::keys::SessionKeys;
use crate::pairing::{dtype_of, put_pairing, LayoutShape, PairingInfo, RefusalCode, Role};
use crate::reader::Reader;

/// First bytes of every handshake message after the length.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"PWHS";
/// Upper bound of a handshake message, length prefix included.
pub const MAX_HANDSHAKE_MSG: usize = 256;
/// The Noise protocol every link runs.
pub const NOISE_PROTOCOL: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";
/// Bytes of a Noise handshake message: the ephemeral key, the encrypted role and its tag.
pub const NOISE_MSG_LEN: usize = 32 + 1 + 16;

const CTX_PASSPHRASE: &str = "pagewarden wire v1 cluster secret";

/// A shared cluster secret: the Noise PSK. Never printed; wiped from memory when dropped.
#[derive(Clone)]
pub struct ClusterSecret([u8; 32]);

impl Drop for ClusterSecret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl ClusterSecret {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ClusterSecret(bytes)
    }

    /// A secret from a configured passphrase (which should itself be long and random).
    pub fn from_passphrase(passphrase: &[u8]) -> Self {
        ClusterSecret(blake3::derive_key(CTX_PASSPHRASE, passphrase))
    }

    /// A 32-byte key for `context` derived from this secret (BLAKE3's key derivation): a
    /// purpose other than the handshake's gets its own key, and the secret never leaves here.
    pub fn derive_key(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.0)
    }

    /// A short public fingerprint, for logs ("which secret is this node using?").
    pub fn fingerprint(&self) -> String {
        let d = blake3::derive_key("pagewarden wire v2 secret fingerprint", &self.0);
        d[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Which secret a link was made with, against the ones a node accepts now (rotation closes the
/// links of a secret no longer accepted): compared in constant time, as secrets are.
impl PartialEq for ClusterSecret {
    fn eq(&self, other: &Self) -> bool {
        crate::ct::ct_eq32(&self.0, &other.0)
    }
}

impl Eq for ClusterSecret {}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

/// Every handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeMsg {
    /// Noise message 1, in clear (its payload, the role, is encrypted under the PSK).
    Hello([u8; NOISE_MSG_LEN]),
    /// Noise message 2, in clear (its payload, the role, is encrypted).
    Reply([u8; NOISE_MSG_LEN]),
    /// Sent only inside a record.
    Pairing {
        role: Role,
        info: PairingInfo,
    },
    Refused(RefusalCode),
}

const KIND_HELLO: u8 = 1;
const KIND_REPLY: u8 = 2;
const KIND_PAIRING: u8 = 4;
const KIND_REFUSED: u8 = 5;

impl HandshakeMsg {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64);
        let kind = match self {
            HandshakeMsg::Hello(m) => {
                body.extend_from_slice(m);
                KIND_HELLO
            }
            HandshakeMsg::Reply(m) => {
                body.extend_from_slice(m);
                KIND_REPLY
            }
            HandshakeMsg::Pairing { role, info } => {
                body.push(*role as u8);
                put_pairing(&mut body, info);
                KIND_PAIRING
            }
            HandshakeMsg::Refused(code) => {
                body.push(*code as u8);
                KIND_REFUSED
            }
        };
        let len = (4 + 2 + 1 + body.len()) as u32; // at most a few hundred bytes
        let mut out = Vec::with_capacity(4 + len as usize);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&HANDSHAKE_MAGIC);
        out.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&body);
        out
    }

    /// Parses exactly one message; never panics, allocates nothing.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let len = r.u32()? as usize;
        if len > MAX_HANDSHAKE_MSG - 4 {
            return Err(WireError::Oversized { len: len.saturating_add(4), max: MAX_HANDSHAKE_MSG });
        }
        if r.remaining() < len {
            return Err(WireError::Truncated { needed: len + 4, had: bytes.len() });
        }
        if r.remaining() > len {
            return Err(WireError::TrailingBytes { extra: r.remaining() - len });
        }
        if r.array::<4>()? != HANDSHAKE_MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = r.u16()?;
        if version != WIRE_VERSION {
            return Err(WireError::BadVersion { got: version, supported: WIRE_VERSION });
        }
        let msg = match r.u8()? {
            KIND_HELLO => HandshakeMsg::Hello(r.array()?),
            KIND_REPLY => HandshakeMsg::Reply(r.array()?),
            KIND_PAIRING => {
                let role = role_of(r.u8()?)?;
                let model_digest = r.array()?;
                let page_size = r.u32()?;
                let kv_dtype = dtype_of(r.u8()?).ok_or(WireError::Malformed("unknown KV dtype"))?;
                let layout = LayoutShape { n_layers: r.u32()?, n_kv_heads: r.u32()?, head_dim: r.u32()? };
                HandshakeMsg::Pairing { role, info: PairingInfo { model_digest, page_size, kv_dtype, layout } }
            }
            KIND_REFUSED => HandshakeMsg::Refused(
                RefusalCode::from_u8(r.u8()?).ok_or(WireError::Malformed("unknown refusal code"))?,
            ),
            _ => return Err(WireError::Malformed("unknown handshake message kind")),
        };
        r.finish()?;
        Ok(msg)
    }
}

fn role_of(v: u8) -> Result<Role, WireError> {
    Role::from_u8(v).ok_or(WireError::Malformed("unknown role"))
}

/// Binds the handshake to this protocol and version: a peer of another version fails it.
fn prologue() -> [u8; 17] {
    let mut p = [0u8; 17];
    p[..15].copy_from_slice(b"pagewarden wire");
    p[15..].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    p
}

fn noise_params() -> Result<NoiseParams, WireError> {
    NOISE_PROTOCOL.parse().map_err(|_| WireError::Crypto("Noise parameters"))
}

fn builder_state(secret: &ClusterSecret, initiator: bool) -> Result<snow::HandshakeState, WireError> {
    let setup = |_| WireError::Crypto("Noise handshake setup");
    let prologue = prologue();
    let b = snow::Builder::new(noise_params()?).psk(0, &secret.0).map_err(setup)?.prologue(&prologue).map_err(setup)?;
    if initiator { b.build_initiator() } else { b.build_responder() }.map_err(setup)
}

/// The keys of a finished Noise handshake.
fn finish(mut hs: snow::HandshakeState) -> Result<SessionKeys, WireError> {
    if !hs.is_handshake_finished() {
        return Err(WireError::Crypto("Noise handshake not finished"));
    }
    let (k1, k2) = hs.dangerously_get_raw_split();
    Ok(SessionKeys::from_split(hs.is_initiator(), &k1, &k2, hs.get_handshake_hash()))
}

/// The side that opens the connection, after sending its [`HandshakeMsg::Hello`].
pub struct Initiator {
    hs: snow::HandshakeState,
    role: Role,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Initiator {{ role: {:?} }}", self.role)
    }
}

impl Initiator {
    /// Starts a handshake under `secret` (a fresh ephemeral key from the OS's random source).
    pub fn start(secret: &ClusterSecret, role: Role) -> Result<(Self, HandshakeMsg), WireError> {
        let mut hs = builder_state(secret, true)?;
        let mut msg = [0u8; NOISE_MSG_LEN];
        let n = hs.write_message(&[role as u8], &mut msg).map_err(|_| WireError::Crypto("Noise message 1"))?;
        if n != NOISE_MSG_LEN {
            return Err(WireError::Crypto("Noise message 1 length"));
        }
        Ok((Initiator { hs, role }, HandshakeMsg::Hello(msg)))
    }

    /// Reads the responder's reply: on success, the session keys and the responder's role.
    /// A reply under another secret, tampered with, or answering another hello fails
    /// ([`WireError::BadProof`]); so does a peer claiming our own role.
    pub fn on_reply(mut self, msg: &HandshakeMsg) -> Result<(SessionKeys, Role), WireError> {
        let reply = match msg {
            HandshakeMsg::Reply(m) => m,
            HandshakeMsg::Refused(code) => return Err(WireError::Refused(*code)),
            _ => return Err(WireError::Malformed("expected a handshake reply")),
        };
        let mut payload = [0u8; NOISE_MSG_LEN];
        let n = self.hs.read_message(reply, &mut payload).map_err(|_| WireError::BadProof)?;
        let peer = match &payload[..n] {
            [r] => role_of(*r)?,
            _ => return Err(WireError::Malformed("handshake payload")),
        };
        if peer == self.role {
            return Err(WireError::Reflection { role: peer });
        }
        Ok((finish(self.hs)?, peer))
    }
}

/// The side that accepts the connection.
#[derive(Debug)]
pub struct Responder;

impl Responder {
    /// Answers a hello: tries each accepted secret (the current one first; more than one only
    /// while a rotation is in progress). Returns the reply to send, the session keys and the
    /// initiator's claimed role, which is proven only once its first record opens.
    pub fn on_hello(
        secrets: &[ClusterSecret],
        role: Role,
        msg: &HandshakeMsg,
    ) -> Result<(HandshakeMsg, SessionKeys, Role), WireError> {
        let hello = match msg {
            HandshakeMsg::Hello(m) => m,
            _ => return Err(WireError::Malformed("expected a hello")),
        };
        for secret in secrets {
            let mut hs = builder_state(secret, false)?;
            let mut payload = [0u8; NOISE_MSG_LEN];
            let Ok(n) = hs.read_message(hello, &mut payload) else { continue };
            let peer = match &payload[..n] {
                [r] => role_of(*r)?,
                _ => return Err(WireError::Malformed("handshake payload")),
            };
            if peer == role {
                return Err(WireError::Reflection { role: peer });
            }
            let mut reply = [0u8; NOISE_MSG_LEN];
            let n = hs.write_message(&[role as u8], &mut reply).map_err(|_| WireError::Crypto("Noise message 2"))?;
            if n != NOISE_MSG_LEN {
                return Err(WireError::Crypto("Noise message 2 length"));
            }
            return Ok((HandshakeMsg::Reply(reply), finish(hs)?, peer));
        }
        Err(WireError::BadProof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::AEAD_TAG_LEN;
    use proptest::prelude::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::from_passphrase(b"correct horse battery staple")
    }

    fn wire(m: &HandshakeMsg) -> Result<HandshakeMsg, WireError> {
        HandshakeMsg::decode(&m.encode())
    }

    type Side = (SessionKeys, Role);

    /// A whole key exchange through the codec.
    fn exchange(si: &ClusterSecret, accepted: &[ClusterSecret], ri: Role, rr: Role) -> Result<(Side, Side), WireError> {
        let (init, hello) = Initiator::start(si, ri)?;
        let (reply, kr, peer_of_r) = Responder::on_hello(accepted, rr, &wire(&hello)?)?;
        let (ki, peer_of_i) = init.on_reply(&wire(&reply)?)?;
        Ok(((ki, peer_of_i), (kr, peer_of_r)))
    }

    /// Whether a record sealed by `a` opens at `b` (the two ends agree on their keys).
    fn agree(a: SessionKeys, b: SessionKeys) -> bool {
        let (Ok((mut sa, _, ea)), Ok((_, mut ob, eb))) = (a.into_parts(), b.into_parts()) else { return false };
        let mut data = *b"pairing";
        let Ok(tag) = sa.seal(b"", &mut data) else { return false };
        ob.open(b"", &mut data, &tag).is_ok() && &data == b"pairing" && ea == eb
    }

    #[test]
    fn nodes_sharing_the_secret_agree_on_fresh_keys_and_learn_each_others_role() {
        let ((ki, pi), (kr, pr)) =
            exchange(&secret(), &[secret()], Role::Prefill, Role::Decode).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((pi, pr), (Role::Decode, Role::Prefill));
        assert!(ki.is_initiator() && !kr.is_initiator());
        assert!(agree(ki, kr));
        let ((a, _), (b, _)) =
            exchange(&secret(), &[secret()], Role::Prefill, Role::Decode).unwrap_or_else(|e| panic!("{e}"));
        let ((c, _), _) =
            exchange(&secret(), &[secret()], Role::Prefill, Role::Decode).unwrap_or_else(|e| panic!("{e}"));
        assert!(agree(a, b));
        let (_, _, ea) = c.into_parts().unwrap_or_else(|e| panic!("{e}"));
        let ((d, _), _) =
            exchange(&secret(), &[secret()], Role::Prefill, Role::Decode).unwrap_or_else(|e| panic!("{e}"));
        let (_, _, ed) = d.into_parts().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(ea, ed, "every connection gets fresh keys");
    }

    #[test]
    fn a_peer_without_the_secret_fails_the_key_exchange_on_both_sides() {
        let wrong = ClusterSecret::from_passphrase(b"guess");
        assert_eq!(exchange(&wrong, &[secret()], Role::Prefill, Role::Decode).err(), Some(WireError::BadProof));
        // A responder with another secret cannot produce a reply the initiator accepts.
        let (init, _) = Initiator::start(&secret(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        let (_, hello_w) = Initiator::start(&wrong, Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        let (reply_w, _, _) = Responder::on_hello(&[wrong], Role::Decode, &hello_w).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(init.on_reply(&reply_w).err(), Some(WireError::BadProof));
    }

    #[test]
    fn during_a_rotation_either_accepted_secret_authenticates() {
        let next = ClusterSecret::from_passphrase(b"the next secret, rotated in");
        let accepted = [next.clone(), secret()];
        for dial in [&secret(), &next] {
            let ((ki, _), (kr, _)) =
                exchange(dial, &accepted, Role::Gateway, Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
            assert!(agree(ki, kr));
        }
        let old = ClusterSecret::from_passphrase(b"retired");
        assert_eq!(exchange(&old, &accepted, Role::Gateway, Role::Prefill).err(), Some(WireError::BadProof));
    }

    #[test]
    fn a_peer_claiming_our_own_role_is_refused_as_a_reflection() {
        assert_eq!(
            exchange(&secret(), &[secret()], Role::Decode, Role::Decode).err(),
            Some(WireError::Reflection { role: Role::Decode })
        );
        // A hello reflected back at its sender, which answers as the same role.
        let (init, hello) = Initiator::start(&secret(), Role::Gateway).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Responder::on_hello(&[secret()], Role::Gateway, &hello).err(),
            Some(WireError::Reflection { role: Role::Gateway })
        );
        // A reply fed back to the initiator as if it were a hello, or a hello as a reply.
        assert!(init
            .on_reply(&HandshakeMsg::Reply(match hello {
                HandshakeMsg::Hello(m) => m,
                _ => [0; NOISE_MSG_LEN],
            }))
            .is_err());
    }

    #[test]
    fn a_recorded_reply_does_not_finish_another_handshake() {
        let (_, hello) = Initiator::start(&secret(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        let (old_reply, _, _) =
            Responder::on_hello(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
        let (fresh, _) = Initiator::start(&secret(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fresh.on_reply(&old_reply).err(), Some(WireError::BadProof));
    }

    #[test]
    fn a_replayed_hello_gets_keys_the_replayer_cannot_use() {
        // The responder answers a replayed hello, but the keys differ from the original
        // session's (fresh responder ephemeral): the replayer's records cannot open.
        let (init, hello) = Initiator::start(&secret(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        let (reply, k_first, _) =
            Responder::on_hello(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
        let (k_init, _) = init.on_reply(&reply).unwrap_or_else(|e| panic!("{e}"));
        let (_, k_replayed, _) =
            Responder::on_hello(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
        assert!(!agree(k_init, k_replayed));
        let _ = k_first;
    }

    #[test]
    fn any_flipped_byte_of_a_hello_or_reply_fails_the_exchange() {
        let (_, hello) = Initiator::start(&secret(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        let bytes = hello.encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x02;
            let r = HandshakeMsg::decode(&b).and_then(|m| Responder::on_hello(&[secret()], Role::Decode, &m));
            assert!(r.is_err(), "hello byte {i}");
        }
        let (init_bytes, reply) = {
            let (init, hello) = Initiator::start(&secret(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
            let (reply, _, _) =
                Responder::on_hello(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
            (init, reply.encode())
        };
        drop(init_bytes);
        for i in 0..reply.len() {
            let (init, hello) = Initiator::start(&secret(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
            let (r, _, _) = Responder::on_hello(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
            let mut b = r.encode();
            b[i] ^= 0x02;
            let out = HandshakeMsg::decode(&b).and_then(|m| init.on_reply(&m));
            assert!(out.is_err(), "reply byte {i}");
        }
    }

    #[test]
    fn refusal_from_the_peer_is_reported() {
        let (init, _) = Initiator::start(&secret(), Role::Gateway).unwrap_or_else(|e| panic!("{e}"));
        let refused = wire(&HandshakeMsg::Refused(RefusalCode::Version));
        assert_eq!(refused, Ok(HandshakeMsg::Refused(RefusalCode::Version)));
        assert_eq!(
            init.on_reply(&HandshakeMsg::Refused(RefusalCode::Busy)).err(),
            Some(WireError::Refused(RefusalCode::Busy))
        );
    }

    fn info() -> PairingInfo {
        let layout = kv::KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: kv::KvDtype::F16 };
        PairingInfo::new([5; 32], &layout).unwrap_or_else(|| panic!("fits"))
    }

    #[test]
    fn handshake_messages_round_trip_and_refuse_truncation_and_other_versions() {
        let msgs = [
            HandshakeMsg::Hello([1; NOISE_MSG_LEN]),
            HandshakeMsg::Reply([2; NOISE_MSG_LEN]),
            HandshakeMsg::Pairing { role: Role::Prefill, info: info() },
            HandshakeMsg::Refused(RefusalCode::Layout),
        ];
        for m in msgs {
            let bytes = m.encode();
            assert!(bytes.len() <= MAX_HANDSHAKE_MSG);
            assert_eq!(HandshakeMsg::decode(&bytes), Ok(m));
            for n in 0..bytes.len() {
                assert!(matches!(HandshakeMsg::decode(&bytes[..n]), Err(WireError::Truncated { .. })));
            }
            let mut v1 = bytes.clone();
            v1[8] = 1;
            assert!(matches!(HandshakeMsg::decode(&v1), Err(WireError::BadVersion { got: 1, .. })));
        }
        assert_eq!(NOISE_MSG_LEN, 32 + 1 + AEAD_TAG_LEN);
    }

    #[test]
    fn secrets_never_print_and_fingerprints_tell_them_apart() {
        assert!(!format!("{:?}", ClusterSecret::from_bytes([0xcd; 32])).contains("cd"));
        assert_ne!(secret().fingerprint(), ClusterSecret::from_bytes([0xcd; 32]).fingerprint());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_handshake_parser(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = HandshakeMsg::decode(&bytes);
        }

        #[test]
        fn arbitrary_bodies_behind_a_valid_header_never_panic_and_never_authenticate(kind in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..120)) {
            let mut bytes = ((7 + body.len()) as u32).to_le_bytes().to_vec();
            bytes.extend_from_slice(&HANDSHAKE_MAGIC);
            bytes.extend_from_slice(&WIRE_VERSION.to_le_bytes());
            bytes.push(kind);
            bytes.extend_from_slice(&body);
            if let Ok(m) = HandshakeMsg::decode(&bytes) {
                prop_assert_eq!(m.encode(), bytes);
                let (init, _) = Initiator::start(&secret(), Role::Prefill).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(init.on_reply(&m).is_err());
                prop_assert!(Responder::on_hello(&[secret()], Role::Decode, &m).is_err());
            }
        }

        #[test]
        fn mutated_genuine_messages_never_authenticate(flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4)) {
            let (init, hello) = Initiator::start(&secret(), Role::Prefill).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let (reply, _, _) = Responder::on_hello(&[secret()], Role::Decode, &hello).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mutate = |m: &HandshakeMsg| {
                let genuine = m.encode();
                let mut b = genuine.clone();
                for (at, x) in &flips {
                    b[at.index(genuine.len())] ^= x;
                }
                if b == genuine { Err(WireError::Malformed("unchanged")) } else { HandshakeMsg::decode(&b) }
            };
            if let Ok(m) = mutate(&hello) {
                prop_assert!(Responder::on_hello(&[secret()], Role::Decode, &m).is_err());
            }
            if let Ok(m) = mutate(&reply) {
                prop_assert!(init.on_reply(&m).is_err());
            }
        }
    }
}
