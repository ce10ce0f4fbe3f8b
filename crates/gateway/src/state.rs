//! What every handler shares: the settings, the served models, tenants, limits, metrics and
//! the drain flag. The server builds it once; the API handlers read it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::served::Models;
use crate::settings::ApiSettings;
use crate::tenants::TenantDirectory;

/// What every handler shares.
pub struct AppState {
    pub settings: ApiSettings,
    /// The served models, each with its cluster, vocabulary and template.
    pub models: Models,
    /// Replaced whole on SIGHUP.
    pub tenants: TenantDirectory,
    pub limiter: Limiter,
    pub metrics: Metrics,
    /// The usage log (`[usage] log`), if one is kept.
    pub usage: Option<crate::usage::UsageLog>,
    /// SHA-256 of the `[metrics] token_file` token: `/metrics` on the public listener needs it.
    pub metrics_token: Option<[u8; 32]>,
    /// SHA-256 of the `[admin]` key: the dashboard's (`None`: no dashboard).
    pub admin_key: Option<[u8; 32]>,
    pub draining: AtomicBool,
    /// API requests being handled (including streams still sending).
    pub inflight: AtomicUsize,
    pub next_id: AtomicU64,
    /// Unix seconds at start (`created` of the model).
    pub started_at: u64,
    /// With membership: the entries the membership watch ignored.
    pub membership_rejected: Option<Arc<crate::metrics::RejectedEntries>>,
}

impl AppState {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Every model's cluster.
    pub fn backends(&self) -> impl Iterator<Item = &cluster::Router> {
        self.models.iter().map(|m| &m.backend)
    }
}
