//! The isolated second pass: what a request's answer under load is compared with, and how.
//!
//! Every category is re-run, because every category is where a past leak hid: near-window
//! prompts (the incident's), bursts that exhaust the pool, shared prefixes, and streams the
//! client dropped (their received prefix is as much an answer as a whole one). A request whose
//! first answer was cut short (dropped by the audit, or failed by a fault mid-stream) is re-run
//! alone up to as many tokens as it first received, and those are compared; one that received
//! nothing has nothing to compare. Refusals are re-run too: a request that must be refused (over
//! the window, over budget) and was refused under load must be refused alone with the same class
//! of status ([`refusal_differs`]); one refused only for load (429, 503) has nothing to compare
//! and is sent again. The audit fails when a category has fewer comparisons than [`required`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::client::Exchange;

/// What the re-run of one request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RerunPlan {
    /// The first answer completed: run it again whole and compare everything.
    Whole,
    /// The first answer stopped after this many tokens: run it again until as many, compare
    /// those.
    Prefix(usize),
    /// A request that must be refused and was (a 4xx other than 429): send it again and check
    /// it is refused again the same way.
    Refusal,
    /// The first answer carried no token: nothing to compare.
    Nothing,
}

/// How the first answer is re-checked.
pub fn plan(first: &Exchange, must_be_refused: bool) -> RerunPlan {
    if must_be_refused && first.status.is_some_and(|s| (400..500).contains(&s) && s != 429) {
        RerunPlan::Refusal
    } else if first.comparable() {
        RerunPlan::Whole
    } else if !first.tokens.is_empty() {
        RerunPlan::Prefix(first.tokens.len())
    } else {
        RerunPlan::Nothing
    }
}

/// Whether the re-run gave what the comparison needs.
pub fn usable(plan: RerunPlan, again: &Exchange) -> bool {
    match plan {
        RerunPlan::Whole => again.comparable(),
        RerunPlan::Prefix(n) => again.tokens.len() >= n || again.comparable(),
        // A load refusal alone says nothing about the request: try again.
        RerunPlan::Refusal => again.status.is_some_and(|s| s != 429 && s != 503),
        RerunPlan::Nothing => false,
    }
}

/// One category's re-run counts (`divergence_checks.by_scenario` in report.json).
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct CategoryChecks {
    /// Requests chosen for a re-run.
    pub selected: usize,
    /// Of those, sent again under load because the first answer carried nothing to compare.
    pub sent_again: usize,
    /// Pairs compared.
    pub compared: usize,
    /// Of those, partial answers compared on their received prefix.
    pub prefixes: usize,
    /// First answers with no token to compare (refused for load, failed before the first
    /// token, dropped at once).
    pub nothing_received: usize,
    /// Re-runs that did not give a comparable answer (faults are paused by then: a sign of
    /// trouble, reported).
    pub rerun_failed: usize,
    pub diverged: usize,
    /// The fewest comparisons that let the audit pass ([`required`]).
    pub required: usize,
}

/// Comparisons a category needs for the audit to pass: three quarters of those selected,
/// rounded up. Bursts and drops legitimately leave some answers empty, and the load phase sends
/// those again until their category has enough; a category the audit could not compare has
/// not been checked.
pub fn required(selected: usize) -> usize {
    (selected * 3).div_ceil(4)
}

/// Categories whose answers so far (scenario, whether the answer has something to compare)
/// fall short of [`required`].
pub fn short_categories(answers: impl Iterator<Item = (&'static str, bool)>) -> Vec<&'static str> {
    let mut by: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    for (scenario, usable) in answers {
        let e = by.entry(scenario).or_default();
        e.0 += 1;
        e.1 += usize::from(usable);
    }
    by.into_iter().filter(|(_, (n, ok))| *ok < required(*n)).map(|(k, _)| k).collect()
}

/// Why a request refused under load was not refused the same way alone, if it was not: a 200
/// (the refusal was not about the request), or another class of status.
pub fn refusal_differs(first: &Exchange, again: &Exchange) -> Option<String> {
    let (Some(a), Some(b)) = (first.status, again.status) else { return None };
    let kind = |e: &Exchange| e.error_kind.clone().unwrap_or_else(|| "-".into());
    if b == 200 {
        Some(format!(
            "refused under load with {a} {}, but answered 200 alone: a request that must be refused was accepted",
            kind(first)
        ))
    } else if a / 100 != b / 100 {
        Some(format!("refused under load with {a} {}, alone with {b} {}", kind(first), kind(again)))
    } else {
        None
    }
}

/// Categories short of [`required`] comparisons: (scenario, compared, required).
pub fn short_of_minimum(by: &BTreeMap<&'static str, CategoryChecks>) -> Vec<(&'static str, usize, usize)> {
    by.iter().filter(|(_, c)| c.compared < c.required).map(|(k, c)| (*k, c.compared, c.required)).collect()
}

/// The largest |Δ log-prob| a target that is not batch-invariant may show between a response
/// and its re-run alone; a batch-invariant one may show none.
pub const LOGPROB_TOLERANCE: f64 = 1e-3;

/// The first difference between a response and its isolated re-run: (position, what, Δ).
/// `prefix`: compare only the first so many tokens (a partial first answer); `tolerance`:
/// the largest log-prob difference allowed (0 for a batch-invariant target).
pub fn divergence(
    a: &Exchange,
    b: &Exchange,
    prefix: Option<usize>,
    tolerance: f64,
) -> Option<(Option<usize>, String, Option<f64>)> {
    let n = match prefix {
        Some(k) => k.min(a.tokens.len()),
        None => a.tokens.len().max(b.tokens.len()),
    };
    for i in 0..n {
        let (ta, tb) = (a.tokens.get(i), b.tokens.get(i));
        let (la, lb) = (a.logprobs.get(i).copied(), b.logprobs.get(i).copied());
        let delta = la.zip(lb).map(|(x, y)| y - x);
        if ta != tb {
            let show =
                |t: Option<&Vec<u8>>| t.map_or("(none)".to_string(), |t| format!("{:?}", String::from_utf8_lossy(t)));
            return Some((Some(i), format!("token {i}: {} under load, {} alone", show(ta), show(tb)), delta));
        }
        let bad = match (la, lb) {
            // NaN (a missing value) counts as different.
            (Some(x), Some(y)) => (y - x).is_nan() || (y - x).abs() > tolerance,
            _ => false,
        };
        if bad {
            let d = delta.unwrap_or(f64::NAN);
            return Some((Some(i), format!("log-prob of token {i} differs by {d:e} (same token)"), delta));
        }
    }
    if prefix.is_some() {
        return None;
    }
    if a.text != b.text {
        let why = if n == 0 { "the text differs (no log-probs to compare)" } else { "the text differs (tokens agree)" };
        return Some((None, why.into(), None));
    }
    if a.finish_reason != b.finish_reason {
        return Some((
            None,
            format!(
                "finish_reason {} under load, {} alone",
                a.finish_reason.as_deref().unwrap_or("-"),
                b.finish_reason.as_deref().unwrap_or("-")
            ),
            None,
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Outcome;
    use std::time::Duration;

    fn ex(tokens: &[&str], lps: &[f64], text: &str) -> Exchange {
        let mut e = Exchange::new(Duration::ZERO);
        e.tokens = tokens.iter().map(|t| t.as_bytes().to_vec()).collect();
        e.logprobs = lps.to_vec();
        e.text = text.into();
        e.finish_reason = Some("length".into());
        e.outcome = Outcome::Ok;
        e
    }

    #[test]
    fn divergence_needs_equal_tokens_and_logprobs_within_the_tolerance() {
        let a = ex(&["a", "b"], &[-0.1, -0.2], "ab");
        let close = ex(&["a", "b"], &[-0.1, -0.2005], "ab");
        assert!(divergence(&a, &close, None, LOGPROB_TOLERANCE).is_none());
        // A batch-invariant target may differ by nothing at all.
        let (pos, what, _) = divergence(&a, &close, None, 0.0).unwrap();
        assert_eq!(pos, Some(1));
        assert!(what.contains("log-prob"), "{what}");
        let (pos, _, d) = divergence(&a, &ex(&["a", "b"], &[-0.1, -0.25], "ab"), None, LOGPROB_TOLERANCE).unwrap();
        assert_eq!(pos, Some(1));
        assert!((d.unwrap() + 0.05).abs() < 1e-9);
        let (pos, what, _) = divergence(&a, &ex(&["a", "c"], &[-0.1, -0.2], "ac"), None, 0.0).unwrap();
        assert_eq!(pos, Some(1));
        assert!(what.contains("\"c\""));
        let (pos, _, _) = divergence(&a, &ex(&["a"], &[-0.1], "a"), None, 0.0).unwrap();
        assert_eq!(pos, Some(1));
        assert!(divergence(&a, &ex(&["a", "b"], &[-0.1, -0.2], "ax"), None, 0.0).is_some());
        // NaN log-probs never compare equal: a missing value is a divergence too.
        assert!(divergence(&a, &ex(&["a", "b"], &[-0.1, f64::NAN], "ab"), None, 1.0).is_some());
    }

    #[test]
    fn a_partial_answer_is_compared_on_what_it_received() {
        // Dropped after two tokens; alone, the same two then more.
        let mut cut = ex(&["a", "b"], &[-0.1, -0.2], "ab");
        cut.outcome = Outcome::DisconnectedByUs;
        cut.finish_reason = None;
        assert_eq!(plan(&cut, false), RerunPlan::Prefix(2));
        let whole = ex(&["a", "b", "c"], &[-0.1, -0.2, -0.3], "abc");
        assert!(usable(RerunPlan::Prefix(2), &whole));
        assert!(divergence(&cut, &whole, Some(2), 0.0).is_none());
        // A different second token is a divergence, whatever follows.
        let other = ex(&["a", "x", "c"], &[-0.1, -0.2, -0.3], "axc");
        assert_eq!(divergence(&cut, &other, Some(2), 0.0).unwrap().0, Some(1));
        // A re-run that stopped after one token cannot be compared on two.
        let mut short = ex(&["a"], &[-0.1], "a");
        short.outcome = Outcome::StreamErrorEvent;
        assert!(!usable(RerunPlan::Prefix(2), &short));
        // Nothing received: nothing to compare; a refusal is re-checked as a refusal.
        let mut none = Exchange::new(Duration::ZERO);
        none.outcome = Outcome::Unavailable503;
        assert_eq!(plan(&none, false), RerunPlan::Nothing);
        // A load refusal of a request that must be refused is no refusal of the request.
        assert_eq!(plan(&none, true), RerunPlan::Nothing);
        let mut refused = Exchange::new(Duration::ZERO);
        refused.status = Some(400);
        refused.outcome = Outcome::Refused400;
        assert_eq!(plan(&refused, true), RerunPlan::Refusal);
        let mut limited = Exchange::new(Duration::ZERO);
        limited.status = Some(429);
        assert!(!usable(RerunPlan::Refusal, &limited));
        assert!(usable(RerunPlan::Refusal, &refused));
        // Refused again: the same answer; 200 alone, or a 5xx: not.
        assert_eq!(refusal_differs(&refused, &refused), None);
        let mut ok = Exchange::new(Duration::ZERO);
        ok.status = Some(200);
        assert!(refusal_differs(&refused, &ok).unwrap().contains("answered 200 alone"));
        let mut err = Exchange::new(Duration::ZERO);
        err.status = Some(500);
        assert!(refusal_differs(&refused, &err).is_some());
        assert_eq!(plan(&whole, true), RerunPlan::Whole);
    }

    #[test]
    fn every_selected_category_needs_three_quarters_compared() {
        assert_eq!((required(0), required(1), required(4), required(9), required(40)), (0, 1, 3, 7, 30));
        let mut by = BTreeMap::new();
        by.insert("burst", CategoryChecks { selected: 24, compared: 18, required: required(24), ..Default::default() });
        by.insert("near_context", CategoryChecks { selected: 2, compared: 1, required: 2, ..Default::default() });
        assert_eq!(short_of_minimum(&by), vec![("near_context", 1, 2)]);
        let answers = [("burst", true), ("burst", true), ("burst", true), ("burst", false), ("short", false)];
        assert_eq!(short_categories(answers.into_iter()), ["short"]);
    }
}
