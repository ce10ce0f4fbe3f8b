//! AVX-512 VNNI: one `vpdpbusd` multiplies four bytes of each of sixteen rows by four broadcast
//! activation bytes, so a 32-element block of 16 rows is eight instructions per token.

use std::arch::x86_64::*;

use crate::qmatrix::{QKind, QMatrix, GROUP, KBLOCKS};
use crate::quant::{QuantActs, QK};

#[inline(always)]
unsafe fn load_f16x16(p: *const u16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

#[inline(always)]
unsafe fn load_u8x16(p: *const u8) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)))
}

/// `-v` exactly (a sign flip; `_mm512_xor_ps` would need avx512dq).
#[inline(always)]
unsafe fn neg(v: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN)))
}

#[inline(always)]
unsafe fn bcast4(p: *const u8, j: usize) -> __m512i {
    _mm512_set1_epi32((p.add(4 * j) as *const i32).read_unaligned())
}

/// `acc += isum * (d_w * d_x)` for one block of token `ti`, where the weights `wv` were stored
/// as value + 2^SHIFT (unsigned, for `vpdpbusd`): subtracting 2^SHIFT * sum(x) restores the
/// signed dot product exactly.
#[inline(always)]
unsafe fn accumulate_offset_block<const SHIFT: u32>(
    acc: &mut __m512,
    wv: &[__m512i; 8],
    dw: __m512,
    a: &QuantActs,
    ti: usize,
) {
    let x = a.qs.as_ptr().add(ti * QK) as *const u8;
    let xs = a.xsum16.as_ptr().add(2 * ti);
    // The correction starts one of the sums (integers: exact in any order), which saves the
    // subtraction on the vector ports that vpdpbusd shares.
    let corr = _mm512_set1_epi32(-((*xs + *xs.add(1)) << SHIFT));
    // Two partial sums halve the dependency chain through vpdpbusd's latency.
    let mut s0 = _mm512_dpbusd_epi32(corr, wv[0], bcast4(x, 0));
    let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], bcast4(x, 1));
    for j in (2..8).step_by(2) {
        s0 = _mm512_dpbusd_epi32(s0, wv[j], bcast4(x, j));
        s1 = _mm512_dpbusd_epi32(s1, wv[j + 1], bcast4(x, j + 1));
    }
    let isum = _mm512_add_epi32(s0, s1);
    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*a.d.get_unchecked(ti)));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, *acc);
}

/// Stores the tokens' sums. Formats without a minimum term add zero, so the final rounding is
/// the scalar kernel's (which adds its minimum accumulator, zero for them).
#[inline(always)]
unsafe fn store_without_minimum<const NT: usize>(acc: &[__m512; NT], out: *mut f32, stride: usize) {
    let zero = _mm512_setzero_ps();
    for (tt, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.add(tt * stride), _mm512_add_ps(*acc, zero));
    }
}

macro_rules! dispatch_nt {
    ($f:ident, $w:expr, $g:expr, $a:expr, $t0:expr, $nt:expr, $out:expr, $stride:expr) => {
        match $nt {
            8 => $f::<8>($w, $g, $a, $t0, $out, $stride),
            7 => $f::<7>($w, $g, $a, $t0, $out, $stride),
            6 => $f::<6>($w, $g, $a, $t0, $out, $stride),
            5 => $f::<5>($w, $g, $a, $t0, $out, $stride),
            4 => $f::<4>($w, $g, $a, $t0, $out, $stride),
            3 => $f::<3>($w, $g, $a, $t0, $out, $stride),
            2 => $f::<2>($w, $g, $a, $t0, $out, $stride),
            1 => $f::<1>($w, $g, $a, $t0, $out, $stride),
            _ => {}
        }
    };
}

/// # Safety
/// The CPU must support avx512f, avx512bw and avx512vnni; indices are checked by the caller,
/// which also vouches for `out` (see [`super::group_dot`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q4_1(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q4_1_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q4_1_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    min_kind_n::<NT, false, Q4_1Scales>(w, g, a, t0, out, stride)
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q5_1(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q5_1_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q5_1_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    min_kind_n::<NT, true, Q4_1Scales>(w, g, a, t0, out, stride)
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q4k(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q4k_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q4k_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    min_kind_n::<NT, false, Q4kScales>(w, g, a, t0, out, stride)
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q5k(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q5k_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q5k_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    min_kind_n::<NT, true, Q4kScales>(w, g, a, t0, out, stride)
}

/// Where a min kind keeps its scales and minimums: those of the 16 rows of block `b` of group
/// `g`. (Methods, not closures: a closure does not inherit the caller's target features unless
/// it is inlined, and an outlined one is slower than the whole kernel.)
pub(super) trait ScaleMin {
    unsafe fn scale_min(w: &QMatrix, g: usize, b: usize) -> (__m512, __m512);
}

/// Q4_1's and Q5_1's: the blocks' f16 scales and minimums.
pub(super) struct Q4_1Scales;
impl ScaleMin for Q4_1Scales {
    #[inline(always)]
    unsafe fn scale_min(w: &QMatrix, g: usize, b: usize) -> (__m512, __m512) {
        let i = (g * w.blocks() + b) * GROUP;
        (load_f16x16(w.d.as_ptr().add(i)), load_f16x16(w.m.as_ptr().add(i)))
    }
}

/// Q4_K's and Q5_K's: the superblocks' f16 `d` and `dmin` times the blocks' 6-bit `sc`, `mn`.
pub(super) struct Q4kScales;
impl ScaleMin for Q4kScales {
    #[inline(always)]
    unsafe fn scale_min(w: &QMatrix, g: usize, b: usize) -> (__m512, __m512) {
        let nb = w.blocks();
        let si = (g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP;
        let i = (g * nb + b) * GROUP;
        // d * sc and dmin * mn are exact in f32 (11-bit by 6-bit products); negating the
        // factor negates the product exactly.
        let d = load_f16x16(w.d.as_ptr().add(si));
        let dmin = neg(load_f16x16(w.m.as_ptr().add(si)));
        let (sc, mn) = (load_u8x16(w.sc.as_ptr().add(i)), load_u8x16(w.mn.as_ptr().add(i)));
        (_mm512_mul_ps(d, sc), _mm512_mul_ps(dmin, mn))
    }
}

/// The kinds with unsigned weights and a minimum, in nibble tiles (Q4_1, Q4K; Q5_1, Q5K with
/// their fifth bits, `FIFTH`, from the tile's masks).
#[inline(always)]
unsafe fn min_kind_n<const NT: usize, const FIFTH: bool, S: ScaleMin>(
    w: &QMatrix,
    g: usize,
    a: &QuantActs,
    t0: usize,
    out: *mut f32,
    stride: usize,
) {
    let nb = w.blocks();
    let mut acc = [_mm512_setzero_ps(); NT];
    let mut macc = [_mm512_setzero_ps(); NT];
    for b in 0..nb {
        let gb = g * nb + b;
        let (dw, mw) = S::scale_min(w, g, b);
        let wv = unpack_nibbles::<FIFTH>(w, gb);
        for tt in 0..NT {
            let ti = (t0 + tt) * nb + b;
            let x = a.qs.as_ptr().add(ti * QK) as *const u8;
            // Two partial sums halve the dependency chain through vpdpbusd's latency.
            let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], bcast4(x, 0));
            let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], bcast4(x, 1));
            s0 = _mm512_dpbusd_epi32(s0, wv[2], bcast4(x, 2));
            s1 = _mm512_dpbusd_epi32(s1, wv[3], bcast4(x, 3));
            s0 = _mm512_dpbusd_epi32(s0, wv[4], bcast4(x, 4));
            s1 = _mm512_dpbusd_epi32(s1, wv[5], bcast4(x, 5));
            s0 = _mm512_dpbusd_epi32(s0, wv[6], bcast4(x, 6));
            s1 = _mm512_dpbusd_epi32(s1, wv[7], bcast4(x, 7));
            let isum = _mm512_add_epi32(s0, s1);
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*a.d.get_unchecked(ti)));
            acc[tt] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[tt]);
            macc[tt] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*a.s.get_unchecked(ti)), macc[tt]);
        }
    }
    for tt in 0..NT {
        _mm512_storeu_ps(out.add(tt * stride), _mm512_add_ps(acc[tt], macc[tt]));
    }
}

/// The values of group-block `gb`'s 16 rows from a nibble tile, element `4j + e` of row `r` in
/// byte `4r + e` of `wv[j]`: the low nibbles give elements 0..16, the high 16..32, and with
/// `FIFTH` the fifth bit is added where the tile's mask ([`QMatrix::qh`]) says: q = nibble | 16.
#[inline(always)]
unsafe fn unpack_nibbles<const FIFTH: bool>(w: &QMatrix, gb: usize) -> [__m512i; 8] {
    let tile = w.qs.as_ptr().add(gb * 256);
    let (mask, fifth) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    let mut wv = [_mm512_setzero_si512(); 8];
    for p in 0..4 {
        let l = _mm512_loadu_si512(tile.add(p * 64) as *const _);
        let (lo, hi) = (_mm512_and_si512(l, mask), _mm512_and_si512(_mm512_srli_epi16::<4>(l), mask));
        if FIFTH {
            let qh = w.qh.as_ptr().add(gb * 8);
            wv[p] = _mm512_mask_add_epi8(lo, *qh.add(p), lo, fifth);
            wv[p + 4] = _mm512_mask_add_epi8(hi, *qh.add(p + 4), hi, fifth);
        } else {
            wv[p] = lo;
            wv[p + 4] = hi;
        }
    }
    wv
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q8_0(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q8_0_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q8_0_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let mut acc = [_mm512_setzero_ps(); NT];
    for b in 0..nb {
        let gb = g * nb + b;
        let tile = w.qs.as_ptr().add(gb * 512);
        let dw = load_f16x16(w.d.as_ptr().add(gb * GROUP));
        let mut wv = [_mm512_setzero_si512(); 8];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(tile.add(j * 64) as *const _);
        }
        for (tt, acc) in acc.iter_mut().enumerate() {
            accumulate_offset_block::<7>(acc, &wv, dw, a, (t0 + tt) * nb + b);
        }
    }
    store_without_minimum(&acc, out, stride);
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q4_0(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q4_0_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q4_0_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    nibble_tile_n::<NT, false, 3>(w, g, a, t0, out, stride)
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q5_0(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q5_0_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q5_0_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    nibble_tile_n::<NT, true, 4>(w, g, a, t0, out, stride)
}

/// The signed kinds stored in a nibble tile, as value + 2^SHIFT: Q4_0 (+8), and Q5_0 (+16)
/// whose fifth bits (`FIFTH`) come from the tile's masks.
#[inline(always)]
unsafe fn nibble_tile_n<const NT: usize, const FIFTH: bool, const SHIFT: u32>(
    w: &QMatrix,
    g: usize,
    a: &QuantActs,
    t0: usize,
    out: *mut f32,
    stride: usize,
) {
    let nb = w.blocks();
    let mut acc = [_mm512_setzero_ps(); NT];
    for b in 0..nb {
        let gb = g * nb + b;
        let dw = load_f16x16(w.d.as_ptr().add(gb * GROUP));
        let wv = unpack_nibbles::<FIFTH>(w, gb);
        for (tt, acc) in acc.iter_mut().enumerate() {
            accumulate_offset_block::<SHIFT>(acc, &wv, dw, a, (t0 + tt) * nb + b);
        }
    }
    store_without_minimum(&acc, out, stride);
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q6k(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q6k_packed_n, w, g, a, t0, nt, out, stride)
}

/// The packed layout (the file's bits): each 64-byte row of the tile is the AVX2 kernel's two
/// 32-byte halves side by side, so a lane is a row here as in the wide layout. The 6-bit values
/// are rebuilt in registers from a nibble and a 2-bit top, then summed as in `q6k_n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q6k_packed_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let (low4, top2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let load = |p: *const u8| _mm512_loadu_si512(p as *const _);
    let mut acc = [_mm512_setzero_ps(); NT];
    for b in 0..nb {
        let gb = g * nb + b;
        let tile = w.qs.as_ptr().add(gb * QKind::Q6K.tile_bytes());
        let d = _mm512_loadu_ps(w.fd.as_ptr().add((g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP));
        let sc = w.sc.as_ptr().add(gb * 2 * GROUP);
        let i8x16 = |p: *const u8| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)));
        let (s_lo, s_hi) = (_mm512_mul_ps(d, i8x16(sc)), _mm512_mul_ps(d, i8x16(sc.add(GROUP))));
        let plane = [load(tile.add(256)), load(tile.add(320))];
        // The stored values (value + 32) of elements 4j..4j+4 in wv[j].
        let mut wv = [_mm512_setzero_si512(); 8];
        for p in 0..4 {
            let n = load(tile.add(p * 64));
            let nibbles = [_mm512_and_si512(n, low4), _mm512_and_si512(_mm512_srli_epi16::<4>(n), low4)];
            for c in 0..2 {
                // Pair p of each plane byte moved to bits 4..6 (16-bit shifts: what crosses into
                // a neighbouring byte lands outside the mask).
                let top = match p {
                    0 => _mm512_slli_epi16::<4>(plane[c]),
                    1 => _mm512_slli_epi16::<2>(plane[c]),
                    2 => plane[c],
                    _ => _mm512_srli_epi16::<2>(plane[c]),
                };
                wv[4 * c + p] = _mm512_or_si512(nibbles[c], _mm512_and_si512(top, top2));
            }
        }
        for (tt, acc) in acc.iter_mut().enumerate() {
            q6k_block_acc(&wv, a, (t0 + tt) * nb + b, s_lo, s_hi, acc);
        }
    }
    store_without_minimum(&acc, out, stride);
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn q6k_wide(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    dispatch_nt!(q6k_n, w, g, a, t0, nt, out, stride)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn q6k_n<const NT: usize>(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let mut acc = [_mm512_setzero_ps(); NT];
    for b in 0..nb {
        let gb = g * nb + b;
        let tile = w.qs.as_ptr().add(gb * 512);
        let (lo, hi) = (gb * 2 * GROUP, (gb * 2 + 1) * GROUP);
        let (s_lo, s_hi) = (_mm512_loadu_ps(w.fd.as_ptr().add(lo)), _mm512_loadu_ps(w.fd.as_ptr().add(hi)));
        let mut wv = [_mm512_setzero_si512(); 8];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(tile.add(j * 64) as *const _);
        }
        for (tt, acc) in acc.iter_mut().enumerate() {
            q6k_block_acc(&wv, a, (t0 + tt) * nb + b, s_lo, s_hi, acc);
        }
    }
    store_without_minimum(&acc, out, stride);
}

/// Adds token block `ti`'s product with a Q6_K block to `acc`: `wv[j]` holds the stored values
/// (value + 32) of elements 4j..4j+4 of each row. As in Q8_0, with elements 0..16 (wv[0..4])
/// and 16..32 (wv[4..8]) summed apart, each less 32 x its activation sum and scaled by its own
/// half's scale.
#[inline(always)]
unsafe fn q6k_block_acc(wv: &[__m512i; 8], a: &QuantActs, ti: usize, s_lo: __m512, s_hi: __m512, acc: &mut __m512) {
    let x = a.qs.as_ptr().add(ti * QK) as *const u8;
    let xs = a.xsum16.as_ptr().add(2 * ti);
    // The corrections start the sums, as in `accumulate_offset_block`.
    let (corr_lo, corr_hi) = (_mm512_set1_epi32(-(*xs << 5)), _mm512_set1_epi32(-(*xs.add(1) << 5)));
    let mut l0 = _mm512_dpbusd_epi32(corr_lo, wv[0], bcast4(x, 0));
    let mut h0 = _mm512_dpbusd_epi32(corr_hi, wv[4], bcast4(x, 4));
    let mut l1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], bcast4(x, 1));
    let mut h1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[5], bcast4(x, 5));
    l0 = _mm512_dpbusd_epi32(l0, wv[2], bcast4(x, 2));
    h0 = _mm512_dpbusd_epi32(h0, wv[6], bcast4(x, 6));
    l1 = _mm512_dpbusd_epi32(l1, wv[3], bcast4(x, 3));
    h1 = _mm512_dpbusd_epi32(h1, wv[7], bcast4(x, 7));
    let isum_lo = _mm512_add_epi32(l0, l1);
    let isum_hi = _mm512_add_epi32(h0, h1);
    let dx = _mm512_set1_ps(*a.d.get_unchecked(ti));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum_lo), _mm512_mul_ps(s_lo, dx), *acc);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum_hi), _mm512_mul_ps(s_hi, dx), *acc);
}
