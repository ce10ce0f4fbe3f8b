//! Where log events go: stderr, as human-readable lines or as one JSON object a line, filtered
//! by level. Events carry ids, sizes and timings; no code path logs prompt or output text.
//! stdout stays for what a command prints as its result (keys, addresses, reports).

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// The environment variable with the filter (`info`, `debug`, `pagewarden::request=warn,info`:
/// tracing-subscriber's `EnvFilter` syntax); `RUST_LOG` is read when it is unset.
pub const LOG_ENV: &str = "PAGEWARDEN_LOG";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `2026-12-01T21:40:00.123Z  INFO request{request=7 endpoint="chat" tenant=2}: ...`
    #[default]
    Human,
    /// One JSON object a line, with the event's fields and its spans' (for log collectors).
    Json,
}

/// Installs the subscriber for this process. An unparsable filter falls back to `info` and
/// says so, rather than silencing the logs.
pub fn init(format: LogFormat) {
    let spec = std::env::var(LOG_ENV).or_else(|_| std::env::var("RUST_LOG")).unwrap_or_else(|_| "info".into());
    let (filter, bad) = match EnvFilter::try_new(&spec) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(true).init(),
    }
    if let Some(e) = bad {
        tracing::warn!(filter = %spec, error = %e, "{LOG_ENV}: not a valid filter; logging at info");
    }
}
