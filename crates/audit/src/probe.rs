//! Driving the timing probe ([`crate::timing`] judges it): which tenants play A and B, what
//! each sends, and how the probe waits out a server's ordinary limits before it counts a
//! request unanswered.
//!
//! Pairs are drawn whatever the model ids are called: each tenant sends on the model it was
//! given, so a server that shows every key its own alias of one backend model is probed like
//! any other. With up to [`ALL_PAIRS_UP_TO`] tenants every pair is probed, in both roles;
//! with more, a ring over the tenants ordered by model (each tenant is A once and B once, and
//! consecutive tenants of different models meet), so every tenant and every model takes part.
//! Samples go round the pairs in turn, A and B swapping roles each round.
//!
//! Every prompt of A and B's prefix classes starts with a nonce no request carried before and
//! has its own filler: no two share a head a per-tenant cache could hit, and B's fresh prompts
//! share nothing with A's. The chunk variant's two prompts of B each share a first third with
//! one of A's, so they stand alike before any prefix cache; they differ only in what follows. The filler follows the audit's seed; the nonces do not (they come from a fresh
//! random seed), so a second audit with the same seed against a server that still holds the
//! first one's cache entries gets misses where it expects them.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::{Client, Exchange};
use crate::finding::RequestRow;
use crate::meter::Meter;
use crate::own_prefix::{OwnPrefixes, Units};
use crate::rng::{self, Rng};
use crate::tenants::TenantKey;
use crate::timing::{Class, TimingProbe, BUCKETS};
use crate::workload::{self, Endpoint};

/// Up to this many tenants, every pair is probed; past it, a ring.
pub const ALL_PAIRS_UP_TO: usize = 4;
/// Each pair runs the chunk variant in one of this many of its rounds.
pub const CHUNK_EVERY: usize = 3;
/// Tokens of each of A's prompts in the chunk variant (at most seven eighths of the smaller
/// window of the pair): its last third, the chunk a cache could reuse, is then over the 256
/// tokens llama.cpp's presets ask of a chunk (`--cache-reuse 256`) from a 1,024-token window.
pub const CHUNK_TOKENS: usize = 880;
/// Tokens of the nonce before the filler (an estimate; only the filler is sized).
const NONCE_TOKENS: usize = 12;
/// Tries of one probe request that the server answers 429 or 503.
const TRIES: usize = 6;
/// The longest `Retry-After` the probe waits; a server that asks for more is not answering.
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// After the prefix: A's first and second request, then B's (one suffix for all of B's, so
/// B's classes differ only in what comes before it).
const SUFFIXES: [&str; 3] = [
    "\nSummary:",
    "\nTitle:",
    "\nList the keywords of the record above, then write a short summary of it in plain words for a reader who \
     has never seen the record before and knows nothing about the people, places or things in it:",
];

/// One tenant as the probe uses it.
pub struct ProbeTenant<'a> {
    /// Its index in the audit's tenant list (the own-prefix ledger's key).
    pub index: usize,
    pub key: &'a TenantKey,
    /// The model id its requests name (as listed for its key).
    pub model: &'a str,
    pub tokens_per_word: f64,
    /// The context window of its model.
    pub window: usize,
    pub meter: &'a Meter<'a>,
}

/// Everything a probe needs from the audit.
pub struct Setup<'a> {
    pub client: &'a Client,
    pub tenants: Vec<ProbeTenant<'a>>,
    pub samples: usize,
    pub power_waived: bool,
    /// The audit's start (rows' times are since then).
    pub t0: Instant,
    /// The first request id to use (ids after the plan's).
    pub first_id: usize,
    pub own: &'a OwnPrefixes,
}

/// The pairs of tenants (indices into `models`' order) to probe, and how they were drawn.
pub fn pairs(models: &[&str]) -> (Vec<(usize, usize)>, String) {
    let n = models.len();
    if n < 2 {
        return (Vec::new(), "fewer than two tenants".into());
    }
    if n <= ALL_PAIRS_UP_TO {
        let all = (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))).collect();
        return (all, format!("every pair of the {n} tenants, each tenant on the model id listed for it"));
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|t| (models[*t], *t));
    let ring = (0..n).map(|i| (order[i], order[(i + 1) % n])).collect();
    (ring, format!("a ring over the {n} tenants ordered by model id: each is A once and B once"))
}

/// Runs the probe (four requests per sample, eight in each pair's every [`CHUNK_EVERY`]th
/// round, one at a time); `tick` after each. Returns the results and a row per request (phase "probe").
pub fn run(setup: &Setup, rng: &mut Rng, tick: &dyn Fn()) -> (TimingProbe, Vec<RequestRow>) {
    let started = Instant::now();
    let models: Vec<&str> = setup.tenants.iter().map(|t| t.model).collect();
    let (pairs, drawn) = pairs(&models);
    let labels: Vec<String> = pairs
        .iter()
        .map(|&(a, b)| {
            let (a, b) = (&setup.tenants[a], &setup.tenants[b]);
            format!("{} ({}) and {} ({})", a.key.name, a.model, b.key.name, b.model)
        })
        .collect();
    let mut probe = TimingProbe::new(setup.samples, &labels, drawn);
    probe.power_waived = setup.power_waived;
    let mut rows = Vec::new();
    if pairs.is_empty() {
        probe.finish();
        return (probe, rows);
    }
    let mut nonces = Rng::new(rng::random_seed());
    let mut id = setup.first_id;
    for sample in 0..setup.samples {
        // A round visits every pair once; each round swaps the roles and moves to the next
        // prefix size, so every pair meets every size in both roles.
        let (round, pair) = (sample / pairs.len(), sample % pairs.len());
        let (mut a, mut b) = pairs[pair];
        if round % 2 == 1 {
            std::mem::swap(&mut a, &mut b);
        }
        let (ta, tb) = (&setup.tenants[a], &setup.tenants[b]);
        let bucket = round % BUCKETS.len();
        let tokens = rng.range(BUCKETS[bucket].0, BUCKETS[bucket].1);
        let mut prompt = |filler: &str| format!("{} {filler}", nonce(&mut nonces));
        let words_for = |t: &ProbeTenant, tokens: usize| {
            let tpw = if t.tokens_per_word > 0.0 { t.tokens_per_word } else { 1.3 };
            ((tokens.saturating_sub(NONCE_TOKENS)) as f64 / tpw).round().max(8.0) as usize
        };
        let words = |t: &ProbeTenant| words_for(t, tokens);
        let p_filler = crate::prose::filler(rng, words(ta));
        let q_filler = crate::prose::filler(rng, words(tb));
        let p = prompt(&p_filler);
        let q = prompt(&q_filler);
        let mut steps =
            vec![(Class::ACold, ta, format!("{p}{}", SUFFIXES[0])), (Class::AWarm, ta, format!("{p}{}", SUFFIXES[1]))];
        if chunk_sample(round, pair) {
            // Reuse past a gap: A sends two new prompts; B sends the first with its middle
            // third cut out, and the second's first third before fresh text of the same size.
            // Both of B's share a head with one of A's (a shared prefix cache would serve both
            // alike); only a cache that reuses a chunk past the point where the prompts part
            // (llama.cpp's `--cache-reuse`) serves the first one's last third as well.
            let long = CHUNK_TOKENS.min(ta.window.min(tb.window) * 7 / 8);
            let p2_filler = crate::prose::filler(rng, words_for(ta, long));
            let p3_filler = crate::prose::filler(rng, words_for(ta, long));
            let (p2, p3) = (prompt(&p2_filler), prompt(&p3_filler));
            let (p2_head, p2_tail) = thirds(&p2);
            let (p3_head, p3_tail) = thirds(&p3);
            let fresh_tail = crate::prose::filler(rng, p3_tail.split(' ').count());
            steps.push((Class::AChunk, ta, format!("{p2}{}", SUFFIXES[0])));
            steps.push((Class::AChunk, ta, format!("{p3}{}", SUFFIXES[0])));
            let mut chunk = vec![
                (Class::BChunk, tb, format!("{p2_head} {p2_tail}{}", SUFFIXES[2])),
                (Class::BChunkFresh, tb, format!("{p3_head} {fresh_tail}{}", SUFFIXES[2])),
            ];
            rng.shuffle(&mut chunk);
            steps.extend(chunk);
        }
        let mut b_steps = vec![
            (Class::BCached, tb, format!("{p}{}", SUFFIXES[2])),
            (Class::BFresh, tb, format!("{q}{}", SUFFIXES[2])),
        ];
        rng.shuffle(&mut b_steps);
        steps.extend(b_steps);
        for (class, tenant, text) in steps {
            let body = body(tenant.model, &text);
            let units = tenant.meter.tokens(&body).map_or_else(|| Units::bytes_of(&body), Units::Tokens);
            let own_len = units.tokens();
            let sent = setup.own.send(tenant.index, units);
            let (ex, retries) = send_paced(setup.client, &tenant.key.key, &body, setup.t0);
            let own_prefix = setup.own.allowed(sent);
            probe.retries += retries;
            probe.record(class, id, &tenant.key.name, &ex, bucket, pair, own_prefix, own_len);
            rows.push(row(id, class, tenant.key, &ex));
            id += 1;
            tick();
        }
    }
    probe.duration_s = started.elapsed().as_secs_f64();
    probe.finish();
    (probe, rows)
}

/// A prompt's first and last third, by words.
fn thirds(text: &str) -> (String, String) {
    let words: Vec<&str> = text.split(' ').collect();
    let n = words.len();
    (words[..n / 3].join(" "), words[n - n / 3..].join(" "))
}

/// Whether the sample of `pair` in `round` runs the chunk variant too: one round in
/// [`CHUNK_EVERY`] for each pair, the pairs taking turns.
pub fn chunk_sample(round: usize, pair: usize) -> bool {
    round % CHUNK_EVERY == pair % CHUNK_EVERY
}

/// Sends one probe request, waiting out 429 (and 503) answers as the server asks
/// (`Retry-After`, at most [`LONGEST_WAIT`]) or with a doubling back-off, up to [`TRIES`]
/// tries: a server's ordinary limits are not a dodge. Returns the last answer and the retries.
fn send_paced(client: &Client, key: &str, body: &Value, t0: Instant) -> (Exchange, usize) {
    let mut backoff = Duration::from_millis(250);
    let mut retries = 0;
    loop {
        let ex = client.send(key, Endpoint::Completions.path(), body, None, t0);
        let limited = matches!(ex.status, Some(429 | 503));
        if !limited || retries + 1 >= TRIES {
            return (ex, retries);
        }
        let wait = ex.retry_after.map_or(backoff, |w| w.min(LONGEST_WAIT));
        std::thread::sleep(wait);
        backoff *= 2;
        retries += 1;
    }
}

/// A probe request's body: streamed, one token, greedy, usage in the stream.
fn body(model: &str, prompt: &str) -> Value {
    let mut b = workload::body(model, Endpoint::Completions, prompt, 1, true, 0);
    if let Some(o) = b.as_object_mut() {
        o.remove("logprobs");
    }
    b
}

/// Twelve random digits: always about the same number of tokens, never seen before.
fn nonce(r: &mut Rng) -> String {
    format!("{:012}", r.next_u64() % 1_000_000_000_000)
}

fn row(id: usize, class: Class, tenant: &TenantKey, ex: &Exchange) -> RequestRow {
    RequestRow {
        stream: true,
        max_tokens: 1,
        ..RequestRow::answered(id, "probe", tenant.name.clone(), class.name(), "completions", ex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_when_few_and_a_ring_covering_every_tenant_and_model_when_many() {
        assert!(pairs(&["m"]).0.is_empty());
        assert_eq!(pairs(&["a-alias", "b-alias"]).0, [(0, 1)]);
        assert_eq!(pairs(&["m", "m", "n"]).0, [(0, 1), (0, 2), (1, 2)]);
        let models = ["x", "y", "x", "y", "z", "x"];
        let (ring, how) = pairs(&models);
        assert!(how.contains("ring"), "{how}");
        assert_eq!(ring.len(), models.len());
        for t in 0..models.len() {
            assert_eq!(ring.iter().filter(|(a, _)| *a == t).count(), 1, "{ring:?}");
            assert_eq!(ring.iter().filter(|(_, b)| *b == t).count(), 1, "{ring:?}");
        }
        // Models meet across the ring: some pair joins tenants of different models.
        assert!(ring.iter().any(|(a, b)| models[*a] != models[*b]));
    }

    #[test]
    fn thirds_keep_the_head_and_the_tail_and_drop_the_middle() {
        assert_eq!(thirds("a b c d e f g h i"), ("a b c".into(), "g h i".into()));
        assert_eq!(thirds("a b c d"), ("a".into(), "d".into()));
    }

    #[test]
    fn every_pair_gets_the_chunk_variant_in_a_third_of_its_rounds() {
        for pairs in 1..=7 {
            for pair in 0..pairs {
                let chunks = (0..30).filter(|round| chunk_sample(*round, pair)).count();
                assert_eq!(chunks, 10, "pair {pair} of {pairs}");
            }
        }
    }
}
