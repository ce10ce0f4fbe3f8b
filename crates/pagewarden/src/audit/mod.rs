//! `pagewarden audit`: drives a running deployment as several tenants at once and reports every
//! place a secret crossed a tenant boundary.
//!
//! The run, in order:
//! 1. Discover the model (`/v1/models`), the context window (given, listed, or read from the
//!    server's refusal of an impossible `max_tokens`) and how many tokens a word of filler costs
//!    (the same refusal states the prompt's length; nothing is computed for it).
//! 2. Scrape every `/metrics` endpoint.
//! 3. Plan the requests ([`workload`]): each carries canaries only its tenant knows
//!    ([`canary`]), with over-long prompts, disconnects, pool-exhausting bursts and shared
//!    prefixes mixed in, and send them with `concurrency` clients.
//! 4. Scan every response (text and raw bytes) for every other request's canaries.
//! 5. Re-send a subset alone, one at a time, and compare tokens and log-probs: the engine is
//!    bit-exact under batching, so any difference is a divergence.
//! 6. The timing probe ([`timing`]): can one tenant tell another's cached prefixes from fresh
//!    ones by time to first token? One request at a time, nothing else in flight.
//! 7. Wait for every KV page gauge to return to zero; scrape again; report ([`report`]).
//!
//! Pass: no canary in another request's response, no divergence, no page left in use, no
//! over-long prompt accepted, no prefix-cache hit across tenants, no timing side channel.
//! Errors (including those caused by injected faults) are counted and reported, not failures.

mod canary;
mod client;
mod meter;
mod prom;
mod proxy;
mod report;
mod rerun;
mod rng;
mod spawn;
mod svg;
mod tenants;
mod timing;
mod workload;

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use self::canary::CanaryIndex;
use self::client::{Client, Exchange, Outcome};
use self::meter::Meter;
use self::report::{kind, Finding, MetricsReport, Report, RequestRow};
use self::workload::{Calibration, Endpoint, PlanParams, ReqSpec, Unit};

pub use self::report::Counts;
/// Seeded filler prose, for other tools' prompts (`bench prefix-cache`).
pub(crate) use self::rng::Rng;
pub(crate) use self::workload::filler;

/// One tenant the audit acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKey {
    pub name: String,
    pub key: String,
}

/// Reads the tenants file (`[[tenants]]` entries with `name` and `key`).
pub fn load_tenants(path: &Path) -> Result<Vec<TenantKey>> {
    tenants::load(path)
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Base URL of the deployment's OpenAI API.
    pub url: String,
    pub tenants: Vec<TenantKey>,
    pub requests: usize,
    pub concurrency: usize,
    pub seed: u64,
    /// Where to write report.md, report.json and report.svg.
    pub report_dir: Option<PathBuf>,
    /// None: discovered from the server.
    pub context_window: Option<usize>,
    /// `/metrics` URLs of the gateway (and workers); empty: `{url}/metrics`.
    pub metrics_urls: Vec<String>,
    /// Bearer token for scraping them (the gateway's `[metrics] token_file`).
    pub metrics_token: Option<String>,
    /// Draw a progress bar on stderr even when it is not a terminal.
    pub progress: bool,
    /// Near-context prompts; None: one per hundred requests, at least one.
    pub long_prompts: Option<usize>,
    /// Re-runs in flight at once during the isolated pass, always all of one tenant.
    pub rerun_concurrency: usize,
    /// Samples per class of the timing probe (0: no probe; it needs two tenants).
    pub timing_probe: usize,
    /// A GGUF file whose tokenizer and chat template count the prompts; None: the target's
    /// tokenizer endpoint, else the default model when the target serves it.
    pub tokenizer: Option<PathBuf>,
    /// Whether the target's outputs are bit-identical alone and in a batch; None: as the
    /// target declares (`batch_invariant` in `/v1/models`).
    pub batch_invariant: Option<bool>,
}

impl AuditOptions {
    /// Options with the CLI's defaults (200 requests, 8 clients, a random seed).
    pub fn new(url: impl Into<String>, tenants: Vec<TenantKey>) -> Self {
        AuditOptions {
            url: url.into(),
            tenants,
            requests: 200,
            concurrency: 8,
            seed: rng::random_seed(),
            report_dir: None,
            context_window: None,
            metrics_urls: Vec::new(),
            metrics_token: None,
            progress: false,
            long_prompts: None,
            rerun_concurrency: 1,
            timing_probe: timing::DEFAULT_SAMPLES,
            tokenizer: None,
            batch_invariant: None,
        }
    }
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct AuditOutcome {
    pub passed: bool,
    /// A few lines for stdout (no prompt or output text).
    pub summary: String,
    pub counts: Counts,
    /// Every finding, failing or not, as in report.json.
    pub findings: Vec<report::Finding>,
}

/// Calls from the run to whoever started it (`--spawn` injects faults on its own thread and
/// tells the report what it did).
pub trait AuditHooks: Sync {
    fn on_progress(&self, _done: usize, _total: usize) {}
    /// The load phase is over; next come the isolated re-runs, the timing probe and the wait
    /// for pages to return to zero. A spawner stops every fault here: the re-runs are the
    /// reference the load is compared with, and the probe times single requests.
    fn on_load_done(&self) {}
    /// `/metrics` URLs to read now, when they change during the run (a restarted worker gets a
    /// new port); empty: the options' URLs.
    fn metrics_urls(&self) -> Vec<String> {
        vec![]
    }
    fn fault_log(&self) -> Vec<String> {
        vec![]
    }
}

pub struct NoHooks;

impl AuditHooks for NoHooks {}

/// `pagewarden audit`.
#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    /// Base URL of the deployment's OpenAI API, e.g. http://127.0.0.1:8080
    #[arg(long)]
    pub url: Option<String>,
    /// TOML file of tenants to act as: `[[tenants]]` entries with `name` and `key`.
    #[arg(long)]
    pub tenants: Option<PathBuf>,
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Concurrent clients (bursts briefly exceed it).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Seed of everything random (canaries, prompts, the mix); default: random, printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Directory for report.md, report.json and report.svg.
    #[arg(long = "report")]
    pub report: Option<PathBuf>,
    /// The deployment's context window in tokens; default: asked from the server.
    #[arg(long)]
    pub context_window: Option<usize>,
    /// A /metrics URL to check (repeatable); default: URL/metrics.
    #[arg(long = "metrics")]
    pub metrics: Vec<String>,
    /// A file holding the bearer token for the gateway's /metrics (its `[metrics] token_file`);
    /// not needed for a `[metrics] listen` address given with --metrics.
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,
    /// Prompts within 90-99% of the context window (each costs a whole window of prefill);
    /// default: one per hundred requests, at least one.
    #[arg(long)]
    pub long_prompts: Option<usize>,
    /// Re-runs in flight at once in the isolated pass. They are always all of one tenant (no
    /// other tenant's request is in flight), so a leak into a reference run can only be the
    /// tenant's own; more than 1 batches them, which makes long runs several times faster.
    #[arg(long, default_value_t = 1)]
    pub rerun_concurrency: usize,
    /// Samples per class of the timing probe, run after the re-runs with nothing else in
    /// flight: tenant B times prefixes tenant A has cached against fresh ones (ROC AUC, target
    /// <= 0.6) and tenant A its own hits; 0 skips it. Needs two tenants.
    #[arg(long, default_value_t = timing::DEFAULT_SAMPLES)]
    pub timing_probe: usize,
    /// A GGUF model file whose tokenizer and chat template the audit counts prompts with (it
    /// never takes a prompt's length from the answer it judges). Default: the target's
    /// tokenizer endpoint (vLLM's or llama-server's `/tokenize`), else the default model's file
    /// when the target serves it; with neither, lengths are estimates.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Whether the target's outputs are bit-identical alone and batched: then any token or
    /// log-prob difference from the isolated re-run is a divergence (else log-probs may differ
    /// by 1e-3). Default: what the target declares (`batch_invariant` in `/v1/models`).
    #[arg(long)]
    pub batch_invariant: Option<bool>,
    /// Draw the progress bar even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,
    /// Start a deployment on loopback (gateway, two prefill and two decode workers, a
    /// fault-injecting proxy on each decode worker's KV port) and audit it; `--url` and
    /// `--tenants` are then not needed.
    #[arg(long)]
    pub spawn: bool,
    /// With --spawn: faults to inject, comma-separated, from kill, corrupt, drop, duplicate,
    /// reorder, delay, stall (or none); default: all.
    #[arg(long)]
    pub faults: Option<String>,
    /// With --spawn: how many tenants to create.
    #[arg(long, default_value_t = 3)]
    pub tenant_count: usize,
}

impl AuditArgs {
    pub fn options(&self, url: String, tenants: Vec<TenantKey>) -> AuditOptions {
        let mut o = AuditOptions::new(url, tenants);
        o.requests = self.requests;
        o.concurrency = self.concurrency;
        if let Some(s) = self.seed {
            o.seed = s;
        }
        o.report_dir = self.report.clone();
        o.context_window = self.context_window;
        o.metrics_urls = self.metrics.clone();
        o.progress = self.progress;
        o.long_prompts = self.long_prompts;
        o.rerun_concurrency = self.rerun_concurrency;
        o.timing_probe = self.timing_probe;
        o.tokenizer = self.tokenizer.clone();
        o.batch_invariant = self.batch_invariant;
        o
    }
}

/// `pagewarden audit --url ... --tenants ...`: runs, prints the summary, and fails (non-zero
/// exit) when the audit does.
pub fn run(args: &AuditArgs) -> Result<()> {
    if args.spawn {
        return spawn::run(args, args.tenant_count, args.faults.as_deref());
    }
    let url = args.url.clone().context("--url is required")?;
    let path = args.tenants.as_deref().context("--tenants FILE is required")?;
    let mut opts = args.options(url, load_tenants(path)?);
    if let Some(f) = &args.metrics_token_file {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading --metrics-token-file {}", f.display()))?;
        opts.metrics_token = Some(text.trim().to_string());
    }
    conclude(&run_audit(&opts, &NoHooks)?)
}

/// Prints the summary; an error (non-zero exit) naming the failing kinds when the audit failed.
fn conclude(outcome: &AuditOutcome) -> Result<()> {
    print!("{}", outcome.summary);
    if !outcome.passed {
        let mut kinds: Vec<&str> = outcome.findings.iter().filter(|f| f.fails).map(|f| f.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        bail!("the audit failed: {} failing findings ({})", outcome.counts.failing_findings, kinds.join(", "));
    }
    Ok(())
}

/// Time limit of one request: past the server's own request deadline (300 s by default), so
/// that the server, not the audit, ends a stalled request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(330);
/// How long the page gauges get to return to zero after the run.
const PAGES_WAIT: Duration = Duration::from_secs(30);
/// Rounds of re-sending, under load, the re-run requests whose answer carried nothing to
/// compare.
const TOP_UP_ROUNDS: usize = 2;
/// Bytes of response quoted on each side of a leaked canary.
const QUOTE: usize = 60;
/// `max_tokens` of a length probe: over any context window, so nothing is ever computed.
const PROBE_MAX_TOKENS: u64 = 1 << 30;

/// The first number after `pat` in `msg`, or the last one before it.
fn number_near(msg: &str, pat: &str, after: bool) -> Option<usize> {
    let i = msg.find(pat)?;
    if after {
        let rest = &msg[i + pat.len()..];
        let digits: String =
            rest.chars().skip_while(|c| !c.is_ascii_digit()).take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    } else {
        let head = msg[..i].trim_end();
        let digits: String = head.chars().rev().take_while(char::is_ascii_digit).collect();
        digits.chars().rev().collect::<String>().parse().ok()
    }
}

/// (context window, prompt tokens) from a context-length refusal, in the wordings of
/// pagewarden ("... is 8192 tokens; the request needs N (P in the prompt + M to generate)"),
/// OpenAI and vLLM ("(P in the messages, M in the completion)", "resulted in P tokens").
fn parse_lengths(msg: &str) -> (Option<usize>, Option<usize>) {
    let context = number_near(msg, "maximum context length is", true);
    let prompt = number_near(msg, " in the prompt", false)
        .or_else(|| number_near(msg, " in the messages", false))
        .or_else(|| number_near(msg, "resulted in", true));
    (context, prompt)
}

/// Sends `body` with an impossible `max_tokens`; the refusal states the lengths.
fn probe(client: &Client, key: &str, endpoint: &str, body: &Value) -> (Option<usize>, Option<usize>) {
    let mut b = body.clone();
    b["max_tokens"] = json!(PROBE_MAX_TOKENS);
    b["stream"] = json!(false);
    if let Some(o) = b.as_object_mut() {
        o.remove("stream_options");
    }
    match client.post(endpoint, key, &b) {
        Ok((400, text)) => {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            parse_lengths(v["error"]["message"].as_str().unwrap_or_default())
        }
        _ => (None, None),
    }
}

fn model_name(client: &Client, key: &str) -> Result<(String, Value)> {
    let (status, body) = client.get("/v1/models", Some(key)).context("the deployment does not answer")?;
    if status != 200 {
        bail!("GET /v1/models answered {status} (is the first tenant's key right?)");
    }
    let v: Value = serde_json::from_str(&body).context("GET /v1/models: not JSON")?;
    let id = v["data"][0]["id"].as_str().context("GET /v1/models lists no model")?.to_string();
    Ok((id, v))
}

/// The context window: from `/v1/models` when the server lists it, else from a probe.
fn discover_window(client: &Client, key: &str, model: &str, models: &Value) -> Result<usize> {
    if let Some(n) = listed_window(models, model) {
        return Ok(n);
    }
    let body = workload::body(model, Endpoint::Chat, "Say hello.", 1, false, 0);
    match probe(client, key, Endpoint::Chat.path(), &body) {
        (Some(n), _) => Ok(n),
        _ => bail!("cannot find the deployment's context window: pass --context-window N"),
    }
}

/// The window `/v1/models` states for `model`: the OpenAI-style fields of pagewarden, vLLM and
/// SGLang, else llama-server's `meta.n_ctx` (what a slot holds; `n_ctx_train`, the model's
/// training length, is only a last resort: llama-server serves `-c`, often far less).
fn listed_window(models: &Value, model: &str) -> Option<usize> {
    let m = models["data"].as_array()?.iter().find(|m| m["id"] == model)?;
    ["context_length", "context_window", "max_model_len", "max_context_length"]
        .iter()
        .find_map(|k| m[*k].as_u64())
        .or_else(|| m["meta"]["n_ctx"].as_u64())
        .or_else(|| m["meta"]["n_ctx_train"].as_u64())
        .map(|n| n as usize)
}

/// Tokens per filler word, from two prompts (no filler, 1,000 words) counted by the audit's own
/// tokenizer, else by the server's refusals; also the context window the server states, if it
/// does.
fn calibrate(client: &Client, key: &str, model: &str, meter: &Meter) -> (Calibration, Option<usize>) {
    let mut rng = Rng::new(0x5eed);
    let make = |words: &str| {
        let prompt = format!("The secret code is kavorimu-tezulani-4821. {words} Repeat the secret code exactly.");
        workload::body(model, Endpoint::Chat, &prompt, 1, false, 0)
    };
    let text = workload::filler(&mut rng, 1000);
    let (window, a) = probe(client, key, Endpoint::Chat.path(), &make(""));
    let (a, b) = match (meter.count(&make("")), meter.count(&make(&text))) {
        (Some(a), Some(b)) => (Some(a), Some(b)),
        _ => (a, probe(client, key, Endpoint::Chat.path(), &make(&text)).1),
    };
    let cal = match (a, b) {
        (Some(a), Some(b)) if b > a => {
            Calibration { tokens_per_word: (b - a) as f64 / 1000.0, base_tokens: a, measured: true }
        }
        _ => Calibration::guess(),
    };
    (cal, window)
}

/// The progress bar: `\r[#####     ] 120/200` on stderr.
struct Progress {
    on: bool,
    total: AtomicUsize,
    done: AtomicUsize,
    last: Mutex<Option<Instant>>,
}

impl Progress {
    fn tick<H: AuditHooks + ?Sized>(&self, hooks: &H) {
        let done = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        let total = self.total.load(Ordering::SeqCst);
        hooks.on_progress(done, total);
        if !self.on {
            return;
        }
        let mut last = lock(&self.last);
        // At most ten redraws a second, but always the last one.
        if done < total && last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
            return;
        }
        *last = Some(Instant::now());
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(width).min(width);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r[{}{}] {done}/{total}", "#".repeat(filled), " ".repeat(width - filled));
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.on {
            eprintln!();
        }
    }
}

/// What the checks need besides the exchange itself.
struct Ctx<'a> {
    opts: &'a AuditOptions,
    canaries: &'a CanaryIndex,
    window: usize,
}

impl Ctx<'_> {
    fn tenant(&self, i: usize) -> &str {
        &self.opts.tenants[i].name
    }

    /// Canary hits, over-long acceptance and odd answers of one exchange.
    fn examine(&self, spec: &ReqSpec, ex: &Exchange, rerun: bool) -> Vec<Finding> {
        let mut out: Vec<Finding> = Vec::new();
        let base = |k: &'static str, fails: bool, detail: String| Finding {
            kind: k,
            fails,
            request: Some(spec.id),
            tenant: Some(self.tenant(spec.tenant).to_string()),
            scenario: Some(spec.scenario.name()),
            detail,
            ..Default::default()
        };
        let pass = if rerun { "re-run " } else { "" };
        let text_place = if spec.stream { "stream text" } else { "response text" };
        // One finding per foreign canary: its first failing hit, else its first excused one. An
        // excused fragment must never hide a later whole copy of the same canary.
        let mut reported: Vec<(usize, usize)> = Vec::new(); // (canary, index in `out`)
        for (text, place) in [(&ex.text, text_place), (&ex.raw, "raw body")] {
            for h in self.canaries.scan(text) {
                let c = self.canaries.get(h.canary);
                if c.request == spec.id {
                    continue;
                }
                let echo = self.canaries.echoes_own(text, &h, &spec.canaries);
                let earlier = reported.iter().find(|(k, _)| *k == h.canary).map(|(_, i)| *i);
                if earlier.is_some_and(|i| out[i].fails || echo) {
                    continue;
                }
                let cross_tenant = c.tenant != spec.tenant;
                let k = if echo {
                    kind::FRAGMENT_IN_OWN_CANARY
                } else if cross_tenant {
                    kind::CROSS_TENANT_CANARY
                } else {
                    kind::CROSS_REQUEST_CANARY
                };
                let what = if h.whole { "whole" } else { "as a fragment" };
                let why = if echo {
                    format!(
                        ", inside a misspelt copy of the request's own canary (within {} edits)",
                        canary::ECHO_EDITS
                    )
                } else {
                    String::new()
                };
                let mut f = base(
                    k,
                    !echo,
                    format!(
                        "the canary of tenant {} (request {}) appeared {what} in the {pass}{place}{why}",
                        self.tenant(c.tenant),
                        c.request
                    ),
                );
                f.canary = Some(c.text.clone());
                f.canary_owner = Some(self.tenant(c.tenant).to_string());
                f.canary_request = Some(c.request);
                f.location = Some(format!("{pass}{place}"));
                f.context = Some(canary::context(text, h.start, h.end, QUOTE));
                f.whole = Some(h.whole);
                match earlier {
                    // An excused hit came first: this failing one takes its place.
                    Some(i) => out[i] = f,
                    None => {
                        reported.push((h.canary, out.len()));
                        out.push(f);
                    }
                }
            }
        }
        let accepted = ex.status == Some(200);
        if spec.scenario.must_be_refused() {
            let refused_right = ex.status == Some(400) && ex.error_kind.as_deref() == Some("context_length_exceeded");
            // Over the window by the audit's own count; planned over it when the audit cannot
            // count (the plan then leaves a wide margin). Never by the server's `usage`: the
            // incident's server said its placeholder prompt was one token long.
            let fits = spec.sent_tokens.is_some_and(|n| n + spec.max_tokens <= self.window);
            let sent = |n: Option<usize>| n.map_or("unknown".into(), |n| n.to_string());
            if accepted && !fits {
                out.push(base(
                    kind::OVERLONG_ACCEPTED,
                    true,
                    format!(
                        "a request over the {}-token window (prompt {} tokens by the audit's count, max_tokens {}) \
                         was accepted with HTTP 200; the server reported {} prompt tokens",
                        self.window,
                        sent(spec.sent_tokens),
                        spec.max_tokens,
                        ex.prompt_tokens.map_or("no".into(), |p| p.to_string())
                    ),
                ));
            } else if accepted {
                out.push(base(
                    kind::OVERLONG_OTHER_ANSWER,
                    false,
                    format!(
                        "planned over the window, but the audit's own count ({} prompt tokens + max_tokens {}) fits \
                         the {}-token window",
                        sent(spec.sent_tokens),
                        spec.max_tokens,
                        self.window
                    ),
                ));
            } else if !refused_right {
                out.push(base(
                    kind::OVERLONG_OTHER_ANSWER,
                    false,
                    format!(
                        "expected 400 context_length_exceeded, got {} {}",
                        ex.status.map_or("no answer".into(), |s| s.to_string()),
                        ex.error_kind.as_deref().unwrap_or(ex.outcome.name())
                    ),
                ));
            }
        } else if ex.status == Some(400) {
            out.push(base(
                kind::UNEXPECTED_400,
                false,
                format!("a request that fits was refused: {}", ex.error_kind.as_deref().unwrap_or("-")),
            ));
        }
        if let (Some(reported), Some(sent)) = (ex.prompt_tokens, spec.sent_tokens) {
            // `sent_tokens` is an exact count (a tokenizer's); with none, this is not checked.
            if (reported as usize) < sent {
                out.push(base(
                    kind::PROMPT_UNDERCOUNTED,
                    true,
                    format!(
                        "the server reported {reported} prompt tokens for a prompt of {sent} tokens by the audit's \
                         count: it did not run the prompt it was sent"
                    ),
                ));
            }
        }
        if ex.outcome == Outcome::Ok && ex.finish_reason.as_deref() == Some("length") {
            if let Some(n) = ex.completion_tokens.filter(|n| (*n as usize) < spec.max_tokens) {
                out.push(base(
                    kind::SHORT_LENGTH,
                    false,
                    format!("finish_reason `length` after {n} of max_tokens {} tokens", spec.max_tokens),
                ));
            }
        }
        out
    }

    fn row(&self, spec: &ReqSpec, ex: &Exchange, phase: &'static str) -> RequestRow {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        RequestRow {
            id: spec.id,
            phase,
            tenant: self.tenant(spec.tenant).to_string(),
            scenario: spec.scenario.name(),
            endpoint: match spec.endpoint {
                Endpoint::Chat => "chat",
                Endpoint::Completions => "completions",
            },
            stream: spec.stream,
            max_tokens: spec.max_tokens,
            canaries: spec.canaries.len(),
            disconnect_after: spec.disconnect_after,
            status: ex.status,
            outcome: ex.outcome,
            error_kind: ex.error_kind.clone(),
            finish_reason: ex.finish_reason.clone(),
            prompt_tokens: ex.prompt_tokens.or(spec.prompt_tokens.map(|p| p as u64)),
            completion_tokens: ex.completion_tokens,
            cached_tokens: ex.cached_tokens,
            events: ex.events,
            start_ms: ms(ex.started),
            ttft_ms: ex.ttft.map(ms),
            total_ms: ms(ex.total),
        }
    }
}

/// Scrapes by URL.
type Scrapes = BTreeMap<String, std::result::Result<Vec<prom::Sample>, String>>;

/// Scrapes `url`: the samples, or why not.
fn scrape(client: &Client, url: &str, token: Option<&str>) -> std::result::Result<Vec<prom::Sample>, String> {
    match client.get(url, token) {
        Ok((200, body)) => Ok(prom::parse(&body)),
        Ok((status, _)) => Err(format!("HTTP {status}")),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Whether the target's outputs are bit-identical alone and batched: as told, else as its
/// `/v1/models` entry declares (`batch_invariant`), else not assumed.
fn batch_invariant(opts: &AuditOptions, models: &Value, model: &str) -> bool {
    opts.batch_invariant.unwrap_or_else(|| {
        models["data"]
            .as_array()
            .and_then(|d| d.iter().find(|m| m["id"] == model))
            .and_then(|m| m["batch_invariant"].as_bool())
            .unwrap_or(false)
    })
}

/// Runs the audit against `opts.url`.
pub fn run_audit(opts: &AuditOptions, hooks: &dyn AuditHooks) -> Result<AuditOutcome> {
    if opts.tenants.is_empty() {
        bail!("the audit needs at least one tenant");
    }
    if opts.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let started_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let client = Client::new(&opts.url, REQUEST_TIMEOUT);
    let first_key = &opts.tenants[0].key;
    let (model, models) = model_name(&client, first_key)?;
    let metrics_urls = || -> Vec<String> {
        let from_hooks = hooks.metrics_urls();
        if !from_hooks.is_empty() {
            from_hooks
        } else if opts.metrics_urls.is_empty() {
            vec![format!("{}/metrics", opts.url.trim_end_matches('/'))]
        } else {
            opts.metrics_urls.clone()
        }
    };
    let before: Scrapes = metrics_urls()
        .into_iter()
        .map(|u| {
            let r = scrape(&client, &u, opts.metrics_token.as_deref());
            (u, r)
        })
        .collect();

    let window = match opts.context_window {
        Some(w) => w,
        None => discover_window(&client, first_key, &model, &models)?,
    };
    let meter = Meter::discover(&client, first_key, &model, opts.tokenizer.as_deref())?;
    let (calibration, stated) = calibrate(&client, first_key, &model, &meter);
    let mut notes = Vec::new();
    if let Some(w) = stated.filter(|w| *w != window) {
        // Near-context prompts sized for the wrong window are refused (or are not near it).
        notes.push(format!("the server states a context window of {w} tokens, not the {window} the audit was given"));
    }
    if !meter.exact() {
        notes.push(
            "the audit has no tokenizer for this model (pass --tokenizer MODEL.gguf): over-long requests are \
             judged by their planned size and reported prompt_tokens are not checked"
                .into(),
        );
    }
    if !calibration.measured {
        notes.push(
            "the server does not state prompt lengths in its refusals: near-context prompt sizes are estimates".into(),
        );
    }

    let mut rng = Rng::new(opts.seed);
    let mut canaries = CanaryIndex::new();
    let params = PlanParams {
        requests: opts.requests,
        concurrency: opts.concurrency,
        tenants: opts.tenants.len(),
        long_prompts: opts.long_prompts,
        context_window: window,
        model: &model,
        request_seed: opts.seed & 0x7fff_ffff,
        calibration,
    };
    let mut measure_calls = 0usize;
    let mut measure = |b: &Value| {
        if meter.exact() {
            return meter.count(b);
        }
        measure_calls += 1;
        let endpoint = if b.get("messages").is_some() { Endpoint::Chat } else { Endpoint::Completions };
        probe(&client, first_key, endpoint.path(), b).1
    };
    let mut plan = workload::build_plan(&params, &mut rng, &mut canaries, &mut measure);
    // Every prompt counted by the audit itself, before anything is sent.
    for spec in plan.units.iter_mut().flat_map(Unit::specs_mut) {
        spec.sent_tokens = meter.count(&spec.body);
    }
    let probes = measure_calls + 2 + usize::from(opts.context_window.is_none());

    let ctx = Ctx { opts, canaries: &canaries, window };
    let reruns_planned: usize = plan
        .units
        .iter()
        .map(|u| match u {
            Unit::One(s) => usize::from(s.rerun),
            Unit::Group(v) => v.iter().filter(|s| s.rerun).count(),
        })
        .sum();
    let probe_samples = if opts.tenants.len() >= 2 { opts.timing_probe } else { 0 };
    if opts.timing_probe > 0 && probe_samples == 0 {
        notes.push("the timing probe needs two tenants: skipped".into());
    }
    let progress = Progress {
        on: opts.progress || std::io::stderr().is_terminal(),
        total: AtomicUsize::new(plan.total + reruns_planned + 4 * probe_samples),
        done: AtomicUsize::new(0),
        last: Mutex::new(None),
    };

    // The run under load.
    let t0 = Instant::now();
    let rows: Mutex<Vec<RequestRow>> = Mutex::new(Vec::new());
    let findings: Mutex<Vec<Finding>> = Mutex::new(Vec::new());
    let kept: Mutex<HashMap<usize, Exchange>> = Mutex::new(HashMap::new());
    let next = AtomicUsize::new(0);
    let send = |spec: &ReqSpec, phase: &'static str| {
        let ex = client.exchange(&opts.tenants[spec.tenant].key, spec, t0);
        let found = ctx.examine(spec, &ex, false);
        lock(&findings).extend(found);
        lock(&rows).push(ctx.row(spec, &ex, phase));
        if spec.rerun {
            // Only re-run requests keep their text, until the comparison.
            lock(&kept).insert(spec.id, ex);
        }
        progress.tick(hooks);
    };
    let one = |spec: &ReqSpec| send(spec, "main");
    std::thread::scope(|s| {
        for _ in 0..opts.concurrency {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(unit) = plan.units.get(i) else { break };
                match unit {
                    Unit::One(spec) => one(spec),
                    Unit::Group(members) => {
                        // All members leave together: a burst, or a shared prefix in flight for
                        // every tenant at once.
                        let gate = Barrier::new(members.len());
                        std::thread::scope(|g| {
                            for m in members {
                                let gate = &gate;
                                g.spawn(move || {
                                    gate.wait();
                                    one(m);
                                });
                            }
                        });
                    }
                }
            });
        }
    });

    // Top-up: a request chosen for a re-run whose answer carried nothing to compare (refused
    // for load, failed by a fault before its first token) is sent again, with the others in
    // that state, still under faults: a comparison needs an answer given under load.
    let mut sent_again: BTreeMap<&'static str, usize> = BTreeMap::new();
    for _ in 0..TOP_UP_ROUNDS {
        let empty: Vec<&ReqSpec> = plan
            .units
            .iter()
            .flat_map(Unit::specs)
            .filter(|s| {
                s.rerun
                    && lock(&kept)
                        .get(&s.id)
                        .is_none_or(|ex| rerun::plan(ex, s.scenario.must_be_refused()) == rerun::RerunPlan::Nothing)
            })
            .collect();
        if empty.is_empty() {
            break;
        }
        progress.total.fetch_add(empty.len(), Ordering::SeqCst);
        for s in &empty {
            *sent_again.entry(s.scenario.name()).or_default() += 1;
        }
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..opts.concurrency {
                s.spawn(|| {
                    while let Some(spec) = empty.get(next.fetch_add(1, Ordering::SeqCst)) {
                        send(spec, "top_up");
                    }
                });
            }
        });
    }

    hooks.on_load_done();

    // The isolated second pass: one tenant at a time, nothing of any other tenant in flight;
    // up to `rerun_concurrency` of that tenant's requests together.
    let kept = Mutex::new(kept.into_inner().unwrap_or_else(|e| e.into_inner()));
    let mut selected: Vec<&ReqSpec> = plan.units.iter().flat_map(Unit::specs).filter(|s| s.rerun).collect();
    selected.sort_by_key(|s| (s.tenant, s.id));
    let invariant = batch_invariant(opts, &models, &model);
    let tolerance = if invariant { 0.0 } else { rerun::LOGPROB_TOLERANCE };
    let by_scenario: Mutex<BTreeMap<&'static str, rerun::CategoryChecks>> = Mutex::new(BTreeMap::new());
    for s in &selected {
        let mut by = lock(&by_scenario);
        let c = by.entry(s.scenario.name()).or_default();
        c.selected += 1;
        c.required = rerun::required(c.selected);
        c.sent_again = sent_again.get(s.scenario.name()).copied().unwrap_or(0);
    }
    let rerun_nonce = rng::random_seed();
    let rerun = |spec: &ReqSpec| {
        let Some(first) = lock(&kept).remove(&spec.id) else { return };
        let count =
            |f: &dyn Fn(&mut rerun::CategoryChecks)| f(lock(&by_scenario).entry(spec.scenario.name()).or_default());
        let how = rerun::plan(&first, spec.scenario.must_be_refused());
        if how == rerun::RerunPlan::Nothing {
            count(&|c| c.nothing_received += 1);
            progress.tick(hooks);
            return;
        }
        // A fresh cache salt: the reference is computed from scratch, never from pages the
        // first run (or an earlier audit) left in the prefix cache.
        let key = &opts.tenants[spec.tenant].key;
        let mut alone = spec.body.clone();
        alone["cache_salt"] = json!(format!("audit-rerun-{}-{rerun_nonce:016x}-{}", opts.seed, spec.id));
        let again = match how {
            rerun::RerunPlan::Prefix(n) => client.exchange_until_tokens(key, spec, &alone, n, t0),
            _ => client.exchange(key, &ReqSpec { body: alone, disconnect_after: None, ..spec.clone() }, t0),
        };
        let found = ctx.examine(spec, &again, true);
        lock(&findings).extend(found);
        lock(&rows).push(ctx.row(spec, &again, "rerun"));
        progress.tick(hooks);
        if !rerun::usable(how, &again) {
            count(&|c| c.rerun_failed += 1);
            return;
        }
        count(&|c| {
            c.compared += 1;
            c.prefixes += usize::from(matches!(how, rerun::RerunPlan::Prefix(_)));
        });
        let prefix = match how {
            rerun::RerunPlan::Prefix(n) => Some(n),
            // Refused twice: the same answer; accepted twice: compared whole.
            rerun::RerunPlan::Refusal if first.status != Some(200) => return,
            _ => None,
        };
        if let Some((position, what, delta)) = rerun::divergence(&first, &again, prefix, tolerance) {
            count(&|c| c.diverged += 1);
            let partial = if prefix.is_some() { " (on the tokens received before the stream ended)" } else { "" };
            lock(&findings).push(Finding {
                kind: kind::DIVERGENCE,
                fails: true,
                request: Some(spec.id),
                tenant: Some(ctx.tenant(spec.tenant).to_string()),
                scenario: Some(spec.scenario.name()),
                detail: format!("the response under load differs from the same request run alone{partial}: {what}"),
                position,
                delta,
                ..Default::default()
            });
        }
    };
    for tenant_specs in selected.chunk_by(|a, b| a.tenant == b.tenant) {
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..opts.rerun_concurrency.max(1) {
                s.spawn(|| {
                    while let Some(spec) = tenant_specs.get(next.fetch_add(1, Ordering::SeqCst)) {
                        rerun(spec);
                    }
                });
            }
        });
    }
    let by_scenario = by_scenario.into_inner().unwrap_or_else(|e| e.into_inner());
    for (scenario, compared, required) in rerun::short_of_minimum(&by_scenario) {
        lock(&findings).push(Finding {
            kind: kind::TOO_FEW_COMPARISONS,
            fails: true,
            scenario: Some(scenario),
            detail: format!(
                "only {compared} of the `{scenario}` requests could be compared with a re-run alone (at least \
                 {required} needed): the audit cannot vouch for that category"
            ),
            ..Default::default()
        });
    }
    let checks = report::DivergenceChecks {
        selected: selected.len(),
        compared: by_scenario.values().map(|c| c.compared).sum(),
        skipped: by_scenario.values().map(|c| c.nothing_received + c.rerun_failed).sum(),
        diverged: 0,
        rerun_concurrency: opts.rerun_concurrency.max(1),
        batch_invariant: invariant,
        logprob_tolerance: tolerance,
        by_scenario,
    };

    // The timing probe: one request at a time, nothing else in flight.
    let timing_probe = (probe_samples > 0).then(|| {
        let first_id = plan
            .units
            .iter()
            .flat_map(|u| match u {
                Unit::One(s) => std::slice::from_ref(s).iter(),
                Unit::Group(v) => v.iter(),
            })
            .map(|s| s.id + 1)
            .max()
            .unwrap_or(0);
        let setup = timing::Setup {
            client: &client,
            model: &model,
            a: &opts.tenants[0],
            b: &opts.tenants[1],
            samples: probe_samples,
            tokens_per_word: calibration.tokens_per_word,
            t0,
            first_id,
        };
        let (probe, probe_rows) = timing::run(&setup, &mut rng, &|| progress.tick(hooks));
        lock(&rows).extend(probe_rows);
        lock(&findings).extend(probe.findings());
        probe
    });
    progress.finish();
    let duration = t0.elapsed();

    // Pages: every gauge back to zero within the wait, on every endpoint.
    let wait_start = Instant::now();
    let mut after: Scrapes;
    loop {
        after = metrics_urls()
            .into_iter()
            .map(|u| {
                let r = scrape(&client, &u, opts.metrics_token.as_deref());
                (u, r)
            })
            .collect();
        let busy = after.values().any(|a| a.as_ref().map_or(true, |s| !prom::pages_in_use(s).is_empty()));
        if !busy || wait_start.elapsed() >= PAGES_WAIT {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let pages_wait_s = wait_start.elapsed().as_secs_f64();

    let mut findings = findings.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut metrics = Vec::new();
    let urls: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for url in urls {
        let mut m = MetricsReport { url: url.clone(), ..Default::default() };
        let empty = Vec::new();
        // An endpoint that appeared during the run (a restarted worker) started from nothing.
        let b = before.get(url).unwrap_or(&Ok(Vec::new())).clone();
        let bs = b.as_ref().unwrap_or(&empty);
        if let Err(e) = &b {
            m.before_error = Some(e.clone());
        }
        m.before = prom::kept(bs);
        let Some(a) = after.get(url) else {
            // Gone by the end (a worker replaced by a restart): its pages went with its process.
            m.after_error = Some("no longer listed by the deployment".into());
            metrics.push(m);
            continue;
        };
        match a {
            Ok(samples) => {
                m.after = prom::kept(samples);
                m.violations = prom::violations(bs, samples);
                let busy = prom::pages_in_use(samples);
                m.pages_returned_to_zero = Some(busy.is_empty());
                for (key, v) in &busy {
                    findings.push(Finding {
                        kind: kind::LEAKED_PAGES,
                        fails: true,
                        detail: format!("`{key}` was still {v} at {url} {pages_wait_s:.1} s after the run"),
                        location: Some(url.clone()),
                        ..Default::default()
                    });
                }
                m.pages_in_use_after = busy.into_iter().collect();
                let changed: Vec<String> = m
                    .violations
                    .iter()
                    .filter(|v| v.delta > 0.0)
                    .map(|v| {
                        format!(
                            "{} +{}{}",
                            v.kind,
                            v.delta,
                            if v.labels.is_empty() { String::new() } else { format!(" ({})", v.labels) }
                        )
                    })
                    .collect();
                if !changed.is_empty() {
                    findings.push(Finding {
                        kind: kind::VIOLATIONS_REPORTED,
                        fails: false,
                        detail: format!(
                            "the deployment caught and failed requests on isolation checks: {}",
                            changed.join(", ")
                        ),
                        location: Some(url.clone()),
                        ..Default::default()
                    });
                }
            }
            Err(e) => {
                m.after_error = Some(e.clone());
                findings.push(Finding {
                    kind: kind::METRICS_UNAVAILABLE,
                    fails: false,
                    detail: format!("could not read {url} after the run ({e}): pages in use were not checked there"),
                    location: Some(url.clone()),
                    ..Default::default()
                });
            }
        }
        metrics.push(m);
    }
    findings.sort_by_key(|f| (!f.fails, f.request));

    let mut rows = rows.into_inner().unwrap_or_else(|e| e.into_inner());
    rows.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    let mut rep = Report {
        version: 1,
        passed: false,
        url: opts.url.clone(),
        model,
        seed: opts.seed,
        context_window: window,
        calibration,
        prompt_lengths: meter.source().clone(),
        concurrency: opts.concurrency,
        requests_planned: plan.total,
        requests_sent: 0,
        probes,
        near_context: report::NearContext { planned: plan.near_total, verified: plan.near_verified },
        started_unix,
        duration_s: duration.as_secs_f64(),
        pages_wait_s,
        tenants: opts.tenants.iter().map(|t| report::TenantRow { name: t.name.clone(), requests: 0, ok: 0 }).collect(),
        counts: Counts::default(),
        divergence_checks: checks,
        outcomes: BTreeMap::new(),
        outcomes_by_scenario: BTreeMap::new(),
        errors_by_kind: BTreeMap::new(),
        latency: report::Latency {
            ttft_ms: report::Percentiles::of([]),
            total_ms: report::Percentiles::of([]),
            total_ok_ms: report::Percentiles::of([]),
        },
        metrics,
        fault_log: hooks.fault_log(),
        notes,
        timing_probe,
        findings,
        requests: rows,
    };
    rep.tally();
    if let Some(dir) = &opts.report_dir {
        rep.write(dir)?;
    }
    Ok(AuditOutcome {
        passed: rep.passed,
        summary: rep.summary(opts.report_dir.as_deref()),
        counts: rep.counts.clone(),
        findings: rep.findings.clone(),
    })
}

/// A poisoned lock still holds what the other threads wrote: the report wants all of it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_from_refusals_of_several_servers() {
        let pw = "this model's maximum context length is 8192 tokens; the request needs 1073741848 \
                  (24 in the prompt + 1073741824 to generate)";
        assert_eq!(parse_lengths(pw), (Some(8192), Some(24)));
        let vllm = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens \
                    (4000 in the messages, 1000 in the completion).";
        assert_eq!(parse_lengths(vllm), (Some(4096), Some(4000)));
        let openai = "This model's maximum context length is 128000 tokens. However, your messages resulted in \
                      130000 tokens. Please reduce the length of the messages.";
        assert_eq!(parse_lengths(openai), (Some(128000), Some(130000)));
        assert_eq!(parse_lengths("max_tokens is too large"), (None, None));
    }

    #[test]
    fn the_window_a_server_lists_is_the_one_it_serves_not_the_models_training_length() {
        let pw = json!({"data": [{"id": "m", "context_length": 1024}]});
        assert_eq!(listed_window(&pw, "m"), Some(1024));
        let vllm = json!({"data": [{"id": "m", "max_model_len": 4096}]});
        assert_eq!(listed_window(&vllm, "m"), Some(4096));
        // llama-server 0c1e570 with -c 4096 -np 4: each slot holds 1,024 of a model trained on 8,192.
        let llama = json!({"data": [{"id": "m", "meta": {"n_ctx": 1024, "n_ctx_train": 8192}}]});
        assert_eq!(listed_window(&llama, "m"), Some(1024));
        let old_llama = json!({"data": [{"id": "m", "meta": {"n_ctx_train": 8192}}]});
        assert_eq!(listed_window(&old_llama, "m"), Some(8192));
        assert_eq!(listed_window(&llama, "other"), None);
        assert_eq!(listed_window(&json!({"data": [{"id": "m"}]}), "m"), None);
    }

    fn spec(id: usize, tenant: usize, scenario: workload::Scenario, max_tokens: usize) -> ReqSpec {
        ReqSpec {
            id,
            tenant,
            scenario,
            endpoint: Endpoint::Chat,
            stream: false,
            max_tokens,
            canaries: vec![],
            disconnect_after: None,
            rerun: false,
            prompt_tokens: None,
            sent_tokens: None,
            body: Value::Null,
        }
    }

    #[test]
    fn examine_classifies_canaries_and_over_long_answers() {
        use workload::Scenario;
        let tenants = ["alice", "bob"].map(|n| TenantKey { name: n.into(), key: format!("k-{n}") }).to_vec();
        let opts = AuditOptions::new("http://x", tenants);
        let mut rng = Rng::new(1);
        let mut idx = CanaryIndex::new();
        let own = idx.issue(&mut rng, 0, 0);
        let same_tenant = idx.issue(&mut rng, 0, 1);
        let other_tenant = idx.issue(&mut rng, 1, 2);
        let ctx = Ctx { opts: &opts, canaries: &idx, window: 100 };
        let text = |i: usize| idx.get(i).text.clone();

        // Request 0 of alice: its own canary is fine; alice's other request's and bob's are not.
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        e.text = format!("{} and {} and {}", text(own), text(same_tenant), text(other_tenant));
        e.raw = format!("{{\"content\": \"{}\"}}", e.text);
        let f = ctx.examine(&spec(0, 0, Scenario::Short, 16), &e, false);
        let kinds: Vec<&str> = f.iter().map(|f| f.kind).collect();
        // Each canary once, though it is in both the text and the raw body.
        assert_eq!(kinds, [kind::CROSS_REQUEST_CANARY, kind::CROSS_TENANT_CANARY]);
        assert_eq!(f[1].canary_owner.as_deref(), Some("bob"));
        assert_eq!(f[1].canary_request, Some(2));
        assert_eq!(f[1].location.as_deref(), Some("response text"));
        assert!(f.iter().all(|f| f.fails));

        // A fragment of bob's canary inside a misspelt copy of alice's own is reported, not
        // failed; the same fragment in a response of a request with other canaries fails.
        let mut echo_idx = CanaryIndex::new();
        let alices = echo_idx.insert("likritri-trulazesa-6298", 0, 10);
        echo_idx.insert("nuzhotro-likritra-3368", 1, 11);
        let echo_ctx = Ctx { opts: &opts, canaries: &echo_idx, window: 100 };
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        e.text = "The secret code is: \"Likritra-Trulazesa-629".into();
        let mut own = spec(10, 0, Scenario::Short, 16);
        own.canaries = vec![alices];
        let f = echo_ctx.examine(&own, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::FRAGMENT_IN_OWN_CANARY, false));
        assert_eq!(f[0].canary_request, Some(11));
        let f = echo_ctx.examine(&spec(12, 0, Scenario::Short, 16), &e, false);
        let kinds: Vec<(&str, bool)> = f.iter().map(|f| (f.kind, f.fails)).collect();
        assert_eq!(kinds, [(kind::CROSS_TENANT_CANARY, true), (kind::CROSS_REQUEST_CANARY, true)]);

        // The excused fragment first, then the whole foreign canary: the whole copy fails.
        e.text = "The secret code is: \"Likritra-Trulazesa-629. Also nuzhotro-likritra-3368.".into();
        let f = echo_ctx.examine(&own, &e, false);
        let kinds: Vec<(&str, bool, Option<bool>)> = f.iter().map(|f| (f.kind, f.fails, f.whole)).collect();
        assert_eq!(kinds, [(kind::CROSS_TENANT_CANARY, true, Some(true))]);

        // Over-long: 400 context_length_exceeded is right; another refusal is reported, not
        // failed; 200 fails whatever `usage` the server reports (the incident's server said its
        // placeholder was one token long).
        let over = spec(3, 1, Scenario::OverLong, 16);
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(400);
        e.outcome = Outcome::Refused400;
        e.error_kind = Some("context_length_exceeded".into());
        assert!(ctx.examine(&over, &e, false).is_empty());
        e.error_kind = Some("invalid_request_error: x".into());
        let f = ctx.examine(&over, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::OVERLONG_OTHER_ANSWER, false));
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        for reported in [150, 50, 1] {
            e.prompt_tokens = Some(reported);
            let f = ctx.examine(&over, &e, false);
            let kinds: Vec<(&str, bool)> = f.iter().map(|f| (f.kind, f.fails)).collect();
            assert_eq!(kinds, [(kind::OVERLONG_ACCEPTED, true)], "reported {reported}");
        }
        // Counted by the audit: 150 tokens sent, one reported: both rules fail it.
        let mut counted = over.clone();
        counted.sent_tokens = Some(150);
        let f = ctx.examine(&counted, &e, false);
        let kinds: Vec<(&str, bool)> = f.iter().map(|f| (f.kind, f.fails)).collect();
        assert_eq!(kinds, [(kind::OVERLONG_ACCEPTED, true), (kind::PROMPT_UNDERCOUNTED, true)]);
        assert!(f[0].detail.contains("prompt 150 tokens by the audit's count") && f[0].detail.contains("reported 1"));
        // Planned over the window, but the audit's own count fits: a planning miss, reported.
        counted.sent_tokens = Some(50);
        e.prompt_tokens = Some(50);
        let f = ctx.examine(&counted, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::OVERLONG_OTHER_ANSWER, false));
        // Any answer reporting fewer prompt tokens than the audit sent fails; as many passes.
        let mut fits = spec(5, 1, Scenario::Short, 16);
        fits.sent_tokens = Some(40);
        e.prompt_tokens = Some(40);
        assert!(ctx.examine(&fits, &e, false).is_empty());
        e.prompt_tokens = Some(39);
        let f = ctx.examine(&fits, &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::PROMPT_UNDERCOUNTED, true));

        // A fitting request refused with 400, and a `length` finish before max_tokens.
        let mut e = Exchange::new(Duration::ZERO);
        e.status = Some(400);
        e.outcome = Outcome::Refused400;
        let f = ctx.examine(&spec(4, 1, Scenario::Medium, 16), &e, false);
        assert_eq!((f[0].kind, f[0].fails), (kind::UNEXPECTED_400, false));
        e.status = Some(200);
        e.outcome = Outcome::Ok;
        e.finish_reason = Some("length".into());
        e.completion_tokens = Some(3);
        let f = ctx.examine(&spec(4, 1, Scenario::Medium, 16), &e, true);
        assert_eq!((f[0].kind, f[0].fails), (kind::SHORT_LENGTH, false));
    }
}
