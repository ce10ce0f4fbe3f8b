//! A route's output constraint on a worker. The format is a tenant's text and compiling it is
//! CPU work: it runs only after the worker's own door check passed (a request the worker would
//! refuse costs it nothing), on the blocking pool (never on the async workers that carry every
//! link's messages), and once per request and tenant: the `n` choices of one request arrive as
//! routes with the same format, and each gets a fresh copy of the compiled start state.
//!
//! The cache is keyed by tenant and the format's digest, so a tenant can only ever hit its own
//! entries: how fast another tenant's grammar compiles never depends on what this one sent.

use std::collections::VecDeque;
use std::sync::Mutex;

use engine::GenRequest;
use grammar::{Constraint, EncodedFormat, Grammars};
use types::TenantId;

use protocol::RequestError;

/// Compiled formats kept, over all tenants (each entry is one grammar's start state).
const ENTRIES: usize = 64;

struct Entry {
    tenant: TenantId,
    digest: [u8; 32],
    start: Constraint,
}

/// Recently compiled formats, per tenant, newest last.
#[derive(Default)]
pub(crate) struct ConstraintCache(Mutex<VecDeque<Entry>>);

impl ConstraintCache {
    fn get(&self, tenant: TenantId, digest: &[u8; 32]) -> Option<Constraint> {
        let q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        q.iter().rev().find(|e| e.tenant == tenant && &e.digest == digest).map(|e| e.start.clone())
    }

    fn put(&self, tenant: TenantId, digest: [u8; 32], start: Constraint) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        q.retain(|e| !(e.tenant == tenant && e.digest == digest));
        if q.len() >= ENTRIES {
            q.pop_front();
        }
        q.push_back(Entry { tenant, digest, start });
    }

    /// Drops a tenant's entries (it left the table, or its key changed).
    pub fn forget(&self, tenant: TenantId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).retain(|e| e.tenant != tenant);
    }

    /// Drops every entry (a worker's first tenant table).
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Sets `req`'s constraint from the route's encoded format. Call after the worker's door check.
pub(crate) async fn constrain(
    cache: &std::sync::Arc<ConstraintCache>,
    grammars: Option<&Grammars>,
    format: Option<&EncodedFormat>,
    req: &mut GenRequest,
) -> Result<(), RequestError> {
    let Some(format) = format else { return Ok(()) };
    let Some(grammars) = grammars else {
        return Err(RequestError::Internal("this worker cannot constrain outputs (no grammar compiler)".into()));
    };
    let digest = *blake3::hash(format.as_bytes()).as_bytes();
    if let Some(c) = cache.get(req.tenant, &digest) {
        req.constraint = Some(c);
        return Ok(());
    }
    let (grammars, format) = (grammars.clone(), format.clone());
    let compiled = tokio::task::spawn_blocking(move || format.decode().and_then(|f| grammars.compile(&f)))
        .await
        .map_err(|e| RequestError::Internal(format!("the grammar task failed: {e}")))?
        .map_err(|e| RequestError::Internal(format!("invalid output format: {e}")))?;
    cache.put(req.tenant, digest, compiled.clone());
    req.constraint = Some(compiled);
    Ok(())
}
