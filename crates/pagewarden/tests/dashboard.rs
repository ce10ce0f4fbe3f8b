#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The admin dashboard in a real headless browser (Debian's Chromium): during a load from two
//! tenants its page map shows pages of both and no page twice, it refuses a tenant's key, and
//! a screenshot is kept as a test artefact (`target/tmp/dashboard.png`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Base64, with the `+` and `/` such keys have: the page reads `#key=` as written.
const ADMIN_KEY: &str = "q+Zx/3fYb0m+T9wP2nV8rK+1sLdE4uJ7hQ0cA6gB+yM=";

/// Ends the load when the test's main thread leaves the scope, also by a failed assertion
/// (the scope would otherwise wait for the load forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Debian's Chromium, installed with apt when missing (the README's test command runs as a
/// user who may install packages, as on CI).
fn chromium() -> PathBuf {
    let found = |p: &str| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success());
    for p in ["chromium", "/usr/bin/chromium"] {
        if found(p) {
            return PathBuf::from(p);
        }
    }
    let ok = Command::new("sh")
        .args(["-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok && found("chromium"), "the dashboard test needs Debian's chromium (apt-get install chromium)");
    PathBuf::from("chromium")
}

/// Runs the page in headless Chromium for a few seconds of page time; `extra` adds flags.
fn browse(chromium: &Path, url: &str, extra: &[&str]) -> String {
    let profile = launch::scratch_dir("pw-chromium").unwrap();
    let out = Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--virtual-time-budget=4000")
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The page cells of a dumped DOM: (kind, owner attributes).
fn page_cells(dom: &str) -> Vec<(String, Vec<String>)> {
    dom.split("<i class=\"pg\"")
        .skip(1)
        .map(|rest| {
            let tag = &rest[..rest.find('>').unwrap()];
            let attr = |name: &str| -> Vec<String> {
                tag.match_indices(&format!("{name}=\""))
                    .map(|(i, m)| {
                        let v = &tag[i + m.len()..];
                        v[..v.find('"').unwrap()].to_string()
                    })
                    .collect()
            };
            (attr("data-kind").into_iter().next().unwrap_or_default(), attr("data-tenant"))
        })
        .collect()
}

fn get_state(url: &str, key: &str) -> (u16, Value) {
    let mut r = launch::agent(Duration::from_secs(10))
        .get(format!("{url}/admin/state"))
        .header("Authorization", format!("Bearer {key}"))
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap_or(Value::Null))
}

#[test]
fn the_dashboard_shows_both_tenants_pages_and_no_page_twice_and_refuses_a_tenant_key() {
    let chromium = chromium();
    let (dir, alice) = common::Server::configure(&[]);
    let config = dir.join("pagewarden.toml");
    let bob = launch::tenant_add(common::bin().as_ref(), &config, "bob").unwrap();
    common::write_secret(&dir.join("admin-key"), ADMIN_KEY);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n[admin]\nkey_file = \"{}\"\n", dir.join("admin-key").display())).unwrap();
    let server = common::Server::start_with(dir, alice.clone());

    // The state refuses tenants' keys and no key; the admin key reads it.
    assert_eq!(get_state(&server.url, &alice).0, 401);
    assert_eq!(get_state(&server.url, &bob).0, 401);
    let (status, state) = get_state(&server.url, ADMIN_KEY);
    assert_eq!(status, 200, "{state}");
    let ids: Vec<u64> = state["tenants"].as_array().unwrap().iter().map(|t| t["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{state}");

    // A load from both tenants, until the test ends.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for (key, prompt) in [(&alice, "Tell me a long story about a dragon."), (&bob, "Describe the ocean in detail.")]
        {
            for _ in 0..2 {
                let (stop, url) = (&stop, &server.url);
                s.spawn(move || {
                    let body = serde_json::json!({"model": common::MODEL_NAME, "max_tokens": 120, "ignore_eos": true,
                        "messages": [{"role": "user", "content": prompt}]});
                    while !stop.load(Ordering::Relaxed) {
                        let r = launch::post_json(
                            &format!("{url}/v1/chat/completions"),
                            key,
                            &body.to_string(),
                            Duration::from_secs(120),
                        );
                        if !matches!(r, Ok((200, _))) {
                            stop.store(true, Ordering::Relaxed);
                            panic!("a load request failed: {r:?}");
                        }
                    }
                });
            }
        }
        // Wait until both tenants hold pages (running requests or sealed prefixes).
        let t0 = Instant::now();
        loop {
            let (_, st) = get_state(&server.url, ADMIN_KEY);
            let holders: Vec<u64> = st["pools"][0]["runs"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r[0] != "free")
                .map(|r| r[1].as_u64().unwrap())
                .collect();
            if ids.iter().all(|id| holders.contains(id)) {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "both tenants never held pages: {st}");
            std::thread::sleep(Duration::from_millis(100));
        }

        let page = format!("{}/admin", server.url);
        let dom = browse(&chromium, &format!("{page}#key={ADMIN_KEY}"), &["--dump-dom"]);
        let cells = page_cells(&dom);
        let total: u64 = state["pools"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["runs"].as_array().unwrap().iter().map(|r| r[2].as_u64().unwrap()))
            .sum();
        assert_eq!(cells.len() as u64, total, "every page of the pool is drawn once");
        for (kind, owners) in &cells {
            match kind.as_str() {
                "free" => assert!(owners.is_empty(), "a free page with an owner"),
                "request" | "sealed" => assert_eq!(owners.len(), 1, "a page with {} owners", owners.len()),
                other => panic!("unknown page kind {other:?}"),
            }
        }
        for id in &ids {
            assert!(
                cells.iter().any(|(_, o)| o.first() == Some(&id.to_string())),
                "no page of tenant {id} on the map during its load"
            );
        }
        assert!(dom.contains("live · updated"), "the page did not update from /admin/state");
        assert!(dom.contains("bob") && dom.contains("tester"), "the tenants table names both tenants");
        // Engine ids are u64s: shown exactly, not rounded to a JavaScript number.
        for w in state["workers"].as_array().unwrap() {
            let id = w["engine"].as_str().unwrap();
            assert!(dom.contains(&format!("<td>{id}</td>")), "engine id {id} not shown exactly");
        }

        // The artefact: what an operator sees during the load.
        let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
        let _ = std::fs::remove_file(&shot);
        browse(
            &chromium,
            &format!("{page}#key={ADMIN_KEY}"),
            &[&format!("--screenshot={}", shot.display()), "--window-size=1400,1100", "--hide-scrollbars"],
        );
        let png = std::fs::read(&shot).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "screenshot of {} bytes", png.len());
        println!("dashboard screenshot: {}", shot.display());

        // A tenant's key: refused, nothing drawn.
        let dom = browse(&chromium, &format!("{page}#key={alice}"), &["--dump-dom"]);
        assert!(dom.contains("refused (401)"), "the page did not say it refused the tenant key");
        assert!(page_cells(&dom).is_empty(), "a tenant's key drew the page map");
    });
}
