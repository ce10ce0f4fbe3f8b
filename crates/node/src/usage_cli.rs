//! `pagewarden usage`: the usage log's totals per tenant, for billing. The log is the one the
//! configuration's `[usage] log` names (or `--log`), with its rotated files.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gateway::usage::{read_all, totals, TenantTotals, UsageError};

use crate::config::{Config, ConfigError};

/// Why `pagewarden usage` could not answer.
#[derive(Debug, thiserror::Error)]
pub enum UsageCliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("no usage log: set `[usage] log` in the configuration or pass --log FILE")]
    NoLog,
    #[error("--since `{0}`: expected a time such as 2026-12-01T00:00:00Z or a duration such as 24h or 7d")]
    Since(String),
    #[error(transparent)]
    Read(#[from] UsageError),
}

/// What to sum.
pub struct UsageQuery<'a> {
    pub config: Option<&'a Path>,
    pub log: Option<&'a Path>,
    /// RFC 3339 time, or a duration back from now (`24h`, `7d`).
    pub since: Option<&'a str>,
    /// A tenant's name or id.
    pub tenant: Option<&'a str>,
    pub json: bool,
}

/// Prints the totals per tenant (a table, or JSON).
pub fn run_usage_cli(q: &UsageQuery) -> Result<(), UsageCliError> {
    let log: PathBuf = match (q.log, q.config) {
        (Some(l), _) => l.to_path_buf(),
        (None, Some(c)) => Config::load(c)?.usage.map(|u| u.path).ok_or(UsageCliError::NoLog)?,
        (None, None) => return Err(UsageCliError::NoLog),
    };
    let since = q.since.map(parse_since).transpose()?;
    let (records, unreadable) = read_all(&log)?;
    let t = totals(&records, since, q.tenant);
    if q.json {
        let v = serde_json::json!({ "log": log.display().to_string(), "since": since, "tenants": t,
                                    "unreadable_lines": unreadable });
        println!("{v:#}");
    } else {
        print!("{}", table(&t));
        if unreadable > 0 {
            eprintln!("{unreadable} line(s) of the log did not parse (a file cut by a crash?) and are not counted");
        }
    }
    Ok(())
}

/// Unix seconds of `--since`.
fn parse_since(s: &str) -> Result<f64, UsageCliError> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t.duration_since(UNIX_EPOCH).map_err(|_| UsageCliError::Since(s.into()))?.as_secs_f64());
    }
    let back: Duration = humantime::parse_duration(s).map_err(|_| UsageCliError::Since(s.into()))?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Ok(now.saturating_sub(back).as_secs_f64())
}

fn table(t: &[TenantTotals]) -> String {
    let mut out = format!(
        "{:<6} {:<20} {:>9} {:>14} {:>14} {:>17}  outcomes\n",
        "id", "tenant", "requests", "prompt_tokens", "cached_tokens", "completion_tokens"
    );
    for r in t {
        let outcomes: Vec<String> = r.outcomes.iter().map(|(o, n)| format!("{o}={n}")).collect();
        out.push_str(&format!(
            "{:<6} {:<20} {:>9} {:>14} {:>14} {:>17}  {}\n",
            r.tenant,
            r.tenant_name,
            r.requests,
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            outcomes.join(" ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_or_a_duration_back_and_names_a_bad_value() {
        assert_eq!(parse_since("2026-12-01T00:00:00Z").expect("time"), 1_796_083_200.0);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs_f64();
        let day = parse_since("24h").expect("duration");
        assert!((now - day - 86_400.0).abs() < 5.0);
        assert!(matches!(parse_since("yesterday-ish"), Err(UsageCliError::Since(_))));
    }
}
