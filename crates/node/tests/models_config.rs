#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `[[models]]` and tenants' `models`, as the configuration file gives them.

use node::config::{Config, ModelSource, PoolSize};

fn err(toml: &str) -> String {
    Config::from_toml_str(toml).unwrap_err().to_string()
}

#[test]
fn models_are_read_with_their_sources_windows_and_pools() {
    let c = Config::from_toml_str(
        "[pool]\ntokens = 9000\n[[models]]\nname = \"a\"\nfile = \"/m/a.gguf\"\ncontext_window = 1024\n\
         [[models]]\nname = \"b\"\npackage = \"gemma-3-270m\"\npool = { bytes = 1000000 }\n",
    )
    .unwrap();
    assert_eq!(c.models.len(), 2);
    assert!(matches!(&c.models[0].source, ModelSource::File(p) if p.to_str() == Some("/m/a.gguf")));
    assert_eq!((c.models[0].context_window, c.models[0].pool_size), (Some(1024), Some(PoolSize::Tokens(9000))));
    assert!(matches!(c.models[1].source, ModelSource::Package(p) if p.name == "gemma-3-270m"));
    assert_eq!(c.models[1].pool_size, Some(PoolSize::Bytes(1_000_000)));
    let b = c.for_model(&c.models[1]);
    assert_eq!(
        (b.model_name.as_str(), b.model.is_none(), b.model_package.map(|p| p.name)),
        ("b", true, Some("gemma-3-270m"))
    );
}

#[test]
fn without_models_the_top_level_fields_describe_the_one_model() {
    let c = Config::from_toml_str("model = \"/x.gguf\"\nmodel_name = \"x\"\ncontext_window = 512\n").unwrap();
    let m = c.served_models();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].name.as_str(), m[0].context_window), ("x", Some(512)));
    assert!(c.single_model("a worker").is_ok());
}

#[test]
fn bad_model_entries_are_refused_naming_the_field() {
    let e = err("[[models]]\nname = \"a\"\npackage = \"llama-70b\"\n");
    assert!(e.contains("models[0].package") && e.contains("smollm2-135m-instruct, gemma-3-270m"), "{e}");
    let e = err("[[models]]\nname = \"a\"\nfile = \"/a\"\npackage = \"gemma-3-270m\"\n");
    assert!(e.contains("models[0].file"), "{e}");
    let e = err("[[models]]\nname = \"a\"\nfile = \"/a\"\n[[models]]\nname = \"a\"\nfile = \"/b\"\n");
    assert!(e.contains("models[1].name") && e.contains("twice"), "{e}");
    let e = err("model_name = \"x\"\n[[models]]\nname = \"a\"\nfile = \"/a\"\n");
    assert!(e.contains("model_name"), "{e}");
    let e = err("[[models]]\nname = \"a\"\nfile = \"/a\"\npool = { tokens = 0 }\n");
    assert!(e.contains("models[0].pool"), "{e}");
}

#[test]
fn a_tenant_may_only_be_limited_to_served_models() {
    let e = err("last_tenant_id = 1\n[[models]]\nname = \"a\"\nfile = \"/a\"\n[[tenants]]\nid = 1\nname = \"t\"\n\
         key_sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\nmodels = [\"b\"]\n");
    assert!(e.contains("tenants[0].models") && e.contains("`b` is not a served model"), "{e}");
}

#[test]
fn a_worker_names_its_model_when_there_are_several() {
    let c = Config::from_toml_str("[[models]]\nname = \"a\"\nfile = \"/a\"\n[[models]]\nname = \"b\"\nfile = \"/b\"\n")
        .unwrap();
    let e = c.single_model("a worker").unwrap_err().to_string();
    assert!(e.contains("a worker loads one model") && e.contains("--model NAME"), "{e}");
    assert_eq!(c.model_named("b").unwrap().model_name, "b");
    let e = c.model_named("z").unwrap_err().to_string();
    assert!(e.contains("`z`") && e.contains("a, b"), "{e}");
}
