//! Quantized weight matrices, repacked at load time for the integer kernels.
//!
//! ggml stores a weight row as consecutive blocks of 32 (or superblocks of 256). The kernels
//! instead want 16 rows side by side, so that one 512-bit multiply-accumulate covers four
//! elements of sixteen rows and a broadcast of four activation bytes. The repack keeps ggml's
//! exact values and scales (each file type maps losslessly onto a kernel format, see
//! [`QKind::of`]); only the order of bytes changes, so results equal ggml's integer dot
//! products block by block.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use gguf::GgmlType;

use crate::dequant::{scale_min_k4, QK_K};
use crate::error::ModelError;
use crate::quant::{ActFormat, QuantActs, QK};
use crate::region::{Alloc, BufMut, Packable, WeightBuf};
use crate::unpack::{unpack, Scale};

/// Rows interleaved per group.
pub const GROUP: usize = 16;

/// 32-element blocks per K-quant superblock.
pub const KBLOCKS: usize = QK_K / QK;

/// The kernel formats. Tiles hold 32 elements of each of 16 rows: the nibble formats as
/// `tile[p*64 + r*4 + e]` = element 4p+e (low nibble) and 16+4p+e (high nibble) of row r, the
/// byte formats as `tile[j*64 + r*4 + e]` = element 4j+e. Every tile byte is unsigned: the
/// signed formats store value + [`QKind::offset`], so that weights are the unsigned operand of
/// the kernels' u8 x i8 products and the offset is taken back out with the activations'
/// per-half-block sums (`offset * sum(x)`), which costs the weights no extra bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QKind {
    /// 4-bit unsigned with per-block f16 scale and minimum (Q4_1); activations in Q8_1.
    Q4_1,
    /// 8-bit signed, stored + 128, with per-block f16 scale (Q8_0; Q4_0 as q-8 and Q5_0 as
    /// q-16 when stacked with Q8_0); activations in Q8_0.
    Q8_0,
    /// 4-bit (Q4_0: q - 8), stored as q in a nibble tile; f16 block scale; activations in
    /// Q8_0. Half the bytes of Q8_0, which batch-1 decode (bound by memory bandwidth) reads.
    Q4_0,
    /// 5-bit (Q5_0: q - 16), stored as q: the low four bits as a nibble tile, the fifth as one
    /// 64-bit mask per four-element column of the tile ([`QMatrix::qh`]); f16 block scale;
    /// activations in Q8_0.
    Q5_0,
    /// 4-bit unsigned as Q4_1, scale `d*sc` and minimum `-dmin*mn` from the superblock's f16
    /// `d`, `dmin` and the block's 6-bit `sc`, `mn` (Q4_K); activations in Q8_1.
    Q4K,
    /// 5-bit unsigned (0..31): Q4_1's nibble tile and scales with Q5_0's fifth-bit masks
    /// (Q5_1), 0.75 bytes a weight as in the file; activations in Q8_1.
    Q5_1,
    /// 5-bit unsigned: Q4K's nibble tile and scales with Q5_0's fifth-bit masks (Q5_K), 0.70
    /// bytes a weight against the file's 0.69; activations in Q8_1.
    Q5K,
    /// 6-bit signed (-32..31), stored + 32 in the file's own bits (Q6_K), 0.83 bytes a
    /// weight against the file's 0.82: the low four bits as a nibble tile, the top two in a
    /// second plane of the tile (`tile[256 + c*64 + r*4 + e]`, bits `2p..2p+2` those of
    /// element `16c + 4p + e`); the blocks' i8 scales of each half block in [`QMatrix::sc`]
    /// and the superblock's f32 `d` in [`QMatrix::fd`]. Activations in Q8_0.
    Q6K,
    /// Q6_K as one byte a value (stored + 32) and an f32 scale per 16 elements, 1.25 bytes a
    /// weight: no unpacking in the kernel, for comparison (`bench model --q6k-layout wide`);
    /// see [`Q6kLayout`].
    Q6KWide,
}

/// How Q6_K matrices are laid out: the file's bits ([`QKind::Q6K`], the default) or a byte a
/// value ([`QKind::Q6KWide`]). Packed is the default on every instruction set: on AVX-512
/// (Xeon, 2 threads, a 1B Q4_K_M file) it decodes 2-4% faster at batch 1 than wide, reading 17%
/// fewer bytes a step, and prefills 2-4% slower; on AVX2 its kernel is faster at 1 token and
/// at 64 (an 8192 x 4096 matrix, 2 threads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Q6kLayout {
    #[default]
    Packed,
    Wide,
}

impl QKind {
    /// The kernel format a file type maps onto exactly, if any.
    pub fn of(ty: GgmlType) -> Option<QKind> {
        match ty {
            GgmlType::Q8_0 => Some(QKind::Q8_0),
            GgmlType::Q4_0 => Some(QKind::Q4_0),
            GgmlType::Q5_0 => Some(QKind::Q5_0),
            GgmlType::Q4_1 => Some(QKind::Q4_1),
            GgmlType::Q4_K => Some(QKind::Q4K),
            GgmlType::Q5_1 => Some(QKind::Q5_1),
            GgmlType::Q5_K => Some(QKind::Q5K),
            GgmlType::Q6_K => Some(QKind::Q6K),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => None,
        }
    }

    /// The one kernel format parts of these types can be stacked in with their exact values:
    /// their common format, or Q8_0 for a mix of Q8_0, Q4_0 and Q5_0 (which all map onto it).
    pub fn of_stack(types: &[GgmlType]) -> Option<QKind> {
        let first = QKind::of(*types.first()?)?;
        if types.iter().all(|&t| QKind::of(t) == Some(first)) {
            return Some(first);
        }
        let bytes = |t: &GgmlType| matches!(t, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0);
        types.iter().all(bytes).then_some(QKind::Q8_0)
    }

    pub fn act_format(self) -> ActFormat {
        match self {
            QKind::Q4_1 | QKind::Q4K | QKind::Q5_1 | QKind::Q5K => ActFormat::Q8_1,
            QKind::Q8_0 | QKind::Q4_0 | QKind::Q5_0 | QKind::Q6K | QKind::Q6KWide => ActFormat::Q8_0,
        }
    }

    /// Bytes of quantized values per (group, block).
    pub const fn tile_bytes(self) -> usize {
        match self {
            QKind::Q4_1 | QKind::Q4K | QKind::Q4_0 | QKind::Q5_0 | QKind::Q5_1 | QKind::Q5K => GROUP * QK / 2,
            QKind::Q6K => GROUP * QK / 2 + GROUP * QK / 4,
            QKind::Q8_0 | QKind::Q6KWide => GROUP * QK,
        }
    }

    /// What the tiles add to each signed value (0 for the unsigned kinds).
    pub const fn offset(self) -> i32 {
        match self {
            QKind::Q8_0 => 128,
            QKind::Q6K | QKind::Q6KWide => 32,
            QKind::Q5_0 => 16,
            QKind::Q4_0 => 8,
            QKind::Q4_1 | QKind::Q4K | QKind::Q5_1 | QKind::Q5K => 0,
        }
    }

    fn nibbles(self) -> bool {
        self.tile_bytes() == GROUP * QK / 2
    }

    /// The kinds whose fifth bits are in [`QMatrix::qh`].
    pub const fn fifth_bits(self) -> bool {
        matches!(self, QKind::Q5_0 | QKind::Q5_1 | QKind::Q5K)
    }

    /// The kinds with unsigned values and a minimum term (`value = q * scale + min`).
    pub const fn with_min(self) -> bool {
        matches!(self, QKind::Q4_1 | QKind::Q4K | QKind::Q5_1 | QKind::Q5K)
    }

    /// This kind as `q6k` lays Q6_K out.
    fn laid_out(self, q6k: Q6kLayout) -> QKind {
        match (self, q6k) {
            (QKind::Q6K, Q6kLayout::Wide) => QKind::Q6KWide,
            (kind, _) => kind,
        }
    }
}

/// A `rows x cols` weight matrix (out features x in features), `cols` a multiple of 32 (of 256
/// for `Q4K`). Per-row parameters are stored 16 rows at a time, `[group][block][16]` unless noted.
pub struct QMatrix {
    pub kind: QKind,
    /// How activations are quantized against it: as llama.cpp does for the file's type (Q8_K
    /// for K-quants), so products agree with the reference implementation.
    pub act: ActFormat,
    pub rows: usize,
    pub cols: usize,
    /// Quantized values, `[group][block][tile_bytes]`.
    pub qs: WeightBuf<u8>,
    /// Q5_0, Q5_1, Q5K: the fifth bits, `[group][block][j]` for the tile's eight four-element columns
    /// `j` (low nibbles 0..4, high 4..8): bit `r*4 + e` is that of element `4j + e` of row `r`,
    /// i.e. a byte mask over the kernels' `j`-th vector of unpacked values.
    pub qh: WeightBuf<u64>,
    /// f16 bits: Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 block scales; Q4K, Q5K superblock scales
    /// `[group][superblock][16]`.
    pub d: WeightBuf<u16>,
    /// f16 bits: Q4_1, Q5_1 block minimums; Q4K, Q5K superblock minimum scales
    /// `[group][superblock][16]`.
    pub m: WeightBuf<u16>,
    /// Q4K, Q5K: the blocks' 6-bit scales and minimums. Q6K: the i8 scales of each half block,
    /// `[group][block][half][16]`.
    pub sc: WeightBuf<u8>,
    pub mn: WeightBuf<u8>,
    /// Q6K: superblock scales `[group][superblock][16]`; Q6KWide: scales of each half block,
    /// `[group][block][half][16]`.
    pub fd: WeightBuf<f32>,
    /// The AMX tiles' signed-byte copy of `qs`, made on the first batched product that uses
    /// the tiles (`kernels::amx::signed_weights`); `None` inside when it was not kept.
    pub signed: OnceLock<Option<SignedCopy>>,
}

/// Bytes held by every live [`SignedCopy`] in the process.
static SIGNED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A matrix's weights as one signed byte each, counted against a process-wide budget so that
/// such copies cannot grow memory without bound (they take twice a 4-bit matrix's bytes).
pub struct SignedCopy(Box<[u8]>);

impl SignedCopy {
    /// `len` zero bytes, if every copy in the process then holds at most `budget` bytes.
    pub fn reserve(len: usize, budget: usize) -> Option<SignedCopy> {
        SIGNED_BYTES
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| held.checked_add(len).filter(|&n| n <= budget))
            .ok()?;
        Some(SignedCopy(vec![0; len].into_boxed_slice()))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for SignedCopy {
    fn drop(&mut self) {
        SIGNED_BYTES.fetch_sub(self.0.len(), Ordering::AcqRel);
    }
}

impl Packable for QMatrix {
    fn each_buf(&mut self, f: &mut dyn FnMut(BufMut<'_>)) {
        f(BufMut::U8(&mut self.qs));
        f(BufMut::U64(&mut self.qh));
        f(BufMut::U16(&mut self.d));
        f(BufMut::U16(&mut self.m));
        f(BufMut::U8(&mut self.sc));
        f(BufMut::U8(&mut self.mn));
        f(BufMut::F32(&mut self.fd));
    }
}

impl QMatrix {
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    pub fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Repacks ggml rows (`rows` rows of `cols` elements encoded as `ty`) into groups.
    pub fn from_ggml(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Result<QMatrix, ModelError> {
        Self::from_parts(&[(ty, rows, data)], cols)
    }

    /// Stacks parts (type, rows, ggml data) by rows into one matrix; every part's type must map
    /// onto the same kernel format. Missing rows of the last group are zero (scale 0), so they
    /// compute to 0 and are not stored.
    pub fn from_parts(parts: &[(GgmlType, usize, &[u8])], cols: usize) -> Result<QMatrix, ModelError> {
        Self::repack(parts, cols, true, Q6kLayout::Packed, Alloc::Heap)
    }

    /// [`QMatrix::from_parts`] with Q6_K laid out as `q6k` says.
    pub fn from_parts_laid_out(
        parts: &[(GgmlType, usize, &[u8])],
        cols: usize,
        q6k: Q6kLayout,
    ) -> Result<QMatrix, ModelError> {
        Self::repack(parts, cols, true, q6k, Alloc::Heap)
    }

    /// [`QMatrix::from_parts_laid_out`] with its buffers made by `alloc` (in a loader's weight region).
    pub fn from_parts_in(
        parts: &[(GgmlType, usize, &[u8])],
        cols: usize,
        q6k: Q6kLayout,
        alloc: Alloc<'_>,
    ) -> Result<QMatrix, ModelError> {
        Self::repack(parts, cols, true, q6k, alloc)
    }

    /// [`QMatrix::from_parts`], whole rows at a time where [`QMatrix::put_row`] can (`rows_at_once`).
    fn repack(
        parts: &[(GgmlType, usize, &[u8])],
        cols: usize,
        rows_at_once: bool,
        q6k: Q6kLayout,
        alloc: Alloc<'_>,
    ) -> Result<QMatrix, ModelError> {
        let rows: usize = parts.iter().map(|p| p.1).sum();
        let shape = |why: String| ModelError::Shape(format!("matrix {rows}x{cols}: {why}"));
        if !cols.is_multiple_of(QK) || rows == 0 {
            return Err(shape("columns must be a positive multiple of 32".into()));
        }
        if QKind::of(parts[0].0).is_none() {
            return Err(shape(format!("no integer kernel format for {}", parts[0].0.name())));
        }
        let types: Vec<GgmlType> = parts.iter().map(|p| p.0).collect();
        let Some(kind) = QKind::of_stack(&types).map(|k| k.laid_out(q6k)) else {
            let other = types.iter().find(|&&t| QKind::of(t) != QKind::of(types[0])).unwrap_or(&types[0]);
            return Err(shape(format!("cannot stack {} with {}", other.name(), parts[0].0.name())));
        };
        for &(ty, n, data) in parts {
            let (be, bb) = ty.block();
            if !cols.is_multiple_of(be) {
                return Err(shape(format!("{} rows must be whole superblocks of {be} columns", ty.name())));
            }
            let expected = n * cols / be * bb;
            if data.len() != expected {
                return Err(shape(format!("{} bytes of {} data, expected {expected}", data.len(), ty.name())));
            }
        }
        let mut w = Self::zeroed(kind, rows, cols, alloc);
        if parts.iter().all(|p| matches!(p.0, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)) {
            w.act = ActFormat::Q8K;
        }
        let mut row = 0;
        for &(ty, n, data) in parts {
            let (be, bb) = ty.block();
            let row_bytes = cols / be * bb;
            for src in data.chunks_exact(row_bytes).take(n) {
                if rows_at_once && w.put_row(ty, row, src) {
                    row += 1;
                    continue;
                }
                for b in 0..cols / QK {
                    let (blk, sub) = ((b * QK) / be, (b * QK) % be / QK);
                    w.put(row, b, &unpack(ty, &src[blk * bb..(blk + 1) * bb], sub));
                }
                row += 1;
            }
        }
        Ok(w)
    }

    fn zeroed(kind: QKind, rows: usize, cols: usize, alloc: Alloc<'_>) -> QMatrix {
        let n = rows.div_ceil(GROUP) * (cols / QK) * GROUP;
        let per = |yes: bool, len: usize| if yes { len } else { 0 };
        use QKind::*;
        QMatrix {
            kind,
            act: kind.act_format(),
            rows,
            cols,
            qs: alloc.zeroed(n / GROUP * kind.tile_bytes()),
            qh: alloc.zeroed(per(kind.fifth_bits(), n / GROUP * 8)),
            d: alloc.zeroed(
                per(matches!(kind, Q8_0 | Q4_0 | Q5_0 | Q4_1 | Q5_1), n) + per(matches!(kind, Q4K | Q5K), n / KBLOCKS),
            ),
            m: alloc.zeroed(per(matches!(kind, Q4_1 | Q5_1), n) + per(matches!(kind, Q4K | Q5K), n / KBLOCKS)),
            sc: alloc.zeroed(per(matches!(kind, Q4K | Q5K), n) + per(kind == Q6K, 2 * n)),
            mn: alloc.zeroed(per(matches!(kind, Q4K | Q5K), n)),
            fd: alloc.zeroed(per(kind == Q6K, n / KBLOCKS) + per(kind == Q6KWide, 2 * n)),
            signed: OnceLock::new(),
        }
    }

    /// Stores ggml row `row` (`src`: its blocks of `ty`) where the file's bytes already are the
    /// tiles' up to their order: Q4_0, Q4_1 and Q4_K nibbles, Q8_0 bytes (+128) and Q6_K's six
    /// bits, four elements at a time. The same bytes as [`QMatrix::put`] of every unpacked block
    /// (`whole_rows_repack_to_the_bytes_of_block_by_block`) at a fraction of its cost, which is
    /// most of a model's load time. False, storing nothing, for any other pair of file type
    /// and kind (Q5 types, a stack requantized to another kind).
    fn put_row(&mut self, ty: GgmlType, row: usize, src: &[u8]) -> bool {
        let wide = self.kind == QKind::Q6KWide;
        if QKind::of(ty).map(|k| k.laid_out(if wide { Q6kLayout::Wide } else { Q6kLayout::Packed })) != Some(self.kind)
        {
            return false;
        }
        let (g, r, nb, tb) = (row / GROUP, row % GROUP, self.blocks(), self.kind.tile_bytes());
        let word = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let f16 = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let (nib, two) = (0x0F0F_0F0Fu32, 0x0303_0303u32);
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
                let (bb, at, words, flip) = match ty {
                    GgmlType::Q4_0 => (18, 2, 4, 0),
                    GgmlType::Q4_1 => (20, 4, 4, 0),
                    _ => (34, 2, 8, 0x8080_8080u32),
                };
                for (b, blk) in src.chunks_exact(bb).enumerate() {
                    let gb = g * nb + b;
                    let tile = &mut self.qs[gb * tb..(gb + 1) * tb];
                    for j in 0..words {
                        tile[j * 64 + r * 4..][..4].copy_from_slice(&(word(blk, at + 4 * j) ^ flip).to_le_bytes());
                    }
                    self.d[gb * GROUP + r] = f16(blk, 0);
                    if ty == GgmlType::Q4_1 {
                        self.m[gb * GROUP + r] = f16(blk, 2);
                    }
                }
            }
            GgmlType::Q4_K => {
                for (k, blk) in src.chunks_exact(144).enumerate() {
                    let si = (g * (nb / KBLOCKS) + k) * GROUP + r;
                    (self.d[si], self.m[si]) = (f16(blk, 0), f16(blk, 2));
                    for sub in 0..KBLOCKS {
                        let gb = g * nb + k * KBLOCKS + sub;
                        let (chunk, shift) = (&blk[16 + 32 * (sub / 2)..][..32], 4 * (sub % 2));
                        let tile = &mut self.qs[gb * tb..(gb + 1) * tb];
                        for p in 0..4 {
                            let lo = (word(chunk, 4 * p) >> shift) & nib;
                            let hi = (word(chunk, 16 + 4 * p) >> shift) & nib;
                            tile[p * 64 + r * 4..][..4].copy_from_slice(&(lo | (hi << 4)).to_le_bytes());
                        }
                        (self.sc[gb * GROUP + r], self.mn[gb * GROUP + r]) = scale_min_k4(sub, &blk[4..16]);
                    }
                }
            }
            GgmlType::Q6_K if !wide => {
                for (k, blk) in src.chunks_exact(210).enumerate() {
                    self.fd[(g * (nb / KBLOCKS) + k) * GROUP + r] = crate::quant::f16_bits_to_f32(blk[208], blk[209]);
                    for sub in 0..KBLOCKS {
                        let gb = g * nb + k * KBLOCKS + sub;
                        let (n, i) = (sub / 4, sub % 4);
                        let (ql, qh) = (&blk[64 * n + 32 * (i % 2)..][..32], &blk[128 + 32 * n..][..32]);
                        // Four elements' low nibbles and top pairs, from element `at` on.
                        let low = |at: usize| (word(ql, at) >> (4 * (i / 2))) & nib;
                        let top = |at: usize| (word(qh, at) >> (2 * i)) & two;
                        let tile = &mut self.qs[gb * tb..(gb + 1) * tb];
                        let mut plane = [0u32; 2];
                        for p in 0..4 {
                            let byte = low(4 * p) | (low(16 + 4 * p) << 4);
                            tile[p * 64 + r * 4..][..4].copy_from_slice(&byte.to_le_bytes());
                            for (c, bits) in plane.iter_mut().enumerate() {
                                *bits |= top(16 * c + 4 * p) << (2 * p);
                            }
                        }
                        for (c, bits) in plane.iter().enumerate() {
                            tile[256 + c * 64 + r * 4..][..4].copy_from_slice(&bits.to_le_bytes());
                        }
                        let half = gb * 2 * GROUP + r;
                        (self.sc[half], self.sc[half + GROUP]) = (blk[192 + 2 * sub], blk[193 + 2 * sub]);
                    }
                }
            }
            GgmlType::Q6_K => {
                for (k, blk) in src.chunks_exact(210).enumerate() {
                    let d = crate::quant::f16_bits_to_f32(blk[208], blk[209]);
                    for sub in 0..KBLOCKS {
                        let gb = g * nb + k * KBLOCKS + sub;
                        let (n, i) = (sub / 4, sub % 4);
                        let (ql, qh) = (&blk[64 * n + 32 * (i % 2)..][..32], &blk[128 + 32 * n..][..32]);
                        let tile = &mut self.qs[gb * tb..(gb + 1) * tb];
                        for j in 0..8 {
                            let six = ((word(ql, 4 * j) >> (4 * (i / 2))) & nib)
                                | (((word(qh, 4 * j) >> (2 * i)) & two) << 4);
                            tile[j * 64 + r * 4..][..4].copy_from_slice(&six.to_le_bytes());
                        }
                        let half = gb * 2 * GROUP + r;
                        self.fd[half] = d * blk[192 + 2 * sub] as i8 as f32;
                        self.fd[half + GROUP] = d * blk[193 + 2 * sub] as i8 as f32;
                    }
                }
            }
            _ => return false,
        }
        true
    }

    /// Stores block `b` of row `row`.
    fn put(&mut self, row: usize, b: usize, blk: &crate::unpack::Block32) {
        let (g, r, nb) = (row / GROUP, row % GROUP, self.blocks());
        let gb = g * nb + b;
        let i = gb * GROUP + r;
        let tb = self.kind.tile_bytes();
        let tile = &mut self.qs[gb * tb..(gb + 1) * tb];
        let q = &blk.q;
        if self.kind.nibbles() || self.kind == QKind::Q6K {
            let v = |k: usize| q[k].wrapping_add(self.kind.offset() as u8);
            for p in 0..4 {
                for e in 0..4 {
                    let (lo, hi) = (v(4 * p + e), v(16 + 4 * p + e));
                    tile[p * 64 + r * 4 + e] = (lo & 0x0F) | (hi << 4);
                    if self.kind == QKind::Q6K {
                        tile[256 + r * 4 + e] |= (lo >> 4) << (2 * p);
                        tile[256 + 64 + r * 4 + e] |= (hi >> 4) << (2 * p);
                    }
                    if self.kind.fifth_bits() {
                        let bit = 1u64 << (r * 4 + e);
                        self.qh[gb * 8 + p] |= if lo & 0x10 != 0 { bit } else { 0 };
                        self.qh[gb * 8 + 4 + p] |= if hi & 0x10 != 0 { bit } else { 0 };
                    }
                }
            }
        } else {
            let off = self.kind.offset() as u8;
            for j in 0..8 {
                for e in 0..4 {
                    tile[j * 64 + r * 4 + e] = q[4 * j + e].wrapping_add(off);
                }
            }
        }
        let half = (gb * 2 * GROUP) + r;
        match blk.scale {
            Scale::F16 { d } => {
                self.d[i] = d;
            }
            Scale::F16Min { d, m } => {
                self.d[i] = d;
                self.m[i] = m;
            }
            Scale::K { d, dmin, sc, mn } => {
                let si = (g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP + r;
                self.d[si] = d;
                self.m[si] = dmin;
                self.sc[i] = sc;
                self.mn[i] = mn;
            }
            Scale::Q6 { d, lo, hi } if self.kind == QKind::Q6K => {
                self.fd[(g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP + r] = d;
                (self.sc[half], self.sc[half + GROUP]) = (lo as u8, hi as u8);
            }
            Scale::Q6 { d, lo, hi } => {
                self.fd[half] = d * lo as f32;
                self.fd[half + GROUP] = d * hi as f32;
            }
        }
    }

    /// Row `r` of group `g`, block `b`: the scale and minimum a min-kind (Q4_1, Q4K, Q5_1, Q5K)
    /// applies, `value = q * scale + min`, in f32 as the kernels form them; for Q8_0 the
    /// minimum is 0, and for Q6K see [`QMatrix::half_scales`].
    #[inline(always)]
    pub fn scale_min(&self, g: usize, b: usize, r: usize) -> (f32, f32) {
        let nb = self.blocks();
        let i = (g * nb + b) * GROUP + r;
        let h = |bits: u16| half::f16::from_bits(bits).to_f32();
        match self.kind {
            QKind::Q8_0 | QKind::Q4_0 | QKind::Q5_0 => (h(self.d[i]), 0.0),
            QKind::Q4_1 | QKind::Q5_1 => (h(self.d[i]), h(self.m[i])),
            QKind::Q4K | QKind::Q5K => {
                let si = (g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP + r;
                (h(self.d[si]) * self.sc[i] as f32, -(h(self.m[si]) * self.mn[i] as f32))
            }
            QKind::Q6K | QKind::Q6KWide => (0.0, 0.0),
        }
    }

    /// Q6K: the scales of elements 0..16 and 16..32 of row `r` of group `g`, block `b`.
    #[inline(always)]
    pub fn half_scales(&self, g: usize, b: usize, r: usize) -> (f32, f32) {
        let nb = self.blocks();
        let i = (g * nb + b) * 2 * GROUP + r;
        match self.kind {
            QKind::Q6K => {
                let d = self.fd[(g * (nb / KBLOCKS) + b / KBLOCKS) * GROUP + r];
                (d * self.sc[i] as i8 as f32, d * self.sc[i + GROUP] as i8 as f32)
            }
            _ => (self.fd[i], self.fd[i + GROUP]),
        }
    }

    /// Element `k` (0..32) of row `r` of group-block `gb` (`g * blocks + b`), as the kernels read it.
    #[inline(always)]
    pub fn value(&self, gb: usize, r: usize, k: usize) -> i32 {
        let tb = self.kind.tile_bytes();
        let tile = &self.qs[gb * tb..(gb + 1) * tb];
        let (j, e) = (k / 4, k % 4);
        match self.kind {
            QKind::Q5_0 | QKind::Q5_1 | QKind::Q5K => {
                let nib = if j < 4 { tile[j * 64 + r * 4 + e] & 0x0F } else { tile[(j - 4) * 64 + r * 4 + e] >> 4 };
                let fifth = (self.qh[gb * 8 + j] >> (r * 4 + e)) & 1;
                nib as i32 + 16 * fifth as i32 - self.kind.offset()
            }
            QKind::Q4_1 | QKind::Q4K | QKind::Q4_0 if j < 4 => {
                (tile[j * 64 + r * 4 + e] & 0x0F) as i32 - self.kind.offset()
            }
            QKind::Q4_1 | QKind::Q4K | QKind::Q4_0 => (tile[(j - 4) * 64 + r * 4 + e] >> 4) as i32 - self.kind.offset(),
            QKind::Q6K => {
                let (p, c) = (j % 4, j / 4);
                let nib = (tile[p * 64 + r * 4 + e] >> (4 * c)) & 0x0F;
                let top = (tile[256 + c * 64 + r * 4 + e] >> (2 * p)) & 3;
                (nib | top << 4) as i32 - self.kind.offset()
            }
            QKind::Q8_0 | QKind::Q6KWide => tile[j * 64 + r * 4 + e] as i32 - self.kind.offset(),
        }
    }

    /// Dequantized row, for embedding lookups and tests: ggml's values exactly.
    pub fn row_f32(&self, row: usize, out: &mut [f32]) {
        let nb = self.blocks();
        let (g, r) = (row / GROUP, row % GROUP);
        for b in 0..nb {
            let gb = g * nb + b;
            let o = &mut out[b * QK..(b + 1) * QK];
            match self.kind {
                QKind::Q8_0 | QKind::Q4_0 | QKind::Q5_0 => {
                    let (d, _) = self.scale_min(g, b, r);
                    for (k, v) in o.iter_mut().enumerate() {
                        *v = self.value(gb, r, k) as f32 * d;
                    }
                }
                QKind::Q4_1 | QKind::Q4K | QKind::Q5_1 | QKind::Q5K => {
                    let (d, m) = self.scale_min(g, b, r);
                    for (k, v) in o.iter_mut().enumerate() {
                        *v = self.value(gb, r, k) as f32 * d + m;
                    }
                }
                QKind::Q6K | QKind::Q6KWide => {
                    let (lo, hi) = self.half_scales(g, b, r);
                    for (k, v) in o.iter_mut().enumerate() {
                        *v = self.value(gb, r, k) as f32 * if k < 16 { lo } else { hi };
                    }
                }
            }
        }
    }

    /// Bytes the matrix occupies (for reports).
    pub fn bytes(&self) -> usize {
        self.qs.len()
            + 8 * self.qh.len()
            + 2 * (self.d.len() + self.m.len())
            + self.sc.len()
            + self.mn.len()
            + 4 * self.fd.len()
    }
}

/// Quantizes `x` (`t` rows of `cols`) in the format `w` needs.
pub fn quantize_for(w: &QMatrix, x: &[f32], t: usize, acts: &mut QuantActs) {
    acts.quantize(x, t, w.cols, w.act);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::synth::{random_blocks, QUANTIZED};

    #[test]
    fn whole_rows_repack_to_the_bytes_of_block_by_block() {
        // 37 rows: two whole groups and a part; 512 columns: two K superblocks a row.
        let (rows, cols) = (37, 512);
        for (ty, layout) in QUANTIZED.iter().flat_map(|&t| [(t, Q6kLayout::Packed), (t, Q6kLayout::Wide)]) {
            let (be, _) = ty.block();
            let data = random_blocks(ty, rows * cols / be, 0xfa57 ^ ty.id() as u64);
            let parts = [(ty, rows, &data[..])];
            let (fast, slow) = (
                QMatrix::repack(&parts, cols, true, layout, Alloc::Heap).unwrap(),
                QMatrix::repack(&parts, cols, false, layout, Alloc::Heap).unwrap(),
            );
            assert_eq!(
                (&fast.qs[..], &fast.qh[..], &fast.d[..], &fast.m[..]),
                (&slow.qs[..], &slow.qh[..], &slow.d[..], &slow.m[..]),
                "{ty:?} {layout:?}"
            );
            assert_eq!((&fast.sc[..], &fast.mn[..]), (&slow.sc[..], &slow.mn[..]), "{ty:?} {layout:?}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast.fd), bits(&slow.fd), "{ty:?} {layout:?}");
        }
        // A stack of Q4_0 under Q8_0 (the kind of neither file type alone) takes the blocks.
        let (a, b) = (random_blocks(GgmlType::Q4_0, 16 * 4, 1), random_blocks(GgmlType::Q8_0, 16 * 4, 2));
        let parts = [(GgmlType::Q4_0, 16, &a[..]), (GgmlType::Q8_0, 16, &b[..])];
        let (fast, slow) = (
            QMatrix::repack(&parts, 128, true, Q6kLayout::Packed, Alloc::Heap).unwrap(),
            QMatrix::repack(&parts, 128, false, Q6kLayout::Packed, Alloc::Heap).unwrap(),
        );
        assert_eq!(fast.kind, QKind::Q8_0);
        assert_eq!((&fast.qs[..], &fast.d[..]), (&slow.qs[..], &slow.d[..]));
    }
}
