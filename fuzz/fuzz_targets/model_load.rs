//! Arbitrary bytes as a model file: loading must fail with a typed error or produce a model,
//! never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = gguf::GgufFile::from_bytes(data.to_vec()) {
        let _ = model::Llama::from_file(&f, model::LoadOptions { threads: 1, ..Default::default() });
    }
});
