//! One 32-element block of a ggml row, decoded into the integer values and scales of the
//! kernel format it maps to ([`QKind::of`](crate::qmatrix::QKind::of)). Every mapping is exact:
//! the kernel format's dequantized values equal ggml's (tested against [`crate::dequant`]).

use gguf::GgmlType;

use crate::dequant::scale_min_k4;
use crate::quant::f16_bits_to_f32;

/// A block's scales, as the kernel format stores them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// `Q8_0`: value = q * d.
    F16 { d: u16 },
    /// `Q4_1`, `Q5_1`: value = q * d + m.
    F16Min { d: u16, m: u16 },
    /// `Q4K`, `Q5K`: value = q * (d * sc) - dmin * mn, with the superblock's f16 `d` and
    /// `dmin` and the block's 6-bit `sc` and `mn`.
    K { d: u16, dmin: u16, sc: u8, mn: u8 },
    /// `Q6K`: value = q * (d * lo) for elements 0..16, q * (d * hi) for 16..32, with the
    /// superblock's `d` and the half blocks' i8 scales.
    Q6 { d: f32, lo: i8, hi: i8 },
}

/// Values (two's complement bytes for the signed formats) and scales of one block.
pub struct Block32 {
    pub q: [u8; 32],
    pub scale: Scale,
}

fn f16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// Elements 0..16 from the low nibbles of `bytes`, 16..32 from the high ones (Q4_0, Q4_1, Q5_x),
/// plus the fifth bits of `qh` when given, minus `offset`.
fn split_nibbles(bytes: &[u8], qh: Option<u32>, offset: i32) -> [u8; 32] {
    let mut q = [0u8; 32];
    let high = |j: usize| qh.map_or(0, |h| ((h >> j) & 1) << 4) as i32;
    for j in 0..16 {
        q[j] = ((bytes[j] & 0x0F) as i32 + high(j) - offset) as u8;
        q[j + 16] = ((bytes[j] >> 4) as i32 + high(j + 16) - offset) as u8;
    }
    q
}

/// Block `sub` (32 elements) of the ggml block `block` of type `ty`.
///
/// # Panics
/// For the float types, which have no integer kernel format.
pub fn unpack(ty: GgmlType, block: &[u8], sub: usize) -> Block32 {
    let f32_at = |i: usize| f16_bits_to_f32(block[i], block[i + 1]);
    let u32_at = |i: usize| u32::from_le_bytes([block[i], block[i + 1], block[i + 2], block[i + 3]]);
    let mut q = [0u8; 32];
    let scale = match ty {
        GgmlType::Q8_0 => {
            q.copy_from_slice(&block[2..34]);
            Scale::F16 { d: f16_at(block, 0) }
        }
        GgmlType::Q4_0 => {
            q = split_nibbles(&block[2..18], None, 8);
            Scale::F16 { d: f16_at(block, 0) }
        }
        GgmlType::Q5_0 => {
            q = split_nibbles(&block[6..22], Some(u32_at(2)), 16);
            Scale::F16 { d: f16_at(block, 0) }
        }
        GgmlType::Q4_1 => {
            q = split_nibbles(&block[4..20], None, 0);
            Scale::F16Min { d: f16_at(block, 0), m: f16_at(block, 2) }
        }
        GgmlType::Q5_1 => {
            q = split_nibbles(&block[8..24], Some(u32_at(4)), 0);
            Scale::F16Min { d: f16_at(block, 0), m: f16_at(block, 2) }
        }
        GgmlType::Q4_K => {
            // Sub-blocks 2i and 2i+1 share 32 bytes: low nibbles, then high.
            let (bytes, shift) = (&block[16 + 32 * (sub / 2)..][..32], 4 * (sub % 2));
            for (v, b) in q.iter_mut().zip(bytes) {
                *v = (b >> shift) & 0x0F;
            }
            let (sc, mn) = scale_min_k4(sub, &block[4..16]);
            Scale::K { d: f16_at(block, 0), dmin: f16_at(block, 2), sc, mn }
        }
        GgmlType::Q5_K => {
            let (bytes, shift) = (&block[48 + 32 * (sub / 2)..][..32], 4 * (sub % 2));
            for ((v, b), h) in q.iter_mut().zip(bytes).zip(&block[16..48]) {
                *v = ((b >> shift) & 0x0F) | (((h >> sub) & 1) << 4);
            }
            let (sc, mn) = scale_min_k4(sub, &block[4..16]);
            Scale::K { d: f16_at(block, 0), dmin: f16_at(block, 2), sc, mn }
        }
        GgmlType::Q6_K => {
            // Each half (128 elements) takes 64 bytes of low nibbles and 32 of 2-bit pairs;
            // its block i reads nibble i/2 of bytes 32*(i%2).., and pair i of every qh byte.
            let (n, i) = (sub / 4, sub % 4);
            let ql = &block[64 * n + 32 * (i % 2)..][..32];
            let qh = &block[128 + 32 * n..][..32];
            for ((v, l), h) in q.iter_mut().zip(ql).zip(qh) {
                let six = ((l >> (4 * (i / 2))) & 0x0F) | (((h >> (2 * i)) & 3) << 4);
                *v = (six as i8 - 32) as u8;
            }
            Scale::Q6 { d: f32_at(208), lo: block[192 + 2 * sub] as i8, hi: block[193 + 2 * sub] as i8 }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => panic!("{} has no integer kernel format", ty.name()),
    };
    Block32 { q, scale }
}
