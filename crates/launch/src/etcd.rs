//! A real etcd on loopback for tests: free ports, a fresh data directory, and the means to
//! kill it (`kill -9`) and bring it back on the same ports and data, as an outage does.
//!
//! The binary is `etcd` on PATH or /usr/bin/etcd; on a fresh machine where it is missing and
//! the tests run as root, Debian's `etcd-server` package is installed first, so `cargo test
//! --workspace` needs no manual step.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{agent, scratch_dir, LaunchError};

/// How long etcd may take to answer `/version` (it starts in well under a second).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The Debian package that holds the server.
const PACKAGE: &str = "etcd-server";

/// A single-member etcd on loopback.
pub struct EtcdServer {
    exe: PathBuf,
    /// Holds the data directory and the log; removed on drop.
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl EtcdServer {
    /// Starts etcd on free loopback ports (client and peer) with a fresh temp data dir; finds
    /// `etcd` on PATH or /usr/bin/etcd (installing `etcd-server` as root when missing). Waits
    /// until `GET /version` answers.
    pub fn start() -> Result<Self, LaunchError> {
        let exe = find_or_install()?;
        let dir = scratch_dir("pw-etcd")?;
        let mut server = EtcdServer { exe, dir, client_port: 0, peer_port: 0, child: None };
        // A port found free can be taken by another test before etcd binds it: try new ones.
        let mut tries = 0;
        loop {
            server.client_port = free_port()?;
            server.peer_port = free_port()?;
            tries += 1;
            match server.run() {
                Ok(()) => return Ok(server),
                Err(LaunchError::EtcdNotServing { exited: true, .. }) if tries < 3 => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// "127.0.0.1:PORT", the client endpoint.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The log etcd writes (stderr), for a failing test to show.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// SIGKILL and reap, to test etcd going away.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports and data dir (leases survive, as etcd's do; etcd
    /// renews them all when it comes back).
    pub fn restart(&mut self) -> Result<(), LaunchError> {
        self.kill9();
        self.run()
    }

    /// Spawns etcd and waits for `/version`; kills it on failure.
    fn run(&mut self) -> Result<(), LaunchError> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log_path = self.log_path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| LaunchError::Io { what: format!("opening {}", log_path.display()), source })?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("--name")
            .arg("default")
            // etcd makes the directory itself, owner-only, as it insists on.
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .arg("--initial-cluster")
            .arg(format!("default={peer}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let what = format!("{} on {client}", self.exe.display());
        self.child = Some(cmd.spawn().map_err(|source| LaunchError::Spawn { what: what.clone(), source })?);
        let a = agent(Duration::from_secs(2));
        let url = format!("{client}/version");
        let t0 = Instant::now();
        loop {
            if a.get(&url).call().is_ok_and(|r| r.status() == 200) {
                return Ok(());
            }
            if self.exited() || t0.elapsed() > START_TIMEOUT {
                let exited = self.exited();
                self.kill9();
                return Err(LaunchError::EtcdNotServing {
                    url,
                    exited,
                    reason: if exited { "etcd exited".into() } else { format!("no answer within {START_TIMEOUT:?}") },
                    log_tail: tail(&log_path),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(|c| c.try_wait().map(|s| s.is_some()).unwrap_or(true))
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port nothing listens on now (bound, read, released).
fn free_port() -> Result<u16, LaunchError> {
    let io = |source| LaunchError::Io { what: "finding a free loopback port".into(), source };
    let l = TcpListener::bind("127.0.0.1:0").map_err(io)?;
    Ok(l.local_addr().map_err(io)?.port())
}

/// `etcd` on PATH, else /usr/bin/etcd, else (as root) Debian's package installed.
fn find_or_install() -> Result<PathBuf, LaunchError> {
    if let Some(exe) = find() {
        return Ok(exe);
    }
    // Tests start servers in parallel: one install at a time (apt holds a lock anyway).
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one = INSTALL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(exe) = find() {
        return Ok(exe);
    }
    if !is_root() {
        return Err(LaunchError::EtcdMissing {
            reason: format!("not found on PATH nor at /usr/bin/etcd; install the `{PACKAGE}` package"),
        });
    }
    let install = || apt(&["install", "-y", "--no-install-recommends", PACKAGE]);
    if let Err(first) = install() {
        // A fresh machine often has no package lists yet.
        apt(&["update"])?;
        install().map_err(|e| LaunchError::EtcdMissing { reason: format!("{first}; after apt-get update: {e}") })?;
    }
    find().ok_or_else(|| LaunchError::EtcdMissing {
        reason: format!("`{PACKAGE}` installed but no etcd on PATH nor at /usr/bin/etcd"),
    })
}

fn find() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("etcd"));
    on_path.chain([PathBuf::from("/usr/bin/etcd")]).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether we run as root: /proc/self belongs to the process's effective user.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn apt(args: &[&str]) -> Result<(), LaunchError> {
    let what = format!("apt-get {}", args.join(" "));
    let out = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LaunchError::Spawn { what: what.clone(), source })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(LaunchError::EtcdMissing { reason: format!("`{what}` failed ({}): {}", out.status, stderr.trim()) })
}

/// The last lines of etcd's log.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_starts_answers_and_comes_back_on_the_same_port() {
        let mut etcd = EtcdServer::start().expect("etcd");
        let version = format!("http://{}/version", etcd.endpoint());
        let a = agent(Duration::from_secs(2));
        assert!(a.get(&version).call().is_ok_and(|r| r.status() == 200));
        etcd.kill9();
        assert!(a.get(&version).call().is_err(), "killed etcd still answers");
        etcd.restart().expect("restart");
        assert!(a.get(&version).call().is_ok_and(|r| r.status() == 200));
        let dir = etcd.dir.clone();
        drop(etcd);
        assert!(!dir.exists(), "the data dir outlived the server");
    }
}
