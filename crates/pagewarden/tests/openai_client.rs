#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The official `openai` Python package (installed with pip into a private venv) against the
//! real server binary on a loopback port: chat, streaming, completions, log-probs, a wrong key,
//! an over-long prompt and an unknown model.

mod common;

use std::process::Command;

#[test]
fn official_openai_python_client_works_against_the_server() {
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
        assert!(ok.success(), "creating a venv failed");
    }
    let pip = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "openai>=1.40,<3"])
        .status()
        .expect("pip install openai");
    assert!(pip.success(), "pip install openai failed (is PyPI reachable?)");

    let server = common::Server::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/openai/client_test.py");
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
