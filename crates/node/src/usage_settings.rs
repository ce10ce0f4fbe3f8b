//! `[usage]`: the per-request usage log (a JSON-lines file the gateway rotates), validated at
//! start-up.

use std::path::PathBuf;

use gateway::usage::UsageSettings;
use serde::Deserialize;

use crate::config_error::{invalid, positive, positive_u64, ConfigError};

/// `[usage] max_bytes`: the log rotates past 64 MiB ...
pub const DEFAULT_USAGE_MAX_BYTES: u64 = 64 << 20;
/// ... and `[usage] keep` rotated files are kept.
pub const DEFAULT_USAGE_KEEP: usize = 8;

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUsage {
    log: Option<PathBuf>,
    max_bytes: Option<u64>,
    keep: Option<usize>,
}

impl RawUsage {
    /// `None` without a `log` file (no usage log); the rotation settings need one.
    pub(crate) fn settings(self) -> Result<Option<UsageSettings>, ConfigError> {
        match self.log {
            Some(path) => Ok(Some(UsageSettings {
                path,
                max_bytes: positive_u64("usage.max_bytes", self.max_bytes, DEFAULT_USAGE_MAX_BYTES)?,
                keep: positive("usage.keep", self.keep, DEFAULT_USAGE_KEEP)?,
            })),
            None if self.max_bytes.is_some() || self.keep.is_some() => {
                Err(invalid("usage.log", "`max_bytes` and `keep` need a `log` file to apply to"))
            }
            None => Ok(None),
        }
    }
}
