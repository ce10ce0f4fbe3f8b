#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Authenticated links over in-memory pipes: the wrong secret or a mismatched pairing gets
//! nothing; a control message changed, replayed or dropped on the way fails the link. Over
//! loopback TCP: what a connection that never authenticates can make a listener hold.

use std::time::Duration;

use cluster::{BoxIo, ClusterError, Identity, Link, Net, SecretRing};
use kv::{KvDtype, KvLayout};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wire::{
    ClusterSecret, HandshakeMsg, Initiator, PairingInfo, RefusalCode, Role, WireError, AEAD_TAG_LEN, NOISE_MSG_LEN,
};

fn identity(secret: &str, role: Role, page_size: usize) -> Identity {
    let layout = KvLayout { n_layers: 2, n_kv_heads: 2, head_dim: 4, page_size, dtype: KvDtype::F16 };
    Identity {
        secrets: SecretRing::single(
            ClusterSecret::from_passphrase(secret.as_bytes()),
            test_key(),
            vec![test_key().identity()],
        ),
        role,
        pairing: PairingInfo::new([7; 32], &layout).unwrap(),
    }
}

const T: Duration = Duration::from_secs(5);

fn pipe() -> (BoxIo, BoxIo) {
    let (a, b) = tokio::io::duplex(1 << 16);
    (Box::new(a), Box::new(b))
}

async fn pair(initiator: Identity, responder: Identity) -> (Result<Link, ClusterError>, Result<Link, ClusterError>) {
    let (a, b) = pipe();
    tokio::join!(Link::connect(a, &initiator, T), Link::accept(b, &responder, T))
}

#[tokio::test]
async fn a_peer_without_the_secret_is_refused_and_gets_no_session() {
    let (i, r) = pair(
        identity("secret-one-0123456789", Role::Prefill, 16),
        identity("secret-two-0123456789", Role::Gateway, 16),
    )
    .await;
    assert!(matches!(i, Err(ClusterError::Wire(WireError::Refused(RefusalCode::BadProof)))), "{:?}", i.err());
    assert!(r.is_err());
}

#[tokio::test]
async fn a_peer_with_another_page_size_is_refused_naming_it() {
    let (i, r) = pair(identity("s-0123456789", Role::Prefill, 16), identity("s-0123456789", Role::Decode, 32)).await;
    // The refusing side names both values (in its error, which it logs); the other learns
    // which field was refused.
    let e = r.err().expect("responder refused").to_string();
    assert!(e.contains("page size") && e.contains("16") && e.contains("32"), "{e}");
    let e = i.err().expect("initiator refused").to_string();
    assert!(e.contains("PageSize"), "{e}");
}

#[tokio::test]
async fn control_messages_round_trip_in_both_directions() {
    let (i, r) = pair(identity("s-0123456789", Role::Decode, 16), identity("s-0123456789", Role::Gateway, 16)).await;
    let (i, r) = (i.unwrap(), r.unwrap());
    assert_eq!((i.peer, r.peer), (Role::Gateway, Role::Decode));
    let ((mut ir, mut iw), (mut rr, mut rw)) = (i.split(), r.split());
    for n in 0..3u32 {
        iw.send(&format!("up {n}")).await.unwrap();
        rw.send(&vec![n; 3]).await.unwrap();
        assert_eq!(rr.recv::<String>().await.unwrap(), Some(format!("up {n}")));
        assert_eq!(ir.recv::<Vec<u32>>().await.unwrap(), Some(vec![n; 3]));
    }
}

/// Bytes the initiator sends during the handshake (Noise hello, pairing record).
fn handshake_bytes() -> usize {
    let hello = HandshakeMsg::Hello([0; NOISE_MSG_LEN]);
    let id = identity("x", Role::Decode, 16);
    let pairing = HandshakeMsg::Pairing { role: Role::Decode, info: id.pairing };
    hello.encode().len() + 4 + pairing.encode().len() + AEAD_TAG_LEN
}

/// A man in the middle on the initiator's direction: relays the handshake, then hands the
/// control bytes that follow to `tamper` before relaying them.
async fn through_mitm(
    tamper: impl Fn(Vec<u8>) -> Vec<u8> + Send + Sync + 'static,
) -> Result<Option<String>, ClusterError> {
    let (a, mut a_mitm) = tokio::io::duplex(1 << 16);
    let (mut b_mitm, b) = tokio::io::duplex(1 << 16);
    let hs = handshake_bytes();
    tokio::spawn(async move {
        let (mut ar, mut aw) = tokio::io::split(&mut a_mitm);
        let (mut br, mut bw) = tokio::io::split(&mut b_mitm);
        let back = async {
            let _ = tokio::io::copy(&mut br, &mut aw).await;
        };
        let fwd = async {
            // Relayed as it comes: each side waits for the other's messages.
            let mut left = hs;
            let mut buf = [0u8; 256];
            while left > 0 {
                let n = ar.read(&mut buf[..left.min(256)]).await.unwrap();
                bw.write_all(&buf[..n]).await.unwrap();
                left -= n;
            }
            let mut rest = Vec::new();
            let _ = ar.read_to_end(&mut rest).await;
            bw.write_all(&tamper(rest)).await.unwrap();
            bw.shutdown().await.unwrap();
        };
        tokio::join!(back, fwd);
    });
    let (ia, ib) = (identity("s-0123456789", Role::Decode, 16), identity("s-0123456789", Role::Gateway, 16));
    let (i, r) = tokio::join!(Link::connect(Box::new(a), &ia, T), Link::accept(Box::new(b), &ib, T));
    let ((_ir, mut iw), (mut rr, _rw)) = (i.unwrap().split(), r.unwrap().split());
    iw.send(&"first".to_string()).await.unwrap();
    iw.send(&"second".to_string()).await.unwrap();
    drop(iw);
    drop(_ir);
    assert_eq!(rr.recv::<String>().await.unwrap().as_deref(), Some("first"), "an untouched message passes");
    rr.recv::<String>().await
}

#[tokio::test]
async fn a_changed_control_message_fails_the_link() {
    // Flip one byte of the second message's body.
    let r = through_mitm(|mut b| {
        let first = 4 + u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        b[first + 6] ^= 1;
        b
    })
    .await;
    assert!(matches!(r, Err(ClusterError::Wire(WireError::BadMac))), "{r:?}");
}

#[tokio::test]
async fn a_replayed_control_message_fails_the_link() {
    // Send the first message again in place of the second.
    let r = through_mitm(|b| {
        let first = 4 + u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let mut out = b[..first].to_vec();
        out.extend_from_slice(&b[..first]);
        out
    })
    .await;
    assert!(matches!(r, Err(ClusterError::Wire(WireError::BadMac))), "{r:?}");
}

/// A listener on loopback TCP whose one accepted connection runs `Link::accept` with the
/// handshake timeout `timeout`; returns its address and the handshake's result.
async fn accept_one_over_tcp(
    me: Identity,
    timeout: Duration,
) -> (String, tokio::task::JoinHandle<(Result<Link, ClusterError>, Duration)>) {
    let (mut listener, addr) = Net::default().listen("127.0.0.1:0").await.unwrap();
    let h = tokio::spawn(async move {
        let io = listener.accept().await.unwrap();
        let t0 = std::time::Instant::now();
        let r = Link::accept(io, &me, timeout).await;
        (r, t0.elapsed())
    });
    (addr, h)
}

#[tokio::test]
async fn a_replayed_hello_then_a_huge_first_record_length_is_refused_at_once_without_reading_it() {
    let me = identity("s-0123456789", Role::Gateway, 16);
    let (addr, accepted) = accept_one_over_tcp(me, T).await;
    // A genuine hello, as one recorded on the network and replayed: the responder answers it.
    let sender = identity("s-0123456789", Role::Prefill, 16);
    let (_, hello) = Initiator::start(&sender.secrets.current(), &test_key(), Role::Prefill).unwrap();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(&hello.encode()).await.unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut reply = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut reply).await.unwrap();
    // The replayer cannot seal the first record; it claims 8 MiB for it and sends a few bytes.
    let claim = 8u32 << 20;
    s.write_all(&claim.to_le_bytes()).await.unwrap();
    s.write_all(&[0x5a; 32]).await.unwrap();
    let (r, took) = tokio::time::timeout(Duration::from_secs(2), accepted).await.expect("refused at once").unwrap();
    match &r {
        Err(e @ ClusterError::Wire(WireError::Oversized { len, max })) => {
            assert_eq!(*len, claim as usize);
            assert!(*max <= 512, "room for a handshake message, not {max} bytes");
            assert_eq!(cluster::link::refusal_reason(e), "oversized");
        }
        other => panic!("expected Oversized, got {:?}", other.as_ref().err()),
    }
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The responder closed the connection: it waits for nothing of the claimed record.
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await.expect("closed").unwrap_or(0);
    assert_eq!(n, 0, "nothing more is said to a replayer");
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_dropped_at_the_preauth_deadline_not_the_handshake_timeout() {
    let me = identity("s-0123456789", Role::Gateway, 16);
    let handshake_timeout = Duration::from_secs(30);
    let (addr, accepted) = accept_one_over_tcp(me, handshake_timeout).await;
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (r, took) = tokio::time::timeout(handshake_timeout, accepted).await.expect("dropped").unwrap();
    let e = r.err().expect("an idle connection is not a link");
    assert!(matches!(e, ClusterError::PreauthTimeout(d) if d == cluster::PREAUTH_TIMEOUT), "{e}");
    assert_eq!(cluster::link::refusal_reason(&e), "preauth_timeout");
    assert!(took >= cluster::PREAUTH_TIMEOUT && took < cluster::PREAUTH_TIMEOUT + Duration::from_secs(2), "{took:?}");
    let mut rest = Vec::new();
    assert_eq!(idle.read_to_end(&mut rest).await.unwrap_or(0), 0, "the listener closed it");
}

/// The node key of every node in these tests (one key, trusted by itself): what they check is
/// the link, not which node is which.
fn test_key() -> wire::NodeKey {
    wire::NodeKey::from_private([0x42; 32]).unwrap()
}
