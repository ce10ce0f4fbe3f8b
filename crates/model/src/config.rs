//! Hyperparameters of a llama-architecture model, read from GGUF metadata and checked.

use gguf::Gguf;
use kv::{KvDtype, KvLayout};

use crate::error::ModelError;

/// The model families whose forward pass this crate implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1-3 and Mistral 7B; Llama 3.1+'s long-context rotary factors come from the file's
    /// `rope_freqs` tensor.
    Llama,
    /// Gemma 3: RMS norms after attention and FFN as well as before, per-head Q/K norms, GeGLU,
    /// a scaled embedding, and local sliding-window layers between global ones.
    Gemma3,
    /// Qwen2 / Qwen2.5: llama with biases on the Q, K and V projections and rotary pairs of
    /// halves (NeoX).
    Qwen2,
    /// Qwen3: llama with per-head RMS norms of Q and K (before the rotation) and NeoX pairs.
    Qwen3,
    /// Gemma 2: Gemma 3's norms around attention and FFN without its Q/K norms, attention
    /// scores and final logits soft-capped (`cap * tanh(x / cap)`), every other layer local.
    Gemma2,
    /// Phi-3 / Phi-3.5 / Phi-4 mini: llama with the Q, K and V projections fused into one
    /// tensor, gate and up fused into one, NeoX pairs, and (128k variants) LongRoPE: a short
    /// and a long set of rotary divisors, chosen by the served context, and a magnitude factor.
    Phi3,
}

impl Arch {
    fn from_name(name: &str) -> Result<Arch, ModelError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "gemma3" => Ok(Arch::Gemma3),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "gemma2" => Ok(Arch::Gemma2),
            "phi3" => Ok(Arch::Phi3),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Phi3 => "phi3",
        }
    }
}

/// How the rotary embedding pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: llama GGUFs have Q and K permuted for it.
    Interleaved,
    /// Halves `(i, i + d/2)`, as GPT-NeoX and Gemma.
    Halves,
}

/// Gemma 3's sliding-window layers use this base; only the global layers use the file's.
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;
/// Gemma 3: every sixth layer attends globally, the five before it locally.
const GEMMA3_SWA_PERIOD: usize = 6;
/// Gemma 2: layers alternate, local first (llama.cpp's default where the file gives no pattern).
const GEMMA2_SWA_PERIOD: usize = 2;
/// Gemma 2's window where the file gives none (llama.cpp's default).
const GEMMA2_WINDOW: usize = 4096;
/// llama.cpp's Gemma 2 soft-caps where the file gives none.
const GEMMA2_ATTN_SOFTCAP: f32 = 50.0;
const GEMMA2_FINAL_SOFTCAP: f32 = 30.0;
/// Gemma 2 27B (46 layers) scales queries by 1/sqrt(n_embd / n_heads), not 1/sqrt(head_dim)
/// (gemma_pytorch's `query_pre_attn_scalar`; llama.cpp keys it on the layer count too).
const GEMMA2_27B_LAYERS: usize = 46;

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Sliding-window layers: the window (positions a query sees, itself included), the
    /// period of the local/global pattern, and their rotary base.
    pub sliding_window: Option<SlidingWindow>,
    /// What a query-key product is multiplied by before the softmax.
    pub attn_scale: f32,
    /// Gemma 2: attention scores become `cap * tanh(score / cap)` before the softmax.
    pub attn_softcap: Option<f32>,
    /// Gemma 2: the logits become `cap * tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
    /// LongRoPE (Phi-3 128k): the context the short rotary divisors were trained for; a served
    /// context beyond it takes the long ones (llama.cpp's rule, on its `n_ctx`).
    pub rope_original_context: Option<usize>,
    /// LongRoPE: the factor every rotary cosine and sine is multiplied by (1 elsewhere).
    pub rope_attn_factor: f32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// Layer `i` is local unless `(i + 1) % period == 0`.
    pub period: usize,
    pub rope_base: f32,
}

/// What differs between layers: where attention looks and how positions rotate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// Keys older than this many positions are not attended to.
    pub window: Option<usize>,
    pub rope_base: f32,
}

impl LlamaConfig {
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig, ModelError> {
        let arch = Arch::from_name(g.str("general.architecture")?)?;
        let prefix = arch.name();
        let key = |k: &str| format!("{prefix}.{k}");
        let u = |k: &str| -> Result<usize, ModelError> { Ok(g.u64(&key(k))? as usize) };
        let opt_u = |k: &str| -> Result<Option<usize>, ModelError> {
            match g.get(&key(k)) {
                Some(_) => Ok(Some(u(k)?)),
                None => Ok(None),
            }
        };
        let n_embd = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = opt_u("attention.head_count_kv")?.unwrap_or(n_heads);
        let rope_base = match g.get(&key("rope.freq_base")) {
            Some(_) => g.f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let head_dim = match opt_u("attention.key_length")? {
            Some(k) => k,
            None => n_embd.checked_div(n_heads).unwrap_or(0),
        };
        if let Some(v) = opt_u("attention.value_length")? {
            if v != head_dim {
                return Err(ModelError::Config(format!("value length {v} differs from key length {head_dim}")));
            }
        }
        let vocab = g.tensor("token_embd.weight")?.dims.get(1).copied().unwrap_or(0) as usize;
        let opt_f32 = |k: &str| -> Result<Option<f32>, ModelError> {
            match g.get(&key(k)) {
                Some(_) => Ok(Some(g.f32(&key(k))?)),
                None => Ok(None),
            }
        };
        // Phi-3 files name a window too, which llama.cpp ignores (its SWA for Phi is off): so
        // does this runtime, or the two would answer differently past the window.
        let sliding_window = match (arch, opt_u("attention.sliding_window")?) {
            (Arch::Gemma3, Some(window)) => {
                Some(SlidingWindow { window, period: GEMMA3_SWA_PERIOD, rope_base: GEMMA3_LOCAL_ROPE_BASE })
            }
            (Arch::Gemma2, window) => {
                if g.get(&key("attention.sliding_window_pattern")).is_some_and(|v| v.as_u64().is_none()) {
                    return Err(ModelError::Config("a per-layer sliding window pattern is not supported".into()));
                }
                Some(SlidingWindow {
                    window: window.unwrap_or(GEMMA2_WINDOW),
                    period: opt_u("attention.sliding_window_pattern")?.unwrap_or(GEMMA2_SWA_PERIOD),
                    rope_base: opt_f32("rope.freq_base_swa")?.unwrap_or(rope_base),
                })
            }
            _ => None,
        };
        let n_layers = u("block_count")?;
        let attn_scale = match arch {
            Arch::Gemma2 if n_layers == GEMMA2_27B_LAYERS => 1.0 / ((n_embd / n_heads.max(1)) as f32).sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let (attn_softcap, final_softcap) = match arch {
            Arch::Gemma2 => (
                Some(opt_f32("attn_logit_softcapping")?.unwrap_or(GEMMA2_ATTN_SOFTCAP)),
                Some(opt_f32("final_logit_softcapping")?.unwrap_or(GEMMA2_FINAL_SOFTCAP)),
            ),
            _ => (None, None),
        };
        let (rope_original_context, rope_attn_factor) = match arch {
            Arch::Phi3 => {
                (opt_u("rope.scaling.original_context_length")?, opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0))
            }
            _ => (None, 1.0),
        };
        let cfg = LlamaConfig {
            arch,
            n_layers,
            n_heads,
            n_kv_heads,
            n_embd,
            n_ff: u("feed_forward_length")?,
            head_dim,
            vocab,
            context: u("context_length")?,
            rope_base,
            rms_eps: g.f32(&key("attention.layer_norm_rms_epsilon"))?,
            sliding_window,
            attn_scale,
            attn_softcap,
            final_softcap,
            rope_original_context,
            rope_attn_factor,
        };
        if let Some(v) = g.get(&key("rope.dimension_count")) {
            if v.as_u64() != Some(cfg.head_dim as u64) {
                return Err(ModelError::Config(format!(
                    "partial rotary embeddings ({v:?} of {} dims) are not supported",
                    cfg.head_dim
                )));
            }
        }
        if let Some(v) = g.get(&key("rope.scaling.type")) {
            if v.as_str().is_some_and(|t| t != "none") {
                return Err(ModelError::Config(format!("rope scaling {v:?} is not supported")));
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Width of the query projection (heads x head dim; Gemma's differs from the embedding).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    pub fn rope_style(&self) -> RopeStyle {
        match self.arch {
            Arch::Llama => RopeStyle::Interleaved,
            Arch::Gemma3 | Arch::Gemma2 | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => RopeStyle::Halves,
        }
    }

    /// Gemma scales the embedding by sqrt(n_embd); the others do not scale it.
    pub fn embed_scale(&self) -> Option<f32> {
        match self.arch {
            Arch::Gemma3 | Arch::Gemma2 => Some((self.n_embd as f32).sqrt()),
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => None,
        }
    }

    /// Whether each head of Q and K is RMS-normalized before its rotation.
    pub fn has_qk_norms(&self) -> bool {
        matches!(self.arch, Arch::Gemma3 | Arch::Qwen3)
    }

    /// Whether the Q, K and V projections carry biases.
    pub fn has_qkv_bias(&self) -> bool {
        self.arch == Arch::Qwen2
    }

    /// The FFN's gate: GELU for Gemma, SiLU for the others.
    pub fn gelu_gate(&self) -> bool {
        matches!(self.arch, Arch::Gemma3 | Arch::Gemma2)
    }

    /// Whether RMS norms follow attention and the FFN as well as precede them (Gemma 2 and 3).
    pub fn has_post_norms(&self) -> bool {
        matches!(self.arch, Arch::Gemma3 | Arch::Gemma2)
    }

    pub fn layer_attention(&self, layer: usize) -> LayerAttention {
        match self.sliding_window {
            Some(sw) if sw.period == 0 || !(layer + 1).is_multiple_of(sw.period) => {
                LayerAttention { window: Some(sw.window), rope_base: sw.rope_base }
            }
            _ => LayerAttention { window: None, rope_base: self.rope_base },
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.n_layers == 0 || self.n_heads == 0 || self.n_kv_heads == 0 || self.vocab == 0 || self.context == 0 {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        if !self.head_dim.is_multiple_of(2)
            || (matches!(self.arch, Arch::Llama | Arch::Phi3) && self.n_embd != self.q_dim())
        {
            return bad(format!("embedding {} is not heads {} x even head dim", self.n_embd, self.n_heads));
        }
        if !self.q_dim().is_multiple_of(32) {
            return bad(format!("query width {} must be a multiple of 32", self.q_dim()));
        }
        if self.sliding_window.is_some_and(|sw| sw.window == 0) {
            return bad("a sliding window of 0 positions".into());
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!("{} heads do not divide into {} KV heads", self.n_heads, self.n_kv_heads));
        }
        if !self.n_embd.is_multiple_of(32) || !self.n_ff.is_multiple_of(32) {
            return bad(format!("embedding {} and FFN {} must be multiples of 32", self.n_embd, self.n_ff));
        }
        if !(self.rms_eps > 0.0 && self.rope_base > 0.0) {
            return bad("rms epsilon and rope base must be positive".into());
        }
        if self.sliding_window.is_some_and(|sw| !(sw.rope_base.is_finite() && sw.rope_base > 0.0)) {
            return bad("the sliding-window layers' rope base must be positive".into());
        }
        // A cap of 0 divides by zero; a negative or NaN one flips or poisons every score.
        if [self.attn_softcap, self.final_softcap].into_iter().flatten().any(|c| !(c.is_finite() && c > 0.0)) {
            return bad("a soft-cap must be a positive number".into());
        }
        if !(self.attn_scale.is_finite() && self.attn_scale > 0.0) {
            return bad("the attention scale must be a positive number".into());
        }
        if !(self.rope_attn_factor.is_finite() && self.rope_attn_factor > 0.0) {
            return bad("the rope attention factor must be a positive number".into());
        }
        Ok(())
    }

    /// The KV layout this model needs from a pool.
    /// K and V bytes a query at position `ctx - 1` reads (each layer over its window), in
    /// `dtype`: what attention adds to a decode step's memory traffic at that context.
    pub fn kv_read_bytes(&self, ctx: usize, dtype: KvDtype) -> usize {
        let row = 2 * self.n_kv_heads * self.head_dim * dtype.bytes();
        (0..self.n_layers).map(|l| self.layer_attention(l).window.map_or(ctx, |w| ctx.min(w)) * row).sum()
    }

    pub fn kv_layout(&self, page_size: usize, dtype: KvDtype) -> KvLayout {
        KvLayout { n_layers: self.n_layers, n_kv_heads: self.n_kv_heads, head_dim: self.head_dim, page_size, dtype }
    }
}
