//! ggml's block formats decoded to f32, following ggml-quants.c (`dequantize_row_*`) operation
//! for operation, so the values are the ones llama.cpp and gguf-py compute
//! (`tests/dequant_matches_gguf_py.rs` holds them to gguf-py bit for bit).

use gguf::GgmlType;

use crate::quant::f16_bits_to_f32;

/// Elements per K-quant superblock.
pub const QK_K: usize = 256;

/// Dequantizes one Q4_0 block (18 bytes: d f16, 16 bytes of nibbles, offset 8).
pub fn dequant_q4_0(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    for j in 0..16 {
        let b = block[2 + j];
        out[j] = ((b & 0x0F) as i32 - 8) as f32 * d;
        out[j + 16] = ((b >> 4) as i32 - 8) as f32 * d;
    }
}

/// Dequantizes one Q4_1 block (20 bytes: d f16, m f16, 16 bytes of nibbles; byte j holds
/// element j in its low nibble and element j+16 in its high nibble).
pub fn dequant_q4_1(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    let m = f16_bits_to_f32(block[2], block[3]);
    for j in 0..16 {
        let b = block[4 + j];
        out[j] = (b & 0x0F) as f32 * d + m;
        out[j + 16] = (b >> 4) as f32 * d + m;
    }
}

/// The 32 five-bit levels of a Q5 block: `nibbles` laid out as in Q4_0 (byte j holds elements
/// j and j+16), the fifth bits from the 4 little-endian bytes `qh`.
fn q5_levels(qh: &[u8], nibbles: &[u8]) -> [u32; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut out = [0u32; 32];
    for j in 0..16 {
        let b = nibbles[j];
        out[j] = (b & 0x0F) as u32 | (((qh >> j) << 4) & 0x10);
        out[j + 16] = (b >> 4) as u32 | ((qh >> (j + 12)) & 0x10);
    }
    out
}

/// Dequantizes one Q5_0 block (22 bytes: d f16, 4 bytes of high bits, 16 bytes of nibbles
/// laid out as in Q4_0; values offset by 16).
pub fn dequant_q5_0(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    for (o, q) in out.iter_mut().zip(q5_levels(&block[2..6], &block[6..22])) {
        *o = (q as i32 - 16) as f32 * d;
    }
}

/// Dequantizes one Q5_1 block (24 bytes: d f16, m f16, 4 bytes of high bits, 16 of nibbles).
pub fn dequant_q5_1(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    let m = f16_bits_to_f32(block[2], block[3]);
    for (o, q) in out.iter_mut().zip(q5_levels(&block[4..8], &block[8..24])) {
        *o = q as f32 * d + m;
    }
}

/// Dequantizes one Q8_0 block (34 bytes: d f16, 32 signed bytes).
pub fn dequant_q8_0(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    for j in 0..32 {
        out[j] = block[2 + j] as i8 as f32 * d;
    }
}

/// Scale and minimum of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K / Q5_K
/// superblock: six bits each (ggml's `get_scale_min_k4`).
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Dequantizes one Q4_K superblock (144 bytes: d f16, dmin f16, 12 bytes of packed 6-bit
/// scales and minimums, 128 bytes of nibbles). Each 64 elements share 32 bytes: sub-block 2i
/// in the low nibbles, 2i+1 in the high ones; element = d*sc * q - dmin*m.
pub fn dequant_q4_k(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    let min = f16_bits_to_f32(block[2], block[3]);
    let scales = &block[4..16];
    for i in 0..4 {
        let q = &block[16 + 32 * i..16 + 32 * (i + 1)];
        let (sc, m) = scale_min_k4(2 * i, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = scale_min_k4(2 * i + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        let y = &mut out[64 * i..64 * (i + 1)];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Dequantizes one Q5_K superblock (176 bytes: d, dmin, 12 scale bytes as in Q4_K, 32 bytes
/// of high bits, 128 of nibbles). Bit 2i of `qh[l]` is the fifth bit of element 64i + l, bit
/// 2i+1 that of element 64i + 32 + l.
pub fn dequant_q5_k(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    let min = f16_bits_to_f32(block[2], block[3]);
    let scales = &block[4..16];
    let qh = &block[16..48];
    for i in 0..4 {
        let ql = &block[48 + 32 * i..48 + 32 * (i + 1)];
        let (u1, u2) = (1u8 << (2 * i), 2u8 << (2 * i));
        let (sc, m) = scale_min_k4(2 * i, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = scale_min_k4(2 * i + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        let y = &mut out[64 * i..64 * (i + 1)];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// Dequantizes one Q6_K superblock (210 bytes: 128 bytes of low nibbles, 64 of high 2-bit
/// pairs, 16 signed 8-bit scales (one per 16 elements), d f16 last); element = d*sc * (q - 32).
pub fn dequant_q6_k(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[208], block[209]);
    for n in 0..2 {
        let ql = &block[64 * n..64 * (n + 1)];
        let qh = &block[128 + 32 * n..128 + 32 * (n + 1)];
        let sc = &block[192 + 8 * n..192 + 8 * (n + 1)];
        let y = &mut out[128 * n..128 * (n + 1)];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * sc[is + k] as i8 as f32;
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

/// Dequantizes `bytes`, whole blocks of `ty`, into `out` (one value per element).
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |c, o| o[0] = f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        GgmlType::F16 => |c, o| o[0] = f16_bits_to_f32(c[0], c[1]),
        GgmlType::BF16 => |c, o| o[0] = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16),
        GgmlType::Q4_0 => dequant_q4_0,
        GgmlType::Q4_1 => dequant_q4_1,
        GgmlType::Q5_0 => dequant_q5_0,
        GgmlType::Q5_1 => dequant_q5_1,
        GgmlType::Q8_0 => dequant_q8_0,
        GgmlType::Q4_K => dequant_q4_k,
        GgmlType::Q5_K => dequant_q5_k,
        GgmlType::Q6_K => dequant_q6_k,
    };
    let (be, bb) = ty.block();
    for (o, c) in out.chunks_exact_mut(be).zip(bytes.chunks_exact(bb)) {
        block(c, o);
    }
}

/// All of `bytes` (whole blocks of `ty`) as f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let (be, bb) = ty.block();
    let mut out = vec![0f32; bytes.len() / bb * be];
    dequantize_into(ty, bytes, &mut out);
    out
}
