//! Loading a llama model's tensors, each checked for presence, type and shape.
//!
//! Layers are repacked in parallel, each matrix built in place in the weight region, and each
//! tensor's file pages released once it is repacked (see [`crate::mapped`]): memory holds the
//! repacked model plus the file pages of the few tensors in flight, never the file and its
//! repacked copy side by side, nor a heap copy of any matrix.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use gguf::{GgmlType, GgufFile, TensorInfo};

use crate::config::{Arch, LlamaConfig};
use crate::error::ModelError;
use crate::qmatrix::{Q6kLayout, QKind, QMatrix};
use crate::quant::{self, QK};
use crate::region::{Alloc, Packer, Region};
use crate::stack::QStack;

pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// Q, K and V projections stacked (rows `[q | k | v]`): one pass over the input instead of
    /// three where the parts share a format, one per format where they do not (`QStack`).
    pub wqkv: QStack,
    pub wo: QMatrix,
    pub ffn_norm: Vec<f32>,
    /// Gate and up projections stacked (rows `[gate | up]`).
    pub w_gate_up: QStack,
    pub w_down: QMatrix,
    /// Gemma 3 and Qwen3: RMS norms of each query and key head, before the rotation.
    pub qk_norms: Option<QkNorms>,
    /// Gemma 3: RMS norms of the attention and FFN outputs, before the residual.
    pub post_norms: Option<PostNorms>,
    /// Qwen2: the biases of `wqkv`'s rows (`[q | k | v]`), added to its output.
    pub qkv_bias: Option<Vec<f32>>,
}

pub struct QkNorms {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
}

pub struct PostNorms {
    pub attn: Vec<f32>,
    pub ffn: Vec<f32>,
}

pub struct LlamaWeights {
    pub tok_embd: QMatrix,
    pub layers: Vec<Layer>,
    pub out_norm: Vec<f32>,
    /// None when the output projection is tied to the embedding.
    pub output: Option<QMatrix>,
    /// Divisors of each rotary pair's angle (head_dim / 2 values each), slowing the low
    /// frequencies for long contexts.
    pub rope_factors: RopeFactors,
    /// Where the matrices live once loaded (see [`crate::region`]); None when the system
    /// gave no mapping and they stayed in ordinary allocations.
    pub region: Option<Arc<Region>>,
}

/// Where a model's rotary divisors come from.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RopeFactors {
    #[default]
    None,
    /// Llama 3.1+: `rope_freqs`, one set for every context.
    Fixed(Vec<f32>),
    /// Phi-3 LongRoPE: `rope_factors_short` up to the original context, `rope_factors_long`
    /// for a served context beyond it.
    LongShort { long: Vec<f32>, short: Vec<f32> },
}

impl RopeFactors {
    /// The divisors a model serving `context` positions uses.
    pub fn for_context(&self, c: &LlamaConfig) -> Option<&[f32]> {
        match self {
            RopeFactors::None => None,
            RopeFactors::Fixed(f) => Some(f),
            RopeFactors::LongShort { long, short } => match c.rope_original_context {
                Some(orig) if c.context > orig => Some(long),
                _ => Some(short),
            },
        }
    }

    fn all(&self) -> impl Iterator<Item = &f32> {
        let (a, b): (&[f32], &[f32]) = match self {
            RopeFactors::None => (&[], &[]),
            RopeFactors::Fixed(f) => (f, &[]),
            RopeFactors::LongShort { long, short } => (long, short),
        };
        a.iter().chain(b)
    }
}

fn check_shape(t: &TensorInfo, expected: &[u64]) -> Result<(), ModelError> {
    if t.dims != expected {
        return Err(ModelError::TensorShape {
            name: t.name.clone(),
            expected: expected.to_vec(),
            found: t.dims.clone(),
        });
    }
    Ok(())
}

/// The file's tensors as the loader reads them, remembering which it read: a tensor the file
/// holds and this runtime never reads is one llama.cpp would apply (a bias, a rotary factor),
/// so the file is refused rather than answered without it ([`Tensors::all_read`]).
struct Tensors<'f> {
    file: &'f GgufFile,
    read: Mutex<HashSet<String>>,
    /// Where repacked matrices are made.
    alloc: Alloc<'f>,
    /// Q6_K's layout (packed unless a comparison asks for wide).
    q6k: Q6kLayout,
}

impl<'f> Tensors<'f> {
    fn new(file: &'f GgufFile, alloc: Alloc<'f>, q6k: Q6kLayout) -> Self {
        Tensors { file, read: Default::default(), alloc, q6k }
    }

    fn data(&self, name: &str) -> Result<(&'f TensorInfo, &'f [u8]), ModelError> {
        let found = self.file.data(name)?;
        self.read.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
        Ok(found)
    }

    /// Lets the file's memory for `name` go: the tensor is converted and never read again.
    fn release(&self, name: &str) {
        self.file.release(name);
    }

    fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_ok()
    }

    fn all_read(&self, arch: Arch) -> Result<(), ModelError> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        match self.file.tensors().iter().find(|t| !read.contains(&t.name)) {
            Some(t) => Err(ModelError::UnreadTensor { name: t.name.clone(), arch: arch.name() }),
            None => Ok(()),
        }
    }
}

fn vector(f: &Tensors<'_>, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let (t, bytes) = f.data(name)?;
    check_shape(t, &[len as u64])?;
    let v = match t.ty {
        GgmlType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(|c| quant::f16_bits_to_f32(c[0], c[1])).collect(),
        other => return Err(ModelError::TensorType { name: name.to_string(), ty: other.name() }),
    };
    f.release(name);
    Ok(v)
}

/// Encodes f32 values as ggml Q8_0 blocks (used for matrices stored in types we have no kernel for).
pub fn encode_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 34);
    for blk in x.chunks_exact(QK) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
    }
    out
}

fn matrix(f: &Tensors<'_>, name: &str, cols: usize, rows: usize) -> Result<QMatrix, ModelError> {
    let mut stack = stacked(f, &[(name, rows)], cols)?;
    Ok(stack.parts.remove(0))
}

/// Matrices sharing an input, stacked by rows. Parts whose types map onto one kernel format
/// (Q5_0 and Q8_0 both do: Q8_0; see [`QKind::of_stack`]) are one matrix; otherwise each run
/// of parts of one format is its own matrix, so every value stays the file's. Types with no
/// kernel format (F32, F16, BF16) are requantized to Q8_0.
fn stacked(f: &Tensors<'_>, parts: &[(&str, usize)], cols: usize) -> Result<QStack, ModelError> {
    let mut tensors = Vec::with_capacity(parts.len());
    for &(name, rows) in parts {
        let (t, bytes) = f.data(name)?;
        check_shape(t, &[cols as u64, rows as u64])?;
        tensors.push((t.ty, rows, bytes));
    }
    let types: Vec<GgmlType> = tensors.iter().map(|t| t.0).collect();
    let runs: Vec<&[(GgmlType, usize, &[u8])]> = match QKind::of_stack(&types) {
        Some(_) => vec![&tensors[..]],
        None => tensors.chunk_by(|a, b| QKind::of(a.0) == QKind::of(b.0)).collect(),
    };
    let mut matrices = Vec::with_capacity(runs.len());
    for run in runs {
        matrices.push(match QKind::of(run[0].0) {
            Some(_) => QMatrix::from_parts_in(run, cols, f.q6k, f.alloc)?,
            None => {
                let rows: usize = run.iter().map(|p| p.1).sum();
                let vals: Vec<f32> = run.iter().flat_map(|&(ty, _, b)| crate::dequant::dequantize(ty, b)).collect();
                QMatrix::from_parts_in(&[(GgmlType::Q8_0, rows, &encode_q8_0(&vals))], cols, f.q6k, f.alloc)?
            }
        });
    }
    for &(name, _) in parts {
        f.release(name);
    }
    Ok(QStack { parts: matrices })
}

/// Layer `i`'s tensors, checked and repacked.
fn layer(f: &Tensors<'_>, c: &LlamaConfig, i: usize) -> Result<Layer, ModelError> {
    let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let qk_norms = match c.has_qk_norms() {
        true => {
            Some(QkNorms { q: vector(f, &n("attn_q_norm"), c.head_dim)?, k: vector(f, &n("attn_k_norm"), c.head_dim)? })
        }
        false => None,
    };
    let post_norms = match c.has_post_norms() {
        true => Some(PostNorms {
            attn: vector(f, &n("post_attention_norm"), c.n_embd)?,
            ffn: vector(f, &n("post_ffw_norm"), c.n_embd)?,
        }),
        false => None,
    };
    let qkv_bias = match c.has_qkv_bias() {
        true => {
            let b = |s: &str, len| vector(f, &format!("blk.{i}.{s}.bias"), len);
            let mut bias = b("attn_q", q_dim)?;
            bias.extend(b("attn_k", kv_dim)?);
            bias.extend(b("attn_v", kv_dim)?);
            Some(bias)
        }
        false => None,
    };
    // Phi-3's converter writes Q, K and V as one tensor (rows `[q | k | v]`) and gate and up as
    // one `ffn_up` (rows `[gate | up]`): the stacks this runtime builds, read as they are.
    let wqkv = match c.arch == Arch::Phi3 && f.has(&n("attn_qkv")) {
        true => stacked(f, &[(&n("attn_qkv"), q_dim + 2 * kv_dim)], c.n_embd)?,
        false => stacked(f, &[(&n("attn_q"), q_dim), (&n("attn_k"), kv_dim), (&n("attn_v"), kv_dim)], c.n_embd)?,
    };
    let w_gate_up = match c.arch {
        Arch::Phi3 => stacked(f, &[(&n("ffn_up"), 2 * c.n_ff)], c.n_embd)?,
        _ => stacked(f, &[(&n("ffn_gate"), c.n_ff), (&n("ffn_up"), c.n_ff)], c.n_embd)?,
    };
    Ok(Layer {
        attn_norm: vector(f, &n("attn_norm"), c.n_embd)?,
        wqkv,
        wo: matrix(f, &n("attn_output"), q_dim, c.n_embd)?,
        ffn_norm: vector(f, &n("ffn_norm"), c.n_embd)?,
        w_gate_up,
        w_down: matrix(f, &n("ffn_down"), c.n_ff, c.n_embd)?,
        qk_norms,
        post_norms,
        qkv_bias,
    })
}

/// What one job of the loader builds.
enum Part {
    Output(Option<QMatrix>),
    Embedding(QMatrix),
    Layer(Box<Layer>),
}

/// The model's matrices, repacked by `threads` threads taking jobs in order: the output
/// projection and the embedding first (the two largest matrices: started last, or alone, one
/// of them would keep a single thread busy while the others idle; with a tied output, which
/// Llama 3.2 and Qwen2.5 files have, the embedding alone was half of a load's wall time), then
/// the layers. On failure, the error of the first job that fails: jobs are taken in order, so
/// every job before it was tried.
fn parts(
    f: &Tensors<'_>,
    c: &LlamaConfig,
    own_output: bool,
    threads: usize,
) -> Result<(Option<QMatrix>, QMatrix, Vec<Layer>), ModelError> {
    let job = |i: usize| match i {
        0 => own_output.then(|| matrix(f, "output.weight", c.n_embd, c.vocab)).transpose().map(Part::Output),
        1 => matrix(f, "token_embd.weight", c.n_embd, c.vocab).map(Part::Embedding),
        i => layer(f, c, i - 2).map(|l| Part::Layer(Box::new(l))),
    };
    let jobs = c.n_layers.saturating_add(2);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(usize, Result<Part, ModelError>)>();
    let done = std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, jobs) {
            let tx = tx.clone();
            let (next, failed, job) = (&next, &failed, &job);
            s.spawn(move || {
                while !failed.load(Ordering::Acquire) {
                    let i = next.fetch_add(1, Ordering::AcqRel);
                    if i >= jobs {
                        break;
                    }
                    let built = job(i);
                    if built.is_err() {
                        failed.store(true, Ordering::Release);
                    }
                    if tx.send((i, built)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        // No capacity from metadata: a damaged count must fail on a missing tensor, not on an
        // allocation.
        let mut done = Vec::new();
        let mut waiting = BTreeMap::new();
        let mut first_err: Option<(usize, ModelError)> = None;
        for (i, built) in rx {
            match built {
                Ok(part) => {
                    waiting.insert(i, part);
                }
                Err(e) if first_err.as_ref().is_none_or(|(j, _)| i < *j) => first_err = Some((i, e)),
                Err(_) => {}
            }
            while let Some(part) = waiting.remove(&done.len()) {
                done.push(part);
            }
        }
        match first_err {
            Some((_, e)) => Err(e),
            None => Ok(done),
        }
    })?;
    let mut done = done.into_iter();
    let (Some(Part::Output(output)), Some(Part::Embedding(tok_embd))) = (done.next(), done.next()) else {
        unreachable!("jobs 0 and 1 build the output and the embedding");
    };
    let layers = done
        .map(|p| match p {
            Part::Layer(l) => *l,
            _ => unreachable!("every job after the first two builds a layer"),
        })
        .collect();
    Ok((output, tok_embd, layers))
}

/// A bound on the bytes the repacked matrices of `file` take: no kernel format takes more than
/// twice its file type's bytes (a Q4_0 part of a stack held as Q8_0, 1.89x, is the most), plus the rows that fill a
/// last group of 16 and each buffer's alignment.
fn packed_bound(file: &GgufFile) -> usize {
    file.tensors()
        .iter()
        .map(|t| {
            let cols = t.dims.first().copied().unwrap_or(0) as usize;
            (t.n_bytes as usize).saturating_mul(2).saturating_add(cols.saturating_mul(2 * crate::qmatrix::GROUP))
                + 8 * 64
        })
        .fold(0usize, usize::saturating_add)
}

impl LlamaWeights {
    /// Loads and repacks every tensor, `threads` at a time (0: one per core).
    pub fn load(file: &GgufFile, c: &LlamaConfig, threads: usize, q6k: Q6kLayout) -> Result<LlamaWeights, ModelError> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        // Every matrix is built in place in one region (where it fits the bound, as all do).
        let packer = Packer::reserve(packed_bound(file));
        let f = &Tensors::new(file, Alloc::In(&packer), q6k);
        // Gemma 2's output is always the embedding (llama.cpp reads no `output.weight` for it, so
        // a file that has one is refused as holding a tensor nobody applies).
        let own_output = f.has("output.weight") && c.arch != Arch::Gemma2;
        let (output, tok_embd, layers) = parts(f, c, own_output, threads)?;
        // Only llama files carry `rope_freqs`, only Phi-3 the LongRoPE pair (llama.cpp reads
        // them for no other architecture here).
        let pairs = c.head_dim / 2;
        let rope_factors = match c.arch {
            Arch::Llama if f.has("rope_freqs.weight") => RopeFactors::Fixed(vector(f, "rope_freqs.weight", pairs)?),
            Arch::Phi3 if f.has("rope_factors_long.weight") || f.has("rope_factors_short.weight") => {
                RopeFactors::LongShort {
                    long: vector(f, "rope_factors_long.weight", pairs)?,
                    short: vector(f, "rope_factors_short.weight", pairs)?,
                }
            }
            _ => RopeFactors::None,
        };
        // A divisor of an angle: zero or NaN would turn every rotated key into NaN.
        if rope_factors.all().any(|&x| !(x.is_finite() && x > 0.0)) {
            return Err(ModelError::Config("a rotary factor is not a positive number".into()));
        }
        let out_norm = vector(f, "output_norm.weight", c.n_embd)?;
        f.all_read(c.arch)?;
        Ok(LlamaWeights { tok_embd, layers, out_norm, output, rope_factors, region: packer.finish() })
    }

    /// Bytes of the weights the system backs with huge pages (None where it cannot be read).
    pub fn huge_page_bytes(&self) -> Option<usize> {
        self.region.as_ref().map_or(Some(0), |r| r.huge_bytes())
    }

    /// Waits up to `timeout` for the weights' move to huge pages, which runs in the
    /// background from load on (see [`crate::region`]); whether it ended. For measurements
    /// of the steady state: serving never waits for it.
    pub fn wait_huge_pages(&self, timeout: std::time::Duration) -> bool {
        self.region.as_ref().is_none_or(|r| r.wait_settled(timeout))
    }

    pub fn output(&self) -> &QMatrix {
        self.output.as_ref().unwrap_or(&self.tok_embd)
    }

    /// Weight bytes one decode step reads whatever its batch: every layer's matrices and norms
    /// and the output projection (the embedding lookup reads one row per token, left out). At
    /// batch 1 a decode step is bound by reading these from memory.
    pub fn step_bytes(&self) -> usize {
        let norms = |v: &[f32]| 4 * v.len();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let extra = l.qk_norms.as_ref().map_or(0, |n| norms(&n.q) + norms(&n.k))
                    + l.post_norms.as_ref().map_or(0, |n| norms(&n.attn) + norms(&n.ffn))
                    + l.qkv_bias.as_deref().map_or(0, norms);
                l.wqkv.bytes()
                    + l.wo.bytes()
                    + l.w_gate_up.bytes()
                    + l.w_down.bytes()
                    + norms(&l.attn_norm)
                    + norms(&l.ffn_norm)
                    + extra
            })
            .sum();
        layers + self.output().bytes() + norms(&self.out_norm)
    }
}
