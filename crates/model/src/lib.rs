//! The model runtime: a llama-architecture forward pass on CPU whose K and V live only in the
//! paged, ownership-checked pool of the `kv` crate.
//!
//! Weights stay quantized (Q4_1 / Q8_0, as in the default GGUF) and are multiplied with integer
//! kernels chosen at run time for the CPU (AVX-512 VNNI, AVX2, or portable scalar code), each
//! tested bit-for-bit against the scalar definition. Activations are quantized the way
//! llama.cpp quantizes them, so logits agree with the reference implementation.

pub mod attention;
pub mod config;
mod error;
pub mod kernels;
pub mod llama;
pub mod matmul;
pub mod ops;
pub mod qmatrix;
pub mod quant;
pub mod threads;
pub mod tiny;
pub mod weights;

pub use config::LlamaConfig;
pub use error::ModelError;
pub use kernels::Isa;
pub use llama::{Llama, LoadOptions, Logits, SeqStep};
