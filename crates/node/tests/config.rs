#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Start-up validation: errors name the field; a pool too small for one request refuses to
//! start naming both numbers and the fix.

mod common;

use common::*;
use node::Config;

fn err(toml: &str) -> String {
    match Config::from_toml_str(toml) {
        Ok(_) => panic!("accepted: {toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn config_validation_errors_name_the_field() {
    let cases = [
        ("listen = \"nowhere\"", "listen"),
        ("[pool]\npage_size = 0", "pool.page_size"),
        ("[pool]\ndtype = \"f8\"", "pool.dtype"),
        ("[pool]\nscrub = \"never\"", "pool.scrub"),
        ("[pool]\ntokens = 10\nbytes = 10", "pool"),
        ("[engine]\nmax_running = 0", "engine.max_running"),
        ("[engine]\nspeculative_draft = 17", "engine.speculative_draft"),
        ("[limits]\nmax_body_bytes = 0", "limits.max_body_bytes"),
        ("context_window = 0", "context_window"),
        ("[[tenants]]\nname = \"a\"\nkey_sha256 = \"abc\"", "tenants[0].key_sha256"),
        ("[[tenants]]\nname = \"bad name\"\nkey_sha256 = \"abc\"", "tenants[0].name"),
        ("[pool]\ntokenz = 5", "tokenz"),
        ("threads = \"many\"", "threads"),
        ("[limits]\nbody_timeout_ms = 0", "limits.body_timeout_ms"),
        ("[limits]\nheader_timeout_ms = 0", "limits.header_timeout_ms"),
        ("[limits]\nmax_connections_per_address = 0", "limits.max_connections_per_address"),
        ("[metrics]\nlisten = \"nowhere\"", "metrics.listen"),
        ("[metrics]\ntenant_name = true", "tenant_name"),
    ];
    for (toml, field) in cases {
        let e = err(toml);
        assert!(e.contains(field), "error for {toml:?} should name {field}: {e}");
    }
}

#[test]
fn pool_smaller_than_the_context_window_refuses_to_start_naming_both_numbers() {
    let mut cfg = test_config();
    cfg = Config { context_window: Some(1024), ..cfg };
    cfg.pool.size = Some(node::config::PoolSize::Tokens(512));
    let e = try_start(cfg).err().expect("must refuse to start").to_string();
    assert!(e.contains("512") && e.contains("1024"), "{e}");
    assert!(e.contains("2x") && e.contains("pool.tokens"), "{e}");
}

#[test]
fn context_window_beyond_the_models_refuses_to_start() {
    let mut cfg = test_config();
    cfg.context_window = Some(100_000);
    let e = try_start(cfg).err().expect("must refuse to start").to_string();
    assert!(e.contains("context_window") && e.contains("8192"), "{e}");
}

#[test]
fn example_config_file_is_valid_and_matches_the_defaults() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/pagewarden.example.toml")).unwrap();
    let c = Config::from_toml_str(&text).unwrap();
    let d = Config::default();
    assert_eq!(c.listen, d.listen);
    assert_eq!(c.engine.max_batch_tokens, d.engine.max_batch_tokens);
    assert_eq!(c.limits.max_body_bytes, d.limits.max_body_bytes);
    assert_eq!(c.limits.connections.header_timeout, d.limits.connections.header_timeout);
    assert_eq!(c.limits.connections.max_per_address, d.limits.connections.max_per_address);
    assert_eq!(c.pool.page_size, d.pool.page_size);
}

#[test]
fn connection_limits_default_short_and_parse() {
    let d = Config::default();
    assert_eq!(d.limits.connections.header_timeout, std::time::Duration::from_secs(20));
    assert_eq!(d.limits.connections.max_per_address, 256);
    let c = Config::from_toml_str("[limits]\nheader_timeout_ms = 2500\nmax_connections_per_address = 8\n").unwrap();
    assert_eq!(c.limits.connections.header_timeout, std::time::Duration::from_millis(2500));
    assert_eq!(c.limits.connections.max_per_address, 8);
}

#[test]
fn new_limits_and_metrics_keys_parse_with_their_defaults() {
    let d = Config::default();
    assert_eq!(d.limits.body_timeout, std::time::Duration::from_millis(30_000));
    assert!(d.metrics.listen.is_none() && d.metrics.token_file.is_none() && !d.metrics.tenant_names);
    let digest = "ab".repeat(32);
    let c = Config::from_toml_str(&format!(
        "[limits]\nbody_timeout_ms = 1500\n[metrics]\nlisten = \"127.0.0.1:9464\"\ntoken_file = \"/t\"\n\
         tenant_names = true\n[[tenants]]\nid = 1\nname = \"a\"\nkey_sha256 = \"{digest}\"\nmax_body_bytes = 4096\n"
    ))
    .unwrap();
    assert_eq!(c.limits.body_timeout, std::time::Duration::from_millis(1500));
    assert_eq!(c.metrics.listen.map(|a| a.port()), Some(9464));
    assert!(c.metrics.tenant_names);
    assert_eq!(c.tenants[0].max_body_bytes, Some(4096));
    let e = err(&format!("[[tenants]]\nid = 1\nname = \"a\"\nkey_sha256 = \"{digest}\"\nmax_body_bytes = 0\n"));
    assert!(e.contains("tenants[0].max_body_bytes"), "{e}");
}

#[test]
fn tenant_ids_are_required_unique_and_within_last_tenant_id() {
    let t = |id: &str, name: &str, digest: char| {
        format!("[[tenants]]\n{id}name = \"{name}\"\nkey_sha256 = \"{}\"\n", digest.to_string().repeat(64))
    };
    let e = err(&t("", "a", 'a'));
    assert!(e.contains("tenants[0].id") && e.contains("tenant add"), "{e}");
    let e = err(&format!("{}{}", t("id = 3\n", "a", 'a'), t("id = 3\n", "b", 'b')));
    assert!(e.contains("tenants[1].id") && e.contains("two tenants"), "{e}");
    let e = err(&format!("last_tenant_id = 2\n{}", t("id = 3\n", "a", 'a')));
    assert!(e.contains("tenants[0].id") && e.contains("last_tenant_id"), "{e}");
    assert!(err(&t("id = 0\n", "a", 'a')).contains("tenants[0].id"));
    let c =
        Config::from_toml_str(&format!("last_tenant_id = 9\n{}{}", t("id = 7\n", "a", 'a'), t("id = 2\n", "b", 'b')))
            .unwrap();
    assert_eq!(c.tenants.iter().map(|t| t.id.0).collect::<Vec<_>>(), vec![7, 2]);
    assert_eq!(c.last_tenant_id, 9);
    let c = Config::from_toml_str(&t("id = 5\n", "a", 'a')).unwrap();
    assert_eq!(c.last_tenant_id, 5, "at least every tenant's id");
}

#[test]
fn the_pool_share_and_max_tokens_ceiling_are_validated() {
    let d = Config::default();
    assert_eq!((d.limits.tenant_pool_share, d.limits.max_tokens_ceiling), (0.5, 4096));
    let c = Config::from_toml_str("[limits]\ntenant_pool_share = 0.25\nmax_tokens_ceiling = 100\n").unwrap();
    assert_eq!((c.limits.tenant_pool_share, c.limits.max_tokens_ceiling), (0.25, 100));
    for bad in ["tenant_pool_share = 0.0", "tenant_pool_share = 1.5", "tenant_pool_share = -1.0"] {
        assert!(err(&format!("[limits]\n{bad}\n")).contains("limits.tenant_pool_share"), "{bad}");
    }
    assert!(err("[limits]\nmax_tokens_ceiling = 0\n").contains("limits.max_tokens_ceiling"));
}

#[test]
fn a_metrics_token_file_readable_by_others_or_short_refuses_to_start() {
    use std::os::unix::fs::PermissionsExt;
    let loose = private_file("loose-metrics-token", &"t".repeat(40));
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    let short = private_file("short-metrics-token", "short");
    for (path, want) in [(loose, "chmod 600"), (short, "at least 32")] {
        let mut cfg = test_config();
        cfg.metrics.token_file = Some(path);
        let e = try_start(cfg).err().expect("must refuse to start").to_string();
        assert!(e.contains("metrics.token_file") && e.contains(want), "{e}");
    }
}
