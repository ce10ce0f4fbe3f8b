//! SentencePiece-style tokenization (GGUF `tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm_session`: a bigram merge driven by token scores over one symbol per UTF-8
//! character, with `<0xXX>` byte fallback for what no token covers.
//!
//! The caller (tokenizer.rs) partitions special tokens out first and passes each plain fragment
//! here; [`Spm::fragment`] applies llama.cpp's normalisation (the optional leading space, then
//! every `' '` escaped to `▁`) and merges.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::TextError;

/// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible space.
pub(crate) const SPACE: char = '\u{2581}';

/// The vocabulary as the SPM merge loop sees it.
#[derive(Debug, Clone)]
pub(crate) struct Spm {
    /// Every token's text (all types, as llama.cpp's `token_to_id`: later duplicates win).
    vocab: HashMap<String, u32>,
    /// The score of each token, indexed by id: higher merges first.
    scores: Vec<f32>,
    /// The byte-fallback token `<0xXX>` of each byte. (llama.cpp's `byte_to_token` would also try
    /// the byte itself as a one-character token, but only bytes of multi-byte characters ever
    /// fall back, and those are not strings on their own.)
    byte_token: [Option<u32>; 256],
    /// Longest token text in bytes: a longer pair can never be a token, so it is not looked up.
    max_len: usize,
    /// `tokenizer.ggml.add_space_prefix`: a space before a fragment at the start of the text or
    /// right after a special token.
    pub(crate) add_space_prefix: bool,
}

impl Spm {
    /// `vocab` maps every token text to its id; `scores[id]` is the score of token `id` (every id
    /// in `vocab` must be below `scores.len()`).
    pub(crate) fn new(vocab: HashMap<String, u32>, scores: Vec<f32>, add_space_prefix: bool) -> Spm {
        debug_assert!(vocab.values().all(|&id| (id as usize) < scores.len()));
        let max_len = vocab.keys().map(String::len).max().unwrap_or(0);
        let byte_token = std::array::from_fn(|b| vocab.get(format!("<0x{b:02X}>").as_str()).copied());
        Spm { vocab, scores, byte_token, max_len, add_space_prefix }
    }

    /// Tokens of one plain fragment (never empty); `after_special` when the fragment starts the
    /// text or follows a special token, where llama.cpp adds the space prefix.
    pub(crate) fn fragment(&self, text: &str, after_special: bool, out: &mut Vec<u32>) -> Result<(), TextError> {
        let mut escaped = String::with_capacity(text.len() + text.len() / 2 + 3);
        if self.add_space_prefix && after_special {
            escaped.push(SPACE);
        }
        for c in text.chars() {
            escaped.push(if c == ' ' { SPACE } else { c });
        }
        self.tokenize(&escaped, out)
    }

    /// `llm_tokenizer_spm_session::tokenize` on already escaped text.
    pub(crate) fn tokenize(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TextError> {
        if text.is_empty() {
            return Ok(());
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = syms.len();
            syms.push(Sym { start, len: c.len_utf8(), prev: i.wrapping_sub(1), next: i + 1 });
        }
        let n = syms.len();
        let mut queue = BinaryHeap::with_capacity(n);
        for i in 1..n {
            self.push_bigram(text, &syms, &mut queue, i - 1, i);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            // Outdated: one side was merged away or grew since this pair was queued (sizes only
            // grow, so an unchanged total means both are as they were).
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            syms[b.left].len += r.len;
            syms[b.left].next = r.next;
            syms[b.right].len = 0;
            if r.next < n {
                syms[r.next].prev = b.left;
            }
            if l.prev < n {
                self.push_bigram(text, &syms, &mut queue, l.prev, b.left);
            }
            if r.next < n {
                self.push_bigram(text, &syms, &mut queue, b.left, r.next);
            }
        }
        // llama.cpp's `resegment`: every merged symbol is a token by construction, so only a single
        // character without a token reaches the byte fallback (its `rev_merge` lookup never hits).
        let mut i = 0;
        while i < n {
            let s = syms[i];
            let piece = &text[s.start..s.start + s.len];
            match self.vocab.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        let id = self.byte_token[usize::from(b)].ok_or_else(|| {
                            TextError::Encode(format!("no token for {piece:?} and no byte-fallback token <0x{b:02X}>"))
                        })?;
                        out.push(id);
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }

    fn push_bigram(&self, text: &str, syms: &[Sym], queue: &mut BinaryHeap<Bigram>, left: usize, right: usize) {
        let size = syms[left].len + syms[right].len;
        if size > self.max_len {
            return;
        }
        let start = syms[left].start;
        let Some(&id) = self.vocab.get(&text[start..start + size]) else {
            return;
        };
        queue.push(Bigram { score: self.scores[id as usize], left, right, size });
    }
}

#[derive(Debug, Clone, Copy)]
struct Sym {
    /// Byte range in the escaped text; `len == 0` once merged into its left neighbour.
    start: usize,
    len: usize,
    /// Neighbours in the chain; out of range (`usize::MAX` or `n`) at the ends.
    prev: usize,
    next: usize,
}

/// A candidate merge: the highest score pops first, then the leftmost (llama.cpp's comparator).
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the merged text, to detect an outdated entry.
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab_of(texts: &[String]) -> HashMap<String, u32> {
        texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect()
    }

    /// A tiny vocabulary: `(text, score)` pairs, ids in order, plus `<0x00>`..`<0xFF>` after them.
    fn spm(pieces: &[(&str, f32)], add_space_prefix: bool) -> (Spm, Vec<String>) {
        let mut texts: Vec<String> = pieces.iter().map(|(t, _)| t.to_string()).collect();
        let mut scores: Vec<f32> = pieces.iter().map(|&(_, s)| s).collect();
        for b in 0..=255u8 {
            texts.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
        }
        (Spm::new(vocab_of(&texts), scores, add_space_prefix), texts)
    }

    fn encode(s: &Spm, texts: &[String], text: &str, after_special: bool) -> Vec<String> {
        let mut out = Vec::new();
        s.fragment(text, after_special, &mut out).expect("encodes");
        out.into_iter().map(|id| texts[id as usize].clone()).collect()
    }

    #[test]
    fn higher_score_merges_first() {
        // "abc": "ab" and "bc" compete for the b; the better score wins, whatever the position.
        let base = [("a", -10.0), ("b", -10.0), ("c", -10.0)];
        let (s, t) = spm(&[&base[..], &[("ab", -2.0), ("bc", -1.0)]].concat(), false);
        assert_eq!(encode(&s, &t, "abc", false), ["a", "bc"]);
        let (s, t) = spm(&[&base[..], &[("ab", -1.0), ("bc", -2.0)]].concat(), false);
        assert_eq!(encode(&s, &t, "abc", false), ["ab", "c"]);
    }

    #[test]
    fn merge_order_decides_the_result_not_the_final_score() {
        // "abcd": "bc" (best) merges first and takes the b and the c from the better-scored "ab"
        // and "cd", which never get their chance.
        let (s, t) = spm(
            &[
                ("a", -10.0),
                ("b", -10.0),
                ("c", -10.0),
                ("d", -10.0),
                ("ab", -2.0),
                ("cd", -2.0),
                ("bc", -1.0),
                ("bcd", -5.0),
            ],
            false,
        );
        assert_eq!(encode(&s, &t, "abcd", false), ["a", "bcd"]);
    }

    #[test]
    fn equal_scores_merge_leftmost_first() {
        let (s, t) = spm(&[("a", -10.0), ("aa", -1.0)], false);
        assert_eq!(encode(&s, &t, "aaa", false), ["aa", "a"]);
        // A tie between different pairs: the left one wins.
        let (s, t) = spm(&[("x", -10.0), ("y", -10.0), ("xy", -3.0), ("yx", -3.0)], false);
        assert_eq!(encode(&s, &t, "xyx", false), ["xy", "x"]);
        assert_eq!(encode(&s, &t, "yxy", false), ["yx", "y"]);
    }

    #[test]
    fn characters_without_a_token_fall_back_to_bytes() {
        let (s, t) = spm(&[("a", -1.0), ("▁", -1.0)], false);
        // é is C3 A9; it stays one symbol during merging and splits into bytes only at the end.
        assert_eq!(encode(&s, &t, "aé a", false), ["a", "<0xC3>", "<0xA9>", "▁", "a"]);
        // A vocabulary without a <0xXX> token for a needed byte is an error, not a panic.
        let no_bytes = Spm::new(vocab_of(&["a".to_string()]), vec![0.0], false);
        assert!(matches!(no_bytes.fragment("b", false, &mut Vec::new()), Err(TextError::Encode(_))));
    }

    #[test]
    fn spaces_are_escaped_and_prefixed_only_when_asked() {
        let (s, t) = spm(&[("▁", -5.0), ("h", -5.0), ("i", -5.0), ("▁hi", -1.0), ("hi", -2.0)], true);
        assert_eq!(encode(&s, &t, "hi hi", true), ["▁hi", "▁hi"]);
        assert_eq!(encode(&s, &t, "hi hi", false), ["hi", "▁hi"]);
        let (s, t) = spm(&[("▁", -5.0), ("h", -5.0), ("i", -5.0), ("▁hi", -1.0), ("hi", -2.0)], false);
        assert_eq!(encode(&s, &t, "hi", true), ["hi"]);
    }

    #[test]
    fn long_input_is_not_quadratic() {
        let (s, _) = spm(&[("a", -1.0), ("aa", -0.5), ("aaaa", -0.25)], false);
        let mut out = Vec::new();
        s.fragment(&"a".repeat(200_000), false, &mut out).expect("encodes");
        assert_eq!(out.len(), 50_000);
        assert!(out.iter().all(|&id| id == 2));
    }
}
