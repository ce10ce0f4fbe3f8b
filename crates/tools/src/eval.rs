//! `pagewarden eval perplexity`, computed the way llama.cpp's llama-perplexity does: the text is
//! cut into chunks of `ctx` tokens, each evaluated from an empty cache, and only the second half
//! of each chunk is scored (so every scored token has at least ctx/2 tokens of context).

use std::path::PathBuf;

use clap::Subcommand;
use kv::{Owner, RequestId, TenantId};
use model::{Logits, SeqStep};
use serde::Serialize;

use crate::runtime;
use crate::{ModelArgs, ToolError};

#[derive(Subcommand)]
pub enum EvalCmd {
    /// Perplexity of a text file.
    Perplexity {
        #[command(flatten)]
        m: ModelArgs,
        #[arg(long)]
        file: PathBuf,
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// Stop after this many chunks (default: all whole chunks).
        #[arg(long)]
        chunks: Option<usize>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Serialize)]
pub struct PerplexityReport {
    pub perplexity: f64,
    /// Standard error of the perplexity estimate, as llama.cpp reports it.
    pub stderr: f64,
    pub chunks: usize,
    pub ctx: usize,
    pub tokens: usize,
    pub scored: usize,
    pub seconds: f64,
}

pub fn run(cmd: &EvalCmd) -> Result<(), ToolError> {
    let EvalCmd::Perplexity { m, file, ctx, chunks, json } = cmd;
    let r = perplexity(m, file, *ctx, *chunks, !json)?;
    if *json {
        println!("{}", serde_json::to_string_pretty(&r).map_err(ToolError::json("serialising the report"))?);
    } else {
        println!(
            "perplexity {:.4} +/- {:.4} over {} chunks of {} tokens ({} scored) in {:.1} s",
            r.perplexity, r.stderr, r.chunks, r.ctx, r.scored, r.seconds
        );
    }
    Ok(())
}

fn log_prob(row: &[f32], target: u32) -> f64 {
    (row[target as usize] - sampling::logsumexp(row)) as f64
}

pub fn perplexity(
    m: &ModelArgs,
    path: &PathBuf,
    ctx: usize,
    max_chunks: Option<usize>,
    progress: bool,
) -> Result<PerplexityReport, ToolError> {
    let text = std::fs::read_to_string(path).map_err(ToolError::file("reading", path))?;
    let file = runtime::open(m)?;
    let tok = runtime::tokenizer(&file)?;
    let model = runtime::load_model(&file, m.threads)?;
    let tokens = tok.encode(&text, false)?;
    if ctx < 4 || ctx > model.config.context {
        return Err(ToolError::Usage(format!(
            "--ctx must be between 4 and the model's context window ({})",
            model.config.context
        )));
    }
    let mut n_chunks = tokens.len() / ctx;
    if let Some(c) = max_chunks {
        n_chunks = n_chunks.min(c);
    }
    if n_chunks == 0 {
        return Err(ToolError::Usage(format!("{} tokens is less than one chunk of {ctx}", tokens.len())));
    }
    let pool = runtime::pool_for(&model, ctx)?;
    let vocab = model.config.vocab;
    let first = ctx / 2;
    let t0 = std::time::Instant::now();
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    for c in 0..n_chunks {
        let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
        // As llama.cpp's perplexity: the first token of each chunk becomes BOS when the
        // vocabulary asks for one.
        if let (true, Some(b)) = (tok.add_bos(), tok.bos()) {
            chunk[0] = b;
        }
        let mut kv = pool.reserve(Owner { tenant: TenantId(0), request: RequestId(c as u64) }, ctx)?;
        let logits =
            model.forward(&mut [SeqStep { tokens: &chunk, start: 0, kv: &mut kv, logits: Logits::All }])?.remove(0);
        for j in first..ctx - 1 {
            let lp = log_prob(&logits[j * vocab..(j + 1) * vocab], chunk[j + 1]);
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
        }
        if progress {
            eprint!("[{}]{:.4},", c + 1, (nll / count as f64).exp());
        }
    }
    if progress {
        eprintln!();
    }
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    Ok(PerplexityReport {
        perplexity: ppl,
        stderr: if count > 1 { ppl * (var / (count - 1) as f64).sqrt() } else { 0.0 },
        chunks: n_chunks,
        ctx,
        tokens: tokens.len(),
        scored: count,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
