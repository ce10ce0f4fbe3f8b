//! The pre-tokenizer splits of llama.cpp: plain text into the words that BPE merges within.
//!
//! Hand-written rather than run as a regex, as llama.cpp also hand-writes its splitters: the
//! patterns' `\s+(?!\S)` needs a look-ahead, which only a backtracking engine (fancy-regex) runs,
//! and that engine dominated tokenization time. Each splitter tries its pattern's alternatives in
//! the same leftmost-first order, one branch each, matched repeatedly from the end of the
//! previous match. The `tokenizer.ggml.pre` values implemented, and how each is verified:
//!
//! | `tokenizer.ggml.pre` | pattern | verified against |
//! | --- | --- | --- |
//! | `gpt-2` | GPT-2 ([`gpt2_match`]) | regex splits (golden file); llama.cpp's `ggml-vocab-gpt-2` test |
//! | `gpt2`, `default` (and no key) | GPT-2 | this crate's reading, kept from before: llama.cpp knows no `gpt2`, and its `default` adds three more splits |
//! | `smollm`, `starcoder` | every `\p{N}` alone, then GPT-2 | the same golden file; the real SmolLM2 model; llama.cpp's `ggml-vocab-starcoder` test (llama.cpp runs both names through the same regexes) |
//! | `llama-bpe`, `llama3`, `llama-v3` | Llama 3 (llama3.rs) | llama.cpp's `ggml-vocab-llama-bpe` test |
//! | `qwen2`, `deepseek-r1-qwen` | Qwen2 (llama3.rs) | llama.cpp's `ggml-vocab-qwen2` test |
//! | `qwen35` | Qwen 3.5 (llama3.rs) | llama.cpp's `ggml-vocab-qwen35` test |
//!
//! The llama.cpp tests (tests/llama_cpp_vocabs.rs) run every input of llama.cpp's own
//! `ggml-vocab-*.gguf.inp` files, fetched from the pinned llama-cpp-python sdist, and require
//! exactly the ids of the matching `.gguf.out`. The names on one row are those llama.cpp sends
//! down the same code with the same settings; other names llama.cpp knows (`tekken`, `falcon3`,
//! `deepseek-v3`, ...) are refused with [`crate::TextError::UnsupportedPre`] until a test proves
//! them. SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Phi-3, Gemma)
//! have no pre-tokenizer at all: llama.cpp ignores the key for them, and so does this crate.
//!
//! The GPT-2 pattern (llama.cpp's, with the trailing `\s+` its custom matcher implements):
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! Every branch of [`gpt2_match`] is one alternative, so the words are the regex's, byte for
//! byte: tests/data/pretokenize_golden.json holds splits recorded from the regex implementation
//! (the `tokenizers` crate's) that this one replaced. Llama 3 and Qwen are in llama3.rs, with
//! llama.cpp's own character table (table.rs).

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

use llama3::Style;

mod llama3;
mod table;

/// A `tokenizer.ggml.pre` this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// "gpt2" and "default": the GPT-2 pattern alone.
    Gpt2,
    /// "smollm": every `\p{N}` character a word of its own, then the GPT-2 pattern within each
    /// stretch between them (whose end is an end of text for the look-ahead).
    SmolLm,
    /// Llama 3 (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3`), Qwen2 and Qwen 3.5: llama3.rs.
    Llama3(Style),
}

/// Every `tokenizer.ggml.pre` value accepted, and what it selects (see the module doc for how
/// each is verified). The error for any other value lists these.
pub(crate) const NAMES: &[(&str, PreTokenizer)] = &[
    ("default", PreTokenizer::Gpt2),
    ("gpt2", PreTokenizer::Gpt2),
    ("gpt-2", PreTokenizer::Gpt2),
    ("smollm", PreTokenizer::SmolLm),
    ("starcoder", PreTokenizer::SmolLm),
    ("llama-bpe", PreTokenizer::Llama3(Style::LLAMA3)),
    ("llama3", PreTokenizer::Llama3(Style::LLAMA3)),
    ("llama-v3", PreTokenizer::Llama3(Style::LLAMA3)),
    ("qwen2", PreTokenizer::Llama3(Style::QWEN2)),
    ("deepseek-r1-qwen", PreTokenizer::Llama3(Style::QWEN2)),
    ("qwen35", PreTokenizer::Llama3(Style::QWEN35)),
];

/// The accepted names, quoted and comma-separated, for the error message.
pub(crate) fn supported_names() -> String {
    NAMES.iter().map(|(n, _)| format!("{n:?}")).collect::<Vec<_>>().join(", ")
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp selects for a `tokenizer.ggml.pre` value.
    pub(crate) fn from_name(name: &str) -> Option<PreTokenizer> {
        NAMES.iter().find(|&&(n, _)| n == name).map(|&(_, pre)| pre)
    }

    /// llama.cpp's `ignore_merges` for this pre-tokenizer: a word that is a token as a whole
    /// becomes that token without merging (Llama 3's vocabulary has tokens its merges never
    /// build).
    pub(crate) fn ignores_merges(self) -> bool {
        self == PreTokenizer::Llama3(Style::LLAMA3)
    }

    /// Whether prompts start with BOS when `tokenizer.ggml.add_bos_token` is missing: llama.cpp
    /// turns it on for Llama 3 (BPE vocabularies are otherwise without).
    pub(crate) fn adds_bos_by_default(self) -> bool {
        self == PreTokenizer::Llama3(Style::LLAMA3)
    }

    /// The words of `text`, in order; they concatenate back to `text`.
    pub(crate) fn split(self, text: &str) -> Words<'_> {
        Words { pre: self, piece: "", rest: text }
    }
}

/// Iterator over the words of one text (see [`PreTokenizer::split`]).
pub(crate) struct Words<'t> {
    pre: PreTokenizer,
    /// What remains of the stretch the GPT-2 pattern is matched in.
    piece: &'t str,
    /// The text after `piece`.
    rest: &'t str,
}

impl<'t> Iterator for Words<'t> {
    type Item = &'t str;

    fn next(&mut self) -> Option<&'t str> {
        if self.piece.is_empty() {
            let c = self.rest.chars().next()?;
            match self.pre {
                PreTokenizer::Gpt2 | PreTokenizer::Llama3(_) => (self.piece, self.rest) = (self.rest, ""),
                // `char::is_numeric`, not the \p{N} table below: the digit split of the
                // implementation this replaces (tokenizers' `Digits`) used the standard library's.
                PreTokenizer::SmolLm if c.is_numeric() => {
                    let (digit, rest) = self.rest.split_at(c.len_utf8());
                    self.rest = rest;
                    return Some(digit);
                }
                PreTokenizer::SmolLm => {
                    let end = self.rest.find(char::is_numeric).unwrap_or(self.rest.len());
                    (self.piece, self.rest) = self.rest.split_at(end);
                }
            }
        }
        let len = match self.pre {
            PreTokenizer::Llama3(style) => llama3::word_len(self.piece, style),
            PreTokenizer::Gpt2 | PreTokenizer::SmolLm => gpt2_match(self.piece),
        };
        let (word, piece) = self.piece.split_at(len);
        self.piece = piece;
        Some(word)
    }
}

/// The classes the pattern distinguishes: `\p{L}`, `\p{N}`, `\s`, and everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

/// `\p{L}` is the General_Category Letter (not `char::is_alphabetic`, which adds marks and more)
/// and `\s` is White_Space (`char::is_whitespace`). The table is Unicode 16.0, regex-syntax's
/// version, which the regex implementation ran on: a test pins it, as a newer table moves ids.
fn class(c: char) -> Class {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' => Class::Letter,
            '0'..='9' => Class::Number,
            '\t' | '\n' | '\x0B' | '\x0C' | '\r' | ' ' => Class::Space,
            _ => Class::Other,
        };
    }
    if c.is_whitespace() {
        return Class::Space;
    }
    match get_general_category(c) {
        Gc::UppercaseLetter | Gc::LowercaseLetter | Gc::TitlecaseLetter | Gc::ModifierLetter | Gc::OtherLetter => {
            Class::Letter
        }
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => Class::Number,
        _ => Class::Other,
    }
}

/// Byte length of the longest prefix of `s` whose characters are all of class `k`.
fn run(s: &str, k: Class) -> usize {
    s.char_indices().find(|&(_, c)| class(c) != k).map_or(s.len(), |(i, _)| i)
}

/// Byte length of the pattern's match at the start of non-empty `s` (0 for empty `s`). Every
/// character starts a match of some alternative, so matches tile the text without gaps.
fn gpt2_match(s: &str) -> usize {
    let mut chars = s.chars();
    let Some(c) = chars.next() else { return 0 };
    if c == '\'' {
        let after = &s.as_bytes()[1..];
        // No form is a prefix of another, so their order cannot matter.
        for form in [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"] {
            if after.starts_with(form) {
                return 1 + form.len();
            }
        }
    }
    let k = class(c);
    if k != Class::Space {
        return c.len_utf8() + run(&s[c.len_utf8()..], k);
    }
    // ` ?`: only U+0020, and only before a character that starts a letter, number or other run.
    if c == ' ' {
        if let Some(next) = chars.next() {
            let k = class(next);
            if k != Class::Space {
                let at = 1 + next.len_utf8();
                return at + run(&s[at..], k);
            }
        }
    }
    let end = run(s, Class::Space);
    if end == s.len() {
        return end; // `\s+(?!\S)` at the end of the text
    }
    // `\s+(?!\S)` backtracks one character, leaving the last blank to lead the next word; a
    // single blank before a non-blank falls through to `\s+`.
    match s[..end].char_indices().next_back() {
        Some((last, _)) if last > 0 => last,
        _ => end,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn words(pre: PreTokenizer, s: &str) -> Vec<&str> {
        pre.split(s).collect()
    }

    #[test]
    fn general_category_table_is_regex_syntax_version() {
        // A newer table moves characters between classes, and with them token ids.
        assert_eq!(unicode_general_category::UNICODE_VERSION, (16, 0, 0));
    }

    #[test]
    fn gpt2_examples() {
        let g = PreTokenizer::Gpt2;
        assert_eq!(words(g, "Hello world's  x"), ["Hello", " world", "'s", " ", " x"]);
        assert_eq!(words(g, "a  \tb 12!? \n"), ["a", "  ", "\t", "b", " 12", "!?", " \n"]);
        assert_eq!(words(g, "'S 're'll"), ["'", "S", " '", "re", "'ll"]);
        assert_eq!(words(g, "e\u{301}"), ["e", "\u{301}"]);
        assert!(words(g, "").is_empty());
    }

    #[test]
    fn smollm_isolates_digits() {
        let s = PreTokenizer::SmolLm;
        assert_eq!(words(s, "ab 123x  4"), ["ab", " ", "1", "2", "3", "x", "  ", "4"]);
        assert_eq!(words(s, "Ⅻ²½"), ["Ⅻ", "²", "½"]);
    }

    #[test]
    fn matches_the_splits_recorded_from_the_regex_implementation() {
        let golden: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/pretokenize_golden.json")).unwrap();
        let cases = golden.as_array().unwrap();
        assert!(cases.len() > 400);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            for (pre, key) in [(PreTokenizer::Gpt2, "gpt2"), (PreTokenizer::SmolLm, "smollm")] {
                let want: Vec<&str> = case[key].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
                assert_eq!(words(pre, text), want, "{key}: {text:?}");
            }
        }
    }

    #[test]
    fn every_name_resolves_and_the_refusal_lists_them_all() {
        let msg = crate::TextError::UnsupportedPre("tekken".into()).to_string();
        for &(name, pre) in NAMES {
            assert_eq!(PreTokenizer::from_name(name), Some(pre));
            assert!(msg.contains(&format!("{name:?}")), "{msg}");
        }
        // Known to llama.cpp, not proven here.
        for name in ["tekken", "falcon3", "deepseek-v3", "stablelm2", "command-r", ""] {
            assert_eq!(PreTokenizer::from_name(name), None, "{name}");
        }
    }

    #[test]
    fn llama3_words_come_from_its_own_matcher() {
        let l = PreTokenizer::Llama3(Style::LLAMA3);
        assert_eq!(words(l, "Hello world's 12345\n\n"), ["Hello", " world", "'s", " ", "123", "45", "\n\n"]);
        assert_eq!(words(PreTokenizer::Llama3(Style::QWEN2), "x 12"), ["x", " ", "1", "2"]);
        assert!(l.ignores_merges() && l.adds_bos_by_default());
        assert!(!PreTokenizer::Llama3(Style::QWEN2).ignores_merges());
    }

    proptest! {
        #[test]
        fn words_tile_the_text(s in any::<String>()) {
            for &(_, pre) in NAMES {
                let w = words(pre, &s);
                prop_assert!(w.iter().all(|w| !w.is_empty()));
                prop_assert_eq!(w.concat(), s.as_str());
            }
        }
    }
}
