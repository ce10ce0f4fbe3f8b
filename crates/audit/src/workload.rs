//! What the audit sends: the plan of requests, their prompts with canaries, and the mix of
//! behaviour that caused past leaks (over-long prompts, disconnects, pool-exhausting bursts,
//! prefixes shared across tenants).
//!
//! Prompt sizes are set in words of filler and converted to tokens with a ratio measured on the
//! server itself (see [`Calibration`]): the audit works against any deployment, whose tokenizer
//! it does not have.

use serde::Serialize;
use serde_json::{json, Value};

use super::canary::CanaryIndex;
use super::prose::{filler, CANARY_SENTENCES, INSTRUCTIONS};
use super::rng::Rng;

/// What a request is for; also the label the report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// A short prompt with canaries at its start, middle or end.
    Short,
    /// The same, a few hundred words long.
    Medium,
    /// A prompt within 90-99% of what the context window leaves after `max_tokens`.
    NearContext,
    /// A prompt longer than the context window: must be refused with 400.
    OverLong,
    /// A prompt that fits but with `max_tokens` over what the window leaves: must be refused.
    OverBudget,
    /// A stream the audit drops after a few events.
    Disconnect,
    /// One of many requests fired at once, most reserving nearly a whole context window.
    Burst,
    /// One of several concurrent requests of different tenants that share a long document
    /// before each tenant's own canary.
    SharedPrefix,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Short => "short",
            Scenario::Medium => "medium",
            Scenario::NearContext => "near_context",
            Scenario::OverLong => "over_long",
            Scenario::OverBudget => "over_budget",
            Scenario::Disconnect => "disconnect",
            Scenario::Burst => "burst",
            Scenario::SharedPrefix => "shared_prefix",
        }
    }

    /// Whether the server must refuse the request with 400 `context_length_exceeded`.
    pub fn must_be_refused(self) -> bool {
        matches!(self, Scenario::OverLong | Scenario::OverBudget)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// One request of the plan.
#[derive(Debug, Clone)]
pub struct ReqSpec {
    pub id: usize,
    pub tenant: usize,
    pub scenario: Scenario,
    pub endpoint: Endpoint,
    pub stream: bool,
    pub max_tokens: usize,
    /// Indices into the run's [`CanaryIndex`].
    pub canaries: Vec<usize>,
    /// Streams only: SSE events to read before dropping the connection (0: right after the
    /// response head).
    pub disconnect_after: Option<usize>,
    /// Whether to send it again alone after the run and compare.
    pub rerun: bool,
    /// The prompt's size in tokens when the server measured it (near-context prompts).
    pub prompt_tokens: Option<usize>,
    /// The prompt's size in tokens by the audit's own count ([`super::meter`]); None when
    /// the audit has no tokenizer.
    pub sent_tokens: Option<usize>,
    /// The context window of the model the request names (its tenant's).
    pub window: usize,
    pub body: Value,
    /// The prompt's token ids by the audit's count, for the own-prefix ledger; None: its
    /// bytes stand in.
    pub units: Option<crate::own_prefix::Units>,
}

/// A request alone, or a group sent all at once (a burst, a shared-prefix set).
#[derive(Debug)]
pub enum Unit {
    One(ReqSpec),
    Group(Vec<ReqSpec>),
}

impl Unit {
    pub fn specs(&self) -> &[ReqSpec] {
        match self {
            Unit::One(s) => std::slice::from_ref(s),
            Unit::Group(v) => v,
        }
    }

    pub fn specs_mut(&mut self) -> &mut [ReqSpec] {
        match self {
            Unit::One(s) => std::slice::from_mut(s),
            Unit::Group(v) => v,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Unit::One(_) => 1,
            Unit::Group(v) => v.len(),
        }
    }
}

/// Tokens per word of filler, measured on the server when it says how long a refused prompt
/// was (OpenAI, vLLM and pagewarden do), else guessed.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Calibration {
    pub tokens_per_word: f64,
    /// Tokens of a request with no filler (template, instruction, canary).
    pub base_tokens: usize,
    /// Whether the numbers were measured; if not, near-context sizes are estimates.
    pub measured: bool,
}

impl Calibration {
    /// A guess for servers that do not say: most BPE vocabularies spend 1.2-1.4 tokens on a
    /// word of common English.
    pub fn guess() -> Self {
        Calibration { tokens_per_word: 1.3, base_tokens: 64, measured: false }
    }
}

/// The model a tenant's requests name, as the plan sizes them.
#[derive(Debug, Clone, Copy)]
pub struct PlanTarget<'a> {
    pub model: &'a str,
    pub window: usize,
    pub calibration: Calibration,
}

/// What the plan is built from.
pub struct PlanParams<'a> {
    pub requests: usize,
    pub concurrency: usize,
    pub long_prompts: Option<usize>,
    /// One per tenant: the model its requests name (tenants may use different models).
    pub targets: Vec<PlanTarget<'a>>,
    /// Sent as `seed` in every request (greedy anyway; seeded so that a server that samples
    /// regardless stays repeatable).
    pub request_seed: u64,
}

pub struct Plan {
    pub units: Vec<Unit>,
    pub total: usize,
    /// Near-context prompts whose size the server confirmed to be within 90-99%.
    pub near_verified: usize,
    pub near_total: usize,
}

/// Where canaries sit in a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Start,
    Middle,
    End,
}

fn borrow(v: &[(String, Place)]) -> Vec<(&str, Place)> {
    v.iter().map(|(s, pl)| (s.as_str(), *pl)).collect()
}

/// A prompt: an optional shared document, then filler with canary sentences at their places,
/// then the instruction to repeat them.
fn compose(
    rng: &mut Rng,
    doc: Option<&str>,
    canaries: &[(&str, Place)],
    filler_seed: u64,
    filler_words: usize,
    completions: bool,
) -> String {
    let sentence = |rng: &mut Rng, c: &str| rng.pick(&CANARY_SENTENCES).replace("{}", c);
    let at = |p: Place| canaries.iter().filter(move |(_, q)| *q == p).map(|(c, _)| *c);
    // The filler comes from its own generator so that a prompt re-made with another length
    // differs only in its filler, not in every draw after it.
    let mut frng = Rng::new(filler_seed);
    let half = filler_words / 2;
    let first = filler(&mut frng, half);
    let second = filler(&mut frng, filler_words - half);
    let mut parts: Vec<String> = Vec::new();
    if let Some(d) = doc {
        parts.push(d.to_string());
    }
    parts.extend(at(Place::Start).map(|c| sentence(rng, c)).collect::<Vec<_>>());
    parts.push(first);
    parts.extend(at(Place::Middle).map(|c| sentence(rng, c)).collect::<Vec<_>>());
    parts.push(second);
    parts.extend(at(Place::End).map(|c| sentence(rng, c)).collect::<Vec<_>>());
    let plural = canaries.len() > 1;
    if completions {
        parts.push(format!("\n{}", INSTRUCTIONS[if plural { 3 } else { 2 }]));
    } else {
        parts.push(INSTRUCTIONS[if plural { 1 } else { 0 }].to_string());
    }
    parts.retain(|p| !p.is_empty());
    parts.join(" ")
}

/// The request body. Greedy (temperature 0), seeded, with log-probs, so that a clean re-run
/// must reproduce it token for token.
pub fn body(model: &str, endpoint: Endpoint, prompt: &str, max_tokens: usize, stream: bool, seed: u64) -> Value {
    let mut b = match endpoint {
        Endpoint::Chat => json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "logprobs": true,
        }),
        Endpoint::Completions => json!({"model": model, "prompt": prompt, "logprobs": 1}),
    };
    b["max_tokens"] = json!(max_tokens);
    b["temperature"] = json!(0);
    b["seed"] = json!(seed);
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

/// How many requests of each kind a run of `requests` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    pub near: usize,
    pub over: usize,
    pub bursts: usize,
    pub burst_size: usize,
    pub shared_groups: usize,
    pub shared_size: usize,
    pub disconnects: usize,
    pub regular: usize,
}

/// The mix: near-context prompts are few (each costs a whole context window of prefill), at
/// most one per hundred requests unless asked, at least one; about 6% over-long; a burst and a
/// shared-prefix group per hundred and per forty requests; 10% of the rest disconnect.
pub fn mix(requests: usize, concurrency: usize, tenants: usize, long_prompts: Option<usize>) -> Mix {
    let n = requests;
    let mut left = n;
    let mut take = |want: usize| {
        let t = want.min(left);
        left -= t;
        t
    };
    let near = take(long_prompts.unwrap_or((n / 100).max(1)));
    let over = take(if n >= 2 { (n * 6 / 100).max(1) } else { 0 });
    let burst_size = (2 * concurrency).clamp(4, 16);
    let bursts = if n >= 20 { (n / 100).max(1) } else { 0 };
    let bursts = take(bursts * burst_size) / burst_size;
    let shared_size = tenants.max(2);
    let shared_groups = if n >= 10 { (n / 40).max(1) } else { 0 };
    let shared_groups = take(shared_groups * shared_size) / shared_size;
    // What `take` could not place in whole groups goes back to the regular requests.
    let left = n - near - over - bursts * burst_size - shared_groups * shared_size;
    let disconnects = left / 10;
    Mix { near, over, bursts, burst_size, shared_groups, shared_size, disconnects, regular: left - disconnects }
}

/// Builds the plan. `measure` asks the server for a body's prompt length in tokens, as the
/// given tenant (without running it); `None` when the server does not say.
pub fn build_plan(
    p: &PlanParams,
    rng: &mut Rng,
    canaries: &mut CanaryIndex,
    measure: &mut dyn FnMut(usize, &Value) -> Option<usize>,
) -> Plan {
    let tenants = p.targets.len();
    let m = mix(p.requests, p.concurrency, tenants, p.long_prompts);
    let target_of = |tenant: usize| p.targets[tenant];
    let mut next_id = 0usize;
    let mut tenant_turn = rng.below(tenants.max(1));
    let mut next_tenant = || {
        tenant_turn = (tenant_turn + 1) % tenants.max(1);
        tenant_turn
    };
    let mut units: Vec<Unit> = Vec::new();
    let mut near_verified = 0usize;

    // Canaries: one to three, each at a distinct place.
    let draw_canaries = |rng: &mut Rng, canaries: &mut CanaryIndex, tenant: usize, id: usize, n: usize| {
        let mut places = [Place::Start, Place::Middle, Place::End];
        rng.shuffle(&mut places);
        (0..n).map(|i| (canaries.issue(rng, tenant, id), places[i])).collect::<Vec<_>>()
    };
    let texts = |canaries: &CanaryIndex, cs: &[(usize, Place)]| -> Vec<(String, Place)> {
        cs.iter().map(|(i, pl)| (canaries.get(*i).text.clone(), *pl)).collect()
    };

    let endpoint_for = |rng: &mut Rng| if rng.chance(0.25) { Endpoint::Completions } else { Endpoint::Chat };
    let spec = |id, tenant: usize, scenario, endpoint, stream, max_tokens, cs: &[(usize, Place)], body| ReqSpec {
        id,
        tenant,
        scenario,
        endpoint,
        stream,
        max_tokens,
        canaries: cs.iter().map(|(i, _)| *i).collect(),
        disconnect_after: None,
        rerun: false,
        prompt_tokens: None,
        sent_tokens: None,
        units: None,
        window: target_of(tenant).window,
        body,
    };

    // Regular requests and disconnects.
    for k in 0..m.regular + m.disconnects {
        let id = next_id;
        next_id += 1;
        let tenant = next_tenant();
        let disconnect = k >= m.regular;
        let scenario = if disconnect {
            Scenario::Disconnect
        } else if rng.chance(0.6) {
            Scenario::Short
        } else {
            Scenario::Medium
        };
        let words = match scenario {
            Scenario::Medium => rng.range(150, 400),
            _ => rng.range(10, 80),
        };
        let endpoint = endpoint_for(rng);
        let stream = disconnect || rng.chance(0.4);
        let max_tokens = if disconnect { rng.range(48, 200) } else { rng.range(16, 32) };
        let n = rng.range(1, 3);
        let cs = draw_canaries(rng, canaries, tenant, id, n);
        let t = texts(canaries, &cs);
        let fseed = rng.next_u64();
        let prompt = compose(rng, None, &borrow(&t), fseed, words, endpoint == Endpoint::Completions);
        let mut s = spec(
            id,
            tenant,
            scenario,
            endpoint,
            stream,
            max_tokens,
            &cs,
            body(target_of(tenant).model, endpoint, &prompt, max_tokens, stream, p.request_seed),
        );
        if disconnect {
            s.disconnect_after = Some(rng.range(0, 6));
        }
        // Every stream dropped after some events is re-run (its received prefix compared;
        // one dropped at once has none), every fourth of the rest: they are the bulk of the
        // plan and alike.
        s.rerun = if disconnect { s.disconnect_after != Some(0) } else { id.is_multiple_of(4) };
        units.push(Unit::One(s));
    }

    // Near-context prompts: sized until the server confirms 90-99% of the window left after
    // max_tokens (a few measurements; each only tokenizes).
    for _ in 0..m.near {
        let id = next_id;
        next_id += 1;
        let tenant = next_tenant();
        let PlanTarget { window, calibration: cal, .. } = target_of(tenant);
        let endpoint = endpoint_for(rng);
        let stream = rng.chance(0.5);
        let max_tokens = rng.range(16, 32);
        let budget = window.saturating_sub(max_tokens);
        let lower = (budget as f64 * 0.90).ceil() as usize;
        let target = (budget as f64 * (0.90 + 0.09 * rng.unit())).round() as usize;
        let n = rng.range(1, 3);
        let cs = draw_canaries(rng, canaries, tenant, id, n);
        let t = texts(canaries, &cs);
        let fseed = rng.next_u64();
        // The sentences around the canaries are drawn from their own seed too, so that every
        // re-sizing keeps them.
        let sseed = rng.next_u64();
        let mut words = (target.saturating_sub(cal.base_tokens) as f64 / cal.tokens_per_word) as usize;
        if !cal.measured {
            // Unmeasured: aim low so that the prompt still fits if words cost more tokens.
            words = (words as f64 * 0.9) as usize;
        }
        let make = |words: usize| {
            let prompt =
                compose(&mut Rng::new(sseed), None, &borrow(&t), fseed, words, endpoint == Endpoint::Completions);
            body(target_of(tenant).model, endpoint, &prompt, max_tokens, stream, p.request_seed)
        };
        let mut b = make(words);
        let mut measured = None;
        if cal.measured {
            for _ in 0..6 {
                let Some(tokens) = measure(tenant, &b) else { break };
                measured = Some(tokens);
                if (lower..=budget).contains(&tokens) {
                    break;
                }
                let delta = (target as f64 - tokens as f64) / cal.tokens_per_word;
                let step = if delta.abs() < 1.0 { delta.signum() } else { delta };
                words = (words as f64 + step).max(1.0) as usize;
                b = make(words);
                measured = None;
            }
        }
        if measured.is_some_and(|t| (lower..=budget).contains(&t)) {
            near_verified += 1;
        }
        let mut s = spec(id, tenant, Scenario::NearContext, endpoint, stream, max_tokens, &cs, b);
        s.prompt_tokens = measured;
        s.rerun = true;
        units.push(Unit::One(s));
    }

    // Over-long: the prompt alone over the window (while the body stays under 1 MB; most
    // servers refuse larger bodies before reading them), or a prompt that fits with max_tokens
    // over what is left.
    for _ in 0..m.over {
        let id = next_id;
        next_id += 1;
        let tenant = next_tenant();
        let PlanTarget { window, calibration: cal, .. } = target_of(tenant);
        let endpoint = endpoint_for(rng);
        let stream = rng.chance(0.3);
        let n = rng.range(1, 3);
        let cs = draw_canaries(rng, canaries, tenant, id, n);
        let t = texts(canaries, &cs);
        let fseed = rng.next_u64();
        let target = (window as f64 * (1.05 + 0.45 * rng.unit())) as usize;
        // Words are sized as if each cost at most one token when unmeasured, so that the prompt
        // is over the window whatever the real ratio.
        let per_word = if cal.measured { cal.tokens_per_word } else { 1.0 };
        let words = (target as f64 / per_word) as usize + 16;
        let prompt_alone = words * 8 < 900_000 && rng.chance(0.6);
        // Over budget: max_tokens alone fills the window, unless the server measures the prompt
        // (below), when the request is made exactly one token too long.
        let (scenario, words, max_tokens) = if prompt_alone {
            (Scenario::OverLong, words, rng.range(16, 32))
        } else {
            (Scenario::OverBudget, rng.range(20, 200), window.max(1))
        };
        let prompt = compose(rng, None, &borrow(&t), fseed, words, endpoint == Endpoint::Completions);
        let mut b = body(target_of(tenant).model, endpoint, &prompt, max_tokens, stream, p.request_seed);
        let mut max_tokens = max_tokens;
        if scenario == Scenario::OverBudget && cal.measured {
            if let Some(tokens) = measure(tenant, &b) {
                // Exactly one token over: an off-by-one at the door shows here.
                max_tokens = window + 1 - tokens.min(window);
                b["max_tokens"] = json!(max_tokens);
            }
        }
        let mut s = spec(id, tenant, scenario, endpoint, stream, max_tokens, &cs, b);
        s.rerun = true;
        units.push(Unit::One(s));
    }

    // Bursts: all members at once; two in three stream with nearly the whole window as
    // max_tokens (reserved up front, so a few fill the pool) and are dropped after a few
    // events; the rest are ordinary short requests that must wait for pages or be refused.
    for _ in 0..m.bursts {
        let mut members = Vec::new();
        for j in 0..m.burst_size {
            let id = next_id;
            next_id += 1;
            let tenant = next_tenant();
            let PlanTarget { window, calibration: cal, .. } = target_of(tenant);
            let endpoint = endpoint_for(rng);
            let words = rng.range(10, 60);
            let cs = draw_canaries(rng, canaries, tenant, id, 1);
            let t = texts(canaries, &cs);
            let fseed = rng.next_u64();
            let prompt = compose(rng, None, &borrow(&t), fseed, words, endpoint == Endpoint::Completions);
            let hog = j % 3 != 2;
            let (stream, max_tokens) = if hog {
                // A generous estimate of the prompt, so that prompt + max_tokens fits.
                let est = cal.base_tokens + (words as f64 * cal.tokens_per_word.max(1.0) * 1.5) as usize + 32;
                (true, window.saturating_sub(est).max(16))
            } else {
                (rng.chance(0.5), rng.range(16, 32))
            };
            let mut s = spec(
                id,
                tenant,
                Scenario::Burst,
                endpoint,
                stream,
                max_tokens,
                &cs,
                body(target_of(tenant).model, endpoint, &prompt, max_tokens, stream, p.request_seed),
            );
            if hog {
                s.disconnect_after = Some(rng.range(1, 6));
            }
            s.rerun = true;
            members.push(s);
        }
        units.push(Unit::Group(members));
    }

    // Shared prefixes: one document, one request per tenant (two when there is one tenant),
    // each with its own canary after the document; all re-run alone later.
    for _ in 0..m.shared_groups {
        let doc_words = rng.range(150, 400);
        let doc = filler(rng, doc_words);
        let endpoint = endpoint_for(rng);
        let stream = rng.chance(0.4);
        let max_tokens = rng.range(16, 32);
        let mut members = Vec::new();
        for j in 0..m.shared_size {
            let id = next_id;
            next_id += 1;
            let tenant = if tenants >= m.shared_size { j } else { next_tenant() };
            let cs = draw_canaries(rng, canaries, tenant, id, 1)
                .into_iter()
                .map(|(c, _)| (c, Place::End))
                .collect::<Vec<_>>();
            let t = texts(canaries, &cs);
            let fseed = rng.next_u64();
            let prompt = compose(rng, Some(&doc), &borrow(&t), fseed, 0, endpoint == Endpoint::Completions);
            let mut s = spec(
                id,
                tenant,
                Scenario::SharedPrefix,
                endpoint,
                stream,
                max_tokens,
                &cs,
                body(target_of(tenant).model, endpoint, &prompt, max_tokens, stream, p.request_seed),
            );
            s.rerun = true;
            members.push(s);
        }
        units.push(Unit::Group(members));
    }

    rng.shuffle(&mut units);
    // Near-context prompts take longest; starting them in the first half lets the rest of the
    // run overlap them instead of waiting for them at the end.
    let half = units.len() / 2;
    for i in half..units.len() {
        if matches!(&units[i], Unit::One(s) if s.scenario == Scenario::NearContext) {
            let j = rng.below(half.max(1));
            units.swap(i, j);
        }
    }
    let total = units.iter().map(Unit::len).sum();
    Plan { units, total, near_verified, near_total: m.near }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_adds_up_and_bounds_long_prompts() {
        for (n, c, t) in [(40, 4, 3), (200, 8, 3), (20_000, 16, 5), (1, 1, 1), (7, 2, 2), (0, 8, 3)] {
            let m = mix(n, c, t, None);
            let sum =
                m.near + m.over + m.bursts * m.burst_size + m.shared_groups * m.shared_size + m.disconnects + m.regular;
            assert_eq!(sum, n, "{n}: {m:?}");
            if n > 0 {
                assert!(m.near >= 1 && m.near <= n.div_ceil(100), "{n}: {m:?}");
            }
        }
        assert_eq!(mix(40, 4, 3, Some(3)).near, 3);
    }

    #[test]
    fn a_plan_has_every_kind_and_canaries_in_every_prompt() {
        let target = PlanTarget {
            model: "m",
            window: 2048,
            calibration: Calibration { tokens_per_word: 1.25, base_tokens: 40, measured: true },
        };
        let params =
            PlanParams { requests: 120, concurrency: 4, long_prompts: None, targets: vec![target; 3], request_seed: 1 };
        let mut idx = CanaryIndex::new();
        // A stand-in tokenizer: 1.25 tokens per word plus the template.
        let mut measure = |_tenant: usize, b: &Value| {
            let text = b["messages"][0]["content"].as_str().or(b["prompt"].as_str()).unwrap_or_default();
            Some(40 + (text.split_whitespace().count() as f64 * 1.25) as usize)
        };
        let plan = build_plan(&params, &mut Rng::new(5), &mut idx, &mut measure);
        assert_eq!(plan.total, 120);
        assert_eq!(plan.near_total, 1);
        assert_eq!(plan.near_verified, 1);
        let all: Vec<&ReqSpec> = plan
            .units
            .iter()
            .flat_map(|u| match u {
                Unit::One(s) => vec![s],
                Unit::Group(v) => v.iter().collect(),
            })
            .collect();
        let mut ids: Vec<usize> = all.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 120);
        for s in &all {
            assert!(!s.canaries.is_empty());
            let body = s.body.to_string();
            for &c in &s.canaries {
                assert!(body.contains(&idx.get(c).text), "{:?}", s.scenario);
                assert_eq!(idx.get(c).tenant, s.tenant);
            }
            if s.scenario == Scenario::NearContext {
                let t = s.prompt_tokens.unwrap_or(0);
                let budget = 2048 - s.max_tokens;
                assert!(t * 100 >= budget * 90 && t <= budget, "{t} of {budget}");
            }
        }
        for sc in [Scenario::Short, Scenario::Medium, Scenario::OverLong, Scenario::Burst, Scenario::SharedPrefix] {
            assert!(all.iter().any(|s| s.scenario == sc), "{sc:?}");
        }
        for t in 0..3 {
            assert!(all.iter().any(|s| s.tenant == t));
        }
        // A shared-prefix group: one document, one request per tenant.
        let group = plan
            .units
            .iter()
            .find_map(|u| match u {
                Unit::Group(v) if v[0].scenario == Scenario::SharedPrefix => Some(v),
                _ => None,
            })
            .expect("a shared-prefix group");
        let mut tenants: Vec<usize> = group.iter().map(|s| s.tenant).collect();
        tenants.sort_unstable();
        assert_eq!(tenants, vec![0, 1, 2]);
        let text = |s: &ReqSpec| {
            s.body["messages"][0]["content"].as_str().or(s.body["prompt"].as_str()).unwrap_or_default().to_string()
        };
        let a = text(&group[0]);
        let b = text(&group[1]);
        let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!(common > 500, "shared prefix of {common} bytes");
    }
}
