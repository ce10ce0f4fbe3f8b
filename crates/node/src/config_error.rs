//! Why a configuration did not load: every error names the file or the field.

/// A configuration that failed to load or validate.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("config field `{field}`: {message}")]
    Invalid { field: String, message: String },
}

pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), message: message.into() }
}
