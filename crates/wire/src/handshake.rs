//! Node-to-node handshake: mutual authentication by a cluster secret (challenge-response over
//! fresh nonces from both sides) and a pairing check (model digest, page size, KV dtype,
//! layout) that refuses, naming the mismatch (invariants 2 and 11).
//!
//! ```text
//! initiator                                   responder
//!   Hello { role, nonce_i }          ───▶
//!                                    ◀───     Challenge { role, nonce_r, proof_r }
//!   Proof { proof_i }                ───▶
//!   Pairing { role, info, mac }      ◀──▶     Pairing { role, info, mac }   (MAC'd by session key)
//! ```
//! `proof_r = keyed_blake3(auth_key, "responder" || transcript)`,
//! `proof_i = keyed_blake3(auth_key, "initiator" || transcript)`, where the transcript is
//! version, both roles and both nonces, and `auth_key` is derived from the cluster secret.
//! Each side's own fresh nonce makes the other's proof unreplayable; the labels stop a proof
//! from being reflected back. Every message: `len u32 LE | "PWHS" | version u16 LE | kind u8 |
//! body` (fixed size per kind), at most [`MAX_HANDSHAKE_MSG`] bytes.

use crate::codec::Reader;
use crate::error::WireError;
use crate::frame::WIRE_VERSION;
use crate::mac::{ct_eq32, mac, verify};
use kv::{KvDtype, KvLayout};

/// First bytes of every handshake message after the length.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"PWHS";
/// Upper bound of a handshake message, length prefix included.
pub const MAX_HANDSHAKE_MSG: usize = 256;

const CTX_AUTH: &str = "pagewarden wire v1 node auth";
const CTX_SESSION: &str = "pagewarden wire v1 session key";
const CTX_PASSPHRASE: &str = "pagewarden wire v1 cluster secret";

/// The shared cluster secret. Never printed.
#[derive(Clone)]
pub struct ClusterSecret([u8; 32]);

impl ClusterSecret {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ClusterSecret(bytes)
    }

    /// A secret from a configured passphrase (which should itself be long and random).
    pub fn from_passphrase(passphrase: &[u8]) -> Self {
        ClusterSecret(blake3::derive_key(CTX_PASSPHRASE, passphrase))
    }

    fn auth_key(&self) -> [u8; 32] {
        blake3::derive_key(CTX_AUTH, &self.0)
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

/// Key both sides derive after a successful handshake (secret and both nonces). Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKey([u8; 32]);

impl SessionKey {
    /// The raw key, for MACing later messages on the channel.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(<redacted>)")
    }
}

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Gateway = 1,
    Prefill = 2,
    Decode = 3,
}

impl Role {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        match v {
            1 => Ok(Role::Gateway),
            2 => Ok(Role::Prefill),
            3 => Ok(Role::Decode),
            _ => Err(WireError::Malformed("unknown role")),
        }
    }
}

/// Why a node refuses a peer (sent in [`HandshakeMsg::Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    BadProof = 1,
    Version = 2,
    ModelDigest = 3,
    PageSize = 4,
    KvDtype = 5,
    Layout = 6,
}

impl RefusalCode {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        use RefusalCode::*;
        [BadProof, Version, ModelDigest, PageSize, KvDtype, Layout]
            .into_iter()
            .find(|c| *c as u8 == v)
            .ok_or(WireError::Malformed("unknown refusal code"))
    }
}

/// Model shape of the KV cache, as compared at pairing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutShape {
    pub n_layers: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
}

/// What two nodes must agree on before any KV crosses between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairingInfo {
    /// SHA-256 (or other 32-byte digest) of the model file.
    pub model_digest: [u8; 32],
    pub page_size: u32,
    pub kv_dtype: KvDtype,
    pub layout: LayoutShape,
}

/// The first difference found between our pairing info and a peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PairingMismatch {
    #[error("model digests differ")]
    ModelDigest,
    #[error("page size differs: ours {ours}, theirs {theirs}")]
    PageSize { ours: u32, theirs: u32 },
    #[error("KV dtype differs: ours {ours:?}, theirs {theirs:?}")]
    KvDtype { ours: KvDtype, theirs: KvDtype },
    #[error("layout differs: ours {ours:?}, theirs {theirs:?}")]
    Layout { ours: LayoutShape, theirs: LayoutShape },
}

impl PairingMismatch {
    /// The code to send the peer.
    pub fn code(&self) -> RefusalCode {
        match self {
            PairingMismatch::ModelDigest => RefusalCode::ModelDigest,
            PairingMismatch::PageSize { .. } => RefusalCode::PageSize,
            PairingMismatch::KvDtype { .. } => RefusalCode::KvDtype,
            PairingMismatch::Layout { .. } => RefusalCode::Layout,
        }
    }
}

impl PairingInfo {
    /// Pairing info of a model digest and a KV layout.
    pub fn new(model_digest: [u8; 32], layout: &KvLayout) -> Result<Self, WireError> {
        let f = |v: usize| u32::try_from(v).map_err(|_| WireError::Malformed("layout does not fit u32"));
        Ok(PairingInfo {
            model_digest,
            page_size: f(layout.page_size)?,
            kv_dtype: layout.dtype,
            layout: LayoutShape {
                n_layers: f(layout.n_layers)?,
                n_kv_heads: f(layout.n_kv_heads)?,
                head_dim: f(layout.head_dim)?,
            },
        })
    }

    /// Ok when `theirs` equals ours; else the mismatch, in the order model, page size, dtype,
    /// layout.
    pub fn check(&self, theirs: &PairingInfo) -> Result<(), PairingMismatch> {
        if !ct_eq32(&self.model_digest, &theirs.model_digest) {
            return Err(PairingMismatch::ModelDigest);
        }
        if self.page_size != theirs.page_size {
            return Err(PairingMismatch::PageSize { ours: self.page_size, theirs: theirs.page_size });
        }
        if self.kv_dtype != theirs.kv_dtype {
            return Err(PairingMismatch::KvDtype { ours: self.kv_dtype, theirs: theirs.kv_dtype });
        }
        if self.layout != theirs.layout {
            return Err(PairingMismatch::Layout { ours: self.layout, theirs: theirs.layout });
        }
        Ok(())
    }

    /// Our pairing message, MAC'd under the session key and bound to our role.
    pub fn seal(&self, role: Role, session: &SessionKey) -> HandshakeMsg {
        let tag = mac(&session.0, &pairing_signed(role, self));
        HandshakeMsg::Pairing { role, info: *self, mac: tag }
    }

    /// Opens the peer's pairing message: it must come from `peer` (the role the handshake
    /// authenticated) and carry a valid MAC; then checks it against ours.
    pub fn open_and_check(
        &self,
        msg: &HandshakeMsg,
        peer: Role,
        session: &SessionKey,
    ) -> Result<PairingInfo, WireError> {
        let (role, info, tag) = match msg {
            HandshakeMsg::Pairing { role, info, mac } => (*role, *info, mac),
            HandshakeMsg::Refused(code) => return Err(WireError::Refused(*code)),
            _ => return Err(WireError::Malformed("expected a pairing message")),
        };
        if role != peer || !verify(&session.0, &pairing_signed(role, &info), tag) {
            return Err(WireError::BadMac);
        }
        self.check(&info).map_err(WireError::Pairing)?;
        Ok(info)
    }
}

fn pairing_signed(role: Role, info: &PairingInfo) -> Vec<u8> {
    let mut v = b"pairing".to_vec();
    v.push(role as u8);
    put_pairing(&mut v, info);
    v
}

fn dtype_code(d: KvDtype) -> u8 {
    match d {
        KvDtype::F16 => 1,
        KvDtype::F32 => 2,
    }
}

fn put_pairing(v: &mut Vec<u8>, info: &PairingInfo) {
    v.extend_from_slice(&info.model_digest);
    v.extend_from_slice(&info.page_size.to_le_bytes());
    v.push(dtype_code(info.kv_dtype));
    for x in [info.layout.n_layers, info.layout.n_kv_heads, info.layout.head_dim] {
        v.extend_from_slice(&x.to_le_bytes());
    }
}

/// Every handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeMsg {
    Hello { role: Role, nonce: [u8; 32] },
    Challenge { role: Role, nonce: [u8; 32], proof: [u8; 32] },
    Proof { proof: [u8; 32] },
    Pairing { role: Role, info: PairingInfo, mac: [u8; 32] },
    Refused(RefusalCode),
}

impl HandshakeMsg {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(128);
        let kind = match self {
            HandshakeMsg::Hello { role, nonce } => {
                body.push(*role as u8);
                body.extend_from_slice(nonce);
                1
            }
            HandshakeMsg::Challenge { role, nonce, proof } => {
                body.push(*role as u8);
                body.extend_from_slice(nonce);
                body.extend_from_slice(proof);
                2
            }
            HandshakeMsg::Proof { proof } => {
                body.extend_from_slice(proof);
                3
            }
            HandshakeMsg::Pairing { role, info, mac } => {
                body.push(*role as u8);
                put_pairing(&mut body, info);
                body.extend_from_slice(mac);
                4
            }
            HandshakeMsg::Refused(code) => {
                body.push(*code as u8);
                5
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
            1 => HandshakeMsg::Hello { role: Role::from_u8(r.u8()?)?, nonce: r.array()? },
            2 => HandshakeMsg::Challenge { role: Role::from_u8(r.u8()?)?, nonce: r.array()?, proof: r.array()? },
            3 => HandshakeMsg::Proof { proof: r.array()? },
            4 => {
                let role = Role::from_u8(r.u8()?)?;
                let model_digest = r.array()?;
                let page_size = r.u32()?;
                let kv_dtype = match r.u8()? {
                    1 => KvDtype::F16,
                    2 => KvDtype::F32,
                    _ => return Err(WireError::Malformed("unknown KV dtype")),
                };
                let layout = LayoutShape { n_layers: r.u32()?, n_kv_heads: r.u32()?, head_dim: r.u32()? };
                let info = PairingInfo { model_digest, page_size, kv_dtype, layout };
                HandshakeMsg::Pairing { role, info, mac: r.array()? }
            }
            5 => HandshakeMsg::Refused(RefusalCode::from_u8(r.u8()?)?),
            _ => return Err(WireError::Malformed("unknown handshake message kind")),
        };
        r.finish()?;
        Ok(msg)
    }
}

fn transcript(label: &[u8], initiator: Role, responder: Role, ni: &[u8; 32], nr: &[u8; 32]) -> Vec<u8> {
    let mut t = Vec::with_capacity(label.len() + 2 + 2 + 64);
    t.extend_from_slice(label);
    t.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    t.push(initiator as u8);
    t.push(responder as u8);
    t.extend_from_slice(ni);
    t.extend_from_slice(nr);
    t
}

fn session_key(secret: &ClusterSecret, initiator: Role, responder: Role, ni: &[u8; 32], nr: &[u8; 32]) -> SessionKey {
    let mut h = blake3::Hasher::new_derive_key(CTX_SESSION);
    h.update(&secret.0);
    h.update(&transcript(b"session", initiator, responder, ni, nr));
    SessionKey(*h.finalize().as_bytes())
}

/// The side that opens the connection, after sending its [`HandshakeMsg::Hello`].
#[derive(Debug)]
pub struct Initiator {
    secret: ClusterSecret,
    role: Role,
    nonce: [u8; 32],
}

impl Initiator {
    /// Starts a handshake; `nonce` must be fresh random bytes.
    pub fn start(secret: ClusterSecret, role: Role, nonce: [u8; 32]) -> (Self, HandshakeMsg) {
        (Initiator { secret, role, nonce }, HandshakeMsg::Hello { role, nonce })
    }

    /// Checks the responder's proof; on success returns our proof to send, the session key
    /// and the responder's role.
    pub fn on_challenge(self, msg: &HandshakeMsg) -> Result<(HandshakeMsg, SessionKey, Role), WireError> {
        let (peer, nr, proof) = match msg {
            HandshakeMsg::Challenge { role, nonce, proof } => (*role, nonce, proof),
            HandshakeMsg::Refused(code) => return Err(WireError::Refused(*code)),
            _ => return Err(WireError::Malformed("expected a challenge")),
        };
        if ct_eq32(nr, &self.nonce) {
            return Err(WireError::NonceReuse);
        }
        let key = self.secret.auth_key();
        if !verify(&key, &transcript(b"responder", self.role, peer, &self.nonce, nr), proof) {
            return Err(WireError::BadProof);
        }
        let mine = mac(&key, &transcript(b"initiator", self.role, peer, &self.nonce, nr));
        let session = session_key(&self.secret, self.role, peer, &self.nonce, nr);
        Ok((HandshakeMsg::Proof { proof: mine }, session, peer))
    }
}

/// The side that accepts the connection, after sending its [`HandshakeMsg::Challenge`].
#[derive(Debug)]
pub struct Responder {
    secret: ClusterSecret,
    role: Role,
    peer: Role,
    peer_nonce: [u8; 32],
    nonce: [u8; 32],
}

impl Responder {
    /// Answers a hello with our challenge and proof; `nonce` must be fresh random bytes.
    pub fn on_hello(
        secret: ClusterSecret,
        role: Role,
        nonce: [u8; 32],
        msg: &HandshakeMsg,
    ) -> Result<(Self, HandshakeMsg), WireError> {
        let (peer, ni) = match msg {
            HandshakeMsg::Hello { role, nonce } => (*role, *nonce),
            _ => return Err(WireError::Malformed("expected a hello")),
        };
        if ct_eq32(&ni, &nonce) {
            return Err(WireError::NonceReuse);
        }
        let proof = mac(&secret.auth_key(), &transcript(b"responder", peer, role, &ni, &nonce));
        let challenge = HandshakeMsg::Challenge { role, nonce, proof };
        Ok((Responder { secret, role, peer, peer_nonce: ni, nonce }, challenge))
    }

    /// Checks the initiator's proof; on success the session key and the initiator's role.
    pub fn on_proof(self, msg: &HandshakeMsg) -> Result<(SessionKey, Role), WireError> {
        let proof = match msg {
            HandshakeMsg::Proof { proof } => proof,
            HandshakeMsg::Refused(code) => return Err(WireError::Refused(*code)),
            _ => return Err(WireError::Malformed("expected a proof")),
        };
        let t = transcript(b"initiator", self.peer, self.role, &self.peer_nonce, &self.nonce);
        if !verify(&self.secret.auth_key(), &t, proof) {
            return Err(WireError::BadProof);
        }
        Ok((session_key(&self.secret, self.peer, self.role, &self.peer_nonce, &self.nonce), self.peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::from_passphrase(b"correct horse battery staple")
    }

    /// A side's session key and the peer role it authenticated.
    type Outcome = (SessionKey, Role);

    /// Runs a whole handshake through the codec; returns both sides' outcomes.
    fn handshake(
        si: ClusterSecret,
        sr: ClusterSecret,
        ni: [u8; 32],
        nr: [u8; 32],
    ) -> Result<(Outcome, Outcome), WireError> {
        let wire = |m: &HandshakeMsg| HandshakeMsg::decode(&m.encode());
        let (init, hello) = Initiator::start(si, Role::Prefill, ni);
        let (resp, challenge) = Responder::on_hello(sr, Role::Decode, nr, &wire(&hello)?)?;
        let (proof, ki, peer_of_i) = init.on_challenge(&wire(&challenge)?)?;
        let (kr, peer_of_r) = resp.on_proof(&wire(&proof)?)?;
        Ok(((ki, peer_of_i), (kr, peer_of_r)))
    }

    fn info() -> PairingInfo {
        let layout = KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: KvDtype::F16 };
        PairingInfo::new([5; 32], &layout).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn nodes_sharing_the_secret_authenticate_and_agree_on_a_session_key() {
        let ((ki, pi), (kr, pr)) = handshake(secret(), secret(), [1; 32], [2; 32]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ki, kr);
        assert_eq!((pi, pr), (Role::Decode, Role::Prefill));
        let ((other, _), _) = handshake(secret(), secret(), [1; 32], [3; 32]).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(ki, other, "fresh nonces give a fresh session key");
    }

    #[test]
    fn responder_without_the_secret_fails_the_initiator_with_bad_proof() {
        let wrong = ClusterSecret::from_passphrase(b"guess");
        assert_eq!(handshake(secret(), wrong, [1; 32], [2; 32]).err(), Some(WireError::BadProof));
    }

    #[test]
    fn initiator_without_the_secret_fails_the_responder_with_bad_proof() {
        let (resp, _) = Responder::on_hello(
            secret(),
            Role::Decode,
            [2; 32],
            &HandshakeMsg::Hello { role: Role::Prefill, nonce: [1; 32] },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // What an initiator holding another secret would compute.
        let guess = ClusterSecret::from_passphrase(b"guess").auth_key();
        let proof = mac(&guess, &transcript(b"initiator", Role::Prefill, Role::Decode, &[1; 32], &[2; 32]));
        assert_eq!(resp.on_proof(&HandshakeMsg::Proof { proof }).err(), Some(WireError::BadProof));
    }

    #[test]
    fn proof_replayed_into_a_session_with_a_fresh_nonce_is_refused() {
        let hello = HandshakeMsg::Hello { role: Role::Prefill, nonce: [1; 32] };
        let (init, _) = Initiator::start(secret(), Role::Prefill, [1; 32]);
        let (resp, challenge) =
            Responder::on_hello(secret(), Role::Decode, [2; 32], &hello).unwrap_or_else(|e| panic!("{e}"));
        let (old_proof, _, _) = init.on_challenge(&challenge).unwrap_or_else(|e| panic!("{e}"));
        assert!(resp.on_proof(&old_proof).is_ok());
        let (fresh, _) = Responder::on_hello(secret(), Role::Decode, [3; 32], &hello).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fresh.on_proof(&old_proof).err(), Some(WireError::BadProof));
    }

    #[test]
    fn any_flipped_byte_of_a_challenge_fails_the_initiator() {
        let (_, hello) = Initiator::start(secret(), Role::Prefill, [1; 32]);
        let (_, challenge) =
            Responder::on_hello(secret(), Role::Decode, [2; 32], &hello).unwrap_or_else(|e| panic!("{e}"));
        let bytes = challenge.encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x02;
            let (init, _) = Initiator::start(secret(), Role::Prefill, [1; 32]);
            let outcome = HandshakeMsg::decode(&b).and_then(|m| init.on_challenge(&m));
            assert!(outcome.is_err(), "byte {i}");
        }
    }

    #[test]
    fn echoed_nonce_is_refused_on_both_sides() {
        let hello = HandshakeMsg::Hello { role: Role::Prefill, nonce: [1; 32] };
        assert_eq!(Responder::on_hello(secret(), Role::Decode, [1; 32], &hello).err(), Some(WireError::NonceReuse));
        let (init, _) = Initiator::start(secret(), Role::Prefill, [1; 32]);
        let echo = HandshakeMsg::Challenge { role: Role::Decode, nonce: [1; 32], proof: [0; 32] };
        assert_eq!(init.on_challenge(&echo).err(), Some(WireError::NonceReuse));
    }

    #[test]
    fn responder_proof_cannot_be_reflected_as_the_initiator_proof() {
        let hello = HandshakeMsg::Hello { role: Role::Prefill, nonce: [1; 32] };
        let (resp, challenge) =
            Responder::on_hello(secret(), Role::Decode, [2; 32], &hello).unwrap_or_else(|e| panic!("{e}"));
        let HandshakeMsg::Challenge { proof, .. } = challenge else { panic!("not a challenge") };
        assert_eq!(resp.on_proof(&HandshakeMsg::Proof { proof }).err(), Some(WireError::BadProof));
    }

    #[test]
    fn refusal_from_the_peer_is_reported() {
        let (init, _) = Initiator::start(secret(), Role::Gateway, [1; 32]);
        let refused = HandshakeMsg::decode(&HandshakeMsg::Refused(RefusalCode::Version).encode());
        assert_eq!(refused, Ok(HandshakeMsg::Refused(RefusalCode::Version)));
        assert_eq!(
            init.on_challenge(&HandshakeMsg::Refused(RefusalCode::Version)).err(),
            Some(WireError::Refused(RefusalCode::Version))
        );
    }

    #[test]
    fn pairing_succeeds_between_identical_nodes() {
        let key = SessionKey([7; 32]);
        let msg = HandshakeMsg::decode(&info().seal(Role::Prefill, &key).encode()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(info().open_and_check(&msg, Role::Prefill, &key), Ok(info()));
    }

    #[test]
    fn pairing_refuses_naming_each_mismatch() {
        let key = SessionKey([7; 32]);
        let mut cases = Vec::new();
        let mut t = info();
        t.model_digest[0] ^= 1;
        cases.push((t, PairingMismatch::ModelDigest));
        let mut t = info();
        t.page_size = 32;
        cases.push((t, PairingMismatch::PageSize { ours: 16, theirs: 32 }));
        let mut t = info();
        t.kv_dtype = KvDtype::F32;
        cases.push((t, PairingMismatch::KvDtype { ours: KvDtype::F16, theirs: KvDtype::F32 }));
        let mut t = info();
        t.layout.n_kv_heads = 4;
        cases.push((t, PairingMismatch::Layout { ours: info().layout, theirs: t.layout }));
        for (theirs, want) in cases {
            assert_eq!(info().check(&theirs), Err(want));
            let msg = theirs.seal(Role::Decode, &key);
            assert_eq!(info().open_and_check(&msg, Role::Decode, &key), Err(WireError::Pairing(want)));
            let code = HandshakeMsg::Refused(want.code());
            assert_eq!(HandshakeMsg::decode(&code.encode()), Ok(code));
        }
    }

    #[test]
    fn pairing_message_forged_reflected_or_tampered_is_refused() {
        let key = SessionKey([7; 32]);
        let msg = info().seal(Role::Decode, &key);
        assert_eq!(info().open_and_check(&msg, Role::Decode, &SessionKey([8; 32])), Err(WireError::BadMac));
        assert_eq!(info().open_and_check(&msg, Role::Prefill, &key), Err(WireError::BadMac));
        let mut bytes = msg.encode();
        let at = bytes.len() - 40;
        bytes[at] ^= 1;
        let tampered = HandshakeMsg::decode(&bytes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(info().open_and_check(&tampered, Role::Decode, &key), Err(WireError::BadMac));
    }

    #[test]
    fn handshake_messages_round_trip_and_refuse_truncation_and_other_versions() {
        let msgs = [
            HandshakeMsg::Hello { role: Role::Gateway, nonce: [1; 32] },
            HandshakeMsg::Challenge { role: Role::Decode, nonce: [2; 32], proof: [3; 32] },
            HandshakeMsg::Proof { proof: [4; 32] },
            info().seal(Role::Prefill, &SessionKey([1; 32])),
            HandshakeMsg::Refused(RefusalCode::Layout),
        ];
        for m in msgs {
            let bytes = m.encode();
            assert!(bytes.len() <= MAX_HANDSHAKE_MSG);
            assert_eq!(HandshakeMsg::decode(&bytes), Ok(m));
            for n in 0..bytes.len() {
                assert!(matches!(HandshakeMsg::decode(&bytes[..n]), Err(WireError::Truncated { .. })));
            }
            let mut v2 = bytes.clone();
            v2[8] = 2;
            assert!(matches!(HandshakeMsg::decode(&v2), Err(WireError::BadVersion { got: 2, .. })));
        }
    }

    #[test]
    fn secrets_and_session_keys_never_print() {
        assert!(!format!("{:?}", ClusterSecret::from_bytes([0xcd; 32])).contains("cd"));
        assert!(!format!("{:?}", SessionKey([0xcd; 32])).contains("cd"));
    }

    fn arb_role() -> impl Strategy<Value = Role> {
        prop_oneof![Just(Role::Gateway), Just(Role::Prefill), Just(Role::Decode)]
    }

    /// Any message a peer without the secret could send: every kind, arbitrary fields, and the
    /// nonces both sides use here among the candidates so echoes are tried too.
    fn arb_msg() -> impl Strategy<Value = HandshakeMsg> {
        let bytes32 = prop_oneof![Just([1u8; 32]), Just([2u8; 32]), any::<[u8; 32]>()];
        let info =
            (bytes32.clone(), any::<u32>(), any::<bool>(), any::<[u32; 3]>()).prop_map(|(d, ps, f32, l)| PairingInfo {
                model_digest: d,
                page_size: ps,
                kv_dtype: if f32 { KvDtype::F32 } else { KvDtype::F16 },
                layout: LayoutShape { n_layers: l[0], n_kv_heads: l[1], head_dim: l[2] },
            });
        prop_oneof![
            (arb_role(), bytes32.clone()).prop_map(|(role, nonce)| HandshakeMsg::Hello { role, nonce }),
            (arb_role(), bytes32.clone(), any::<[u8; 32]>()).prop_map(|(role, nonce, proof)| HandshakeMsg::Challenge {
                role,
                nonce,
                proof
            }),
            any::<[u8; 32]>().prop_map(|proof| HandshakeMsg::Proof { proof }),
            (arb_role(), info, any::<[u8; 32]>()).prop_map(|(role, info, mac)| HandshakeMsg::Pairing {
                role,
                info,
                mac
            }),
            (1u8..=6).prop_map(|c| HandshakeMsg::Refused(RefusalCode::from_u8(c).unwrap_or(RefusalCode::BadProof))),
        ]
    }

    /// Drives every state machine with `msg` where a peer could send it; none may panic, and
    /// none may accept a message that needs the secret or the session key.
    fn drive(msg: &HandshakeMsg) -> Result<(), TestCaseError> {
        let (init, hello) = Initiator::start(secret(), Role::Prefill, [1; 32]);
        prop_assert!(init.on_challenge(msg).is_err(), "initiator accepted {:?}", msg);
        match Responder::on_hello(secret(), Role::Decode, [2; 32], msg) {
            Ok((_, challenge)) => {
                let HandshakeMsg::Hello { nonce, .. } = msg else { return Err(TestCaseError::fail("not a hello")) };
                prop_assert_ne!(nonce, &[2u8; 32]);
                let is_challenge = matches!(challenge, HandshakeMsg::Challenge { .. });
                prop_assert!(is_challenge);
            }
            Err(_) => {
                let fresh_hello = matches!(msg, HandshakeMsg::Hello { nonce, .. } if nonce != &[2u8; 32]);
                prop_assert!(!fresh_hello, "fresh hello refused");
            }
        }
        let (resp, _) = Responder::on_hello(secret(), Role::Decode, [2; 32], &hello)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(resp.on_proof(msg).is_err(), "responder accepted {:?}", msg);
        prop_assert!(info().open_and_check(msg, Role::Prefill, &SessionKey([7; 32])).is_err());
        Ok(())
    }

    proptest! {
        #[test]
        fn arbitrary_messages_never_panic_nor_authenticate_the_state_machines(msg in arb_msg()) {
            drive(&msg)?;
            prop_assert_eq!(HandshakeMsg::decode(&msg.encode()), Ok(msg));
        }

        #[test]
        fn arbitrary_bytes_that_parse_never_authenticate(bytes in proptest::collection::vec(any::<u8>(), 0..300), kind in 1u8..=5) {
            // A valid header with an arbitrary body, so that some inputs parse.
            let mut framed = ((7 + bytes.len()) as u32).to_le_bytes().to_vec();
            framed.extend_from_slice(&HANDSHAKE_MAGIC);
            framed.extend_from_slice(&WIRE_VERSION.to_le_bytes());
            framed.push(kind);
            framed.extend_from_slice(&bytes);
            for input in [&bytes, &framed] {
                if let Ok(m) = HandshakeMsg::decode(input) {
                    drive(&m)?;
                }
            }
        }

        #[test]
        fn mutated_genuine_messages_never_authenticate(flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4)) {
            let (init, hello) = Initiator::start(secret(), Role::Prefill, [1; 32]);
            let (resp, challenge) = Responder::on_hello(secret(), Role::Decode, [2; 32], &hello)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let (proof, key, _) = Initiator::start(secret(), Role::Prefill, [1; 32]).0.on_challenge(&challenge)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let pairing = info().seal(Role::Prefill, &key);
            // Flips that cancel out leave the genuine message: nothing to refuse.
            let mutate = |m: &HandshakeMsg| {
                let genuine = m.encode();
                let mut b = genuine.clone();
                for (at, x) in &flips {
                    b[at.index(genuine.len())] ^= x;
                }
                if b == genuine { Err(WireError::Malformed("unchanged")) } else { HandshakeMsg::decode(&b) }
            };
            if let Ok(m) = mutate(&challenge) {
                prop_assert!(init.on_challenge(&m).is_err());
            }
            if let Ok(m) = mutate(&proof) {
                prop_assert!(resp.on_proof(&m).is_err());
            }
            if let Ok(m) = mutate(&pairing) {
                prop_assert!(info().open_and_check(&m, Role::Prefill, &key).is_err());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_handshake_parser(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = HandshakeMsg::decode(&bytes);
        }

        #[test]
        fn arbitrary_bodies_behind_a_valid_header_never_panic(kind in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..120)) {
            let mut bytes = ((7 + body.len()) as u32).to_le_bytes().to_vec();
            bytes.extend_from_slice(&HANDSHAKE_MAGIC);
            bytes.extend_from_slice(&WIRE_VERSION.to_le_bytes());
            bytes.push(kind);
            bytes.extend_from_slice(&body);
            if let Ok(m) = HandshakeMsg::decode(&bytes) {
                prop_assert_eq!(m.encode(), bytes);
            }
        }
    }
}
