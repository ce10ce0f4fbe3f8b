//! `out = x · Wᵀ` for a batch of tokens, parallel over groups of weight rows.

use std::ops::Range;

use crate::kernels::{self, Isa, TOKENS_PER_TILE};
use crate::qmatrix::{QMatrix, GROUP};
use crate::quant::QuantActs;
use crate::threads::ComputePool;

/// `out[t * w.rows + r]` for every token `t` of `a` and row `r` of `w`.
pub fn matmul(pool: &ComputePool, isa: Isa, w: &QMatrix, a: &QuantActs, out: &mut [f32]) {
    matmul_into(pool, isa, w, a, out, w.rows, 0);
}

/// `out[t * stride + col0 + r]` for every token `t` of `a` and row `r` of `w`: `w`'s columns
/// of a wider output (a part of a [`crate::stack::QStack`]); nothing else of `out` is written.
pub fn matmul_into(
    pool: &ComputePool,
    isa: Isa,
    w: &QMatrix,
    a: &QuantActs,
    out: &mut [f32],
    stride: usize,
    col0: usize,
) {
    let t = a.rows;
    let rows = w.rows;
    assert_eq!(a.blocks_per_row, w.blocks(), "activation width does not match the matrix");
    assert!(col0 + rows <= stride && out.len() >= t * stride);
    // Enough tasks to balance the threads, few enough that each amortizes its dispatch; even
    // where AMX tiles take the groups in pairs.
    let groups = w.groups();
    let (tiled, signed) = amx_plan(isa, w, t);
    let per_task = groups.div_ceil(pool.threads() * 4).max(1).next_multiple_of(if tiled > 0 { 2 } else { 1 });
    // Wrapping: with no tokens `out` may be empty; every write below is inside `out` (asserted).
    let base = OutPtr(out.as_mut_ptr().wrapping_add(col0));
    pool.run(groups.div_ceil(per_task), &|task| {
        let base = &base;
        let task_groups = task * per_task..((task + 1) * per_task).min(groups);
        if tiled > 0 {
            for g in task_groups.clone().step_by(2) {
                let pair: &[usize] = if g + 1 < task_groups.end { &[g, g + 1] } else { &[g] };
                // SAFETY: `amx_plan` checked the CPU and the kind, and gave tiles that start
                // below `t`; the tiles store only tokens below `t`, and the groups' valid
                // columns of those rows lie inside `out` and belong to this task.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    kernels::amx::group_tiles(w, pair, signed, a, tiled, base.0, stride)
                };
            }
        }
        let per_call = isa.tokens_per_tile();
        // Token chunks outside, groups inside: a chunk's activations stay in L2 across the
        // task's groups, each group's weights stream once per chunk.
        let per_chunk = tokens_per_chunk(a, per_call);
        for c0 in ((tiled * AMX_TOKENS).min(t)..t).step_by(per_chunk) {
            let chunk = c0..(c0 + per_chunk).min(t);
            for g in task_groups.clone() {
                // SAFETY: the chunk's rows lie below `t`, whose rows of this task's groups lie
                // inside `out` (asserted above) and are written by this task only.
                unsafe { vector_group(isa, w, g, a, chunk.clone(), per_call, base.0, stride) };
            }
        }
    });
}

/// Bytes of quantized activations the vector kernels' pass over a task's groups should reuse
/// from L2 (1-2 MiB a core on the machines measured): past it, a pass re-read every token's
/// activations from L3 once per 16-row group. Chunking the tokens so the chunk stays in L2 gave
/// a 1536x8960 Q4_K product of 512 tokens 580-620 GOP/s against 440-500, 8960x1536 505-520
/// against 385-485, Q6_K 430-440 against 405-410 (Xeon, AVX-512 VNNI, 2 threads).
const ACTS_CHUNK_BYTES: usize = 512 * 1024;

/// Tokens per chunk: as many whole kernel calls as fit [`ACTS_CHUNK_BYTES`], at least one.
fn tokens_per_chunk(a: &QuantActs, per_call: usize) -> usize {
    (ACTS_CHUNK_BYTES / a.row_bytes().max(1)).max(per_call) / per_call * per_call
}

/// Group `g`'s rows of `tokens`' outputs through the vector kernels, `per_call` tokens a call.
///
/// # Safety
/// `out` is the output of [`matmul_into`] (its columns offset by `col0`), whose rows `tokens`,
/// columns of group `g`, lie inside it and are written by this caller only.
#[allow(clippy::too_many_arguments)]
unsafe fn vector_group(
    isa: Isa,
    w: &QMatrix,
    g: usize,
    a: &QuantActs,
    tokens: Range<usize>,
    per_call: usize,
    out: *mut f32,
    stride: usize,
) {
    let valid = GROUP.min(w.rows - g * GROUP);
    let end = tokens.end;
    for t0 in tokens.step_by(per_call) {
        let nt = per_call.min(end - t0);
        if valid == GROUP {
            // SAFETY: rows t0..t0+nt, columns g*16..g*16+16 are the caller's (above).
            unsafe { kernels::group_dot(isa, w, g, a, t0, nt, out.add(t0 * stride + g * GROUP), stride) };
        } else {
            // A partial last group goes through a buffer so its padding rows are never
            // stored into another task's columns.
            let mut buf = [0f32; GROUP * TOKENS_PER_TILE];
            // SAFETY: `buf` holds nt rows of 16.
            unsafe { kernels::group_dot(isa, w, g, a, t0, nt, buf.as_mut_ptr(), GROUP) };
            for tt in 0..nt {
                for r in 0..valid {
                    // SAFETY: inside `out`, in the caller's columns, as above.
                    unsafe { out.add((t0 + tt) * stride + g * GROUP + r).write(buf[tt * GROUP + r]) };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
const AMX_TOKENS: usize = kernels::amx::TOKENS;
#[cfg(not(target_arch = "x86_64"))]
const AMX_TOKENS: usize = 16;

/// Fewest tokens for the tiles when they unpack the weights per call: below two tiles a pass
/// pairs groups but not token tiles, and measured slower than the VNNI kernel (batch-16 decode
/// 0 to -11%, about -5% typical: the unpack is shared by half as many tokens).
const AMX_MIN_TOKENS: usize = 2 * AMX_TOKENS;

/// Fewest tokens for the tiles on a matrix whose signed copy is kept (no unpack).
const AMX_MIN_TOKENS_KEPT: usize = AMX_TOKENS;

/// The tiles' share of a product of `t` tokens: how many 16-token tiles go through AMX (any
/// rest through the vector kernels, which give the same bits), and `w`'s signed copy where one
/// is kept. Past the minimum, a last, partial tile goes through the tiles too, padded: beside
/// a whole tile in a pass it adds only products, and even on its own it beat the vector
/// kernels, which stream the weights once per call of a few tokens (measured when a call took
/// four, as on AVX2; eight on AVX-512 since: with one token left to them, a 17-token decode
/// step gave 15-20% fewer tokens per second than a 16-token one; on its own, the partial tile
/// was +2-3% at 33 tokens and +7-10% at 40).
fn amx_plan(isa: Isa, w: &QMatrix, t: usize) -> (usize, Option<&[u8]>) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx && t >= AMX_MIN_TOKENS_KEPT && kernels::amx::handles(w.kind) && kernels::amx::available() {
        let signed = kernels::amx::signed_weights(w);
        if t >= if signed.is_some() { AMX_MIN_TOKENS_KEPT } else { AMX_MIN_TOKENS } {
            return (t.div_ceil(AMX_TOKENS), signed);
        }
    }
    let _ = (isa, w);
    (0, None)
}

struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint column blocks of the output through it (see `matmul`).
unsafe impl Sync for OutPtr {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::dequantize;
    use crate::qmatrix::{Q6kLayout, QKind};
    use crate::synth::{random_blocks, QUANTIZED};
    use gguf::GgmlType;

    /// A ggml-encoded random matrix, deterministic from `seed`.
    fn random_ggml(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let (be, _) = ty.block();
        random_blocks(ty, rows * cols / be, seed)
    }

    /// Shapes with row counts that are and are not multiples of 16 (rows, cols, tokens), and
    /// token counts that fill 16-token tiles with and without a remainder: a partial tile
    /// beside a whole one in a pass (17, 20, 53) and one on its own (33, 37).
    fn shapes(ty: GgmlType) -> &'static [(usize, usize, usize)] {
        if ty.block().0 == 256 {
            &[
                (16, 256, 1),
                (40, 512, 3),
                (192, 256, 7),
                (33, 768, 4),
                (17, 1536, 9),
                (40, 512, 37),
                (16, 256, 16),
                (40, 512, 17),
                (16, 256, 53),
                // Every tile width of both sets (up to 8 tokens a call) as a last tile.
                (16, 256, 2),
                (40, 512, 14),
                // Rows wide enough that the vector kernels take the tokens in several chunks
                // (`tokens_per_chunk`), the last one partial.
                (33, 24576, 53),
            ]
        } else {
            &[
                (16, 32, 1),
                (40, 96, 3),
                (192, 576, 7),
                (33, 64, 4),
                (17, 1536, 9),
                (40, 96, 37),
                (33, 1536, 16),
                (16, 32, 48),
                (40, 96, 17),
                (33, 64, 20),
                (16, 32, 33),
                (40, 96, 53),
                (16, 32, 2),
                (40, 96, 14),
                (33, 24576, 53),
            ]
        }
    }

    #[test]
    fn token_chunks_are_whole_kernel_calls_and_the_widest_test_shape_takes_several() {
        let mut a = QuantActs::default();
        for (cols, t) in [(24576, 53), (256, 1), (1 << 20, 3)] {
            a.quantize(&vec![0.5; t * cols], t, cols, crate::quant::ActFormat::Q8_0);
            for per_call in [4, 8] {
                let chunk = tokens_per_chunk(&a, per_call);
                assert!(chunk >= per_call && chunk.is_multiple_of(per_call), "{cols}: {chunk}");
                assert!(chunk * a.row_bytes() <= ACTS_CHUNK_BYTES || chunk == per_call);
            }
        }
        a.quantize(&vec![0.5; 53 * 24576], 53, 24576, crate::quant::ActFormat::Q8_0);
        assert!(tokens_per_chunk(&a, 8) < 53 / 2, "the shapes below must cross chunk boundaries");
    }

    fn check_isa(isa: Isa, ty: GgmlType, layout: Q6kLayout) {
        let build = |rows: usize, cols: usize| {
            let raw = random_ggml(ty, rows, cols, rows as u64);
            QMatrix::from_parts_laid_out(&[(ty, rows, &raw)], cols, layout).unwrap()
        };
        for &(rows, cols, t) in shapes(ty) {
            let w = build(rows, cols);
            let x: Vec<f32> = (0..t * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0).collect();
            let mut a = QuantActs::default();
            crate::qmatrix::quantize_for(&w, &x, t, &mut a);
            let mut want = vec![0.0; t * rows];
            let pool = ComputePool::new(2).unwrap();
            matmul(&pool, Isa::Scalar, &w, &a, &mut want);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            // The output has room for a whole tile more, marked: a kernel that computes a
            // partial tile's padding tokens must not store them.
            let mark = f32::from_bits(0x7fc0_0bad);
            let run = |w: &QMatrix, what: &str| {
                let mut got = vec![mark; (t + 16) * rows];
                matmul(&pool, isa, w, &a, &mut got);
                assert_eq!(bits(&want), bits(&got[..t * rows]), "{isa:?} {what}{ty:?} {rows}x{cols} t={t}");
                assert!(
                    got[t * rows..].iter().all(|v| v.to_bits() == mark.to_bits()),
                    "{isa:?} {what}stored past t={t}"
                );
            };
            run(&w, "");
            if isa == Isa::Amx {
                // And where the tiles' signed copy is not kept (over budget), they unpack per call.
                let unkept = build(rows, cols);
                assert!(unkept.signed.set(None).is_ok());
                run(&unkept, "unkept ");
            }
            // And the scalar kernel itself agrees with a dequantized float dot product.
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                w.row_f32(r, &mut row);
                for ti in 0..t {
                    let exact: f32 = row.iter().zip(&x[ti * cols..]).map(|(a, b)| a * b).sum();
                    let tol = 0.02 * row.iter().map(|v| v.abs()).sum::<f32>() + 1e-3;
                    let got = want[ti * rows + r];
                    assert!((exact - got).abs() < tol, "{ty:?} row {r} token {ti}: {exact} vs {got}");
                }
            }
        }
    }

    fn check_every_isa(ty: GgmlType) {
        for isa in Isa::available() {
            check_isa(isa, ty, Q6kLayout::Packed);
        }
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q4_1() {
        check_every_isa(GgmlType::Q4_1);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q8_0() {
        check_every_isa(GgmlType::Q8_0);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q4_0() {
        check_every_isa(GgmlType::Q4_0);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q5_0() {
        check_every_isa(GgmlType::Q5_0);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q5_1() {
        check_every_isa(GgmlType::Q5_1);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q4_k() {
        check_every_isa(GgmlType::Q4_K);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q5_k() {
        check_every_isa(GgmlType::Q5_K);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q6_k() {
        check_every_isa(GgmlType::Q6_K);
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q6_k_laid_out_wide() {
        for isa in Isa::available() {
            check_isa(isa, GgmlType::Q6_K, Q6kLayout::Wide);
        }
    }

    #[test]
    fn q6_k_packed_holds_about_the_files_bytes_and_wide_half_as_much_again() {
        let (rows, cols) = (64, 1024);
        let raw = random_ggml(GgmlType::Q6_K, rows, cols, 5);
        let lay = |l| QMatrix::from_parts_laid_out(&[(GgmlType::Q6_K, rows, &raw)], cols, l).unwrap();
        let (packed, wide) = (lay(Q6kLayout::Packed), lay(Q6kLayout::Wide));
        assert_eq!((packed.kind, wide.kind), (QKind::Q6K, QKind::Q6KWide));
        // 210 bytes per 256 weights in the file; 212 packed (the superblock scale as f32).
        assert_eq!(
            (raw.len(), packed.bytes(), wide.bytes()),
            (rows * cols / 256 * 210, rows * cols / 256 * 212, rows * cols / 256 * 320)
        );
        // The same values and scales either way.
        let (mut a, mut b) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            packed.row_f32(r, &mut a);
            wide.row_f32(r, &mut b);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn q5_1_and_q5_k_hold_about_the_files_bytes() {
        let (rows, cols) = (64, 1024);
        for (ty, kind, file, held) in [
            // 24 bytes per 32 weights in the file, and here: nibbles, fifth bits, f16 d and m.
            (GgmlType::Q5_1, QKind::Q5_1, 24 * 32, 24 * 32),
            // 176 per 256 in the file; 180 here (each block's 6-bit scale and minimum a byte).
            (GgmlType::Q5_K, QKind::Q5K, 176 * 4, 180 * 4),
        ] {
            let raw = random_ggml(ty, rows, cols, 7);
            let w = QMatrix::from_ggml(ty, rows, cols, &raw).unwrap();
            assert_eq!(w.kind, kind);
            assert_eq!((raw.len(), w.bytes()), (rows * file, rows * held), "{ty:?}");
        }
    }

    #[test]
    fn a_signed_copy_over_the_budget_is_refused() {
        use crate::qmatrix::SignedCopy;
        assert!(SignedCopy::reserve(usize::MAX, usize::MAX - 1).is_none());
        assert!(SignedCopy::reserve(1 << 20, 0).is_none());
        let copy = SignedCopy::reserve(64, usize::MAX).expect("within an unbounded budget");
        assert_eq!(copy.bytes(), &[0u8; 64][..]);
    }

    #[test]
    fn repacked_rows_dequantize_to_ggml_values() {
        for ty in QUANTIZED {
            let (be, bb) = ty.block();
            let (rows, cols) = (20, 2 * be.max(32));
            let raw = random_ggml(ty, rows, cols, 3);
            let w = QMatrix::from_ggml(ty, rows, cols, &raw).unwrap();
            let row_bytes = cols / be * bb;
            let mut got = vec![0.0; cols];
            for r in 0..rows {
                w.row_f32(r, &mut got);
                let want = dequantize(ty, &raw[r * row_bytes..(r + 1) * row_bytes]);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{ty:?} row {r}");
            }
        }
    }

    #[test]
    fn each_file_type_maps_onto_its_kernel_format() {
        let want = [
            (GgmlType::Q4_0, QKind::Q4_0),
            (GgmlType::Q4_1, QKind::Q4_1),
            (GgmlType::Q5_0, QKind::Q5_0),
            (GgmlType::Q5_1, QKind::Q5_1),
            (GgmlType::Q8_0, QKind::Q8_0),
            (GgmlType::Q4_K, QKind::Q4K),
            (GgmlType::Q5_K, QKind::Q5K),
            (GgmlType::Q6_K, QKind::Q6K),
        ];
        for (ty, kind) in want {
            assert_eq!(QKind::of(ty), Some(kind), "{ty:?}");
        }
        assert_eq!(QKind::of(GgmlType::F16), None);
    }

    #[test]
    fn parts_sharing_a_kernel_format_stack_with_exact_values() {
        // As Gemma 3 stacks Q5_0 q and k with a Q8_0 v.
        let cols = 64;
        let parts = [(GgmlType::Q5_0, 16), (GgmlType::Q4_0, 3), (GgmlType::Q8_0, 5)];
        let raw: Vec<Vec<u8>> = parts.iter().map(|&(ty, n)| random_ggml(ty, n, cols, n as u64)).collect();
        let stack: Vec<_> = parts.iter().zip(&raw).map(|(&(ty, n), r)| (ty, n, &r[..])).collect();
        let w = QMatrix::from_parts(&stack, cols).unwrap();
        assert_eq!((w.kind, w.rows), (QKind::Q8_0, 24));
        let want: Vec<f32> = parts.iter().zip(&raw).flat_map(|(&(ty, _), r)| dequantize(ty, r)).collect();
        let mut got = vec![0.0; cols];
        for r in 0..24 {
            w.row_f32(r, &mut got);
            assert_eq!(got, want[r * cols..(r + 1) * cols], "row {r}");
        }
    }

    #[test]
    fn parts_of_different_kernel_formats_do_not_stack() {
        let (a, b) = (random_ggml(GgmlType::Q4_K, 2, 256, 1), random_ggml(GgmlType::Q6_K, 2, 256, 2));
        let err = QMatrix::from_parts(&[(GgmlType::Q4_K, 2, &a), (GgmlType::Q6_K, 2, &b)], 256).err().unwrap();
        assert!(err.to_string().contains("cannot stack Q6_K with Q4_K"), "{err}");
    }

    #[test]
    fn k_quant_rows_must_be_whole_superblocks_of_256() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let raw = random_ggml(ty, 1, 256, 1);
            let err = QMatrix::from_ggml(ty, 2, 128, &raw).err().unwrap();
            let msg = err.to_string();
            assert!(msg.contains("whole superblocks of 256 columns"), "{msg}");
            assert!(msg.contains(ty.name()), "{msg}");
        }
    }
}
