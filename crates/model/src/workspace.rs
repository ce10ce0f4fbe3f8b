//! A step's activation buffers, kept from one step to the next.
//!
//! A batch-64 decode step of the default model needs about 15 MB of activations and logits.
//! Allocated afresh each step, most of it is mapped and unmapped by the allocator every time
//! (blocks over glibc's mmap threshold, trimmed heap tops), and in `serve` the page faults of
//! touching it again cost about a fifth of each step. Kept here, a step of a size seen before
//! allocates nothing that large.

use crate::quant::QuantActs;

/// Buffers larger than this are not kept after a step, so one unusually large step (a long
/// prompt with every position's logits) does not pin its memory for the life of the model.
const KEEP_AT_MOST: usize = 16 << 20;

#[derive(Default)]
pub(crate) struct Workspace {
    pub x: Vec<f32>,
    pub xn: Vec<f32>,
    pub qkv: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub attn: Vec<f32>,
    pub proj: Vec<f32>,
    pub normed: Vec<f32>,
    pub gate_up: Vec<f32>,
    pub hidden: Vec<f32>,
    /// The final norm's input and output rows and the vocabulary projection of the rows
    /// whose logits were asked for.
    pub sel: Vec<f32>,
    pub sel_normed: Vec<f32>,
    pub logits: Vec<f32>,
    pub acts: QuantActs,
    /// Each attention task's output rows (a task per sequence, KV head and block of rows).
    pub attn_parts: Vec<Vec<f32>>,
}

impl Workspace {
    /// Frees every buffer over [`KEEP_AT_MOST`] floats' worth of bytes.
    pub fn trim(&mut self) {
        for b in [
            &mut self.x,
            &mut self.xn,
            &mut self.qkv,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.attn,
            &mut self.proj,
            &mut self.normed,
            &mut self.gate_up,
            &mut self.hidden,
            &mut self.sel,
            &mut self.sel_normed,
            &mut self.logits,
        ] {
            if b.capacity() * size_of::<f32>() > KEEP_AT_MOST {
                *b = Vec::new();
            }
        }
        if self.acts.qs.capacity() > KEEP_AT_MOST {
            self.acts = QuantActs::default();
        }
        if self.attn_parts.iter().map(|p| p.capacity() * size_of::<f32>()).sum::<usize>() > KEEP_AT_MOST {
            self.attn_parts = Vec::new();
        }
    }
}

/// `buf` as `len` zeros, in its existing allocation when that is large enough.
pub(crate) fn zeroed(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.clear();
    buf.resize(len, 0.0);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_buffer_is_all_zeros_at_the_new_length() {
        let mut b = vec![7.0f32; 10];
        assert_eq!(zeroed(&mut b, 4), &[0.0; 4]);
        assert_eq!(zeroed(&mut b, 12), &[0.0; 12]);
    }

    #[test]
    fn trimming_frees_only_buffers_over_the_limit() {
        let mut w = Workspace { x: vec![0.0; 1000], logits: vec![0.0; KEEP_AT_MOST / 4 + 1], ..Default::default() };
        w.trim();
        assert_eq!(w.x.capacity(), 1000);
        assert_eq!(w.logits.capacity(), 0);
    }
}
