//! A real disaggregated deployment: a `pagewarden gateway` process and worker processes
//! (`prefill`, `decode`) on loopback ports, sharing one config file and cluster secret.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::bin;

/// 32 bytes in hex, as a cluster secret file must hold (not random: the tests' own).
pub const SECRET: &str = "7e57c1a55e7e57c1a55e7e57c1a55e7e57c1a55e7e57c1a55e7e57c1a55e0001";

/// The private key of the test harness's own node identity ([`node_identity`], a gateway
/// played by the test): pinned in every test cluster, and the config's default
/// `node_key_file`, which every node started by [`Cluster`] overrides with its own key.
const HARNESS_KEY: [u8; 32] = [0x7e; 32];

/// Node keys of each test cluster, one per node started (wrapping round after this many).
const NODE_KEYS: usize = 8;

pub struct Worker {
    pub name: String,
    /// Its node identity (hex), pinned in the cluster's config.
    pub node_key: String,
    pub metrics_url: String,
    pub kv_addr: Option<String>,
    pub pid: u32,
    child: Child,
}

pub struct Cluster {
    pub url: String,
    pub key: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub cluster_addr: String,
    gateway: Child,
    pub workers: Vec<Worker>,
    /// Gateways after the first ([`Cluster::add_gateway`]; with membership only).
    pub more_gateways: Vec<Gateway>,
    /// Members find each other through etcd (`[membership]`): workers get no `--gateway`.
    membership: bool,
    /// The node key files made for this cluster and their identities, all pinned; each node
    /// started takes the next.
    node_keys: Vec<(PathBuf, String)>,
    next_key: usize,
}

/// Makes `n` node keys in `dir` with `pagewarden node keygen` (a fresh identity, as an
/// operator makes one): their files and identities.
pub fn keygen(dir: &std::path::Path, prefix: &str, n: usize) -> Vec<(PathBuf, String)> {
    (0..n)
        .map(|i| {
            let path = dir.join(format!("{prefix}-{i}.key"));
            let out = Command::new(bin()).args(["node", "keygen", "--out"]).arg(&path).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            (path, String::from_utf8(out.stdout).unwrap().trim().to_string())
        })
        .collect()
}

/// The private key of node `i` of a test cluster: fixed, so the harness ([`node_identity`])
/// can trust every node of any cluster it meets.
fn node_private(i: usize) -> [u8; 32] {
    [0x10 + i as u8; 32]
}

/// Writes the cluster's node keys to `dir` (owner-only): their files and identities.
fn node_keys(dir: &std::path::Path) -> Vec<(PathBuf, String)> {
    (0..NODE_KEYS)
        .map(|i| {
            let path = dir.join(format!("node-{i}.key"));
            super::write_secret(&path, &base64_of(&node_private(i)));
            (path, wire::NodeKey::from_private(node_private(i)).unwrap().identity().to_hex())
        })
        .collect()
}

/// What the harness trusts: itself and every node of its clusters (what it checks is their
/// behaviour, not their keys).
pub fn harness_trusted() -> Vec<wire::NodeIdentity> {
    std::iter::once(harness_key().identity()).chain((0..NODE_KEYS).map(|i| node_key(i).identity())).collect()
}

/// The key of node `i` of a test cluster (the first gateway's is node 0's).
pub fn node_key(i: usize) -> wire::NodeKey {
    wire::NodeKey::from_private(node_private(i)).unwrap()
}

/// The test harness's own node key (pinned in every test cluster).
pub fn harness_key() -> wire::NodeKey {
    wire::NodeKey::from_private(HARNESS_KEY).unwrap()
}

/// A gateway besides the cluster's first.
pub struct Gateway {
    pub url: String,
    child: Child,
}

/// Spawns `pagewarden ARGS` and waits for a stdout line containing each marker; returns the
/// child and the text after each marker.
fn spawn(args: &[&str], markers: &[&str]) -> (Child, Vec<String>) {
    let mut cmd = Command::new(bin());
    cmd.args(args).stderr(Stdio::null());
    let mut p = launch::spawn(cmd).unwrap();
    let got = p.expect_lines(markers, launch::START_TIMEOUT).unwrap();
    (p.child, got)
}

/// Sum of the samples of `name` whose labels contain `filter`.
pub fn metric(text: &str, name: &str, filter: &str) -> f64 {
    launch::metric(text, name, filter)
}

pub fn agent() -> ureq::Agent {
    launch::agent(Duration::from_secs(180))
}

pub fn get_text(url: &str) -> String {
    agent().get(url).call().unwrap().body_mut().read_to_string().unwrap()
}

impl Cluster {
    /// Starts the gateway; `extra` is appended to the shared config file.
    pub fn start(extra: &str) -> Cluster {
        Cluster::start_inner(extra, false)
    }

    /// [`Cluster::start`] with membership through the etcd at `endpoint` (a fresh prefix and a
    /// 2 s lease): gateways publish themselves and workers find them there.
    pub fn start_with_etcd(endpoint: &str, extra: &str) -> Cluster {
        static CLUSTERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefix = format!("/pagewarden-test/{}-{n}", std::process::id());
        let section = format!("[membership]\netcd = [\"{endpoint}\"]\nprefix = \"{prefix}\"\nlease_ttl_s = 2\n");
        Cluster::start_inner(&format!("{extra}\n{section}"), true)
    }

    fn start_inner(extra: &str, membership: bool) -> Cluster {
        fetch::ensure_default_model().expect("default model");
        let dir = launch::scratch_dir("pw-cluster").unwrap();
        super::write_secret(&dir.join("secret"), SECRET);
        super::write_secret(&dir.join("harness.key"), &base64_of(&HARNESS_KEY));
        let node_keys = node_keys(&dir);
        let pinned: Vec<String> = std::iter::once(format!("\"harness:{}\"", harness_key().identity()))
            .chain(node_keys.iter().enumerate().map(|(i, (_, k))| format!("\"node-{i}:{k}\"")))
            .collect();
        let config = dir.join("pagewarden.toml");
        let text = format!(
            "threads = 1\n{extra}\n[pool]\ntokens = 16384\n[cluster]\nsecret_file = \"{}\"\nnode_key_file = \"{}\"\n\
             trusted_nodes = [{}]\ntransfer_timeout_ms = 10000\nhandshake_timeout_ms = 5000\n{}",
            dir.join("secret").display(),
            dir.join("harness.key").display(),
            pinned.join(", "),
            super::metrics_section(&dir),
        );
        std::fs::write(&config, text).unwrap();
        let key = add_tenant(&config, "tester");
        let cfg = config.to_str().unwrap().to_string();
        let gw_key = node_keys[0].0.to_str().unwrap().to_string();
        let (gateway, got) = spawn(
            &[
                "gateway",
                "--config",
                &cfg,
                "--listen",
                "127.0.0.1:0",
                "--cluster-listen",
                "127.0.0.1:0",
                "--node-key",
                &gw_key,
            ],
            &[launch::listening::API_HTTP, launch::listening::CLUSTER],
        );
        Cluster {
            url: format!("http://{}", got[0]),
            key,
            dir,
            config,
            cluster_addr: got[1].clone(),
            gateway,
            workers: Vec::new(),
            more_gateways: Vec::new(),
            membership,
            node_keys,
            next_key: 1,
        }
    }

    /// Another gateway on the same config (membership only: workers find it in etcd);
    /// returns its index in `more_gateways`.
    pub fn add_gateway(&mut self) -> usize {
        self.add_gateway_reading(&self.config.clone())
    }

    /// Another gateway reading its own config file (a copy, as on another host).
    pub fn add_gateway_reading(&mut self, config: &std::path::Path) -> usize {
        assert!(self.membership, "a second gateway needs the membership");
        let cfg = config.to_str().unwrap().to_string();
        let (key, _) = self.take_key();
        let (child, got) = spawn(
            &[
                "gateway",
                "--config",
                &cfg,
                "--listen",
                "127.0.0.1:0",
                "--cluster-listen",
                "127.0.0.1:0",
                "--node-key",
                &key,
            ],
            &[launch::listening::API_HTTP],
        );
        self.more_gateways.push(Gateway { url: format!("http://{}", got[0]), child });
        self.more_gateways.len() - 1
    }

    /// `kill -9` of gateway `i` of `more_gateways`.
    pub fn kill_more_gateway(&mut self, i: usize) {
        let _ = self.more_gateways[i].child.kill();
        let _ = self.more_gateways[i].child.wait();
    }

    /// `kill -9` of the first gateway.
    pub fn kill_gateway(&mut self) {
        let _ = self.gateway.kill();
        let _ = self.gateway.wait();
    }

    /// Sends `signal` (e.g. "-STOP", "-CONT", "-TERM") to worker `i`.
    pub fn signal(&self, i: usize, signal: &str) {
        let st = Command::new("kill").args([signal, &self.workers[i].pid.to_string()]).status().unwrap();
        assert!(st.success());
    }

    /// Waits (at most `within`) for worker `i` to exit; its exit status.
    pub fn wait_exit(&mut self, i: usize, within: Duration) -> std::process::ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.workers[i].child.try_wait().unwrap() {
                return st;
            }
            assert!(t0.elapsed() < within, "worker {} did not exit within {within:?}", self.workers[i].name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `pagewarden tenant add NAME` on this cluster's config (apply it with [`Cluster::reload`]).
    pub fn add_tenant(&self, name: &str) -> String {
        add_tenant(&self.config, name)
    }

    /// Sends SIGHUP to the gateway: it reloads its tenants (and secrets).
    pub fn reload(&self) {
        let st = Command::new("kill").args(["-HUP", &self.gateway.id().to_string()]).status().unwrap();
        assert!(st.success());
    }

    /// Kills the gateway (only it) and starts a new one on the same addresses; the workers
    /// re-register with it.
    pub fn restart_gateway(&mut self) {
        let _ = self.gateway.kill();
        let _ = self.gateway.wait();
        let cfg = self.config.to_str().unwrap().to_string();
        let http = self.url.trim_start_matches("http://").to_string();
        let key = self.node_keys[0].0.to_str().unwrap().to_string();
        let (gateway, _) = spawn(
            &[
                "gateway",
                "--config",
                &cfg,
                "--listen",
                &http,
                "--cluster-listen",
                &self.cluster_addr,
                "--node-key",
                &key,
            ],
            &[launch::listening::API_HTTP, launch::listening::CLUSTER],
        );
        self.gateway = gateway;
    }

    /// The next unused node key of this cluster: its file and identity.
    fn take_key(&mut self) -> (String, String) {
        let (path, public) = self.node_keys[self.next_key % self.node_keys.len()].clone();
        self.next_key += 1;
        (path.to_str().unwrap().to_string(), public)
    }

    /// The gateway's node identity (hex).
    pub fn gateway_node_key(&self) -> String {
        self.node_keys[0].1.clone()
    }

    /// Starts a worker (`prefill` or `decode`); returns its index in `workers`.
    pub fn add_worker(&mut self, role: &str, name: &str, kv_advertise: Option<&str>) -> usize {
        let (gateway, config) = (self.cluster_addr.clone(), self.config.clone());
        self.add_worker_at(role, name, kv_advertise, &gateway, &config)
    }

    /// [`Cluster::add_worker`] with more arguments (`--model NAME`, say).
    pub fn add_worker_with(&mut self, role: &str, name: &str, extra: &[&str]) -> usize {
        let (gateway, config) = (self.cluster_addr.clone(), self.config.clone());
        self.spawn_worker(role, name, None, &gateway, &config, extra)
    }

    /// [`Cluster::add_worker`] dialling `gateway` (a relay, say) with its own `config` file.
    pub fn add_worker_at(
        &mut self,
        role: &str,
        name: &str,
        kv_advertise: Option<&str>,
        gateway: &str,
        config: &std::path::Path,
    ) -> usize {
        self.spawn_worker(role, name, kv_advertise, gateway, config, &[])
    }

    fn spawn_worker(
        &mut self,
        role: &str,
        name: &str,
        kv_advertise: Option<&str>,
        gateway: &str,
        config: &std::path::Path,
        extra: &[&str],
    ) -> usize {
        let cfg = config.to_str().unwrap().to_string();
        let (key_file, node_key) = self.take_key();
        let mut args =
            vec![role, "--config", &cfg, "--name", name, "--metrics-listen", "127.0.0.1:0", "--node-key", &key_file];
        if !self.membership {
            args.extend(["--gateway", gateway]);
        }
        args.extend_from_slice(extra);
        if role == "decode" {
            args.extend(["--kv-listen", "127.0.0.1:0"]);
        }
        if let Some(a) = kv_advertise {
            args.extend(["--kv-advertise", a]);
        }
        let mut markers = vec!["metrics on http://"];
        if role == "decode" {
            markers.push(launch::listening::KV);
        }
        let (child, got) = spawn(&args, &markers);
        let metrics_url = format!("http://{}", got[0]);
        let kv_addr = got.get(1).cloned();
        let pid = child.id();
        self.workers.push(Worker { name: name.into(), node_key, metrics_url, kv_addr, pid, child });
        self.workers.len() - 1
    }

    /// Waits until the gateway lists this many workers of each role and is ready.
    pub fn wait_workers(&self, prefill: usize, decode: usize) {
        self.wait_workers_on(&self.url, prefill, decode);
    }

    /// [`Cluster::wait_workers`] on the gateway at `url`.
    pub fn wait_workers_on(&self, url: &str, prefill: usize, decode: usize) {
        let t0 = Instant::now();
        loop {
            let m = self.gateway_metrics_on(url);
            let p = metric(&m, "pagewarden_cluster_workers", "role=\"prefill\"");
            let d = metric(&m, "pagewarden_cluster_workers", "role=\"decode\"");
            if p as usize == prefill
                && d as usize == decode
                && agent().get(format!("{url}/ready")).call().unwrap().status() == 200
            {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "workers did not register:\n{m}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn gateway_pid(&self) -> u32 {
        self.gateway.id()
    }

    pub fn gateway_metrics(&self) -> String {
        self.gateway_metrics_on(&self.url)
    }

    /// The `/metrics` of the gateway at `url`.
    pub fn gateway_metrics_on(&self, url: &str) -> String {
        let mut r = agent()
            .get(format!("{url}/metrics"))
            .header("Authorization", format!("Bearer {}", super::METRICS_TOKEN))
            .call()
            .unwrap();
        assert_eq!(r.status(), 200, "the gateway's /metrics");
        r.body_mut().read_to_string().unwrap()
    }

    pub fn worker_metrics(&self, i: usize) -> String {
        get_text(&self.workers[i].metrics_url)
    }

    pub fn worker_metric(&self, i: usize, name: &str, filter: &str) -> f64 {
        metric(&self.worker_metrics(i), name, filter)
    }

    /// Pages in use in worker `i`'s pool; None when its `/metrics` shows no pool at all (could
    /// not be read, or has no `pagewarden_kv_pages_total`): an absent gauge is not a zero.
    pub fn worker_pages_used(&self, i: usize) -> Option<f64> {
        let text = self.worker_metrics(i);
        launch::has_metric(&text, "pagewarden_kv_pages_total").then(|| metric(&text, "pagewarden_kv_pages_used", ""))
    }

    /// Waits until every live worker's pool is readable and has no page in use.
    pub fn wait_pools_empty(&self, live: &[usize]) {
        let t0 = Instant::now();
        loop {
            let used: Vec<Option<f64>> = live.iter().map(|&i| self.worker_pages_used(i)).collect();
            if used.iter().all(|u| *u == Some(0.0)) {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "pages still in use: {used:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kill -9`.
    pub fn kill(&mut self, i: usize) {
        let _ = self.workers[i].child.kill();
        let _ = self.workers[i].child.wait();
    }

    pub fn post(&self, path: &str, body: &serde_json::Value) -> (u16, String) {
        self.post_to(&self.url, path, body)
    }

    /// [`Cluster::post`] to the gateway at `url`.
    pub fn post_to(&self, url: &str, path: &str, body: &serde_json::Value) -> (u16, String) {
        launch::post_json(&format!("{url}{path}"), &self.key, &body.to_string(), Duration::from_secs(180)).unwrap()
    }
}

/// The identity of a node of these test clusters (the shared secret, the default model's
/// pairing): what a rogue node or a fake gateway in a test presents.
pub fn node_identity(role: wire::Role) -> cluster::Identity {
    let model = fetch::ensure_default_model().unwrap();
    let layout = kv::KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: kv::KvDtype::F16 };
    cluster::Identity {
        secrets: cluster::SecretRing::single(
            wire::ClusterSecret::from_passphrase(SECRET.as_bytes()),
            harness_key(),
            harness_trusted(),
        ),
        role,
        pairing: wire::PairingInfo::new(cluster::model_digest(&model).unwrap(), &layout).unwrap(),
    }
}

/// A gateway played by the test (it holds the cluster secret, so it is as trusted as a real
/// one): a real worker process of `role` registers with it and takes tenant 1; the test then
/// sends it whatever control messages it likes. The worker is killed on drop.
pub struct DirectGateway {
    pub rd: cluster::link::LinkReader,
    pub wr: cluster::link::LinkWriter,
    child: Child,
}

impl DirectGateway {
    pub async fn start(role: wire::Role, config: &std::path::Path) -> DirectGateway {
        let (mut listener, addr) = cluster::Net::default().listen("127.0.0.1:0").await.unwrap();
        let me = node_identity(wire::Role::Gateway);
        let role_arg = if role == wire::Role::Prefill { "prefill" } else { "decode" };
        let mut cmd = Command::new(bin());
        cmd.args([role_arg, "--config", config.to_str().unwrap(), "--gateway", &addr, "--name", "direct"]);
        if role == wire::Role::Decode {
            cmd.args(["--kv-listen", "127.0.0.1:0"]);
        }
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let io = tokio::time::timeout(Duration::from_secs(120), listener.accept()).await.unwrap().unwrap();
        let link = cluster::Link::accept(io, &me, Duration::from_secs(10)).await.unwrap();
        assert_eq!(link.peer, role);
        let (mut rd, mut wr) = link.split();
        let reg: cluster::proto::Register = rd.recv().await.unwrap().unwrap();
        assert_eq!(reg.context, 8192);
        let tenants = vec![cluster::proto::TenantEntry { id: 1, epoch: [0; 16] }];
        let table = cluster::proto::TenantTable { tenants, max_share: 1.0 };
        wr.send(&cluster::proto::Registered::Accepted(table)).await.unwrap();
        DirectGateway { rd, wr, child }
    }

    /// What the worker sent until `within` passed (its stats reports apart: the last one is
    /// returned beside; its route-tag reports left out).
    pub async fn answers(
        &mut self,
        within: Duration,
    ) -> (Vec<cluster::proto::ToGateway>, Option<cluster::proto::Stats>) {
        let (mut got, mut stats) = (Vec::new(), None);
        let until = tokio::time::Instant::now() + within;
        while let Ok(Ok(Some(m))) = tokio::time::timeout_at(until, self.rd.recv::<cluster::proto::ToGateway>()).await {
            match m {
                cluster::proto::ToGateway::Stats(s) => stats = Some(*s),
                cluster::proto::ToGateway::CacheTags { .. } => {}
                other => got.push(other),
            }
        }
        (got, stats)
    }
}

impl Drop for DirectGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A streaming chat request in its own thread: each content delta is sent on the channel as it
/// arrives; the thread returns the whole text after `[DONE]`, or the error event's object.
pub fn stream_chat(
    url: &str,
    key: &str,
    body: serde_json::Value,
) -> (mpsc::Receiver<String>, std::thread::JoinHandle<Result<String, serde_json::Value>>) {
    let (tx, rx) = mpsc::channel();
    let (url, key) = (format!("{url}/v1/chat/completions"), key.to_string());
    let h = std::thread::spawn(move || {
        let mut r = agent()
            .post(url)
            .header("Authorization", format!("Bearer {key}"))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut text = String::new();
        for line in BufReader::new(r.body_mut().as_reader()).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                return Ok(text);
            }
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            if v.get("error").is_some() {
                return Err(v);
            }
            if let Some(d) = v["choices"][0]["delta"]["content"].as_str() {
                text.push_str(d);
                let _ = tx.send(d.to_string());
            }
        }
        Err(serde_json::json!({"error": "the stream ended without [DONE] or an error event"}))
    });
    (rx, h)
}

/// Another tenant's traffic for a test that attacks or reconfigures the cluster: streamed
/// chat requests one after another until `stop`. Returns how many completed, and each failure
/// (an error event, or a status other than 200).
pub fn bystander(
    url: &str,
    key: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    let (url, key) = (url.to_string(), key.to_string());
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, Vec::new());
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let body = serde_json::json!({
                "model": super::MODEL_NAME,
                "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": 24, "ignore_eos": true, "stream": true,
            });
            let (status, text) = launch::post_json(
                &format!("{url}/v1/chat/completions"),
                &key,
                &body.to_string(),
                Duration::from_secs(120),
            )
            .unwrap();
            let done = text.lines().any(|l| l == "data: [DONE]");
            match (status, done) {
                (200, true) => ok += 1,
                (200, false) => failed.push(format!("a stream without [DONE]: {text}")),
                (s, _) => failed.push(format!("status {s}: {text}")),
            }
        }
        (ok, failed)
    })
}

/// `pagewarden tenant add NAME --config FILE` with generous limits; returns the key.
pub fn add_tenant(config: &std::path::Path, name: &str) -> String {
    let key = launch::tenant_add(bin().as_ref(), config, name).unwrap();
    let text = std::fs::read_to_string(config).unwrap();
    // The new tenant's table is the file's last: these keys land in it.
    std::fs::write(config, format!("{text}max_concurrent = 32\nmax_queued = 64\n")).unwrap();
    key
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
        for g in &mut self.more_gateways {
            let _ = g.child.kill();
            let _ = g.child.wait();
        }
        let _ = self.gateway.kill();
        let _ = self.gateway.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Standard base64, as a node key file holds it.
fn base64_of(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    while !out.len().is_multiple_of(4) {
        out.push('=');
    }
    out
}
