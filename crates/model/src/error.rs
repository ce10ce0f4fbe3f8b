use thiserror::Error;

/// Why a model could not be loaded or run.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("unsupported architecture {0:?}; supported: llama, gemma2, gemma3, qwen2, qwen3, phi3")]
    UnsupportedArchitecture(String),
    #[error("tensor {name}: expected shape {expected:?}, found {found:?}")]
    TensorShape { name: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor {name}: type {ty} is not supported here")]
    TensorType { name: String, ty: &'static str },
    /// The file holds a tensor this runtime does not apply (llama.cpp would): answering
    /// without it would be a different model.
    #[error("tensor {name} is not supported for architecture {arch}: the model would run without it")]
    UnreadTensor { name: String, arch: &'static str },
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error("shape error: {0}")]
    Shape(String),
    #[error(transparent)]
    Kv(#[from] kv::KvError),
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("sequence of {needed} positions exceeds the context window of {context}")]
    ContextExceeded { needed: usize, context: usize },
    #[error("KV layout {found} does not match the model's {expected}")]
    KvLayoutMismatch { expected: String, found: String },
    #[error("bad forward input: {0}")]
    Input(String),
}
