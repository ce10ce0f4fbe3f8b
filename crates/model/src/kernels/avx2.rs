//! AVX2 fallback: the 16 rows of a group as two halves of 8, with `vpmaddubsw` + `vpmaddwd`
//! standing in for the VNNI instruction.

use std::arch::x86_64::*;

use crate::qmatrix::{QKind, QMatrix, GROUP, KBLOCKS};
use crate::quant::{QuantActs, QK};

#[inline(always)]
unsafe fn bcast4(p: *const u8, j: usize) -> __m256i {
    _mm256_set1_epi32((p.add(4 * j) as *const i32).read_unaligned())
}

#[inline(always)]
unsafe fn load_f16x8(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline(always)]
unsafe fn load_u8x8(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// # Safety
/// The CPU must support avx2, fma and f16c; indices are checked by the caller, which also
/// vouches for `out` (see [`super::group_dot`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_1(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    min_kind::<false>(w, g, a, t0, nt, out, stride, |gb, h| block_scale_min(w, gb, h))
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_1(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    min_kind::<true>(w, g, a, t0, nt, out, stride, |gb, h| block_scale_min(w, gb, h))
}

/// Q4_1's and Q5_1's f16 scale and minimum of block `gb`, rows `8h..8h+8`.
#[inline(always)]
unsafe fn block_scale_min(w: &QMatrix, gb: usize, h: usize) -> (__m256, __m256) {
    let i = gb * GROUP + h * 8;
    (load_f16x8(w.d.as_ptr().add(i)), load_f16x8(w.m.as_ptr().add(i)))
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4k(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    min_kind::<false>(w, g, a, t0, nt, out, stride, |gb, h| k_scale_min(w, g, gb, h))
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5k(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    min_kind::<true>(w, g, a, t0, nt, out, stride, |gb, h| k_scale_min(w, g, gb, h))
}

/// Q4_K's and Q5_K's scale `d * sc` and minimum `-dmin * mn` of block `gb` (of group `g`),
/// rows `8h..8h+8`: exact products, as in the AVX-512 kernel.
#[inline(always)]
unsafe fn k_scale_min(w: &QMatrix, g: usize, gb: usize, h: usize) -> (__m256, __m256) {
    let nb = w.blocks();
    let b = gb - g * nb;
    let si = (g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP + h * 8;
    let i = gb * GROUP + h * 8;
    let d = load_f16x8(w.d.as_ptr().add(si));
    let dmin = _mm256_xor_ps(load_f16x8(w.m.as_ptr().add(si)), _mm256_set1_ps(-0.0));
    let (sc, mn) = (load_u8x8(w.sc.as_ptr().add(i)), load_u8x8(w.mn.as_ptr().add(i)));
    (_mm256_mul_ps(d, sc), _mm256_mul_ps(dmin, mn))
}

/// The kinds with unsigned weights and a minimum, in nibble tiles (Q4_1, Q4K; Q5_1, Q5K with
/// their fifth bits, `FIFTH`, from the tile's masks): `scale_min(gb, h)` gives the block's
/// scale and minimum of rows `8h..8h+8`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn min_kind<const FIFTH: bool>(
    w: &QMatrix,
    g: usize,
    a: &QuantActs,
    t0: usize,
    nt: usize,
    out: *mut f32,
    stride: usize,
    scale_min: impl Fn(usize, usize) -> (__m256, __m256),
) {
    let nb = w.blocks();
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut macc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let gb = g * nb + b;
            let (dw, mw) = scale_min(gb, h);
            let wv = unpack_nibbles::<FIFTH>(w, gb, h);
            for tt in 0..nt {
                let ti = (t0 + tt) * nb + b;
                let x = a.qs.as_ptr().add(ti * QK) as *const u8;
                let isum = _mm256_add_epi32(unsigned_dot4(&wv, x, 0, ones), unsigned_dot4(&wv, x, 4, ones));
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(ti)));
                acc[tt] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[tt]);
                macc[tt] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*a.s.get_unchecked(ti)), macc[tt]);
            }
        }
        for tt in 0..nt {
            _mm256_storeu_ps(out.add(tt * stride + h * 8), _mm256_add_ps(acc[tt], macc[tt]));
        }
    }
}

/// The values of rows `8h..8h+8` of group-block `gb` from a nibble tile, element `4j + e` of
/// row `r` in byte `4r + e` of `wv[j]`: the low nibbles give elements 0..16, the high 16..32,
/// and with `FIFTH` each byte's fifth bit comes from the tile's masks ([`QMatrix::qh`]).
#[inline(always)]
unsafe fn unpack_nibbles<const FIFTH: bool>(w: &QMatrix, gb: usize, h: usize) -> [__m256i; 8] {
    let tile = w.qs.as_ptr().add(gb * 256 + h * 32);
    let (mask, fifth) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let high = |j: usize| {
        if FIFTH {
            let qh = w.qh.as_ptr().add(gb * 8);
            _mm256_and_si256(bytes_from_bits((*qh.add(j) >> (32 * h)) as u32), fifth)
        } else {
            _mm256_setzero_si256()
        }
    };
    let mut wv = [_mm256_setzero_si256(); 8];
    for p in 0..4 {
        let l = _mm256_loadu_si256(tile.add(p * 64) as *const __m256i);
        wv[p] = _mm256_or_si256(_mm256_and_si256(l, mask), high(p));
        wv[p + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l), mask), high(p + 4));
    }
    wv
}

/// Sums of unsigned weights `wv[j0..j0+4]` times the matching signed activation quads, per row.
/// Pair products are at most 31 * 127 * 2, so four such sums stay inside i16 (eight would for
/// nibbles, but the same split serves both).
#[inline(always)]
unsafe fn unsigned_dot4(wv: &[__m256i; 8], x: *const u8, j0: usize, ones: __m256i) -> __m256i {
    let mut s16 = _mm256_maddubs_epi16(wv[j0], bcast4(x, j0));
    for (j, wj) in wv.iter().enumerate().skip(j0 + 1).take(3) {
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(*wj, bcast4(x, j)));
    }
    _mm256_madd_epi16(s16, ones)
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let ones = _mm256_set1_epi16(1);
    let bias = _mm256_set1_epi8(i8::MIN);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let gb = g * nb + b;
            let tile = w.qs.as_ptr().add(gb * 512 + h * 32);
            let dw = load_f16x8(w.d.as_ptr().add(gb * GROUP + h * 8));
            let mut wabs = [_mm256_setzero_si256(); 8];
            let mut wv = [_mm256_setzero_si256(); 8];
            for j in 0..8 {
                // Stored as value + 128: flipping the top bit gives the signed value back.
                wv[j] = _mm256_xor_si256(_mm256_loadu_si256(tile.add(j * 64) as *const __m256i), bias);
                wabs[j] = _mm256_sign_epi8(wv[j], wv[j]);
            }
            for (tt, acc) in acc.iter_mut().enumerate().take(nt) {
                let ti = (t0 + tt) * nb + b;
                let x = a.qs.as_ptr().add(ti * QK) as *const u8;
                // |w| * (x with w's sign): each pair sum fits i16; widen to i32 per group.
                let mut isum = _mm256_setzero_si256();
                for j in 0..8 {
                    let p = _mm256_maddubs_epi16(wabs[j], _mm256_sign_epi8(bcast4(x, j), wv[j]));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ones));
                }
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(ti)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, *acc);
            }
        }
        store_halves(&acc, out, stride, nt, h);
    }
}

/// 0xFF in byte `i` where bit `i` of `bits` is set, else 0 (ggml's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn bytes_from_bits(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let probe = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, probe), _mm256_set1_epi64x(-1))
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    nibble_tile::<false, 3>(w, g, a, t0, nt, out, stride)
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_0(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    nibble_tile::<true, 4>(w, g, a, t0, nt, out, stride)
}

/// The signed kinds stored in a nibble tile, as value + 2^SHIFT: Q4_0 (+8), and Q5_0 (+16)
/// whose fifth bits (`FIFTH`) come from the tile's masks.
#[inline(always)]
unsafe fn nibble_tile<const FIFTH: bool, const SHIFT: u32>(
    w: &QMatrix,
    g: usize,
    a: &QuantActs,
    t0: usize,
    nt: usize,
    out: *mut f32,
    stride: usize,
) {
    let nb = w.blocks();
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let gb = g * nb + b;
            let dw = load_f16x8(w.d.as_ptr().add(gb * GROUP + h * 8));
            let wv = unpack_nibbles::<FIFTH>(w, gb, h);
            for (tt, acc) in acc.iter_mut().enumerate().take(nt) {
                let ti = (t0 + tt) * nb + b;
                let x = a.qs.as_ptr().add(ti * QK) as *const u8;
                // Weights stored as value + 2^SHIFT: as the unsigned kinds, less 2^SHIFT * sum(x).
                let xs = a.xsum16.as_ptr().add(2 * ti);
                let corr = _mm256_set1_epi32((*xs + *xs.add(1)) << SHIFT);
                let isum = _mm256_add_epi32(unsigned_dot4(&wv, x, 0, ones), unsigned_dot4(&wv, x, 4, ones));
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(ti)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum, corr)), scale, *acc);
            }
        }
        store_halves(&acc, out, stride, nt, h);
    }
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6k(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let (low4, top2, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30), _mm256_set1_epi16(1));
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let gb = g * nb + b;
            let tile = w.qs.as_ptr().add(gb * QKind::Q6K.tile_bytes() + h * 32);
            let d = _mm256_loadu_ps(w.fd.as_ptr().add((g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP + h * 8));
            let sc = w.sc.as_ptr().add(gb * 2 * GROUP + h * 8);
            let (s_lo, s_hi) = (_mm256_mul_ps(d, load_i8x8(sc)), _mm256_mul_ps(d, load_i8x8(sc.add(GROUP))));
            let plane = [load32(tile.add(256)), load32(tile.add(320))];
            // The stored values (value + 32, 0..63) of elements 0..16 in wq[0..4], 16..32 in wq[4..8].
            let mut wq = [_mm256_setzero_si256(); 8];
            for p in 0..4 {
                let n = load32(tile.add(p * 64));
                let nibbles = [_mm256_and_si256(n, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(n), low4)];
                for c in 0..2 {
                    // Pair p of each plane byte moved to bits 4..6 (16-bit shifts: what crosses
                    // into a neighbouring byte lands outside the mask).
                    let top = match p {
                        0 => _mm256_slli_epi16::<4>(plane[c]),
                        1 => _mm256_slli_epi16::<2>(plane[c]),
                        2 => plane[c],
                        _ => _mm256_srli_epi16::<2>(plane[c]),
                    };
                    wq[4 * c + p] = _mm256_or_si256(nibbles[c], _mm256_and_si256(top, top2));
                }
            }
            for (tt, acc) in acc.iter_mut().enumerate().take(nt) {
                let ti = (t0 + tt) * nb + b;
                let x = a.qs.as_ptr().add(ti * QK) as *const u8;
                let xs = a.xsum16.as_ptr().add(2 * ti);
                // Stored values times activations, minus 32 x the half block's activation sum:
                // the signed values' exact sum. Two pair sums (at most 2 * 2 * 63 * 128) fit i16.
                let half = |j0: usize, xsum: i32| {
                    let pair = |j: usize| _mm256_maddubs_epi16(wq[j], bcast4(x, j));
                    let s0 = _mm256_madd_epi16(_mm256_add_epi16(pair(j0), pair(j0 + 1)), ones);
                    let s1 = _mm256_madd_epi16(_mm256_add_epi16(pair(j0 + 2), pair(j0 + 3)), ones);
                    let isum = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_set1_epi32(xsum << 5));
                    _mm256_cvtepi32_ps(isum)
                };
                let dx = _mm256_set1_ps(*a.d.get_unchecked(ti));
                *acc = _mm256_fmadd_ps(half(0, *xs), _mm256_mul_ps(s_lo, dx), *acc);
                *acc = _mm256_fmadd_ps(half(4, *xs.add(1)), _mm256_mul_ps(s_hi, dx), *acc);
            }
        }
        store_halves(&acc, out, stride, nt, h);
    }
}

/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6k_wide(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let (bias, ones) = (_mm256_set1_epi8(32), _mm256_set1_epi16(1));
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let gb = g * nb + b;
            let tile = w.qs.as_ptr().add(gb * 512 + h * 32);
            let (lo, hi) = (gb * 2 * GROUP + h * 8, (gb * 2 + 1) * GROUP + h * 8);
            let (s_lo, s_hi) = (_mm256_loadu_ps(w.fd.as_ptr().add(lo)), _mm256_loadu_ps(w.fd.as_ptr().add(hi)));
            let mut wabs = [_mm256_setzero_si256(); 8];
            let mut wv = [_mm256_setzero_si256(); 8];
            for j in 0..8 {
                // Stored as value + 32.
                wv[j] = _mm256_sub_epi8(load32(tile.add(j * 64)), bias);
                wabs[j] = _mm256_sign_epi8(wv[j], wv[j]);
            }
            for (tt, acc) in acc.iter_mut().enumerate().take(nt) {
                let ti = (t0 + tt) * nb + b;
                let x = a.qs.as_ptr().add(ti * QK) as *const u8;
                // |w| <= 32, so four pair sums (at most 4 * 2 * 32 * 127) stay inside i16.
                let half = |j0: usize| {
                    let mut s16 = _mm256_setzero_si256();
                    for j in j0..j0 + 4 {
                        let p = _mm256_maddubs_epi16(wabs[j], _mm256_sign_epi8(bcast4(x, j), wv[j]));
                        s16 = _mm256_add_epi16(s16, p);
                    }
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones))
                };
                let dx = _mm256_set1_ps(*a.d.get_unchecked(ti));
                *acc = _mm256_fmadd_ps(half(0), _mm256_mul_ps(s_lo, dx), *acc);
                *acc = _mm256_fmadd_ps(half(4), _mm256_mul_ps(s_hi, dx), *acc);
            }
        }
        store_halves(&acc, out, stride, nt, h);
    }
}

#[inline(always)]
unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn load_i8x8(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Stores half `h` (8 rows) of each token's sums, plus 0 as the scalar definition adds its
/// (zero) minimum term, which turns -0 into +0 as it does.
#[inline(always)]
unsafe fn store_halves(acc: &[__m256; 4], out: *mut f32, stride: usize, nt: usize, h: usize) {
    let zero = _mm256_setzero_ps();
    for (tt, acc) in acc.iter().enumerate().take(nt) {
        _mm256_storeu_ps(out.add(tt * stride + h * 8), _mm256_add_ps(*acc, zero));
    }
}
