//! A worker's reports of its route tags (see `router::cache_map` on the gateway): which pages
//! the gateways' tags name became cached or were dropped, batched, to every link; a new link
//! first gets the full listing. Prefill workers cache the prompts they compute, decode workers
//! the prompts whose transfer they verified.

use std::time::Duration;

use crate::proto::ToGateway;
use crate::state::Ctx;

/// How often a prefill worker tells its gateways which route tags became cached or were
/// dropped: a conversation's next turn, sent right after a reply, should find its prefix.
const TAG_REPORT_EVERY: Duration = Duration::from_millis(20);

/// Reports the engine's route-tag changes to every gateway link, batched, until the worker
/// is gone. Under the links' lock, so a link that opens gets its full listing
/// ([`first_report`]) before any later change.
pub(crate) async fn report_cache_tags(ctx: std::sync::Weak<Ctx>) {
    loop {
        tokio::time::sleep(TAG_REPORT_EVERY).await;
        let Some(ctx) = ctx.upgrade() else { return };
        let links = ctx.links.lock().unwrap_or_else(|e| e.into_inner());
        let c = ctx.engine.take_tag_changes();
        if c.is_empty() {
            continue;
        }
        let msg = ToGateway::CacheTags {
            reset: c.reset,
            cached: c.cached.iter().map(|t| t.0).collect(),
            dropped: c.dropped.iter().map(|t| t.0).collect(),
        };
        for out in links.values() {
            let _ = out.send(msg.clone());
        }
    }
}

/// A new link's first report: every route tag cached now. Call with the
/// links' lock held, the link already listed.
pub(crate) fn first_report(ctx: &Ctx, out: &tokio::sync::mpsc::UnboundedSender<ToGateway>) {
    let cached = ctx.engine.route_tags().iter().map(|t| t.0).collect();
    let _ = out.send(ToGateway::CacheTags { reset: true, cached, dropped: Vec::new() });
}
