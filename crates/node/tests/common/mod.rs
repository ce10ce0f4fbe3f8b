//! A real server on 127.0.0.1:0 in this process (real default model), and a plain HTTP client.
#![allow(dead_code, clippy::expect_used)] // helpers outside #[test] fns; not every test file uses all

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use gateway::settings::TenantConfig;
use gateway::tenants::sha256;
use node::{Config, ServeError};
use serde_json::Value;

pub const MODEL: &str = "SmolLM2-135M-Instruct";
pub const ALICE: &str = "key-alice";
pub const BOB: &str = "key-bob";
/// The bearer token `/metrics` on the API port asks for in [`test_config`].
pub const METRICS_TOKEN: &str = "metrics-token-of-the-gateway-tests-0123456789";

/// A private file (mode 600, as the server insists) holding `text`, in a directory of this
/// test process.
pub fn private_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pw-gw-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    launch::write_private(&path, text.as_bytes()).expect("private file");
    path
}

/// A tenant with a fixed id per name (alice 1, bob 2, carol 3, others 4).
pub fn tenant(name: &str, key: &str, max_concurrent: usize) -> TenantConfig {
    let id = match name {
        "alice" => 1,
        "bob" => 2,
        "carol" => 3,
        _ => 4,
    };
    TenantConfig {
        id: kv::TenantId(id),
        name: name.into(),
        key_sha256: sha256(key.as_bytes()),
        max_concurrent,
        max_queued: 32,
        tokens_per_minute: 0,
        max_body_bytes: None,
        models: None,
    }
}

/// A small, fast configuration: context 1024, pool 2048 tokens, two tenants.
pub fn test_config() -> Config {
    let mut c = Config::from_toml_str(
        r#"
        listen = "127.0.0.1:0"
        threads = 2
        context_window = 1024
        [pool]
        tokens = 2048
        [limits]
        max_body_bytes = 65536
        max_tokens_default = 16
        max_tokens_ceiling = 950
        drain_timeout_s = 20
        "#,
    )
    .expect("test config");
    c.model = Some(fetch::ensure_default_model().expect("default model"));
    c.tenants = vec![tenant("alice", ALICE, 8), tenant("bob", BOB, 8)];
    c.metrics.token_file = Some(private_file("metrics-token", METRICS_TOKEN));
    c
}

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Starts the drain (as SIGTERM would) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Drains and waits for `serve` to return.
    pub fn shutdown(mut self) -> Result<(), ServeError> {
        self.begin_shutdown();
        self.thread.take().expect("thread").join().expect("server thread")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.begin_shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts a server; `Err` if `serve` returned before it was ready.
pub fn try_start(config: Config) -> Result<Server, ServeError> {
    let (addr_tx, addr_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(node::serve(
            config,
            async move {
                let _ = stop_rx.await;
            },
            move |addr| {
                let _ = addr_tx.send(addr);
            },
        ))
    });
    match addr_rx.recv() {
        Ok(addr) => Ok(Server { addr, stop: Some(stop_tx), thread: Some(thread) }),
        Err(_) => Err(thread.join().expect("server thread").expect_err("serve returned Ok before it was ready")),
    }
}

pub fn start(config: Config) -> Server {
    match try_start(config) {
        Ok(s) => s,
        Err(e) => panic!("server did not start: {e}"),
    }
}

pub fn agent() -> ureq::Agent {
    launch::agent(Duration::from_secs(60))
}

/// Status, headers (lower-case name -> value) and body text.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The error envelope's `error` object, after checking its four fields are present.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v.get("error").unwrap_or_else(|| panic!("no error envelope: {}", self.body)).clone();
        for k in ["message", "type", "param", "code"] {
            assert!(e.get(k).is_some(), "envelope lacks {k}: {}", self.body);
        }
        e
    }

    /// The `data:` payloads of an SSE body.
    pub fn events(&self) -> Vec<String> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
    }
}

fn reply(mut resp: ureq::http::Response<ureq::Body>) -> Reply {
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string()))
        .collect();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    Reply { status, headers, body }
}

pub fn post(url: &str, key: Option<&str>, body: &str) -> Reply {
    let mut req = agent().post(url).header("Content-Type", "application/json");
    if let Some(k) = key {
        req = req.header("Authorization", &format!("Bearer {k}"));
    }
    reply(req.send(body).expect("request"))
}

pub fn post_json(url: &str, key: Option<&str>, body: &Value) -> Reply {
    post(url, key, &body.to_string())
}

pub fn get(url: &str, key: Option<&str>) -> Reply {
    let mut req = agent().get(url);
    if let Some(k) = key {
        req = req.header("Authorization", &format!("Bearer {k}"));
    }
    reply(req.call().expect("request"))
}

/// A streaming request whose body is read line by line.
pub fn open_stream(url: &str, key: &str, body: &Value) -> (u16, BufReader<ureq::BodyReader<'static>>) {
    let resp = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Authorization", &format!("Bearer {key}"))
        .send(body.to_string())
        .expect("request");
    let status = resp.status().as_u16();
    (status, BufReader::new(resp.into_body().into_reader()))
}

/// The next `data:` payload of an SSE stream, `None` at its end.
pub fn next_event(r: &mut BufReader<ureq::BodyReader<'static>>) -> Option<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            return Some(d.to_string());
        }
    }
}

/// The server's `/metrics` text, read with the metrics token.
pub fn metrics_text(server: &Server) -> String {
    let r = get(&server.url("/metrics"), Some(METRICS_TOKEN));
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// A metric's value (first sample whose line starts with `prefix`).
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix) && l.as_bytes().get(prefix.len()) == Some(&b' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {prefix} not found"))
}

pub fn metric_or_zero(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix) && l.as_bytes().get(prefix.len()) == Some(&b' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
