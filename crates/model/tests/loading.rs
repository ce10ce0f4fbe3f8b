#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Loading refuses what it cannot run, by name, and never panics on a damaged file.

use gguf::write::GgufWriter;
use gguf::{Gguf, GgufFile, Value};
use model::tiny::{tiny_gguf, TinySpec};
use model::{Llama, LoadOptions, ModelError};
use proptest::prelude::*;

fn load(bytes: Vec<u8>) -> Result<Llama, ModelError> {
    let f = GgufFile::from_bytes(bytes)?;
    Llama::from_file(&f, LoadOptions { threads: 1, ..Default::default() })
}

/// Rewrites a tiny model with `edit` applied to its metadata and tensor list.
fn rewrite(
    edit: impl Fn(&str, &mut Option<Value>),
    drop_tensor: Option<&str>,
    reshape: Option<(&str, Vec<u64>)>,
) -> Vec<u8> {
    let src = tiny_gguf(&TinySpec::default());
    let g = Gguf::parse(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let mut v = Some(v.clone());
        edit(k, &mut v);
        if let Some(v) = v {
            w.meta(k, v);
        }
    }
    for t in g.tensors() {
        if Some(t.name.as_str()) == drop_tensor {
            continue;
        }
        let data = g.tensor_data(&src, &t.name).unwrap().1.to_vec();
        let dims = match &reshape {
            Some((n, d)) if *n == t.name => d.clone(),
            _ => t.dims.clone(),
        };
        w.tensor(&t.name, &dims, t.ty, data);
    }
    w.to_bytes()
}

#[test]
fn the_generated_tiny_model_loads() {
    let m = load(tiny_gguf(&TinySpec::default())).unwrap();
    assert_eq!(m.config.n_layers, 2);
    assert_eq!(m.config.n_kv_heads, 2);
}

#[test]
fn unsupported_architecture_is_named() {
    let bytes = rewrite(
        |k, v| {
            if k == "general.architecture" {
                *v = Some(Value::String("mamba".into()));
            }
        },
        None,
        None,
    );
    match load(bytes) {
        Err(ModelError::UnsupportedArchitecture(a)) => assert_eq!(a, "mamba"),
        other => panic!("expected UnsupportedArchitecture, got {:?}", other.err()),
    }
}

#[test]
fn missing_tensor_is_named() {
    let bytes = rewrite(|_, _| {}, Some("blk.1.ffn_down.weight"), None);
    let err = load(bytes).err().expect("must fail");
    assert!(err.to_string().contains("blk.1.ffn_down.weight"), "{err}");
}

#[test]
fn wrong_shape_is_named_with_both_shapes() {
    let bytes = rewrite(|_, _| {}, None, Some(("blk.0.attn_norm.weight", vec![32, 2])));
    match load(bytes) {
        Err(ModelError::TensorShape { name, expected, found }) => {
            assert_eq!(name, "blk.0.attn_norm.weight");
            assert_eq!(expected, vec![64]);
            assert_eq!(found, vec![32, 2]);
        }
        other => panic!("expected TensorShape, got {:?}", other.err()),
    }
}

/// A tiny model with one more tensor than it reads.
fn with_extra(name: &str, dims: &[u64], data: Vec<u8>) -> Vec<u8> {
    changed(tiny_gguf(&TinySpec::default()), |_, _| {}, Some((name, dims, data)))
}

/// `src` with one more metadata key.
fn with_key(src: Vec<u8>, key: &str, value: Value) -> Vec<u8> {
    let g = Gguf::parse(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.meta(k, v.clone());
    }
    w.meta(key, value);
    for t in g.tensors() {
        w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(&src, &t.name).unwrap().1.to_vec());
    }
    w.to_bytes()
}

/// `src` with `edit` applied to its metadata and, if given, one more F32 tensor.
fn changed(src: Vec<u8>, edit: impl Fn(&str, &mut Value), extra: Option<(&str, &[u64], Vec<u8>)>) -> Vec<u8> {
    let g = Gguf::parse(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let mut v = v.clone();
        edit(k, &mut v);
        w.meta(k, v);
    }
    for t in g.tensors() {
        w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(&src, &t.name).unwrap().1.to_vec());
    }
    if let Some((name, dims, data)) = extra {
        w.tensor(name, dims, gguf::GgmlType::F32, data);
    }
    w.to_bytes()
}

#[test]
fn a_tensor_the_runtime_would_not_apply_is_refused_by_name_not_ignored() {
    // llama.cpp adds an output projection's bias where a llama file has one (and a Llama 3.1
    // file's rope_freqs, read since): running without it would answer as another model.
    let bias = with_extra("blk.0.attn_output.bias", &[64], vec![0; 64 * 4]);
    match load(bias) {
        Err(ModelError::UnreadTensor { name, arch }) => {
            assert_eq!((name.as_str(), arch), ("blk.0.attn_output.bias", "llama"))
        }
        other => panic!("expected UnreadTensor, got {:?}", other.err()),
    }
    // Read and applied for llama: the same file with rotary factors of 1 loads.
    let ones: Vec<u8> = (0..8).flat_map(|_| 1f32.to_le_bytes()).collect();
    assert!(load(with_extra("rope_freqs.weight", &[8], ones)).is_ok());
    // A factor that is not a positive number would turn every rotated key into NaN.
    let zero: Vec<u8> = (0..8).flat_map(|i| if i == 3 { 0f32 } else { 1f32 }.to_le_bytes()).collect();
    assert!(matches!(load(with_extra("rope_freqs.weight", &[8], zero)), Err(ModelError::Config(_))));
}

/// Gemma 2's output is its embedding: llama.cpp reads no `output.weight` for it, so a Gemma 2
/// file with one is refused naming it, not served with a projection llama.cpp would ignore. A
/// soft-cap or attention factor that is not a positive number is refused at load (a cap of 0
/// divides by zero, a negative one turns the scores around).
#[test]
fn gemma2_with_an_output_matrix_and_caps_or_rope_factors_that_are_no_positive_numbers_are_refused() {
    use model::tiny::{arch_gguf, Variant, ARCH_VOCAB};
    let gemma2 = || arch_gguf(&Variant::Gemma2.spec());
    let n_embd = Variant::Gemma2.spec().n_embd;
    let output = vec![0u8; n_embd * ARCH_VOCAB * 4];
    match load(changed(gemma2(), |_, _| {}, Some(("output.weight", &[n_embd as u64, ARCH_VOCAB as u64], output)))) {
        Err(ModelError::UnreadTensor { name, arch }) => assert_eq!((name.as_str(), arch), ("output.weight", "gemma2")),
        other => panic!("expected UnreadTensor, got {:?}", other.err()),
    }
    assert!(load(gemma2()).is_ok());
    for (key, bad) in [
        ("gemma2.attn_logit_softcapping", 0.0),
        ("gemma2.final_logit_softcapping", -30.0),
        ("gemma2.final_logit_softcapping", f32::NAN),
    ] {
        let edit = |k: &str, v: &mut Value| {
            if k == key {
                *v = Value::F32(bad);
            }
        };
        assert!(matches!(load(changed(gemma2(), edit, None)), Err(ModelError::Config(_))), "{key} = {bad}");
    }
    // A per-layer window pattern (an array) is not read, so it is refused, not guessed; a
    // local rotary base that is no positive number would turn every local key into NaN.
    for (key, bad) in [
        ("gemma2.attention.sliding_window_pattern", Value::Array(vec![Value::Bool(true), Value::Bool(false)])),
        ("gemma2.rope.freq_base_swa", Value::F32(-1.0)),
    ] {
        let file = with_key(gemma2(), key, bad.clone());
        assert!(matches!(load(file), Err(ModelError::Config(_))), "{key} = {bad:?}");
    }
    let phi3 = || arch_gguf(&Variant::Phi3.spec());
    assert!(load(phi3()).is_ok());
    let edit = |k: &str, v: &mut Value| {
        if k == "phi3.rope.scaling.attn_factor" {
            *v = Value::F32(0.0);
        }
    };
    assert!(matches!(load(changed(phi3(), edit, None)), Err(ModelError::Config(_))));
}

#[test]
fn missing_hyperparameter_is_named() {
    let bytes = rewrite(
        |k, v| {
            if k == "llama.block_count" {
                *v = None;
            }
        },
        None,
        None,
    );
    let err = load(bytes).err().expect("must fail");
    assert!(err.to_string().contains("llama.block_count"), "{err}");
}

#[test]
fn inconsistent_head_counts_are_refused() {
    let bytes = rewrite(
        |k, v| {
            if k == "llama.attention.head_count_kv" {
                *v = Some(Value::U32(3));
            }
        },
        None,
        None,
    );
    assert!(matches!(load(bytes), Err(ModelError::Config(_))));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn damaged_model_files_never_panic(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), cut in any::<prop::sample::Index>()) {
        let mut bytes = tiny_gguf(&TinySpec::default());
        // Damage the header region most of the time: that is where parsing happens.
        let header = 3000.min(bytes.len());
        for (i, b) in flips {
            let at = i.index(header);
            bytes[at] = b;
        }
        let _ = load(bytes.clone());
        let keep = cut.index(bytes.len());
        bytes.truncate(keep);
        let _ = load(bytes);
    }
}

/// `tiny_gguf(spec)` without the tensors named in `drop`.
fn without(spec: &TinySpec, drop: &[&str]) -> Vec<u8> {
    let src = tiny_gguf(spec);
    let g = Gguf::parse(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.meta(k, v.clone());
    }
    for t in g.tensors().iter().filter(|t| !drop.contains(&t.name.as_str())) {
        w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(&src, &t.name).unwrap().1.to_vec());
    }
    w.to_bytes()
}

#[test]
fn a_mapped_file_repacked_by_several_threads_holds_the_same_weights_as_one_thread_reading_it() {
    let spec = TinySpec { n_layers: 7, ..TinySpec::default() };
    let bytes = tiny_gguf(&spec);
    let dir = std::env::temp_dir().join(format!("pw-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let one = load(bytes).unwrap();
    let many = Llama::load(&path, LoadOptions { threads: 4, ..Default::default() }).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let same = |a: &model::qmatrix::QMatrix, b: &model::qmatrix::QMatrix| {
        assert_eq!((a.kind, a.rows, a.cols), (b.kind, b.rows, b.cols));
        assert_eq!((&a.qs[..], &a.d[..], &a.m[..], &a.qh[..]), (&b.qs[..], &b.d[..], &b.m[..], &b.qh[..]));
        assert_eq!((&a.sc[..], &a.mn[..], &a.fd[..]), (&b.sc[..], &b.mn[..], &b.fd[..]));
    };
    assert_eq!(many.weights.layers.len(), 7);
    for (a, b) in one.weights.layers.iter().zip(&many.weights.layers) {
        for (x, y) in [(&a.wqkv, &b.wqkv), (&a.w_gate_up, &b.w_gate_up)] {
            assert_eq!(x.parts.len(), y.parts.len());
            x.parts.iter().zip(&y.parts).for_each(|(x, y)| same(x, y));
        }
        for (x, y) in [(&a.wo, &b.wo), (&a.w_down, &b.w_down)] {
            same(x, y);
        }
        assert_eq!((&a.attn_norm, &a.ffn_norm), (&b.attn_norm, &b.ffn_norm));
    }
    same(&one.weights.tok_embd, &many.weights.tok_embd);
    assert_eq!(one.weights.out_norm, many.weights.out_norm);
}

#[test]
fn repacked_by_several_threads_a_file_missing_tensors_is_refused_naming_the_first_layer_that_lacks_one() {
    let spec = TinySpec { n_layers: 8, ..TinySpec::default() };
    let bytes = without(&spec, &["blk.2.ffn_up.weight", "blk.6.attn_q.weight"]);
    for threads in [1, 2, 5] {
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        let err = Llama::from_file(&f, LoadOptions { threads, ..Default::default() }).err().expect("must fail");
        assert!(err.to_string().contains("blk.2.ffn_up.weight"), "{threads} threads: {err}");
    }
}
