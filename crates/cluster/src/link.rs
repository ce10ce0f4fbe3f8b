//! An authenticated link between two nodes: the cluster-secret handshake and pairing check of
//! the `wire` crate over a byte stream, then either control messages (JSON, each sealed with
//! the session key, a direction and a counter, so nothing can be forged, replayed, reordered
//! or reflected) or, on a KV connection, raw `wire` frames (which carry their own per-ticket
//! MACs).

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use wire::{
    ClusterSecret, HandshakeMsg, Initiator, PairingInfo, Responder, Role, SessionKey, WireError, MAX_HANDSHAKE_MSG,
};

use crate::net::BoxIo;
use crate::{random, ClusterError};

/// The most a control message may take (a prompt of a full context window is ~100 KB).
pub const MAX_CONTROL_MSG: usize = 8 << 20;
const TAG: usize = 32;

/// Who this node is, as its peers check it.
#[derive(Clone)]
pub struct Identity {
    pub secret: ClusterSecret,
    pub role: Role,
    pub pairing: PairingInfo,
}

/// A handshaken, paired connection.
pub struct Link {
    io: BoxIo,
    session: SessionKey,
    pub peer: Role,
    initiator: bool,
}

async fn read_hs(io: &mut BoxIo) -> Result<HandshakeMsg, ClusterError> {
    let mut buf = [0u8; MAX_HANDSHAKE_MSG];
    io.read_exact(&mut buf[..4]).await?;
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_HANDSHAKE_MSG - 4 {
        return Err(WireError::Oversized { len: len.saturating_add(4), max: MAX_HANDSHAKE_MSG }.into());
    }
    io.read_exact(&mut buf[4..4 + len]).await?;
    Ok(HandshakeMsg::decode(&buf[..4 + len])?)
}

async fn write_hs(io: &mut BoxIo, msg: &HandshakeMsg) -> Result<(), ClusterError> {
    io.write_all(&msg.encode()).await?;
    io.flush().await?;
    Ok(())
}

/// Tells the peer why we refuse it (best effort) and returns the error.
async fn refuse(io: &mut BoxIo, e: WireError) -> ClusterError {
    let code = match &e {
        WireError::Pairing(m) => Some(m.code()),
        WireError::BadProof => Some(wire::RefusalCode::BadProof),
        WireError::BadVersion { .. } => Some(wire::RefusalCode::Version),
        _ => None,
    };
    if let Some(code) = code {
        let _ = write_hs(io, &HandshakeMsg::Refused(code)).await;
    }
    e.into()
}

impl Link {
    /// Dials side of the handshake.
    pub async fn connect(io: BoxIo, me: &Identity, timeout: Duration) -> Result<Link, ClusterError> {
        tokio::time::timeout(timeout, Self::connect_inner(io, me))
            .await
            .map_err(|_| ClusterError::Timeout("handshaking with a peer"))?
    }

    async fn connect_inner(mut io: BoxIo, me: &Identity) -> Result<Link, ClusterError> {
        let (init, hello) = Initiator::start(me.secret.clone(), me.role, random()?);
        write_hs(&mut io, &hello).await?;
        let challenge = read_hs(&mut io).await?;
        let (proof, session, peer) = match init.on_challenge(&challenge) {
            Ok(x) => x,
            Err(e) => return Err(refuse(&mut io, e).await),
        };
        write_hs(&mut io, &proof).await?;
        write_hs(&mut io, &me.pairing.seal(me.role, &session)).await?;
        let theirs = read_hs(&mut io).await?;
        if let Err(e) = me.pairing.open_and_check(&theirs, peer, &session) {
            return Err(refuse(&mut io, e).await);
        }
        Ok(Link { io, session, peer, initiator: true })
    }

    /// Listening side of the handshake.
    pub async fn accept(io: BoxIo, me: &Identity, timeout: Duration) -> Result<Link, ClusterError> {
        tokio::time::timeout(timeout, Self::accept_inner(io, me))
            .await
            .map_err(|_| ClusterError::Timeout("handshaking with a peer"))?
    }

    async fn accept_inner(mut io: BoxIo, me: &Identity) -> Result<Link, ClusterError> {
        let hello = read_hs(&mut io).await?;
        let (resp, challenge) = match Responder::on_hello(me.secret.clone(), me.role, random()?, &hello) {
            Ok(x) => x,
            Err(e) => return Err(refuse(&mut io, e).await),
        };
        write_hs(&mut io, &challenge).await?;
        let proof = read_hs(&mut io).await?;
        let (session, peer) = match resp.on_proof(&proof) {
            Ok(x) => x,
            Err(e) => return Err(refuse(&mut io, e).await),
        };
        let theirs = read_hs(&mut io).await?;
        if let Err(e) = me.pairing.open_and_check(&theirs, peer, &session) {
            return Err(refuse(&mut io, e).await);
        }
        write_hs(&mut io, &me.pairing.seal(me.role, &session)).await?;
        Ok(Link { io, session, peer, initiator: false })
    }

    /// Control-message halves.
    pub fn split(self) -> (LinkReader, LinkWriter) {
        let (rd, wr) = tokio::io::split(self.io);
        // Each direction has its own label, so a message cannot be reflected back.
        let (mine, theirs) = if self.initiator { (1u8, 2u8) } else { (2, 1) };
        (
            LinkReader { rd, key: *self.session.bytes(), dir: theirs, counter: 0 },
            LinkWriter { wr, key: *self.session.bytes(), dir: mine, counter: 0 },
        )
    }

    /// The raw stream, for KV frames (self-authenticating under their ticket keys).
    pub fn into_io(self) -> BoxIo {
        self.io
    }
}

/// `blake3::Hash` compares in constant time.
fn tag(key: &[u8; 32], dir: u8, counter: u64, body: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(&[dir]);
    h.update(&counter.to_le_bytes());
    h.update(body);
    h.finalize()
}

pub struct LinkReader {
    rd: ReadHalf<BoxIo>,
    key: [u8; 32],
    dir: u8,
    counter: u64,
}

pub struct LinkWriter {
    wr: WriteHalf<BoxIo>,
    key: [u8; 32],
    dir: u8,
    counter: u64,
}

impl LinkReader {
    /// The next message; `None` when the peer closed the link cleanly between messages.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ClusterError> {
        let mut len = [0u8; 4];
        match self.rd.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_le_bytes(len) as usize;
        if !(TAG..=MAX_CONTROL_MSG).contains(&len) {
            return Err(WireError::Oversized { len, max: MAX_CONTROL_MSG }.into());
        }
        let mut buf = vec![0u8; len];
        self.rd.read_exact(&mut buf).await?;
        let (body, t) = buf.split_at(len - TAG);
        let got: [u8; TAG] = t.try_into().map_err(|_| WireError::BadMac)?;
        if tag(&self.key, self.dir, self.counter, body) != got {
            return Err(WireError::BadMac.into());
        }
        self.counter += 1;
        serde_json::from_slice(body).map(Some).map_err(|e| ClusterError::Message(e.to_string()))
    }
}

impl LinkWriter {
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), ClusterError> {
        let body = serde_json::to_vec(msg).map_err(|e| ClusterError::Message(e.to_string()))?;
        let len = body.len() + TAG;
        if len > MAX_CONTROL_MSG {
            return Err(WireError::Oversized { len, max: MAX_CONTROL_MSG }.into());
        }
        let t = tag(&self.key, self.dir, self.counter, &body);
        self.counter += 1;
        let mut out = Vec::with_capacity(4 + len);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(t.as_bytes());
        self.wr.write_all(&out).await?;
        self.wr.flush().await?;
        Ok(())
    }
}
