//! Why a configuration did not load: every error names the field, and once the file's text is
//! known ([`crate::config_span`]) the file, line and column too, so an operator goes straight
//! to the line to fix. Errors found later, when a role starts (a secret file, an empty
//! allow-list), are located the same way from the file the config came from.

use std::fmt;

/// Where in a config file: the file, and the line and column (1-based) when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub path: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path)?;
        if let Some(line) = self.line {
            write!(f, ", line {line}")?;
        }
        if let Some(column) = self.column {
            write!(f, ", column {column}")?;
        }
        Ok(())
    }
}

/// A configuration that failed to load or validate.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The OS error is the source, not part of the message: printers that walk the chain
    /// (anyhow's `{:#}`, [`Chain`]) would otherwise say it twice.
    #[error("cannot read config file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or TOML whose shape is wrong (an unknown key, a string where a number goes).
    #[error("{at}: {}{message}", field_prefix(field.as_deref()))]
    Parse { at: Location, field: Option<String>, message: String },
    /// A value the TOML reader accepted and validation refused. `at` is `None` until the
    /// error is tied to the file it came from (and for a config built without one).
    #[error("{}config field `{field}`: {message}", location_prefix(at.as_ref()))]
    Invalid { field: String, message: String, at: Option<Location> },
}

fn field_prefix(field: Option<&str>) -> String {
    field.map(|f| format!("config field `{f}`: ")).unwrap_or_default()
}

fn location_prefix(at: Option<&Location>) -> String {
    at.map(|a| format!("{a}: ")).unwrap_or_default()
}

pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), message: message.into(), at: None }
}

/// `v`, at least 1; `default` when absent.
pub(crate) fn positive(field: &str, v: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match v {
        Some(0) => Err(invalid(field, "must be at least 1, got 0")),
        Some(v) => Ok(v),
        None => Ok(default),
    }
}

/// [`positive`] for `u64` fields (milliseconds, seconds, bytes).
pub(crate) fn positive_u64(field: &str, v: Option<u64>, default: u64) -> Result<u64, ConfigError> {
    match v {
        Some(0) => Err(invalid(field, "must be at least 1, got 0")),
        Some(v) => Ok(v),
        None => Ok(default),
    }
}

/// An error and its sources, `: `-separated: for log lines, whose `%e` would show only the
/// outermost message (a reload that cannot read the file must still say why).
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}
