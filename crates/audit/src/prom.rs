//! The deployment's `/metrics` (Prometheus text format): isolation violations by kind, before and
//! after the run, and KV pages in use, which must all return to zero once the run is over.

use std::collections::BTreeMap;

use serde::Serialize;

pub const VIOLATIONS: &str = "pagewarden_isolation_violations_total";
pub const WORKER_VIOLATIONS: &str = "pagewarden_worker_isolation_violations_total";
pub const PAGES_USED: &str = "pagewarden_kv_pages_used";
pub const WORKER_PAGES_USED: &str = "pagewarden_worker_kv_pages_used";
pub const PAGES_TOTAL: &str = "pagewarden_kv_pages_total";

/// Families kept in the report (the rest of the exposition is not the audit's business).
const KEPT: [&str; 12] = [
    VIOLATIONS,
    WORKER_VIOLATIONS,
    PAGES_USED,
    WORKER_PAGES_USED,
    PAGES_TOTAL,
    "pagewarden_requests_total",
    "pagewarden_rejections_total",
    "pagewarden_cluster_workers",
    "pagewarden_prefix_cache_lookups_total",
    "pagewarden_prefix_cache_hits_total",
    "pagewarden_prefix_cache_hit_tokens_total",
    "pagewarden_prefix_cache_pages",
];

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// `name{a="x",b="y"}`, the key the report uses.
    pub fn key(&self) -> String {
        if self.labels.is_empty() {
            return self.name.clone();
        }
        let l: Vec<String> = self.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        format!("{}{{{}}}", self.name, l.join(","))
    }
}

/// Parses the text format; lines that do not parse are skipped (a scrape is evidence, not a
/// contract the audit enforces).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if rest.starts_with('{') {
        let mut chars = rest.char_indices().skip(1).peekable();
        let mut key = String::new();
        let mut close = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '}' => {
                    close = Some(i);
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    // A quoted value with \\, \" and \n escapes.
                    if chars.next().map(|(_, c)| c) != Some('"') {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()? {
                            (_, '\\') => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            (_, '"') => break,
                            (_, other) => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        }
        rest = &rest[close? + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name: name.to_string(), labels, value })
}

/// The kept families of a scrape, by sample key.
pub fn kept(samples: &[Sample]) -> BTreeMap<String, f64> {
    samples.iter().filter(|s| KEPT.contains(&s.name.as_str())).map(|s| (s.key(), s.value)).collect()
}

/// Page gauges that are not zero.
pub fn pages_in_use(samples: &[Sample]) -> Vec<(String, f64)> {
    samples
        .iter()
        .filter(|s| (s.name == PAGES_USED || s.name == WORKER_PAGES_USED) && s.value != 0.0)
        .map(|s| (s.key(), s.value))
        .collect()
}

/// Whether the scrape shows any KV page gauge at all (pages in use, even at zero, or the
/// pool's size): without one, pages in use cannot be judged.
pub fn has_page_gauges(samples: &[Sample]) -> bool {
    samples.iter().any(|s| s.name == PAGES_USED || s.name == WORKER_PAGES_USED || s.name == PAGES_TOTAL)
}

/// One violation counter's change over the run.
#[derive(Debug, Clone, Serialize)]
pub struct ViolationDelta {
    pub metric: String,
    pub kind: String,
    /// Other labels (worker, role).
    pub labels: String,
    pub before: f64,
    pub after: f64,
    pub delta: f64,
}

/// Violation counters of `after` with their values in `before` (0 when absent then).
pub fn violations(before: &[Sample], after: &[Sample]) -> Vec<ViolationDelta> {
    let then: BTreeMap<String, f64> = before.iter().map(|s| (s.key(), s.value)).collect();
    after
        .iter()
        .filter(|s| s.name == VIOLATIONS || s.name == WORKER_VIOLATIONS)
        .map(|s| {
            let b = then.get(&s.key()).copied().unwrap_or(0.0);
            let kind = s.labels.get("kind").cloned().unwrap_or_default();
            let labels: Vec<String> =
                s.labels.iter().filter(|(k, _)| k.as_str() != "kind").map(|(k, v)| format!("{k}={v}")).collect();
            ViolationDelta {
                metric: s.name.clone(),
                kind,
                labels: labels.join(","),
                before: b,
                after: s.value,
                delta: s.value - b,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP pagewarden_isolation_violations_total Ownership or integrity violations.
# TYPE pagewarden_isolation_violations_total counter
pagewarden_isolation_violations_total{kind="bad_mac"} 2
pagewarden_isolation_violations_total{kind="generation_mismatch"} 0
pagewarden_kv_pages_used{tenant="a \"b\""} 3
pagewarden_worker_kv_pages_used{worker="decode-1",role="decode"} 0
pagewarden_time_to_first_token_seconds_bucket{le="+Inf"} 7
pagewarden_queue_depth 0
garbage line {
"#;

    #[test]
    fn parses_samples_labels_and_escapes() {
        let s = parse(TEXT);
        assert_eq!(s.len(), 6);
        assert_eq!(s[0].name, VIOLATIONS);
        assert_eq!(s[0].labels.get("kind").map(String::as_str), Some("bad_mac"));
        assert_eq!(s[0].value, 2.0);
        assert_eq!(s[2].labels.get("tenant").map(String::as_str), Some("a \"b\""));
        assert_eq!(s[5].name, "pagewarden_queue_depth");
        assert!(s[5].labels.is_empty());
        assert_eq!(pages_in_use(&s), vec![("pagewarden_kv_pages_used{tenant=\"a \"b\"\"}".to_string(), 3.0)]);
    }

    #[test]
    fn violation_deltas_count_new_kinds_from_zero() {
        let before = parse("pagewarden_isolation_violations_total{kind=\"bad_mac\"} 1\n");
        let after = parse(
            "pagewarden_isolation_violations_total{kind=\"bad_mac\"} 3\n\
             pagewarden_worker_isolation_violations_total{worker=\"d\",role=\"decode\",kind=\"truncated\"} 2\n",
        );
        let d = violations(&before, &after);
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].kind.as_str(), d[0].delta), ("bad_mac", 2.0));
        assert_eq!((d[1].kind.as_str(), d[1].labels.as_str(), d[1].delta), ("truncated", "role=decode,worker=d", 2.0));
    }
}
