#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Start-up validation: errors name the field; a pool too small for one request refuses to
//! start naming both numbers and the fix.

mod common;

use common::*;
use gateway::Config;

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
        ("[limits]\nmax_body_bytes = 0", "limits.max_body_bytes"),
        ("context_window = 0", "context_window"),
        ("[[tenants]]\nname = \"a\"\nkey_sha256 = \"abc\"", "tenants[0].key_sha256"),
        ("[[tenants]]\nname = \"bad name\"\nkey_sha256 = \"abc\"", "tenants[0].name"),
        ("[pool]\ntokenz = 5", "tokenz"),
        ("threads = \"many\"", "threads"),
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
    cfg.pool.size = Some(gateway::config::PoolSize::Tokens(512));
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
    assert_eq!(c.pool.page_size, d.pool.page_size);
}
