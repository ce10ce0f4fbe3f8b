//! The Llama 3 pattern and its Qwen variants, as llama.cpp runs them.
//!
//! llama.cpp does not run these patterns through a regex engine either: `unicode.cpp` has a
//! hand-written matcher for each (`unicode_regex_split_custom_llama3`, `_qwen2`, `_qwen35`), and
//! those matchers, not the regexes, define the ids llama.cpp produces. [`word_len`] follows them
//! branch for branch, in the same order:
//!
//! ```text
//! llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! qwen2:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! qwen35: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! Characters are classified by llama.cpp's own table (table.rs, generated from its
//! `unicode-data.cpp`): its Unicode version is not the one of the crates the GPT-2 path uses,
//! and a character that is a letter to one and unassigned to the other moves a word boundary.

use super::table::CLASS_RANGES;

/// What distinguishes the three patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Style {
    /// Longest digit group: `\p{N}{1,3}` (3) or `\p{N}` (1).
    digits: usize,
    /// Combining marks (`\p{M}`) belong to letter runs, not to symbol runs.
    marks_in_words: bool,
}

impl Style {
    pub(crate) const LLAMA3: Style = Style { digits: 3, marks_in_words: false };
    pub(crate) const QWEN2: Style = Style { digits: 1, marks_in_words: false };
    pub(crate) const QWEN35: Style = Style { digits: 1, marks_in_words: true };

    fn in_word(self, k: Class) -> bool {
        k == Class::Letter || (self.marks_in_words && k == Class::Mark)
    }

    /// `[^\s\p{L}\p{N}]` (and not `\p{M}` when marks belong to words).
    fn in_symbols(self, k: Class) -> bool {
        k == Class::Other || (!self.marks_in_words && k == Class::Mark)
    }
}

/// llama.cpp's `unicode_cpt_flags`, reduced to what the patterns ask. The classes partition the
/// code points: no White_Space character is a letter, number or mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Mark,
    Space,
    Other,
}

/// `\s` is llama.cpp's whitespace set, which is Unicode's White_Space (`char::is_whitespace`);
/// the rest comes from its category table. Both are checked against llama.cpp's data for every
/// code point (`classes_are_llama_cpps` below).
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
    // The last entry starting at or before `c` (entry 0 starts at 0, so there is one).
    let key = u32::from(c) << 2 | 3;
    let at = CLASS_RANGES.partition_point(|&e| e <= key).saturating_sub(1);
    match CLASS_RANGES.get(at).map(|e| e & 3) {
        Some(1) => Class::Letter,
        Some(2) => Class::Number,
        Some(3) => Class::Mark,
        _ => Class::Other,
    }
}

/// Byte length of the longest prefix of `s` whose characters all satisfy `keep`.
fn run(s: &str, keep: impl Fn(Class) -> bool) -> usize {
    s.char_indices().find(|&(_, c)| !keep(class(c))).map_or(s.len(), |(i, _)| i)
}

/// Byte length of the word at the start of `s` (0 for empty `s`). Every character starts a word,
/// so words tile the text.
pub(crate) fn word_len(s: &str, style: Style) -> usize {
    let mut chars = s.chars();
    let Some(c) = chars.next() else { return 0 };
    let next = chars.clone().next();

    // (?i:'s|'t|'re|'ve|'m|'ll|'d): llama.cpp lowercases with its table, in which only ASCII
    // letters lower to these, so ASCII folding is the same; every matched character is one byte.
    if c == '\'' {
        if let Some(n1) = next.map(|n| n.to_ascii_lowercase()) {
            if matches!(n1, 's' | 't' | 'm' | 'd') {
                return 2;
            }
            let n2 = chars.nth(1).map(|n| n.to_ascii_lowercase());
            if matches!((n1, n2), ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l'))) {
                return 3;
            }
        }
    }

    // [^\r\n\p{L}\p{N}]?\p{L}+ : the optional lead is any one character but CR, LF or a number
    // (a space, a symbol, a mark), taken only when a letter follows it.
    let k = class(c);
    if c != '\r'
        && c != '\n'
        && k != Class::Number
        && (style.in_word(k) || next.is_some_and(|n| style.in_word(class(n))))
    {
        let at = c.len_utf8();
        return at + run(&s[at..], |k| style.in_word(k));
    }

    // \p{N}{1,3} (or \p{N}): a longer run is cut into groups from the left, "12345" as "123", "45".
    if k == Class::Number {
        let mut end = c.len_utf8();
        for d in s[end..].chars().take(style.digits - 1) {
            if class(d) != Class::Number {
                break;
            }
            end += d.len_utf8();
        }
        return end;
    }

    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`. A space at the very end also lands here, as in llama.cpp
    // (which tests the class of the position past the end, no class at all), and is a word of
    // its own, as `\s+` would make it.
    let lead = if c == ' ' { next.map(class) } else { Some(k) };
    if lead.is_none_or(|k| style.in_symbols(k)) {
        let mut end = usize::from(c == ' ');
        end += run(&s[end..], |k| style.in_symbols(k));
        end += s[end..].bytes().take_while(|&b| b == b'\r' || b == b'\n').count();
        return end;
    }

    // \s*[\r\n]+ : the blank run up to and including its last CR or LF.
    // \s+(?!\S)  : a blank run before a non-blank leaves its last blank to lead the next word.
    // \s+        : otherwise the whole run (at the end of the text, or a single blank).
    let mut end = 0;
    let mut last = 0;
    let mut after_newline = None;
    for (i, b) in s.char_indices() {
        if class(b) != Class::Space {
            break;
        }
        if b == '\r' || b == '\n' {
            after_newline = Some(i + 1);
        }
        last = i;
        end = i + b.len_utf8();
    }
    if let Some(e) = after_newline {
        return e;
    }
    if last > 0 && end < s.len() {
        return last;
    }
    if end > 0 {
        return end;
    }
    // Unreachable with the classes above (every character starts some branch); llama.cpp's
    // matchers end the same way, with a word of one character.
    c.len_utf8()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn words(s: &str, style: Style) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            let (w, r) = rest.split_at(word_len(rest, style));
            out.push(w);
            rest = r;
        }
        out
    }

    const ALL: [Style; 3] = [Style::LLAMA3, Style::QWEN2, Style::QWEN35];

    #[test]
    fn contractions_are_case_insensitive_and_only_ascii() {
        for style in ALL {
            assert_eq!(
                words("I'M HERE'S we'Ll 'RE'vE'd", style),
                ["I", "'M", " HERE", "'S", " we", "'Ll", " '", "RE", "'vE", "'d"]
            );
            // Not a contraction: the apostrophe leads the letters as any symbol would.
            assert_eq!(words("'x 'ſ", style), ["'x", " '", "ſ"]);
            // The two-letter forms need both letters; "'l" alone is a lead plus a letter run.
            assert_eq!(words("'l", style), ["'l"]);
            assert_eq!(words("'", style), ["'"]);
        }
    }

    #[test]
    fn digit_groups_are_of_one_to_three_for_llama3_and_single_for_qwen() {
        let l = Style::LLAMA3;
        assert_eq!(words("1", l), ["1"]);
        assert_eq!(words("12345678", l), ["123", "456", "78"]);
        assert_eq!(words("x 1234", l), ["x", " ", "123", "4"]);
        // \p{N}, not only ASCII digits: Arabic-Indic digits and vulgar fractions group too.
        assert_eq!(words("٣٣٣٣½", l), ["٣٣٣", "٣½"]);
        assert_eq!(words("a123b", l), ["a", "123", "b"]);
        for q in [Style::QWEN2, Style::QWEN35] {
            assert_eq!(words("2024½", q), ["2", "0", "2", "4", "½"]);
        }
    }

    #[test]
    fn a_blank_run_before_a_word_leaves_its_last_blank_to_the_word() {
        for style in ALL {
            assert_eq!(words("a   b", style), ["a", "  ", " b"]);
            assert_eq!(words("a \tb", style), ["a", " ", "\tb"]);
            // A single blank before a number is a word of its own: the number takes no lead.
            assert_eq!(words("a 1", style), ["a", " ", "1"]);
            assert_eq!(words("a  1", style), ["a", " ", " ", "1"]);
            // At the end of the text the whole run is one word.
            assert_eq!(words("a   ", style), ["a", "   "]);
            assert_eq!(words(" ", style), [" "]);
            assert_eq!(words("a ", style), ["a", " "]);
            // Non-ASCII White_Space counts as blank (U+3000, U+00A0).
            assert_eq!(words("a\u{3000}\u{3000}b", style), ["a", "\u{3000}", "\u{3000}b"]);
            assert_eq!(words("\u{a0}x", style), ["\u{a0}x"]);
        }
    }

    #[test]
    fn newlines_end_blank_runs_and_follow_symbols() {
        for style in ALL {
            assert_eq!(words("a\n\nb", style), ["a", "\n\n", "b"]);
            // \s*[\r\n]+ takes the blanks before and between newlines, up to the last one.
            assert_eq!(words("a \n \r\n  b", style), ["a", " \n \r\n", " ", " b"]);
            assert_eq!(words("a\n  ", style), ["a", "\n", "  "]);
            // Newlines after a symbol run join it; blanks in between do not.
            assert_eq!(words("x.\n\ny", style), ["x", ".\n\n", "y"]);
            assert_eq!(words("x. \ny", style), ["x", ".", " \n", "y"]);
            // CR and LF never lead a letter run.
            assert_eq!(words("\nabc", style), ["\n", "abc"]);
            assert_eq!(words("\r\nabc", style), ["\r\n", "abc"]);
            // A tab does.
            assert_eq!(words("\tabc", style), ["\tabc"]);
        }
    }

    #[test]
    fn symbol_runs_take_one_leading_space_and_a_symbol_before_letters_leads_them() {
        for style in ALL {
            assert_eq!(words("a ({[b", style), ["a", " ({[", "b"]);
            assert_eq!(words("$$$", style), ["$$$"]);
            assert_eq!(words("!!!x", style), ["!!!", "x"]);
            assert_eq!(words("a.b", style), ["a", ".b"]);
            assert_eq!(words("  !!", style), [" ", " !!"]);
        }
    }

    #[test]
    fn cjk_emoji_and_combining_marks() {
        for style in ALL {
            // Han and kana are letters; full-width punctuation is a symbol.
            assert_eq!(words("我想在apple工作", style), ["我想在apple工作"]);
            assert_eq!(words("天～x", style), ["天", "～x"]);
            // Emoji are symbols; ZWJ and the variation selector are a format character and a
            // mark, which join the symbol run unless marks belong to words.
            assert_eq!(words(" 🚀🦙", style), [" 🚀🦙"]);
        }
        let zwj = "😶\u{200d}🌫\u{fe0f}";
        assert_eq!(words(zwj, Style::LLAMA3), [zwj]);
        assert_eq!(words(zwj, Style::QWEN35), ["😶\u{200d}🌫", "\u{fe0f}"]);
        // A combining acute accent after a letter: outside \p{L}, so it ends the word, except
        // for Qwen 3.5 whose words take marks.
        let e = "re\u{301}sume\u{301}";
        assert_eq!(words(e, Style::LLAMA3), ["re", "\u{301}sume", "\u{301}"]);
        assert_eq!(words(e, Style::QWEN2), ["re", "\u{301}sume", "\u{301}"]);
        assert_eq!(words(e, Style::QWEN35), [e]);
        // Khmer vowel signs are marks too.
        assert_eq!(words("កាន់", Style::QWEN35), ["កាន់"]);
        assert_eq!(words("កាន់", Style::LLAMA3), ["ក", "ាន", "់"]);
    }

    #[test]
    fn classes_follow_llama_cpps_unicode_version_not_the_latest() {
        // U+1C89 CYRILLIC CAPITAL LETTER TJE is new in Unicode 16: llama.cpp's table has it
        // unassigned, so it is no letter here.
        assert_eq!(class('\u{1C89}'), Class::Other);
        assert_eq!(class('\u{2EBF0}'), Class::Letter); // CJK Extension I, Unicode 15.1
        assert_eq!(class('\u{10FFFF}'), Class::Other);
        assert_eq!(class('\u{85}'), Class::Space);
    }

    /// llama.cpp's unicode-data.cpp from the pinned sdist: `(first code point, flags)` ranges and
    /// the whitespace set.
    fn llama_cpp_unicode_data() -> (Vec<(u32, u16)>, Vec<u32>) {
        let dir = fetch::ensure_sdist(&fetch::LLAMA_CPP_TEST_DATA).expect("llama.cpp test data available");
        let src = std::fs::read_to_string(dir.join("unicode-data.cpp")).expect("unicode-data.cpp readable");
        let section = |from: &str, to: &str| -> String {
            let start = src.find(from).expect("section start");
            let end = src[start..].find(to).expect("section end") + start;
            src[start..end].to_string()
        };
        let hex = |t: &str| u32::from_str_radix(t.trim().trim_start_matches("0x"), 16).expect("hex");
        let ranges = section("unicode_ranges_flags", "unicode_set_whitespace")
            .lines()
            .filter_map(|l| l.trim().strip_prefix('{')?.strip_suffix("},").map(str::to_string))
            .map(|pair| {
                let (a, f) = pair.split_once(',').expect("pair");
                (hex(a), u16::try_from(hex(f)).expect("u16 flags"))
            })
            .collect();
        let spaces = section("unicode_set_whitespace", "unicode_map_lowercase")
            .lines()
            .filter_map(|l| l.trim().strip_suffix(',').filter(|t| t.starts_with("0x")).map(hex))
            .collect();
        (ranges, spaces)
    }

    #[test]
    fn classes_are_llama_cpps_for_every_code_point() {
        let (ranges, spaces) = llama_cpp_unicode_data();
        assert!(ranges.len() > 2000 && spaces.len() == 25, "{} ranges, {} spaces", ranges.len(), spaces.len());
        let mut wrong = Vec::new();
        for pair in ranges.windows(2) {
            let ((start, flags), (end, _)) = (pair[0], pair[1]);
            for cp in start..end.min(0x110000) {
                let Some(c) = char::from_u32(cp) else { continue }; // surrogates: no &str holds one
                let want = if spaces.contains(&cp) {
                    Class::Space
                } else if flags & 0x04 != 0 {
                    Class::Letter
                } else if flags & 0x02 != 0 {
                    Class::Number
                } else if flags & 0x10 != 0 {
                    Class::Mark
                } else {
                    Class::Other
                };
                if class(c) != want {
                    wrong.push(format!("U+{cp:04X}: {:?}, llama.cpp {want:?}", class(c)));
                }
            }
        }
        assert!(wrong.is_empty(), "{} code points differ: {:?}", wrong.len(), &wrong[..wrong.len().min(20)]);
    }

    proptest! {
        #[test]
        fn words_tile_the_text(s in any::<String>()) {
            for style in ALL {
                let w = words(&s, style);
                prop_assert!(w.iter().all(|w| !w.is_empty()));
                prop_assert_eq!(w.concat(), s.as_str());
            }
        }
    }
}
