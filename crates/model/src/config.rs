//! Hyperparameters of a llama-architecture model, read from GGUF metadata and checked.

use gguf::Gguf;
use kv::{KvDtype, KvLayout};

use crate::error::ModelError;

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
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
}

impl LlamaConfig {
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig, ModelError> {
        let arch = g.str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture(arch.to_string()));
        }
        let u = |k: &str| -> Result<usize, ModelError> { Ok(g.u64(&format!("llama.{k}"))? as usize) };
        let n_embd = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = match g.get("llama.attention.head_count_kv") {
            Some(_) => u("attention.head_count_kv")?,
            None => n_heads,
        };
        let rope_base = match g.get("llama.rope.freq_base") {
            Some(_) => g.f32("llama.rope.freq_base")?,
            None => 10_000.0,
        };
        let vocab = g.tensor("token_embd.weight")?.dims.get(1).copied().unwrap_or(0) as usize;
        let cfg = LlamaConfig {
            n_layers: u("block_count")?,
            n_heads,
            n_kv_heads,
            n_embd,
            n_ff: u("feed_forward_length")?,
            head_dim: n_embd.checked_div(n_heads).unwrap_or(0),
            vocab,
            context: u("context_length")?,
            rope_base,
            rms_eps: g.f32("llama.attention.layer_norm_rms_epsilon")?,
        };
        if let Some(v) = g.get("llama.rope.dimension_count") {
            if v.as_u64() != Some(cfg.head_dim as u64) {
                return Err(ModelError::Config(format!(
                    "partial rotary embeddings ({v:?} of {} dims) are not supported",
                    cfg.head_dim
                )));
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.n_layers == 0 || self.n_heads == 0 || self.n_kv_heads == 0 || self.vocab == 0 || self.context == 0 {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        if self.n_embd != self.n_heads * self.head_dim || !self.head_dim.is_multiple_of(2) {
            return bad(format!("embedding {} is not heads {} x even head dim", self.n_embd, self.n_heads));
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
    pub fn kv_layout(&self, page_size: usize, dtype: KvDtype) -> KvLayout {
        KvLayout { n_layers: self.n_layers, n_kv_heads: self.n_kv_heads, head_dim: self.head_dim, page_size, dtype }
    }
}
