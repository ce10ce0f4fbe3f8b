#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `/metrics` shows every tenant's load: the API port serves it only with the metrics token
//! (404 when none is configured), a `[metrics] listen` listener serves it to a private network,
//! and tenants are labelled by id unless names are asked for.

mod common;

use common::*;
use serde_json::json;

fn free_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn one_request(server: &Server, key: &str) {
    let b = json!({"model": MODEL, "prompt": "1, 2,", "max_tokens": 2, "temperature": 0});
    assert_eq!(post_json(&server.url("/v1/completions"), Some(key), &b).status, 200);
}

#[test]
fn without_metrics_access_configured_the_api_port_answers_404_and_the_listener_serves_it() {
    let mut cfg = test_config();
    cfg.metrics.token_file = None;
    let at = free_port();
    cfg.metrics.listen = Some(at);
    let server = start(cfg);
    for key in [None, Some(ALICE), Some(METRICS_TOKEN)] {
        let r = get(&server.url("/metrics"), key);
        assert_eq!(r.status, 404, "{}", r.body);
        let e = r.error();
        assert!(e["message"].as_str().unwrap().contains("token_file"), "{e}");
        assert!(!r.body.contains("pagewarden_"), "{}", r.body);
    }
    one_request(&server, BOB);
    let r = get(&format!("http://{at}/metrics"), None);
    assert_eq!(r.status, 200, "{}", r.body);
    // OpenMetrics: the family is `pagewarden_requests`, its samples `pagewarden_requests_total`.
    assert!(r.body.contains("# TYPE pagewarden_requests counter"), "{}", r.body);
    assert!(r.body.contains("pagewarden_requests_total{status=\"200\"} "), "{}", r.body);
    assert!(r.body.contains("pagewarden_prefix_cache_lookups_total{tenant=\"2\"} 1"), "{}", r.body);
    // The listener serves nothing else of the API.
    assert_eq!(get(&format!("http://{at}/v1/models"), Some(ALICE)).status, 404);
}

#[test]
fn with_a_token_file_the_api_port_needs_the_token_and_labels_tenants_by_id() {
    let server = start(test_config());
    let url = server.url("/metrics");
    for key in [None, Some(ALICE), Some("metrics-token-of-the-gateway-tests-012345678"), Some("")] {
        let r = get(&url, key);
        assert_eq!(r.status, 401, "{key:?}: {}", r.body);
        r.error();
        assert!(!r.body.contains("pagewarden_"), "{}", r.body);
    }
    one_request(&server, BOB);
    let text = metrics_text(&server);
    assert!(text.contains("pagewarden_prefix_cache_lookups_total{tenant=\"2\"} 1"), "{text}");
    assert!(!text.contains("bob") && !text.contains("alice"), "tenant names leak: {text}");
}

#[test]
fn tenant_names_label_tenants_by_name_when_asked() {
    let mut cfg = test_config();
    cfg.metrics.tenant_names = true;
    let server = start(cfg);
    one_request(&server, BOB);
    let text = metrics_text(&server);
    assert!(text.contains("pagewarden_prefix_cache_lookups_total{tenant=\"bob\"} 1"), "{text}");
}
