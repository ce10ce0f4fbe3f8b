//! Throwaway: decode attention cost per key and KV head at depth (SmolLM2 shape).
use kv::{Capacity, KvDtype, KvLayout, KvPool, Owner, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::attention::{attend_heads, AttnInput, AttnShape};
use std::time::Instant;

fn main() {
    let depth: usize = std::env::args().nth(1).map_or(2048, |s| s.parse().unwrap());
    let reps: usize = std::env::args().nth(2).map_or(20, |s| s.parse().unwrap());
    let nl: usize = std::env::var("NL").map_or(30, |s| s.parse().unwrap());
    let (n_heads, n_kv, hd, ps) = (9, 3, 64, 16);
    let layout = KvLayout { n_layers: nl, n_kv_heads: n_kv, head_dim: hd, page_size: ps, dtype: KvDtype::F16 };
    let pool =
        KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(depth + 64), scrub: ScrubPolicy::OnFree }).unwrap();
    let mut t = pool.reserve(Owner { tenant: TenantId(1), request: RequestId(1) }, depth + 1).unwrap();
    let row = n_kv * hd;
    let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 250.0;
    let k: Vec<f32> = (0..(depth + 1) * row).map(val).collect();
    let v: Vec<f32> = (0..(depth + 1) * row).map(|i| val(i + 13)).collect();
    for l in 0..nl {
        t.write_range(l, 0, &k, &v).unwrap();
    }
    let q: Vec<f32> = (0..n_heads * hd).map(|i| val(i + 101) / 8.0).collect();
    let shape = AttnShape { n_heads, n_kv_heads: n_kv, head_dim: hd, window: None };
    let mut check = 0f32;
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t0 = Instant::now();
        for l in 0..nl {
            let inp = AttnInput { q: &q, start: depth, n: 1, view: t.layer(l, depth + 1).unwrap() };
            for kvh in 0..n_kv {
                let o = attend_heads(&inp, &shape, kvh, 0..3, 0..1);
                check += o[0];
            }
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!(
        "depth {depth}: {:.3} ms per token, {:.1} ns per key per kv head (check {check})",
        best * 1e3,
        best * 1e9 / (nl * n_kv * (depth + 1)) as f64
    );
}
