//! Why an audit did not run to a verdict, or failed one: one kind per thing a caller could act
//! on. A failing verdict is [`AuditError::Failed`], so the CLI's non-zero exit covers both.
//!
//! Every underlying error stays a `#[source]`, never interpolated into the message as well: the
//! binary prints the chain (`{:#}`), which would show it twice.

use std::path::{Path, PathBuf};

/// Why `pagewarden audit` (or [`crate::run_audit`]) stopped without a passing verdict.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The arguments or options cannot make a run; nothing was sent.
    #[error("{0}")]
    Usage(String),
    /// The tenants file is not the strict shape the audit reads (`problem` names the line).
    #[error("{}{problem}", in_file(.file.as_deref()))]
    Tenants { file: Option<PathBuf>, problem: String },
    /// A file the audit reads (tenants, the metrics token) or prepares for `--spawn`.
    #[error("{action} {}", .path.display())]
    File {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An HTTP exchange with the deployment failed below HTTP (`request`: `GET URL`, ...).
    #[error("{request}")]
    Http {
        request: String,
        #[source]
        source: ureq::Error,
    },
    /// The deployment did not answer the audit's first question at all.
    #[error("the deployment does not answer: {request}")]
    NoAnswer {
        request: String,
        #[source]
        source: ureq::Error,
    },
    /// The deployment answered, but not as the audit needs (a refused key, no model, no
    /// context window it states).
    #[error("{0}")]
    Target(String),
    /// An answer that should be JSON is not.
    #[error("{what}: not JSON")]
    NotJson {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A `--tokenizer` model file could not be opened.
    #[error("opening {}", .path.display())]
    ModelFile {
        path: PathBuf,
        #[source]
        source: gguf::GgufError,
    },
    /// The tokenizer or chat template of a model file could not be read (`what` says which).
    #[error("{what}")]
    Tokenizer {
        what: &'static str,
        #[source]
        source: text::TextError,
    },
    /// `--spawn`: a `pagewarden` process could not be started or did not serve.
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    /// `--spawn`: something local the deployment needs (its executable, a process, the fault
    /// proxy) failed.
    #[error("{what}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// `--spawn`: a process ran and failed; its stderr says why.
    #[error("{process} failed: {stderr}")]
    Process { process: &'static str, stderr: String },
    /// `--spawn`: the workers started but never registered with the gateway.
    #[error("the workers did not register with the gateway")]
    NotRegistered,
    /// `--spawn`: a thread of the deployment panicked while holding its worker list.
    #[error("the spawned deployment's worker list was poisoned by a panic")]
    Poisoned,
    /// The audit ran, but its report could not be written.
    #[error("{action} {}", .path.display())]
    Report {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serialising the report")]
    ReportJson(#[source] serde_json::Error),
    /// The audit ran and found failing findings (`kinds`: their kinds, sorted, once each).
    #[error("the audit failed: {failing} failing findings ({})", .kinds.join(", "))]
    Failed { failing: usize, kinds: Vec<&'static str> },
}

impl AuditError {
    pub(crate) fn file(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AuditError {
        let path = path.to_path_buf();
        move |source| AuditError::File { action, path, source }
    }

    pub(crate) fn spawn(what: &str) -> impl FnOnce(std::io::Error) -> AuditError {
        let what = what.to_string();
        move |source| AuditError::Spawn { what, source }
    }

    /// The error of the audit's first request, which says the deployment is not there at all
    /// rather than that one exchange failed.
    pub(crate) fn no_answer(self) -> AuditError {
        match self {
            AuditError::Http { request, source } => AuditError::NoAnswer { request, source },
            other => other,
        }
    }
}

fn in_file(file: Option<&Path>) -> String {
    file.map(|f| format!("tenants file {}: ", f.display())).unwrap_or_default()
}

/// `e` and its sources joined by `: `, as the binary prints an error (`{:#}`): for the errors
/// the audit records instead of returning (a metrics endpoint it could not read), and those the
/// tools report and go on from (a benchmark request that failed).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        next = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_reads_as_its_action_and_path_then_the_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let e = AuditError::file("reading", Path::new("/etc/tenants.toml"))(io);
        assert_eq!(e.to_string(), "reading /etc/tenants.toml");
        assert_eq!(chain(&e), "reading /etc/tenants.toml: No such file or directory (os error 2)");
    }

    #[test]
    fn a_tenants_problem_names_the_file_once_it_is_known() {
        let mut e = AuditError::Tenants { file: None, problem: "line 3: unterminated string".into() };
        assert_eq!(e.to_string(), "line 3: unterminated string");
        if let AuditError::Tenants { file, .. } = &mut e {
            *file = Some("t.toml".into());
        }
        assert_eq!(e.to_string(), "tenants file t.toml: line 3: unterminated string");
    }

    #[test]
    fn only_a_transport_failure_becomes_no_answer() {
        let e = AuditError::Http { request: "GET http://x/v1/models".into(), source: ureq::Error::ConnectionFailed };
        let e = e.no_answer();
        assert!(matches!(e, AuditError::NoAnswer { .. }));
        assert_eq!(chain(&e), "the deployment does not answer: GET http://x/v1/models: connection failed");
        assert!(matches!(AuditError::Target("x".into()).no_answer(), AuditError::Target(_)));
    }

    #[test]
    fn a_failed_audit_names_its_kinds() {
        let e = AuditError::Failed { failing: 3, kinds: vec!["canary_leak", "pages_left"] };
        assert_eq!(e.to_string(), "the audit failed: 3 failing findings (canary_leak, pages_left)");
    }
}
