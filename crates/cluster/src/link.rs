//! An authenticated, encrypted link between two nodes: the `wire` crate's Noise key exchange
//! and pairing check over a byte stream, then AES-256-GCM records whose nonces are counters
//! kept by both ends. On a control link the records carry JSON control messages; on a KV link
//! they carry `wire` KV frames, whose bodies are sealed again under the ticket's AEGIS-128X2
//! key ([`Link::into_kv_sealer`], [`Link::into_kv_opener`]). Nothing
//! after the first two handshake messages is readable on the network, and nothing can be
//! forged, replayed, reordered, dropped or reflected without failing the link.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use wire::{
    ClusterSecret, Exporter, HandshakeMsg, Initiator, KvOpener, KvSealer, NodePublicKey, PairingInfo, RecordOpener,
    RecordSealer, RefusalCode, Responder, Role, WireError, AEAD_TAG_LEN, DEFAULT_MAX_FRAME, MAX_HANDSHAKE_MSG,
};

use crate::net::BoxIo;
use crate::secrets::SecretRing;
use crate::ClusterError;

/// The most a control message may take (a prompt of a full context window is ~100 KB).
pub const MAX_CONTROL_MSG: usize = 8 << 20;

/// The most a record of the handshake (a pairing or a refusal) may take: read before the
/// peer is authenticated, its length is only a claim, so it gets room for a handshake
/// message and no more.
const MAX_HANDSHAKE_RECORD: usize = MAX_HANDSHAKE_MSG + AEAD_TAG_LEN;

/// How long a listener waits for a connection to authenticate (its pairing record opening
/// under the session key: it is live and holds the secret), when the handshake timeout is
/// longer. A real node needs one round trip and two Diffie-Hellmans; a connection that sends
/// nothing frees its slot after this.
pub const PREAUTH_TIMEOUT: Duration = Duration::from_secs(3);

/// Who this node is, as its peers check it.
#[derive(Clone, Debug)]
pub struct Identity {
    pub secrets: SecretRing,
    pub role: Role,
    pub pairing: PairingInfo,
}

/// A handshaken, paired, encrypted connection.
pub struct Link {
    io: BoxIo,
    sealer: RecordSealer,
    opener: RecordOpener,
    exporter: Exporter,
    pub peer: Role,
    /// The cluster secret the handshake proved: the link lives only while it is accepted.
    secret: ClusterSecret,
    /// The peer's static key the handshake proved: the link lives only while it is trusted.
    peer_key: NodePublicKey,
}

async fn read_clear(io: &mut BoxIo) -> Result<HandshakeMsg, ClusterError> {
    let mut buf = [0u8; MAX_HANDSHAKE_MSG];
    io.read_exact(&mut buf[..4]).await?;
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_HANDSHAKE_MSG - 4 {
        return Err(WireError::Oversized { len: len.saturating_add(4), max: MAX_HANDSHAKE_MSG }.into());
    }
    io.read_exact(&mut buf[4..4 + len]).await?;
    Ok(HandshakeMsg::decode(&buf[..4 + len])?)
}

async fn write_clear(io: &mut BoxIo, msg: &HandshakeMsg) -> Result<(), ClusterError> {
    io.write_all(&msg.encode()).await?;
    io.flush().await?;
    Ok(())
}

/// One record: `len u32 LE | ciphertext | tag`, the length authenticated as associated data.
async fn write_record<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    sealer: &mut RecordSealer,
    mut body: Vec<u8>,
) -> Result<(), ClusterError> {
    let len = body.len() + AEAD_TAG_LEN;
    if len > MAX_CONTROL_MSG {
        return Err(WireError::Oversized { len, max: MAX_CONTROL_MSG }.into());
    }
    let prefix = (len as u32).to_le_bytes();
    let tag = sealer.seal(&prefix, &mut body)?;
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&prefix);
    out.extend_from_slice(&body);
    out.extend_from_slice(&tag);
    w.write_all(&out).await?;
    w.flush().await?;
    Ok(())
}

/// The next record's plaintext; `None` when the peer closed cleanly between records.
async fn read_record<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    opener: &mut RecordOpener,
) -> Result<Option<Vec<u8>>, ClusterError> {
    read_record_within(r, opener, MAX_CONTROL_MSG).await
}

/// [`read_record`] of a record of at most `max` bytes: a longer claim is refused before
/// anything is allocated or read.
async fn read_record_within<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    opener: &mut RecordOpener,
    max: usize,
) -> Result<Option<Vec<u8>>, ClusterError> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if !(AEAD_TAG_LEN..=max).contains(&len) {
        return Err(WireError::Oversized { len, max }.into());
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    let (body, tag) = buf.split_at_mut(len - AEAD_TAG_LEN);
    opener.open(&prefix, body, tag)?;
    buf.truncate(len - AEAD_TAG_LEN);
    Ok(Some(buf))
}

/// The handshake's outcome on the responder: reply, keys, the peer's role and static key, and
/// the secret it proved.
type Answered = (HandshakeMsg, wire::SessionKeys, Role, NodePublicKey, ClusterSecret);

/// [`Responder::on_hello`] with each accepted secret in turn, so the link knows which one the
/// peer proved (the same tries, in the same order, as handing it the whole list).
fn answer_hello(me: &Identity, hello: &HandshakeMsg) -> Result<Answered, WireError> {
    let ring = &me.secrets;
    let trusts = |k: &NodePublicKey| ring.trusts(k);
    for secret in ring.accepted() {
        match Responder::on_hello(std::slice::from_ref(&secret), ring.node_key(), me.role, hello, &trusts) {
            Ok((reply, keys, peer, key)) => return Ok((reply, keys, peer, key, secret)),
            Err(WireError::BadProof) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(WireError::BadProof)
}

/// The refusal code to tell a peer for a handshake error, if it may be told.
fn refusal(e: &WireError) -> Option<RefusalCode> {
    match e {
        WireError::Pairing(m) => Some(m.code()),
        WireError::BadProof => Some(RefusalCode::BadProof),
        WireError::BadVersion { .. } => Some(RefusalCode::Version),
        WireError::Reflection { .. } => Some(RefusalCode::Reflection),
        WireError::UntrustedNode(_) => Some(RefusalCode::Untrusted),
        _ => None,
    }
}

impl Link {
    /// Dialling side of the handshake.
    pub async fn connect(io: BoxIo, me: &Identity, timeout: Duration) -> Result<Link, ClusterError> {
        tokio::time::timeout(timeout, Self::connect_inner(io, me))
            .await
            .map_err(|_| ClusterError::Timeout("handshaking with a peer"))?
    }

    async fn connect_inner(mut io: BoxIo, me: &Identity) -> Result<Link, ClusterError> {
        let ring = &me.secrets;
        let secret = ring.current();
        let (init, hello) = Initiator::start(&secret, ring.node_key(), me.role)?;
        write_clear(&mut io, &hello).await?;
        let reply = read_clear(&mut io).await?;
        // A failed key exchange (or an untrusted responder) leaves no key to tell the peer
        // anything under: just close.
        let (keys, peer, peer_key) = init.on_reply(&reply, &|k: &NodePublicKey| ring.trusts(k))?;
        let (mut sealer, mut opener, exporter) = keys.into_parts()?;
        // Our pairing record proves to the responder that we are live and hold the secret.
        write_record(&mut io, &mut sealer, HandshakeMsg::Pairing { role: me.role, info: me.pairing }.encode()).await?;
        let theirs = read_record_within(&mut io, &mut opener, MAX_HANDSHAKE_RECORD)
            .await?
            .ok_or(ClusterError::Message("the peer closed the link during the handshake".into()))?;
        let checked = match HandshakeMsg::decode(&theirs)? {
            HandshakeMsg::Pairing { role, info } if role == peer => me.pairing.check(&info).map_err(WireError::Pairing),
            HandshakeMsg::Refused(code) => Err(WireError::Refused(code)),
            _ => Err(WireError::Malformed("expected the peer's pairing")),
        };
        if let Err(e) = checked {
            if let Some(code) = refusal(&e) {
                let _ = write_record(&mut io, &mut sealer, HandshakeMsg::Refused(code).encode()).await;
            }
            return Err(e.into());
        }
        Ok(Link { io, sealer, opener, exporter, peer, secret, peer_key })
    }

    /// Listening side of the handshake, for a peer of any role but ours.
    pub async fn accept(io: BoxIo, me: &Identity, timeout: Duration) -> Result<Link, ClusterError> {
        Self::accept_from(io, me, &[Role::Gateway, Role::Prefill, Role::Decode], timeout).await
    }

    /// Listening side of the handshake, for a peer of one of `roles` only: a peer of another
    /// role (which proved the secret) is told `Refused(Role)` inside the link, and this side
    /// gets [`ClusterError::WrongRole`]. A peer of our own role is a `Reflection` either way.
    pub async fn accept_from(
        io: BoxIo,
        me: &Identity,
        roles: &[Role],
        timeout: Duration,
    ) -> Result<Link, ClusterError> {
        Ok(Self::accept_among(io, me, &[me.pairing], roles, timeout).await?.0)
    }

    /// [`Link::accept_from`] for a listener that serves several models: the peer's pairing
    /// must match one of `pairings` (in practice, its model file's digest picks one; then page
    /// size, dtype and layout must agree with it). Returns the link and which one matched; we
    /// answer with that pairing.
    pub async fn accept_among(
        io: BoxIo,
        me: &Identity,
        pairings: &[PairingInfo],
        roles: &[Role],
        timeout: Duration,
    ) -> Result<(Link, usize), ClusterError> {
        let preauth = timeout.min(PREAUTH_TIMEOUT);
        tokio::time::timeout(timeout, Self::accept_inner(io, me, pairings, roles, preauth))
            .await
            .map_err(|_| ClusterError::Timeout("handshaking with a peer"))?
    }

    async fn accept_inner(
        mut io: BoxIo,
        me: &Identity,
        pairings: &[PairingInfo],
        roles: &[Role],
        preauth: Duration,
    ) -> Result<(Link, usize), ClusterError> {
        // Until its first record opens the peer is anyone who reached the port: it gets a
        // shorter deadline than the whole handshake, and room for handshake messages only.
        let (mut sealer, opener, exporter, peer, secret, peer_key, theirs) =
            tokio::time::timeout(preauth, Self::unauthenticated(&mut io, me))
                .await
                .map_err(|_| ClusterError::PreauthTimeout(preauth))??;
        let checked = match HandshakeMsg::decode(&theirs)? {
            HandshakeMsg::Pairing { role, info } if role == peer => {
                // The pairing of the same model file decides; with none, the first one's
                // mismatch is the reason given.
                let index = pairings.iter().position(|p| p.model_digest == info.model_digest).unwrap_or(0);
                match pairings.get(index) {
                    Some(p) => p.check(&info).map(|()| index).map_err(WireError::Pairing),
                    None => Err(WireError::Malformed("no pairing to check against")),
                }
            }
            _ => Err(WireError::Malformed("expected the peer's pairing")),
        };
        let index = match checked {
            Ok(i) => i,
            Err(e) => {
                if let Some(code) = refusal(&e) {
                    let _ = write_record(&mut io, &mut sealer, HandshakeMsg::Refused(code).encode()).await;
                }
                return Err(e.into());
            }
        };
        // The role is checked only now, once the peer proved it holds the secret and is live:
        // an unauthenticated peer learns nothing about which roles we take.
        if !roles.contains(&peer) {
            let _ = write_record(&mut io, &mut sealer, HandshakeMsg::Refused(RefusalCode::Role).encode()).await;
            return Err(ClusterError::WrongRole { got: peer, want: roles.to_vec() });
        }
        write_record(&mut io, &mut sealer, HandshakeMsg::Pairing { role: me.role, info: pairings[index] }.encode())
            .await?;
        Ok((Link { io, sealer, opener, exporter, peer, secret, peer_key }, index))
    }

    /// The cluster secret this link was made with.
    pub fn secret(&self) -> &ClusterSecret {
        &self.secret
    }

    /// The peer's node key, as its handshake proved it.
    pub fn peer_key(&self) -> NodePublicKey {
        self.peer_key
    }

    /// The responder's steps before the peer is authenticated: the hello, our reply, and the
    /// initiator's first record (bounded to a handshake message), which only a live holder of
    /// the secret can seal. Returns the session's halves, the peer's role and that record.
    async fn unauthenticated(
        io: &mut BoxIo,
        me: &Identity,
    ) -> Result<(RecordSealer, RecordOpener, Exporter, Role, ClusterSecret, NodePublicKey, Vec<u8>), ClusterError> {
        let answered = match read_clear(io).await {
            Ok(hello) => answer_hello(me, &hello),
            Err(ClusterError::Wire(e)) => Err(e),
            Err(e) => return Err(e),
        };
        let (reply, keys, peer, peer_key, secret) = match answered {
            Ok(x) => x,
            Err(e) => {
                // In clear: there is no shared key. It tells a misconfigured node why, and
                // tells an attacker nothing it did not know.
                if let Some(code) = refusal(&e) {
                    let _ = write_clear(io, &HandshakeMsg::Refused(code)).await;
                }
                return Err(e.into());
            }
        };
        write_clear(io, &reply).await?;
        let (sealer, mut opener, exporter) = keys.into_parts()?;
        // Only this record proves the initiator live: a replayed hello gets no further, and
        // whatever length it claims gets no more room than a pairing record needs.
        let theirs = read_record_within(io, &mut opener, MAX_HANDSHAKE_RECORD)
            .await?
            .ok_or(ClusterError::Message("the peer closed the link during the handshake".into()))?;
        Ok((sealer, opener, exporter, peer, secret, peer_key, theirs))
    }

    /// Control-message halves.
    pub fn split(self) -> (LinkReader, LinkWriter) {
        let (rd, wr) = tokio::io::split(self.io);
        (LinkReader { rd, opener: self.opener }, LinkWriter { wr, sealer: self.sealer })
    }

    /// The stream and the sealer of KV frames, for the sending end of a KV link.
    pub fn into_kv_sealer(self) -> (BoxIo, KvSealer) {
        (self.io, KvSealer::from_parts(self.sealer, self.exporter, DEFAULT_MAX_FRAME))
    }

    /// The stream and the opener of KV frames, for the receiving end of a KV link.
    pub fn into_kv_opener(self) -> (BoxIo, KvOpener) {
        (self.io, KvOpener::from_parts(self.opener, self.exporter, DEFAULT_MAX_FRAME))
    }
}

/// Caps the handshakes in progress on one listener, in all and from any one source address:
/// an unauthenticated peer holds a slot only until [`PREAUTH_TIMEOUT`], and one address (one
/// host: an IPv6 /64) only `per_source` of them, so a flood of idle or slow connections from
/// a few hosts can neither starve a node of memory or tasks nor keep other hosts' nodes out.
/// Connections of the in-process transport have no address and meet only the overall cap.
#[derive(Clone, Debug)]
pub struct HandshakeGate(Arc<Gate>);

#[derive(Debug)]
struct Gate {
    max: usize,
    per_source: usize,
    /// Slots held in all, and by source; a source leaves the map with its last slot, so the
    /// map never holds more than `max` entries.
    held: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Handshakes one listener runs at once by default: four sources at their cap.
pub const MAX_PENDING_HANDSHAKES: usize = 4 * MAX_PENDING_HANDSHAKES_PER_SOURCE;

/// Handshakes one source address may have in progress on a listener by default: twice the
/// routes a prefill worker runs at once (the engine's `max_running`, 64), each of which dials
/// the decode worker's KV port, so a real node never meets it.
pub const MAX_PENDING_HANDSHAKES_PER_SOURCE: usize = 128;

/// Why a connection found no handshake slot; both are told `Refused(Busy)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateFull {
    /// The listener's overall cap.
    Listener,
    /// The cap of the connection's source address.
    Source,
}

impl GateFull {
    /// The label for `pagewarden_link_failures_total{reason}`.
    pub fn reason(self) -> &'static str {
        match self {
            GateFull::Listener => "busy",
            GateFull::Source => "busy_source",
        }
    }
}

/// One handshake slot, given back when dropped.
#[derive(Debug)]
pub struct HandshakePermit {
    gate: Arc<Gate>,
    source: Option<IpAddr>,
}

/// The address a source is counted under: an IPv4 address, or the /64 of an IPv6 one (what
/// one host is normally given); an IPv4-mapped IPv6 address counts as its IPv4 address.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

impl HandshakeGate {
    /// A gate of `max` slots, at most `per_source` of them for any one source address.
    pub fn new(max: usize, per_source: usize) -> Self {
        let gate = Gate { max: max.max(1), per_source: per_source.max(1), held: Mutex::default() };
        HandshakeGate(Arc::new(gate))
    }

    /// A slot for one more handshake from `source` (`None`: the in-process transport), held
    /// until the permit drops.
    pub fn try_enter(&self, source: Option<IpAddr>) -> Result<HandshakePermit, GateFull> {
        let source = source.map(source_key);
        let mut held = self.0.held.lock().unwrap_or_else(|e| e.into_inner());
        let (total, by_source) = &mut *held;
        if *total >= self.0.max {
            return Err(GateFull::Listener);
        }
        if let Some(ip) = source {
            let n = by_source.entry(ip).or_insert(0);
            if *n >= self.0.per_source {
                return Err(GateFull::Source);
            }
            *n += 1;
        }
        *total += 1;
        Ok(HandshakePermit { gate: self.0.clone(), source })
    }
}

impl Drop for HandshakePermit {
    fn drop(&mut self) {
        let mut held = self.gate.held.lock().unwrap_or_else(|e| e.into_inner());
        let (total, by_source) = &mut *held;
        *total = total.saturating_sub(1);
        if let Some(ip) = self.source {
            if let Some(n) = by_source.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by_source.remove(&ip);
                }
            }
        }
    }
}

/// Turns a connection away for lack of a handshake slot (in clear, best effort, bounded).
pub async fn refuse_busy(mut io: BoxIo) {
    let _ =
        tokio::time::timeout(Duration::from_secs(1), write_clear(&mut io, &HandshakeMsg::Refused(RefusalCode::Busy)))
            .await;
}

/// The label of a failed handshake or link, for `pagewarden_link_failures_total{reason}`.
pub fn refusal_reason(e: &ClusterError) -> &'static str {
    match e {
        ClusterError::Wire(WireError::BadProof | WireError::Refused(RefusalCode::BadProof)) => "bad_proof",
        ClusterError::Wire(WireError::Reflection { .. }) => "reflection",
        ClusterError::Wire(WireError::UntrustedNode(_) | WireError::Refused(RefusalCode::Untrusted)) => {
            "untrusted_node"
        }
        ClusterError::Wire(WireError::BadVersion { .. } | WireError::Refused(RefusalCode::Version)) => "version",
        ClusterError::Wire(WireError::Pairing(_)) => "pairing",
        ClusterError::Wire(WireError::BadMac) => "bad_mac",
        ClusterError::WrongRole { .. } | ClusterError::Wire(WireError::Refused(RefusalCode::Role)) => "role",
        ClusterError::Wire(WireError::Refused(_)) => "refused",
        ClusterError::PreauthTimeout(_) => "preauth_timeout",
        ClusterError::Wire(WireError::Oversized { .. }) => "oversized",
        ClusterError::Timeout(_) => "timeout",
        ClusterError::Io(_) => "io",
        _ => "malformed",
    }
}

pub struct LinkReader {
    rd: ReadHalf<BoxIo>,
    opener: RecordOpener,
}

pub struct LinkWriter {
    wr: WriteHalf<BoxIo>,
    sealer: RecordSealer,
}

/// A message that opened under the link's keys (so its peer sent it, whole and in order) but
/// does not decode as one: the route it names, if any, fails; the link and every other route on
/// it go on. One request's content must never end a link that other tenants' routes share.
#[derive(Debug)]
pub struct Undecodable {
    pub route: Option<u64>,
    pub reason: String,
}

impl LinkReader {
    /// The next message; `None` when the peer closed the link cleanly between messages.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ClusterError> {
        match read_record(&mut self.rd, &mut self.opener).await? {
            None => Ok(None),
            Some(body) => serde_json::from_slice(&body).map(Some).map_err(|e| ClusterError::Message(e.to_string())),
        }
    }

    /// The next message of an established session, or the [`Undecodable`] one it turned out to
    /// be; `Err` only when the link itself failed (a record that does not open, a lost stream).
    pub async fn recv_routed<T: DeserializeOwned>(&mut self) -> Result<Option<Result<T, Undecodable>>, ClusterError> {
        let Some(body) = read_record(&mut self.rd, &mut self.opener).await? else { return Ok(None) };
        Ok(Some(
            serde_json::from_slice(&body)
                .map_err(|e| Undecodable { route: crate::proto::route_of(&body), reason: e.to_string() }),
        ))
    }
}

impl LinkWriter {
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), ClusterError> {
        let body = serde_json::to_vec(msg).map_err(|e| ClusterError::Message(e.to_string()))?;
        write_record(&mut self.wr, &mut self.sealer, body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
    }

    #[test]
    fn one_source_holds_at_most_its_share_and_never_the_slots_of_another() {
        let gate = HandshakeGate::new(6, 2);
        let a: Vec<_> = (0..2).map(|_| gate.try_enter(ip("10.0.0.1")).unwrap_or_else(|e| panic!("{e:?}"))).collect();
        assert_eq!(gate.try_enter(ip("10.0.0.1")).err(), Some(GateFull::Source));
        // The same host over IPv6-mapped IPv4 is the same source.
        assert_eq!(gate.try_enter(ip("::ffff:10.0.0.1")).err(), Some(GateFull::Source));
        let b = gate.try_enter(ip("10.0.0.2")).unwrap_or_else(|e| panic!("{e:?}"));
        // One IPv6 host is its /64: another address in it is the same source.
        let c = gate.try_enter(ip("2001:db8:1:2::1")).unwrap_or_else(|e| panic!("{e:?}"));
        let _c2 = gate.try_enter(ip("2001:db8:1:2::ffff")).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(gate.try_enter(ip("2001:db8:1:2:abcd::")).err(), Some(GateFull::Source));
        let d = gate.try_enter(ip("10.0.0.3")).unwrap_or_else(|e| panic!("{e:?}"));
        // The listener's cap holds for every source, the in-process transport included.
        assert_eq!(gate.try_enter(ip("10.0.0.4")).err(), Some(GateFull::Listener));
        assert_eq!(gate.try_enter(None).err(), Some(GateFull::Listener));
        drop(c);
        let in_process = gate.try_enter(None).unwrap_or_else(|e| panic!("{e:?}"));
        drop((a, b, d, in_process));
        // Every slot came back: a source may use its whole share again.
        let again: Vec<_> = (0..2).map(|_| gate.try_enter(ip("10.0.0.1"))).collect();
        assert!(again.iter().all(Result::is_ok));
        assert_eq!((GateFull::Listener.reason(), GateFull::Source.reason()), ("busy", "busy_source"));
    }

    #[test]
    fn the_in_process_transport_meets_only_the_listener_cap() {
        let gate = HandshakeGate::new(3, 1);
        let held: Vec<_> = (0..3).map(|_| gate.try_enter(None)).collect();
        assert!(held.iter().all(Result::is_ok));
        assert_eq!(gate.try_enter(None).err(), Some(GateFull::Listener));
    }
}
