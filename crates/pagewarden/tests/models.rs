#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Several models in one `serve` process, each a packaged model fetched by name: the official
//! `openai` client uses both, a tenant's `models` allow-list holds (a model it may not use is a
//! 404 identical to an unknown model's), and the isolation audit passes with its tenants spread
//! over both models.

mod common;

const GEMMA: &str = "gemma-3-270m";

#[test]
fn two_models_serve_side_by_side_allow_lists_hold_and_the_audit_passes_across_both() {
    fetch::ensure_model(&fetch::GEMMA3_270M).expect("Gemma 3 model");
    let python = common::python_with(&["openai>=1.40,<3"]);
    let dir = launch::scratch_dir("pw-models").unwrap();
    let config = dir.join("pagewarden.toml");
    // Windows of 2,048: a near-context prompt of the audit's stays a few seconds of prefill. The
    // queue timeout bounds how long a burst that fills a pool keeps requests waiting.
    let models = format!(
        "[engine]\nqueue_timeout_ms = 10000\n\n\
         [[models]]\nname = \"{}\"\npackage = \"smollm2-135m-instruct\"\ncontext_window = 2048\npool = {{ tokens = 8192 }}\n\n\
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
    audit_spreads_over_both_models(&server, &key_all, &key_gemma);
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

/// The isolation audit as two tenants: one may use both models, one only Gemma. Each takes a
/// model of its own (the first SmolLM2, the other Gemma), each model is sized and counted with
/// its own tokenizer, and the timing probe pairs the two tenants, each on its own model.
fn audit_spreads_over_both_models(server: &common::Server, key_all: &str, key_gemma: &str) {
    let tenants = server.dir.join("audit-tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenants]]\nname = \"everything\"\nkey = \"{key_all}\"\n\n\
             [[tenants]]\nname = \"gemma-only\"\nkey = \"{key_gemma}\"\n"
        ),
    )
    .unwrap();
    let report = server.dir.join("audit");
    let out = std::process::Command::new(common::bin())
        .args(["audit", "--url", &server.url, "--tenants"])
        .arg(&tenants)
        .arg("--metrics-token-file")
        .arg(server.dir.join("metrics-token"))
        .args([
            "--requests",
            "40",
            "--concurrency",
            "4",
            "--seed",
            "20261203",
            "--timing-probe",
            "6",
            "--skip-check",
            "probe-power",
            "--report",
        ])
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the audit failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["passed"], true);
    let models = r["models"].as_array().unwrap();
    let used: Vec<(&str, &str)> =
        models.iter().map(|m| (m["model"].as_str().unwrap(), m["tenants"][0].as_str().unwrap())).collect();
    assert_eq!(used, [(common::MODEL_NAME, "everything"), (GEMMA, "gemma-only")], "{models:?}");
    for m in models {
        assert_eq!(m["context_window"], 2048, "{m}");
        assert_eq!(m["prompt_lengths"]["source"], "model_file", "{m}");
        assert_eq!(m["calibration"]["measured"], true, "{m}");
    }
    // The two tokenizers count the same words differently: each model was calibrated apart.
    assert_ne!(models[0]["calibration"]["tokens_per_word"], models[1]["calibration"]["tokens_per_word"]);
    for k in ["cross_tenant_canaries", "cross_request_canaries", "divergences", "leaked_pages", "overlong_accepted"] {
        assert_eq!(r["counts"][k], 0, "{k}: {}", r["findings"]);
    }
    // Every request named its tenant's model, and both tenants were answered.
    for t in r["tenants"].as_array().unwrap() {
        assert!(t["ok"].as_u64().unwrap() > 0, "{t}");
    }
    assert!(r["outcomes"]["refused_400"].as_u64().unwrap() >= 1, "{}", r["outcomes"]);
    assert!(r["divergence_checks"]["compared"].as_u64().unwrap() >= 3, "{}", r["divergence_checks"]);
    let p = &r["timing_probe"];
    // The two tenants were paired, each on the model it was given.
    let pairs = p["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 1, "{p}");
    let label = pairs[0]["label"].as_str().unwrap();
    assert!(
        label.contains(&format!("everything ({})", common::MODEL_NAME))
            && label.contains(&format!("gemma-only ({GEMMA})")),
        "{label}"
    );
    assert!(p["b_on_a_cached"]["cached_tokens"].as_array().unwrap().iter().all(|n| n == 0), "{p}");
    assert!(p["a_warm"]["cached_tokens"].as_array().unwrap().iter().any(|n| n.as_u64().unwrap() > 0), "{p}");
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
