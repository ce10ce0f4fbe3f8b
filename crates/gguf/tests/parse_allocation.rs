#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What a GGUF header's counts make the parser allocate, measured: this binary's global
//! allocator records, per thread, the largest single allocation and the total. A count is
//! only a claim until the items it counts are read, so a refused header may cost a few KiB,
//! never memory in proportion to what it claims (or a multiple of the file's size).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use gguf::write::GgufWriter;
use gguf::{Gguf, GgufError, Value};

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only adds bookkeeping in thread-locals (which
// `try_with` skips while a thread is being torn down).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        let _ = TOTAL.try_with(|t| t.set(t.get() + layout.size()));
        unsafe { System.alloc(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        let _ = TOTAL.try_with(|t| t.set(t.get() + new_size));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// (largest single allocation, total bytes allocated) while parsing `bytes` on this thread,
/// and the result.
fn parse_measured(bytes: &[u8]) -> (usize, usize, Result<Gguf, GgufError>) {
    LARGEST.with(|l| l.set(0));
    TOTAL.with(|t| t.set(0));
    let r = Gguf::parse(bytes);
    (LARGEST.with(Cell::get), TOTAL.with(Cell::get), r)
}

/// A refused header may cost this much at most, whatever it claims and however long it is.
const REFUSAL_BUDGET: usize = 16 << 10;

fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn key(b: &mut Vec<u8>, k: &str, ty: u32) {
    b.extend_from_slice(&(k.len() as u64).to_le_bytes());
    b.extend_from_slice(k.as_bytes());
    b.extend_from_slice(&ty.to_le_bytes());
}

/// `n` bytes of `fill` after `b`.
fn padded(mut b: Vec<u8>, n: usize, fill: u8) -> Vec<u8> {
    b.resize(b.len() + n, fill);
    b
}

#[test]
fn huge_counts_are_refused_without_allocating() {
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("u64::MAX tensors", header(u64::MAX, 0)),
        ("u64::MAX metadata entries", header(0, u64::MAX)),
        ("a key of u64::MAX bytes", {
            let mut b = header(0, 1);
            b.extend_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("a string value of u64::MAX bytes", {
            let mut b = header(0, 1);
            key(&mut b, "k", 8);
            b.extend_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("an array of u64::MAX strings", {
            let mut b = header(0, 1);
            key(&mut b, "k", 9);
            b.extend_from_slice(&8u32.to_le_bytes());
            b.extend_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("a tensor of u32::MAX dimensions", {
            let mut b = header(1, 0);
            b.extend_from_slice(&1u64.to_le_bytes());
            b.push(b't');
            b.extend_from_slice(&u32::MAX.to_le_bytes());
            b
        }),
    ];
    // Counts the file's length could hold, whose items then turn out bad: the count passes
    // the bytes-left check, so only the parser's own restraint keeps what it reserves for
    // them small. Each file is 1 MiB.
    const MIB: usize = 1 << 20;
    cases.push(("an array of a million bools, the first not a bool", {
        let mut b = header(0, 1);
        key(&mut b, "k", 9);
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(&(MIB as u64).to_le_bytes());
        padded(b, MIB, 2)
    }));
    cases.push(("80,000 metadata entries, the first key not UTF-8", {
        let mut b = header(0, (MIB / 13) as u64);
        b.extend_from_slice(&8u64.to_le_bytes());
        padded(b, MIB, 0xff)
    }));
    cases.push(("43,000 tensors, the first with 9 dimensions", {
        let mut b = header((MIB / 24) as u64, 0);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b't');
        b.extend_from_slice(&9u32.to_le_bytes());
        padded(b, MIB, 0)
    }));
    cases.push(("a key of a mebibyte, not UTF-8", {
        let mut b = header(0, 1);
        b.extend_from_slice(&(MIB as u64).to_le_bytes());
        padded(b, MIB, 0xff)
    }));
    for (what, bytes) in &cases {
        let (largest, total, r) = parse_measured(bytes);
        assert!(matches!(r, Err(GgufError::Malformed { .. })), "{what}: {r:?}");
        assert!(
            largest <= REFUSAL_BUDGET && total <= 2 * REFUSAL_BUDGET,
            "{what} ({} bytes): largest allocation {largest}, total {total}",
            bytes.len()
        );
    }
}

#[test]
fn a_legitimate_file_with_large_arrays_still_parses_and_allocates_in_proportion() {
    // A tokenizer-sized vocabulary: the vectors grow as items are read, past any up-front
    // reservation.
    let tokens: Vec<Value> = (0..50_000).map(|i| Value::String(format!("tok{i}"))).collect();
    let types: Vec<Value> = (0..50_000).map(|i| Value::I32(i % 7)).collect();
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("tokenizer.ggml.tokens", Value::Array(tokens))
        .meta("tokenizer.ggml.token_type", Value::Array(types))
        .tensor("w", &[4, 2], gguf::GgmlType::F32, vec![1u8; 32]);
    let bytes = w.to_bytes();
    let (largest, _, r) = parse_measured(&bytes);
    let g = r.unwrap();
    let got = g.str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!((got.len(), got[0], got[49_999]), (50_000, "tok0", "tok49999"));
    assert_eq!(g.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()).map(<[Value]>::len), Some(50_000));
    assert_eq!(g.tensor("w").unwrap().dims, vec![4, 2]);
    // Whatever is reserved stands for items actually read: a small multiple of the file.
    assert!(largest <= 4 * bytes.len(), "largest allocation {largest} for a file of {}", bytes.len());
}
