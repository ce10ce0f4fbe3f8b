#![allow(clippy::unwrap_used, clippy::expect_used)]
//! HTTPS on the API (`[tls]`): the official `openai` Python client over TLS with a test CA
//! (trustme), a client trusting another CA refused, plain HTTP on the port refused, the
//! certificate replaced on SIGHUP without a restart, and bad key files refused at start-up.

mod common;

use std::path::Path;
use std::process::Command;

fn run_client(python: &Path, server: &common::Server, trusted: &Path, other: &Path) {
    common::run_python_checks(
        python,
        "https_test.py",
        &[&server.url, &server.key, &common::MODEL_NAME, &trusted, &other],
    );
}

/// Copies CA `n`'s server certificate and key to the paths the config names (key mode 600).
fn install(dir: &Path, n: u32) {
    std::fs::copy(dir.join(format!("server{n}.pem")), dir.join("cert.pem")).unwrap();
    let key = std::fs::read(dir.join(format!("server{n}.key"))).unwrap();
    // Anew: an existing file would keep its mode.
    let _ = std::fs::remove_file(dir.join("key.pem"));
    launch::write_private(&dir.join("key.pem"), &key).unwrap();
}

fn make_certs(python: &Path, dir: &Path) {
    let out = Command::new(python).arg(common::python_script("make_certs.py")).arg(dir).output().unwrap();
    assert!(out.status.success(), "make_certs.py: {}", String::from_utf8_lossy(&out.stderr));
}

fn tls_section(dir: &Path) -> String {
    format!(
        "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        dir.join("cert.pem").display(),
        dir.join("key.pem").display()
    )
}

#[test]
fn the_official_client_works_over_https_and_a_sighup_serves_a_renewed_certificate() {
    let python = common::python_with(&["openai>=1.40,<3", "trustme>=1.1,<2"]);
    let (dir, key) = common::Server::configure(&[]);
    make_certs(&python, &dir);
    install(&dir, 1);
    let config = dir.join("pagewarden.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n{}", tls_section(&dir))).unwrap();

    let server = common::Server::start_with(dir.clone(), key);
    assert!(server.url.starts_with("https://127.0.0.1:"), "{}", server.url);
    run_client(&python, &server, &dir.join("ca1.pem"), &dir.join("ca2.pem"));

    // A renewal: CA 2's certificate on the same paths, then SIGHUP. New connections get it.
    install(&dir, 2);
    server.reload();
    run_client(&python, &server, &dir.join("ca2.pem"), &dir.join("ca1.pem"));

    // A broken file on reload keeps the certificate in use.
    std::fs::write(dir.join("cert.pem"), "not a certificate").unwrap();
    server.reload();
    std::thread::sleep(std::time::Duration::from_millis(500));
    run_client(&python, &server, &dir.join("ca2.pem"), &dir.join("ca1.pem"));
}

/// `serve` with `dir`'s config: it must exit non-zero, its stderr naming `field` and `words`.
fn refused_at_start(dir: &Path, field: &str, words: &str) {
    let out = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("pagewarden.toml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started with a bad [tls]: {stderr}");
    assert!(stderr.contains(field) && stderr.contains(words), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
}

#[test]
fn a_loose_or_foreign_key_is_refused_before_serving() {
    let python = common::python_with(&["openai>=1.40,<3", "trustme>=1.1,<2"]);
    let (dir, _key) = common::Server::configure(&[]);
    make_certs(&python, &dir);
    let config = dir.join("pagewarden.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n{}", tls_section(&dir))).unwrap();

    // A key that others can read.
    install(&dir, 1);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("key.pem"), std::fs::Permissions::from_mode(0o644)).unwrap();
    refused_at_start(&dir, "tls.key_file", "chmod 600");

    // CA 1's certificate with CA 2's server key.
    install(&dir, 1);
    std::fs::remove_file(dir.join("key.pem")).unwrap();
    launch::write_private(&dir.join("key.pem"), &std::fs::read(dir.join("server2.key")).unwrap()).unwrap();
    refused_at_start(&dir, "tls.key_file", "does not belong");

    // No certificate in the file.
    install(&dir, 1);
    std::fs::write(dir.join("cert.pem"), "").unwrap();
    refused_at_start(&dir, "tls.cert_file", "no PEM certificate");
    let _ = std::fs::remove_dir_all(&dir);
}
