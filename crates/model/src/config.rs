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
}

impl Arch {
    fn from_name(name: &str) -> Result<Arch, ModelError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "gemma3" => Ok(Arch::Gemma3),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
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
        let sliding_window = match (arch, opt_u("attention.sliding_window")?) {
            (Arch::Gemma3, Some(window)) => {
                Some(SlidingWindow { window, period: GEMMA3_SWA_PERIOD, rope_base: GEMMA3_LOCAL_ROPE_BASE })
            }
            _ => None,
        };
        let cfg = LlamaConfig {
            arch,
            n_layers: u("block_count")?,
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
            Arch::Gemma3 | Arch::Qwen2 | Arch::Qwen3 => RopeStyle::Halves,
        }
    }

    /// Gemma scales the embedding by sqrt(n_embd); the others do not scale it.
    pub fn embed_scale(&self) -> Option<f32> {
        match self.arch {
            Arch::Gemma3 => Some((self.n_embd as f32).sqrt()),
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => None,
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
        self.arch == Arch::Gemma3
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
        if !self.head_dim.is_multiple_of(2) || (self.arch == Arch::Llama && self.n_embd != self.q_dim()) {
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
