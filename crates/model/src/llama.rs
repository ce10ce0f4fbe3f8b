//! The llama forward pass over a batch of sequences, each at its own position.
//!
//! All tokens of the step (prefill chunks and single decode tokens alike) go through the
//! matrix multiplications together; only the KV write and attention are per sequence, and they
//! touch K and V nowhere but in each sequence's pages of the pool.

use std::path::Path;
use std::sync::Mutex;

use gguf::GgufFile;
use kv::BlockTable;

use crate::attention::{AttnInput, AttnShape};
use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::kernels::Isa;
use crate::layer_attention;
use crate::matmul::matmul;
use crate::ops;
use crate::qmatrix::{Q6kLayout, QMatrix};
use crate::quant::QuantActs;
use crate::threads::ComputePool;
use crate::weights::{Layer, LlamaWeights};
use crate::workspace::{zeroed, Workspace};

/// Which logits a sequence wants back from a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// One sequence's part of a step: `tokens` at positions `start..start + tokens.len()`, with its
/// pages (already holding positions `0..start`, with capacity for the new ones).
pub struct SeqStep<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub kv: &'a mut BlockTable,
    pub logits: Logits,
}

#[derive(Default)]
pub struct LoadOptions {
    /// Compute threads; 0 = all cores.
    pub threads: usize,
    /// How Q6_K matrices are laid out (packed, the file's bits, unless a comparison asks for
    /// wide).
    pub q6k: Q6kLayout,
}

pub struct Llama {
    pub config: LlamaConfig,
    pub weights: LlamaWeights,
    isa: Isa,
    pool: ComputePool,
    /// One step's buffers, kept for the next (see [`crate::workspace`]). Steps of one model
    /// run one at a time on its compute pool anyway.
    workspace: Mutex<Workspace>,
}

fn build_pool(threads: usize) -> Result<ComputePool, ModelError> {
    ComputePool::new(threads).map_err(|e| ModelError::Config(format!("cannot start compute threads: {e}")))
}

impl Llama {
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Llama, ModelError> {
        Self::from_file(&crate::mapped::open(path)?, opts)
    }

    pub fn from_file(f: &GgufFile, opts: LoadOptions) -> Result<Llama, ModelError> {
        let config = LlamaConfig::from_gguf(f)?;
        let weights = LlamaWeights::load(f, &config, opts.threads, opts.q6k)?;
        let pool = build_pool(opts.threads)?;
        Ok(Llama { config, weights, isa: Isa::detect(), pool, workspace: Mutex::default() })
    }

    /// [`Llama::from_file`] on a scoped thread while `beside` runs on this one: start-up work
    /// that needs no weights (a tokenizer, a template) fills the cores a load leaves idle,
    /// instead of adding its time before or after it. `beside`'s result is returned whatever
    /// the load's, so a caller reports errors in its own order.
    pub fn from_file_beside<T>(
        f: &GgufFile,
        opts: LoadOptions,
        beside: impl FnOnce() -> T,
    ) -> (Result<Llama, ModelError>, T) {
        std::thread::scope(|s| {
            let llama = s.spawn(|| Self::from_file(f, opts));
            let other = beside();
            (llama.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), other)
        })
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Overrides the kernel set (must be one of `Isa::available()`).
    pub fn set_isa(&mut self, isa: Isa) -> Result<(), ModelError> {
        if !Isa::available().contains(&isa) {
            return Err(ModelError::Config(format!("{} kernels are not supported by this CPU", isa.name())));
        }
        self.isa = isa;
        Ok(())
    }

    /// Replaces the compute thread pool (0 = all cores).
    pub fn set_threads(&mut self, threads: usize) -> Result<(), ModelError> {
        self.pool = build_pool(threads)?;
        Ok(())
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// The compute threads, for per-sequence work around a step (sampling) that should not
    /// run on one core while the others wait.
    pub fn compute_pool(&self) -> &ComputePool {
        &self.pool
    }

    /// Dequantized embedding of `token`.
    pub fn embed(&self, token: u32, out: &mut [f32]) {
        self.weights.tok_embd.row_f32(token as usize, out);
    }

    /// `f(first_row, rows)` over `out` (rows of `width`) split into runs of whole rows across
    /// the pool; row-wise work gives the same values however it is split.
    fn par_rows(&self, out: &mut [f32], width: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
        let rows = out.len() / width;
        if rows < 2 || self.pool.threads() == 1 {
            return f(0, out);
        }
        let per_task = rows.div_ceil(self.pool.threads() * 2);
        self.pool.for_each_chunk_mut(out, per_task * width, &|i, part| f(i * per_task, part));
    }

    /// Quantizes `x` (`t` rows) in the format `w` needs, rows in parallel.
    fn quantize_for(&self, w: &QMatrix, x: &[f32], t: usize, acts: &mut QuantActs) {
        acts.quantize_on(&self.pool, x, t, w.cols, w.act);
    }

    /// `ops::rms_norm` of the rows of `x` into `out`, rows in parallel.
    fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let d = w.len();
        self.par_rows(out, d, &|r0, part| ops::rms_norm(&x[r0 * d..r0 * d + part.len()], w, eps, part));
    }

    /// Each sequence's keys (normalized where the model asks, rotated) and values for layer
    /// `li`, taken from the step's `qkv` rows and written into its pages: one task per
    /// sequence, since each writes only its own table.
    #[allow(clippy::too_many_arguments)]
    fn write_kv(
        &self,
        li: usize,
        layer: &Layer,
        batch: &mut [SeqStep<'_>],
        offsets: &[usize],
        qkv: &[f32],
        (k, v): (&mut [f32], &mut [f32]),
        ropes: &[(f32, f32)],
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (hd, q_dim, kv_dim) = (c.head_dim, c.q_dim(), c.kv_dim());
        let qkv_w = q_dim + 2 * kv_dim;
        let rope_style = c.rope_style();
        let mut parts = Vec::with_capacity(batch.len());
        let (mut k_rest, mut v_rest) = (k, v);
        for (s, &off) in batch.iter_mut().zip(offsets) {
            let n = s.tokens.len() * kv_dim;
            let (ks, kt) = std::mem::take(&mut k_rest).split_at_mut(n);
            let (vs, vt) = std::mem::take(&mut v_rest).split_at_mut(n);
            (k_rest, v_rest) = (kt, vt);
            parts.push((s, off, ks, vs, Ok(())));
        }
        self.pool.for_each_chunk_mut(&mut parts, 1, &|_, part| {
            for (s, off, ks, vs, result) in part.iter_mut() {
                for (i, (kr, vr)) in ks.chunks_exact_mut(kv_dim).zip(vs.chunks_exact_mut(kv_dim)).enumerate() {
                    let r = *off + i;
                    let row = &qkv[r * qkv_w..(r + 1) * qkv_w];
                    vr.copy_from_slice(&row[q_dim + kv_dim..]);
                    match &layer.qk_norms {
                        Some(n) => ops::rms_norm(&row[q_dim..q_dim + kv_dim], &n.k, c.rms_eps, kr),
                        None => kr.copy_from_slice(&row[q_dim..q_dim + kv_dim]),
                    }
                    ops::rope_apply(kr, hd, &ropes[r * hd / 2..(r + 1) * hd / 2], rope_style);
                }
                *result = s.kv.write_range(li, s.start, ks, vs);
            }
        });
        for (_, _, _, _, result) in parts {
            result?;
        }
        Ok(())
    }

    fn check(&self, batch: &[SeqStep<'_>]) -> Result<(), ModelError> {
        let c = &self.config;
        if batch.is_empty() {
            return Err(ModelError::Input("empty batch".into()));
        }
        for s in batch {
            if s.tokens.is_empty() {
                return Err(ModelError::Input("a sequence with no tokens".into()));
            }
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::TokenOutOfRange { id, vocab: c.vocab });
            }
            let end = s.start + s.tokens.len();
            if end > c.context {
                return Err(ModelError::ContextExceeded { needed: end, context: c.context });
            }
            let l = s.kv.layout();
            if (l.n_layers, l.n_kv_heads, l.head_dim) != (c.n_layers, c.n_kv_heads, c.head_dim) {
                return Err(ModelError::KvLayoutMismatch {
                    expected: format!("{} layers x {} heads x {}", c.n_layers, c.n_kv_heads, c.head_dim),
                    found: format!("{} layers x {} heads x {}", l.n_layers, l.n_kv_heads, l.head_dim),
                });
            }
            if end > s.kv.capacity() {
                return Err(ModelError::Input(format!(
                    "sequence needs {end} KV slots but its block table holds {}",
                    s.kv.capacity()
                )));
            }
        }
        Ok(())
    }

    /// Runs one step. Returns, per sequence, its requested logits rows (`vocab` floats each).
    pub fn forward(&self, batch: &mut [SeqStep<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut out = vec![Vec::new(); batch.len()];
        self.forward_into(batch, &mut out)?;
        Ok(out)
    }

    /// [`Llama::forward`] into the caller's buffers: `out[i]` is cleared and receives sequence
    /// `i`'s requested logits rows in its existing allocation, so a server that keeps them
    /// does not allocate a vocabulary's worth of floats per sequence per step.
    pub fn forward_into(&self, batch: &mut [SeqStep<'_>], out: &mut [Vec<f32>]) -> Result<(), ModelError> {
        self.check(batch)?;
        if out.len() != batch.len() {
            return Err(ModelError::Input(format!(
                "{} logits buffers for a batch of {} sequences",
                out.len(),
                batch.len()
            )));
        }
        // A poisoned lock only means an earlier step panicked midway: every buffer is
        // rewritten before it is read, so its contents do not matter.
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let result = self.forward_inner(batch, &mut ws, out);
        ws.trim();
        result
    }

    fn forward_inner(
        &self,
        batch: &mut [SeqStep<'_>],
        ws: &mut Workspace,
        out: &mut [Vec<f32>],
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (d, hd) = (c.n_embd, c.head_dim);
        let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
        let t: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let mut offsets = Vec::with_capacity(batch.len());
        let Workspace {
            x,
            xn,
            qkv,
            q,
            k,
            v,
            attn,
            proj,
            normed,
            gate_up,
            hidden,
            sel,
            sel_normed,
            logits,
            acts,
            attn_parts,
        } = ws;
        let x = zeroed(x, t * d);
        let mut positions = Vec::with_capacity(t);
        let mut row = 0;
        for s in batch.iter() {
            offsets.push(row);
            for (i, &tok) in s.tokens.iter().enumerate() {
                self.embed(tok, &mut x[(row + i) * d..(row + i + 1) * d]);
                positions.push(s.start + i);
            }
            row += s.tokens.len();
        }
        if let Some(scale) = c.embed_scale() {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        // One table of rotary angles per base in use (Gemma's local layers have their own).
        let mut ropes: Vec<(f32, Vec<(f32, f32)>)> = Vec::new();
        for li in 0..c.n_layers {
            let base = c.layer_attention(li).rope_base;
            if !ropes.iter().any(|(b, _)| *b == base) {
                let mut tab = vec![(0f32, 0f32); t * hd / 2];
                for (r, &pos) in positions.iter().enumerate() {
                    let factors = (self.weights.rope_factors.for_context(c), c.rope_attn_factor);
                    ops::rope_table(pos, hd, base, factors, &mut tab[r * hd / 2..(r + 1) * hd / 2]);
                }
                ropes.push((base, tab));
            }
        }
        let rope_style = c.rope_style();
        let xn = zeroed(xn, t * d);
        let qkv_w = q_dim + 2 * kv_dim;
        let qkv = zeroed(qkv, t * qkv_w);
        let (q, k, v) = (zeroed(q, t * q_dim), zeroed(k, t * kv_dim), zeroed(v, t * kv_dim));
        let attn = zeroed(attn, t * q_dim);
        zeroed(proj, t * d);
        zeroed(normed, t * d);
        let gate_up = zeroed(gate_up, t * 2 * c.n_ff);
        let hidden = zeroed(hidden, t * c.n_ff);

        for (li, layer) in self.weights.layers.iter().enumerate() {
            let la = c.layer_attention(li);
            let shape = AttnShape {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                window: la.window,
                scale: c.attn_scale,
                softcap: c.attn_softcap,
            };
            let Some((_, ropes)) = ropes.iter().find(|(b, _)| *b == la.rope_base) else {
                return Err(ModelError::Config(format!("no rotary table for base {}", la.rope_base)));
            };
            self.rms_norm(x, &layer.attn_norm, c.rms_eps, xn);
            layer.wqkv.matmul(&self.pool, self.isa, xn, t, acts, qkv);
            if let Some(bias) = &layer.qkv_bias {
                self.par_rows(qkv, qkv_w, &|_, part| {
                    part.chunks_exact_mut(qkv_w).for_each(|row| ops::add_in_place(row, bias));
                });
            }
            // Queries (most of the rows' work) in parallel, then keys and values.
            let qkv = &*qkv;
            self.par_rows(q, q_dim, &|r0, part| {
                for (i, qr) in part.chunks_exact_mut(q_dim).enumerate() {
                    let r = r0 + i;
                    let row = &qkv[r * qkv_w..(r + 1) * qkv_w];
                    match &layer.qk_norms {
                        // Gemma and Qwen3 normalize each head of Q and K before rotating it.
                        Some(n) => ops::rms_norm(&row[..q_dim], &n.q, c.rms_eps, qr),
                        None => qr.copy_from_slice(&row[..q_dim]),
                    }
                    ops::rope_apply(qr, hd, &ropes[r * hd / 2..(r + 1) * hd / 2], rope_style);
                }
            });
            self.write_kv(li, layer, batch, &offsets, qkv, (k, v), ropes)?;
            // Attention: one task per (sequence, KV head, block of queries), so long prefills
            // spread over every thread.
            let mut inputs = Vec::with_capacity(batch.len());
            for (s, &off) in batch.iter().zip(&offsets) {
                let n = s.tokens.len();
                let view = s.kv.layer(li, s.start + n)?;
                inputs.push(AttnInput { q: &q[off * q_dim..(off + n) * q_dim], start: s.start, n, view });
            }
            layer_attention::attend(&self.pool, &inputs, &shape, &offsets, attn, attn_parts);
            drop(inputs);
            self.quantize_for(&layer.wo, attn, t, acts);
            matmul(&self.pool, self.isa, &layer.wo, acts, proj);
            if let Some(n) = &layer.post_norms {
                self.rms_norm(proj, &n.attn, c.rms_eps, normed);
                std::mem::swap(proj, normed);
            }
            ops::add_in_place(x, proj);

            self.rms_norm(x, &layer.ffn_norm, c.rms_eps, xn);
            layer.w_gate_up.matmul(&self.pool, self.isa, xn, t, acts, gate_up);
            let gate_up = &*gate_up;
            self.par_rows(hidden, c.n_ff, &|r0, part| {
                for (i, h) in part.chunks_exact_mut(c.n_ff).enumerate() {
                    let r = r0 + i;
                    let row = &gate_up[r * 2 * c.n_ff..(r + 1) * 2 * c.n_ff];
                    h.copy_from_slice(&row[..c.n_ff]);
                    match c.gelu_gate() {
                        true => ops::geglu(h, &row[c.n_ff..]),
                        false => ops::swiglu(h, &row[c.n_ff..]),
                    }
                }
            });
            self.quantize_for(&layer.w_down, hidden, t, acts);
            matmul(&self.pool, self.isa, &layer.w_down, acts, proj);
            if let Some(n) = &layer.post_norms {
                self.rms_norm(proj, &n.ffn, c.rms_eps, normed);
                std::mem::swap(proj, normed);
            }
            ops::add_in_place(x, proj);
        }
        self.logits(batch, &offsets, x, LogitsBuffers { sel, sel_normed, logits, acts }, out);
        Ok(())
    }

    /// Writes each sequence's requested logits rows into its `out` buffer (cleared first).
    fn logits(
        &self,
        batch: &[SeqStep<'_>],
        offsets: &[usize],
        x: &[f32],
        bufs: LogitsBuffers<'_>,
        out: &mut [Vec<f32>],
    ) {
        let c = &self.config;
        let d = c.n_embd;
        // Gather only the rows someone asked for: the vocabulary projection is the largest
        // matrix, and decode steps want one row per sequence.
        let asked: Vec<std::ops::Range<usize>> = batch
            .iter()
            .zip(offsets)
            .map(|(s, &off)| {
                let end = off + s.tokens.len();
                match s.logits {
                    Logits::None => end..end,
                    Logits::Last => end - 1..end,
                    Logits::All => off..end,
                }
            })
            .collect();
        let rows: Vec<usize> = asked.iter().cloned().flatten().collect();
        out.iter_mut().for_each(Vec::clear);
        if rows.is_empty() {
            return;
        }
        let LogitsBuffers { sel, sel_normed, logits, acts } = bufs;
        let sel = zeroed(sel, rows.len() * d);
        for (i, &r) in rows.iter().enumerate() {
            sel[i * d..(i + 1) * d].copy_from_slice(&x[r * d..(r + 1) * d]);
        }
        let normed = zeroed(sel_normed, sel.len());
        ops::rms_norm(sel, &self.weights.out_norm, c.rms_eps, normed);
        let w: &QMatrix = self.weights.output();
        let logits = zeroed(logits, rows.len() * c.vocab);
        self.quantize_for(w, normed, rows.len(), acts);
        matmul(&self.pool, self.isa, w, acts, logits);
        if let Some(cap) = c.final_softcap {
            self.par_rows(logits, c.vocab, &|_, part| ops::softcap(part, cap));
        }
        // Each sequence's rows into its own buffer, sequences in parallel: at batch 64 this is
        // 12 MB, a copy the other threads would otherwise wait for.
        let mut parts: Vec<(&mut Vec<f32>, &[f32])> = Vec::with_capacity(out.len());
        let mut rest: &[f32] = logits;
        for (r, o) in asked.iter().zip(out) {
            let (mine, tail) = rest.split_at(r.len() * c.vocab);
            parts.push((o, mine));
            rest = tail;
        }
        self.pool.for_each_chunk_mut(&mut parts, 1, &|_, part| {
            for (o, rows) in part.iter_mut() {
                o.extend_from_slice(rows);
            }
        });
    }
}

/// The workspace's buffers the vocabulary projection uses.
struct LogitsBuffers<'a> {
    sel: &'a mut Vec<f32>,
    sel_normed: &'a mut Vec<f32>,
    logits: &'a mut Vec<f32>,
    acts: &'a mut QuantActs,
}
