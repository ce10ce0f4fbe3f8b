//! What is under a prefix, kept current: a range, then a watch from the revision after it.
//! Any failure keeps the last known entries (routing goes on with the last membership known;
//! an etcd outage must not empty a cluster) and starts over with a fresh range, which also
//! catches whatever changed while the watch was down.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;

use crate::backoff::Backoff;
use crate::client::EtcdClient;
use crate::watch::Event;

/// A watch is started afresh this often, so a connection that died silently (no FIN, no
/// RST: a cut network) cannot freeze the view: etcd sends nothing on a quiet prefix.
const WATCH_RESTART: Duration = Duration::from_secs(30);
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(2);

/// The entries under a prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// keys relative to the prefix
    pub entries: BTreeMap<String, Vec<u8>>,
    /// true once a range has succeeded
    pub synced: bool,
}

/// What is under `prefix`, kept current (see the module doc); spawns a task on the current
/// tokio runtime; the task ends when every receiver is dropped.
pub fn watch_members(client: EtcdClient, prefix: String) -> watch::Receiver<Members> {
    let (tx, rx) = watch::channel(Members::default());
    tokio::spawn(async move {
        tokio::select! {
            () = tx.closed() => {}
            () = follow(&client, &prefix, &tx) => {}
        }
    });
    rx
}

async fn follow(client: &EtcdClient, prefix: &str, tx: &watch::Sender<Members>) {
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_CAP);
    // `failing`: in a run of failures (warned once); `wait`: back off before the next range.
    let mut failing = false;
    let mut wait = false;
    loop {
        if std::mem::take(&mut wait) {
            tokio::time::sleep(backoff.next_delay()).await;
        }
        let (revision, kvs) = match client.range_prefix(prefix).await {
            Ok(r) => r,
            Err(e) => {
                warn_once(&mut failing, prefix, "range", &e);
                wait = true;
                continue;
            }
        };
        let entries: BTreeMap<String, Vec<u8>> =
            kvs.into_iter().filter_map(|(k, v)| Some((relative(prefix, &k)?.to_string(), v))).collect();
        tx.send_if_modified(|m| {
            let changed = !m.synced || m.entries != entries;
            m.entries = entries;
            m.synced = true;
            changed
        });
        let mut watch = match client.watch_prefix(prefix, revision + 1).await {
            Ok(w) => w,
            Err(e) => {
                warn_once(&mut failing, prefix, "watch", &e);
                wait = true;
                continue;
            }
        };
        if failing {
            tracing::info!(prefix, "membership: following again");
        }
        failing = false;
        backoff.reset();
        let restart = tokio::time::Instant::now() + WATCH_RESTART;
        loop {
            let left = restart.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match watch.next(left).await {
                Ok(Some(events)) => {
                    tx.send_if_modified(|m| apply(prefix, &mut m.entries, events));
                }
                Ok(None) => {
                    // etcd closed a healthy stream (shutting down?): resync, not at once.
                    tracing::debug!(prefix, "membership: the watch stream ended");
                    wait = true;
                    break;
                }
                Err(e) if e.is_timeout() => break,
                Err(e) => {
                    warn_once(&mut failing, prefix, "watch", &e);
                    wait = true;
                    break;
                }
            }
        }
    }
}

/// Applies events in order; whether anything changed.
fn apply(prefix: &str, entries: &mut BTreeMap<String, Vec<u8>>, events: Vec<Event>) -> bool {
    let mut changed = false;
    for event in events {
        match event {
            Event::Put { key, value, .. } => {
                if let Some(k) = relative(prefix, &key) {
                    if entries.get(k) != Some(&value) {
                        entries.insert(k.to_string(), value);
                        changed = true;
                    }
                }
            }
            Event::Delete { key, .. } => {
                if let Some(k) = relative(prefix, &key) {
                    changed |= entries.remove(k).is_some();
                }
            }
        }
    }
    changed
}

/// The key below the prefix; none for the prefix itself (not a member's key).
fn relative<'a>(prefix: &str, key: &'a str) -> Option<&'a str> {
    key.strip_prefix(prefix).filter(|k| !k.is_empty())
}

fn warn_once(failing: &mut bool, prefix: &str, what: &str, e: &crate::error::MembershipError) {
    if *failing {
        tracing::debug!(prefix, error = %e, "membership: {what} failed again; keeping the last known members");
    } else {
        tracing::warn!(prefix, error = %e, "membership: {what} failed; keeping the last known members and retrying");
    }
    *failing = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_apply_relative_to_the_prefix() {
        let mut entries = BTreeMap::new();
        let put = |k: &str, v: &[u8]| Event::Put { key: k.into(), value: v.to_vec(), revision: 1 };
        assert!(apply("/p/", &mut entries, vec![put("/p/a", b"1"), put("/p/b", b"2"), put("/p/", b"x")]));
        assert!(!apply("/p/", &mut entries, vec![put("/p/a", b"1")]));
        assert!(apply("/p/", &mut entries, vec![Event::Delete { key: "/p/b".into(), revision: 2 }]));
        assert!(!apply("/p/", &mut entries, vec![Event::Delete { key: "/p/zz".into(), revision: 3 }]));
        assert_eq!(entries.into_iter().collect::<Vec<_>>(), [("a".to_string(), b"1".to_vec())]);
    }
}
