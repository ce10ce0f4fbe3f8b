//! The pre-tokenizer splits of llama.cpp: plain text into the words that BPE merges within.
//!
//! Hand-written rather than run as a regex, as llama.cpp also hand-writes its GPT-2 splitter: the
//! pattern's `\s+(?!\S)` needs a look-ahead, which only a backtracking engine (fancy-regex) runs,
//! and that engine dominated tokenization time. The GPT-2 pattern (llama.cpp's, with the trailing
//! `\s+` its custom matcher implements), matched repeatedly from the end of the previous match:
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! Every branch of [`gpt2_match`] is one alternative, tried in the same leftmost-first order, so
//! the words are the regex's, byte for byte: tests/data/pretokenize_golden.json holds splits
//! recorded from the regex implementation (the `tokenizers` crate's) that this one replaced.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// A `tokenizer.ggml.pre` this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// "gpt2" and "default": the GPT-2 pattern alone.
    Gpt2,
    /// "smollm": every `\p{N}` character a word of its own, then the GPT-2 pattern within each
    /// stretch between them (whose end is an end of text for the look-ahead).
    SmolLm,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp selects for a `tokenizer.ggml.pre` value.
    pub(crate) fn from_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "gpt2" | "default" => Some(PreTokenizer::Gpt2),
            "smollm" => Some(PreTokenizer::SmolLm),
            _ => None,
        }
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
                PreTokenizer::Gpt2 => (self.piece, self.rest) = (self.rest, ""),
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
        let (word, piece) = self.piece.split_at(gpt2_match(self.piece));
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

    proptest! {
        #[test]
        fn words_tile_the_text(s in any::<String>()) {
            for pre in [PreTokenizer::Gpt2, PreTokenizer::SmolLm] {
                let w = words(pre, &s);
                prop_assert!(w.iter().all(|w| !w.is_empty()));
                prop_assert_eq!(w.concat(), s.as_str());
            }
        }
    }
}
