//! Route tags: a router's names for cached pages, opaque to the pool, and the log of which of
//! them became cached or were dropped.
//!
//! Why: the cache's own keys come from a secret that never leaves the pool, so a router cannot
//! compute them and cannot ask which prefixes a worker holds. Instead a request carries one tag
//! per whole prompt page (the router's own hash chain over the same tokens, scoped by tenant);
//! the pool attaches each tag to the page it seals and logs when that page becomes cached or is
//! dropped (evicted, forgotten with its tenant, cleared). The worker reports the log to its
//! gateways, so a router knows where a tenant's prefix lives without learning anything it
//! could not compute itself. A tag is a hint: a stale or false one costs a cache miss, never a
//! hit (the pool's own keys and owner checks decide hits).

use std::collections::HashMap;

/// A router's name for one cached page: the router's chain over the page's tokens and every
/// token before them, scoped to one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteTag(pub [u8; 16]);

/// How many tags one cached page keeps (several gateways, or one restarted with a new secret,
/// name the same page differently); the oldest is dropped first.
pub(crate) const TAGS_PER_PAGE: usize = 4;

/// Changes the log holds before it gives up listing them and asks for a whole new listing.
const MAX_PENDING: usize = 1 << 16;

/// What changed since the last [`crate::KvPool::take_tag_changes`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TagChanges {
    /// The reader's view is to be replaced by `cached` (everything tagged now), not updated.
    pub reset: bool,
    /// Tags whose page is cached now.
    pub cached: Vec<RouteTag>,
    /// Tags whose page is no longer cached (or no longer named by the tag).
    pub dropped: Vec<RouteTag>,
}

impl TagChanges {
    pub fn is_empty(&self) -> bool {
        !self.reset && self.cached.is_empty() && self.dropped.is_empty()
    }
}

/// The net change of each tag since the last take (the last state wins, so a tag dropped and
/// cached again in one window is reported cached).
#[derive(Default)]
pub(crate) struct TagLog {
    pending: HashMap<RouteTag, bool>,
    overflowed: bool,
}

impl TagLog {
    pub(crate) fn cached(&mut self, tag: RouteTag) {
        self.note(tag, true);
    }

    pub(crate) fn dropped(&mut self, tag: RouteTag) {
        self.note(tag, false);
    }

    fn note(&mut self, tag: RouteTag, cached: bool) {
        if self.overflowed {
            return;
        }
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&tag) {
            // Nobody reads the log: stop listing, the next take lists everything instead.
            self.pending.clear();
            self.overflowed = true;
            return;
        }
        self.pending.insert(tag, cached);
    }

    /// The changes since the last take; after an overflow, a reset listing `all()`.
    pub(crate) fn take(&mut self, all: impl FnOnce() -> Vec<RouteTag>) -> TagChanges {
        if std::mem::take(&mut self.overflowed) {
            return TagChanges { reset: true, cached: all(), dropped: Vec::new() };
        }
        let mut out = TagChanges::default();
        for (tag, cached) in self.pending.drain() {
            if cached {
                out.cached.push(tag);
            } else {
                out.dropped.push(tag);
            }
        }
        out.cached.sort_unstable();
        out.dropped.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(b: u8) -> RouteTag {
        RouteTag([b; 16])
    }

    #[test]
    fn the_last_change_of_a_tag_in_a_window_is_the_one_reported() {
        let mut log = TagLog::default();
        log.cached(t(1));
        log.dropped(t(1));
        log.dropped(t(2));
        log.cached(t(2));
        log.cached(t(3));
        let c = log.take(Vec::new);
        assert_eq!(c, TagChanges { reset: false, cached: vec![t(2), t(3)], dropped: vec![t(1)] });
        assert!(log.take(Vec::new).is_empty());
    }

    #[test]
    fn a_log_nobody_reads_stops_growing_and_the_next_take_lists_everything() {
        let mut log = TagLog::default();
        for i in 0..=MAX_PENDING as u32 {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&i.to_le_bytes());
            log.cached(RouteTag(b));
        }
        assert!(log.pending.is_empty());
        let c = log.take(|| vec![t(9)]);
        assert_eq!(c, TagChanges { reset: true, cached: vec![t(9)], dropped: vec![] });
        assert!(log.take(Vec::new).is_empty());
    }
}
