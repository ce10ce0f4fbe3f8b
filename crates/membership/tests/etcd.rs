//! The membership against a real etcd on loopback (`launch::etcd::EtcdServer`): the client's
//! calls, publications under leases, the members view, and etcd killed and brought back.
#![allow(clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use base64::Engine as _;
use launch::etcd::EtcdServer;
use membership::{publish, watch_members, EtcdClient, Event, Members, MembershipError};
use tokio::sync::watch;

const TIMEOUT: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(2);

fn client(etcd: &EtcdServer) -> EtcdClient {
    EtcdClient::new(&[etcd.endpoint()], TIMEOUT).expect("client")
}

fn start() -> EtcdServer {
    EtcdServer::start().expect("etcd")
}

/// Polls `check` until it holds, failing the test at the deadline.
async fn eventually<F, Fut>(what: &str, within: Duration, check: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let t0 = Instant::now();
    while !check().await {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the members view satisfies `want`, failing the test at the deadline.
async fn members_until(rx: &mut watch::Receiver<Members>, within: Duration, want: impl Fn(&Members) -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !want(&rx.borrow_and_update()) {
        let changed = tokio::time::timeout_at(deadline, rx.changed()).await;
        let now = rx.borrow().clone();
        assert!(changed.is_ok(), "members not as wanted within {within:?}: {now:?}");
        changed.expect("not timed out").expect("the members task ended");
    }
}

async fn value_of(c: &EtcdClient, key: &str) -> Option<Vec<u8>> {
    let (_, kvs) = c.range_prefix(key).await.expect("range");
    kvs.into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn entries(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
}

/// The lease a key is under, read with a raw range (the client does not expose it).
fn lease_of(etcd: &EtcdServer, key: &str) -> i64 {
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = serde_json::json!({ "key": b64.encode(key) }).to_string();
    let url = format!("http://{}/v3/kv/range", etcd.endpoint());
    // launch's agent, not `post_json`: etcd takes any Authorization header for its own token.
    let mut r = launch::agent(TIMEOUT).post(&url).send(body.as_bytes()).expect("raw range");
    let text = r.body_mut().read_to_string().expect("body");
    assert_eq!(r.status(), 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["kvs"][0]["lease"].as_str().expect("a lease").parse().expect("an id")
}

/// `kill -9` / restart block on processes and HTTP polls: off the async workers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_range_and_revoke_round_trip_and_ranges_stay_within_their_prefix() {
    let etcd = start();
    let c = client(&etcd);
    let lease = c.grant(TTL).await.expect("grant");
    assert!(c.keep_alive(lease).await.expect("keepalive").is_some_and(|ttl| ttl >= TTL));
    c.put("/t/gateways/a", b"1", Some(lease)).await.expect("put a");
    c.put("/t/gateways/b", b"", None).await.expect("put b");
    c.put("/t/gatewaysX", b"not under the prefix", None).await.expect("put X");
    c.put("/t/workers/w", b"3", None).await.expect("put w");

    let (revision, kvs) = c.range_prefix("/t/gateways/").await.expect("range");
    assert!(revision >= 4, "revision {revision}");
    assert_eq!(kvs, [("/t/gateways/a".to_string(), b"1".to_vec()), ("/t/gateways/b".to_string(), Vec::new())]);

    c.revoke(lease).await.expect("revoke");
    let (_, kvs) = c.range_prefix("/t/gateways/").await.expect("range");
    assert_eq!(kvs, [("/t/gateways/b".to_string(), Vec::new())], "the revoked lease took its key");
    assert_eq!(c.keep_alive(lease).await.expect("keepalive"), None, "a revoked lease is gone");
    let e = c.revoke(lease).await.expect_err("revoked twice");
    assert!(matches!(e, MembershipError::Status { status: 404, .. }), "{e}");
    assert!(e.to_string().contains("lease not found"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_puts_and_deletes_after_the_range_it_follows() {
    let etcd = start();
    let c = client(&etcd);
    c.put("/w/a", b"before", None).await.expect("put");
    let (revision, _) = c.range_prefix("/w/").await.expect("range");
    let mut w = c.watch_prefix("/w/", revision + 1).await.expect("watch");
    let e = w.next(Duration::from_millis(300)).await.expect_err("a quiet prefix");
    assert!(e.is_timeout(), "{e}");

    let lease = c.grant(TTL).await.expect("grant");
    c.put("/w/b", b"2", Some(lease)).await.expect("put");
    c.put("/other/c", b"3", None).await.expect("put elsewhere");
    let events = w.next(TIMEOUT).await.expect("events").expect("open");
    assert!(
        matches!(&events[..], [Event::Put { key, value, revision: r }] if key == "/w/b" && value == b"2" && *r > revision),
        "{events:?}"
    );
    c.revoke(lease).await.expect("revoke");
    let events = w.next(TIMEOUT).await.expect("events").expect("open");
    assert!(matches!(&events[..], [Event::Delete { key, .. }] if key == "/w/b"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_key_expires_with_its_lease_once_the_publication_is_dropped() {
    let etcd = start();
    let c = client(&etcd);
    let p = publish(c.clone(), "/p/workers/w1".into(), b"{\"w\":1}".to_vec(), TTL);
    let mut published = p.published();
    tokio::time::timeout(TIMEOUT, published.wait_for(|p| *p)).await.expect("published in time").expect("task");
    assert_eq!(value_of(&c, "/p/workers/w1").await.as_deref(), Some(&b"{\"w\":1}"[..]));
    // Renewed past its TTL while the handle lives.
    tokio::time::sleep(TTL * 2).await;
    assert!(value_of(&c, "/p/workers/w1").await.is_some(), "the key expired while published");

    drop(p);
    let t0 = Instant::now();
    let c = &c;
    eventually("the key expires", TTL * 3, || async move { value_of(c, "/p/workers/w1").await.is_none() }).await;
    assert!(t0.elapsed() > Duration::from_millis(200), "gone at once: revoked rather than expired?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_key_disappears_at_once() {
    let etcd = start();
    let c = client(&etcd);
    let p = publish(c.clone(), "/p/gateways/g1".into(), b"g".to_vec(), Duration::from_secs(30));
    let mut published = p.published();
    tokio::time::timeout(TIMEOUT, published.wait_for(|p| *p)).await.expect("published in time").expect("task");
    let t0 = Instant::now();
    p.withdraw().await.expect("withdraw");
    assert!(t0.elapsed() < TIMEOUT);
    assert_eq!(value_of(&c, "/p/gateways/g1").await, None, "still there after withdraw");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_see_puts_and_deletes_relative_to_their_prefix() {
    let etcd = start();
    let c = client(&etcd);
    c.put("/m/workers/a", b"1", None).await.expect("put");
    let mut rx = watch_members(c.clone(), "/m/workers/".into());
    members_until(&mut rx, TIMEOUT, |m| m.synced && m.entries == entries(&[("a", "1")])).await;

    let lease = c.grant(TTL).await.expect("grant");
    c.put("/m/workers/b", b"2", Some(lease)).await.expect("put");
    c.put("/m/gateways/g", b"not a worker", None).await.expect("put elsewhere");
    members_until(&mut rx, TIMEOUT, |m| m.entries == entries(&[("a", "1"), ("b", "2")])).await;
    c.put("/m/workers/a", b"1b", None).await.expect("put");
    members_until(&mut rx, TIMEOUT, |m| m.entries == entries(&[("a", "1b"), ("b", "2")])).await;
    c.revoke(lease).await.expect("revoke");
    members_until(&mut rx, TIMEOUT, |m| m.entries == entries(&[("a", "1b")])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_keep_the_last_known_entries_while_etcd_is_down_and_catch_up_after() {
    let mut etcd = start();
    let c = client(&etcd);
    c.put("/d/workers/a", b"1", None).await.expect("put");
    let mut rx = watch_members(c.clone(), "/d/workers/".into());
    members_until(&mut rx, TIMEOUT, |m| m.synced && m.entries == entries(&[("a", "1")])).await;
    let before = rx.borrow().clone();

    blocking(|| etcd.kill9());
    // Long enough for the watch to break and a few resyncs to fail.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(*rx.borrow(), before, "the view changed while etcd was down");

    blocking(|| etcd.restart()).expect("restart");
    c.put("/d/workers/b", b"2", None).await.expect("put after the restart");
    members_until(&mut rx, Duration::from_secs(10), |m| m.synced && m.entries == entries(&[("a", "1"), ("b", "2")]))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_is_back_after_etcd_was_down_longer_than_its_ttl() {
    let mut etcd = start();
    let c = client(&etcd);
    let short = EtcdClient::new(&[etcd.endpoint()], Duration::from_millis(500)).expect("client");
    let p = publish(short, "/r/workers/w".into(), b"w".to_vec(), TTL);
    let mut published = p.published();
    tokio::time::timeout(TIMEOUT, published.wait_for(|p| *p)).await.expect("published in time").expect("task");

    blocking(|| etcd.kill9());
    let t0 = Instant::now();
    tokio::time::timeout(TIMEOUT, published.wait_for(|p| !*p)).await.expect("unpublished in time").expect("task");
    tokio::time::sleep((TTL * 2).saturating_sub(t0.elapsed())).await;
    blocking(|| etcd.restart()).expect("restart");

    tokio::time::timeout(Duration::from_secs(10), published.wait_for(|p| *p))
        .await
        .expect("published again in time")
        .expect("task");
    assert_eq!(value_of(&c, "/r/workers/w").await.as_deref(), Some(&b"w"[..]));
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_whose_lease_is_lost_takes_a_new_one_and_puts_again() {
    let etcd = start();
    let c = client(&etcd);
    let p = publish(c.clone(), "/l/workers/w".into(), b"w".to_vec(), TTL);
    let mut published = p.published();
    tokio::time::timeout(TIMEOUT, published.wait_for(|p| *p)).await.expect("published in time").expect("task");
    let first = blocking(|| lease_of(&etcd, "/l/workers/w"));

    c.revoke(first).await.expect("revoke behind its back");
    assert_eq!(value_of(&c, "/l/workers/w").await, None);
    let cr = &c;
    eventually("the key is back", TTL * 2, || async move { value_of(cr, "/l/workers/w").await.is_some() }).await;
    let second = blocking(|| lease_of(&etcd, "/l/workers/w"));
    assert_ne!(first, second, "the key is under a new lease");
    assert!(*p.published().borrow());
    p.withdraw().await.expect("withdraw");
    assert_eq!(value_of(&c, "/l/workers/w").await, None);
}

#[test]
fn https_endpoints_are_refused_with_a_clear_message() {
    let e = EtcdClient::new(&["https://etcd-0:2379".to_string()], TIMEOUT).expect_err("https");
    let text = e.to_string();
    assert!(text.contains("https://etcd-0:2379") && text.contains("TLS to etcd is not supported yet"), "{text}");
    assert!(EtcdClient::new(&[], TIMEOUT).is_err(), "no endpoint at all");
    assert!(EtcdClient::new(&["etcd-0".to_string()], TIMEOUT).is_err(), "no port");
}

#[tokio::test]
async fn an_unreachable_endpoint_fails_within_the_timeout_naming_it() {
    // A port nothing listens on: refused at once.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let timeout = Duration::from_millis(700);
    let c = EtcdClient::new(std::slice::from_ref(&closed), timeout).expect("client");
    let t0 = Instant::now();
    let e = c.grant(TTL).await.expect_err("nothing there");
    assert!(t0.elapsed() < timeout + Duration::from_millis(500));
    assert!(matches!(e, MembershipError::Unreachable { .. }) && e.to_string().contains(&closed), "{e}");

    // A listener that never answers: the deadline ends the call.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr").to_string();
    let c = EtcdClient::new(&[format!("http://{addr}")], timeout).expect("client");
    let t0 = Instant::now();
    let e = c.range_prefix("/x/").await.expect_err("no answer");
    let took = t0.elapsed();
    assert!(took >= timeout && took < timeout + Duration::from_millis(500), "{took:?}");
    assert!(e.is_timeout() && e.to_string().contains(&addr), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_passed_over_for_a_live_one() {
    let etcd = start();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let c = EtcdClient::new(&[closed, etcd.endpoint()], TIMEOUT).expect("client");
    c.put("/e/k", b"v", None).await.expect("put through the live endpoint");
    assert_eq!(value_of(&c, "/e/k").await.as_deref(), Some(&b"v"[..]));
}
