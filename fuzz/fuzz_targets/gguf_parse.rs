//! Arbitrary bytes as a GGUF file: parsing must return a value or a typed error, never panic or
//! allocate beyond what the input can describe.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = gguf::Gguf::parse(data) {
        for t in g.tensors() {
            let _ = g.tensor_data(data, &t.name);
        }
        let _ = g.str_array("tokenizer.ggml.tokens");
    }
});
