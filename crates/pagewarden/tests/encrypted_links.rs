#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What the network between nodes sees and can do, tried with relays on every cluster link of
//! real gateway, prefill and decode processes: a passive observer reads nothing (no prompt, no
//! output, no token id, no plaintext KV); an active one gets every forgery, replay, reflection
//! and flood refused and counted, nothing of a tampered request streamed, and the next request
//! served with the same greedy output. Secrets rotate without a restart.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::{Identity, Link, Net, SecretRing};
use common::cluster::{metric, Cluster, SECRET};
use common::relay::{Dir, Relay};
use common::{bin, chat, generate_cli};
use serde_json::{json, Value};
use wire::{ClusterSecret, HandshakeMsg, PairingInfo, RefusalCode, Role, WireError};

const CANARIES: [&str; 3] = ["Vorlaxite-Quibbleton-4471", "Zephyrine-Marbloch-9038", "Krumholtz-Ulvenmark-2265"];

/// Long enough for several KV frames (pages of 16 tokens).
const LONG: &str = "Tell me a short story about a lighthouse keeper who finds a message in a bottle, \
    in three sentences, with a happy ending, and give it a title.";

fn tokenize(text: &str) -> Vec<u32> {
    let out = Command::new(bin()).args(["tokenize", text]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Every run of three consecutive ids, as they would appear in JSON and as little-endian u32s.
fn id_runs(ids: &[u32]) -> Vec<Vec<u8>> {
    ids.windows(3)
        .flat_map(|w| {
            let json = format!("{},{},{}", w[0], w[1], w[2]).into_bytes();
            let le: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
            [json, le]
        })
        .collect()
}

fn content(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn link_failures(metrics: &str, reason: &str) -> f64 {
    metric(metrics, "pagewarden_link_failures_total", &format!("reason=\"{reason}\""))
}

/// A config for one worker: the cluster's, with `extra` lines in its `[cluster]` table.
fn config_with(c: &Cluster, name: &str, extra: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&c.config).unwrap().replace("[cluster]\n", &format!("[cluster]\n{extra}\n"));
    let path = c.dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn identity(secret: &str, role: Role) -> Identity {
    let model = fetch::ensure_default_model().unwrap();
    let layout = kv::KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: kv::KvDtype::F16 };
    Identity {
        secrets: SecretRing::single(
            ClusterSecret::from_passphrase(secret.as_bytes()),
            common::cluster::harness_key(),
            common::cluster::harness_trusted(),
        ),
        role,
        pairing: PairingInfo::new(cluster::model_digest(&model).unwrap(), &layout).unwrap(),
    }
}

/// Dials `addr` and runs the handshake as `me`.
fn dial(addr: &str, me: &Identity) -> Result<(), cluster::ClusterError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let io = Net::default().dial(addr).await?;
        Link::connect(io, me, Duration::from_secs(10)).await.map(drop)
    })
}

/// Sends `bytes` on a fresh connection and reads until the peer closes.
fn replay(addr: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(bytes);
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
}

#[test]
fn a_recording_relay_on_every_cluster_link_reads_no_prompt_output_token_id_or_kv() {
    let mut c = Cluster::start("");
    let (control, kv) = (Relay::start(), Relay::start());
    control.set_upstream(&c.cluster_addr);
    let config = c.config.clone();
    c.add_worker_at("prefill", "prefill-a", None, &control.addr, &config);
    let d = c.add_worker_at("decode", "decode-a", Some(&kv.addr), &control.addr, &config);
    kv.set_upstream(c.workers[d].kv_addr.as_deref().unwrap());
    c.wait_workers(1, 1);

    let mut secrets: Vec<Vec<u8>> = Vec::new();
    for canary in CANARIES {
        let prompt = format!("Please repeat this code word exactly, then explain it: {canary}");
        let want = generate_cli(&prompt, 24);
        let (status, body) = c.post("/v1/chat/completions", &chat(&prompt, 24));
        assert_eq!(status, 200, "{body}");
        let text = content(&body);
        assert_eq!(text, want["text"].as_str().unwrap(), "greedy output through the encrypted links");
        secrets.push(canary.as_bytes().to_vec());
        secrets.extend(canary.split('-').filter(|w| w.len() >= 6).map(|w| w.as_bytes().to_vec()));
        if text.len() >= 8 {
            secrets.push(text.as_bytes().to_vec());
            secrets.push(text.as_bytes()[..8].to_vec());
        }
        secrets.extend(id_runs(&tokenize(&prompt)));
        let out: Vec<u32> = want["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        secrets.extend(id_runs(&out));
    }

    let (control_bytes, kv_bytes) = (control.all_bytes(), kv.all_bytes());
    assert!(kv.captures().len() >= CANARIES.len(), "one KV link per transfer went through the relay");
    assert!(control_bytes.len() > 1000 && kv_bytes.len() > 3 * 100_000, "the relays saw the traffic");
    for (what, bytes) in [("control", &control_bytes), ("KV", &kv_bytes)] {
        for s in &secrets {
            assert!(!contains(bytes, s), "the {what} links show {:?}", String::from_utf8_lossy(s));
        }
    }
    // KV in clear compresses (f16 values of nearby magnitude); ciphertext does not.
    let packed = miniz_oxide::deflate::compress_to_vec(&kv_bytes, 6);
    assert!(
        packed.len() as f64 > 0.99 * kv_bytes.len() as f64,
        "KV capture compresses to {} of {}",
        packed.len(),
        kv_bytes.len()
    );
    let m = c.worker_metrics(d);
    assert_eq!(metric(&m, "pagewarden_isolation_violations_total", ""), 0.0, "{m}");
    assert_eq!(metric(&m, "pagewarden_link_failures_total", ""), 0.0, "{m}");
}

/// A streamed request that must fail: an error, nothing of the answer streamed.
fn expect_failure_nothing_streamed(c: &Cluster, want: &str) {
    let mut body = chat(LONG, 12);
    body["stream"] = json!(true);
    let (status, text) = c.post("/v1/chat/completions", &body);
    if status == 200 && text.contains("data:") {
        // Retried on a fresh link before anything was released: then it must be whole.
        let streamed: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|l| *l != "[DONE]")
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(String::from))
            .collect();
        assert!(text.contains("[DONE]") && streamed == want, "a tampered request streamed {text}");
    } else {
        assert!(status >= 500, "status {status}: {text}");
        assert!(!text.contains("data:"), "something was streamed: {text}");
    }
}

#[test]
fn an_active_attacker_on_the_links_is_refused_and_counted_and_the_next_request_succeeds() {
    let mut c = Cluster::start("");
    let (control, kv) = (Relay::start(), Relay::start());
    control.set_upstream(&c.cluster_addr);
    let capped = config_with(&c, "capped.toml", "max_pending_handshakes = 2");
    let p = c.add_worker("prefill", "prefill-a", None);
    // The decode worker's control link: the gateway's first request to it gets a flipped bit.
    control.tamper_next(Dir::Down, 3);
    let d = c.add_worker_at("decode", "decode-a", Some(&kv.addr), &control.addr, &capped);
    let kv_addr = c.workers[d].kv_addr.clone().unwrap();
    kv.set_upstream(&kv_addr);
    c.wait_workers(1, 1);
    let want = generate_cli(LONG, 12)["text"].as_str().unwrap().to_string();
    let ok = |c: &Cluster| {
        let (status, body) = c.post("/v1/chat/completions", &chat(LONG, 12));
        assert_eq!(status, 200, "{body}");
        assert_eq!(content(&body), want);
    };

    // 1. A bit flipped on a control link: the worker cannot open the record, drops the link
    //    and counts it; the request it carried ends in an error (or a whole retried answer).
    expect_failure_nothing_streamed(&c, &want);
    wait_for("the decode worker to count the tampered record", || {
        link_failures(&c.worker_metrics(d), "bad_mac") == 1.0
    });
    c.wait_workers(1, 1);
    ok(&c);

    // 2. A bit flipped in a KV frame: the transfer fails as an isolation violation.
    let before = c.worker_metric(d, "pagewarden_isolation_violations_total", "kind=\"bad_mac\"");
    kv.tamper_next(Dir::Up, 3);
    expect_failure_nothing_streamed(&c, "");
    assert_eq!(c.worker_metric(d, "pagewarden_isolation_violations_total", "kind=\"bad_mac\""), before + 1.0);
    c.wait_pools_empty(&[p, d]);
    ok(&c);

    // 3. Recorded links replayed into new connections: the replayed hello gets a reply under
    //    fresh keys, and the replayed records do not open.
    let kv_link = kv.captures().last().unwrap().up.clone();
    replay(&kv_addr, &kv_link);
    wait_for("the decode worker to count the replayed KV link", || {
        link_failures(&c.worker_metrics(d), "bad_mac") == 2.0
    });
    let control_link = control.captures().last().unwrap().up.clone();
    replay(&c.cluster_addr, &control_link);
    wait_for("the gateway to count the replayed control link", || {
        link_failures(&c.gateway_metrics(), "bad_mac") >= 1.0
    });
    assert_eq!(metric(&c.gateway_metrics(), "pagewarden_cluster_workers", ""), 2.0, "no worker joined by replay");

    // 4. Handshakes under another secret, and peers claiming the listener's own role.
    let wrong = identity("not-the-cluster-secret-0123456789abcdef", Role::Prefill);
    for addr in [&c.cluster_addr, &kv_addr] {
        let e = dial(addr, &wrong).unwrap_err();
        assert!(matches!(e, cluster::ClusterError::Wire(WireError::Refused(RefusalCode::BadProof))), "{e}");
    }
    for (addr, role) in [(&c.cluster_addr, Role::Gateway), (&kv_addr, Role::Decode)] {
        let e = dial(addr, &identity(SECRET, role)).unwrap_err();
        assert!(matches!(e, cluster::ClusterError::Wire(WireError::Refused(RefusalCode::Reflection))), "{e}");
    }
    let (gm, dm) = (c.gateway_metrics(), c.worker_metrics(d));
    assert_eq!((link_failures(&gm, "bad_proof"), link_failures(&gm, "reflection")), (1.0, 1.0), "{gm}");
    assert_eq!((link_failures(&dm, "bad_proof"), link_failures(&dm, "reflection")), (1.0, 1.0), "{dm}");

    // 5. A flood of connections that never finish a handshake: past the cap (2) they are
    //    turned away at once, counted; when they go, service resumes.
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&kv_addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(&kv_addr).unwrap();
    third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut refusal = Vec::new();
    let _ = third.read_to_end(&mut refusal);
    assert_eq!(HandshakeMsg::decode(&refusal).unwrap(), HandshakeMsg::Refused(RefusalCode::Busy));
    assert_eq!(link_failures(&c.worker_metrics(d), "busy"), 1.0);
    drop(idle);
    wait_for("the idle connections to leave the gate", || {
        let m = c.worker_metrics(d);
        ["io", "malformed", "timeout"].iter().map(|r| link_failures(&m, r)).sum::<f64>() >= 2.0
    });

    ok(&c);
    c.wait_pools_empty(&[p, d]);
}

#[test]
fn a_decode_worker_dialling_its_own_kv_port_refuses_the_reflection_and_exits_naming_it() {
    let c = Cluster::start("");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let out = Command::new(bin())
        .args(["decode", "--config", c.config.to_str().unwrap(), "--gateway", &addr, "--kv-listen", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Reflection"), "{err}");
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Lets this process hold `n` sockets at once.
fn raise_open_files(n: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < n {
            lim.rlim_cur = n.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
        assert!(lim.rlim_cur >= n, "the hard limit on open files is {}", lim.rlim_max);
    }
}

fn registered(c: &Cluster, role: &str) -> f64 {
    metric(&c.gateway_metrics(), "pagewarden_cluster_workers", &format!("role=\"{role}\""))
}

/// `per_addr` connections from 127.0.0.2 (every node of the cluster is on 127.0.0.1) to each
/// of `addrs` that never send a byte; each is dialled again a second after the listener
/// closes it, until the flood is dropped.
struct Flood {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dialled: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Flood {
    fn start(addrs: &[&str], per_addr: usize) -> Flood {
        let addrs: Vec<std::net::SocketAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
        let dialled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counter = dialled.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                for addr in addrs {
                    for _ in 0..per_addr {
                        let counter = counter.clone();
                        tokio::spawn(async move {
                            loop {
                                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                                socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                                if let Ok(mut s) = socket.connect(addr).await {
                                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let mut sink = [0u8; 64];
                                    while let Ok(n) = tokio::io::AsyncReadExt::read(&mut s, &mut sink).await {
                                        if n == 0 {
                                            break;
                                        }
                                    }
                                }
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                        });
                    }
                }
                let _ = stopped.await;
            });
        });
        Flood { stop: Some(stop), thread: Some(thread), dialled }
    }

    fn dialled(&self) -> usize {
        self.dialled.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_flood_of_idle_connections_from_one_address_holds_a_few_mib_and_keeps_no_node_out() {
    raise_open_files(4096);
    let mut c = Cluster::start("");
    let p = c.add_worker("prefill", "prefill-a", None);
    let d = c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    let kv_addr = c.workers[d].kv_addr.clone().unwrap();
    let want = generate_cli(LONG, 12)["text"].as_str().unwrap().to_string();
    let ok = |c: &Cluster| {
        let (status, body) = c.post("/v1/chat/completions", &chat(LONG, 12));
        assert_eq!(status, 200, "{body}");
        assert_eq!(content(&body), want);
    };
    // Whatever a first request allocates for good is not the flood's.
    ok(&c);
    std::thread::sleep(Duration::from_millis(500));
    let (gateway, decode) = (c.gateway_pid(), c.workers[d].pid);
    let before = (rss_kib(gateway), rss_kib(decode));

    // 1,000 idle connections from one address to the gateway's cluster port and as many to
    // the decode worker's KV port, held (and redialled) throughout.
    let flood = Flood::start(&[&c.cluster_addr, &kv_addr], 1000);
    let mut peak = before;
    let sample = |peak: &mut (u64, u64)| {
        *peak = (peak.0.max(rss_kib(gateway)), peak.1.max(rss_kib(decode)));
    };
    wait_for("the flood to be refused past its address's share", || {
        sample(&mut peak);
        flood.dialled() >= 2000
            && link_failures(&c.gateway_metrics(), "busy_source") >= 800.0
            && link_failures(&c.worker_metrics(d), "busy_source") >= 800.0
    });

    // A new worker, from another address than the flood's, registers at once.
    let refused_before = link_failures(&c.gateway_metrics(), "busy_source");
    let q = c.add_worker("prefill", "prefill-b", None);
    let t0 = Instant::now();
    while registered(&c, "prefill") < 2.0 {
        sample(&mut peak);
        assert!(t0.elapsed() < Duration::from_secs(2), "a worker took over 2 s to register under the flood");
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed();
    // The flood did not pause for it: its redials are still being refused around the
    // registration (a registration of a few ms may fall between two of them, so this looks
    // at the moments after it, not only inside it).
    wait_for("the flood to go on around the registration", || {
        link_failures(&c.gateway_metrics(), "busy_source") > refused_before
    });
    // Connections that send nothing are dropped at the pre-authentication deadline.
    wait_for("the held flood connections to time out", || {
        sample(&mut peak);
        link_failures(&c.gateway_metrics(), "preauth_timeout") >= 100.0
            && link_failures(&c.worker_metrics(d), "preauth_timeout") >= 100.0
    });
    sample(&mut peak);
    let rise = (peak.0.saturating_sub(before.0), peak.1.saturating_sub(before.1));
    eprintln!(
        "under a flood of {} connections: registered in {took:?}; resident memory rose {} KiB (gateway), {} KiB (decode)",
        flood.dialled(),
        rise.0,
        rise.1
    );
    assert!(rise.0 <= 4096 && rise.1 <= 4096, "resident memory rose {rise:?} KiB (gateway, decode)");
    // Routes still cross the flooded KV port (a prefill worker dials it for each).
    ok(&c);
    ok(&c);
    drop(flood);
    ok(&c);
    c.wait_pools_empty(&[p, q, d]);
}

#[test]
fn a_kv_frame_claiming_16_mib_with_only_its_header_sent_is_refused_from_the_header_and_allocates_nothing() {
    let mut c = Cluster::start("");
    let d = c.add_worker("decode", "decode-a", None);
    wait_for("the decode worker to register", || registered(&c, "decode") == 1.0);
    let kv_addr = c.workers[d].kv_addr.clone().unwrap();
    let before = rss_kib(c.workers[d].pid);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let largest = wire::DEFAULT_MAX_FRAME;
    // A node holding the secret (a compromised prefill worker) sends a frame's length and its
    // header, then nothing: the decode worker must not wait for, or make room for, the rest.
    let send_head = |head: &dyn Fn(&mut wire::KvSealer) -> Vec<u8>| {
        rt.block_on(async {
            let io = Net::default().dial(&kv_addr).await.unwrap();
            let link = Link::connect(io, &common::cluster::node_identity(Role::Prefill), Duration::from_secs(10))
                .await
                .unwrap();
            let (mut io, mut sealer) = link.into_kv_sealer();
            let bytes = head(&mut sealer);
            assert_eq!(bytes.len(), wire::HEADER_LEN);
            let t0 = Instant::now();
            tokio::io::AsyncWriteExt::write_all(&mut io, &bytes).await.unwrap();
            let mut rest = Vec::new();
            let closed =
                tokio::time::timeout(Duration::from_secs(3), tokio::io::AsyncReadExt::read_to_end(&mut io, &mut rest))
                    .await;
            assert!(closed.is_ok(), "the decode worker waited for the claimed 16 MiB");
            t0.elapsed()
        })
    };
    // A forged header: fails to open under the link key.
    let forged = send_head(&|_| {
        let mut b = vec![0x5a; wire::HEADER_LEN];
        b[..4].copy_from_slice(&((largest - 4) as u32).to_le_bytes());
        b
    });
    // An authentic header for a ticket the decode worker does not hold.
    let unknown = send_head(&|sealer| {
        let ticket = wire::TicketId {
            nonce: wire::TicketNonce([9; 16]),
            request: wire::RequestId(1),
            tenant: wire::TenantId(1),
        };
        let mut payload = vec![0u8; largest - wire::FRAME_OVERHEAD];
        let kv = wire::KvFrameMut { page_index: 0, layers: 0..1, tokens: 0..1, payload: &mut payload };
        sealer.seal_kv(&ticket, 0, kv).unwrap().head.to_vec()
    });
    let m = c.worker_metrics(d);
    assert_eq!(metric(&m, "pagewarden_isolation_violations_total", "kind=\"bad_mac\""), 1.0, "{m}");
    assert_eq!(metric(&m, "pagewarden_isolation_violations_total", "kind=\"unknown_ticket\""), 1.0, "{m}");
    let rise = rss_kib(c.workers[d].pid).saturating_sub(before);
    eprintln!("closed after {forged:?} (forged) and {unknown:?} (unknown ticket); resident memory rose {rise} KiB");
    assert!(rise < 4096, "the decode worker's resident memory rose {rise} KiB");
}

/// One request of the load a revocation runs under: whether a token had arrived, and how it
/// ended.
struct Outcome {
    streaming: bool,
    result: Result<String, Value>,
}

/// `pagewarden node revoke KEY` on the cluster's config, as an operator runs it.
fn revoke(c: &Cluster, key: &str) {
    let out =
        Command::new(bin()).args(["node", "revoke", key, "--config", c.config.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Streaming requests, two at a time, until `stop` is set.
fn load(
    c: &Cluster,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<Outcome>>> {
    (0..2)
        .map(|_| {
            let (url, key, stop) = (c.url.clone(), c.key.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let body = common::chat_to_length("Count from one to twenty in words.", 24, true);
                    let (deltas, h) = common::cluster::stream_chat(&url, &key, body);
                    let result = h.join().unwrap_or_else(|_| Err(json!({"error": "the request was refused"})));
                    out.push(Outcome { streaming: deltas.try_recv().is_ok(), result });
                }
                out
            })
        })
        .collect()
}

#[test]
fn a_revoked_node_is_evicted_within_seconds_gets_no_route_and_cannot_reconnect_while_requests_go_on() {
    let mut c = Cluster::start("");
    let p = c.add_worker("prefill", "prefill-a", None);
    let d1 = c.add_worker("decode", "decode-a", None);
    let d2 = c.add_worker("decode", "decode-b", None);
    c.wait_workers(1, 2);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = load(&c, stop.clone());
    std::thread::sleep(Duration::from_secs(2));

    // The operator removes decode-b's key from the allow-list and reloads every node.
    let revoked = c.workers[d2].node_key.clone();
    revoke(&c, &revoked);
    assert!(!std::fs::read_to_string(&c.config).unwrap().contains(&revoked));
    let t0 = Instant::now();
    assert!(Command::new("kill").args(["-HUP", &c.gateway_pid().to_string()]).status().unwrap().success());
    for w in [p, d1, d2] {
        c.signal(w, "-HUP");
    }
    wait_for("the gateway to drop the revoked decode worker", || registered(&c, "decode") == 1.0);
    let evicted = t0.elapsed();
    println!("revoked node evicted {:.2} s after SIGHUP", evicted.as_secs_f64());
    assert!(evicted < Duration::from_secs(5), "evicted after {evicted:?}");

    // It dials again, is refused as untrusted, and stops: it gets no further route.
    let st = c.wait_exit(d2, Duration::from_secs(20));
    assert!(!st.success());
    let m = c.gateway_metrics();
    assert!(link_failures(&m, "untrusted_node") >= 2.0, "the eviction and the refused reconnection: {m}");
    let routed_after = metric(&m, "pagewarden_worker_routes_total", "worker=\"decode-b\"");
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let outcomes: Vec<Outcome> = clients.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert_eq!(metric(&c.gateway_metrics(), "pagewarden_worker_routes_total", "worker=\"decode-b\""), routed_after);

    // No request failed but, at most, one per client already streaming from decode-b.
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.result.is_err()).collect();
    println!("{} requests under the revocation, {} failed mid-stream", outcomes.len(), failed.len());
    assert!(failed.iter().all(|o| o.streaming), "a request failed before its first token: {:?}", failed[0].result);
    assert!(failed.len() <= 2, "{} requests failed", failed.len());
    assert!(outcomes.len() >= 6, "only {} requests ran", outcomes.len());
    let (status, body) = c.post("/v1/chat/completions", &chat("What is 12 times 7?", 8));
    assert_eq!(status, 200, "{body}");
    c.wait_pools_empty(&[p, d1]);
}

/// An identity whose node key no node of the test clusters pins, holding the cluster secret.
fn stranger(role: Role) -> Identity {
    let mut me = identity(SECRET, role);
    let key = wire::NodeKey::from_private([0x99; 32]).unwrap();
    me.secrets =
        SecretRing::single(ClusterSecret::from_passphrase(SECRET.as_bytes()), key, common::cluster::harness_trusted());
    me
}

#[test]
fn a_node_whose_key_is_not_pinned_is_refused_on_every_port_and_counted() {
    let mut c = Cluster::start("");
    let p = c.add_worker("prefill", "prefill-a", None);
    let d = c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);

    // A worker with a fresh key from `node keygen`, never pinned: refused by the gateway, it
    // stops, naming why.
    let keys = common::cluster::keygen(&c.dir, "unpinned", 1);
    let out = Command::new(bin())
        .args(["decode", "--config", c.config.to_str().unwrap(), "--gateway", &c.cluster_addr])
        .args(["--kv-listen", "127.0.0.1:0", "--node-key"])
        .arg(&keys[0].0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Untrusted"), "{err}");
    assert_eq!(registered(&c, "decode"), 1.0);
    assert!(link_failures(&c.gateway_metrics(), "untrusted_node") >= 1.0);

    // The same key on the cluster port and on a decode worker's KV port, holding the secret.
    let refused = |addr: &str, role| match dial(addr, &stranger(role)) {
        Err(cluster::ClusterError::Wire(WireError::Refused(RefusalCode::Untrusted))) => true,
        other => panic!("{addr}: {other:?}"),
    };
    assert!(refused(&c.cluster_addr.clone(), Role::Decode));
    assert!(refused(&c.workers[d].kv_addr.clone().unwrap(), Role::Prefill));
    assert!(link_failures(&c.worker_metrics(d), "untrusted_node") >= 1.0);

    // A gateway whose key the worker does not pin: the worker checks whom it dials.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (mut listener, addr) = rt.block_on(Net::default().listen("127.0.0.1:0")).unwrap();
    let mut child = Command::new(bin())
        .args(["prefill", "--config", c.config.to_str().unwrap(), "--gateway", &addr])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let accepted = rt.block_on(async {
        let io = tokio::time::timeout(Duration::from_secs(120), listener.accept()).await.unwrap().unwrap();
        Link::accept(io, &stranger(Role::Gateway), Duration::from_secs(10)).await.map(drop)
    });
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let worker = (status, err);
    assert!(accepted.is_err());
    assert!(!worker.0.success());
    assert!(worker.1.contains("not trusted"), "{}", worker.1);

    let (status, body) = c.post("/v1/chat/completions", &chat("What is 12 times 7?", 8));
    assert_eq!(status, 200, "{body}");
    c.wait_pools_empty(&[p, d]);
}

#[test]
fn a_kv_link_from_a_revoked_node_is_cut_within_seconds_not_left_to_its_idle_timeout() {
    let mut c = Cluster::start("");
    c.add_worker("prefill", "prefill-a", None);
    let d = c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    let kv_addr = c.workers[d].kv_addr.clone().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // A KV link as the harness's prefill identity, pinned, holding the secret: it is up, and
    // would idle for the 30 s transfer timeout.
    let me = identity(SECRET, Role::Prefill);
    let link = rt
        .block_on(async {
            let io = Net::default().dial(&kv_addr).await?;
            Link::connect(io, &me, Duration::from_secs(10)).await
        })
        .unwrap();
    let (mut io, _opener) = link.into_kv_opener();

    revoke(&c, &common::cluster::harness_key().public().to_hex());
    let t0 = Instant::now();
    c.signal(d, "-HUP");
    let read = rt.block_on(async {
        let mut byte = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut io, &mut byte)).await
    });
    let cut = t0.elapsed();
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the link is still up {cut:?} after SIGHUP: {read:?}");
    println!("KV link from the revoked node cut {:.3} s after SIGHUP", cut.as_secs_f64());
    wait_for("the cut to be counted", || link_failures(&c.worker_metrics(d), "untrusted_node") >= 1.0);
}
