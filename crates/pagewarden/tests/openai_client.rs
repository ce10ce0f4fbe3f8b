#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The official `openai` Python package (installed with pip into a private venv) against the
//! real server binary on a loopback port: chat, streaming, completions, log-probs, a wrong key,
//! an over-long prompt and an unknown model; and structured outputs (json_schema, json_object)
//! and function calling, checked against their schemas with `jsonschema`.

mod common;

use std::process::Command;

#[test]
fn official_openai_python_client_works_against_the_server() {
    let python = common::python_with(&["openai>=1.40,<3"]);
    let server = common::Server::start(&[]);
    let script = common::python_script("client_test.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(&server.url)
        .arg(&server.key)
        .arg(common::MODEL_NAME)
        .output()
        .expect("run the openai client script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openai client checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("passed, 0 failed"), "{stdout}");
}

#[test]
fn structured_outputs_and_tool_calls_validate_with_the_official_client() {
    let python = common::python_with(&["openai>=1.40,<3", "jsonschema>=4,<5"]);
    let server = common::Server::start(&[]);
    let out = Command::new(&python)
        .arg(common::python_script("structured_test.py"))
        .arg(&server.url)
        .arg(&server.key)
        .arg(common::MODEL_NAME)
        .output()
        .expect("run the structured-output script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "structured output checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("passed, 0 failed"), "{stdout}");
}
