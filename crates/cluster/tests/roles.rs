#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Roles on real TCP links over loopback, with real worker roles (`run_worker`) on engines of
//! the tiny generated model. Every peer here holds the cluster secret and the same pairing:
//! only its role is wrong, so only the role checks stand between it and the worker.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::proto::{Register, Registered, Spec, TenantTable, TicketWire, ToWorker};
use cluster::{run_worker, ClusterError, Gateways, Identity, Link, Net, SecretRing, WorkerConfig, WorkerMetrics};
use engine::{Engine, EngineConfig};
use gguf::GgufFile;
use kv::{Capacity, KvDtype, KvPool, PoolConfig, ScrubPolicy};
use model::tiny::{tiny_gguf, TinySpec};
use model::{Llama, LoadOptions};
use protocol::{RequestId, RouteRequest, TenantId};
use sampling::{SamplingParams, StopTokens};
use wire::{ClusterSecret, PairingInfo, RefusalCode, Role, WireError};

const SECRET: &[u8] = b"roles-test-cluster-secret-0123456789abcdef";
const T: Duration = Duration::from_secs(10);

/// A tiny-model engine and the pairing every node of these tests presents.
fn engine() -> (Engine, PairingInfo) {
    let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
    let model = Llama::from_file(&f, LoadOptions { threads: 1, ..Default::default() }).unwrap();
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool =
        KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(1024), scrub: ScrubPolicy::OnFree }).unwrap();
    let pairing = PairingInfo::new([7; 32], &layout).unwrap();
    (Engine::start(model, pool, EngineConfig::default()), pairing)
}

fn identity(role: Role, pairing: PairingInfo) -> Identity {
    Identity {
        secrets: SecretRing::single(ClusterSecret::from_passphrase(SECRET), test_key(), vec![test_key().identity()]),
        role,
        pairing,
    }
}

fn worker_config(name: &str, me: Identity) -> WorkerConfig {
    let decode = me.role == Role::Decode;
    WorkerConfig {
        name: name.into(),
        identity: me,
        kv_listen: decode.then(|| "127.0.0.1:0".into()),
        kv_advertise: None,
        handshake_timeout: T,
        transfer_timeout: T,
        max_pending_handshakes: 8,
        max_pending_handshakes_per_source: 8,
        drain_timeout: Duration::from_secs(5),
        link_lifetime: Duration::from_secs(3600),
    }
}

/// A request spec as a gateway would send it.
fn spec() -> Spec {
    Spec {
        route: 1,
        request: RouteRequest {
            id: RequestId(1),
            tenant: TenantId(1),
            prompt: vec![1, 2, 3, 4, 5],
            max_tokens: 4,
            sampling: SamplingParams::default(),
            stop_tokens: StopTokens::new([]),
            deadline: None,
            cache_salt: None,
            output: None,
        },
        cache_tags: Vec::new(),
    }
}

fn link_failures(m: &WorkerMetrics, reason: &str) -> u64 {
    m.links.snapshot().into_iter().find(|(r, _)| r == reason).map_or(0, |(_, n)| n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_link_from_a_gateway_or_decode_node_is_refused_typed_counted_and_reserves_nothing() {
    let (engine, pairing) = engine();
    let net = Net::default();
    // The test is the gateway the decode worker registers with: that is where it learns the
    // worker's KV address.
    let (mut gateway, gateway_addr) = net.listen("127.0.0.1:0").await.unwrap();
    let metrics = Arc::new(WorkerMetrics::default());
    let worker = tokio::spawn(run_worker(
        worker_config("decode-under-test", identity(Role::Decode, pairing)),
        Gateways::Fixed(gateway_addr.clone()),
        engine.handle(),
        net.clone(),
        metrics.clone(),
        std::future::pending(),
    ));
    let io = gateway.accept().await.unwrap();
    let link = Link::accept_from(io, &identity(Role::Gateway, pairing), &[Role::Decode], T).await.unwrap();
    let (mut rd, mut wr) = link.split();
    let reg: Register = rd.recv().await.unwrap().unwrap();
    let kv_addr = reg.kv_addr.expect("a decode worker registers its KV address");
    wr.send(&Registered::Accepted(TenantTable { tenants: Vec::new(), max_share: 1.0 })).await.unwrap();

    // A gateway-role peer: it proved the secret and is live, and the KV listener refuses it
    // inside the link, with a typed refusal it can read.
    let e = Link::connect(net.dial(&kv_addr).await.unwrap(), &identity(Role::Gateway, pairing), T).await.err();
    assert!(
        matches!(e, Some(ClusterError::Wire(WireError::Refused(RefusalCode::Role)))),
        "a gateway on a KV port: {e:?}"
    );
    // A decode-role peer: a reflection of the listener's own role, refused before any key.
    let e = Link::connect(net.dial(&kv_addr).await.unwrap(), &identity(Role::Decode, pairing), T).await.err();
    assert!(
        matches!(e, Some(ClusterError::Wire(WireError::Refused(RefusalCode::Reflection)))),
        "a decode node on a KV port: {e:?}"
    );

    // Both refusals are counted by reason on the decode worker (it counts after it answered).
    let t0 = Instant::now();
    while (link_failures(&metrics, "role"), link_failures(&metrics, "reflection")) != (1, 1) {
        assert!(t0.elapsed() < T, "link failures: {:?}", metrics.links.snapshot());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And nothing reached the worker: no reservation, no frame, no page, no violation.
    let stats = metrics.snapshot(&engine.handle());
    assert_eq!((stats.reservations, stats.frames_received, stats.pool.pages_used), (0, 0, 0));
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    assert_eq!(metrics.frames_received.load(Ordering::Relaxed), 0);

    // The same port takes a prefill worker: the refusals were about the role alone.
    let ok = Link::connect(net.dial(&kv_addr).await.unwrap(), &identity(Role::Prefill, pairing), T).await.unwrap();
    assert_eq!(ok.peer, Role::Decode);
    worker.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_gateway_address_reaches_another_role_takes_no_work_and_exits_naming_it() {
    for (worker_role, rogue_role) in [(Role::Prefill, Role::Decode), (Role::Decode, Role::Prefill)] {
        let (engine, pairing) = engine();
        let net = Net::default();
        // A node of another worker role (the secret and pairing right) where the worker
        // expects its gateway: a misconfigured address, or a rogue node.
        let (mut rogue, rogue_addr) = net.listen("127.0.0.1:0").await.unwrap();
        let metrics = Arc::new(WorkerMetrics::default());
        let worker = tokio::spawn(run_worker(
            worker_config("worker-under-test", identity(worker_role, pairing)),
            Gateways::Fixed(rogue_addr.clone()),
            engine.handle(),
            net.clone(),
            metrics.clone(),
            std::future::pending(),
        ));
        let io = rogue.accept().await.unwrap();
        // The handshake itself succeeds: the two roles differ, and a worker may pair with a
        // worker of the other role (that is a KV link).
        let link = Link::accept(io, &identity(rogue_role, pairing), T).await.unwrap();
        assert_eq!(link.peer, worker_role);
        let (mut rd, mut wr) = link.split();
        // It offers work at once, as a gateway would after registration.
        let _ = wr.send(&ToWorker::Reserve(spec())).await;
        let ticket = TicketWire { request: 1, tenant: 1, nonce: [9; 16], pages: 1, tokens: 5, held: 0 };
        let _ = wr.send(&ToWorker::Prefill { spec: spec(), ticket, decode_addr: rogue_addr.clone() }).await;

        // The worker stops, naming the role it found and the one it wanted; retrying could not
        // fix an address that reaches the wrong node.
        let ended = tokio::time::timeout(T, worker).await;
        let Ok(Ok(Err(ClusterError::WrongRole { got, want }))) = ended else {
            panic!("a {worker_role:?} worker dialling a {rogue_role:?} node as its gateway: {ended:?}");
        };
        assert_eq!((got, want), (rogue_role, vec![Role::Gateway]));
        // It never registered or answered: the link ends with nothing from it.
        let got: Result<Option<serde_json::Value>, _> = tokio::time::timeout(T, rd.recv()).await.unwrap();
        assert!(!matches!(got, Ok(Some(_))), "the worker sent {got:?}");
        // And it took no work.
        let stats = metrics.snapshot(&engine.handle());
        assert_eq!(
            (stats.reservations, stats.frames_sent, stats.pool.pages_used, stats.pool.prefill_tokens, stats.pool.steps),
            (0, 0, 0, 0, 0),
            "{worker_role:?} worker"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_address_that_is_no_gateway_gets_nothing_and_the_worker_registers_with_the_real_one() {
    let (engine, pairing) = engine();
    let net = Net::default();
    // The membership lists a rogue node (another role, secret and pairing right) and then the
    // real gateway: a stale or forged entry.
    let (mut rogue, rogue_addr) = net.listen("127.0.0.1:0").await.unwrap();
    let (mut gateway, gateway_addr) = net.listen("127.0.0.1:0").await.unwrap();
    let (list_tx, list) = tokio::sync::watch::channel(std::collections::BTreeSet::from([rogue_addr.clone()]));
    let metrics = Arc::new(WorkerMetrics::default());
    let worker = tokio::spawn(run_worker(
        worker_config("listed-worker", identity(Role::Decode, pairing)),
        Gateways::Listed(list),
        engine.handle(),
        net.clone(),
        metrics.clone(),
        std::future::pending(),
    ));
    let io = rogue.accept().await.unwrap();
    let link = Link::accept(io, &identity(Role::Prefill, pairing), T).await.unwrap();
    let (mut rd, mut wr) = link.split();
    let _ = wr.send(&ToWorker::Reserve(spec())).await;
    // The worker drops the rogue link without registering or answering, and keeps running.
    let got: Result<Option<serde_json::Value>, _> = tokio::time::timeout(T, rd.recv()).await.unwrap();
    assert!(!matches!(got, Ok(Some(_))), "the worker sent the rogue {got:?}");
    assert!(!worker.is_finished(), "a bad listed address must not stop the worker");
    // The real gateway is listed: the worker registers there.
    list_tx.send_modify(|l| {
        l.insert(gateway_addr.clone());
    });
    let io = tokio::time::timeout(T, gateway.accept()).await.expect("the worker dials the listed gateway").unwrap();
    let link = Link::accept_from(io, &identity(Role::Gateway, pairing), &[Role::Decode], T).await.unwrap();
    let (mut rd, _wr) = link.split();
    let reg: Register = rd.recv().await.unwrap().unwrap();
    assert_eq!(reg.name, "listed-worker");
    // The rogue is not dialled again while its entry stays, and nothing ran.
    assert!(tokio::time::timeout(Duration::from_millis(500), rogue.accept()).await.is_err(), "redialled the rogue");
    let stats = metrics.snapshot(&engine.handle());
    assert_eq!((stats.reservations, stats.pool.pages_used), (0, 0));
    worker.abort();
}

/// The node key of every node in these tests (one key, trusted by itself): what they check is
/// the link, not which node is which.
fn test_key() -> wire::NodeKey {
    wire::NodeKey::from_private([0x42; 32]).unwrap()
}
