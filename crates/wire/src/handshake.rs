//! Node-to-node key exchange: `Noise_IXpsk0_25519_AESGCM_SHA256` (the `snow` crate), keyed by
//! the cluster secret and each node's own static key, then a pairing check inside the
//! encrypted link (invariants 2, 11, 12).
//!
//! ```text
//! initiator                                          responder
//!   Hello   = Noise msg 1 (psk, e, s; role)     ───▶  tries each accepted secret; checks the
//!                                                     initiator's static key is trusted
//!                                               ◀───  Reply = Noise msg 2 (e, ee, se, s, es; role)
//!   checks the responder's static key is trusted
//!   ══════ every later byte is an AES-256-GCM record under the split keys ══════
//!   Pairing (role, model, page size, …)         ───▶  checks it; Refused(code) or
//!                                               ◀───  Pairing (role, model, page size, …)
//! ```
//!
//! Why IXpsk0 (docs/wire.md): it keeps the two-message flow (XX needs a third), each side
//! learns and authenticates the other's static key without knowing it in advance (IK and KK
//! need the responder's, or both, beforehand; a worker only has an allow-list), and the PSK
//! mixed before the first message keeps what NNpsk0 gave: message 1 fails without the cluster
//! secret, and the initiator's static key travels encrypted under it, so only a member of the
//! cluster learns who is dialling. The ee, se and es Diffie-Hellmans bind both static keys
//! and both ephemerals into the session keys: only the holder of the static private key named
//! in a message can use the keys, and every connection gets fresh keys (forward secrecy). The
//! responder learns that the initiator is live (not a replayed message 1) only when its first
//! record opens, so a link is established only after the initiator's pairing record opened on
//! the responder. Roles travel inside the Noise payloads; a peer claiming our own role is
//! refused ([`WireError::Reflection`]); a peer whose static key is not trusted is refused
//! ([`WireError::UntrustedNode`]).
//!
//! Clear-text framing of every handshake message: `len u32 LE | "PWHS" | version u16 LE |
//! kind u8 | body` (fixed size per kind), at most [`MAX_HANDSHAKE_MSG`] bytes. Pairing
//! messages and refusals after the key exchange use the same encoding inside a record.

use snow::params::NoiseParams;

use crate::error::WireError;
use crate::frame::WIRE_VERSION;
use crate::keys::SessionKeys;
use crate::node_id::{NodePublicKey, NODE_KEY_LEN};
use crate::node_key::NodeKey;
use crate::pairing::{dtype_of, put_pairing, LayoutShape, PairingInfo, RefusalCode, Role};
use crate::reader::Reader;

/// First bytes of every handshake message after the length.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"PWHS";
/// Upper bound of a handshake message, length prefix included.
pub const MAX_HANDSHAKE_MSG: usize = 256;
/// The Noise protocol every link runs.
pub const NOISE_PROTOCOL: &str = "Noise_IXpsk0_25519_AESGCM_SHA256";
/// Bytes of a Noise handshake message (both have the same size): the ephemeral key, the
/// encrypted static key and its tag, the encrypted role and its tag.
pub const NOISE_MSG_LEN: usize = 32 + (NODE_KEY_LEN + 16) + (1 + 16);

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
    /// Noise message 1, in clear (the static key and the role are encrypted under the PSK).
    Hello([u8; NOISE_MSG_LEN]),
    /// Noise message 2, in clear (the static key and the role are encrypted).
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

pub(crate) fn noise_params() -> Result<NoiseParams, WireError> {
    NOISE_PROTOCOL.parse().map_err(|_| WireError::Crypto("Noise parameters"))
}

fn builder_state(secret: &ClusterSecret, key: &NodeKey, initiator: bool) -> Result<snow::HandshakeState, WireError> {
    let setup = |_| WireError::Crypto("Noise handshake setup");
    let prologue = prologue();
    let b = snow::Builder::new(noise_params()?)
        .psk(0, &secret.0)
        .map_err(setup)?
        .prologue(&prologue)
        .map_err(setup)?
        .local_private_key(key.private())
        .map_err(setup)?;
    if initiator { b.build_initiator() } else { b.build_responder() }.map_err(setup)
}

/// The static key the peer sent in the message just read (authenticated by the DHs that
/// follow it), if the allow-list takes it.
fn trusted_peer(
    hs: &snow::HandshakeState,
    trusts: &dyn Fn(&NodePublicKey) -> bool,
) -> Result<NodePublicKey, WireError> {
    let key: [u8; NODE_KEY_LEN] = hs
        .get_remote_static()
        .and_then(|k| k.try_into().ok())
        .ok_or(WireError::Crypto("Noise handshake: no peer static key"))?;
    let key = NodePublicKey(key);
    if trusts(&key) {
        Ok(key)
    } else {
        Err(WireError::UntrustedNode(key))
    }
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
    /// Starts a handshake under `secret` as the node of `key` (a fresh ephemeral key from the
    /// OS's random source).
    pub fn start(secret: &ClusterSecret, key: &NodeKey, role: Role) -> Result<(Self, HandshakeMsg), WireError> {
        let mut hs = builder_state(secret, key, true)?;
        let mut msg = [0u8; NOISE_MSG_LEN];
        let n = hs.write_message(&[role as u8], &mut msg).map_err(|_| WireError::Crypto("Noise message 1"))?;
        if n != NOISE_MSG_LEN {
            return Err(WireError::Crypto("Noise message 1 length"));
        }
        Ok((Initiator { hs, role }, HandshakeMsg::Hello(msg)))
    }

    /// Reads the responder's reply: on success, the session keys, the responder's role and its
    /// static key, which `trusts` accepted. A reply under another secret, tampered with, or
    /// answering another hello fails ([`WireError::BadProof`]); so does a peer claiming our
    /// own role, and one whose static key `trusts` refuses ([`WireError::UntrustedNode`]).
    pub fn on_reply(
        mut self,
        msg: &HandshakeMsg,
        trusts: &dyn Fn(&NodePublicKey) -> bool,
    ) -> Result<(SessionKeys, Role, NodePublicKey), WireError> {
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
        let key = trusted_peer(&self.hs, trusts)?;
        Ok((finish(self.hs)?, peer, key))
    }
}

/// The side that accepts the connection.
#[derive(Debug)]
pub struct Responder;

impl Responder {
    /// Answers a hello as the node of `key`: tries each accepted secret (the current one first;
    /// more than one only while a rotation is in progress), then checks the initiator's static
    /// key with `trusts`. Returns the reply to send, the session keys, the initiator's claimed
    /// role and its static key; both are proven only once its first record opens (only the
    /// holder of that key's private half can open the keys).
    pub fn on_hello(
        secrets: &[ClusterSecret],
        key: &NodeKey,
        role: Role,
        msg: &HandshakeMsg,
        trusts: &dyn Fn(&NodePublicKey) -> bool,
    ) -> Result<(HandshakeMsg, SessionKeys, Role, NodePublicKey), WireError> {
        let hello = match msg {
            HandshakeMsg::Hello(m) => m,
            _ => return Err(WireError::Malformed("expected a hello")),
        };
        for secret in secrets {
            let mut hs = builder_state(secret, key, false)?;
            let mut payload = [0u8; NOISE_MSG_LEN];
            let Ok(n) = hs.read_message(hello, &mut payload) else { continue };
            let peer = match &payload[..n] {
                [r] => role_of(*r)?,
                _ => return Err(WireError::Malformed("handshake payload")),
            };
            if peer == role {
                return Err(WireError::Reflection { role: peer });
            }
            let peer_key = trusted_peer(&hs, trusts)?;
            let mut reply = [0u8; NOISE_MSG_LEN];
            let n = hs.write_message(&[role as u8], &mut reply).map_err(|_| WireError::Crypto("Noise message 2"))?;
            if n != NOISE_MSG_LEN {
                return Err(WireError::Crypto("Noise message 2 length"));
            }
            return Ok((HandshakeMsg::Reply(reply), finish(hs)?, peer, peer_key));
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

    /// The two nodes of most tests: fixed keys, each trusting the other.
    fn key_i() -> NodeKey {
        NodeKey::from_private([0x11; 32]).unwrap_or_else(|e| panic!("{e}"))
    }

    fn key_r() -> NodeKey {
        NodeKey::from_private([0x22; 32]).unwrap_or_else(|e| panic!("{e}"))
    }

    fn pinned(k: &NodePublicKey) -> bool {
        *k == key_i().public() || *k == key_r().public()
    }

    fn start(s: &ClusterSecret, role: Role) -> (Initiator, HandshakeMsg) {
        Initiator::start(s, &key_i(), role).unwrap_or_else(|e| panic!("{e}"))
    }

    fn answer(
        accepted: &[ClusterSecret],
        role: Role,
        hello: &HandshakeMsg,
    ) -> Result<(HandshakeMsg, SessionKeys, Role, NodePublicKey), WireError> {
        Responder::on_hello(accepted, &key_r(), role, hello, &pinned)
    }

    fn wire(m: &HandshakeMsg) -> Result<HandshakeMsg, WireError> {
        HandshakeMsg::decode(&m.encode())
    }

    type Side = (SessionKeys, Role);

    /// A whole key exchange through the codec.
    fn exchange(si: &ClusterSecret, accepted: &[ClusterSecret], ri: Role, rr: Role) -> Result<(Side, Side), WireError> {
        let (init, hello) = Initiator::start(si, &key_i(), ri)?;
        let (reply, kr, peer_of_r, _) = answer(accepted, rr, &wire(&hello)?)?;
        let (ki, peer_of_i, _) = init.on_reply(&wire(&reply)?, &pinned)?;
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
    fn nodes_sharing_the_secret_agree_on_fresh_keys_and_learn_each_others_role_and_static_key() {
        let (init, hello) = start(&secret(), Role::Prefill);
        let (reply, kr, pr, key_of_i) = answer(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
        let (ki, pi, key_of_r) = init.on_reply(&reply, &pinned).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((pi, pr), (Role::Decode, Role::Prefill));
        assert_eq!((key_of_i, key_of_r), (key_i().public(), key_r().public()));
        assert!(ki.is_initiator() && !kr.is_initiator());
        assert!(agree(ki, kr));
        let ((c, _), _) =
            exchange(&secret(), &[secret()], Role::Prefill, Role::Decode).unwrap_or_else(|e| panic!("{e}"));
        let (_, _, ec) = c.into_parts().unwrap_or_else(|e| panic!("{e}"));
        let ((d, _), _) =
            exchange(&secret(), &[secret()], Role::Prefill, Role::Decode).unwrap_or_else(|e| panic!("{e}"));
        let (_, _, ed) = d.into_parts().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(ec, ed, "every connection gets fresh keys");
    }

    #[test]
    fn a_peer_without_the_secret_fails_the_key_exchange_on_both_sides() {
        let wrong = ClusterSecret::from_passphrase(b"guess");
        assert_eq!(exchange(&wrong, &[secret()], Role::Prefill, Role::Decode).err(), Some(WireError::BadProof));
        // A responder with another secret cannot produce a reply the initiator accepts.
        let (init, _) = start(&secret(), Role::Prefill);
        let (_, hello_w) = start(&wrong, Role::Prefill);
        let (reply_w, _, _, _) = answer(&[wrong], Role::Decode, &hello_w).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(init.on_reply(&reply_w, &pinned).err(), Some(WireError::BadProof));
    }

    #[test]
    fn a_trusted_static_key_without_the_cluster_secret_is_still_refused() {
        // The PSK is still required: a pinned node that lost (or never had) the secret is out.
        let wrong = ClusterSecret::from_passphrase(b"a pinned node with the wrong secret");
        let (_, hello) = Initiator::start(&wrong, &key_i(), Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer(&[secret()], Role::Decode, &hello).err(), Some(WireError::BadProof));
    }

    #[test]
    fn an_initiator_whose_static_key_is_not_pinned_is_refused_by_the_responder() {
        let stranger = NodeKey::from_private([0x33; 32]).unwrap_or_else(|e| panic!("{e}"));
        let (_, hello) = Initiator::start(&secret(), &stranger, Role::Prefill).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer(&[secret()], Role::Decode, &hello).err(), Some(WireError::UntrustedNode(stranger.public())));
        // Revocation: the same node, trusted a moment ago, is refused once its key is unpinned.
        let (_, hello) = start(&secret(), Role::Prefill);
        let without_i = |k: &NodePublicKey| *k == key_r().public();
        assert_eq!(
            Responder::on_hello(&[secret()], &key_r(), Role::Decode, &hello, &without_i).err(),
            Some(WireError::UntrustedNode(key_i().public()))
        );
    }

    #[test]
    fn a_responder_whose_static_key_is_not_pinned_is_refused_by_the_initiator() {
        let stranger = NodeKey::from_private([0x44; 32]).unwrap_or_else(|e| panic!("{e}"));
        let (init, hello) = start(&secret(), Role::Gateway);
        let (reply, _, _, _) = Responder::on_hello(&[secret()], &stranger, Role::Prefill, &hello, &pinned)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(init.on_reply(&reply, &pinned).err(), Some(WireError::UntrustedNode(stranger.public())));
    }

    #[test]
    fn a_responder_cannot_claim_another_nodes_static_key() {
        // A reply made with one key pair cannot be passed off as another's: the static key the
        // initiator learns is the one whose private half took part in the handshake.
        let (init, hello) = start(&secret(), Role::Gateway);
        let stranger = NodeKey::from_private([0x55; 32]).unwrap_or_else(|e| panic!("{e}"));
        let (reply, _, _, _) = Responder::on_hello(&[secret()], &stranger, Role::Prefill, &hello, &pinned)
            .unwrap_or_else(|e| panic!("{e}"));
        let HandshakeMsg::Reply(mut bytes) = reply else { panic!("not a reply") };
        // Splice the pinned responder's encrypted static key into the stranger's reply.
        let (init2, hello2) = start(&secret(), Role::Gateway);
        let (genuine, _, _, _) = answer(&[secret()], Role::Prefill, &hello2).unwrap_or_else(|e| panic!("{e}"));
        let HandshakeMsg::Reply(g) = genuine else { panic!("not a reply") };
        bytes[32..32 + NODE_KEY_LEN + 16].copy_from_slice(&g[32..32 + NODE_KEY_LEN + 16]);
        assert!(init.on_reply(&HandshakeMsg::Reply(bytes), &pinned).is_err());
        drop(init2);
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
        let (init, hello) = start(&secret(), Role::Gateway);
        assert_eq!(
            answer(&[secret()], Role::Gateway, &hello).err(),
            Some(WireError::Reflection { role: Role::Gateway })
        );
        // A hello fed back to the initiator as if it were a reply.
        let HandshakeMsg::Hello(m) = hello else { panic!("not a hello") };
        assert!(init.on_reply(&HandshakeMsg::Reply(m), &pinned).is_err());
    }

    #[test]
    fn a_recorded_reply_does_not_finish_another_handshake() {
        let (_, hello) = start(&secret(), Role::Prefill);
        let (old_reply, _, _, _) = answer(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
        let (fresh, _) = start(&secret(), Role::Prefill);
        assert_eq!(fresh.on_reply(&old_reply, &pinned).err(), Some(WireError::BadProof));
    }

    #[test]
    fn a_replayed_hello_gets_keys_the_replayer_cannot_use() {
        // The responder answers a replayed hello (a trusted node's, under the secret), but the
        // keys differ from the original session's (fresh responder ephemeral, and the se DH
        // needs the initiator's static private key): the replayer's records cannot open.
        let (init, hello) = start(&secret(), Role::Prefill);
        let (reply, _, _, _) = answer(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
        let (k_init, _, _) = init.on_reply(&reply, &pinned).unwrap_or_else(|e| panic!("{e}"));
        let (replayed_reply, k_replayed, _, _) =
            answer(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(replayed_reply, reply);
        assert!(!agree(k_init, k_replayed));
    }

    #[test]
    fn any_flipped_byte_of_a_hello_or_reply_fails_the_exchange() {
        let (_, hello) = start(&secret(), Role::Prefill);
        let bytes = hello.encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x02;
            let r = HandshakeMsg::decode(&b).and_then(|m| answer(&[secret()], Role::Decode, &m));
            assert!(r.is_err(), "hello byte {i}");
        }
        let len = {
            let (_, hello) = start(&secret(), Role::Prefill);
            answer(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}")).0.encode().len()
        };
        for i in 0..len {
            let (init, hello) = start(&secret(), Role::Prefill);
            let (r, _, _, _) = answer(&[secret()], Role::Decode, &hello).unwrap_or_else(|e| panic!("{e}"));
            let mut b = r.encode();
            b[i] ^= 0x02;
            let out = HandshakeMsg::decode(&b).and_then(|m| init.on_reply(&m, &pinned));
            assert!(out.is_err(), "reply byte {i}");
        }
    }

    #[test]
    fn refusal_from_the_peer_is_reported() {
        let (init, _) = start(&secret(), Role::Gateway);
        let refused = wire(&HandshakeMsg::Refused(RefusalCode::Version));
        assert_eq!(refused, Ok(HandshakeMsg::Refused(RefusalCode::Version)));
        assert_eq!(
            init.on_reply(&HandshakeMsg::Refused(RefusalCode::Untrusted), &pinned).err(),
            Some(WireError::Refused(RefusalCode::Untrusted))
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
        assert_eq!(NOISE_MSG_LEN, 32 + 32 + AEAD_TAG_LEN + 1 + AEAD_TAG_LEN);
    }

    #[test]
    fn a_version_2_hello_is_refused_as_a_bad_version_not_as_malformed() {
        // What a version-2 node sends: NNpsk0's first message (e, then the role sealed under
        // the PSK-mixed key), shorter than IXpsk0's.
        let body = [7u8; 32 + 1 + AEAD_TAG_LEN];
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((4 + 2 + 1 + body.len()) as u32).to_le_bytes());
        bytes.extend_from_slice(&HANDSHAKE_MAGIC);
        bytes.extend_from_slice(&2u16.to_le_bytes());
        bytes.push(KIND_HELLO);
        bytes.extend_from_slice(&body);
        assert_eq!(HandshakeMsg::decode(&bytes), Err(WireError::BadVersion { got: 2, supported: 5 }));
        assert_eq!(WIRE_VERSION, 5);
        // Version-3 and 4 nodes' hellos have this version's shape (their control messages do not).
        for old in [3u16, 4] {
            bytes[8..10].copy_from_slice(&old.to_le_bytes());
            assert_eq!(HandshakeMsg::decode(&bytes), Err(WireError::BadVersion { got: old, supported: 5 }));
        }
        let e = WireError::BadVersion { got: 2, supported: WIRE_VERSION };
        assert_eq!(
            (e.to_string().as_str(), e.kind()),
            ("unsupported wire version 2 (this build speaks 5)", "bad_version")
        );
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
                let (init, _) = start(&secret(), Role::Prefill);
                prop_assert!(init.on_reply(&m, &pinned).is_err());
                prop_assert!(answer(&[secret()], Role::Decode, &m).is_err());
            }
        }

        #[test]
        fn mutated_genuine_messages_never_authenticate(flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4)) {
            let (init, hello) = start(&secret(), Role::Prefill);
            let (reply, _, _, _) = answer(&[secret()], Role::Decode, &hello).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mutate = |m: &HandshakeMsg| {
                let genuine = m.encode();
                let mut b = genuine.clone();
                for (at, x) in &flips {
                    b[at.index(genuine.len())] ^= x;
                }
                if b == genuine { Err(WireError::Malformed("unchanged")) } else { HandshakeMsg::decode(&b) }
            };
            if let Ok(m) = mutate(&hello) {
                prop_assert!(answer(&[secret()], Role::Decode, &m).is_err());
            }
            if let Ok(m) = mutate(&reply) {
                prop_assert!(init.on_reply(&m, &pinned).is_err());
            }
        }
    }
}
