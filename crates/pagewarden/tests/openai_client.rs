#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The official `openai` Python package (installed with pip into a private venv) against the
//! real server binary on a loopback port: chat, streaming, completions, log-probs, a wrong key,
//! an over-long prompt and an unknown model; and structured outputs (json_schema, json_object)
//! and function calling, checked against their schemas with `jsonschema`.

mod common;

#[test]
fn official_openai_python_client_works_against_the_server() {
    let python = common::python_with(&["openai>=1.40,<3"]);
    let server = common::Server::start(&[]);
    common::run_python_checks(&python, "client_test.py", &[&server.url, &server.key, &common::MODEL_NAME]);
}

#[test]
fn structured_outputs_and_tool_calls_validate_with_the_official_client() {
    let python = common::python_with(&["openai>=1.40,<3", "jsonschema>=4,<5"]);
    let server = common::Server::start(&[]);
    common::run_python_checks(&python, "structured_test.py", &[&server.url, &server.key, &common::MODEL_NAME]);
}
