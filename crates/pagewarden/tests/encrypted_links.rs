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
        secrets: SecretRing::single(ClusterSecret::from_passphrase(secret.as_bytes())),
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

#[test]
fn the_cluster_secret_rotates_without_a_restart_and_the_old_one_is_then_refused() {
    const NEXT_SECRET: &str = "4e3a7c1a55e7e57c1a55e7e57c1a55e7e57c1a55e7e57c1a55e7e57c1a550002";
    let mut c = Cluster::start("");
    let (old, new) = (c.dir.join("secret"), c.dir.join("new-secret"));
    common::write_secret(&new, NEXT_SECRET);
    let hup = |c: &Cluster| {
        assert!(Command::new("kill").args(["-HUP", &c.gateway_pid().to_string()]).status().unwrap().success());
    };
    let new_id = identity(NEXT_SECRET, Role::Prefill);
    let cluster_addr = c.cluster_addr.clone();
    let accepts = |id: &Identity| dial(&cluster_addr, id).is_ok();

    // Step 1: every node accepts both; nodes still dial with the old one.
    let text = std::fs::read_to_string(&c.config).unwrap();
    let both = text.replace("[cluster]\n", &format!("[cluster]\naccept_secret_files = [\"{}\"]\n", new.display()));
    std::fs::write(&c.config, &both).unwrap();
    assert!(!accepts(&new_id));
    hup(&c);
    wait_for("the gateway to accept the new secret", || accepts(&new_id));
    let p = c.add_worker("prefill", "prefill-a", None);

    // Step 2: a node dialling with the new secret (and still accepting the old) joins.
    let swapped = both
        .replace(&format!("secret_file = \"{}\"", old.display()), &format!("secret_file = \"{}\"", new.display()))
        .replace(
            &format!("accept_secret_files = [\"{}\"]", new.display()),
            &format!("accept_secret_files = [\"{}\"]", old.display()),
        );
    let new_config = c.dir.join("rotated.toml");
    std::fs::write(&new_config, &swapped).unwrap();
    let d = c.add_worker_at("decode", "decode-a", None, &cluster_addr, &new_config);
    c.wait_workers(1, 1);
    let (status, body) = c.post("/v1/chat/completions", &chat("What is 12 times 7?", 8));
    assert_eq!(status, 200, "{body}");

    // Step 3: the gateway drops the old secret; links already up keep serving, new ones under
    // the old secret are refused.
    let new_only = swapped.replace(&format!("accept_secret_files = [\"{}\"]\n", old.display()), "");
    std::fs::write(&c.config, &new_only).unwrap();
    hup(&c);
    let old_id = identity(SECRET, Role::Prefill);
    wait_for("the gateway to refuse the old secret", || !accepts(&old_id));
    let (status, body) = c.post("/v1/chat/completions", &chat("What is 12 times 7?", 8));
    assert_eq!(status, 200, "{body}");
    assert!(link_failures(&c.gateway_metrics(), "bad_proof") >= 1.0);
    c.wait_pools_empty(&[p, d]);
}
