//! GGUF container: the metadata table and tensor directory of a model file.
//!
//! A model file is untrusted input (downloaded, or handed to a worker by an operator), so the
//! parser never panics and never allocates more than the bytes it was given could describe:
//! every length is checked against what remains before anything is reserved. It knows nothing
//! about any architecture; `model` interprets the tensors.

mod error;
mod reader;
mod types;
mod value;
pub mod write;

pub use error::GgufError;
pub use reader::{Gguf, GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::Value;
