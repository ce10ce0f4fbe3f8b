//! The one error type of the crate: every failure names what was wrong, so a caller can turn it
//! into a precise message (an unsupported model at load time, a bad request at render time).

/// Everything that can go wrong turning text into tokens, tokens into text, or chats into prompts.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error(
        "unsupported tokenizer model {0:?} (tokenizer.ggml.model): supported are \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer (split regex) this crate does not implement, or
    /// one that no test proves exact against llama.cpp yet.
    #[error(
        "unsupported pre-tokenizer {name:?} (tokenizer.ggml.pre): supported are {supported}",
        name = .0,
        supported = crate::pretokenize::supported_names()
    )]
    UnsupportedPre(String),
    /// A required metadata key is missing or has the wrong type.
    #[error("GGUF metadata: {0}")]
    Metadata(#[from] gguf::GgufError),
    /// The vocabulary metadata is present but inconsistent (ids out of range, bad merges, ...).
    #[error("invalid tokenizer metadata: {0}")]
    InvalidVocab(String),
    /// A token id outside the vocabulary.
    #[error("unknown token id {id} (vocabulary has {vocab_size} tokens)")]
    UnknownToken { id: u32, vocab_size: usize },
    /// The BPE engine failed on some input (not expected for valid vocabularies).
    #[error("tokenization failed: {0}")]
    Encode(String),
    /// The GGUF file's `tokenizer.chat_template` is not a string. (A missing key is not an error:
    /// [`crate::ChatTemplate::from_gguf`] then falls back to ChatML, as llama.cpp does.)
    #[error("the model has no usable chat template (GGUF key tokenizer.chat_template is not a string)")]
    MissingChatTemplate,
    /// The chat template does not compile.
    #[error("chat template does not compile: {0:#}")]
    TemplateSyntax(#[source] minijinja::Error),
    /// The template called `raise_exception(message)`, typically to reject the conversation
    /// (for example roles that do not alternate).
    #[error("chat template rejected the conversation: {0}")]
    TemplateRaised(String),
    /// A tool call's `arguments` are not JSON, for a template that reads them as an object
    /// (llama.cpp refuses such a conversation too).
    #[error("the arguments of the call to {function:?} are not JSON: {source}")]
    ToolArguments {
        function: String,
        #[source]
        source: serde_json::Error,
    },
    /// Any other failure while rendering the template.
    #[error("chat template failed to render: {0:#}")]
    TemplateRender(#[source] minijinja::Error),
}
