//! `pagewarden bench model`: prefill and decode speed at batch 1 and 16, per thread count, and
//! the cost of scrubbing a page. Figures are medians of repeated runs in one process.

use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};
use kv::{BlockTable, KvPool, Owner, RequestId, TenantId};
use model::{Isa, Llama, Logits, SeqStep};
use serde::Serialize;

use crate::runtime;
use crate::ModelArgs;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Model speed: prefill tokens/s (512-token prompt), decode tokens/s (128 tokens), batch 1
    /// and 16, and the cost of zeroing a KV page.
    Model(ModelBench),
    /// Streaming chat load against an OpenAI-compatible server: output tokens/s, time to first
    /// token and inter-token latency at each concurrency.
    Serve(crate::bench_serve::ServeBench),
    /// KV transfer throughput between two processes over loopback TCP: raw bytes, frames
    /// without verification, and the full protocol (MACs and transfer checks), side by side.
    Transfer(crate::bench_transfer::TransferArgs),
    /// Prefix cache on vs off: two local servers, multi-turn chats sharing one long system
    /// prompt, time to first token per turn, and a check that the replies are identical.
    PrefixCache(crate::bench_prefix::PrefixCacheBench),
}

#[derive(Args)]
pub struct ModelBench {
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Thread counts to measure, comma separated (0 = all cores).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2])]
    threads: Vec<usize>,
    /// Batch sizes, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 16])]
    batch: Vec<usize>,
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Kernel sets to compare side by side (scalar, avx2, avx512); default: the best available.
    #[arg(long, value_delimiter = ',')]
    isa: Vec<String>,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    kernels: &'static str,
    threads: usize,
    batch: usize,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    model: String,
    kernels: &'static str,
    prompt_tokens: usize,
    decode_tokens: usize,
    rows: Vec<Row>,
    scrub_ns_per_page: f64,
    scrub_gib_per_s: f64,
    page_bytes: usize,
    scrub_share_of_decode_token: f64,
}

pub fn run(cmd: &BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Model(b) => model_bench(b),
        BenchCmd::Serve(b) => crate::bench_serve::run(b),
        BenchCmd::Transfer(b) => crate::bench_transfer::run(b),
        BenchCmd::PrefixCache(b) => crate::bench_prefix::run(b),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Deterministic token ids spread over the vocabulary (content does not change the cost).
fn tokens(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + salt * 104_729 + 17) % (vocab - 100) + 100) as u32).collect()
}

fn reserve_all(pool: &KvPool, batch: usize, len: usize) -> Result<Vec<BlockTable>> {
    (0..batch).map(|i| Ok(pool.reserve(Owner { tenant: TenantId(1), request: RequestId(i as u64) }, len)?)).collect()
}

fn prefill(model: &Llama, pool: &KvPool, batch: usize, n: usize) -> Result<f64> {
    let prompts: Vec<Vec<u32>> = (0..batch).map(|i| tokens(n, model.config.vocab, i)).collect();
    let mut tables = reserve_all(pool, batch, n)?;
    let t0 = Instant::now();
    let mut steps: Vec<SeqStep<'_>> = prompts
        .iter()
        .zip(tables.iter_mut())
        .map(|(p, kv)| SeqStep { tokens: p, start: 0, kv, logits: Logits::Last })
        .collect();
    model.forward(&mut steps)?;
    Ok((batch * n) as f64 / t0.elapsed().as_secs_f64())
}

fn decode(model: &Llama, pool: &KvPool, batch: usize, n: usize) -> Result<f64> {
    let mut tables = reserve_all(pool, batch, n)?;
    let toks: Vec<Vec<u32>> = (0..batch).map(|i| tokens(n, model.config.vocab, i)).collect();
    let t0 = Instant::now();
    for pos in 0..n {
        let mut steps: Vec<SeqStep<'_>> = toks
            .iter()
            .zip(tables.iter_mut())
            .map(|(t, kv)| SeqStep { tokens: &t[pos..pos + 1], start: pos, kv, logits: Logits::Last })
            .collect();
        model.forward(&mut steps)?;
    }
    Ok((batch * n) as f64 / t0.elapsed().as_secs_f64())
}

fn model_bench(b: &ModelBench) -> Result<()> {
    let margs = ModelArgs { model: b.model.clone(), threads: 0 };
    let path = runtime::model_path(&margs)?;
    let file = runtime::open(&margs)?;
    let mut model = runtime::load_model(&file, 1)?;
    let max_batch = b.batch.iter().copied().max().unwrap_or(1);
    let pool = runtime::pool_for(&model, max_batch * (b.prompt.max(b.decode) + 16))?;
    let isas = parse_isas(&b.isa)?;
    let mut rows = Vec::new();
    for &isa in &isas {
        model.set_isa(isa)?;
        for &threads in &b.threads {
            model.set_threads(threads)?;
            for &batch in &b.batch {
                // One untimed warm-up so page faults and thread start-up are not measured.
                decode(&model, &pool, batch, 4)?;
                let pf = median((0..b.reps).map(|_| prefill(&model, &pool, batch, b.prompt)).collect::<Result<_>>()?);
                let dc = median((0..b.reps).map(|_| decode(&model, &pool, batch, b.decode)).collect::<Result<_>>()?);
                let threads = model.threads();
                if !b.json {
                    println!(
                    "{:<12} threads {threads:>2}  batch {batch:>3}  prefill {pf:>8.1} tok/s  decode {dc:>8.1} tok/s{}",
                    isa.name(),
                    reference_ratio(threads, batch, b.prompt, b.decode, pf, dc)
                );
                }
                rows.push(Row {
                    kernels: isa.name(),
                    threads,
                    batch,
                    prefill_tokens_per_s: pf,
                    decode_tokens_per_s: dc,
                });
            }
        }
    }
    let (ns, page_bytes) = scrub_cost(&pool);
    let decode_token_ns = rows.first().map(|r| 1e9 / r.decode_tokens_per_s).unwrap_or(f64::NAN);
    let report = Report {
        model: path.display().to_string(),
        kernels: model.isa().name(),
        prompt_tokens: b.prompt,
        decode_tokens: b.decode,
        rows,
        scrub_ns_per_page: ns,
        scrub_gib_per_s: page_bytes as f64 / ns,
        page_bytes,
        // A request frees one page per page_size tokens it produced.
        scrub_share_of_decode_token: ns / pool.layout().page_size as f64 / decode_token_ns,
    };
    if b.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "scrub: {:.0} ns per {} KiB page ({:.1} GiB/s), {:.3}% of a batch-1 decode token's time per token freed",
            report.scrub_ns_per_page,
            page_bytes / 1024,
            report.scrub_gib_per_s,
            100.0 * report.scrub_share_of_decode_token
        );
        println!("kernels: {}", report.kernels);
    }
    Ok(())
}

fn parse_isas(names: &[String]) -> Result<Vec<Isa>> {
    if names.is_empty() {
        return Ok(vec![Isa::detect()]);
    }
    names
        .iter()
        .map(|n| {
            let isa = match n.as_str() {
                "scalar" => Isa::Scalar,
                "avx2" => Isa::Avx2,
                "avx512" | "avx512-vnni" => Isa::Avx512,
                other => anyhow::bail!("unknown kernel set {other:?} (scalar, avx2, avx512)"),
            };
            if !Isa::available().contains(&isa) {
                anyhow::bail!("{} kernels are not supported by this CPU", isa.name());
            }
            Ok(isa)
        })
        .collect()
}

/// llama.cpp's figures on this machine class (llama-bench, `../shared/reference`), for the
/// shapes it measured: pp512 and tg128 at batch 1.
fn reference_ratio(threads: usize, batch: usize, prompt: usize, decode: usize, pf: f64, dc: f64) -> String {
    let (pp, tg) = match threads {
        1 => (145.17, 53.51),
        2 => (283.64, 124.27),
        _ => return String::new(),
    };
    if batch != 1 || prompt != 512 || decode != 128 {
        return String::new();
    }
    format!("   (x{:.2} and x{:.2} llama.cpp's pp512 {pp} / tg128 {tg})", pf / pp, dc / tg)
}

fn scrub_cost(pool: &KvPool) -> (f64, usize) {
    let iters = 2000;
    let t0 = Instant::now();
    for _ in 0..iters {
        pool.scrub_one_page_for_bench();
    }
    (t0.elapsed().as_nanos() as f64 / iters as f64, pool.layout().page_bytes())
}
