#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Several models in one `serve` process, each a packaged model fetched by name: the official
//! `openai` client uses both, and a tenant's `models` allow-list holds (a model it may not use
//! is a 404 identical to an unknown model's).

mod common;

const GEMMA: &str = "gemma-3-270m";

#[test]
fn two_models_serve_side_by_side_and_tenant_allow_lists_hold() {
    fetch::ensure_model(&fetch::GEMMA3_270M).expect("Gemma 3 model");
    let python = common::python_with(&["openai>=1.40,<3"]);
    let dir = launch::scratch_dir("pw-models").unwrap();
    let config = dir.join("pagewarden.toml");
    let models = format!(
        "[[models]]\nname = \"{}\"\npackage = \"smollm2-135m-instruct\"\npool = {{ tokens = 8192 }}\n\n\
         [[models]]\nname = \"{GEMMA}\"\npackage = \"gemma-3-270m\"\ncontext_window = 2048\npool = {{ tokens = 4096 }}\n\n",
        common::MODEL_NAME
    );
    std::fs::write(&config, format!("{models}{}", common::metrics_section(&dir))).unwrap();
    let key_all = launch::tenant_add(common::bin().as_ref(), &config, "everything").unwrap();
    let key_gemma = launch::tenant_add(common::bin().as_ref(), &config, "gemma-only").unwrap();
    // The last tenant table in the file is gemma-only's.
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("models = [\"{GEMMA}\"]\n"));
    std::fs::write(&config, text).unwrap();

    let server = common::Server::start_with(dir, key_all.clone());
    common::run_python_checks(
        &python,
        "models_test.py",
        &[&server.url, &key_all, &key_gemma, &common::MODEL_NAME, &GEMMA],
    );
    // Both models' workers are listed, and every page of both pools comes back (workers
    // report their pools periodically: poll for a few seconds).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let m = server.metrics();
        let used: Vec<f64> = m
            .lines()
            .filter(|l| l.starts_with("pagewarden_worker_kv_pages_used{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(m.contains("decode-0") && m.contains("decode-1"), "both models' workers listed: {m}");
        if used.len() == 4 && used.iter().all(|&u| u == 0.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "pages left in use: {used:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
