#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The router against scripted workers on real links: messages about one route come over two
//! links (prefill's and decode's), so their order between links is the network's. A decode
//! worker's `Verified` may overtake the prefill worker's `Sent`; the route, already streaming,
//! must then neither time out on the verification it has nor start over on other workers.

use std::time::{Duration, Instant};

use cluster::link::{LinkReader, LinkWriter};
use cluster::proto::{Register, Registered, TicketWire, ToGateway, ToWorker};
use cluster::{Identity, Link, Net, Router, RouterConfig, SecretRing};
use kv::{KvDtype, KvLayout};
use protocol::{Event, FinishReason, RequestError, RequestId, RouteRequest, TenantId, TokenEvent, ViolationKind};
use wire::{ClusterSecret, PairingInfo, Role};

const T: Duration = Duration::from_secs(10);
const CONTEXT: usize = 512;
/// Short, so that a verification deadline wrongly left armed fires within the test.
const TRANSFER_TIMEOUT: Duration = Duration::from_millis(300);

fn identity(role: Role) -> Identity {
    let layout = KvLayout { n_layers: 2, n_kv_heads: 2, head_dim: 16, page_size: 16, dtype: KvDtype::F16 };
    Identity {
        secrets: SecretRing::single(
            ClusterSecret::from_passphrase(b"route-order-test-secret-0123456789abcdef"),
            test_key(),
            vec![test_key().identity()],
        ),
        role,
        pairing: PairingInfo::new([3; 32], &layout).unwrap(),
    }
}

async fn worker(net: &Net, addr: &str, role: Role) -> (LinkReader, LinkWriter) {
    let io = net.dial(addr).await.unwrap();
    let link = Link::connect(io, &identity(role), T).await.unwrap();
    let (mut rd, mut wr) = link.split();
    let kv_addr = (role == Role::Decode).then(|| "127.0.0.1:9".to_string());
    let name = format!("scripted-{role:?}").to_lowercase();
    wr.send(&Register { name, kv_addr, context: CONTEXT, capacity_tokens: 4 * CONTEXT }).await.unwrap();
    let reg: Option<Registered> = rd.recv().await.unwrap();
    assert!(matches!(reg, Some(Registered::Accepted(_))), "{reg:?}");
    (rd, wr)
}

/// The next message about a route (tenant tables are skipped), or None within `within`.
async fn next(rd: &mut LinkReader, within: Duration) -> Option<ToWorker> {
    let until = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, rd.recv::<ToWorker>()).await {
            Ok(Ok(Some(ToWorker::Tenants(_)))) => continue,
            Ok(Ok(m)) => return m,
            Ok(Err(e)) => panic!("link: {e}"),
            Err(_) => return None,
        }
    }
}

fn token(t: u32) -> TokenEvent {
    TokenEvent { token: t, logprob: Some(-0.25), top: vec![] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verification_that_overtakes_the_prefill_workers_sent_neither_times_out_nor_restarts_the_stream() {
    let net = Net::default();
    let (listener, addr) = net.listen("127.0.0.1:0").await.unwrap();
    let router = router();
    tokio::spawn(cluster::serve_models(vec![router.clone()], listener));
    let (mut d_rd, mut d_wr) = worker(&net, &addr, Role::Decode).await;
    let (mut p_rd, mut p_wr) = worker(&net, &addr, Role::Prefill).await;
    assert!(router.wait_for_workers(1, 1, T).await);

    let prompt = vec![11, 12, 13];
    let req = RouteRequest {
        id: RequestId(5),
        tenant: TenantId(1),
        prompt: prompt.clone(),
        max_tokens: 4,
        sampling: sampling::SamplingParams::default(),
        stop_tokens: sampling::StopTokens::new([]),
        deadline: Some(Instant::now() + T),
        cache_salt: None,
        output: None,
    };
    let mut stream = router.submit(req, router.revocation_mark()).unwrap();

    let Some(ToWorker::Reserve(spec)) = next(&mut d_rd, T).await else { panic!("no reservation") };
    let ticket = TicketWire { request: 5, tenant: 1, nonce: [4; 16], pages: 1, tokens: prompt.len() as u32, held: 0 };
    d_wr.send(&ToGateway::Reserved { route: spec.route, ticket }).await.unwrap();
    let Some(ToWorker::Prefill { spec: p_spec, .. }) = next(&mut p_rd, T).await else { panic!("no prefill") };
    assert_eq!(p_spec.route, spec.route);
    let route = spec.route;
    p_wr.send(&ToGateway::First { route, token: token(40), cached_tokens: None }).await.unwrap();
    // Decode verified the KV and decodes before prefill's `Sent` reaches the gateway.
    d_wr.send(&ToGateway::Verified { route, first: 40 }).await.unwrap();
    d_wr.send(&ToGateway::Token { route, token: token(41) }).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    p_wr.send(&ToGateway::Sent { route, frames: 1 }).await.unwrap();

    // Decoding takes longer than the transfer timeout after that `Sent`: no second attempt
    // may be routed (its tokens would follow the ones already streamed).
    let retried = next(&mut d_rd, TRANSFER_TIMEOUT * 4).await;
    assert!(retried.is_none(), "the router started the request over: {retried:?}");
    d_wr.send(&ToGateway::Token { route, token: token(42) }).await.unwrap();
    d_wr.send(&ToGateway::Finished { route, reason: FinishReason::Length, usage: (3, 3) }).await.unwrap();

    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(T, stream.next()).await.unwrap() {
            Some(Event::Token(t)) => got.push(t.token),
            Some(Event::Finished { usage, .. }) => {
                assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 3));
                break;
            }
            Some(Event::Failed(e)) => panic!("the request failed after {got:?}: {e}"),
            Some(_) => {}
            None => panic!("the stream ended without a result after {got:?}"),
        }
    }
    assert_eq!(got, [40, 41, 42]);
}

fn router() -> Router {
    Router::new(RouterConfig {
        identity: identity(Role::Gateway),
        context: CONTEXT,
        vocab: 100,
        handshake_timeout: T,
        transfer_timeout: TRANSFER_TIMEOUT,
        max_pending_handshakes: 8,
        max_pending_handshakes_per_source: 8,
        routing: cluster::RoutingPolicy::default(),
    })
}

/// A compromised decode worker claims, in its ticket, to hold what it cannot (the whole prompt,
/// or part of a page): the route fails as a wrong ticket and the prefill worker is never asked
/// to send anything, so it can never be told to skip pages the decode worker lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_claiming_held_tokens_that_are_not_whole_pages_before_the_last_fails_and_nothing_is_sent() {
    let net = Net::default();
    let (listener, addr) = net.listen("127.0.0.1:0").await.unwrap();
    let router = router();
    tokio::spawn(cluster::serve_models(vec![router.clone()], listener));
    let (mut d_rd, mut d_wr) = worker(&net, &addr, Role::Decode).await;
    let (mut p_rd, _p_wr) = worker(&net, &addr, Role::Prefill).await;
    assert!(router.wait_for_workers(1, 1, T).await);
    let prompt: Vec<u32> = (10..50).collect();
    for (id, held) in [(6u64, 40u32), (7, 8), (8, 48)] {
        let req = RouteRequest {
            id: RequestId(id),
            tenant: TenantId(1),
            prompt: prompt.clone(),
            max_tokens: 4,
            sampling: sampling::SamplingParams::default(),
            stop_tokens: sampling::StopTokens::new([]),
            deadline: Some(Instant::now() + T),
            cache_salt: None,
            output: None,
        };
        let mut stream = router.submit(req, router.revocation_mark()).unwrap();
        let Some(ToWorker::Reserve(spec)) = next(&mut d_rd, T).await else { panic!("no reservation") };
        let ticket = TicketWire { request: id, tenant: 1, nonce: [4; 16], pages: 4, tokens: prompt.len() as u32, held };
        d_wr.send(&ToGateway::Reserved { route: spec.route, ticket }).await.unwrap();
        let failure = loop {
            match tokio::time::timeout(T, stream.next()).await.unwrap() {
                Some(Event::Failed(e)) => break e,
                Some(Event::Token(_) | Event::Finished { .. }) | None => panic!("held {held}: not refused"),
                Some(_) => {}
            }
        };
        assert_eq!(failure, RequestError::IsolationViolation { kind: ViolationKind::WrongTicket }, "held {held}");
        // Both workers are told to cancel the route; the prefill worker is never asked to send.
        assert!(matches!(next(&mut d_rd, T).await, Some(ToWorker::Cancel { .. })), "held {held}");
        let heard = next(&mut p_rd, Duration::from_millis(200)).await;
        assert!(matches!(heard, None | Some(ToWorker::Cancel { .. })), "held {held}: {heard:?}");
    }
}

/// The node key of every node in these tests (one key, trusted by itself): what they check is
/// the link, not which node is which.
fn test_key() -> wire::NodeKey {
    wire::NodeKey::from_private([0x42; 32]).unwrap()
}
