#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Membership through a real etcd (`[membership]`): gateways and workers as separate processes
//! find each other there. Several gateways share the workers, losing one gateway ends only
//! the streams it carried, a worker that joins takes load without a restart, one that drains
//! (SIGTERM) finishes its streams and leaves, one whose lease expires (stopped, its link still
//! open) is dropped and comes back when it resumes, etcd going away stops nothing that runs
//! (a worker started meanwhile waits for it), and live gateways share each tenant's limits;
//! entries written by anyone without the cluster secret, or with it but not signed by a pinned
//! node, neither count nor get dialled, and a pinned node's extra entries hold no extra share.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::cluster::{metric, stream_chat, Cluster};
use common::{chat, chat_to_length, PROMPTS};
use launch::etcd::EtcdServer;
use serde_json::Value;

fn content(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

/// Waits until `cond` holds, at most `within`.
fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < within, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_gateways_found_through_etcd_share_the_workers_and_losing_one_ends_only_its_streams() {
    let etcd = EtcdServer::start().unwrap();
    let mut c = Cluster::start_with_etcd(&etcd.endpoint(), "");
    let b = c.add_gateway();
    let b_url = c.more_gateways[b].url.clone();
    c.add_worker("prefill", "prefill-a", None);
    c.add_worker("decode", "decode-a", None);
    // Neither worker was told a gateway address: both registered with both gateways.
    c.wait_workers(1, 1);
    c.wait_workers_on(&b_url, 1, 1);

    let (status, body) = c.post("/v1/chat/completions", &chat(PROMPTS[0], 16));
    assert_eq!(status, 200, "{body}");
    let (status, body_b) = c.post_to(&b_url, "/v1/chat/completions", &chat(PROMPTS[0], 16));
    assert_eq!(status, 200, "{body_b}");
    assert_eq!(content(&body), content(&body_b), "the same greedy answer through either gateway");

    // A stream through each gateway; then the first gateway is killed mid-stream.
    let (started_a, on_a) = stream_chat(&c.url, &c.key, chat_to_length(PROMPTS[1], 160, true));
    let (started_b, on_b) = stream_chat(&b_url, &c.key, chat_to_length(PROMPTS[2], 160, true));
    started_a.recv_timeout(Duration::from_secs(60)).expect("the stream through gateway A started");
    started_b.recv_timeout(Duration::from_secs(60)).expect("the stream through gateway B started");
    c.kill_gateway();
    let a = on_a.join();
    assert!(!matches!(a, Ok(Ok(_))), "a stream through the killed gateway cannot complete: {a:?}");
    let text_b = on_b.join().unwrap().expect("the stream through gateway B completes with [DONE]");
    assert!(!text_b.is_empty());

    // B goes on serving, and the workers freed the killed gateway's route.
    let (status, body) = c.post_to(&b_url, "/v1/chat/completions", &chat(PROMPTS[3], 8));
    assert_eq!(status, 200, "{body}");
    c.wait_pools_empty(&[0, 1]);
    c.wait_workers_on(&b_url, 1, 1);
}

#[test]
fn a_worker_that_joins_takes_load_and_one_that_drains_finishes_its_stream_and_leaves() {
    let etcd = EtcdServer::start().unwrap();
    // The drain waits as long as the busy stream may need on a slow machine (a machine
    // without AVX-512 decodes the test build at a few tens of tokens a second).
    let mut c = Cluster::start_with_etcd(&etcd.endpoint(), "[limits]\ndrain_timeout_s = 180\n");
    c.add_worker("prefill", "prefill-a", None);
    let d1 = c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    // The busy worker: a stream holds decode-a while decode-b joins, long enough to outlast
    // decode-b's start (were it over first, both would be idle and the tie would go to
    // decode-a): 120 tokens once did, until decode got faster.
    let (started, busy) = stream_chat(&c.url, &c.key, chat_to_length(PROMPTS[1], 1000, true));
    started.recv_timeout(Duration::from_secs(60)).expect("the stream started");
    let d2 = c.add_worker("decode", "decode-b", None);
    c.wait_workers(1, 2);
    // The least loaded decode worker is the new one: it takes the next request.
    let (status, body) = c.post("/v1/chat/completions", &chat(PROMPTS[0], 8));
    assert_eq!(status, 200, "{body}");
    assert!(c.worker_metric(d2, "pagewarden_worker_reservations_total", "") >= 1.0, "decode-b took no load");

    // A second stream (on decode-b, the less loaded), then SIGTERM drains decode-a while
    // its stream runs.
    let (started, other) = stream_chat(&c.url, &c.key, chat_to_length(PROMPTS[2], 120, true));
    started.recv_timeout(Duration::from_secs(60)).expect("the second stream started");
    c.signal(d1, "-TERM");
    // New requests go to decode-b while decode-a finishes what it has.
    for p in PROMPTS {
        let (status, body) = c.post("/v1/chat/completions", &chat(p, 8));
        assert_eq!(status, 200, "{body}");
    }
    let text = busy.join().unwrap().expect("decode-a's stream finishes with [DONE] while it drains");
    assert!(!text.is_empty());
    other.join().unwrap().expect("the other stream finishes too");
    let st = c.wait_exit(d1, Duration::from_secs(60));
    assert!(st.success(), "a drained worker exits cleanly: {st:?}");
    c.wait_workers(1, 1);
    c.wait_pools_empty(&[0, d2]);
}

#[test]
fn a_worker_whose_lease_expires_is_dropped_and_rejoins_and_etcd_down_stops_nothing_while_new_workers_wait() {
    let mut etcd = EtcdServer::start().unwrap();
    let mut c = Cluster::start_with_etcd(&etcd.endpoint(), "");
    c.add_worker("prefill", "prefill-a", None);
    let d1 = c.add_worker("decode", "decode-a", None);
    let d2 = c.add_worker("decode", "decode-b", None);
    c.wait_workers(1, 2);

    // Stopped (SIGSTOP), decode-a's link stays open but it renews nothing: when its lease
    // expires the gateway drops it, and every request goes to decode-b.
    c.signal(d1, "-STOP");
    c.wait_workers(1, 1);
    for p in PROMPTS {
        let (status, body) = c.post("/v1/chat/completions", &chat(p, 8));
        assert_eq!(status, 200, "{body}");
    }
    // Resumed, it publishes itself again and re-registers.
    c.signal(d1, "-CONT");
    c.wait_workers(1, 2);

    // etcd killed: what runs goes on, on the last known membership.
    let (started, stream) = stream_chat(&c.url, &c.key, chat_to_length(PROMPTS[1], 96, true));
    started.recv_timeout(Duration::from_secs(60)).expect("the stream started");
    etcd.kill9();
    for p in PROMPTS {
        let (status, body) = c.post("/v1/chat/completions", &chat(p, 8));
        assert_eq!(status, 200, "with etcd down: {body}");
    }
    stream.join().unwrap().expect("a stream runs to [DONE] with etcd down");
    // A worker started now cannot learn where the gateways are: it waits.
    let d3 = c.add_worker("decode", "decode-c", None);
    // Longer than the lease: nobody could renew, and nobody is dropped for it.
    std::thread::sleep(Duration::from_secs(3));
    let m = c.gateway_metrics();
    assert_eq!(metric(&m, "pagewarden_cluster_workers", "role=\"decode\""), 2.0, "{m}");
    etcd.restart().unwrap();
    // etcd back: the waiting worker finds the gateway and registers.
    c.wait_workers(1, 3);
    let (status, body) = c.post("/v1/chat/completions", &chat(PROMPTS[0], 8));
    assert_eq!(status, 200, "{body}");
    // After etcd is back every member renews or republishes: none is dropped for good.
    std::thread::sleep(Duration::from_secs(3));
    c.wait_workers(1, 3);
    until(Duration::from_secs(30), "pages freed", || {
        [0, d1, d2, d3].iter().all(|&i| c.worker_pages_used(i) == Some(0.0))
    });
}

/// A request that holds one of its tenant's concurrency slots on the gateway at `url` until
/// dropped: its headers are sent, its body never is (the slot is taken before the body).
struct HeldSlot {
    url: String,
    key: String,
    stream: TcpStream,
}

impl HeldSlot {
    fn new(url: &str, key: &str) -> HeldSlot {
        HeldSlot { url: url.to_string(), key: key.to_string(), stream: Self::open(url, key) }
    }

    fn open(url: &str, key: &str) -> TcpStream {
        let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        .unwrap();
        s
    }

    /// Opens the request again when the gateway already answered it: a probe that reached
    /// the limiter first took the slot and this one was refused (a race on a slow machine).
    fn renew_if_answered(&mut self) {
        self.stream.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let answered = !matches!(self.stream.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        self.stream.set_nonblocking(false).unwrap();
        if answered {
            self.stream = Self::open(&self.url, &self.key);
        }
    }
}

#[test]
fn live_gateways_share_each_tenants_limits_and_one_that_leaves_gives_its_share_back() {
    let etcd = EtcdServer::start().unwrap();
    let mut c = Cluster::start_with_etcd(&etcd.endpoint(), "");
    // A tenant allowed 2 concurrent requests in all.
    let key = c.add_tenant("small");
    let text = std::fs::read_to_string(&c.config).unwrap();
    let at = text.rfind("max_concurrent = 32").unwrap();
    std::fs::write(&c.config, format!("{}max_concurrent = 2{}", &text[..at], &text[at + 19..])).unwrap();
    c.reload();
    let b = c.add_gateway();
    let b_url = c.more_gateways[b].url.clone();
    let over = |url: &str| {
        let (status, body) = launch::post_json(
            &format!("{url}/v1/chat/completions"),
            &key,
            &chat(PROMPTS[0], 4).to_string(),
            Duration::from_secs(30),
        )
        .unwrap();
        (status == 429).then_some(body)
    };
    // Each gateway counts both (its gauge says what it shares its limits with).
    for url in [&c.url, &b_url] {
        until(Duration::from_secs(30), "each gateway counting two live gateways", || {
            metric(&c.gateway_metrics_on(url), "pagewarden_gateways_live", "") == 2.0
        });
    }
    // With two gateways each has half: one request held on A leaves A none.
    let mut held = HeldSlot::new(&c.url, &key);
    until(Duration::from_secs(30), "gateway A enforcing its share (1 of 2)", || {
        held.renew_if_answered();
        over(&c.url).is_some_and(|b| b.contains("limit 1"))
    });
    // B has its own half.
    let mut held_b = HeldSlot::new(&b_url, &key);
    until(Duration::from_secs(30), "gateway B enforcing its share (1 of 2)", || {
        held_b.renew_if_answered();
        over(&b_url).is_some_and(|b| b.contains("limit 1"))
    });
    drop(held_b);
    // B gone (its lease expires): A takes the whole limit back.
    c.kill_more_gateway(b);
    until(Duration::from_secs(30), "gateway A counting itself alone", || {
        metric(&c.gateway_metrics(), "pagewarden_gateways_live", "") == 1.0
    });
    held.renew_if_answered();
    until(Duration::from_secs(30), "gateway A back to the whole limit", || over(&c.url).is_none());
    drop(held);
}

/// `pagewarden tenant VERB NAME --config FILE`: (stdout, stderr).
fn tenant_cmd(config: &std::path::Path, verb: &str, name: &str) -> (String, String) {
    let out = std::process::Command::new(common::bin())
        .args(["tenant", verb, name, "--config"])
        .arg(config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "tenant {verb}: {err}");
    (String::from_utf8_lossy(&out.stdout).trim().to_string(), err)
}

/// The status of `GET /v1/models` with `key` (authentication only, no model run).
fn models_status(url: &str, key: &str) -> u16 {
    match common::cluster::agent()
        .get(&format!("{url}/v1/models"))
        .header("Authorization", &format!("Bearer {key}"))
        .call()
    {
        Ok(r) => r.status().as_u16(),
        Err(ureq::Error::StatusCode(s)) => s,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_tenant_change_announced_through_etcd_reaches_every_gateway_without_a_signal() {
    let etcd = EtcdServer::start().unwrap();
    let mut c = Cluster::start_with_etcd(&etcd.endpoint(), "");
    // Gateway B reads its own copy of the file, as a gateway on another host does.
    let b_config = c.dir.join("b.toml");
    std::fs::copy(&c.config, &b_config).unwrap();
    let b = c.add_gateway_reading(&b_config);
    let b_url = c.more_gateways[b].url.clone();
    c.add_worker("prefill", "prefill-a", None);
    c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    c.wait_workers_on(&b_url, 1, 1);

    // `tenant add` on A's file announces the change: A applies it, no SIGHUP; B's copy is
    // not the announced table yet, so B goes on refusing the key.
    let (key, said) = tenant_cmd(&c.config, "add", "newcomer");
    assert!(said.contains("announced through etcd"), "{said}");
    until(Duration::from_secs(20), "gateway A accepting the new tenant", || models_status(&c.url, &key) == 200);
    assert_eq!(models_status(&b_url, &key), 401, "B's copy of the file does not have the tenant yet");
    let (status, body) = launch::post_json(
        &format!("{}/v1/chat/completions", c.url),
        &key,
        &chat(PROMPTS[0], 4).to_string(),
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(status, 200, "the workers serve the tenant A announced: {body}");
    // While B waits for the announced table, a file that is not it (here: the new table less
    // the first tenant, as a copy caught half-way can be) is never applied: B keeps serving
    // its table through several of its one-second re-reads.
    let text = std::fs::read_to_string(&c.config).unwrap();
    let mut blocks = text.split("[[tenants]]");
    let head = blocks.next().unwrap().to_string();
    let others: Vec<&str> = blocks.filter(|b| !b.contains("\"tester\"")).collect();
    assert_eq!(others.len(), 1, "only the newcomer's block is left");
    std::fs::write(&b_config, others.iter().fold(head, |t, b| t + "[[tenants]]" + b)).unwrap();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(models_status(&b_url, &c.key), 200, "B applied a file that is not the announced table");
        assert_eq!(models_status(&b_url, &key), 401, "B applied a file that is not the announced table");
    }
    // The new file reaches B's host: B takes it within its retry window, still no signal.
    std::fs::copy(&c.config, &b_config).unwrap();
    until(Duration::from_secs(20), "gateway B accepting the new tenant once its file has it", || {
        models_status(&b_url, &key) == 200
    });

    // A rotated key: A takes the new key at once. A stream A admits under it runs while B's
    // copy of the file catches up, and B catching up ends nothing A admitted under the new key
    // (the workers end a tenant's requests only when the gateway that sent them re-keys it).
    let (new_key, _) = tenant_cmd(&c.config, "rotate-key", "newcomer");
    until(Duration::from_secs(20), "gateway A taking the rotated key", || models_status(&c.url, &new_key) == 200);
    let (started, on_a) = stream_chat(&c.url, &new_key, chat_to_length(PROMPTS[1], 600, true));
    started.recv_timeout(Duration::from_secs(60)).expect("A's stream under the new key started");
    std::fs::copy(&c.config, &b_config).unwrap();
    until(Duration::from_secs(20), "gateway B taking the rotated key", || models_status(&b_url, &new_key) == 200);
    assert!(!on_a.is_finished(), "A's stream outlasts B catching up (else this checks nothing)");
    let text = on_a.join().unwrap().expect("A's stream under the new key completes with [DONE]");
    assert!(!text.is_empty());
    for url in [&c.url, &b_url] {
        until(Duration::from_secs(20), "the old key refused on every gateway", || models_status(url, &key) == 401);
        assert_eq!(models_status(url, &new_key), 200);
        let (status, body) = launch::post_json(
            &format!("{url}/v1/chat/completions"),
            &new_key,
            &chat(PROMPTS[0], 4).to_string(),
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(status, 200, "{body}");
    }
    // etcd gone: the file still changes, the command says the change was not announced and
    // how to apply it.
    drop(etcd);
    let (_, said) = tenant_cmd(&c.config, "remove", "newcomer");
    assert!(said.contains("NOT announced") && said.contains("SIGHUP"), "{said}");
    assert_eq!(models_status(&c.url, &new_key), 200, "nothing applied the removal yet");
    c.reload();
    until(Duration::from_secs(20), "the removal applied on SIGHUP", || models_status(&c.url, &new_key) == 401);
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The membership prefix a [`Cluster::start_with_etcd`] config names.
fn prefix_of(c: &Cluster) -> String {
    let text = std::fs::read_to_string(&c.config).unwrap();
    let line = text.lines().find(|l| l.starts_with("prefix = ")).unwrap();
    line.trim_start_matches("prefix = ").trim_matches('"').to_string()
}

#[test]
fn entries_written_without_the_cluster_secret_or_a_pinned_nodes_signature_neither_share_limits_nor_get_dialled() {
    let etcd = EtcdServer::start().unwrap();
    let mut c = Cluster::start_with_etcd(&etcd.endpoint(), "");
    c.add_worker("prefill", "prefill-0", None);
    c.add_worker("decode", "decode-0", None);
    c.wait_workers(1, 1);
    until(Duration::from_secs(30), "the gateway counting itself", || {
        metric(&c.gateway_metrics(), "pagewarden_gateways_live", "") == 1.0
    });
    // An address of ours: any node that dials an entry pointing here is seen.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let trap_addr = trap.local_addr().unwrap().to_string();
    let gateways = format!("{}/gateways/", prefix_of(&c));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let etcd_client = membership::EtcdClient::new(&[etcd.endpoint()], Duration::from_secs(5)).unwrap();
        let (_, live) = etcd_client.range_prefix(&gateways).await.unwrap();
        assert_eq!(live.len(), 1, "the real gateway's entry");
        let junk = serde_json::json!({"id": "junk", "cluster_addr": trap_addr}).to_string();
        for i in 0..50 {
            // Plain records, as the code before sealing wrote them, and garbage.
            let value = if i % 2 == 0 { junk.clone().into_bytes() } else { format!("junk {i}").into_bytes() };
            etcd_client.put(&format!("{gateways}junk-{i}"), &value, None).await.unwrap();
        }
        // The real gateway's sealed entry, copied under another name: bound to its own key.
        etcd_client.put(&format!("{gateways}copy"), &live[0].1, None).await.unwrap();
        // A member gone rogue: it holds the real cluster secret but its node key is pinned
        // nowhere (a fresh one, or one revoked): its entry is sealed and signed, and counts not.
        let secret = wire::ClusterSecret::from_passphrase(common::cluster::SECRET.as_bytes());
        let rogue = wire::NodeKey::from_private([0xee; 32]).unwrap();
        for i in 0..5 {
            let name = format!("rogue-{i}");
            let record = serde_json::json!({"id": name, "cluster_addr": trap_addr}).to_string();
            let sealed =
                node::member::seal_record(&secret, &rogue, &format!("{gateways}{name}"), &record, now_ms()).unwrap();
            etcd_client.put(&format!("{gateways}{name}"), &sealed, None).await.unwrap();
        }
        // The real gateway's key (a pinned node, compromised) publishing its own record again
        // under other names: it opens, but one node holds one share of the limits.
        let (_, real) = &live[0];
        let real: serde_json::Value = serde_json::from_slice(real).unwrap();
        let record = real["record"].as_str().unwrap();
        let gateway_key = common::cluster::node_key(0);
        for i in 0..5 {
            let etcd_key = format!("{gateways}twin-{i}");
            let sealed = node::member::seal_record(&secret, &gateway_key, &etcd_key, record, now_ms()).unwrap();
            etcd_client.put(&etcd_key, &sealed, None).await.unwrap();
        }
    });
    // Long enough for every reader to see the entries and look at them again.
    std::thread::sleep(Duration::from_secs(6));
    let m = c.gateway_metrics();
    assert_eq!(metric(&m, "pagewarden_gateways_live", ""), 1.0, "junk divided the limits");
    assert!(trap.accept().is_err(), "a worker dialled an unauthenticated entry");
    // Each ignored entry counted once, by reason, however often it was looked at again.
    let rejected =
        |reason: &str| metric(&m, "pagewarden_membership_entries_rejected_total", &format!("reason=\"{reason}\""));
    assert_eq!(rejected("malformed"), 50.0, "{m}");
    assert_eq!(rejected("bad_mac"), 1.0, "the copy under another name");
    assert_eq!(rejected("unknown_signer"), 5.0, "the rogue's entries");
    let (status, body) = c.post("/v1/chat/completions", &chat(PROMPTS[0], 4));
    assert_eq!(status, 200, "{body}");
}
