//! AMX tiles for batched products of every kind but Q6_K: one `tdpbssd` multiplies a
//! 32-element block of sixteen tokens by the same block of sixteen weight rows, 8,192 products
//! where AVX-512 VNNI needs eight instructions for each of the sixteen tokens. The weights go
//! in as signed bytes: the signed kinds less their offset, the unsigned ones (below 32) as they
//! are; a matrix's copy in that form is kept where memory allows ([`signed_weights`]).
//!
//! The arithmetic is the other kernels' (see the parent module): the tile unit only produces
//! each block's exact integer sums, which the vector unit then scales and accumulates per block
//! in block order, `acc = fma(isum, d_w * d_x, acc)`, and the minimum terms of the kinds that
//! have them apart, `macc = fma(m_w, s_x, macc)`. So a token's result does not depend on
//! whether it went through a tile or through the VNNI kernel with fewer batch-mates: batch
//! invariance holds bit for bit, and the tests hold this kernel to the scalar one.
//!
//! Linux hands AMX's 8 KiB tile state to a process only after it asks (`arch_prctl`); without
//! that the first tile instruction faults, so availability means the CPU has the units *and*
//! the kernel granted them.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::{Cell, RefCell};

use super::avx512::{Q4_1Scales, Q4kScales, ScaleMin};
use crate::qmatrix::{QKind, QMatrix, SignedCopy, GROUP};
use crate::quant::{QuantActs, QK};

/// How many blocks ahead a pass asks for its weights: a kept copy streams from memory, and the
/// tile unit, which runs in order, would otherwise wait on each block's loads (batch-16 decode
/// +4-8% measured).
const PREFETCH: usize = 6;

/// Tokens per tile (the A tile's rows and the C tile's rows): the rows [`QuantActs`] pads to.
pub const TOKENS: usize = crate::quant::TILE_ROWS;

/// Whether this CPU has AMX-INT8 and the kernel let this process use it (asked once).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
        // CPUID leaf 7 exists on every x86-64 CPU this runs on (zero where unsupported).
        let edx = __cpuid_count(7, 0).edx;
        if edx & (3 << 24) != 3 << 24 {
            return false;
        }
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a request for a permission; it touches no memory of ours.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    })
}

/// Whether the tiles compute this kind: every kind whose blocks are one integer sum times one
/// scale (Q6_K's half-block scales stay on the VNNI kernels).
pub fn handles(kind: QKind) -> bool {
    !matches!(kind, QKind::Q6K | QKind::Q6KWide)
}

/// The tile configuration (palette 1): C tiles 0-3 (16 tokens x 16 rows of i32: token tile
/// `c / 2` against group `c % 2`), A tiles 4-5 (16 tokens x one block of i8), B tiles 6-7 (one
/// block of 16 rows, four-byte columns).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    const fn new() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes: [(u16, u8); 8] = [(64, 16), (64, 16), (64, 16), (64, 16), (32, 16), (32, 16), (64, 8), (64, 8)];
        let mut t = 0;
        while t < shapes.len() {
            let (colsb, rows) = shapes[t];
            c[16 + 2 * t] = colsb as u8;
            c[16 + 2 * t + 1] = (colsb >> 8) as u8;
            c[48 + t] = rows;
            t += 1;
        }
        TileConfig(c)
    }
}

static CONFIG: TileConfig = TileConfig::new();

thread_local! {
    /// Whether this thread loaded [`CONFIG`].
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
    /// Two groups' blocks unpacked to signed bytes in the B-tile layout, reused across calls.
    static UNPACKED: RefCell<[Vec<u8>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// The matrix's blocks as signed bytes in the B-tile layout (`[group][block][512]`, see
/// [`unpack_group`]), made on first use and kept while every such copy in the process fits in
/// an eighth of physical memory; `None` where it was not kept or the tiles cannot take `w`.
/// With it a product skips the per-call unpack, which is a fifth of a 64-token product and
/// more with fewer tokens; it costs a byte per weight (twice a 4-bit matrix), which is why it
/// is made only once a batched product asks for it.
pub fn signed_weights(w: &QMatrix) -> Option<&[u8]> {
    if !(handles(w.kind) && available() && is_x86_feature_detected!("avx512bw")) {
        return None;
    }
    let copy = w.signed.get_or_init(|| {
        let nb = w.blocks();
        let mut copy = SignedCopy::reserve(w.groups() * nb * 512, budget())?;
        for (g, buf) in copy.bytes_mut().chunks_exact_mut(nb * 512).enumerate() {
            // SAFETY: AVX-512BW checked above; `buf` holds the group's nb blocks.
            unsafe { unpack_group(w, g, buf) };
        }
        Some(copy)
    });
    copy.as_ref().map(SignedCopy::bytes)
}

/// An eighth of physical memory: what the signed copies may hold together.
fn budget() -> usize {
    // SAFETY: sysconf reads a system constant.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages.max(0) as usize).saturating_mul(size.max(0) as usize) / 8
}

/// `*out.add(t * stride + g * 16 + r)` = dot(row `g*16 + r` of `w`, token `t` of `a`) for the
/// groups `g` of `groups` (one or two), their rows that exist (a last group may have fewer
/// than 16), and the tokens of the first `tiles` tiles that exist (a last tile may have fewer
/// than 16: its padding rows of `a` are multiplied, not stored). `signed`: `w`'s
/// [`signed_weights`], if kept; otherwise the groups are unpacked here.
///
/// # Safety
/// [`available`] must be true and `handles(w.kind)`; `(tiles - 1) * 16 < a.rows`, every group
/// `< w.groups()`, and `out` valid for writes at every index above, which no other thread
/// touches during the call.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn group_tiles(
    w: &QMatrix,
    groups: &[usize],
    signed: Option<&[u8]>,
    a: &QuantActs,
    tiles: usize,
    out: *mut f32,
    stride: usize,
) {
    let nb = w.blocks();
    // The tile loads read whole tiles of tokens, padding included.
    assert!(tiles * TOKENS <= a.rows.next_multiple_of(TOKENS));
    assert!(
        a.qs.len() >= tiles * TOKENS * nb * QK && a.d.len() >= tiles * TOKENS * nb && a.s.len() >= tiles * TOKENS * nb
    );
    // Configured once per thread and never released: `ldtilecfg` waits for the tile unit to
    // drain and zeroes every tile, which cost 5% of a batch-16 decode step when done per call.
    // Every tile is loaded or zeroed before it is read, so what an earlier call left in them
    // is never used; Linux saves and restores the tiles with the thread like any register.
    if !CONFIGURED.get() {
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        CONFIGURED.set(true);
    }
    let run = |ws: [*const u8; 2]| {
        let mut tile = 0;
        while tile < tiles {
            let pass = Pass { w, groups, ws, a, t0: tile * TOKENS, out, stride };
            // Whether this pass's last token tile is a partial one: a variant of its own, so
            // the passes over whole tiles keep their fixed-count loops.
            let partial = (tile + 2).min(tiles) * TOKENS > a.rows;
            match (tiles - tile >= 2, groups.len() == 2, partial) {
                (true, true, false) => pass.run::<2, 2, false>(),
                (true, false, false) => pass.run::<2, 1, false>(),
                (false, true, false) => pass.run::<1, 2, false>(),
                (false, false, false) => pass.run::<1, 1, false>(),
                (true, true, true) => pass.run::<2, 2, true>(),
                (true, false, true) => pass.run::<2, 1, true>(),
                (false, true, true) => pass.run::<1, 2, true>(),
                (false, false, true) => pass.run::<1, 1, true>(),
            }
            tile += 2;
        }
    };
    if let Some(s) = signed {
        assert!(s.len() >= w.groups() * nb * 512);
        let at = |i: usize| s.as_ptr().add(groups[i.min(groups.len() - 1)] * nb * 512);
        return run([at(0), at(1)]);
    }
    UNPACKED.with_borrow_mut(|bufs| {
        for (buf, &g) in bufs.iter_mut().zip(groups) {
            // Grown only: matrices of different widths alternate, and a resize back up
            // would zero the growth on every call.
            if buf.len() < nb * 512 {
                buf.resize(nb * 512, 0);
            }
            unpack_group(w, g, buf);
        }
        run([bufs[0].as_ptr(), bufs[1].as_ptr()])
    });
}

/// The group's blocks as signed bytes, `buf[b*512 + j*64 + r*4 + e]` = element `4j + e` of row
/// `r` in block `b`: the B-tile layout, and the VNNI kernels' unpacked vectors minus their offset.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_group(w: &QMatrix, g: usize, buf: &mut [u8]) {
    let nb = w.blocks();
    assert!(buf.len() >= nb * 512);
    let dst = buf.as_mut_ptr();
    let store = |i: usize, v: __m512i| _mm512_storeu_si512(dst.add(i * 64) as *mut _, v);
    match w.kind {
        QKind::Q8_0 => {
            let src = w.qs.as_ptr().add(g * nb * 512);
            let flip = _mm512_set1_epi8(i8::MIN);
            for i in 0..nb * 8 {
                store(i, _mm512_xor_si512(_mm512_loadu_si512(src.add(i * 64) as *const _), flip));
            }
        }
        QKind::Q4_0 | QKind::Q5_0 | QKind::Q4_1 | QKind::Q4K | QKind::Q5_1 | QKind::Q5K => {
            let fifth_bits = w.kind.fifth_bits();
            // Unsigned values below 32 (Q4_1, Q4K, Q5_1, Q5K) are their own signed values.
            let offset = _mm512_set1_epi8(w.kind.offset() as i8);
            let (mask, fifth) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
            for b in 0..nb {
                let gb = g * nb + b;
                let tile = w.qs.as_ptr().add(gb * 256);
                for p in 0..4 {
                    let l = _mm512_loadu_si512(tile.add(p * 64) as *const _);
                    let (mut lo, mut hi) =
                        (_mm512_and_si512(l, mask), _mm512_and_si512(_mm512_srli_epi16::<4>(l), mask));
                    if fifth_bits {
                        let qh = w.qh.as_ptr().add(gb * 8);
                        lo = _mm512_mask_add_epi8(lo, *qh.add(p), lo, fifth);
                        hi = _mm512_mask_add_epi8(hi, *qh.add(p + 4), hi, fifth);
                    }
                    store(b * 8 + p, _mm512_sub_epi8(lo, offset));
                    store(b * 8 + p + 4, _mm512_sub_epi8(hi, offset));
                }
            }
        }
        _ => unreachable!("AMX tiles do not handle {:?}", w.kind),
    }
}

/// One pass over the blocks for up to two token tiles against up to two groups: each block
/// loads two A and two B tiles for four products. The tile unit computes a block's sums while
/// the vector unit scales the previous block's: the sums go through memory, and a load right
/// behind the tile store that wrote it would wait for that store to retire.
struct Pass<'a> {
    w: &'a QMatrix,
    groups: &'a [usize],
    ws: [*const u8; 2],
    a: &'a QuantActs,
    t0: usize,
    out: *mut f32,
    stride: usize,
}

/// Tile loads, zeroing, products and stores by register number (the asm needs literals).
macro_rules! tile_op {
    (load $t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) $p, s = in(reg) $stride, options(nostack, readonly))
    };
    (product $c:literal, $a:literal, $b:literal) => {
        asm!(concat!("tilezero tmm", $c), concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b), options(nostack, nomem))
    };
    (store $t:literal, $p:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) $p, s = in(reg) 64usize, options(nostack))
    };
}

impl Pass<'_> {
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn run<const NT: usize, const NG: usize, const PARTIAL: bool>(&self) {
        let nb = self.w.blocks();
        let row_bytes = nb * QK;
        let xq = self.a.qs.as_ptr().add(self.t0 * row_bytes) as *const u8;
        // Written by the tile stores before it is read; zeroing 8 KiB per pass would cost more
        // than a small product.
        let mut sums = std::mem::MaybeUninit::<Sums>::uninit();
        let base = sums.as_mut_ptr() as *mut i32;
        // Block b's sums of C tile c.
        let slot = |b: usize, c: usize| base.add(((b % 2) * 4 + c) * TOKENS * GROUP);
        let mut acc = Acc([[_mm512_setzero_ps(); TOKENS]; 4]);
        // Tokens of each token tile that exist: a last tile's padding gets its products (the
        // tile unit multiplies sixteen rows either way) but none of the vector unit's work,
        // which is most of what a pass spends its time on.
        let last = if PARTIAL { self.a.rows - (self.t0 + (NT - 1) * TOKENS) } else { TOKENS };
        let tokens = |c: usize| if PARTIAL && c / 2 == NT - 1 { last } else { TOKENS };
        for b in 0..=nb {
            if b < nb {
                if b + PREFETCH < nb {
                    for line in 0..8 {
                        _mm_prefetch::<_MM_HINT_T0>(self.ws[0].add((b + PREFETCH) * 512 + line * 64) as *const i8);
                        if NG == 2 {
                            _mm_prefetch::<_MM_HINT_T0>(self.ws[1].add((b + PREFETCH) * 512 + line * 64) as *const i8);
                        }
                    }
                }
                tile_op!(load 4, xq.add(b * QK), row_bytes);
                if NT == 2 {
                    tile_op!(load 5, xq.add(TOKENS * row_bytes + b * QK), row_bytes);
                }
                tile_op!(load 6, self.ws[0].add(b * 512), 64usize);
                if NG == 2 {
                    tile_op!(load 7, self.ws[1].add(b * 512), 64usize);
                }
                // All products before any store: the tile unit runs in order, and a store
                // right behind its product would hold the next product back for the latency.
                tile_op!(product 0, 4, 6);
                if NG == 2 {
                    tile_op!(product 1, 4, 7);
                }
                if NT == 2 {
                    tile_op!(product 2, 5, 6);
                    if NG == 2 {
                        tile_op!(product 3, 5, 7);
                    }
                }
                tile_op!(store 0, slot(b, 0));
                if NG == 2 {
                    tile_op!(store 1, slot(b, 1));
                }
                if NT == 2 {
                    tile_op!(store 2, slot(b, 2));
                    if NG == 2 {
                        tile_op!(store 3, slot(b, 3));
                    }
                }
            }
            if b > 0 {
                for c in 0..4 {
                    if c / 2 < NT && c % 2 < NG {
                        let acc = &mut acc.0[c];
                        if PARTIAL && c / 2 == NT - 1 {
                            self.scale_add(b - 1, c, slot(b - 1, c), &mut acc[..last]);
                        } else {
                            self.scale_add(b - 1, c, slot(b - 1, c), acc);
                        }
                    }
                }
            }
        }
        let min_kind = self.w.kind.with_min();
        for c in 0..4 {
            if c / 2 < NT && c % 2 < NG {
                let (g, t0) = (self.groups[c % 2], self.t0 + (c / 2) * TOKENS);
                // As the VNNI kernels store: acc + macc, macc the minimum terms in block order
                // (zero for a kind without them). They need no tiles, so they run here, in
                // registers, rather than through memory with the sums.
                let mut macc = [_mm512_setzero_ps(); TOKENS];
                let tokens = tokens(c);
                if min_kind {
                    for b in 0..nb {
                        let (_, mw) = self.scale_min(g, b);
                        for (m, macc) in macc.iter_mut().enumerate().take(tokens) {
                            let sx = *self.a.s.get_unchecked((t0 + m) * nb + b);
                            *macc = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), *macc);
                        }
                    }
                }
                // A last group's rows past the matrix are padding, and another task's columns.
                let valid = GROUP.min(self.w.rows - g * GROUP);
                let keep: __mmask16 = if valid >= GROUP { !0 } else { (1u16 << valid) - 1 };
                let out = self.out.add(t0 * self.stride + g * GROUP);
                // A last tile's padding tokens are not stored.
                for (m, (acc, macc)) in acc.0[c].iter().zip(macc).enumerate().take(tokens) {
                    _mm512_mask_storeu_ps(out.add(m * self.stride), keep, _mm512_add_ps(*acc, macc));
                }
            }
        }
    }

    /// The 16 rows' scales and minimums of block `b` of group `g`, computed as the VNNI
    /// kernels compute them (the minimum is zero for the kinds without one).
    #[inline(always)]
    unsafe fn scale_min(&self, g: usize, b: usize) -> (__m512, __m512) {
        let w = self.w;
        match w.kind {
            QKind::Q4_1 | QKind::Q5_1 => Q4_1Scales::scale_min(w, g, b),
            QKind::Q4K | QKind::Q5K => Q4kScales::scale_min(w, g, b),
            _ => {
                let d = w.d.as_ptr().add((g * w.blocks() + b) * GROUP);
                (_mm512_cvtph_ps(_mm256_loadu_si256(d as *const __m256i)), _mm512_setzero_ps())
            }
        }
    }

    /// `acc[m] = fma(isum[m], d_w * d_x[m], acc[m])` for block `b`'s sums `sums` of C tile `c`.
    #[inline(always)]
    unsafe fn scale_add(&self, b: usize, c: usize, sums: *const i32, acc: &mut [__m512]) {
        let (w, a) = (self.w, self.a);
        let nb = w.blocks();
        let g = self.groups[c % 2];
        let t0 = self.t0 + (c / 2) * TOKENS;
        let (dw, _) = self.scale_min(g, b);
        for (m, acc) in acc.iter_mut().enumerate() {
            let isum = _mm512_loadu_si512(sums.add(m * GROUP) as *const _);
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*a.d.get_unchecked((t0 + m) * nb + b)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, *acc);
        }
    }
}

/// The four C tiles' running sums, in memory: 64 vectors do not fit the register file.
#[repr(C, align(64))]
struct Acc([[__m512; TOKENS]; 4]);

/// Two blocks' sums of the four C tiles (the block computed and the block scaled), aligned
/// for the tile stores.
#[repr(C, align(64))]
struct Sums([i32; 2 * 4 * TOKENS * GROUP]);
