#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Our dequantizers against an independent implementation: gguf-py (the `gguf` package that
//! ships with llama.cpp), `gguf.quants.dequantize`, on random but valid blocks of every
//! quantized type.
//!
//! The values must be bit-identical, not merely close: gguf-py computes each element with the
//! same single f32 operations in the same order as ggml's `dequantize_row_*` (numpy does not
//! fuse a multiply and an add), f16 to f32 conversion is exact, and the sub-block scale
//! products (`d * sc`, `dmin * m`) are exact in f32, so there is no rounding to differ.
//!
//! Needs `python3` and PyPI (the venv is created once under the target's temporary directory).

use std::path::{Path, PathBuf};
use std::process::Command;

use gguf::GgmlType;
use model::dequant::dequantize;
use model::synth::random_blocks;

const GGUF_PY: &str = "gguf==0.19.0";

const SCRIPT: &str = r#"
import sys
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
name, src, dst = sys.argv[1:4]
raw = np.fromfile(src, dtype=np.uint8)
out = dequantize(raw, GGMLQuantizationType[name])
assert out.dtype == np.float32, out.dtype
out.reshape(-1).astype("<f4").tofile(dst)
"#;

/// The venv's interpreter, with gguf-py installed. A file lock serializes creation across the
/// test threads and across concurrent test runs; a marker written last tells a finished venv
/// from one whose creation was interrupted.
fn python() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(tmp).unwrap();
    let lock = std::fs::File::create(tmp.join("gguf-venv.lock")).unwrap();
    lock.lock().unwrap();
    let venv = tmp.join("gguf-venv");
    let python = venv.join("bin/python");
    let marker = venv.join(format!("installed-{GGUF_PY}"));
    if !marker.exists() {
        let _ = std::fs::remove_dir_all(&venv);
        let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
        assert!(ok.success(), "creating a venv failed");
        let pip = Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", GGUF_PY])
            .status()
            .expect("pip install");
        assert!(pip.success(), "pip install {GGUF_PY} failed (is PyPI reachable?)");
        std::fs::write(&marker, b"").unwrap();
    }
    python
}

/// gguf-py's dequantization of `raw` (whole blocks of `ty`).
fn gguf_py_dequantize(ty: GgmlType, raw: &[u8]) -> Vec<f32> {
    let python = python();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("dequant-{}-{}", ty.name(), std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, dst) = (dir.join("blocks.bin"), dir.join("values.f32"));
    std::fs::write(&src, raw).unwrap();
    let out = Command::new(python).arg("-c").arg(SCRIPT).arg(ty.name()).arg(&src).arg(&dst).output().unwrap();
    assert!(out.status.success(), "gguf-py failed on {}:\n{}", ty.name(), String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&dst).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn assert_bit_identical_to_gguf_py(ty: GgmlType) {
    let raw = random_blocks(ty, 512, 0x5eed ^ ty.id() as u64);
    let ours = dequantize(ty, &raw);
    let theirs = gguf_py_dequantize(ty, &raw);
    assert_eq!(ours.len(), 512 * ty.block().0);
    assert_eq!(theirs.len(), ours.len(), "{}: element count", ty.name());
    let bad: Vec<_> = ours.iter().zip(&theirs).enumerate().filter(|(_, (a, b))| a.to_bits() != b.to_bits()).collect();
    assert!(
        bad.is_empty(),
        "{}: {} of {} values differ, first (index, ours, gguf-py): {:?}",
        ty.name(),
        bad.len(),
        ours.len(),
        &bad[..bad.len().min(5)]
    );
}

#[test]
fn q4_0_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q4_0);
}

#[test]
fn q4_1_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q4_1);
}

#[test]
fn q5_0_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q5_0);
}

#[test]
fn q5_1_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q5_1);
}

#[test]
fn q8_0_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q8_0);
}

#[test]
fn q4_k_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q4_K);
}

#[test]
fn q5_k_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q5_K);
}

#[test]
fn q6_k_dequantizes_bit_identically_to_gguf_py() {
    assert_bit_identical_to_gguf_py(GgmlType::Q6_K);
}
