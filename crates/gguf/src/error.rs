use thiserror::Error;

/// Why a GGUF file could not be read. Offsets are byte positions in the file.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file (magic {found:#010x})")]
    BadMagic { found: u32 },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated at byte {offset}: needed {needed} more bytes while reading {what}")]
    Truncated { offset: usize, needed: usize, what: &'static str },
    #[error("malformed GGUF at byte {offset}: {reason}")]
    Malformed { offset: usize, reason: String },
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    #[error(
        "tensor {name}: unsupported ggml type {} (type {ty}); supported: {}",
        crate::types::ggml_type_name(*ty),
        crate::GgmlType::supported_names()
    )]
    UnsupportedTensorType { name: String, ty: u32 },
    #[error("tensor {name}: data [{start}, {end}) lies outside the file ({len} bytes)")]
    TensorOutOfBounds { name: String, start: u64, end: u64, len: usize },
    #[error("metadata key {0} is missing")]
    MissingKey(String),
    #[error("metadata key {key} has type {found}, expected {expected}")]
    WrongType { key: String, found: &'static str, expected: &'static str },
    #[error("tensor {0} is missing")]
    MissingTensor(String),
}
