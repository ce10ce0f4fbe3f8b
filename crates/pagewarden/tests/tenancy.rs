#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Tenants are stable identities across config changes, between real gateway, prefill and
//! decode processes: a removed tenant's id and cache never reach another tenant, even when only
//! the gateway restarts, and a tenant removed or re-keyed on a running gateway loses its key,
//! its in-flight streams and its cached prefixes on every worker at once, while the others go
//! on untouched.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::chat_to_length;
use common::cluster::{agent, stream_chat, Cluster};
use serde_json::Value;

/// Ten sentences: well over three 16-token pages after the chat template.
const LONG_PROMPT: &str = "The lighthouse stood on a rock at the edge of the bay. Every night its keeper climbed \
    the stairs, trimmed the wick and polished the lens. Ships passed far out at sea. In winter the storms came \
    and the waves broke over the rail. In summer children swam in the cove below. The keeper kept a log of every \
    ship he saw. One morning he found a bottle on the shore. Inside was a letter written in a language he did not \
    know. He kept it in a drawer for many years. Summarise this story in one sentence.";

fn post(c: &Cluster, key: &str, b: &Value) -> (u16, Value) {
    let mut r = agent()
        .post(format!("{}/v1/chat/completions", c.url))
        .header("Authorization", format!("Bearer {key}"))
        .header("Content-Type", "application/json")
        .send(b.to_string().as_bytes())
        .unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap_or(Value::Null))
}

fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)
}

/// Cached prefix pages of tenant `id` on worker `i`.
fn cached_pages(c: &Cluster, i: usize, id: u64) -> f64 {
    c.worker_metric(i, "pagewarden_worker_prefix_cache_pages", &format!("tenant=\"{id}\""))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `pagewarden tenant remove|rotate-key NAME` on the cluster's config; returns stdout.
fn tenant_cmd(c: &Cluster, what: &str, name: &str) -> String {
    let out = Command::new(common::bin()).args(["tenant", what, name, "--config"]).arg(&c.config).output().unwrap();
    assert!(out.status.success(), "tenant {what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The tenant ids `tenant add` gave: tester 1 (the cluster's own), then in order.
const ALICE: u64 = 2;

fn cluster_with_alice_and_bob() -> (Cluster, String, String) {
    let mut c = Cluster::start("");
    c.add_worker("prefill", "prefill-a", None);
    c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    let (alice, bob) = (c.add_tenant("alice"), c.add_tenant("bob"));
    // Added to the running gateway by a reload, no restart.
    c.reload();
    wait_until("the reload did not add alice", || post(&c, &alice, &chat_to_length("Hi", 1, false)).0 == 200);
    (c, alice, bob)
}

#[test]
fn a_removed_tenants_cache_is_dropped_when_only_the_gateway_restarts_and_no_other_tenant_hits_it() {
    let (mut c, alice, bob) = cluster_with_alice_and_bob();
    let (s, _) = post(&c, &alice, &chat_to_length(LONG_PROMPT, 4, false));
    assert_eq!(s, 200);
    let (s, second) = post(&c, &alice, &chat_to_length(LONG_PROMPT, 4, false));
    assert_eq!(s, 200);
    assert!(cached_tokens(&second) >= 48, "alice's own prompt hits 3+ pages: {second}");
    assert!(cached_pages(&c, 0, ALICE) >= 3.0);

    tenant_cmd(&c, "remove", "alice");
    c.restart_gateway();
    c.wait_workers(1, 1);
    // The workers applied the new table when they registered again.
    wait_until("alice's pages are still cached", || {
        cached_pages(&c, 0, ALICE) == 0.0 && cached_pages(&c, 1, ALICE) == 0.0
    });

    let (s, v) = post(&c, &bob, &chat_to_length(LONG_PROMPT, 4, false));
    assert_eq!(s, 200, "{v}");
    assert_eq!(cached_tokens(&v), 0, "bob never hits alice's prefix: {v}");
    let (s, v) = post(&c, &alice, &chat_to_length("Hi", 1, false));
    assert_eq!(s, 401, "{v}");
    c.wait_pools_empty(&[0, 1]);
}

#[test]
fn removing_or_rekeying_a_tenant_on_a_running_gateway_ends_its_access_streams_and_cache_and_spares_the_others() {
    let (c, alice, bob) = cluster_with_alice_and_bob();
    let carol = c.add_tenant("carol");
    c.reload();
    wait_until("the reload did not add carol", || post(&c, &carol, &chat_to_length("Hi", 1, false)).0 == 200);
    let bob_body = chat_to_length("Write a long poem about the sea.", 48, true);
    let (_, alone) = stream_chat(&c.url, &bob, bob_body.clone());
    let bob_alone = alone.join().unwrap().unwrap();

    // Alice and carol cache a prefix; alice then streams a long answer while bob streams his.
    for key in [&alice, &carol] {
        post(&c, key, &chat_to_length(LONG_PROMPT, 2, false));
    }
    assert!(cached_pages(&c, 0, ALICE) >= 3.0);
    let (alice_deltas, alice_stream) = stream_chat(&c.url, &alice, chat_to_length(LONG_PROMPT, 2000, true));
    alice_deltas.recv_timeout(Duration::from_secs(60)).expect("alice's stream started");
    let (bob_deltas, bob_stream) = stream_chat(&c.url, &bob, bob_body);
    bob_deltas.recv_timeout(Duration::from_secs(60)).expect("bob's stream started");

    tenant_cmd(&c, "remove", "alice");
    c.reload();
    let err = alice_stream.join().unwrap().expect_err("alice's stream must end with an error event");
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("revoked"), "{err}");
    let (s, v) = post(&c, &alice, &chat_to_length("Hi", 1, false));
    assert_eq!(s, 401, "{v}");
    wait_until("alice's pages are still cached", || {
        cached_pages(&c, 0, ALICE) == 0.0 && cached_pages(&c, 1, ALICE) == 0.0
    });
    assert_eq!(bob_stream.join().unwrap().expect("bob's stream completes"), bob_alone, "bob is unaffected");

    // A rotated key: the old one is refused at once, the new one works, with a cold cache.
    let carol_id = 4;
    assert!(cached_pages(&c, 0, carol_id) >= 3.0);
    let new_key = tenant_cmd(&c, "rotate-key", "carol");
    c.reload();
    wait_until("carol's old key still works", || post(&c, &carol, &chat_to_length("Hi", 1, false)).0 == 401);
    let (s, v) = post(&c, &new_key, &chat_to_length(LONG_PROMPT, 2, false));
    assert_eq!(s, 200, "{v}");
    assert_eq!(cached_tokens(&v), 0, "a rotated key starts with an empty cache: {v}");
    c.wait_pools_empty(&[0, 1]);
}
