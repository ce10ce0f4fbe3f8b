#![allow(clippy::unwrap_used, clippy::expect_used)]
use gguf::write::GgufWriter;
use gguf::{GgmlType, Gguf, GgufError, Value};
use proptest::prelude::*;

fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("llama.block_count", Value::U32(2))
        .meta("llama.rope.freq_base", Value::F32(10000.0))
        .meta("tokenizer.ggml.tokens", Value::Array(vec![Value::String("a".into()), Value::String("b".into())]))
        .tensor("w", &[4, 2], GgmlType::F32, vec![1u8; 32])
        .tensor("q", &[32, 1], GgmlType::Q8_0, vec![2u8; 34]);
    w.to_bytes()
}

#[test]
fn written_file_reads_back_metadata_and_tensors() {
    let bytes = sample();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.str("general.architecture").unwrap(), "llama");
    assert_eq!(g.u64("llama.block_count").unwrap(), 2);
    assert_eq!(g.f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(g.str_array("tokenizer.ggml.tokens").unwrap(), vec!["a", "b"]);
    let (t, data) = g.tensor_data(&bytes, "q").unwrap();
    assert_eq!(t.ty, GgmlType::Q8_0);
    assert_eq!(data, &[2u8; 34][..]);
    assert_eq!(g.tensor_data(&bytes, "w").unwrap().1, &[1u8; 32][..]);
}

#[test]
fn missing_key_and_wrong_type_are_named() {
    let bytes = sample();
    let g = Gguf::parse(&bytes).unwrap();
    assert!(matches!(g.u64("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert!(matches!(g.u64("general.architecture"), Err(GgufError::WrongType { .. })));
    assert!(matches!(g.tensor("absent"), Err(GgufError::MissingTensor(_))));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample();
    for cut in 0..bytes.len() - 1 {
        // The last tensor's padding may be cut without losing data; anything earlier must fail.
        let r = Gguf::parse(&bytes[..cut]);
        if cut < bytes.len() - 30 {
            assert!(r.is_err(), "truncated at {cut} of {} parsed", bytes.len());
        }
    }
}

#[test]
fn wrong_magic_and_version_are_typed() {
    let mut bytes = sample();
    bytes[0] = b'X';
    assert!(matches!(Gguf::parse(&bytes), Err(GgufError::BadMagic { .. })));
    let mut bytes = sample();
    bytes[4] = 9;
    assert!(matches!(Gguf::parse(&bytes), Err(GgufError::UnsupportedVersion(9))));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn corrupted_bytes_never_panic(flips in proptest::collection::vec((0usize..400, any::<u8>()), 1..8), cut in 0usize..400) {
        let mut bytes = sample();
        for (i, b) in flips {
            let n = bytes.len();
            bytes[i % n] = b;
        }
        let cut = cut.min(bytes.len());
        let _ = Gguf::parse(&bytes[..cut]);
        let _ = Gguf::parse(&bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.extend_from_slice(&bytes);
        let _ = Gguf::parse(&b);
        let _ = Gguf::parse(&bytes);
    }
}

#[test]
fn tensor_of_an_unsupported_type_is_refused_by_name_and_id() {
    // A Q2_K tensor: 256 elements in one 84-byte block.
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into())).tensor_type_id(
        "blk.0.attn_k.weight",
        &[256, 1],
        10,
        vec![0u8; 84],
    );
    let err = Gguf::parse(&w.to_bytes()).unwrap_err();
    assert!(matches!(err, GgufError::UnsupportedTensorType { ty: 10, .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "tensor blk.0.attn_k.weight: unsupported ggml type Q2_K (type 10); supported: F32, F16, BF16, Q4_0, Q4_1, \
         Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"
    );
}

#[test]
fn k_quant_tensors_are_read_with_their_block_sizes() {
    let mut w = GgufWriter::new();
    w.tensor("a", &[256, 2], GgmlType::Q4_K, vec![1u8; 288])
        .tensor("b", &[256, 1], GgmlType::Q5_K, vec![2u8; 176])
        .tensor("c", &[512, 1], GgmlType::Q6_K, vec![3u8; 420])
        .tensor("d", &[64, 1], GgmlType::Q5_0, vec![4u8; 44])
        .tensor("e", &[32, 1], GgmlType::Q5_1, vec![5u8; 24]);
    let bytes = w.to_bytes();
    let g = Gguf::parse(&bytes).unwrap();
    for (name, ty, len) in
        [("a", GgmlType::Q4_K, 288), ("b", GgmlType::Q5_K, 176), ("c", GgmlType::Q6_K, 420), ("d", GgmlType::Q5_0, 44)]
    {
        let (t, data) = g.tensor_data(&bytes, name).unwrap();
        assert_eq!((t.ty, data.len()), (ty, len), "{name}");
    }
    assert_eq!(g.tensor("e").unwrap().n_bytes, 24);
    // A K-quant row must be whole superblocks.
    let mut w = GgufWriter::new();
    w.tensor("k", &[128, 2], GgmlType::Q4_K, vec![0u8; 144]);
    assert!(matches!(Gguf::parse(&w.to_bytes()), Err(GgufError::Malformed { .. })));
}
