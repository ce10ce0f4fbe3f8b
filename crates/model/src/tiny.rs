//! A small random llama model written as GGUF, so tests can exercise the loader and the whole
//! forward pass in milliseconds, with shapes (grouped KV heads, several layers) like the real one.

use gguf::write::GgufWriter;
use gguf::{GgmlType, Value};

use crate::weights::encode_q8_0;

#[derive(Clone, Debug)]
pub struct TinySpec {
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub context: usize,
    pub seed: u64,
}

impl Default for TinySpec {
    fn default() -> Self {
        TinySpec { n_layers: 2, n_heads: 4, n_kv_heads: 2, n_embd: 64, n_ff: 96, vocab: 80, context: 512, seed: 7 }
    }
}

struct Lcg(u64);

impl Lcg {
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Q4_1 encoding of `x` (rows of multiples of 32), as ggml's reference quantizer does it.
pub fn encode_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 20);
    for blk in x.chunks_exact(32) {
        let min = blk.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let max = blk.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        out.extend_from_slice(&half::f16::from_f32(min).to_bits().to_le_bytes());
        for j in 0..16 {
            let lo = (((blk[j] - min) * id + 0.5) as u8).min(15);
            let hi = (((blk[j + 16] - min) * id + 0.5) as u8).min(15);
            out.push(lo | (hi << 4));
        }
    }
    out
}

/// The GGUF bytes of a random model with this spec.
pub fn tiny_gguf(spec: &TinySpec) -> Vec<u8> {
    let mut rng = Lcg(spec.seed);
    let hd = spec.n_embd / spec.n_heads;
    let kv_dim = spec.n_kv_heads * hd;
    let mut w = GgufWriter::new();
    let u = |v: usize| Value::U32(v as u32);
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("llama.block_count", u(spec.n_layers))
        .meta("llama.context_length", u(spec.context))
        .meta("llama.embedding_length", u(spec.n_embd))
        .meta("llama.feed_forward_length", u(spec.n_ff))
        .meta("llama.attention.head_count", u(spec.n_heads))
        .meta("llama.attention.head_count_kv", u(spec.n_kv_heads))
        .meta("llama.rope.freq_base", Value::F32(10000.0))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .meta("llama.rope.dimension_count", u(hd));
    let mut mat = |name: &str, cols: usize, rows: usize, scale: f32, q8: bool| {
        let vals: Vec<f32> = (0..cols * rows).map(|_| rng.next() * scale).collect();
        let (ty, data) = if q8 { (GgmlType::Q8_0, encode_q8_0(&vals)) } else { (GgmlType::Q4_1, encode_q4_1(&vals)) };
        (name.to_string(), [cols as u64, rows as u64], ty, data)
    };
    let mut tensors = vec![mat("token_embd.weight", spec.n_embd, spec.vocab, 1.0, true)];
    for i in 0..spec.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let s_in = 1.0 / (spec.n_embd as f32).sqrt() * 1.7;
        tensors.push(mat(&n("attn_q"), spec.n_embd, spec.n_embd, s_in * 2.0, false));
        tensors.push(mat(&n("attn_k"), spec.n_embd, kv_dim, s_in * 2.0, false));
        tensors.push(mat(&n("attn_v"), spec.n_embd, kv_dim, s_in, false));
        tensors.push(mat(&n("attn_output"), spec.n_embd, spec.n_embd, s_in, false));
        tensors.push(mat(&n("ffn_gate"), spec.n_embd, spec.n_ff, s_in, false));
        tensors.push(mat(&n("ffn_up"), spec.n_embd, spec.n_ff, s_in, false));
        tensors.push(mat(&n("ffn_down"), spec.n_ff, spec.n_embd, 1.7 / (spec.n_ff as f32).sqrt(), false));
    }
    for (name, dims, ty, data) in &tensors {
        w.tensor(name, dims, *ty, data.clone());
    }
    let norm =
        |rng: &mut Lcg| -> Vec<u8> { (0..spec.n_embd).flat_map(|_| (1.0 + 0.2 * rng.next()).to_le_bytes()).collect() };
    for i in 0..spec.n_layers {
        w.tensor(&format!("blk.{i}.attn_norm.weight"), &[spec.n_embd as u64], GgmlType::F32, norm(&mut rng));
        w.tensor(&format!("blk.{i}.ffn_norm.weight"), &[spec.n_embd as u64], GgmlType::F32, norm(&mut rng));
    }
    w.tensor("output_norm.weight", &[spec.n_embd as u64], GgmlType::F32, norm(&mut rng));
    w.to_bytes()
}
