//! The model runtime: a forward pass on CPU for the llama (with Llama 3.1's rotary factors),
//! Gemma 3, Qwen2 and Qwen3 architectures (`config::Arch`) whose K and V live only in the paged,
//! ownership-checked pool of the `kv` crate. A file is loaded whole or refused: every tensor it
//! holds is read and applied, or the file is refused naming the one that is not.
//!
//! Weights stay quantized (each GGUF block type mapped exactly onto a kernel format) and are
//! multiplied with integer kernels chosen at run time for the CPU (AMX, AVX-512 VNNI, AVX2, or
//! portable scalar code), each tested bit-for-bit against the scalar definition. Activations are
//! quantized the way llama.cpp quantizes them for each weight type (per 32 for the 32-element
//! types, per 256 as Q8_K for the K-quants), so logits agree with the reference implementation.

pub mod attention;
pub mod config;
pub mod dequant;
mod error;
pub mod kernels;
mod layer_attention;
pub mod llama;
pub mod mapped;
pub mod matmul;
pub mod ops;
pub mod qmatrix;
pub mod quant;
pub mod region;
pub mod stack;
pub mod synth;
pub mod threads;
pub mod tiny;
pub mod unpack;
pub mod weights;
mod workspace;

pub use config::LlamaConfig;
pub use error::ModelError;
pub use kernels::Isa;
pub use llama::{Llama, LoadOptions, Logits, SeqStep};
