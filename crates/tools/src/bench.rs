//! `pagewarden bench model`: prefill and decode speed at batch 1 and 16, per thread count, and
//! the cost of scrubbing a page. Figures are medians of repeated runs in one process. With
//! `--llama-bench PATH` it also runs llama.cpp's benchmark in the same run and prints speed
//! ratios against it; without, it prints none (figures from another run or machine would make
//! a ratio of noise).

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use kv::{BlockTable, KvPool, Owner, RequestId, TenantId};
use model::qmatrix::Q6kLayout;
use model::region::{self, BufMut, Packable, WeightBuf};
use model::{Isa, Llama, LoadOptions, Logits, SeqStep};
use serde::Serialize;

use crate::llama_bench::{self, LlamaBenchTest};
use crate::runtime;
use crate::{ModelArgs, ToolError};
use audit::stats::median_or_nan;

/// How long `bench model` waits for the weights' move to huge pages before measuring.
const HUGE_PAGES_WAIT: Duration = Duration::from_secs(300);

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
    /// Context depths, comma separated: tokens already in the sequence's KV cache before the
    /// timed prefill and decode (llama-bench's `-d`), where attention over a long context
    /// costs what the weights do at depth 0.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0])]
    depth: Vec<usize>,
    /// Kernel sets to compare side by side (scalar, avx2, avx512, amx); default: the best available.
    #[arg(long, value_delimiter = ',')]
    isa: Vec<String>,
    /// Q6_K's layout (packed: the file's bits, the default; wide: a byte a value, no unpacking
    /// in the kernel), to compare the two on one machine.
    #[arg(long, value_enum)]
    q6k_layout: Option<Q6kArg>,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    #[arg(long)]
    json: bool,
    /// A llama-bench binary (llama.cpp): run it after our measurements, on the same GGUF with
    /// the same prompt and decode lengths, thread counts and repetitions, and print our batch-1
    /// figures as ratios of its pp/tg figures. Without it, no ratio is printed.
    #[arg(long, value_name = "PATH")]
    llama_bench: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Q6kArg {
    Packed,
    Wide,
}

#[derive(Serialize)]
struct Row {
    kernels: &'static str,
    threads: usize,
    batch: usize,
    depth: usize,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    /// Bytes a decode step reads per sequence: the weights over the batch, plus the sequence's
    /// K and V at the mean context of the timed decode.
    decode_bytes_per_token: usize,
    /// `decode_bytes_per_token` times the decode rate: the memory traffic achieved.
    decode_gb_per_s: f64,
}

/// The machine's read bandwidth at a thread count, measured in this run.
#[derive(Serialize)]
struct Bandwidth {
    threads: usize,
    read_gb_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    model: String,
    kernels: &'static str,
    /// How the Q6_K matrices were laid out (`packed` or `wide`), whether or not the file has any.
    q6k_layout: &'static str,
    prompt_tokens: usize,
    decode_tokens: usize,
    rows: Vec<Row>,
    scrub_ns_per_page: f64,
    scrub_gib_per_s: f64,
    page_bytes: usize,
    scrub_share_of_decode_token: f64,
    /// Weight bytes every decode step reads (the batch-1 floor is this over the bandwidth).
    weight_bytes_per_step: usize,
    /// Of the weights, bytes the system backs with huge pages (absent where unreadable).
    #[serde(skip_serializing_if = "Option::is_none")]
    weight_bytes_in_huge_pages: Option<usize>,
    /// Seconds from the end of loading until the weights' move to huge pages ended (or the
    /// wait gave up), before anything was measured.
    huge_pages_wait_s: f64,
    read_bandwidth: Vec<Bandwidth>,
    /// llama.cpp measured in this run (`--llama-bench`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    llama_cpp: Option<LlamaCpp>,
}

#[derive(Serialize)]
struct LlamaCpp {
    llama_bench: String,
    build_commit: String,
    tests: Vec<LlamaBenchTest>,
    versus: Vec<Versus>,
}

/// One of our batch-1 rows against llama.cpp's figures at the same thread count.
#[derive(Debug, PartialEq, Serialize)]
struct Versus {
    kernels: &'static str,
    threads: usize,
    depth: usize,
    llama_pp_tokens_per_s: f64,
    llama_tg_tokens_per_s: f64,
    /// Our prefill tokens/s over llama.cpp's ppN (above 1: faster).
    prefill_ratio: f64,
    /// Our decode tokens/s over llama.cpp's tgN.
    decode_ratio: f64,
}

/// Our batch-1 rows (llama-bench runs one sequence) against llama.cpp's figures at the same
/// thread count, depth and lengths; rows it has no figure for get no ratio.
fn versus(rows: &[Row], tests: &[LlamaBenchTest], prompt: usize, decode: usize) -> Vec<Versus> {
    rows.iter()
        .filter(|r| r.batch == 1)
        .filter_map(|r| {
            let (pp, tg) = llama_bench::figures(tests, r.threads, r.depth, prompt, decode)?;
            Some(Versus {
                kernels: r.kernels,
                threads: r.threads,
                depth: r.depth,
                llama_pp_tokens_per_s: pp,
                llama_tg_tokens_per_s: tg,
                prefill_ratio: r.prefill_tokens_per_s / pp,
                decode_ratio: r.decode_tokens_per_s / tg,
            })
        })
        .collect()
}

pub fn run(cmd: &BenchCmd) -> Result<(), ToolError> {
    match cmd {
        BenchCmd::Model(b) => model_bench(b),
        BenchCmd::Serve(b) => crate::bench_serve::run(b),
        BenchCmd::Transfer(b) => crate::bench_transfer::run(b),
        BenchCmd::PrefixCache(b) => crate::bench_prefix::run(b),
    }
}

/// Read bandwidth in GB/s with `threads` threads each summing its share of a buffer far larger
/// than the caches (best of three passes): the ceiling of a decode step bound by memory. The
/// buffer is placed as the weights are (`model::region`) and measured, as they are, once its
/// move to huge pages has ended, so both pay the same page walks.
fn read_bandwidth(threads: usize) -> f64 {
    const WORDS: usize = 64 << 20; // 512 MiB of u64
    struct Words(WeightBuf<u64>);
    impl Packable for Words {
        fn each_buf(&mut self, f: &mut dyn FnMut(BufMut<'_>)) {
            f(BufMut::U64(&mut self.0))
        }
    }
    let mut words = Words((0..WORDS as u64).collect::<Vec<u64>>().into());
    let region = region::pack(&mut [&mut words]);
    if let Some(r) = &region {
        r.wait_settled(HUGE_PAGES_WAIT);
    }
    let buf: &[u64] = &words.0;
    let per = WORDS.div_ceil(threads.max(1));
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(per)
                .map(|part| {
                    s.spawn(move || {
                        // Eight independent sums so the loop is bound by loads, not by adds.
                        let mut acc = [0u64; 8];
                        for c in part.chunks_exact(8) {
                            for (a, &x) in acc.iter_mut().zip(c) {
                                *a = a.wrapping_add(x);
                            }
                        }
                        acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
                    })
                })
                .collect();
            parts.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max((WORDS * 8) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Deterministic token ids spread over the vocabulary (content does not change the cost).
fn tokens(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + salt * 104_729 + 17) % (vocab - 100) + 100) as u32).collect()
}

fn reserve_all(pool: &KvPool, batch: usize, len: usize) -> Result<Vec<BlockTable>, ToolError> {
    (0..batch).map(|i| Ok(pool.reserve(Owner { tenant: TenantId(1), request: RequestId(i as u64) }, len)?)).collect()
}

/// Fills `depth` positions of every table, untimed, in chunks as the engine prefills.
fn fill(model: &Llama, tables: &mut [BlockTable], depth: usize) -> Result<(), ToolError> {
    const CHUNK: usize = 512;
    let ctx: Vec<Vec<u32>> = (0..tables.len()).map(|i| tokens(depth, model.config.vocab, i + 1000)).collect();
    for start in (0..depth).step_by(CHUNK) {
        let end = (start + CHUNK).min(depth);
        let mut steps: Vec<SeqStep<'_>> = ctx
            .iter()
            .zip(tables.iter_mut())
            .map(|(c, kv)| SeqStep { tokens: &c[start..end], start, kv, logits: Logits::None })
            .collect();
        model.forward(&mut steps)?;
    }
    Ok(())
}

/// Prefill of `n` tokens per sequence after `depth` tokens of context.
fn prefill(model: &Llama, pool: &KvPool, batch: usize, n: usize, depth: usize) -> Result<f64, ToolError> {
    let prompts: Vec<Vec<u32>> = (0..batch).map(|i| tokens(n, model.config.vocab, i)).collect();
    let mut tables = reserve_all(pool, batch, depth + n)?;
    fill(model, &mut tables, depth)?;
    let t0 = Instant::now();
    let mut steps: Vec<SeqStep<'_>> = prompts
        .iter()
        .zip(tables.iter_mut())
        .map(|(p, kv)| SeqStep { tokens: p, start: depth, kv, logits: Logits::Last })
        .collect();
    model.forward(&mut steps)?;
    Ok((batch * n) as f64 / t0.elapsed().as_secs_f64())
}

/// Decode of `n` tokens per sequence, one step at a time, after `depth` tokens of context.
fn decode(model: &Llama, pool: &KvPool, batch: usize, n: usize, depth: usize) -> Result<f64, ToolError> {
    let mut tables = reserve_all(pool, batch, depth + n)?;
    fill(model, &mut tables, depth)?;
    let toks: Vec<Vec<u32>> = (0..batch).map(|i| tokens(n, model.config.vocab, i)).collect();
    // Each sequence's logits buffer kept across steps, as the engine keeps it: a fresh
    // vocabulary-sized buffer per sequence per step cost the kernel's page zeroing (a tenth of
    // a batch-64 step), which is not the engine's cost.
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); batch];
    let t0 = Instant::now();
    for pos in 0..n {
        let mut steps: Vec<SeqStep<'_>> = toks
            .iter()
            .zip(tables.iter_mut())
            .map(|(t, kv)| SeqStep { tokens: &t[pos..pos + 1], start: depth + pos, kv, logits: Logits::Last })
            .collect();
        model.forward_into(&mut steps, &mut out)?;
    }
    Ok((batch * n) as f64 / t0.elapsed().as_secs_f64())
}

fn model_bench(b: &ModelBench) -> Result<(), ToolError> {
    if let Some(bin) = &b.llama_bench {
        // Refused before minutes of measuring, not after.
        if !bin.is_file() {
            return Err(ToolError::Usage(format!("--llama-bench {}: no such file", bin.display())));
        }
        if !b.batch.contains(&1) {
            return Err(ToolError::Usage(
                "--llama-bench compares batch 1 (llama-bench runs one sequence): add 1 to --batch".into(),
            ));
        }
    }
    let margs = ModelArgs { model: b.model.clone(), threads: 0 };
    let path = runtime::model_path(&margs)?;
    let file = runtime::open(&margs)?;
    let q6k = match b.q6k_layout {
        Some(Q6kArg::Wide) => Q6kLayout::Wide,
        Some(Q6kArg::Packed) | None => Q6kLayout::Packed,
    };
    let mut model = Llama::from_file(&file, LoadOptions { threads: 1, q6k }).map_err(ToolError::LoadModel)?;
    // Measured once the weights are in huge pages, as a server is seconds after start.
    let t = Instant::now();
    let settled = model.weights.wait_huge_pages(HUGE_PAGES_WAIT);
    let huge_pages_wait_s = t.elapsed().as_secs_f64();
    if !settled {
        eprintln!("the weights' move to huge pages did not end within {HUGE_PAGES_WAIT:?}: measuring anyway");
    }
    let max_batch = b.batch.iter().copied().max().unwrap_or(1);
    let max_depth = b.depth.iter().copied().max().unwrap_or(0);
    let pool = runtime::pool_for(&model, max_batch * (max_depth + b.prompt.max(b.decode) + 16))?;
    let deep = max_depth > 0;
    let isas = parse_isas(&b.isa)?;
    let weight_bytes = model.weights.step_bytes();
    let mut bandwidth: Vec<Bandwidth> = Vec::new();
    let mut rows = Vec::new();
    for &isa in &isas {
        model.set_isa(isa)?;
        for &threads in &b.threads {
            model.set_threads(threads)?;
            let threads = model.threads();
            if !bandwidth.iter().any(|bw| bw.threads == threads) {
                bandwidth.push(Bandwidth { threads, read_gb_per_s: read_bandwidth(threads) });
            }
            let peak = bandwidth.iter().find(|bw| bw.threads == threads).map_or(f64::NAN, |bw| bw.read_gb_per_s);
            for &batch in &b.batch {
                // One untimed warm-up so page faults and thread start-up are not measured.
                decode(&model, &pool, batch, 4, 0)?;
                for &depth in &b.depth {
                    let pf = median_or_nan(
                        &(0..b.reps)
                            .map(|_| prefill(&model, &pool, batch, b.prompt, depth))
                            .collect::<Result<Vec<_>, _>>()?,
                    );
                    let dc = median_or_nan(
                        &(0..b.reps)
                            .map(|_| decode(&model, &pool, batch, b.decode, depth))
                            .collect::<Result<Vec<_>, _>>()?,
                    );
                    let kv = model.config.kv_read_bytes(depth + b.decode / 2 + 1, pool.layout().dtype);
                    let bytes = weight_bytes / batch + kv;
                    let gbps = bytes as f64 * dc / 1e9;
                    if !b.json {
                        let at = if deep { format!("  depth {depth:>5}") } else { String::new() };
                        // At batch 1 decode is bound by memory: how close it comes.
                        let traffic = if batch == 1 {
                            format!(
                                "  ({:.1} MiB/token: {gbps:.1} GB/s of {peak:.1} measured, {:.0}%)",
                                bytes as f64 / (1 << 20) as f64,
                                100.0 * gbps / peak
                            )
                        } else {
                            String::new()
                        };
                        println!(
                            "{:<12} threads {threads:>2}  batch {batch:>3}{at}  prefill {pf:>8.1} tok/s  decode {dc:>8.1} tok/s{traffic}",
                            isa.name(),
                        );
                    }
                    rows.push(Row {
                        kernels: isa.name(),
                        threads,
                        batch,
                        depth,
                        prefill_tokens_per_s: pf,
                        decode_tokens_per_s: dc,
                        decode_bytes_per_token: bytes,
                        decode_gb_per_s: gbps,
                    });
                }
            }
        }
    }
    let (ns, page_bytes) = scrub_cost(&pool);
    let decode_token_ns =
        rows.iter().find(|r| r.depth == 0).or(rows.first()).map(|r| 1e9 / r.decode_tokens_per_s).unwrap_or(f64::NAN);
    // llama.cpp runs after our measurements (never beside them), at the thread counts our
    // batch-1 rows actually used.
    let llama_cpp = match &b.llama_bench {
        None => None,
        Some(bin) => {
            let mut threads: Vec<usize> = rows.iter().filter(|r| r.batch == 1).map(|r| r.threads).collect();
            threads.sort_unstable();
            threads.dedup();
            if !b.json {
                eprintln!("running {} on the same model ...", bin.display());
            }
            let tests = llama_bench::run(bin, &path, &threads, &b.depth, b.prompt, b.decode, b.reps)?;
            let versus = versus(&rows, &tests, b.prompt, b.decode);
            let build_commit = tests.first().map(|t| t.build_commit.clone()).unwrap_or_default();
            Some(LlamaCpp { llama_bench: bin.display().to_string(), build_commit, tests, versus })
        }
    };
    let report = Report {
        model: path.display().to_string(),
        kernels: model.isa().name(),
        q6k_layout: match q6k {
            Q6kLayout::Packed => "packed",
            Q6kLayout::Wide => "wide",
        },
        prompt_tokens: b.prompt,
        decode_tokens: b.decode,
        rows,
        scrub_ns_per_page: ns,
        scrub_gib_per_s: page_bytes as f64 / ns,
        page_bytes,
        // A request frees one page per page_size tokens it produced.
        scrub_share_of_decode_token: ns / pool.layout().page_size as f64 / decode_token_ns,
        weight_bytes_per_step: weight_bytes,
        weight_bytes_in_huge_pages: model.weights.huge_page_bytes(),
        huge_pages_wait_s,
        read_bandwidth: bandwidth,
        llama_cpp,
    };
    if b.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(ToolError::json("serialising the report"))?);
    } else {
        println!(
            "scrub: {:.0} ns per {} KiB page ({:.1} GiB/s), {:.3}% of a batch-1 decode token's time per token freed",
            report.scrub_ns_per_page,
            page_bytes / 1024,
            report.scrub_gib_per_s,
            100.0 * report.scrub_share_of_decode_token
        );
        println!("kernels: {} (Q6_K laid out {})", report.kernels, report.q6k_layout);
        let bw: Vec<String> = report
            .read_bandwidth
            .iter()
            .map(|bw| format!("{:.1} GB/s at {} threads", bw.read_gb_per_s, bw.threads))
            .collect();
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        let huge = report.weight_bytes_in_huge_pages.map_or("unknown".into(), |b| format!("{:.1} MiB", mib(b)));
        println!(
            "memory: {:.1} MiB of weights read per decode step ({huge} of the weights in huge pages, {:.1} s after loading); machine read bandwidth measured here: {}",
            mib(weight_bytes),
            report.huge_pages_wait_s,
            bw.join(", ")
        );
        print_llama_cpp(report.llama_cpp.as_ref(), b.prompt, b.decode);
    }
    Ok(())
}

fn print_llama_cpp(l: Option<&LlamaCpp>, prompt: usize, decode: usize) {
    let Some(l) = l else {
        println!(
            "llama.cpp: not measured in this run, so no ratio (--llama-bench PATH runs llama-bench on the same \
             model and settings)"
        );
        return;
    };
    println!("llama.cpp measured in this run (llama-bench {}, {}):", l.build_commit, l.llama_bench);
    if l.versus.is_empty() {
        println!("  no pp{prompt}/tg{decode} figure at our thread counts: no ratio");
    }
    let deep = l.versus.iter().any(|v| v.depth > 0);
    for v in &l.versus {
        let at = if deep { format!("  depth {:>5}", v.depth) } else { String::new() };
        println!(
            "  threads {:>2}{at}  pp{prompt} {:>8.1} tok/s  tg{decode} {:>8.1} tok/s   {:<12} prefill x{:.2}  decode x{:.2}",
            v.threads, v.llama_pp_tokens_per_s, v.llama_tg_tokens_per_s, v.kernels, v.prefill_ratio, v.decode_ratio
        );
    }
}

fn parse_isas(names: &[String]) -> Result<Vec<Isa>, ToolError> {
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
                "amx" | "avx512-amx" => Isa::Amx,
                other => {
                    return Err(ToolError::Usage(format!("unknown kernel set {other:?} (scalar, avx2, avx512, amx)")))
                }
            };
            if !Isa::available().contains(&isa) {
                return Err(ToolError::Usage(format!("{} kernels are not supported by this CPU", isa.name())));
            }
            Ok(isa)
        })
        .collect()
}

fn scrub_cost(pool: &KvPool) -> (f64, usize) {
    let iters = 2000;
    let t0 = Instant::now();
    for _ in 0..iters {
        pool.scrub_one_page_for_bench();
    }
    (t0.elapsed().as_nanos() as f64 / iters as f64, pool.layout().page_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn row(kernels: &'static str, threads: usize, batch: usize, pf: f64, dc: f64) -> Row {
        Row {
            kernels,
            threads,
            batch,
            depth: 0,
            prefill_tokens_per_s: pf,
            decode_tokens_per_s: dc,
            decode_bytes_per_token: 0,
            decode_gb_per_s: 0.0,
        }
    }

    #[test]
    fn ratios_are_of_batch_one_rows_against_llama_bench_at_the_same_thread_count() {
        let tests = llama_bench::parse(include_str!("../../../reference/llama_bench.json")).unwrap();
        let rows = [
            row("avx512-vnni", 1, 1, 2.0 * 145.168199, 53.509262),
            row("avx512-vnni", 1, 16, 9999.0, 9999.0),
            row("avx512-vnni", 2, 1, 283.641028, 0.5 * 124.268256),
            row("avx512-vnni", 4, 1, 500.0, 200.0),
        ];
        let v = versus(&rows, &tests, 512, 128);
        let got: Vec<(usize, f64, f64)> = v.iter().map(|v| (v.threads, v.prefill_ratio, v.decode_ratio)).collect();
        // Batch 16 has no llama-bench counterpart; 4 threads were not measured by it.
        assert_eq!(got, vec![(1, 2.0, 1.0), (2, 1.0, 0.5)]);
        assert_eq!((v[0].llama_pp_tokens_per_s, v[0].llama_tg_tokens_per_s), (145.168199, 53.509262));
        // Other lengths than llama-bench ran: no ratio at all.
        assert!(versus(&rows, &tests, 256, 128).is_empty());
        // A depth it did not run: no ratio either (the sample has depth 0 only).
        let deep = [Row { depth: 2048, ..row("avx512-vnni", 1, 1, 1.0, 1.0) }];
        assert!(versus(&deep, &tests, 512, 128).is_empty());
    }
}
