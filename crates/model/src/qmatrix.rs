//! Quantized weight matrices, repacked at load time for the integer kernels.
//!
//! ggml stores a weight row as consecutive blocks of 32. The kernels instead want 16 rows side
//! by side, so that one 512-bit multiply-accumulate covers four elements of sixteen rows and a
//! broadcast of four activation bytes. The repack keeps ggml's exact values and scales; only
//! the order of bytes changes, so results equal ggml's integer dot products.

use crate::error::ModelError;
use crate::quant::{ActFormat, QuantActs, QK};

/// Rows interleaved per group.
pub const GROUP: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QKind {
    /// 4-bit unsigned with per-block scale and minimum; activations in Q8_1.
    Q4_1,
    /// 8-bit signed with per-block scale; activations in Q8_0.
    Q8_0,
}

impl QKind {
    pub fn act_format(self) -> ActFormat {
        match self {
            QKind::Q4_1 => ActFormat::Q8_1,
            QKind::Q8_0 => ActFormat::Q8_0,
        }
    }

    /// Bytes of quantized values per (group, block).
    pub const fn tile_bytes(self) -> usize {
        match self {
            QKind::Q4_1 => GROUP * QK / 2,
            QKind::Q8_0 => GROUP * QK,
        }
    }
}

/// A `rows x cols` weight matrix (out features x in features), `cols` a multiple of 32.
pub struct QMatrix {
    pub kind: QKind,
    pub rows: usize,
    pub cols: usize,
    /// Quantized values, `[group][block][tile_bytes]`.
    pub qs: Vec<u8>,
    /// Block scales as f16 bits, `[group][block][16]`.
    pub d: Vec<u16>,
    /// Q4_1: block minimums as f16 bits, `[group][block][16]`.
    pub m: Vec<u16>,
    /// Q8_0: 128 * sum of the block's values, `[group][block][16]`: corrects for the activations
    /// being fed as value + 128 to an unsigned x signed instruction.
    pub wsum128: Vec<i32>,
}

impl QMatrix {
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    pub fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Repacks ggml rows (`rows` rows of `cols` elements, ggml block encoding) into groups.
    /// Missing rows of the last group are zero (scale 0), so they compute to 0 and are not stored.
    pub fn from_ggml(kind: QKind, rows: usize, cols: usize, data: &[u8]) -> Result<QMatrix, ModelError> {
        if !cols.is_multiple_of(QK) || rows == 0 {
            return Err(ModelError::Shape(format!("matrix {rows}x{cols}: columns must be a positive multiple of 32")));
        }
        let nb = cols / QK;
        let block_bytes = match kind {
            QKind::Q4_1 => 20,
            QKind::Q8_0 => 34,
        };
        if data.len() != rows * nb * block_bytes {
            return Err(ModelError::Shape(format!(
                "matrix {rows}x{cols}: {} bytes of data, expected {}",
                data.len(),
                rows * nb * block_bytes
            )));
        }
        let groups = rows.div_ceil(GROUP);
        let tb = kind.tile_bytes();
        let mut qs = vec![0u8; groups * nb * tb];
        let mut d = vec![0u16; groups * nb * GROUP];
        let mut m = vec![0u16; if kind == QKind::Q4_1 { groups * nb * GROUP } else { 0 }];
        let mut wsum128 = vec![0i32; if kind == QKind::Q8_0 { groups * nb * GROUP } else { 0 }];
        for row in 0..rows {
            let (g, r) = (row / GROUP, row % GROUP);
            for b in 0..nb {
                let src = &data[(row * nb + b) * block_bytes..(row * nb + b + 1) * block_bytes];
                let gb = g * nb + b;
                d[gb * GROUP + r] = u16::from_le_bytes([src[0], src[1]]);
                let tile = &mut qs[gb * tb..(gb + 1) * tb];
                match kind {
                    QKind::Q4_1 => {
                        m[gb * GROUP + r] = u16::from_le_bytes([src[2], src[3]]);
                        // Byte j of a ggml block holds elements j (low) and j+16 (high); lane
                        // p*64 + r*4 + e takes byte 4p+e, so low nibbles form element group p and
                        // high nibbles group p+4.
                        for p in 0..4 {
                            for e in 0..4 {
                                tile[p * 64 + r * 4 + e] = src[4 + 4 * p + e];
                            }
                        }
                    }
                    QKind::Q8_0 => {
                        let mut sum = 0i32;
                        for j in 0..8 {
                            for e in 0..4 {
                                let v = src[2 + 4 * j + e];
                                tile[j * 64 + r * 4 + e] = v;
                                sum += v as i8 as i32;
                            }
                        }
                        wsum128[gb * GROUP + r] = 128 * sum;
                    }
                }
            }
        }
        Ok(QMatrix { kind, rows, cols, qs, d, m, wsum128 })
    }

    /// Dequantized row, for embedding lookups and tests.
    pub fn row_f32(&self, row: usize, out: &mut [f32]) {
        let nb = self.blocks();
        let (g, r) = (row / GROUP, row % GROUP);
        let tb = self.kind.tile_bytes();
        for b in 0..nb {
            let gb = g * nb + b;
            let tile = &self.qs[gb * tb..(gb + 1) * tb];
            let d = half::f16::from_bits(self.d[gb * GROUP + r]).to_f32();
            let o = &mut out[b * QK..(b + 1) * QK];
            match self.kind {
                QKind::Q4_1 => {
                    let m = half::f16::from_bits(self.m[gb * GROUP + r]).to_f32();
                    for p in 0..4 {
                        for e in 0..4 {
                            let byte = tile[p * 64 + r * 4 + e];
                            o[4 * p + e] = (byte & 0x0F) as f32 * d + m;
                            o[16 + 4 * p + e] = (byte >> 4) as f32 * d + m;
                        }
                    }
                }
                QKind::Q8_0 => {
                    for j in 0..8 {
                        for e in 0..4 {
                            o[4 * j + e] = tile[j * 64 + r * 4 + e] as i8 as f32 * d;
                        }
                    }
                }
            }
        }
    }

    /// Bytes the matrix occupies (for reports).
    pub fn bytes(&self) -> usize {
        self.qs.len() + 2 * (self.d.len() + self.m.len()) + 4 * self.wsum128.len()
    }
}

/// Quantizes `x` (`t` rows of `cols`) in the format `w` needs.
pub fn quantize_for(w: &QMatrix, x: &[f32], t: usize, acts: &mut QuantActs) {
    acts.quantize(x, t, w.cols, w.kind.act_format());
}
