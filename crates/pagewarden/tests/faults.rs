#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Faults between real prefill and decode processes: a fault-injecting proxy on the KV path,
//! a prefill worker that lies about its transfer, and workers killed with SIGKILL. Every
//! faulty request fails with an error (nothing of it streamed), the violation counter moves,
//! pools return to zero, and the next requests succeed.

mod common;

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use audit::relay::read_unit;
use cluster::proto::{Register, Registered, ToGateway, ToWorker};
use cluster::{Link, Net};
use common::cluster::{metric, node_identity, stream_chat, Cluster};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use wire::{CloseFrame, Frame, KvFrame, PromptDigest, Role, Ticket};

/// A long enough prompt for five KV frames (four pages and the close).
const PROMPT: &str = "Tell me a short story about a lighthouse keeper who finds a message in a bottle, \
    in three sentences, with a happy ending, and give it a title.";

fn request(stream: bool) -> Value {
    json!({
        "model": common::MODEL_NAME,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": stream,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Pass,
    Corrupt,
    Drop,
    Duplicate,
    Reorder,
    Foreign,
    Truncate,
    /// Forward the first frame, then hold everything (the test kills the sender).
    Stall,
}

#[derive(Default)]
struct ProxyState {
    upstream: Option<String>,
    /// Applied to the next transfer only.
    fault: Option<Fault>,
    /// The first frame of the last transfer (for `Foreign`).
    saved: Option<Vec<u8>>,
    transfers: usize,
}

/// Sits between prefill workers and a decode worker. It cannot forge anything (it has no
/// secret); it relays the handshake and then drops, corrupts, duplicates, reorders, swaps or
/// truncates KV frames. The prefill side is always drained to the end, so the sender sees a
/// successful send and only the decode worker's checks can catch the fault.
struct Proxy {
    addr: String,
    state: Arc<Mutex<ProxyState>>,
}

impl Proxy {
    fn start() -> Proxy {
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let st = state.clone();
        let addr = audit::relay::listen(move |from| relay(from, &st)).unwrap();
        Proxy { addr, state }
    }

    fn set(&self, f: Fault) {
        self.state.lock().unwrap().fault = Some(f);
    }
}

fn relay(mut from: TcpStream, st: &Mutex<ProxyState>) {
    let upstream = st.lock().unwrap().upstream.clone().unwrap();
    let Some(mut to) = audit::relay::splice(&mut from, &upstream) else { return };
    let fault = {
        let mut s = st.lock().unwrap();
        s.transfers += 1;
        s.fault.take().unwrap_or(Fault::Pass)
    };
    let mut frames = Vec::new();
    if fault == Fault::Stall {
        // The first frame reaches the decode worker; the rest is held until the sender dies.
        if let Some(u) = read_unit(&mut from) {
            let _ = to.write_all(&u);
        }
        while read_unit(&mut from).is_some() {}
        // Keep the decode side open: only the sender's death may end this transfer.
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    while let Some(u) = read_unit(&mut from) {
        frames.push(u);
    }
    let saved = st.lock().unwrap().saved.replace(frames[0].clone());
    let mut out: Vec<Vec<u8>> = frames.clone();
    match fault {
        Fault::Pass => {}
        Fault::Corrupt => {
            let n = out[1].len();
            out[1][n / 2] ^= 0x40;
        }
        Fault::Drop => {
            out.remove(1);
        }
        Fault::Duplicate => out.insert(2, frames[1].clone()),
        Fault::Reorder => out.swap(1, 2),
        Fault::Foreign => out[1] = saved.expect("a previous transfer"),
        Fault::Truncate => {
            let half = out[1].len() / 2;
            let _ = to.write_all(&out[0]);
            let _ = to.write_all(&out[1][..half]);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        Fault::Stall => {}
    }
    for u in out {
        if to.write_all(&u).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn violations(c: &Cluster, decode: usize, kind: &str) -> f64 {
    c.worker_metric(decode, "pagewarden_isolation_violations_total", &format!("kind=\"{kind}\""))
}

fn expect_error_nothing_streamed(c: &Cluster) -> Value {
    let (status, body) = c.post("/v1/chat/completions", &request(true));
    assert!(status >= 500, "status {status}: {body}");
    assert!(!body.contains("data:"), "something was streamed: {body}");
    serde_json::from_str(&body).unwrap()
}

fn ok_text(c: &Cluster) -> String {
    let (status, body) = c.post("/v1/chat/completions", &request(false));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

#[test]
fn every_network_fault_on_the_kv_path_fails_its_request_loudly_and_the_next_one_succeeds() {
    let proxy = Proxy::start();
    // Every page of the prompt crosses (no cache holds any of it): the proxy's faults are
    // placed by frame. Partial transfers are faulted by the rogue prefill worker below.
    let mut c = Cluster::start("[prefix_cache]\nenabled = false\n");
    c.add_worker("prefill", "prefill-a", None);
    let d = c.add_worker("decode", "decode-a", Some(&proxy.addr));
    proxy.state.lock().unwrap().upstream = c.workers[d].kv_addr.clone();
    c.wait_workers(1, 1);
    let want = ok_text(&c);
    // The link's records take their nonce from a counter both ends keep: a frame flipped,
    // dropped, repeated, moved or carried over from another connection does not open.
    let cases = [
        (Fault::Corrupt, "bad_mac"),
        (Fault::Drop, "bad_mac"),
        (Fault::Duplicate, "bad_mac"),
        (Fault::Reorder, "bad_mac"),
        (Fault::Foreign, "bad_mac"),
        (Fault::Truncate, "truncated"),
    ];
    for (fault, kind) in cases {
        let before = violations(&c, d, kind);
        let gw_before =
            metric(&c.gateway_metrics(), "pagewarden_isolation_violations_total", &format!("kind=\"{kind}\""));
        proxy.set(fault);
        let err = expect_error_nothing_streamed(&c);
        assert!(err["error"]["message"].as_str().unwrap().contains(kind), "{fault:?}: {err}");
        assert_eq!(violations(&c, d, kind), before + 1.0, "{fault:?}");
        let gw = metric(&c.gateway_metrics(), "pagewarden_isolation_violations_total", &format!("kind=\"{kind}\""));
        assert_eq!(gw, gw_before + 1.0, "{fault:?}: the gateway counts it too");
        c.wait_pools_empty(&[0, 1]);
        assert_eq!(ok_text(&c), want, "after {fault:?}");
    }
}

/// A prefill worker dials the decode worker while it computes the prompt, so a request that
/// fails or is cancelled meanwhile closes an authenticated KV link before its first frame.
/// Nothing of any ticket crossed it: it is counted as a link closed unused, not as a
/// truncated transfer, and the next request is served as before.
#[test]
fn a_kv_link_closed_before_its_first_frame_counts_as_unused_not_as_a_violation() {
    let mut c = Cluster::start("");
    c.add_worker("prefill", "prefill-a", None);
    let d = c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    let want = ok_text(&c);
    let unused = |c: &Cluster| c.worker_metric(d, "pagewarden_link_failures_total", "reason=\"closed_unused\"");
    let (violations_before, unused_before) = (violations(&c, d, "truncated"), unused(&c));
    let kv_addr = c.workers[d].kv_addr.clone().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let io = Net::default().dial(&kv_addr).await.unwrap();
        let link = Link::connect(io, &node_identity(Role::Prefill), Duration::from_secs(10)).await.unwrap();
        drop(link);
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while unused(&c) < unused_before + 1.0 {
        assert!(Instant::now() < deadline, "the unused link was not counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(violations(&c, d, "truncated"), violations_before);
    assert_eq!(ok_text(&c), want);
}

/// A prefill worker that knows the cluster secret but lies about what it computed.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// The incident: the KV of the first token only, closed as a one-token prompt.
    Placeholder,
    /// Every slot, then a digest of another prompt.
    WrongDigest,
    /// Every page but the last, then an honest close.
    MissingPage,
    /// Every slot and an honest digest, but a first token outside the vocabulary, which the
    /// model cannot embed: were it decoded, the step would fail for every sequence in it.
    BadFirstToken,
    /// A well-formed transfer of every page the decode worker does not hold (zeros for KV).
    Honest,
    /// Skips one more page than the decode worker holds, as if it held that page too.
    SkipsUnheldPage,
    /// Sends the pages the decode worker holds as well.
    ResendsHeldPages,
}

/// SmolLM2's vocabulary size: the first id outside it.
const VOCAB: u32 = 49152;

async fn rogue_prefill(c_addr: String, lies: Arc<Mutex<Vec<Lie>>>) {
    let me = node_identity(Role::Prefill);
    let net = Net::default();
    let link = Link::connect(net.dial(&c_addr).await.unwrap(), &me, Duration::from_secs(10)).await.unwrap();
    let (mut rd, mut wr) = link.split();
    wr.send(&Register { name: "rogue".into(), kv_addr: None, context: 8192, capacity_tokens: 16384 }).await.unwrap();
    assert!(matches!(rd.recv::<Registered>().await.unwrap(), Some(Registered::Accepted(_))));
    while let Ok(Some(m)) = rd.recv::<ToWorker>().await {
        let ToWorker::Prefill { spec, ticket, decode_addr } = m else { continue };
        let lie = lies.lock().unwrap().remove(0);
        let ticket: Ticket = ticket.into();
        let first = if matches!(lie, Lie::BadFirstToken) { VOCAB } else { 42 };
        let token = engine::TokenEvent { token: first, logprob: Some(-0.1), top: vec![] };
        wr.send(&ToGateway::First { route: spec.route, token, cached_tokens: None }).await.unwrap();
        let link = Link::connect(net.dial(&decode_addr).await.unwrap(), &me, Duration::from_secs(10)).await.unwrap();
        // It holds the secret, so its link and its frames authenticate: only the decode
        // worker's checks against its own reservation stand between it and the pages.
        let (mut io, mut sealer) = link.into_kv_sealer();
        let n = spec.request.prompt.len() as u32;
        let pages = match lie {
            Lie::Placeholder => 1,
            Lie::MissingPage => n.div_ceil(16) - 1,
            _ => n.div_ceil(16),
        };
        let held = ticket.held / 16;
        let from = match lie {
            Lie::SkipsUnheldPage => held + 1,
            Lie::ResendsHeldPages => 0,
            _ => held,
        };
        let mut seq = 0;
        for p in from..pages {
            let end = if matches!(lie, Lie::Placeholder) { 1 } else { (p * 16 + 16).min(n) };
            let tokens = p * 16..end;
            let payload = vec![0u8; 30 * (tokens.len()) * 2 * 384];
            let f = Frame::kv(ticket.id(), seq, KvFrame { page_index: p, layers: 0..30, tokens, payload });
            io.write_all(&sealer.seal(&f).unwrap()).await.unwrap();
            seq += 1;
        }
        let close = match lie {
            Lie::Placeholder => {
                CloseFrame { tokens: 1, prompt_digest: PromptDigest::of(&spec.request.prompt[..1]), first_token: 42 }
            }
            Lie::WrongDigest => {
                let mut other = spec.request.prompt.clone();
                other[3] ^= 1;
                CloseFrame { tokens: n, prompt_digest: PromptDigest::of(&other), first_token: 42 }
            }
            _ => CloseFrame { tokens: n, prompt_digest: PromptDigest::of(&spec.request.prompt), first_token: first },
        };
        io.write_all(&sealer.seal(&Frame::close(ticket.id(), seq, close)).unwrap()).await.unwrap();
        io.shutdown().await.unwrap();
        wr.send(&ToGateway::Sent { route: spec.route, frames: seq + 1 }).await.unwrap();
    }
}

#[test]
fn a_prefill_worker_that_lies_about_its_transfer_never_gets_a_request_decoded() {
    let mut c = Cluster::start("");
    let d = c.add_worker("decode", "decode-a", None);
    let lies = Arc::new(Mutex::new(vec![Lie::Placeholder, Lie::WrongDigest, Lie::MissingPage]));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.spawn(rogue_prefill(c.cluster_addr.clone(), lies.clone()));
    c.wait_workers(1, 1);
    for kind in ["token_count", "prompt_digest", "incomplete"] {
        let before = violations(&c, d, kind);
        let err = expect_error_nothing_streamed(&c);
        assert!(err["error"]["message"].as_str().unwrap().contains(kind), "{kind}: {err}");
        assert_eq!(violations(&c, d, kind), before + 1.0, "{kind}");
        c.wait_pools_empty(&[d]);
    }
    assert!(lies.lock().unwrap().is_empty());
}

#[test]
fn a_prefill_worker_that_lies_about_the_pages_the_decode_worker_holds_gets_nothing_decoded() {
    let mut c = Cluster::start("");
    let d = c.add_worker("decode", "decode-a", None);
    let lies = Arc::new(Mutex::new(vec![Lie::Honest, Lie::SkipsUnheldPage, Lie::ResendsHeldPages]));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.spawn(rogue_prefill(c.cluster_addr.clone(), lies.clone()));
    c.wait_workers(1, 1);
    // A transfer every check passes: the decode worker decodes it and keeps the prompt's
    // whole pages, verified, for the tenant's next request.
    let (status, body) = c.post("/v1/chat/completions", &request(false));
    assert_eq!(status, 200, "{body}");
    let cached = metric(&c.worker_metrics(d), "pagewarden_worker_prefix_cache_pages", "");
    assert!(cached >= 1.0, "the decode worker holds the verified prompt pages: {cached}");
    // Told the decode worker holds them, the rogue skips one more page, or sends them anyway:
    // the decode worker's own count decides, and both transfers fail.
    for kind in ["incomplete", "duplicate"] {
        let before = violations(&c, d, kind);
        let err = expect_error_nothing_streamed(&c);
        assert!(err["error"]["message"].as_str().unwrap().contains(kind), "{kind}: {err}");
        assert_eq!(violations(&c, d, kind), before + 1.0, "{kind}");
        c.wait_pools_empty(&[d]);
    }
    assert!(lies.lock().unwrap().is_empty());
}

#[test]
fn a_rogue_prefill_workers_out_of_vocabulary_first_token_fails_only_its_request_while_bob_decodes_beside_it() {
    let mut c = Cluster::start("");
    let honest = c.add_worker("prefill", "prefill-a", None);
    let d = c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    let bob = json!({
        "model": common::MODEL_NAME,
        "messages": [{"role": "user", "content": "Write a long poem about the sea."}],
        "max_tokens": 64,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
    });
    let alone = stream_chat(&c.url, &c.key, bob.clone()).1.join().unwrap().unwrap();

    let lies = Arc::new(Mutex::new(vec![Lie::BadFirstToken]));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.spawn(rogue_prefill(c.cluster_addr.clone(), lies.clone()));
    c.wait_workers(2, 1);
    let before = violations(&c, d, "bad_first_token");
    let (started, bobs) = stream_chat(&c.url, &c.key, bob);
    {
        started.recv_timeout(Duration::from_secs(60)).expect("bob's stream started");
        // With the honest prefill worker gone (bob's KV is already on the decode worker, so his
        // stream carries on), this request goes to the rogue, and its KV to the decode worker
        // where bob is decoding.
        kill9(c.workers[honest].pid);
        wait_prefill_workers(&c, 1);
        let err = expect_error_nothing_streamed(&c);
        assert!(err["error"]["message"].as_str().unwrap().contains("bad_first_token"), "{err}");
        let bobs = bobs.join().unwrap().expect("bob's stream completes");
        assert_eq!(bobs, alone, "bob's output equals his output alone");
    }
    assert!(lies.lock().unwrap().is_empty(), "the rogue got the request");
    assert_eq!(violations(&c, d, "bad_first_token"), before + 1.0, "counted by kind");
    c.wait_pools_empty(&[d]);
}

#[test]
fn a_worker_reporting_an_unknown_violation_kind_cannot_change_the_exposition_text() {
    let c = Cluster::start("");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let before = c.gateway_metrics();
    let addr = c.cluster_addr.clone();
    let kept = rt.block_on(async {
        let me = node_identity(Role::Decode);
        let link =
            Link::connect(Net::default().dial(&addr).await.unwrap(), &me, Duration::from_secs(10)).await.unwrap();
        let (mut rd, mut wr) = link.split();
        let reg = Register {
            name: "liar".into(),
            kv_addr: Some("127.0.0.1:1".into()),
            context: 8192,
            capacity_tokens: 16384,
        };
        wr.send(&reg).await.unwrap();
        assert!(matches!(rd.recv::<Registered>().await.unwrap(), Some(Registered::Accepted(_))));
        // A stats report whose violation kind is no kind: it would write its own sample.
        let kind = "x\"} 99\npagewarden_isolation_violations_total{kind=\"forged";
        let mut stats = serde_json::to_value(cluster::proto::Stats::default()).unwrap();
        stats["violations"] = json!([[kind, 1]]);
        wr.send(&json!({ "Stats": stats })).await.unwrap();
        // The gateway cannot decode it: it counts it and drops the message (it names no route),
        // and the link stays (no other route on it pays for one bad message).
        let t0 = std::time::Instant::now();
        while metric(&c.gateway_metrics(), "pagewarden_link_failures_total", "undecodable_message") < 1.0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the undecodable report was not counted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::timeout(Duration::from_millis(500), rd.recv::<ToWorker>()).await.is_err()
    });
    assert!(kept, "the gateway closed the link of a worker over one undecodable report");
    let after = c.gateway_metrics();
    assert!(!after.contains("forged") && !after.contains(" 99"), "{after}");
    let kinds = |m: &str| {
        m.lines().filter(|l| l.contains("kind=")).map(|l| l.split(' ').next().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(kinds(&after), kinds(&before), "the same kind labels as before");
}

/// Waits (at most 30 s) until the gateway counts `n` prefill workers (it saw one go).
fn wait_prefill_workers(c: &Cluster, n: usize) {
    let t0 = Instant::now();
    while metric(&c.gateway_metrics(), "pagewarden_cluster_workers", "role=\"prefill\"") as usize != n {
        assert!(t0.elapsed() < Duration::from_secs(30), "the gateway did not come to count {n} prefill workers");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kill9(pid: u32) {
    let st = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(st.success());
}

#[test]
fn killed_workers_end_in_a_retried_success_or_an_error_and_every_pool_returns_to_zero() {
    let proxy = Proxy::start();
    let mut c = Cluster::start("");
    let pa = c.add_worker("prefill", "prefill-a", None);
    let pb = c.add_worker("prefill", "prefill-b", None);
    let d = c.add_worker("decode", "decode-a", Some(&proxy.addr));
    proxy.state.lock().unwrap().upstream = c.workers[d].kv_addr.clone();
    c.wait_workers(2, 1);
    let want = ok_text(&c);

    // Kill -9 the prefill worker whose transfer the proxy holds mid-way (the decode worker has
    // its first frame only): the request is retried once, on the other prefill worker.
    proxy.set(Fault::Stall);
    let sent = |i: usize| c.worker_metric(i, "pagewarden_kv_frames_sent_total", "");
    let before = [sent(pa), sent(pb)];
    let (victim, (status, body)) = std::thread::scope(|s| {
        let h = s.spawn(|| c.post("/v1/chat/completions", &request(false)));
        let t0 = Instant::now();
        let victim = loop {
            if sent(pa) > before[0] {
                break pa;
            }
            if sent(pb) > before[1] {
                break pb;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no transfer started");
            std::thread::sleep(Duration::from_millis(10));
        };
        kill9(c.workers[victim].pid);
        (victim, h.join().unwrap())
    });
    let t_retry = Instant::now();
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), want, "the retried request's output");
    assert!(t_retry.elapsed() < Duration::from_secs(60));
    let survivor = if victim == pa { pb } else { pa };
    c.kill(victim);
    c.wait_pools_empty(&[survivor, d]);

    // Kill -9 the decode worker mid-decode: after the first tokens were streamed the request
    // cannot be retried; it ends with an error event, never [DONE].
    let body = json!({
        "model": common::MODEL_NAME,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 2000,
        "ignore_eos": true,
        "temperature": 0,
        "stream": true,
    });
    let mut r = common::cluster::agent()
        .post(format!("{}/v1/chat/completions", c.url))
        .header("Authorization", format!("Bearer {}", c.key))
        .header("Content-Type", "application/json")
        .send(body.to_string().as_bytes())
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut reader = std::io::BufReader::new(r.body_mut().as_reader());
    let mut events = Vec::new();
    let mut line = String::new();
    let t0 = Instant::now();
    while std::io::BufRead::read_line(&mut reader, &mut line).unwrap() > 0 {
        if let Some(ev) = line.trim().strip_prefix("data: ") {
            events.push(ev.to_string());
            if events.len() == 5 {
                kill9(c.workers[d].pid);
            }
        }
        line.clear();
    }
    assert!(t0.elapsed() < Duration::from_secs(60), "the stream did not end in bounded time");
    let last = events.last().unwrap();
    assert!(last.contains("\"error\""), "the stream ended with {last}");
    assert!(!events.iter().any(|e| e == "[DONE]"));
    c.kill(d);
    c.wait_pools_empty(&[survivor]);
}

#[test]
fn a_stream_outlives_its_prefill_worker_once_the_kv_is_handed_over() {
    let mut c = Cluster::start("");
    let p = c.add_worker("prefill", "prefill-a", None);
    let d = c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    let body = |stream: bool| {
        json!({
            "model": common::MODEL_NAME,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 256,
            "ignore_eos": true,
            "temperature": 0,
            "stream": stream,
        })
    };
    let (status, whole) = c.post("/v1/chat/completions", &body(false));
    assert_eq!(status, 200, "{whole}");
    let want = serde_json::from_str::<Value>(&whole).unwrap()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();

    // The prefill worker is killed once the first token is out (the decode worker verified the
    // KV): the gateway sees it go while the stream is still decoding, and the stream, carried
    // by the decode worker alone, runs to its end with the same text as without the kill.
    let (deltas, h) = stream_chat(&c.url, &c.key, body(true));
    deltas.recv_timeout(Duration::from_secs(60)).expect("a first token");
    kill9(c.workers[p].pid);
    wait_prefill_workers(&c, 0);
    let ended_early = h.is_finished();
    let got = h.join().unwrap().unwrap_or_else(|e| panic!("the stream ended with an error: {e}"));
    assert!(!ended_early, "the stream ended before the prefill worker's loss reached the gateway");
    assert_eq!(got, want);
    c.kill(p);
    c.wait_pools_empty(&[d]);
    assert_eq!(c.worker_metric(d, "pagewarden_isolation_violations_total", ""), 0.0);
}
