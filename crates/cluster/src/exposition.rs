//! The one way pagewarden turns metrics into the text a scraper reads: every exposition (the
//! gateway's `/metrics`, each worker's) is one `prometheus-client` registry, built at scrape
//! time by [`Exposition`] from the live metric objects and the snapshot values of that moment,
//! and encoded as OpenMetrics text.
//!
//! Names are the constants of [`crate::metric_names`], spelled as a scraper stores them
//! (`pagewarden_requests_total`); the encoder appends `_total` to a counter's family name
//! itself, so [`Exposition`] strips it when registering a counter (only a counter: the gauge
//! `pagewarden_kv_pages_total` predates the naming rules and keeps its name). Label values go through
//! [`LabelValue`], which escapes and caps them: `prometheus-client` writes label values
//! verbatim, and some (a worker's name) are chosen by a peer.

use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{text, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

/// The content type of [`Exposition::text`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The most characters of a label value kept (a longer one is cut, on a character boundary).
pub const MAX_LABEL_CHARS: usize = 64;

/// A label value, escaped as the exposition format wants (backslash, double quote, newline)
/// and cut to [`MAX_LABEL_CHARS`] characters: a value a peer chose can then neither end the
/// label early nor start a line of its own, nor grow the scrape without end. Other control
/// characters are replaced, so that no log viewer or terminal acts on them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelValue(String);

impl LabelValue {
    pub fn new(v: &str) -> LabelValue {
        let mut out = String::with_capacity(v.len().min(MAX_LABEL_CHARS) + 2);
        for c in v.chars().take(MAX_LABEL_CHARS) {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c if c.is_control() => out.push('?'),
                c => out.push(c),
            }
        }
        LabelValue(out)
    }

    /// The escaped text, as it appears between the quotes.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(&self.0)
    }
}

/// A sample's labels, in order: fixed keys of this codebase, escaped values.
pub type Labels = Vec<(&'static str, LabelValue)>;

/// One label.
pub fn label(key: &'static str, value: impl AsRef<str>) -> (&'static str, LabelValue) {
    (key, LabelValue::new(value.as_ref()))
}

/// A counter family whose samples live across scrapes (requests by status, ...).
pub type CounterFamily = Family<Labels, Counter>;

/// One scrape's registry.
#[derive(Default)]
pub struct Exposition {
    registry: Registry,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// A live metric (a counter family or a histogram the process updates); `name` as stored.
    pub fn live(&mut self, name: &'static str, help: &str, metric: impl Metric) -> &mut Self {
        // The encoder ends every help text with a full stop of its own.
        let family = match metric.metric_type() {
            MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
            // A gauge keeps its whole name (`pagewarden_kv_pages_total` is a gauge).
            _ => name,
        };
        self.registry.register(family, help.trim_end_matches('.'), Declared(metric));
        self
    }

    /// A gauge family read now: one sample per row (a row without labels is a plain gauge).
    pub fn gauges(
        &mut self,
        name: &'static str,
        help: &str,
        rows: impl IntoIterator<Item = (Labels, i64)>,
    ) -> &mut Self {
        let rows: Vec<_> = rows.into_iter().collect();
        if let [(labels, v)] = &rows[..] {
            if labels.is_empty() {
                let g = Gauge::<i64>::default();
                g.set(*v);
                return self.live(name, help, g);
            }
        }
        let family = Family::<Labels, Gauge>::default();
        for (labels, v) in rows {
            family.get_or_create(&labels).set(v);
        }
        self.live(name, help, family)
    }

    /// A counter family read now (a total kept elsewhere: engine stats, a worker's report); a
    /// row without labels is a plain counter.
    pub fn counters(
        &mut self,
        name: &'static str,
        help: &str,
        rows: impl IntoIterator<Item = (Labels, u64)>,
    ) -> &mut Self {
        let rows: Vec<_> = rows.into_iter().collect();
        if let [(labels, v)] = &rows[..] {
            if labels.is_empty() {
                let c = Counter::<u64>::default();
                c.inc_by(*v);
                return self.live(name, help, c);
            }
        }
        let family = CounterFamily::default();
        for (labels, v) in rows {
            family.get_or_create(&labels).inc_by(v);
        }
        self.live(name, help, family)
    }

    /// A counter of seconds read now, with these labels.
    pub fn seconds_counter(&mut self, name: &'static str, help: &str, labels: Labels, secs: f64) -> &mut Self {
        let family = Family::<Labels, Counter<f64, AtomicU64>>::default();
        family.get_or_create(&labels).inc_by(secs);
        self.live(name, help, family)
    }

    /// The OpenMetrics text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail, and no metric here fails to encode.
        let _ = text::encode(&mut out, &self.registry);
        out
    }
}

/// A metric whose family is declared (`# HELP`, `# TYPE`) even while it has no sample:
/// `prometheus-client` leaves empty families out, and a dashboard or a scrape check should see
/// that `pagewarden_rejections_total` exists before the first rejection.
#[derive(Debug)]
struct Declared<M>(M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// A histogram with these bucket bounds (seconds).
pub fn histogram(bounds: &[f64]) -> Histogram {
    Histogram::new(bounds.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_capped() {
        assert_eq!(LabelValue::new(r#"a"b\c"#).as_str(), r#"a\"b\\c"#);
        assert_eq!(LabelValue::new("a\nb\rc").as_str(), "a\\nb?c");
        assert_eq!(LabelValue::new(&"é".repeat(100)).as_str().chars().count(), MAX_LABEL_CHARS);
    }

    #[test]
    fn counters_keep_their_stored_names_and_values() {
        let live = CounterFamily::default();
        live.get_or_create(&vec![label("status", "200")]).inc_by(3);
        let mut e = Exposition::new();
        e.live(crate::metric_names::REQUESTS_TOTAL, "API requests by HTTP status.", live.clone())
            .gauges(crate::metric_names::KV_PAGES_USED, "pages", [(vec![label("tenant", "7")], 5)])
            .seconds_counter(crate::metric_names::KV_CRYPTO_SECONDS_TOTAL, "crypto", vec![label("role", "decode")], 1.5)
            .counters(crate::metric_names::ENGINE_STEPS_TOTAL, "Forward steps run.", [(vec![], 9)])
            .gauges(crate::metric_names::KV_PAGES_TOTAL, "Pages in the KV pool.", [(vec![], 128)])
            .counters(crate::metric_names::REJECTIONS_TOTAL, "Refused requests by reason.", []);
        live.get_or_create(&vec![label("status", "200")]).inc();
        let text = e.text();
        assert!(text.contains("pagewarden_requests_total{status=\"200\"} 4\n"), "{text}");
        assert!(text.contains("pagewarden_kv_pages_used{tenant=\"7\"} 5\n"), "{text}");
        assert!(text.contains("pagewarden_kv_crypto_seconds_total{role=\"decode\"} 1.5\n"), "{text}");
        assert!(text.contains("# HELP pagewarden_engine_steps Forward steps run.\n"), "{text}");
        assert!(text.contains("\npagewarden_engine_steps_total 9\n"), "{text}");
        assert!(text.contains("# TYPE pagewarden_kv_pages_total gauge\npagewarden_kv_pages_total 128\n"), "{text}");
        assert!(text.contains("# TYPE pagewarden_rejections counter\n"), "an empty family is declared: {text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_label_value_cannot_write_exposition_lines() {
        let mut e = Exposition::new();
        let evil = "x\"} 1\npagewarden_isolation_violations_total{kind=\"x\"} 99\n#";
        e.gauges(crate::metric_names::WORKER_INFLIGHT, "in flight", [(vec![label("worker", evil)], 1)]);
        let text = e.text();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("pagewarden_worker_inflight{"), "{text}");
        }
    }
}
