//! `pagewarden audit --spawn`: a whole deployment on loopback (a gateway, two prefill and two
//! decode workers, a fault-injecting proxy in front of each decode worker's KV port), faults
//! injected while the audit runs (kill -9 and restart of workers, corrupted, dropped,
//! duplicated, reordered, delayed and stalled KV frames), then torn down.
//!
//! Built with the `incident-replay` feature, it deploys the incident's configuration instead:
//! prefill pools smaller than the context window (the normal build refuses to start so).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::AuditError;
use crate::options::{AuditHooks, AuditOptions};
use crate::proxy::{Fault, Proxy};
use crate::run::{run_audit, AuditOutcome};
use crate::tenants::TenantKey;
use crate::Rng;

/// The served context window: small, so prompts near it stay cheap on a CPU.
pub const CONTEXT: usize = 1024;
/// Set to `1` to let a binary built with the `incident-replay` feature run a serving role: only
/// the audit's self-test (`audit --spawn` of the incident build) does.
pub const INCIDENT_SELF_TEST_ENV: &str = "PAGEWARDEN_INCIDENT_SELF_TEST";

const INCIDENT: bool = cfg!(feature = "incident-replay");
/// The bearer token of the spawned gateway's `/metrics` (written to its `[metrics] token_file`).
const METRICS_TOKEN_FILE: &str = "metrics-token";
/// The incident's prefill pool: smaller than the context window.
const INCIDENT_PREFILL_POOL: usize = 256;

/// The killer waits for the gateway to serve this many requests (200) between two kills. On a
/// fast machine they take less than the pause between kills, so only a slow one is paced.
const REQUESTS_PER_KILL: f64 = 8.0;

/// Every fault `--faults` knows.
pub const ALL_FAULTS: [&str; 7] = ["kill", "corrupt", "drop", "duplicate", "reorder", "delay", "stall"];

struct Proc {
    name: String,
    role: &'static str,
    child: Child,
    metrics: String,
    proxy: Option<Proxy>,
}

pub struct Deployment {
    pub dir: PathBuf,
    pub url: String,
    pub tenants_file: PathBuf,
    pub metrics_urls: Vec<String>,
    /// The bearer token of the gateway's `/metrics`.
    pub metrics_token: String,
    config: PathBuf,
    cluster_addr: String,
    gateway: Child,
    workers: Arc<Mutex<Vec<Proc>>>,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    /// Whether the proxies inject frame faults (paused for the timing probe).
    frame_faults: Arc<AtomicBool>,
    started: Instant,
    injector: Option<std::thread::JoinHandle<()>>,
}

fn exe() -> Result<PathBuf, AuditError> {
    std::env::current_exe().map_err(AuditError::spawn("locating the pagewarden executable"))
}

/// Spawns `args`; waits for a stdout line containing each marker; returns the text after
/// each marker.
fn spawn(args: &[&str], markers: &[&str]) -> Result<(Child, Vec<String>), AuditError> {
    let mut cmd = Command::new(exe()?);
    if INCIDENT {
        // The incident build refuses to serve unless told this is the audit's self-test.
        cmd.env(INCIDENT_SELF_TEST_ENV, "1");
    }
    cmd.args(args).stderr(Stdio::null());
    let mut p = launch::spawn(cmd)?;
    let got = p.expect_lines(markers, launch::START_TIMEOUT)?;
    Ok((p.child, got))
}

fn tenant_add(config: &Path, name: &str) -> Result<String, AuditError> {
    Ok(launch::tenant_add(&exe()?, config, name)?)
}

impl Deployment {
    pub fn start(tenants: usize, faults: &[String], seed: u64) -> Result<Deployment, AuditError> {
        let dir = std::env::temp_dir().join(format!("pw-audit-{}-{seed}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(AuditError::file("creating", &dir))?;
        let secret = launch::random_hex(32)?;
        launch::write_private(&dir.join("secret"), secret.as_bytes())?;
        let metrics_token = launch::random_hex(24)?;
        launch::write_private(&dir.join(METRICS_TOKEN_FILE), metrics_token.as_bytes())?;
        // Every node its own key, all pinned: the audit runs the cluster as an operator would.
        let mut pinned = Vec::new();
        for name in NODES {
            pinned.push(format!("\"{name}:{}\"", node_keygen(&node_key_file(&dir, name))?));
        }
        let config = dir.join("pagewarden.toml");
        let text = format!(
            "threads = 1\ncontext_window = {CONTEXT}\n[pool]\ntokens = {}\n[engine]\nqueue_timeout_ms = 20000\n\
             [limits]\nrequest_timeout_s = 120\n[cluster]\nsecret_file = \"{}\"\ntrusted_nodes = [{}]\n\
             transfer_timeout_ms = 5000\nhandshake_timeout_ms = 5000\n[metrics]\ntoken_file = \"{}\"\n",
            2 * CONTEXT,
            dir.join("secret").display(),
            pinned.join(", "),
            dir.join(METRICS_TOKEN_FILE).display()
        );
        std::fs::write(&config, text).map_err(AuditError::file("writing", &config))?;
        // `tenant add` gives each its id and appends it (the [[tenants]] tables come last).
        let mut keys = Vec::new();
        for i in 0..tenants {
            keys.push((format!("tenant-{i}"), tenant_add(&config, &format!("tenant-{i}"))?));
        }
        let text = std::fs::read_to_string(&config)
            .map_err(AuditError::file("reading", &config))?
            .replace("[[tenants]]", "[[tenants]]\nmax_concurrent = 64\nmax_queued = 128\ntokens_per_minute = 0");
        std::fs::write(&config, text).map_err(AuditError::file("writing", &config))?;
        let tenants_file = dir.join("tenants.toml");
        let mut t = String::new();
        for (name, key) in &keys {
            t.push_str(&format!("[[tenants]]\nname = \"{name}\"\nkey = \"{key}\"\n"));
        }
        std::fs::write(&tenants_file, t).map_err(AuditError::file("writing", &tenants_file))?;

        let cfg = config.to_string_lossy().to_string();
        let gw_key = node_key_file(&dir, "gateway").to_string_lossy().to_string();
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
        )?;
        let url = format!("http://{}", got[0]);
        let mut d = Deployment {
            dir,
            url: url.clone(),
            tenants_file,
            metrics_urls: vec![format!("{url}/metrics")],
            metrics_token,
            config,
            cluster_addr: got[1].clone(),
            gateway,
            workers: Arc::new(Mutex::new(Vec::new())),
            log: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            frame_faults: Arc::new(AtomicBool::new(true)),
            started: Instant::now(),
            injector: None,
        };
        let frame_faults: Vec<Fault> = faults.iter().filter_map(|f| Fault::parse(f)).collect();
        for (i, name) in ["prefill-0", "prefill-1"].into_iter().enumerate() {
            let w = d.start_worker("prefill", name, None)?;
            d.workers.lock().map_err(|_| AuditError::Poisoned)?.push(w);
            let _ = i;
        }
        for (i, name) in ["decode-0", "decode-1"].into_iter().enumerate() {
            // The fault choices: the audit's generator, a stream per proxy from the run's seed.
            let mut rng = Rng::new(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let ff = frame_faults.clone();
            let on = d.frame_faults.clone();
            let chooser = Box::new(move || {
                // One transfer in five gets a fault.
                if ff.is_empty() || !on.load(Ordering::SeqCst) || !rng.next_u64().is_multiple_of(5) {
                    return Fault::Pass;
                }
                *rng.pick(&ff)
            });
            let proxy = Proxy::start(String::new(), chooser).map_err(AuditError::spawn("starting the fault proxy"))?;
            let w = d.start_worker("decode", name, Some(proxy))?;
            d.workers.lock().map_err(|_| AuditError::Poisoned)?.push(w);
        }
        d.wait_ready()?;
        d.started = Instant::now();
        if faults.iter().any(|f| f == "kill") {
            d.injector = Some(d.start_killer(seed));
        }
        Ok(d)
    }

    fn start_worker(&self, role: &'static str, name: &str, proxy: Option<Proxy>) -> Result<Proc, AuditError> {
        start_worker(&self.config, &self.cluster_addr, role, name, proxy)
    }

    fn wait_ready(&self) -> Result<(), AuditError> {
        let t0 = Instant::now();
        loop {
            let metrics = format!("{}/metrics", self.url);
            let m = launch::scrape(&metrics, &self.metrics_token, Duration::from_secs(10)).unwrap_or_default();
            let registered = |role: &str| launch::metric(&m, "pagewarden_cluster_workers", &format!("role=\"{role}\""));
            if registered("prefill") == 2.0 && registered("decode") == 2.0 {
                return Ok(());
            }
            if t0.elapsed() > launch::START_TIMEOUT {
                return Err(AuditError::NotRegistered);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_killer(&self, seed: u64) -> std::thread::JoinHandle<()> {
        let (workers, log, stop) = (self.workers.clone(), self.log.clone(), self.stop.clone());
        let (config, cluster) = (self.config.clone(), self.cluster_addr.clone());
        let (metrics, token) = (format!("{}/metrics", self.url), self.metrics_token.clone());
        // Requests the gateway has served (a failure is no progress: counting them would let
        // the kills feed on their own 503s): kills are paced by them as well as by the clock.
        let answered = move || {
            let m = launch::scrape(&metrics, &token, Duration::from_secs(10)).unwrap_or_default();
            launch::metric(&m, "pagewarden_requests_total", "status=\"200\"")
        };
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed);
            let t0 = Instant::now();
            let mut last = answered();
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2500 + rng.below(2000) as u64));
                // On a slow machine a request outlives several such pauses: without this, most
                // requests in flight would meet a kill and the audit would judge mostly 503s.
                // So there is at most one kill per few served requests, on any machine.
                while !stop.load(Ordering::SeqCst) && answered() < last + REQUESTS_PER_KILL {
                    std::thread::sleep(Duration::from_millis(200));
                }
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                last = answered();
                let Ok(mut ws) = workers.lock() else { break };
                let i = rng.below(ws.len());
                let (name, role) = (ws[i].name.clone(), ws[i].role);
                let _ = ws[i].child.kill();
                let _ = ws[i].child.wait();
                if let Ok(mut l) = log.lock() {
                    l.push(format!("t={:.1}s kill -9 {name}", t0.elapsed().as_secs_f64()));
                }
                let proxy = ws[i].proxy.take();
                std::thread::sleep(Duration::from_millis(300));
                match start_worker(&config, &cluster, role, &name, proxy) {
                    Ok(w) => ws[i] = w,
                    Err(e) => {
                        if let Ok(mut l) = log.lock() {
                            l.push(format!("restarting {name} failed: {e}"));
                        }
                        break;
                    }
                }
                if let Ok(mut l) = log.lock() {
                    l.push(format!("t={:.1}s restarted {name}", t0.elapsed().as_secs_f64()));
                }
            }
        })
    }

    /// Stops injecting kills (frame faults stay: they are per transfer and cannot leak pages).
    pub fn stop_faults(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.injector.take() {
            let _ = h.join();
        }
    }

    /// Stops injecting frame faults: the re-runs are the reference the load is compared with,
    /// and the timing probe measures time to first token, which delayed, stalled or retried
    /// transfers would only blur.
    pub fn pause_frame_faults(&mut self) {
        if self.frame_faults.swap(false, Ordering::SeqCst) {
            if let Ok(mut l) = self.log.lock() {
                l.push(format!(
                    "t={:.1}s frame faults paused for the re-runs and the timing probe",
                    self.started.elapsed().as_secs_f64()
                ));
            }
        }
    }

    /// What was injected, one line each.
    pub fn fault_log(&self) -> Vec<String> {
        let mut out = self.log.lock().map(|l| l.clone()).unwrap_or_default();
        if let Ok(ws) = self.workers.lock() {
            for w in ws.iter() {
                if let Some(p) = &w.proxy {
                    out.extend(p.log());
                }
            }
        }
        out
    }

    /// The workers' current metrics endpoints (restarts change them).
    pub fn worker_metrics(&self) -> Vec<String> {
        self.workers.lock().map(|ws| ws.iter().map(|w| w.metrics.clone()).collect()).unwrap_or_default()
    }
}

/// The nodes of an audit deployment, each with its own key (a restarted worker keeps its name,
/// so its key).
const NODES: [&str; 5] = ["gateway", "prefill-0", "prefill-1", "decode-0", "decode-1"];

fn node_key_file(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.key"))
}

/// `pagewarden node keygen --out FILE` (a fresh file: one left by an earlier run of the same
/// seed goes first); the node identity it printed.
fn node_keygen(file: &Path) -> Result<String, AuditError> {
    let _ = std::fs::remove_file(file);
    let out = Command::new(exe()?)
        .args(["node", "keygen", "--out"])
        .arg(file)
        .output()
        .map_err(AuditError::spawn("running pagewarden node keygen"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        return Err(AuditError::Process { process: "node keygen", stderr });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn start_worker(
    config: &Path,
    cluster: &str,
    role: &'static str,
    name: &str,
    proxy: Option<Proxy>,
) -> Result<Proc, AuditError> {
    let cfg = config.to_string_lossy().to_string();
    let key = node_key_file(config.parent().unwrap_or(Path::new(".")), name).to_string_lossy().to_string();
    let mut args: Vec<String> = [
        role,
        "--config",
        &cfg,
        "--gateway",
        cluster,
        "--name",
        name,
        "--metrics-listen",
        "127.0.0.1:0",
        "--node-key",
        &key,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if role == "prefill" && INCIDENT {
        args.extend(["--pool-tokens".into(), INCIDENT_PREFILL_POOL.to_string()]);
    }
    let mut markers = vec!["metrics on http://"];
    if let Some(p) = &proxy {
        args.extend(["--kv-listen".into(), "127.0.0.1:0".into(), "--kv-advertise".into(), p.addr.clone()]);
        markers.push(launch::listening::KV);
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let (child, got) = spawn(&argv, &markers)?;
    if let (Some(p), Some(kv)) = (&proxy, got.get(1)) {
        p.set_upstream(kv.clone());
    }
    Ok(Proc { name: name.into(), role, child, metrics: format!("http://{}", got[0]), proxy })
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.injector.take() {
            let _ = h.join();
        }
        if let Ok(mut ws) = self.workers.lock() {
            for w in ws.iter_mut() {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
        let _ = self.gateway.kill();
        let _ = self.gateway.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Tells the audit what the spawner does: stop every fault when the load phase ends, and what
/// was injected.
struct SpawnHooks<'a> {
    d: &'a Mutex<Deployment>,
}

impl AuditHooks for SpawnHooks<'_> {
    fn on_load_done(&self) {
        if let Ok(mut d) = self.d.lock() {
            d.stop_faults();
            d.pause_frame_faults();
        }
    }

    fn fault_log(&self) -> Vec<String> {
        self.d.lock().map(|d| d.fault_log()).unwrap_or_default()
    }

    fn metrics_urls(&self) -> Vec<String> {
        self.d
            .lock()
            .map(|d| {
                let mut urls = d.metrics_urls.clone();
                urls.extend(d.worker_metrics());
                urls
            })
            .unwrap_or_default()
    }
}

/// Parses `--faults` (comma-separated; default: all of [`ALL_FAULTS`]).
pub fn parse_faults(list: Option<&str>) -> Result<Vec<String>, AuditError> {
    let Some(list) = list else { return Ok(ALL_FAULTS.iter().map(|s| s.to_string()).collect()) };
    let mut out = Vec::new();
    for f in list.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        if f == "none" {
            continue;
        }
        if !ALL_FAULTS.contains(&f) {
            return Err(AuditError::Usage(format!("unknown fault `{f}`; known: {} (or none)", ALL_FAULTS.join(", "))));
        }
        out.push(f.to_string());
    }
    Ok(out)
}

/// `pagewarden audit --spawn [--faults LIST]`: starts the deployment and audits it with the
/// options `options` makes for its URL and tenants.
pub fn run(
    seed: Option<u64>,
    tenants: usize,
    faults: Option<&str>,
    options: &dyn Fn(String, Vec<TenantKey>) -> AuditOptions,
) -> Result<AuditOutcome, AuditError> {
    let faults = parse_faults(faults)?;
    let seed = seed.unwrap_or_else(crate::rng::random_seed);
    let d = Deployment::start(tenants, &faults, seed)?;
    eprintln!(
        "spawned {}{}: gateway {}, 2 prefill and 2 decode workers, a fault proxy per decode worker; faults: {}",
        if INCIDENT { "THE INCIDENT BUILD " } else { "" },
        if INCIDENT { "(prefill pools smaller than the context window)" } else { "" },
        d.url,
        if faults.is_empty() { "none".to_string() } else { faults.join(",") }
    );
    let mut opts = options(d.url.clone(), crate::tenants::load(&d.tenants_file)?);
    opts.seed = seed;
    opts.context_window = Some(CONTEXT);
    opts.metrics_urls = d.metrics_urls.clone();
    opts.metrics_token = Some(d.metrics_token.clone());
    let d = Mutex::new(d);
    run_audit(&opts, &SpawnHooks { d: &d })
}
