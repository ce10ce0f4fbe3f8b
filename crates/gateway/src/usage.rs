//! Usage accounting: one record per API request a tenant made (token counts, timings, outcome;
//! never prompt or output text), appended as a JSON line to the `[usage] log` file, rotated by
//! size, and summed per tenant by `pagewarden usage`.
//!
//! Records are written by a thread of their own so that a request never waits on the disk; the
//! channel to it is unbounded, because a record dropped is a request nobody is billed for. The
//! file is opened in append mode (a restart continues it); when it passes `max_bytes` it becomes
//! `FILE.1` (the older ones shift to `.2` ... `.keep`, the oldest is deleted). The drain flushes
//! the writer before the server exits.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One request as billed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Unix seconds when the request ended.
    pub ts: f64,
    pub request: u64,
    /// The tenant's id (stable) and its name when the request ran (the operator's label).
    pub tenant: u64,
    pub tenant_name: String,
    pub model: String,
    pub endpoint: String,
    pub status: u16,
    /// A finish reason (`stop`, `length`), `error`, `cancelled` or `rejected`.
    pub outcome: String,
    /// Prompt tokens computed or taken from the cache (0 for a request refused before it ran).
    pub prompt_tokens: u64,
    /// Of `prompt_tokens`, those whose KV came from the tenant's prefix cache.
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
}

/// Where and how the log is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageSettings {
    pub path: PathBuf,
    /// Rotate once the file passes this size.
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.1` newest ... `FILE.keep` oldest).
    pub keep: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("cannot open the usage log {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the usage log {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

enum Msg {
    Record(UsageRecord),
    Flush(mpsc::Sender<()>),
}

/// The writer's handle.
#[derive(Debug)]
pub struct UsageLog {
    tx: mpsc::Sender<Msg>,
    path: PathBuf,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Record(_) => "Record",
            Msg::Flush(_) => "Flush",
        })
    }
}

impl UsageLog {
    /// Opens (or creates) the log and starts its writer; an unwritable path fails here, at
    /// start-up, not at the first request.
    pub fn open(settings: UsageSettings) -> Result<UsageLog, UsageError> {
        let file = open_append(&settings.path)?;
        for older in (1..=settings.keep.max(1)).map(|i| rotated(&settings.path, i)) {
            if let Ok(f) = File::open(&older) {
                make_private(&f, &older)?;
            }
        }
        let (tx, rx) = mpsc::channel();
        let path = settings.path.clone();
        std::thread::Builder::new()
            .name("usage-log".into())
            .spawn(move || write_loop(settings, file, rx))
            .map_err(|source| UsageError::Open { path: path.clone(), source })?;
        Ok(UsageLog { tx, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues a record (never blocks).
    pub fn record(&self, r: UsageRecord) {
        if self.tx.send(Msg::Record(r)).is_err() {
            tracing::error!(target: "pagewarden::usage", "the usage log writer has stopped; a record is lost");
        }
    }

    /// Waits until every record queued before this call is written, at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Msg::Flush(tx)).is_ok() && rx.recv_timeout(timeout).is_ok()
    }
}

/// Opens the log for appending, created owner-only (it names tenants and what each used); a
/// file left readable by group or others by an earlier version is made owner-only too.
fn open_append(path: &Path) -> Result<File, UsageError> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(path).map_err(|source| UsageError::Open { path: path.to_path_buf(), source })?;
    make_private(&file, path)?;
    Ok(file)
}

/// Takes group and other permissions off an open file (never adds any).
fn make_private(file: &File, path: &Path) -> Result<(), UsageError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let open = |source| UsageError::Open { path: path.to_path_buf(), source };
        let mode = file.metadata().map_err(open)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(mode & !0o077)).map_err(open)?;
            tracing::warn!(target: "pagewarden::usage", path = %path.display(), "usage log was readable by group or others: made owner-only");
        }
    }
    let _ = (file, path);
    Ok(())
}

fn write_loop(settings: UsageSettings, mut file: File, rx: mpsc::Receiver<Msg>) {
    let mut size = file.metadata().map(|m| m.len()).unwrap_or(0);
    for msg in rx {
        let r = match msg {
            Msg::Record(r) => r,
            Msg::Flush(done) => {
                let _ = file.sync_data();
                let _ = done.send(());
                continue;
            }
        };
        let mut line = match serde_json::to_vec(&r) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(target: "pagewarden::usage", request = r.request, error = %e, "usage record not encoded");
                continue;
            }
        };
        line.push(b'\n');
        // One write per line: a reader (or a crash) never sees half a record from us.
        if let Err(e) = file.write_all(&line) {
            tracing::error!(target: "pagewarden::usage", request = r.request, error = %e, "usage record not written");
            continue;
        }
        size += line.len() as u64;
        if size >= settings.max_bytes {
            match rotate(&settings) {
                Ok(f) => (file, size) = (f, 0),
                Err(e) => tracing::error!(target: "pagewarden::usage", error = %e, "usage log not rotated"),
            }
        }
    }
}

/// `FILE` -> `FILE.1` -> ... -> `FILE.keep` (deleted past it); a fresh `FILE`.
fn rotate(s: &UsageSettings) -> Result<File, UsageError> {
    let numbered = |i: usize| rotated(&s.path, i);
    let _ = std::fs::remove_file(numbered(s.keep.max(1)));
    for i in (1..s.keep.max(1)).rev() {
        let _ = std::fs::rename(numbered(i), numbered(i + 1));
    }
    std::fs::rename(&s.path, numbered(1)).map_err(|source| UsageError::Open { path: s.path.clone(), source })?;
    open_append(&s.path)
}

fn rotated(path: &Path, i: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{i}"));
    PathBuf::from(p)
}

/// Every record of the log and its rotated files, oldest file first; lines that do not parse
/// (a file cut by a crash) are counted, not fatal.
pub fn read_all(path: &Path) -> Result<(Vec<UsageRecord>, usize), UsageError> {
    let mut files: Vec<PathBuf> =
        (1..).map(|i| rotated(path, i)).take_while(|p| p.exists()).collect::<Vec<_>>().into_iter().rev().collect();
    files.push(path.to_path_buf());
    let (mut out, mut bad) = (Vec::new(), 0);
    for f in files {
        let file = match File::open(&f) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && f == path => continue,
            Err(source) => return Err(UsageError::Read { path: f, source }),
        };
        for line in BufReader::new(file).lines() {
            let line = line.map_err(|source| UsageError::Read { path: f.clone(), source })?;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<UsageRecord>(&line) {
                Ok(r) => out.push(r),
                Err(_) => bad += 1,
            }
        }
    }
    Ok((out, bad))
}

/// One tenant's totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TenantTotals {
    pub tenant: u64,
    /// The latest name the records carry.
    pub tenant_name: String,
    pub requests: u64,
    /// Requests by outcome.
    pub outcomes: std::collections::BTreeMap<String, u64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
}

/// Totals per tenant (by id) of the records at or after `since` (unix seconds) whose tenant
/// id or name is `tenant`, if given.
pub fn totals(records: &[UsageRecord], since: Option<f64>, tenant: Option<&str>) -> Vec<TenantTotals> {
    let mut by: std::collections::BTreeMap<u64, TenantTotals> = Default::default();
    for r in records {
        if since.is_some_and(|s| r.ts < s) {
            continue;
        }
        if tenant.is_some_and(|t| t != r.tenant_name && t != r.tenant.to_string()) {
            continue;
        }
        let t = by.entry(r.tenant).or_insert_with(|| TenantTotals { tenant: r.tenant, ..Default::default() });
        t.tenant_name.clone_from(&r.tenant_name);
        t.requests += 1;
        *t.outcomes.entry(r.outcome.clone()).or_default() += 1;
        t.prompt_tokens += r.prompt_tokens;
        t.cached_tokens += r.cached_tokens;
        t.completion_tokens += r.completion_tokens;
    }
    by.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u64, tenant: u64, name: &str) -> UsageRecord {
        UsageRecord {
            ts: 1_000.0 + i as f64,
            request: i,
            tenant,
            tenant_name: name.into(),
            model: "m".into(),
            endpoint: "chat".into(),
            status: 200,
            outcome: "stop".into(),
            prompt_tokens: 10,
            cached_tokens: 2,
            completion_tokens: 5,
            ttft_ms: Some(1.5),
            total_ms: 9.0,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pw-usage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn records_survive_a_reopen_and_rotation_keeps_every_record_up_to_keep_files() {
        let dir = scratch("rotate");
        let path = dir.join("usage.jsonl");
        let settings = UsageSettings { path: path.clone(), max_bytes: 1_000, keep: 50 };
        let log = UsageLog::open(settings.clone()).expect("open");
        for i in 0..20 {
            log.record(record(i, 1, "alice"));
        }
        assert!(log.flush(Duration::from_secs(10)));
        drop(log);
        // A restart appends to the same log.
        let log = UsageLog::open(settings).expect("reopen");
        for i in 20..40 {
            log.record(record(i, 2, "bob"));
        }
        assert!(log.flush(Duration::from_secs(10)));
        assert!(rotated(&path, 1).exists(), "the log rotated");
        let (all, bad) = read_all(&path).expect("read");
        assert_eq!(bad, 0);
        assert_eq!(all.iter().map(|r| r.request).collect::<Vec<_>>(), (0..40).collect::<Vec<_>>());
        let t = totals(&all, None, None);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].requests, t[0].prompt_tokens, t[0].cached_tokens, t[0].completion_tokens), (20, 200, 40, 100));
        assert_eq!(totals(&all, Some(1_030.0), Some("bob"))[0].requests, 10);
        assert_eq!(totals(&all, None, Some("1"))[0].tenant_name, "alice");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rotation_deletes_past_keep_files() {
        let dir = scratch("keep");
        let path = dir.join("usage.jsonl");
        let log = UsageLog::open(UsageSettings { path: path.clone(), max_bytes: 1, keep: 2 }).expect("open");
        for i in 0..5 {
            log.record(record(i, 1, "alice"));
        }
        assert!(log.flush(Duration::from_secs(10)));
        assert!(rotated(&path, 2).exists() && !rotated(&path, 3).exists());
        let (all, _) = read_all(&path).expect("read");
        assert_eq!(all.iter().map(|r| r.request).collect::<Vec<_>>(), [3, 4]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[cfg(unix)]
    #[test]
    fn the_log_and_its_rotated_files_are_owner_only_and_a_loose_old_log_is_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        let dir = scratch("mode");
        let path = dir.join("usage.jsonl");
        let log = UsageLog::open(UsageSettings { path: path.clone(), max_bytes: 1, keep: 2 }).expect("open");
        for i in 0..3 {
            log.record(record(i, 1, "alice"));
        }
        assert!(log.flush(Duration::from_secs(10)));
        drop(log);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&rotated(&path, 1)), 0o600);
        // Logs an older version left world-readable; an owner-only one stays as it is.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(rotated(&path, 2), std::fs::Permissions::from_mode(0o640)).expect("chmod");
        std::fs::set_permissions(rotated(&path, 1), std::fs::Permissions::from_mode(0o400)).expect("chmod");
        let _log = UsageLog::open(UsageSettings { path: path.clone(), max_bytes: 1 << 20, keep: 2 }).expect("reopen");
        assert_eq!((mode(&path), mode(&rotated(&path, 2)), mode(&rotated(&path, 1))), (0o600, 0o600, 0o400));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_cut_line_is_counted_not_fatal_and_an_unwritable_path_fails_at_open() {
        let dir = scratch("cut");
        let path = dir.join("usage.jsonl");
        let line = serde_json::to_string(&record(1, 1, "a")).expect("json");
        std::fs::write(&path, format!("{line}\n{{\"ts\": 1.0, \"req")).expect("write");
        let (all, bad) = read_all(&path).expect("read");
        assert_eq!((all.len(), bad), (1, 1));
        let e = UsageLog::open(UsageSettings { path: dir.join("no/such/dir/u.jsonl"), max_bytes: 10, keep: 1 });
        assert!(matches!(e, Err(UsageError::Open { .. })));
        let _ = std::fs::remove_dir_all(dir);
    }
}
