#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Paged attention equals a plain contiguous implementation on a tiny generated model, for any
//! page size, any placement of pages in the pool, any chunking of the prompt, and any batch.

use gguf::GgufFile;
use kv::{BlockTable, Capacity, KvDtype, KvPool, Owner, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::attention::{dot, softmax_weighted_sum};
use model::qmatrix::quantize_for;
use model::quant::QuantActs;
use model::threads::ComputePool;
use model::tiny::{tiny_gguf, TinySpec};
use model::{matmul::matmul, ops, Llama, LoadOptions, Logits, SeqStep};
use proptest::prelude::*;

fn tiny() -> Llama {
    let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
    Llama::from_file(&f, LoadOptions { threads: 2, ..Default::default() }).unwrap()
}

/// The whole forward pass written plainly: K and V in contiguous vectors, attention as loops.
/// Shares the model's weights, matmul and element-wise ops, so only the KV path differs.
fn contiguous_logits(m: &Llama, tokens: &[u32]) -> Vec<f32> {
    let c = &m.config;
    let (d, hd, t) = (c.n_embd, c.head_dim, tokens.len());
    let kvd = c.n_kv_heads * hd;
    let pool = ComputePool::new(1).unwrap();
    let mut acts = QuantActs::default();
    let mut x = vec![0f32; t * d];
    for (i, &tok) in tokens.iter().enumerate() {
        m.embed(tok, &mut x[i * d..(i + 1) * d]);
    }
    let mut xn = vec![0f32; t * d];
    for layer in &m.weights.layers {
        ops::rms_norm(&x, &layer.attn_norm, c.rms_eps, &mut xn);
        let mut qkv = vec![0f32; t * (d + 2 * kvd)];
        layer.wqkv.matmul(&pool, m.isa(), &xn, t, &mut acts, &mut qkv);
        let (mut q, mut k, mut v) = (vec![], vec![], vec![]);
        for i in 0..t {
            let row = &qkv[i * (d + 2 * kvd)..(i + 1) * (d + 2 * kvd)];
            let mut tab = vec![(0f32, 0f32); hd / 2];
            ops::rope_table(i, hd, c.rope_base, (None, 1.0), &mut tab);
            let (mut qi, mut ki) = (row[..d].to_vec(), row[d..d + kvd].to_vec());
            ops::rope_apply(&mut qi, hd, &tab, model::config::RopeStyle::Interleaved);
            ops::rope_apply(&mut ki, hd, &tab, model::config::RopeStyle::Interleaved);
            q.extend(qi);
            k.extend(ki);
            v.extend_from_slice(&row[d + kvd..]);
        }
        let mut attn = vec![0f32; t * d];
        let group = c.n_heads / c.n_kv_heads;
        for i in 0..t {
            for h in 0..c.n_heads {
                let kh = h / group;
                let qh = &q[i * d + h * hd..][..hd];
                // Same arithmetic as the model: scores by `dot`, the softmax and weighted sum by
                // the model's own definition (the next matmul quantizes its input, so a one-ulp
                // difference here could flip a rounding and show up as a whole step).
                let scale = 1.0 / (hd as f32).sqrt();
                let mut scores: Vec<f32> = (0..=i).map(|j| dot(qh, &k[j * kvd + kh * hd..][..hd]) * scale).collect();
                let vh: Vec<f32> = (0..=i).flat_map(|j| v[j * kvd + kh * hd..][..hd].iter().copied()).collect();
                softmax_weighted_sum(&mut scores, &vh, hd, &mut attn[i * d + h * hd..][..hd]);
            }
        }
        let mut proj = vec![0f32; t * d];
        quantize_for(&layer.wo, &attn, t, &mut acts);
        matmul(&pool, m.isa(), &layer.wo, &acts, &mut proj);
        ops::add_in_place(&mut x, &proj);
        ops::rms_norm(&x, &layer.ffn_norm, c.rms_eps, &mut xn);
        let mut gu = vec![0f32; t * 2 * c.n_ff];
        layer.w_gate_up.matmul(&pool, m.isa(), &xn, t, &mut acts, &mut gu);
        let mut hidden = vec![0f32; t * c.n_ff];
        for i in 0..t {
            hidden[i * c.n_ff..(i + 1) * c.n_ff].copy_from_slice(&gu[i * 2 * c.n_ff..][..c.n_ff]);
            ops::swiglu(&mut hidden[i * c.n_ff..(i + 1) * c.n_ff], &gu[i * 2 * c.n_ff + c.n_ff..][..c.n_ff]);
        }
        quantize_for(&layer.w_down, &hidden, t, &mut acts);
        matmul(&pool, m.isa(), &layer.w_down, &acts, &mut proj);
        ops::add_in_place(&mut x, &proj);
    }
    let mut out = vec![0f32; t * d];
    ops::rms_norm(&x, &m.weights.out_norm, c.rms_eps, &mut out);
    let mut logits = vec![0f32; t * c.vocab];
    quantize_for(m.weights.output(), &out, t, &mut acts);
    matmul(&pool, m.isa(), m.weights.output(), &acts, &mut logits);
    logits
}

fn pool(m: &Llama, page_size: usize, dtype: KvDtype) -> KvPool {
    let layout = m.config.kv_layout(page_size, dtype);
    KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(4096), scrub: ScrubPolicy::OnFree }).unwrap()
}

fn owner(r: u64) -> Owner {
    Owner { tenant: TenantId(r % 3), request: RequestId(r) }
}

/// Scatters the free list: reserve many single-page tables, free a pseudo-random subset.
fn fragment(p: &KvPool, seed: u64) -> Vec<BlockTable> {
    let ps = p.layout().page_size;
    let mut held: Vec<BlockTable> =
        (0..p.total_pages().min(200)).map(|i| p.reserve(owner(1000 + i as u64), ps).unwrap()).collect();
    let mut s = seed;
    held.retain(|_| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
        (s >> 60).is_multiple_of(2)
    });
    held
}

/// Runs `tokens` through the paged model in the given chunk sizes; returns all logits rows.
fn paged_logits(m: &Llama, p: &KvPool, tokens: &[u32], chunks: &[usize]) -> Vec<f32> {
    let mut kv = p.reserve(owner(1), tokens.len()).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut ci = 0;
    while pos < tokens.len() {
        let n = chunks[ci % chunks.len()].clamp(1, tokens.len() - pos);
        ci += 1;
        let mut step = [SeqStep { tokens: &tokens[pos..pos + n], start: pos, kv: &mut kv, logits: Logits::All }];
        out.extend(m.forward(&mut step).unwrap().remove(0));
        pos += n;
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn paged_attention_matches_contiguous_for_many_page_sizes_and_placements() {
    let m = tiny();
    let tokens: Vec<u32> = (0..70).map(|i| (i * 37 + 11) % m.config.vocab as u32).collect();
    let want = contiguous_logits(&m, &tokens);
    for page_size in [1, 2, 3, 5, 16, 64] {
        let p = pool(&m, page_size, KvDtype::F32);
        let _holes = fragment(&p, page_size as u64);
        let got = paged_logits(&m, &p, &tokens, &[tokens.len()]);
        let diff = max_diff(&want, &got);
        assert!(diff <= 1e-5, "page size {page_size}: max |diff| {diff}");
    }
}

#[test]
fn batching_sequences_together_changes_no_logit() {
    let m = tiny();
    let p = pool(&m, 16, KvDtype::F16);
    let a: Vec<u32> = (0..33).map(|i| (i * 5 + 1) % 80).collect();
    let b: Vec<u32> = (0..9).map(|i| (i * 7 + 3) % 80).collect();
    let alone_a = paged_logits(&m, &p, &a, &[a.len()]);
    let alone_b = paged_logits(&m, &p, &b, &[b.len()]);
    let (mut ka, mut kb) = (p.reserve(owner(2), a.len()).unwrap(), p.reserve(owner(3), b.len()).unwrap());
    let mut steps = [
        SeqStep { tokens: &a, start: 0, kv: &mut ka, logits: Logits::All },
        SeqStep { tokens: &b, start: 0, kv: &mut kb, logits: Logits::All },
    ];
    let both = m.forward(&mut steps).unwrap();
    assert_eq!(both[0], alone_a);
    assert_eq!(both[1], alone_b);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_page_size_placement_and_chunking_matches_contiguous(
        page_size in 1usize..40,
        seed in any::<u64>(),
        len in 1usize..60,
        chunks in proptest::collection::vec(1usize..20, 1..5),
    ) {
        let m = tiny();
        let tokens: Vec<u32> = (0..len as u64).map(|i| ((i * 31 + seed) % 80) as u32).collect();
        let want = contiguous_logits(&m, &tokens);
        let p = pool(&m, page_size, KvDtype::F32);
        let _holes = fragment(&p, seed);
        let got = paged_logits(&m, &p, &tokens, &chunks);
        let diff = max_diff(&want, &got);
        prop_assert!(diff <= 1e-5, "page size {} chunks {:?}: max |diff| {}", page_size, chunks, diff);
    }
}

/// Decode steps give the logits their positions get inside one prompt, bit for bit, where a
/// step's attention is split across the threads (three KV heads of 64 on two threads, an f16
/// pool): by keys, then by output elements. Contexts end on and off a page boundary.
#[test]
fn decode_steps_split_across_threads_give_the_prompts_logits() {
    let spec = TinySpec { n_heads: 6, n_kv_heads: 3, n_embd: 384, ..TinySpec::default() };
    let m = Llama::from_file(
        &GgufFile::from_bytes(tiny_gguf(&spec)).unwrap(),
        LoadOptions { threads: 2, ..Default::default() },
    )
    .unwrap();
    assert_eq!(m.config.head_dim, 64);
    let p = pool(&m, 16, KvDtype::F16);
    let tokens: Vec<u32> = (0..70).map(|i| (i * 37 + 11) % 80).collect();
    let whole = paged_logits(&m, &p, &tokens, &[tokens.len()]);
    // A prompt of 30, then forty decode steps of one token each.
    let mut chunks = vec![30];
    chunks.extend(std::iter::repeat_n(1, 40));
    let stepped = paged_logits(&m, &p, &tokens, &chunks);
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&stepped), bits(&whole));
}

/// `forward_into` writes into the caller's buffers and the model keeps its own between steps:
/// a buffer's stale contents are replaced, a sequence that asks for no logits gets an empty
/// one, and a step after a larger one gives exactly the logits a fresh model gives.
#[test]
fn reused_buffers_give_the_logits_of_fresh_ones() {
    let (m, fresh) = (tiny(), tiny());
    let p = pool(&m, 16, KvDtype::F16);
    let a: Vec<u32> = (0..40).map(|i| (i * 5 + 1) % 80).collect();
    let b: Vec<u32> = (0..7).map(|i| (i * 7 + 3) % 80).collect();
    // A larger step first, so the model's buffers hold its values.
    paged_logits(&m, &p, &a, &[a.len()]);
    let want = paged_logits(&fresh, &p, &b, &[b.len()]);
    let (mut kb, mut ka) = (p.reserve(owner(4), b.len()).unwrap(), p.reserve(owner(5), a.len()).unwrap());
    let mut out = vec![vec![f32::NAN; 3 * m.config.vocab], vec![1.0; 5]];
    let mut steps = [
        SeqStep { tokens: &b, start: 0, kv: &mut kb, logits: Logits::All },
        SeqStep { tokens: &a, start: 0, kv: &mut ka, logits: Logits::None },
    ];
    m.forward_into(&mut steps, &mut out).unwrap();
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out[0]), bits(&want));
    assert!(out[1].is_empty());
    assert!(m.forward_into(&mut steps, &mut out[..1]).is_err(), "one buffer for two sequences");
}
