//! Shared fixtures: the real default model (loaded once per test binary) and the reference data.
#![allow(clippy::expect_used)] // test helpers outside #[test] fns
#![allow(dead_code)]

use std::sync::OnceLock;

use text::{ChatTemplate, Tokenizer};

pub struct Model {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

pub fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model available");
        let file = gguf::GgufFile::open(&path).expect("default model parses");
        Model {
            tokenizer: Tokenizer::from_gguf(&file).expect("tokenizer builds"),
            template: ChatTemplate::from_gguf(&file).expect("chat template compiles"),
        }
    })
}

pub fn tok() -> &'static Tokenizer {
    &model().tokenizer
}

pub fn reference(name: &str) -> serde_json::Value {
    let path = format!("{}/../../reference/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).expect("reference JSON parses")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32 id"))
        .collect()
}
