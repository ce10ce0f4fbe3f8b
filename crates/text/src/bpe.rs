//! The BPE merge loop of llama.cpp's `llm_tokenizer_bpe_session`, over token ids.
//!
//! Our own rather than `tokenizers`' BPE because that one silently skips a character with no
//! token and then merges its neighbours across the gap; llama.cpp keeps it as a symbol that never
//! merges and drops it only from the output.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge rules of one vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct Bpe {
    /// The token of each single byte (its GPT-2 byte-level character), if the vocabulary has one.
    pub(crate) byte_token: [Option<u32>; 256],
    /// (left, right) -> (rank, merged token); first occurrence of a pair wins, as in llama.cpp.
    pub(crate) merges: HashMap<(u32, u32), (u32, u32)>,
    /// llama.cpp's `ignore_merges` (Llama 3): the token of each byte string that is a token's
    /// text, byte-level decoded; a word found here is that token, whatever the merges would make.
    pub(crate) whole_words: Option<HashMap<Box<[u8]>, u32>>,
}

impl Bpe {
    /// BPE over one word, as llama.cpp: one symbol per byte (its byte-level character), then
    /// repeatedly merge the adjacent pair of lowest rank, leftmost first. A byte without a token
    /// stays a symbol that never merges and is dropped from the output.
    pub(crate) fn word(&self, word: &[u8], s: &mut Scratch, out: &mut Vec<u32>) {
        if let Some(&id) = self.whole_words.as_ref().and_then(|w| w.get(word)) {
            out.push(id);
            return;
        }
        if let [b] = word {
            out.extend(self.byte_token[usize::from(*b)]);
            return;
        }
        s.syms.clear();
        s.queue.clear();
        let n = word.len();
        for (i, &b) in word.iter().enumerate() {
            s.syms.push(Sym { id: self.byte_token[usize::from(b)], prev: i.wrapping_sub(1), next: i + 1 });
        }
        for i in 1..n {
            self.push_bigram(s, i - 1, i);
        }
        while let Some(Reverse((_, left, right, lid, rid, merged))) = s.queue.pop() {
            let (l, r) = (s.syms[left], s.syms[right]);
            // Outdated: one side was merged away or grew since this pair was queued.
            if l.id != Some(lid) || r.id != Some(rid) || l.next != right {
                continue;
            }
            s.syms[left].id = Some(merged);
            s.syms[left].next = r.next;
            s.syms[right].id = None;
            s.syms[right].next = usize::MAX; // dead
            if r.next < n {
                s.syms[r.next].prev = left;
            }
            if l.prev < n {
                self.push_bigram(s, l.prev, left);
            }
            if r.next < n {
                self.push_bigram(s, left, r.next);
            }
        }
        let mut i = 0;
        while i < n {
            out.extend(s.syms[i].id);
            i = s.syms[i].next;
        }
    }

    fn push_bigram(&self, s: &mut Scratch, left: usize, right: usize) {
        let (Some(l), Some(r)) = (s.syms[left].id, s.syms[right].id) else {
            return;
        };
        if let Some(&(rank, merged)) = self.merges.get(&(l, r)) {
            s.queue.push(Reverse((rank, left, right, l, r, merged)));
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sym {
    id: Option<u32>,
    prev: usize,
    next: usize,
}

/// (rank, left, right, left id, right id, merged id): a min-heap by rank, then leftmost.
type Bigram = Reverse<(u32, usize, usize, u32, u32, u32)>;

#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    queue: BinaryHeap<Bigram>,
}
