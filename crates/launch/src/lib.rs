//! Starting `pagewarden` processes and knowing when they serve, written once for every caller
//! that needs a real deployment: the integration tests' servers and clusters, the audit's
//! spawned deployment (`pagewarden audit --spawn`) and the prefix-cache bench.
//!
//! A process prints what it listens on to stdout, one line per listener ([`listening`]:
//! `listening on http://…`, `cluster listening on …`, `NAME: KV listening on …`); [`Launched`] reads those lines on a thread of its own (so the
//! child never blocks on a full pipe) and [`Launched::expect_lines`] waits for them with a
//! deadline. [`wait_ready`] then polls `/ready`. Every wait here has a deadline.
//!
//! [`etcd::EtcdServer`] is a real etcd on loopback for the membership tests (killed and
//! restarted on the same ports and data to play an outage).
#![forbid(unsafe_code)]

pub use types::listening;

pub mod etcd;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a process may take to print its addresses or become ready (a model loads first).
pub const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a process did not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start `{what}`: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{what}` did not print {missing:?} within {timeout:?} (exit status {status})")]
    NoAddress { what: String, missing: Vec<String>, timeout: Duration, status: String },
    #[error("{url}/ready did not answer 200 within {timeout:?}")]
    NotReady { url: String, timeout: Duration },
    #[error("`pagewarden tenant add {name}` failed: {stderr}")]
    TenantAdd { name: String, stderr: String },
    #[error("POST {url}: {message}")]
    Http { url: String, message: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the system's random source failed: {0}")]
    Random(String),
    #[error("etcd is not available: {reason}")]
    EtcdMissing { reason: String },
    #[error("etcd at {url} did not serve: {reason}; its log ends:\n{log_tail}")]
    EtcdNotServing { url: String, exited: bool, reason: String, log_tail: String },
}

/// A child process whose stdout lines arrive on a channel.
pub struct Launched {
    pub child: Child,
    what: String,
    lines: mpsc::Receiver<String>,
}

/// Spawns `cmd` with stdout piped (stdin closed; stderr as `cmd` set it).
pub fn spawn(mut cmd: Command) -> Result<Launched, LaunchError> {
    let what = describe(&cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|source| LaunchError::Spawn { what: what.clone(), source })?;
    let (tx, lines) = mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            // Reads to the end even when nobody listens any more: the child never blocks.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    Ok(Launched { child, what, lines })
}

impl Launched {
    /// Waits for a stdout line containing each marker; returns what follows each, trimmed.
    /// On the deadline the child is killed and the error says which markers never came.
    pub fn expect_lines(&mut self, markers: &[&str], timeout: Duration) -> Result<Vec<String>, LaunchError> {
        let mut found: Vec<Option<String>> = vec![None; markers.len()];
        let t0 = Instant::now();
        while found.iter().any(Option::is_none) {
            let left = timeout.saturating_sub(t0.elapsed());
            let Ok(line) = self.lines.recv_timeout(left) else {
                let _ = self.child.kill();
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                let missing =
                    markers.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(m, _)| m.to_string()).collect();
                return Err(LaunchError::NoAddress { what: self.what.clone(), missing, timeout, status });
            };
            for (i, m) in markers.iter().enumerate() {
                if let Some(pos) = line.find(m) {
                    found[i] = Some(line[pos + m.len()..].trim().to_string());
                }
            }
        }
        Ok(found.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9` and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `{url}/ready` until it answers 200.
pub fn wait_ready(url: &str, timeout: Duration) -> Result<(), LaunchError> {
    let a = agent(Duration::from_secs(5));
    let t0 = Instant::now();
    while !a.get(format!("{url}/ready")).call().is_ok_and(|r| r.status() == 200) {
        if t0.elapsed() > timeout {
            return Err(LaunchError::NotReady { url: url.to_string(), timeout });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// An HTTP client that returns error statuses as responses, with an overall deadline.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().into()
}

/// `GET {url}` with a bearer token (a `/metrics` scrape); the body, or `None` if the request
/// failed or answered other than 200.
pub fn scrape(url: &str, bearer: &str, timeout: Duration) -> Option<String> {
    let mut r = agent(timeout).get(url).header("Authorization", format!("Bearer {bearer}")).call().ok()?;
    if r.status() != 200 {
        return None;
    }
    r.body_mut().read_to_string().ok()
}

/// `POST {url}` of a JSON `body` as tenant `bearer`; the status and the body text.
pub fn post_json(url: &str, bearer: &str, body: &str, timeout: Duration) -> Result<(u16, String), LaunchError> {
    let http = |e: ureq::Error| LaunchError::Http { url: url.to_string(), message: e.to_string() };
    let mut r = agent(timeout)
        .post(url)
        .header("Authorization", format!("Bearer {bearer}"))
        .header("Content-Type", "application/json")
        .send(body.as_bytes())
        .map_err(http)?;
    let text = r.body_mut().read_to_string().map_err(http)?;
    Ok((r.status().as_u16(), text))
}

/// `EXE tenant add NAME --config CONFIG`; returns the new tenant's key (its first stdout line).
pub fn tenant_add(exe: &Path, config: &Path, name: &str) -> Result<String, LaunchError> {
    let out = Command::new(exe)
        .args(["tenant", "add", name, "--config"])
        .arg(config)
        .output()
        .map_err(|source| LaunchError::Spawn { what: format!("{} tenant add", exe.display()), source })?;
    if !out.status.success() {
        return Err(LaunchError::TenantAdd {
            name: name.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string())
}

/// `bytes` fresh random bytes from the system's source, as lower-case hex: a secret in the form
/// the roles accept (cluster secret, metrics token).
pub fn random_hex(bytes: usize) -> Result<String, LaunchError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| LaunchError::Random(e.to_string()))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Writes a file readable by its owner only (the roles refuse looser secret files).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), LaunchError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let io = |source| LaunchError::Io { what: format!("writing {}", path.display()), source };
    options.open(path).map_err(io)?.write_all(bytes).map_err(io)
}

/// A fresh directory under the system's temporary directory, named `{prefix}-{pid}-{nanos}`.
pub fn scratch_dir(prefix: &str) -> Result<PathBuf, LaunchError> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|source| LaunchError::Io { what: format!("creating {}", dir.display()), source })?;
    Ok(dir)
}

/// The sum of the samples of `name` whose label text contains `filter` ("" for all), in a
/// Prometheus or OpenMetrics exposition.
pub fn metric(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter(|l| l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Whether the exposition has any sample of `name`: a family that is absent is not zero.
pub fn has_metric(text: &str, name: &str) -> bool {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .any(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().to_string();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_hex_is_fresh_lower_case_hex_of_the_asked_length() {
        let (a, b) = (random_hex(32).expect("random"), random_hex(32).expect("random"));
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn metric_sums_the_named_family_only() {
        let text = "# TYPE pagewarden_kv_pages_used gauge\npagewarden_kv_pages_used{tenant=\"1\"} 3\n\
                    pagewarden_kv_pages_used{tenant=\"2\"} 4\npagewarden_kv_pages_used_extra 100\n\
                    pagewarden_kv_pages_total 9\n# EOF\n";
        assert_eq!(metric(text, "pagewarden_kv_pages_used", ""), 7.0);
        assert_eq!(metric(text, "pagewarden_kv_pages_used", "tenant=\"2\""), 4.0);
        assert_eq!(metric(text, "pagewarden_kv_pages_total", ""), 9.0);
        assert!(has_metric(text, "pagewarden_kv_pages_total"));
        // Declared but without a sample, or only a longer name: absent, not zero.
        assert!(!has_metric("# TYPE pagewarden_x gauge\npagewarden_x_extra 1\n", "pagewarden_x"));
    }

    #[test]
    fn expect_lines_returns_what_follows_each_marker() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo 'noise'; echo 'listening on http://127.0.0.1:5'; echo 'kv listening on 127.0.0.1:6'"]);
        let mut p = spawn(cmd).expect("sh");
        let got =
            p.expect_lines(&["listening on http://", "kv listening on "], Duration::from_secs(10)).expect("lines");
        assert_eq!(got, ["127.0.0.1:5", "127.0.0.1:6"]);
    }

    #[test]
    fn a_process_that_never_prints_its_address_fails_at_the_deadline() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut p = spawn(cmd).expect("sleep");
        let t0 = Instant::now();
        let e = p.expect_lines(&["listening on "], Duration::from_millis(300)).expect_err("no address");
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(matches!(e, LaunchError::NoAddress { ref missing, .. } if missing == &["listening on "]), "{e}");
    }

    #[test]
    fn private_files_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch_dir("pw-launch-test").expect("dir");
        let f = dir.join("secret");
        write_private(&f, b"x").expect("write");
        assert_eq!(std::fs::metadata(&f).expect("meta").permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(dir);
    }
}
