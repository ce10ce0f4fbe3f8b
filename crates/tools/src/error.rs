//! Why a model tool or benchmark failed: one kind per thing a caller could act on (its
//! arguments, the model, the engine's answer, a server or program it measures, a file).
//!
//! Every underlying error stays a `#[source]`, never interpolated into the message as well: the
//! binary prints the chain (`{:#}`), which would show it twice.

use std::path::{Path, PathBuf};

use protocol::AdmissionError;

/// Why a `pagewarden` tool (tokenize, generate, eval, bench) failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments cannot make a run; nothing was measured.
    #[error("{0}")]
    Usage(String),
    /// A token id on the command line is not one.
    #[error("{text:?} is not a token id")]
    TokenId {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    /// A file the tool reads or writes.
    #[error("{action} {}", .path.display())]
    File {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing the tool's own output (a closed pipe, a full disk).
    #[error("writing to stdout")]
    Stdout(#[source] std::io::Error),
    /// JSON that is not what the tool needs: an input file, a server's answer, a program's
    /// output (`what` says which).
    #[error("{what}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// The default model could not be fetched.
    #[error("fetching the default model")]
    Fetch(#[source] fetch::FetchError),
    /// The model file could not be opened.
    #[error("loading {}", .path.display())]
    ModelFile {
        path: PathBuf,
        #[source]
        source: gguf::GgufError,
    },
    /// The model file's tokenizer could not be built.
    #[error("building the tokenizer from the model file")]
    Tokenizer(#[source] text::TextError),
    /// The model's weights could not be loaded.
    #[error("loading the model")]
    LoadModel(#[source] model::ModelError),
    /// Tokenizing, detokenizing or rendering the chat template failed.
    #[error(transparent)]
    Text(#[from] text::TextError),
    /// A forward pass, or a kernel or thread setting, failed.
    #[error(transparent)]
    Model(#[from] model::ModelError),
    /// A KV pool could not be built, or its pages reserved.
    #[error(transparent)]
    Kv(#[from] kv::KvError),
    /// The sampling options are invalid.
    #[error(transparent)]
    Sampling(#[from] sampling::SamplingError),
    /// The request cannot fit the context window: refused before anything runs, in the CLI's
    /// own words (the prompt and the new tokens, separately).
    #[error("prompt of {prompt} tokens plus {max_tokens} new tokens exceeds the context window of {context} tokens")]
    ContextExceeded { prompt: usize, max_tokens: usize, context: usize },
    /// The engine refused the request at its door.
    #[error("the engine refused the request")]
    Refused(#[source] AdmissionError),
    /// The engine admitted the request and then failed it.
    #[error("generation failed")]
    Generation(#[source] protocol::RequestError),
    #[error("the engine stopped before the request finished")]
    EngineStopped,
    /// An HTTP exchange with the server a benchmark measures failed below HTTP.
    #[error("{what}")]
    Http {
        what: String,
        #[source]
        source: ureq::Error,
    },
    /// The measured server answered, but wrongly (a status, an error event, a cut stream).
    #[error("{0}")]
    Server(String),
    /// A `pagewarden` process a benchmark starts could not be started (boxed: the error is large,
    /// and every `Result` of the crate carries this type).
    #[error("{what}")]
    Launch {
        what: String,
        #[source]
        source: Box<launch::LaunchError>,
    },
    /// A server a benchmark started did not serve; its log's last lines say why. `reason` is
    /// in the message, not a source, so the log stays the last thing printed.
    #[error("the {label} server {failure} ({reason}):\n{log_tail}")]
    ServerStart { label: &'static str, failure: &'static str, reason: Box<launch::LaunchError>, log_tail: String },
    /// A program (this executable, llama-bench, the transfer's receiver) could not be run.
    #[error("{what}")]
    Process {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed; the last lines of its stderr.
    #[error("{} exited with {status}:\n{stderr_tail}", .program.display())]
    Exited { program: PathBuf, status: std::process::ExitStatus, stderr_tail: String },
    /// The transfer benchmark's connection between its two processes failed.
    #[error("the transfer benchmark's connection")]
    Link(#[source] std::io::Error),
    /// The transfer benchmark's other process broke the protocol or failed its run.
    #[error("{0}")]
    Transfer(String),
    /// The wire protocol's own code refused (a frame, a handshake, the geometry).
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    /// The system's random source failed.
    #[error(transparent)]
    Random(#[from] cluster::ClusterError),
    /// A benchmark's own check failed (the prefix cache changed an answer).
    #[error("{0}")]
    Check(String),
}

impl ToolError {
    pub(crate) fn file(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ToolError {
        let path = path.to_path_buf();
        move |source| ToolError::File { action, path, source }
    }

    pub(crate) fn json(what: impl Into<String>) -> impl FnOnce(serde_json::Error) -> ToolError {
        let what = what.into();
        move |source| ToolError::Json { what, source }
    }

    pub(crate) fn process(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ToolError {
        let what = what.into();
        move |source| ToolError::Process { what, source }
    }

    /// A refusal at the door: a context overflow in the CLI's words (which name what the
    /// user can shorten), any other refusal as the engine's own.
    pub(crate) fn refused(e: AdmissionError) -> ToolError {
        match e {
            AdmissionError::ContextLengthExceeded { prompt, max_tokens, context, .. } => {
                ToolError::ContextExceeded { prompt, max_tokens, context }
            }
            other => ToolError::Refused(other),
        }
    }
}

pub(crate) use audit::chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_reads_as_its_action_and_path_then_the_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let e = ToolError::file("reading", Path::new("wiki.txt"))(io);
        assert_eq!(chain(&e), "reading wiki.txt: No such file or directory (os error 2)");
    }

    #[test]
    fn a_context_overflow_keeps_the_cli_wording_and_other_refusals_their_source() {
        let e = ToolError::refused(AdmissionError::ContextLengthExceeded {
            prompt: 8000,
            max_tokens: 500,
            needed: 8500,
            context: 8192,
        });
        assert_eq!(chain(&e), "prompt of 8000 tokens plus 500 new tokens exceeds the context window of 8192 tokens");
        let e = ToolError::refused(AdmissionError::QueueFull { limit: 4 });
        assert!(matches!(e, ToolError::Refused(AdmissionError::QueueFull { .. })));
        assert_eq!(chain(&e), "the engine refused the request: the queue is full (4 requests waiting)");
    }
}
