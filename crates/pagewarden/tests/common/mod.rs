#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A real `pagewarden serve` process on a free loopback port, with its own config and tenant.

#![allow(dead_code)]

pub mod cluster;
pub mod fake_openai;
pub mod relay;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const MODEL_NAME: &str = "SmolLM2-135M-Instruct";
/// The bearer token of the gateway's `/metrics` in every config these helpers write.
pub const METRICS_TOKEN: &str = "metrics-token-of-the-pagewarden-tests-0123456789";

/// Writes the metrics token file into `dir`; returns the `[metrics]` section naming it.
pub fn metrics_section(dir: &std::path::Path) -> String {
    let path = dir.join("metrics-token");
    write_secret(&path, METRICS_TOKEN);
    format!("[metrics]\ntoken_file = \"{}\"\n", path.display())
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pagewarden")
}

pub struct Server {
    pub url: String,
    pub key: String,
    pub dir: PathBuf,
    child: Child,
}

impl Server {
    /// Starts a server whose config holds one tenant (`extra_tenant_lines` appended to it).
    pub fn start(extra_tenant_lines: &[&str]) -> Server {
        let (dir, key) = Server::configure(extra_tenant_lines);
        Server::spawn(dir, key, None)
    }

    /// A fresh directory with `pagewarden.toml` (one tenant, `extra_tenant_lines` after it)
    /// and the tenant's key.
    pub fn configure(extra_tenant_lines: &[&str]) -> (PathBuf, String) {
        fetch::ensure_default_model().expect("default model");
        let dir = launch::scratch_dir("pw-serve").unwrap();
        let config = dir.join("pagewarden.toml");
        std::fs::write(&config, format!("[pool]\ntokens = 32768\n{}", metrics_section(&dir))).unwrap();
        let key = launch::tenant_add(bin().as_ref(), &config, "tester").unwrap();
        let mut cfg = std::fs::read_to_string(&config).unwrap();
        for l in extra_tenant_lines {
            cfg.push_str(l);
            cfg.push('\n');
        }
        std::fs::write(&config, cfg).unwrap();
        (dir, key)
    }

    /// Starts `serve` on `dir/pagewarden.toml` as written; `key` is the tenant [`Server::post`]
    /// uses.
    pub fn start_with(dir: PathBuf, key: String) -> Server {
        Server::spawn(dir, key, None)
    }

    /// [`Server::start`] with its log in `dir/stderr.log` ([`Server::log`]): JSON lines with the
    /// `PAGEWARDEN_LOG` filter `filter`.
    pub fn start_logging(filter: &str) -> Server {
        let (dir, key) = Server::configure(&[]);
        Server::spawn(dir, key, Some(filter))
    }

    fn spawn(dir: PathBuf, key: String, log_filter: Option<&str>) -> Server {
        let config = dir.join("pagewarden.toml");
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"]).arg(&config);
        match log_filter {
            Some(f) => {
                let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
                cmd.args(["--log-format", "json"]).env("PAGEWARDEN_LOG", f).stderr(log)
            }
            None => cmd.stderr(Stdio::null()),
        };
        let mut p = launch::spawn(cmd).unwrap();
        let url = p.expect_lines(&[launch::listening::API], launch::START_TIMEOUT).unwrap().remove(0);
        // The address is printed once the workers registered; over HTTPS the caller's client
        // (with its CA) is the readiness check.
        if url.starts_with("http://") {
            launch::wait_ready(&url, launch::START_TIMEOUT).unwrap();
        }
        Server { url, key, dir, child: p.child }
    }

    pub fn agent(&self) -> ureq::Agent {
        launch::agent(Duration::from_secs(120))
    }

    /// POSTs JSON to `path`; returns (status, body).
    pub fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let url = format!("{}{path}", self.url);
        let (status, text) = launch::post_json(&url, &self.key, &body.to_string(), Duration::from_secs(120)).unwrap();
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    /// What a server from [`Server::start_logging`] wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// Sends SIGHUP: the server reloads its tenants from its config file.
    pub fn reload(&self) {
        let st = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status().unwrap();
        assert!(st.success());
    }

    /// SIGTERM, then waits (at most 60 s) for the drain to end and the process to exit; the
    /// directory stays (for a restart with [`Server::start_with`]).
    pub fn stop(mut self) -> std::process::ExitStatus {
        let st = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(st.success());
        let t0 = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Keep the directory: forget it before Drop removes it.
                self.dir = PathBuf::new();
                return status;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "serve did not exit within 60 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn metrics(&self) -> String {
        self.agent()
            .get(format!("{}/metrics", self.url))
            .header("Authorization", format!("Bearer {METRICS_TOKEN}"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Chat prompts the end-to-end tests compare across paths.
pub const PROMPTS: [&str; 4] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Name three primary colors.",
];

/// A greedy chat request body.
pub fn chat(prompt: &str, max_tokens: usize) -> serde_json::Value {
    serde_json::json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// A greedy chat request that runs to `max_tokens` (`ignore_eos`), streamed or not.
pub fn chat_to_length(prompt: &str, max_tokens: usize, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// `pagewarden generate --chat PROMPT --json` in its own process: the reference output.
pub fn generate_cli(prompt: &str, max_tokens: usize) -> serde_json::Value {
    let out = Command::new(bin())
        .args(["generate", "--chat", prompt, "--max-tokens", &max_tokens.to_string(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Writes a secret file readable by its owner only, as the roles require.
pub fn write_secret(path: &std::path::Path, text: &str) {
    launch::write_private(path, text.as_bytes()).unwrap();
}

/// A Python virtual environment (shared by the tests, in the target's temporary directory)
/// with `packages` installed from PyPI; returns its interpreter.
pub fn python_with(packages: &[&str]) -> PathBuf {
    // The tests of one binary run on threads: one venv creation and one pip at a time.
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
        assert!(ok.success(), "creating a venv failed");
    }
    let pip = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(packages)
        .status()
        .expect("pip install");
    assert!(pip.success(), "pip install {packages:?} failed (is PyPI reachable?)");
    python
}

/// A script of the repository's `tests/openai` directory.
pub fn python_script(name: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/openai").join(name)
}

/// Runs a client script of `tests/openai` with `args` and asserts it passed every check.
pub fn run_python_checks(python: &std::path::Path, script: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let mut cmd = Command::new(python);
    cmd.arg(python_script(script));
    for a in args {
        cmd.arg(a);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("passed, 0 failed"), "{stdout}");
}
