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

/// The architectures [`arch_gguf`] writes, each with the tensor and metadata names llama.cpp's
/// converter (`convert_hf_to_gguf.py`) writes for the real family, so the same file loads in
/// llama.cpp and here and the two forward passes can be compared (`tests/arch_vs_llamacpp.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Plain llama (interleaved rotary pairs, no biases, tied output): the control.
    Llama,
    /// Llama 3.1: `rope_freqs.weight` (llama3 frequency scaling), base 500000, untied output.
    Llama3Rope,
    /// Qwen2 / Qwen2.5: Q, K and V biases, NeoX rotary halves, tied output.
    Qwen2,
    /// Qwen3: per-head RMS norms of Q and K (before the rotation), NeoX rotary halves, head dim
    /// set by `key_length` (query width twice the embedding), untied output.
    Qwen3,
    /// Gemma 2: scaled embedding, norms after attention and FFN, GeGLU, attention scores and
    /// logits soft-capped (caps small enough that the tanh bends these scores and logits), a
    /// 48-position window on every other layer, tied output.
    Gemma2,
    /// Phi-3 128k: fused QKV and gate/up tensors, NeoX halves, LongRoPE's short and long
    /// divisors and attention factor; at llama.cpp's 512 positions (within the original 4096)
    /// the short divisors apply. Names a sliding window, which both runtimes ignore.
    Phi3,
    /// As `Phi3` with an original context of 256, so 512 served positions take the long ones.
    Phi3Long,
}

impl Variant {
    pub const ALL: [Variant; 7] = [
        Variant::Llama,
        Variant::Llama3Rope,
        Variant::Qwen2,
        Variant::Qwen3,
        Variant::Gemma2,
        Variant::Phi3,
        Variant::Phi3Long,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Llama => "llama",
            Variant::Llama3Rope => "llama3-rope",
            Variant::Qwen2 => "qwen2",
            Variant::Qwen3 => "qwen3",
            Variant::Gemma2 => "gemma2",
            Variant::Phi3 => "phi3",
            Variant::Phi3Long => "phi3-long",
        }
    }

    pub fn from_name(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }

    /// The variant's spec, seeded (every variant has its own seed, so the files differ).
    pub fn spec(self) -> ArchSpec {
        let base = ArchSpec {
            arch: "llama",
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            n_embd: 256,
            head_dim: 64,
            n_ff: 512,
            context: 512,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
            llama3_rope: None,
            qkv_bias: false,
            qk_norm: false,
            tied_output: true,
            write_head_dim: false,
            gemma2: None,
            phi3: None,
            seed: 41,
            logit_std: 3.0,
        };
        let phi3 = |original_context, seed| ArchSpec {
            arch: "phi3",
            context: 131_072,
            tied_output: false,
            phi3: Some(Phi3Extras { original_context, sliding_window: 32 }),
            seed,
            ..base.clone()
        };
        match self {
            Variant::Llama => base,
            // Llama 3.1 8B's rope parameters and context, as its config.json has them.
            Variant::Llama3Rope => ArchSpec {
                llama3_rope: Some(Llama3Rope {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_context: 8192,
                }),
                rope_base: 500_000.0,
                context: 131_072,
                tied_output: false,
                seed: 42,
                ..base
            },
            // Qwen2.5-0.5B's choices: base 1e6, eps 1e-6, tied output.
            Variant::Qwen2 => ArchSpec {
                arch: "qwen2",
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                context: 32_768,
                qkv_bias: true,
                seed: 43,
                ..base
            },
            // Qwen3-8B's choices (untied output), and like every Qwen3 a head dim of its own
            // (128 there with 4096 wide; 64 with 8 heads here on 256).
            Variant::Qwen3 => ArchSpec {
                arch: "qwen3",
                n_heads: 8,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                context: 40_960,
                qk_norm: true,
                tied_output: false,
                write_head_dim: true,
                seed: 44,
                ..base
            },
            Variant::Gemma2 => ArchSpec {
                arch: "gemma2",
                rms_eps: 1e-6,
                context: 8192,
                write_head_dim: true,
                gemma2: Some(Gemma2Extras { attn_softcap: 4.0, final_softcap: 14.0, sliding_window: 48 }),
                seed: 45,
                logit_std: 8.0,
                ..base
            },
            Variant::Phi3 => phi3(4096, 46),
            Variant::Phi3Long => phi3(256, 47),
        }
    }
}

/// Llama 3's frequency scaling, as Meta's `apply_scaling` and llama.cpp's converter compute it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_context: usize,
}

impl Llama3Rope {
    /// The `rope_freqs.weight` values: one per rotary pair, by which llama.cpp DIVIDES the
    /// pair's frequency (ggml_rope_cache_init: `theta / freq_factors[i0/2]`). Transcribed from
    /// `LlamaModel.generate_extra_tensors` in llama.cpp's conversion/llama.py (frequencies in
    /// f32 as torch computes them there, the rest in f64 as Python does).
    pub fn factors(&self, head_dim: usize, base: f32) -> Vec<f32> {
        let old = self.original_context as f64;
        let low_wavelen = old / self.low_freq_factor as f64;
        let high_wavelen = old / self.high_freq_factor as f64;
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32);
                let wavelen = 2.0 * std::f64::consts::PI / freq as f64;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    self.factor
                } else {
                    let smooth = (old / wavelen - self.low_freq_factor as f64)
                        / (self.high_freq_factor as f64 - self.low_freq_factor as f64);
                    (1.0 / ((1.0 - smooth) / self.factor as f64 + smooth)) as f32
                }
            })
            .collect()
    }
}

/// A small model of one of llama.cpp's architectures, written by [`arch_gguf`]. Matrices are
/// Q8_0 (llama.cpp's CPU kernels and ours both multiply them with activations quantized to
/// Q8_0 per 32, so both compute the same products); norms, biases and rope factors are F32.
/// Gemma 2's additions to a spec.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemma2Extras {
    pub attn_softcap: f32,
    pub final_softcap: f32,
    pub sliding_window: usize,
}

/// Phi-3's additions to a spec: LongRoPE's original context (its divisors and attention factor
/// follow from it and the context) and the window the converter writes (ignored by both).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Phi3Extras {
    pub original_context: usize,
    pub sliding_window: usize,
}

impl Phi3Extras {
    /// The converter's LongRoPE attention factor: sqrt(1 + ln(scale) / ln(original)).
    pub fn attn_factor(&self, context: usize) -> f32 {
        let scale = context as f64 / self.original_context as f64;
        (1.0 + scale.ln() / (self.original_context as f64).ln()).sqrt() as f32
    }

    /// Long divisors from 1 to 16 (quadratic), short ones from 1 to 1.5: the two sets differ
    /// enough that using the wrong one fails the comparison.
    pub fn factors(head_dim: usize) -> (Vec<f32>, Vec<f32>) {
        let n = head_dim / 2;
        let t = |i: usize| i as f32 / (n - 1).max(1) as f32;
        ((0..n).map(|i| 1.0 + 15.0 * t(i) * t(i)).collect(), (0..n).map(|i| 1.0 + 0.5 * t(i)).collect())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ArchSpec {
    /// `general.architecture`, and the prefix of the hyperparameter keys.
    pub arch: &'static str,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub n_embd: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    /// `context_length` in the metadata (the tests run 256 positions whatever it says).
    pub context: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Writes `rope_freqs.weight` (and no rope scaling keys, as the converter does for llama3).
    pub llama3_rope: Option<Llama3Rope>,
    /// `blk.N.attn_{q,k,v}.bias`.
    pub qkv_bias: bool,
    /// `blk.N.attn_{q,k}_norm.weight` (head_dim each).
    pub qk_norm: bool,
    /// No `output.weight`: the output projection is the embedding.
    pub tied_output: bool,
    /// Writes `attention.key_length` / `value_length`, as the converter does when config.json
    /// names a `head_dim`.
    pub write_head_dim: bool,
    pub gemma2: Option<Gemma2Extras>,
    pub phi3: Option<Phi3Extras>,
    pub seed: u64,
    /// Standard deviation of the logits over the vocabulary for a unit-RMS final hidden state
    /// (sets the output matrix's scale): 3 gives a perplexity of about 15-25 over 384
    /// tokens on a sequence the model itself samples at temperature 1 (9-12 at 0.8), far from
    /// flat (384) and far from one-hot.
    pub logit_std: f32,
}

/// Token count of the vocabulary [`arch_gguf`] writes: 256 byte tokens, 126 merges, 2 specials.
pub const ARCH_VOCAB: usize = 384;
const N_MERGES: usize = ARCH_VOCAB - 256 - 2;

/// GPT-2's byte-to-character map (`bytes_to_unicode`): printable bytes stand for themselves,
/// the others for the characters from U+0100 on.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// A minimal byte-level BPE vocabulary (`tokenizer.ggml.model` "gpt2", pre-tokenizer
/// "default"): every byte, merges of lower-case letter pairs, and BOS/EOS as control tokens.
/// Only there so llama.cpp accepts the file: the comparison drives token ids directly.
fn write_vocab(w: &mut GgufWriter) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let pairs = (b'a'..=b'z').flat_map(|a| b"aeiou".iter().map(move |&b| (char::from(a), char::from(b))));
    let mut merges = Vec::new();
    for (a, b) in pairs.take(N_MERGES) {
        merges.push(Value::String(format!("{a} {b}")));
        tokens.push(format!("{a}{b}"));
    }
    tokens.push("<|bos|>".into());
    tokens.push("<|eos|>".into());
    let types: Vec<Value> =
        tokens.iter().enumerate().map(|(i, _)| Value::I32(if i >= ARCH_VOCAB - 2 { 3 } else { 1 })).collect();
    w.meta("tokenizer.ggml.model", Value::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", Value::String("default".into()))
        .meta("tokenizer.ggml.tokens", Value::Array(tokens.into_iter().map(Value::String).collect()))
        .meta("tokenizer.ggml.token_type", Value::Array(types))
        .meta("tokenizer.ggml.merges", Value::Array(merges))
        .meta("tokenizer.ggml.bos_token_id", Value::U32((ARCH_VOCAB - 2) as u32))
        .meta("tokenizer.ggml.eos_token_id", Value::U32((ARCH_VOCAB - 1) as u32));
}

/// What the layers add to the residual stream, relative to unit RMS. With a tied output the
/// input token's own embedding is in the final hidden state, and scores itself
/// `n_embd * rms(embedding)^2 / rms(hidden)` above the rest: unless the layers' contributions
/// dominate, the model mostly predicts its input token again and the sampled sequence repeats.
const RESIDUAL_GAIN: f32 = 6.0;

fn f32s(v: Vec<f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// A Q8_0 matrix of `rows` rows of `cols`, uniform in ±`scale`.
fn q8(w: &mut GgufWriter, rng: &mut Lcg, name: &str, cols: usize, rows: usize, scale: f32) {
    let vals: Vec<f32> = (0..cols * rows).map(|_| rng.next() * scale).collect();
    w.tensor(name, &[cols as u64, rows as u64], GgmlType::Q8_0, encode_q8_0(&vals));
}

/// Matrices sharing an input, each `(name, rows, scale)` uniform in ±scale, drawn in order:
/// apart under their own names, or (`fused`) one Q8_0 tensor `fused_name` of their rows
/// stacked, as a converter that fuses them writes it.
fn q8_stack(
    w: &mut GgufWriter,
    rng: &mut Lcg,
    (fused_name, fused): (&str, bool),
    cols: usize,
    parts: &[(&str, usize, f32)],
    name: impl Fn(&str) -> String,
) {
    if !fused {
        for &(part, rows, scale) in parts {
            q8(w, rng, &name(part), cols, rows, scale);
        }
        return;
    }
    let vals: Vec<f32> = parts
        .iter()
        .flat_map(|&(_, rows, scale)| (0..cols * rows).map(|_| rng.next() * scale).collect::<Vec<_>>())
        .collect();
    let rows: usize = parts.iter().map(|p| p.1).sum();
    w.tensor(fused_name, &[cols as u64, rows as u64], GgmlType::Q8_0, encode_q8_0(&vals));
}

/// An F32 vector uniform in `center` ± `spread`.
fn vec(w: &mut GgufWriter, rng: &mut Lcg, name: &str, len: usize, center: f32, spread: f32) {
    let v: Vec<f32> = (0..len).map(|_| center + spread * rng.next()).collect();
    w.tensor(name, &[len as u64], GgmlType::F32, f32s(v));
}

/// The file's `general.name`. llama.cpp sets Phi-3 token attributes when the name contains
/// "phi3" and stops on a vocabulary without Phi-3's tokens, so that family is spelt apart.
fn display_name(arch: &str) -> String {
    match arch {
        "phi3" => "pagewarden synthetic model of the Phi 3 family".into(),
        a => format!("pagewarden synthetic {a}"),
    }
}

/// The GGUF bytes of a random model with this spec, the same bytes for the same spec.
///
/// Scales, so that the forward pass is neither flat nor saturated and every part of it moves
/// the logits (a part that is computed wrong must show in the comparison): projections
/// uniform in ±1.7/sqrt(fan-in) (unit-RMS outputs for unit-RMS inputs), Q and K twice that
/// (attention scores with a standard deviation of a few units, so attention is selective and
/// positions matter), norm weights 1 ± 0.2 (Q/K head norms 2 ± 0.4, for the same reason),
/// biases ±1 (about as large as the projection they are added to), and the output matrix set
/// by `logit_std`.
pub fn arch_gguf(spec: &ArchSpec) -> Vec<u8> {
    let mut rng = Lcg(spec.seed);
    let (hd, q_dim, kv_dim) = (spec.head_dim, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim);
    let a = spec.arch;
    let u = |v: usize| Value::U32(v as u32);
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String(a.into()))
        .meta("general.name", Value::String(display_name(a)))
        .meta(&format!("{a}.block_count"), u(spec.n_layers))
        .meta(&format!("{a}.context_length"), u(spec.context))
        .meta(&format!("{a}.embedding_length"), u(spec.n_embd))
        .meta(&format!("{a}.feed_forward_length"), u(spec.n_ff))
        .meta(&format!("{a}.attention.head_count"), u(spec.n_heads))
        .meta(&format!("{a}.attention.head_count_kv"), u(spec.n_kv_heads))
        .meta(&format!("{a}.rope.freq_base"), Value::F32(spec.rope_base))
        .meta(&format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(spec.rms_eps));
    if spec.write_head_dim {
        w.meta(&format!("{a}.attention.key_length"), u(hd)).meta(&format!("{a}.attention.value_length"), u(hd));
    }
    if a == "llama" {
        // LlamaModel.set_gguf_parameters adds these two; the Qwen converters do not.
        w.meta(&format!("{a}.vocab_size"), u(ARCH_VOCAB)).meta(&format!("{a}.rope.dimension_count"), u(hd));
    }
    if let Some(g) = &spec.gemma2 {
        w.meta(&format!("{a}.attn_logit_softcapping"), Value::F32(g.attn_softcap))
            .meta(&format!("{a}.final_logit_softcapping"), Value::F32(g.final_softcap))
            .meta(&format!("{a}.attention.sliding_window"), u(g.sliding_window));
    }
    if let Some(p) = &spec.phi3 {
        w.meta(&format!("{a}.rope.scaling.original_context_length"), u(p.original_context))
            .meta(&format!("{a}.rope.dimension_count"), u(hd))
            .meta(&format!("{a}.attention.sliding_window"), u(p.sliding_window))
            .meta(&format!("{a}.rope.scaling.attn_factor"), Value::F32(p.attn_factor(spec.context)));
    }
    write_vocab(&mut w);

    // Logit std = sqrt(n_embd) * scale / sqrt(3) for a unit-RMS hidden state.
    let out_scale = spec.logit_std * 3f32.sqrt() / (spec.n_embd as f32).sqrt();
    q8(&mut w, &mut rng, "token_embd.weight", spec.n_embd, ARCH_VOCAB, out_scale);
    if let Some(r) = &spec.llama3_rope {
        w.tensor("rope_freqs.weight", &[(hd / 2) as u64], GgmlType::F32, f32s(r.factors(hd, spec.rope_base)));
    }
    if spec.phi3.is_some() {
        let (long, short) = Phi3Extras::factors(hd);
        w.tensor("rope_factors_long.weight", &[(hd / 2) as u64], GgmlType::F32, f32s(long));
        w.tensor("rope_factors_short.weight", &[(hd / 2) as u64], GgmlType::F32, f32s(short));
    }
    let s_in = 1.7 / (spec.n_embd as f32).sqrt();
    let s_q = 1.7 / (q_dim as f32).sqrt();
    let s_ff = 1.7 / (spec.n_ff as f32).sqrt();
    // Gemma 2's post-norms set the size of what each layer adds: the gain goes there.
    let (gain, post_gain) = match spec.gemma2 {
        Some(_) => (1.0, RESIDUAL_GAIN),
        None => (RESIDUAL_GAIN, 1.0),
    };
    for i in 0..spec.n_layers {
        let n = |s: &str, kind: &str| format!("blk.{i}.{s}.{kind}");
        vec(&mut w, &mut rng, &n("attn_norm", "weight"), spec.n_embd, 1.0, 0.2);
        let qkv = [("attn_q", q_dim, 2.0 * s_in), ("attn_k", kv_dim, 2.0 * s_in), ("attn_v", kv_dim, s_in)];
        let gate_up = [("ffn_gate", spec.n_ff, s_in), ("ffn_up", spec.n_ff, s_in)];
        // Phi-3's converter fuses Q, K, V into `attn_qkv` and gate, up into `ffn_up`.
        let fused = spec.phi3.is_some();
        q8_stack(&mut w, &mut rng, (&n("attn_qkv", "weight"), fused), spec.n_embd, &qkv, |s| n(s, "weight"));
        if spec.qkv_bias {
            vec(&mut w, &mut rng, &n("attn_q", "bias"), q_dim, 0.0, 1.0);
            vec(&mut w, &mut rng, &n("attn_k", "bias"), kv_dim, 0.0, 1.0);
            vec(&mut w, &mut rng, &n("attn_v", "bias"), kv_dim, 0.0, 0.25);
        }
        if spec.qk_norm {
            vec(&mut w, &mut rng, &n("attn_q_norm", "weight"), hd, 2.0, 0.4);
            vec(&mut w, &mut rng, &n("attn_k_norm", "weight"), hd, 2.0, 0.4);
        }
        q8(&mut w, &mut rng, &n("attn_output", "weight"), q_dim, spec.n_embd, gain * s_q);
        if spec.gemma2.is_some() {
            vec(&mut w, &mut rng, &n("post_attention_norm", "weight"), spec.n_embd, post_gain, 0.2 * post_gain);
        }
        vec(&mut w, &mut rng, &n("ffn_norm", "weight"), spec.n_embd, 1.0, 0.2);
        q8_stack(&mut w, &mut rng, (&n("ffn_up", "weight"), fused), spec.n_embd, &gate_up, |s| n(s, "weight"));
        q8(&mut w, &mut rng, &n("ffn_down", "weight"), spec.n_ff, spec.n_embd, gain * s_ff);
        if spec.gemma2.is_some() {
            vec(&mut w, &mut rng, &n("post_ffw_norm", "weight"), spec.n_embd, post_gain, 0.2 * post_gain);
        }
    }
    vec(&mut w, &mut rng, "output_norm.weight", spec.n_embd, 1.0, 0.2);
    if !spec.tied_output {
        q8(&mut w, &mut rng, "output.weight", spec.n_embd, ARCH_VOCAB, out_scale);
    }
    w.to_bytes()
}
