//! The settling phase: every `/metrics` endpoint scraped before the run and again once the load
//! is over, every KV page gauge given time to return to zero, and the two scrapes compared
//! (pages still in use fail the audit; isolation violations the deployment counted are
//! reported).

use std::collections::{BTreeMap, BTreeSet};

use crate::client::Client;
use crate::finding::{kind, Finding};
use crate::prom;
use crate::report::MetricsReport;

/// Scrapes by URL: the samples, or why not.
pub(crate) type Scrapes = BTreeMap<String, Result<Vec<prom::Sample>, String>>;

/// Scrapes every URL.
pub(crate) fn scrape_all(client: &Client, urls: Vec<String>, token: Option<&str>) -> Scrapes {
    urls.into_iter()
        .map(|u| {
            let r = scrape(client, &u, token);
            (u, r)
        })
        .collect()
}

/// Scrapes `url`: the samples, or why not.
fn scrape(client: &Client, url: &str, token: Option<&str>) -> Result<Vec<prom::Sample>, String> {
    match client.get(url, token) {
        Ok((200, body)) => Ok(prom::parse(&body)),
        Ok((status, _)) => Err(format!("HTTP {status}")),
        Err(e) => Err(crate::error::chain(&e)),
    }
}

/// Whether any endpoint still shows pages in use (or cannot be read).
pub(crate) fn busy(scrapes: &Scrapes) -> bool {
    scrapes.values().any(|a| a.as_ref().map_or(true, |s| !prom::pages_in_use(s).is_empty()))
}

/// Each endpoint's metrics before and after, and what they show: pages left in use (failing),
/// isolation violations counted during the run, endpoints that could not be read. When no
/// endpoint showed a page gauge after the run, nothing was measured: a failing `not_verified`
/// unless the operator skipped the check (`page_gauges_skipped`).
pub(crate) fn compare(
    before: &Scrapes,
    after: &Scrapes,
    pages_wait_s: f64,
    page_gauges_skipped: bool,
) -> (Vec<MetricsReport>, Vec<Finding>) {
    let mut findings = Vec::new();
    let mut verified = false;
    let mut metrics = Vec::new();
    let urls: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for url in urls {
        let mut m = MetricsReport { url: url.clone(), ..Default::default() };
        let empty = Vec::new();
        // An endpoint that appeared during the run (a restarted worker) started from nothing.
        let b = before.get(url).cloned().unwrap_or(Ok(Vec::new()));
        let bs = b.as_ref().unwrap_or(&empty);
        if let Err(e) = &b {
            m.before_error = Some(e.clone());
        }
        m.before = prom::kept(bs);
        let Some(a) = after.get(url) else {
            // Gone by the end (a worker replaced by a restart): its pages went with its process.
            m.after_error = Some("no longer listed by the deployment".into());
            metrics.push(m);
            continue;
        };
        match a {
            Ok(samples) => {
                m.after = prom::kept(samples);
                m.violations = prom::violations(bs, samples);
                let busy = prom::pages_in_use(samples);
                // No gauge, no measurement: "returned to zero" is not the same as "not shown".
                let measured = prom::has_page_gauges(samples);
                verified |= measured;
                m.pages_returned_to_zero = measured.then_some(busy.is_empty());
                for (key, v) in &busy {
                    findings.push(Finding {
                        kind: kind::LEAKED_PAGES,
                        fails: true,
                        detail: format!("`{key}` was still {v} at {url} {pages_wait_s:.1} s after the run"),
                        location: Some(url.clone()),
                        ..Default::default()
                    });
                }
                m.pages_in_use_after = busy.into_iter().collect();
                let changed: Vec<String> = m
                    .violations
                    .iter()
                    .filter(|v| v.delta > 0.0)
                    .map(|v| {
                        format!(
                            "{} +{}{}",
                            v.kind,
                            v.delta,
                            if v.labels.is_empty() { String::new() } else { format!(" ({})", v.labels) }
                        )
                    })
                    .collect();
                if !changed.is_empty() {
                    findings.push(Finding {
                        kind: kind::VIOLATIONS_REPORTED,
                        fails: false,
                        detail: format!(
                            "the deployment caught and failed requests on isolation checks: {}",
                            changed.join(", ")
                        ),
                        location: Some(url.clone()),
                        ..Default::default()
                    });
                }
            }
            Err(e) => {
                m.after_error = Some(e.clone());
                findings.push(Finding {
                    kind: kind::METRICS_UNAVAILABLE,
                    fails: false,
                    detail: format!("could not read {url} after the run ({e}): pages in use were not checked there"),
                    location: Some(url.clone()),
                    ..Default::default()
                });
            }
        }
        metrics.push(m);
    }
    if !verified {
        findings.push(Finding {
            kind: kind::NOT_VERIFIED,
            fails: !page_gauges_skipped,
            detail: format!(
                "pages in use after the run: not verified (no /metrics endpoint showed a KV page gauge after the run){}",
                if page_gauges_skipped { "; skipped by --skip-check page-gauges" } else { "" }
            ),
            ..Default::default()
        });
    }
    (metrics, findings)
}
