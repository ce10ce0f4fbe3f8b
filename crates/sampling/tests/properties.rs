//! Property tests: truncation never leaks tokens, logprobs are consistent.

#![allow(clippy::unwrap_used)] // test helpers

use proptest::prelude::*;
use sampling::{argmax, log_softmax, Sampler, SamplingParams};

/// Brute-force oracle of the allowed set for top_k -> top_p -> min_p, with
/// a little slack at the top_p and min_p boundaries for float rounding.
fn allowed(logits: &[f32], top_k: usize, top_p: f32, min_p: f32) -> Vec<bool> {
    let mut order: Vec<usize> = (0..logits.len()).filter(|&i| logits[i] > f32::NEG_INFINITY).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
    if top_k > 0 {
        order.truncate(top_k);
    }
    let max = logits[order[0]] as f64;
    let w: Vec<f64> = order.iter().map(|&i| (logits[i] as f64 - max).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut ok = vec![false; logits.len()];
    let mut before = 0.0;
    for (r, &i) in order.iter().enumerate() {
        let in_top_p = top_p >= 1.0 || before / z < top_p as f64 + 1e-5;
        let in_min_p = min_p <= 0.0 || w[r] >= min_p as f64 * (1.0 - 1e-5);
        ok[i] = in_top_p && in_min_p;
        before += w[r];
    }
    ok
}

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(prop_oneof![9 => -15.0f32..15.0, 1 => Just(f32::NEG_INFINITY)], 1..300).prop_map(|mut v| {
        if v.iter().all(|x| *x == f32::NEG_INFINITY) {
            v[0] = 0.0;
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn truncation_never_returns_a_token_outside_the_allowed_set(
        logits in logits_strategy(),
        top_k in 0i64..40,
        top_p in 0.01f32..=1.0,
        min_p in prop_oneof![Just(0.0f32), 0.0f32..=1.0],
        temperature in 0.05f32..=2.0,
        seed: u64,
    ) {
        let p = SamplingParams::builder()
            .temperature(temperature).top_k(top_k).top_p(top_p).min_p(min_p).seed(seed)
            .build().unwrap();
        let ok = allowed(&logits, top_k as usize, top_p, min_p);
        let mut s = Sampler::new(p);
        let dist = s.distribution(&logits, &[]).unwrap();
        let total: f64 = dist.iter().map(|d| d.1).sum();
        prop_assert!((total - 1.0).abs() < 1e-6);
        prop_assert!(dist.iter().any(|d| d.0 == argmax(&logits)), "the best token is always kept");
        for &(id, _) in &dist {
            prop_assert!(ok[id as usize], "token {} kept but not allowed", id);
        }
        for _ in 0..20 {
            let t = s.sample(&logits, &[]).unwrap().token;
            prop_assert!(ok[t as usize], "sampled {} outside the allowed set", t);
            prop_assert!(dist.iter().any(|d| d.0 == t));
        }
    }

    #[test]
    fn top_k_1_equals_greedy_with_any_penalties(
        logits in logits_strategy(),
        history in prop::collection::vec(0u32..300, 0..50),
        temperature in 0.05f32..=2.0,
        rep in 0.5f32..3.0,
        freq in -2.0f32..=2.0,
        presence in -2.0f32..=2.0,
        seed: u64,
    ) {
        let history: Vec<u32> = history.into_iter().filter(|&t| (t as usize) < logits.len()).collect();
        let b = SamplingParams::builder().repetition_penalty(rep).frequency_penalty(freq).presence_penalty(presence);
        let greedy = Sampler::new(b.clone().build().unwrap()).sample(&logits, &history).unwrap();
        let k1 = Sampler::new(b.temperature(temperature).top_k(1).seed(seed).build().unwrap())
            .sample(&logits, &history).unwrap();
        prop_assert_eq!(greedy.token, k1.token);
    }

    #[test]
    fn log_softmax_exponentiated_sums_to_one(logits in logits_strategy(), shift in -1e4f32..1e4) {
        let shifted: Vec<f32> = logits.iter().map(|x| x + shift).collect();
        let mut out = vec![0.0; shifted.len()];
        log_softmax(&shifted, &mut out);
        let sum: f64 = out.iter().map(|&x| (x as f64).exp()).sum();
        prop_assert!((sum - 1.0).abs() < 1e-4, "sum {}", sum);
    }

    #[test]
    fn top_logprobs_are_sorted_and_match_brute_force_log_softmax(
        logits in logits_strategy(),
        n in 0i64..=20,
        temperature in 0.0f32..=2.0,
        seed: u64,
    ) {
        let p = SamplingParams::builder().temperature(temperature).top_logprobs(n).logprobs(true).seed(seed).build().unwrap();
        let out = Sampler::new(p).sample(&logits, &[]).unwrap();
        let mut lp = vec![0.0; logits.len()];
        log_softmax(&logits, &mut lp);
        let mut want: Vec<(u32, f32)> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize] > f32::NEG_INFINITY)
            .map(|i| (i, lp[i as usize]))
            .collect();
        want.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
        want.truncate(n as usize);
        let got: Vec<(u32, f32)> = out.top.iter().map(|t| (t.token, t.logprob)).collect();
        prop_assert_eq!(got, want);
        prop_assert!(out.logprob.is_some_and(|l| (l - lp[out.token as usize]).abs() < 1e-6));
    }
}
