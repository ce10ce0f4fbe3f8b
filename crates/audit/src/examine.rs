//! Judging one exchange: foreign canaries in its text or bytes, an over-long prompt answered,
//! a prompt under-reported, odd refusals; and the row it adds to the report.

use crate::canary::{self, CanaryIndex};
use crate::client::{Exchange, Outcome};
use crate::finding::{kind, Finding, RequestRow};
use crate::options::AuditOptions;
use crate::workload::{Endpoint, ReqSpec};

/// Bytes of response quoted on each side of a leaked canary.
const QUOTE: usize = 60;

/// What the checks need besides the exchange itself.
pub(crate) struct Examiner<'a> {
    pub(crate) opts: &'a AuditOptions,
    pub(crate) canaries: &'a CanaryIndex,
}

impl Examiner<'_> {
    pub(crate) fn tenant(&self, i: usize) -> &str {
        &self.opts.tenants[i].name
    }

    /// A finding about request `spec`: its id, tenant and scenario filled in.
    pub(crate) fn finding(&self, spec: &ReqSpec, kind: &'static str, fails: bool, detail: String) -> Finding {
        Finding {
            kind,
            fails,
            request: Some(spec.id),
            tenant: Some(self.tenant(spec.tenant).to_string()),
            scenario: Some(spec.scenario.name()),
            detail,
            ..Default::default()
        }
    }

    /// Canary hits, over-long acceptance and odd answers of one exchange.
    pub(crate) fn examine(&self, spec: &ReqSpec, ex: &Exchange, rerun: bool) -> Vec<Finding> {
        let mut out: Vec<Finding> = Vec::new();
        let base = |k: &'static str, fails: bool, detail: String| self.finding(spec, k, fails, detail);
        let pass = if rerun { "re-run " } else { "" };
        let text_place = if spec.stream { "stream text" } else { "response text" };
        // One finding per foreign canary: its first failing hit, else its first excused one. An
        // excused fragment must never hide a later whole copy of the same canary.
        let mut reported: Vec<(usize, usize)> = Vec::new(); // (canary, index in `out`)
        for (text, place) in [(&ex.text, text_place), (&ex.raw, "raw body")] {
            for h in self.canaries.scan(text) {
                let c = self.canaries.get(h.canary);
                if c.request == spec.id {
                    continue;
                }
                let echo = self.canaries.echoes_own(text, &h, &spec.canaries);
                let earlier = reported.iter().find(|(k, _)| *k == h.canary).map(|(_, i)| *i);
                if earlier.is_some_and(|i| out[i].fails || echo) {
                    continue;
                }
                let cross_tenant = c.tenant != spec.tenant;
                let k = if echo {
                    kind::FRAGMENT_IN_OWN_CANARY
                } else if cross_tenant {
                    kind::CROSS_TENANT_CANARY
                } else {
                    kind::CROSS_REQUEST_CANARY
                };
                let what = if h.whole { "whole" } else { "as a fragment" };
                let why = if echo {
                    format!(
                        ", inside a misspelt copy of the request's own canary (within {} edits)",
                        canary::ECHO_EDITS
                    )
                } else {
                    String::new()
                };
                let mut f = base(
                    k,
                    !echo,
                    format!(
                        "the canary of tenant {} (request {}) appeared {what} in the {pass}{place}{why}",
                        self.tenant(c.tenant),
                        c.request
                    ),
                );
                f.canary = Some(c.text.clone());
                f.canary_owner = Some(self.tenant(c.tenant).to_string());
                f.canary_request = Some(c.request);
                f.location = Some(format!("{pass}{place}"));
                f.context = Some(canary::context(text, h.start, h.end, QUOTE));
                f.whole = Some(h.whole);
                match earlier {
                    // An excused hit came first: this failing one takes its place.
                    Some(i) => out[i] = f,
                    None => {
                        reported.push((h.canary, out.len()));
                        out.push(f);
                    }
                }
            }
        }
        let accepted = ex.status == Some(200);
        if spec.scenario.must_be_refused() {
            let refused_right = ex.status == Some(400) && ex.error_kind.as_deref() == Some("context_length_exceeded");
            // Over the window by the audit's own count; planned over it when the audit cannot
            // count (the plan then leaves a wide margin). Never by the server's `usage`: the
            // incident's server said its placeholder prompt was one token long.
            let fits = spec.sent_tokens.is_some_and(|n| n + spec.max_tokens <= spec.window);
            let sent = |n: Option<usize>| n.map_or("unknown".into(), |n| n.to_string());
            if accepted && !fits {
                out.push(base(
                    kind::OVERLONG_ACCEPTED,
                    true,
                    format!(
                        "a request over the {}-token window (prompt {} tokens by the audit's count, max_tokens {}) \
                         was accepted with HTTP 200; the server reported {} prompt tokens",
                        spec.window,
                        sent(spec.sent_tokens),
                        spec.max_tokens,
                        ex.prompt_tokens.map_or("no".into(), |p| p.to_string())
                    ),
                ));
            } else if accepted {
                out.push(base(
                    kind::OVERLONG_OTHER_ANSWER,
                    false,
                    format!(
                        "planned over the window, but the audit's own count ({} prompt tokens + max_tokens {}) fits \
                         the {}-token window",
                        sent(spec.sent_tokens),
                        spec.max_tokens,
                        spec.window
                    ),
                ));
            } else if !refused_right {
                out.push(base(
                    kind::OVERLONG_OTHER_ANSWER,
                    false,
                    format!(
                        "expected 400 context_length_exceeded, got {} {}",
                        ex.status.map_or("no answer".into(), |s| s.to_string()),
                        ex.error_kind.as_deref().unwrap_or(ex.outcome.name())
                    ),
                ));
            }
        } else if ex.status == Some(400) {
            out.push(base(
                kind::UNEXPECTED_400,
                false,
                format!("a request that fits was refused: {}", ex.error_kind.as_deref().unwrap_or("-")),
            ));
        }
        if let (Some(reported), None) = (ex.prompt_tokens, spec.sent_tokens) {
            // No tokenizer: the prompt's bytes still bound how few tokens it can be.
            let bytes = prompt_bytes(&spec.body);
            let least = crate::meter::min_tokens_for_bytes(bytes);
            if (reported as usize) < least {
                out.push(base(
                    kind::PROMPT_IMPLAUSIBLE,
                    true,
                    format!(
                        "the server reported {reported} prompt tokens for a prompt of {bytes} bytes, which takes at \
                         least {least} (at most {} bytes a token): it did not run the prompt it was sent",
                        crate::meter::MAX_BYTES_PER_TOKEN
                    ),
                ));
            }
        }
        if let (Some(reported), Some(sent)) = (ex.prompt_tokens, spec.sent_tokens) {
            // `sent_tokens` is an exact count (a tokenizer's).
            if (reported as usize) < sent {
                out.push(base(
                    kind::PROMPT_UNDERCOUNTED,
                    true,
                    format!(
                        "the server reported {reported} prompt tokens for a prompt of {sent} tokens by the audit's \
                         count: it did not run the prompt it was sent"
                    ),
                ));
            }
        }
        if ex.outcome == Outcome::Ok && ex.finish_reason.as_deref() == Some("length") {
            if let Some(n) = ex.completion_tokens.filter(|n| (*n as usize) < spec.max_tokens) {
                out.push(base(
                    kind::SHORT_LENGTH,
                    false,
                    format!("finish_reason `length` after {n} of max_tokens {} tokens", spec.max_tokens),
                ));
            }
        }
        out
    }

    /// A cross-tenant cache hit, by the one definition every phase uses
    /// ([`crate::own_prefix`]): cached tokens beyond the longest prefix the tenant sent before.
    pub(crate) fn cache_hit(
        &self,
        spec: &ReqSpec,
        ex: &Exchange,
        own_prefix: usize,
        phase: &'static str,
    ) -> Option<Finding> {
        let own_len = spec.sent_tokens.or(ex.prompt_tokens.map(|n| n as usize));
        let cached = ex.cached_tokens.filter(|n| crate::own_prefix::crosses(*n as usize, own_prefix, own_len))?;
        Some(self.finding(
            spec,
            kind::CROSS_TENANT_CACHE_HIT,
            true,
            format!(
                "a {phase} request reported {cached} cached prompt tokens where tenant {}'s own earlier prompts share \
                 at most {own_prefix} with it: it was served KV it never computed",
                self.tenant(spec.tenant)
            ),
        ))
    }

    pub(crate) fn row(&self, spec: &ReqSpec, ex: &Exchange, phase: &'static str) -> RequestRow {
        let endpoint = match spec.endpoint {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
        };
        let tenant = self.tenant(spec.tenant).to_string();
        RequestRow {
            stream: spec.stream,
            max_tokens: spec.max_tokens,
            canaries: spec.canaries.len(),
            disconnect_after: spec.disconnect_after,
            prompt_tokens: ex.prompt_tokens.or(spec.prompt_tokens.map(|p| p as u64)),
            ..RequestRow::answered(spec.id, phase, tenant, spec.scenario.name(), endpoint, ex)
        }
    }
}

/// Bytes of a request's prompt text (a completion's prompt, or every message's content).
fn prompt_bytes(body: &serde_json::Value) -> usize {
    if let Some(p) = body.get("prompt").and_then(|p| p.as_str()) {
        return p.len();
    }
    body["messages"].as_array().into_iter().flatten().map(|m| m["content"].as_str().map_or(0, str::len)).sum()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::Value;

    use super::*;
    use crate::rng::Rng;
    use crate::tenants::TenantKey;
    use crate::workload;

    fn spec(id: usize, tenant: usize, scenario: workload::Scenario, max_tokens: usize) -> ReqSpec {
        ReqSpec {
            id,
            tenant,
            scenario,
            endpoint: Endpoint::Chat,
            stream: false,
            max_tokens,
            canaries: vec![],
            disconnect_after: None,
            rerun: false,
            prompt_tokens: None,
            sent_tokens: None,
            units: None,
            window: 100,
            body: Value::Null,
        }
    }

    #[test]
    fn examine_classifies_canaries_and_over_long_answers() {
        use workload::Scenario;
        let tenants = ["alice", "bob"].map(|n| TenantKey { name: n.into(), key: format!("k-{n}") }).to_vec();
        let opts = AuditOptions::new("http://x", tenants);
        let mut rng = Rng::new(1);
        let mut idx = CanaryIndex::new();
        let own = idx.issue(&mut rng, 0, 0);
        let same_tenant = idx.issue(&mut rng, 0, 1);
        let other_tenant = idx.issue(&mut rng, 1, 2);
        let ctx = Examiner { opts: &opts, canaries: &idx };
        let text = |i: usize| idx.get(i).text.clone();

        // Request 0 of alice: its own canary is fine; alice's other request's and bob's are not.
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        e.text = format!("{} and {} and {}", text(own), text(same_tenant), text(other_tenant));
        e.raw = format!("{{\"content\": \"{}\"}}", e.text);
        let f = ctx.examine(&spec(0, 0, Scenario::Short, 16), &e, false);
        let kinds: Vec<&str> = f.iter().map(|f| f.kind).collect();
        // Each canary once, though it is in both the text and the raw body.
        assert_eq!(kinds, [kind::CROSS_REQUEST_CANARY, kind::CROSS_TENANT_CANARY]);
        assert_eq!(f[1].canary_owner.as_deref(), Some("bob"));
        assert_eq!(f[1].canary_request, Some(2));
        assert_eq!(f[1].location.as_deref(), Some("response text"));
        assert!(f.iter().all(|f| f.fails));

        // A fragment of bob's canary inside a misspelt copy of alice's own is reported, not
        // failed; the same fragment in a response of a request with other canaries fails.
        let mut echo_idx = CanaryIndex::new();
        let alices = echo_idx.insert("likritri-trulazesa-6298", 0, 10);
        echo_idx.insert("nuzhotro-likritra-3368", 1, 11);
        let echo_ctx = Examiner { opts: &opts, canaries: &echo_idx };
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        e.text = "The secret code is: \"Likritra-Trulazesa-629".into();
        let mut own = spec(10, 0, Scenario::Short, 16);
        own.canaries = vec![alices];
        let f = echo_ctx.examine(&own, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::FRAGMENT_IN_OWN_CANARY, false));
        assert_eq!(f[0].canary_request, Some(11));
        let f = echo_ctx.examine(&spec(12, 0, Scenario::Short, 16), &e, false);
        let kinds: Vec<(&str, bool)> = f.iter().map(|f| (f.kind, f.fails)).collect();
        assert_eq!(kinds, [(kind::CROSS_TENANT_CANARY, true), (kind::CROSS_REQUEST_CANARY, true)]);

        // The excused fragment first, then the whole foreign canary: the whole copy fails.
        e.text = "The secret code is: \"Likritra-Trulazesa-629. Also nuzhotro-likritra-3368.".into();
        let f = echo_ctx.examine(&own, &e, false);
        let kinds: Vec<(&str, bool, Option<bool>)> = f.iter().map(|f| (f.kind, f.fails, f.whole)).collect();
        assert_eq!(kinds, [(kind::CROSS_TENANT_CANARY, true, Some(true))]);

        // Over-long: 400 context_length_exceeded is right; another refusal is reported, not
        // failed; 200 fails whatever `usage` the server reports (the incident's server said its
        // placeholder was one token long).
        let over = spec(3, 1, Scenario::OverLong, 16);
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(400);
        e.outcome = Outcome::Refused400;
        e.error_kind = Some("context_length_exceeded".into());
        assert!(ctx.examine(&over, &e, false).is_empty());
        e.error_kind = Some("invalid_request_error: x".into());
        let f = ctx.examine(&over, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::OVERLONG_OTHER_ANSWER, false));
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        for reported in [150, 50, 1] {
            e.prompt_tokens = Some(reported);
            let f = ctx.examine(&over, &e, false);
            let kinds: Vec<(&str, bool)> = f.iter().map(|f| (f.kind, f.fails)).collect();
            assert_eq!(kinds, [(kind::OVERLONG_ACCEPTED, true)], "reported {reported}");
        }
        // Counted by the audit: 150 tokens sent, one reported: both rules fail it.
        let mut counted = over.clone();
        counted.sent_tokens = Some(150);
        let f = ctx.examine(&counted, &e, false);
        let kinds: Vec<(&str, bool)> = f.iter().map(|f| (f.kind, f.fails)).collect();
        assert_eq!(kinds, [(kind::OVERLONG_ACCEPTED, true), (kind::PROMPT_UNDERCOUNTED, true)]);
        assert!(f[0].detail.contains("prompt 150 tokens by the audit's count") && f[0].detail.contains("reported 1"));
        // Planned over the window, but the audit's own count fits: a planning miss, reported.
        counted.sent_tokens = Some(50);
        e.prompt_tokens = Some(50);
        let f = ctx.examine(&counted, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::OVERLONG_OTHER_ANSWER, false));
        // Any answer reporting fewer prompt tokens than the audit sent fails; as many passes.
        let mut fits = spec(5, 1, Scenario::Short, 16);
        fits.sent_tokens = Some(40);
        e.prompt_tokens = Some(40);
        assert!(ctx.examine(&fits, &e, false).is_empty());
        e.prompt_tokens = Some(39);
        let f = ctx.examine(&fits, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::PROMPT_UNDERCOUNTED, true));

        // A fitting request refused with 400, and a `length` finish before max_tokens.
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(400);
        e.outcome = Outcome::Refused400;
        let f = ctx.examine(&spec(4, 1, Scenario::Medium, 16), &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::UNEXPECTED_400, false));
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        e.finish_reason = Some("length".into());
        e.completion_tokens = Some(3);
        let f = ctx.examine(&spec(4, 1, Scenario::Medium, 16), &e, true);
        assert_eq!((f[0].kind, f[0].fails), (kind::SHORT_LENGTH, false));
    }
}
