//! GGUF container: the metadata table and tensor directory of a model file.
//!
//! A model file is untrusted input (downloaded, or handed to a worker by an operator), so the
//! parser never panics and never allocates in proportion to what a header claims: every
//! length is checked against what remains, and no collection reserves more than a few KiB
//! before its items are read (`tests/parse_allocation.rs` measures it). It knows nothing
//! about any architecture; `model` interprets the tensors.

#![forbid(unsafe_code)]

mod error;
mod reader;
mod types;
mod value;
pub mod write;

pub use error::GgufError;
pub use reader::{FileBytes, Gguf, GgufFile, TensorInfo};
pub use types::{ggml_type_name, GgmlType};
pub use value::Value;
