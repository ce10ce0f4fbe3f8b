//! Canaries: random secrets, each known to exactly one request of one tenant, and the scanner
//! that looks for any of them (or any 8-character fragment of one) in text another request got
//! back.
//!
//! A canary is two pronounceable pseudo-words and four digits ("kavorimu-tezulani-4821"). It
//! carries nothing about its tenant (a tenant-specific prefix would itself leak who the tenant
//! is), and it is pronounceable so that the model tends to copy it whole, which makes leaked KV
//! surface as text. The scanner matches every 8-letter window of each pseudo-word, so a model
//! that copies only part of it ("kavorimu", "vorimute") is still caught. Windows across the
//! hyphen are not used: a word's tail and the next word's head ("le-trave") are too often
//! English ("while travel").

use std::collections::HashMap;

use super::rng::Rng;

/// Length of the fragments matched. Shorter fragments start to match ordinary English; a
/// pseudo-word is at least this long so that each word alone is a fragment.
pub const FRAGMENT: usize = 8;

const ONSETS: [&str; 18] =
    ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "kr", "vl", "zh", "tr"];
const VOWELS: [&str; 5] = ["a", "e", "i", "o", "u"];
/// Letters that make a pseudo-word unlike English; every fragment carries one.
const RARE: [u8; 3] = [b'k', b'v', b'z'];

/// One canary: its text and who alone may see it.
#[derive(Debug, Clone)]
pub struct Canary {
    pub text: String,
    pub tenant: usize,
    pub request: usize,
}

/// A pseudo-word of 8 to 10 letters built from consonant-vowel syllables.
fn pseudo_word(rng: &mut Rng) -> String {
    loop {
        let mut w = String::new();
        while w.len() < FRAGMENT {
            w.push_str(ONSETS[rng.below(ONSETS.len())]);
            w.push_str(VOWELS[rng.below(VOWELS.len())]);
        }
        if w.len() <= 10 && windows(w.as_bytes()).all(|f| f.iter().any(|c| RARE.contains(c))) {
            return w;
        }
    }
}

/// Lower-case ASCII letters and digits stay; every run of anything else becomes one `-`. The
/// model may change case or spacing when it copies a canary ("Kavorimu tezulani 4821"), and a
/// fragment must still match. `map[i]` is the byte offset in the original text of normalised
/// byte `i`, so that a hit can quote the original text around it.
fn normalise(text: &str) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::with_capacity(text.len());
    let mut map = Vec::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        let b = if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() as u8 } else { b'-' };
        if b == b'-' && out.last() == Some(&b'-') {
            continue;
        }
        out.push(b);
        map.push(i);
    }
    (out, map)
}

/// A place where a canary (or part of one) was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Index of the canary in the [`CanaryIndex`].
    pub canary: usize,
    /// Byte range in the scanned text that matched.
    pub start: usize,
    pub end: usize,
    /// Whether the canary appeared whole, not only as a fragment.
    pub whole: bool,
}

/// Every canary of the run and every fragment of each, for scanning in time linear in the
/// scanned text.
#[derive(Default)]
pub struct CanaryIndex {
    canaries: Vec<Canary>,
    fragments: HashMap<[u8; FRAGMENT], usize>,
}

impl CanaryIndex {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, i: usize) -> &Canary {
        &self.canaries[i]
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.canaries.len()
    }

    /// Draws a new canary for `request` of `tenant`, unlike every earlier one in every fragment
    /// (so that a fragment names exactly one owner), and returns its index.
    pub fn issue(&mut self, rng: &mut Rng, tenant: usize, request: usize) -> usize {
        loop {
            let (a, b) = (pseudo_word(rng), pseudo_word(rng));
            if let Some(idx) = self.admit(format!("{a}-{b}-{:04}", rng.below(10_000)), tenant, request) {
                return idx;
            }
        }
    }

    /// Registers a given canary (tests that replay a real run's texts).
    #[cfg(test)]
    pub fn insert(&mut self, text: &str, tenant: usize, request: usize) -> usize {
        self.admit(text.into(), tenant, request).unwrap_or_else(|| panic!("{text} shares a fragment"))
    }

    /// Registers `text` unless one of its fragments belongs to an earlier canary. A fragment
    /// repeated inside one canary is harmless, but one shared with another canary would make a
    /// hit ambiguous.
    fn admit(&mut self, text: String, tenant: usize, request: usize) -> Option<usize> {
        let windows: Vec<[u8; FRAGMENT]> = words(&text).flat_map(|w| windows(w.as_bytes())).collect();
        if windows.iter().any(|w| self.fragments.contains_key(w)) {
            return None;
        }
        let idx = self.canaries.len();
        for w in windows {
            self.fragments.insert(w, idx);
        }
        self.canaries.push(Canary { text, tenant, request });
        Some(idx)
    }

    /// Every canary (or fragment) in `text`, one hit per canary and contiguous match.
    pub fn scan(&self, text: &str) -> Vec<Hit> {
        let (norm, map) = normalise(text);
        let mut hits: Vec<Hit> = Vec::new();
        // (canary, normalised start, normalised end) of the match being extended.
        let mut open: Option<(usize, usize, usize)> = None;
        let close = |open: (usize, usize, usize), hits: &mut Vec<Hit>| {
            let (c, s, mut e) = open;
            let whole = norm[s..].starts_with(self.canaries[c].text.as_bytes());
            if whole {
                // The digits are not fragments; a whole hit covers them too.
                e = s + self.canaries[c].text.len();
            }
            let start = map[s];
            // The end is the byte after the last matched character of the original text.
            let end = text[map[e - 1]..].chars().next().map_or(text.len(), |ch| map[e - 1] + ch.len_utf8());
            hits.push(Hit { canary: c, start, end, whole });
        };
        for (i, w) in norm.windows(FRAGMENT).enumerate() {
            let Some(&c) = w.try_into().ok().and_then(|k: [u8; FRAGMENT]| self.fragments.get(&k)) else {
                continue;
            };
            match open {
                // Overlapping windows, or the next word after one separator: one hit.
                Some((oc, s, e)) if oc == c && i <= e + 1 => open = Some((c, s, i + FRAGMENT)),
                _ => {
                    if let Some(o) = open.take() {
                        close(o, &mut hits);
                    }
                    open = Some((c, i, i + FRAGMENT));
                }
            }
        }
        if let Some(o) = open {
            close(o, &mut hits);
        }
        hits
    }

    /// Whether a fragment-only `hit` in `text` is the responding request misspelling one of its
    /// `own` canaries: the matched letters are one stretch of letters within [`ECHO_EDITS`]
    /// edits of some stretch of one of its own pseudo-words. A model that garbles its own secret
    /// ("likritra" for its own "likritri") can land exactly on another canary's window, and with
    /// tens of thousands of canaries from one syllable alphabet that happens in long runs. A
    /// whole canary, or a match across a word boundary, is never excused.
    pub fn echoes_own(&self, text: &str, hit: &Hit, own: &[usize]) -> bool {
        if hit.whole {
            return false;
        }
        let (matched, _) = normalise(&text[hit.start..hit.end]);
        if matched.is_empty() || !matched.iter().all(u8::is_ascii_lowercase) {
            return false;
        }
        own.iter()
            .flat_map(|&i| words(&self.canaries[i].text))
            .any(|word| edits_to_a_stretch(&matched, word.as_bytes()) <= ECHO_EDITS)
    }
}

/// Edits (substitutions, insertions, deletions) a fragment-only hit may be away from a stretch
/// of one of its own canary words and still count as a misspelling of it. Two of eight letters:
/// the four garbled copies seen in a 20,000-request run needed one, one, one and two.
pub const ECHO_EDITS: usize = 2;

/// The fewest edits that turn `needle` into some contiguous stretch of `hay` (edit distance with
/// free start and end in `hay`).
fn edits_to_a_stretch(needle: &[u8], hay: &[u8]) -> usize {
    // prev[j]: edits from needle[..i] to a stretch of hay ending at j.
    let mut prev = vec![0usize; hay.len() + 1];
    for (i, &n) in needle.iter().enumerate() {
        let mut cur = vec![i + 1; hay.len() + 1];
        for (j, &h) in hay.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(n != h)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev.into_iter().min().unwrap_or(needle.len())
}

/// The two pseudo-words of a canary (the digits are not fragments).
fn words(canary: &str) -> impl Iterator<Item = &str> {
    canary.split('-').take(2)
}

fn windows(b: &[u8]) -> impl Iterator<Item = [u8; FRAGMENT]> + '_ {
    b.windows(FRAGMENT).filter_map(|w| w.try_into().ok())
}

/// Up to `radius` bytes of `text` on each side of `start..end`, on character boundaries, with
/// line breaks shown as spaces, for a finding to quote.
pub fn context(text: &str, start: usize, end: usize, radius: usize) -> String {
    let mut a = start.saturating_sub(radius);
    while !text.is_char_boundary(a) {
        a -= 1;
    }
    let mut b = (end + radius).min(text.len());
    while !text.is_char_boundary(b) {
        b += 1;
    }
    let mut s = String::new();
    if a > 0 {
        s.push('…');
    }
    s.push_str(&text[a..b].replace(['\n', '\r'], " "));
    if b < text.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_with(n: usize, seed: u64) -> CanaryIndex {
        let mut rng = Rng::new(seed);
        let mut idx = CanaryIndex::new();
        for i in 0..n {
            idx.issue(&mut rng, i % 3, i);
        }
        idx
    }

    #[test]
    fn canaries_have_the_documented_shape() {
        let idx = index_with(200, 1);
        for i in 0..idx.len() {
            let t = &idx.get(i).text;
            let parts: Vec<&str> = t.split('-').collect();
            assert_eq!(parts.len(), 3, "{t}");
            for w in &parts[..2] {
                assert!((FRAGMENT..=10).contains(&w.len()), "{t}");
                assert!(w.chars().all(|c| c.is_ascii_lowercase()), "{t}");
            }
            assert!(parts[2].len() == 4 && parts[2].chars().all(|c| c.is_ascii_digit()), "{t}");
        }
    }

    #[test]
    fn finds_whole_canaries_and_fragments_in_any_case_or_spacing() {
        let idx = index_with(50, 2);
        let c = idx.get(17).text.clone();
        let words: Vec<&str> = c.split('-').collect();

        let text = format!("Sure! The code is {c}. Anything else?");
        let hits = idx.scan(&text);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].canary, 17);
        assert!(hits[0].whole);
        assert_eq!(&text[hits[0].start..hits[0].end], c);

        let upper = format!("CODE: {} {} {}", words[0].to_uppercase(), words[1], words[2]);
        let hits = idx.scan(&upper);
        assert_eq!(hits.len(), 1, "{upper}");
        assert!(hits[0].whole);

        // Only the first eight letters of one word.
        let partial = format!("I think it was {}... not sure", &words[1][..FRAGMENT]);
        let hits = idx.scan(&partial);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].canary, 17);
        assert!(!hits[0].whole);

        // Two canaries in one text: two hits, each with its owner.
        let d = idx.get(3).text.clone();
        let both = format!("{c} and then é{d}");
        let owners: Vec<usize> = idx.scan(&both).iter().map(|h| h.canary).collect();
        assert_eq!(owners, vec![17, 3]);
    }

    #[test]
    fn seven_characters_are_not_a_fragment() {
        let idx = index_with(20, 3);
        let c = idx.get(5).text.clone();
        assert!(idx.scan(&c[..FRAGMENT - 1]).is_empty());
    }

    #[test]
    fn no_false_positives_on_ordinary_text() {
        // Many canaries against English prose, the audit's own filler and instructions, and
        // code-like text: nothing may match.
        let idx = index_with(20_000, 4);
        let mut rng = Rng::new(9);
        let filler = super::super::prose::filler(&mut rng, 20_000);
        let prose = "The quick brown fox jumps over the lazy dog. Kubernetes orchestrates containers; \
            a refrigerator moves heat from inside to outside. Velvet curtains, zebra crossings and \
            vocabulary lessons: the government announced a comprehensive infrastructure programme \
            yesterday. Remember the secret code exactly and repeat it. Authorization: Bearer sk-live \
            2024-05-17T12:00:00Z pagewarden_kv_pages_used{tenant=\"alice\"} 0 \
            Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.";
        assert!(idx.scan(prose).is_empty());
        let hits: Vec<(String, &str)> =
            idx.scan(&filler).iter().map(|h| (idx.get(h.canary).text.clone(), &filler[h.start..h.end])).collect();
        assert!(hits.is_empty(), "{hits:?}");
        assert!(idx.scan(super::super::prose::INSTRUCTIONS.join(" ").as_str()).is_empty());
        // The project's own documentation: some 40 kB of technical English.
        for doc in [
            include_str!("../../../README.md"),
            include_str!("../../../ARCHITECTURE.md"),
            include_str!("../../../SECURITY.md"),
            include_str!("../../../docs/cluster.md"),
            include_str!("../../../docs/wire.md"),
        ] {
            let hits: Vec<String> = idx.scan(doc).iter().map(|h| doc[h.start..h.end].to_string()).collect();
            assert!(hits.is_empty(), "{hits:?}");
        }
    }

    /// The four fragment-only findings of a 20,000-request run (seed 1): each response garbled
    /// its own canary into a word holding another canary's 8-letter window. Quoted as the audit
    /// saw them, with the responding request's own canaries and the foreign one.
    #[test]
    fn a_garbled_copy_of_the_requests_own_canary_is_an_echo_not_a_leak() {
        let cases: [(&str, &[&str], &str); 4] = [
            (
                "The secret code is:  \"Likritra-Vutofolu-754",
                &["likritri-trulazesa-6298", "zutatupa-vutofolu-7548"],
                "nuzhotro-likritra-3368",
            ),
            (
                "The secret code is:  - Tenazhipo-krenakezho-4748 - ",
                &["kibitrezo-krenukezho-4748", "tenazhipo-kranakare-3228"],
                "kravlere-penakezho-5146",
            ),
            (
                "The code is:  \"Trukazukruzakregi-guzakregi-guzakregi-",
                &["krazhuba-sufeluvo-0003", "trusukra-guzakregi-5225"],
                "kruzakre-nekakruga-9983",
            ),
            ("  Fivozhazhazhazhazhazhazhazhazhazh", &["fivozhazi-datisazho-4586"], "vivozhazhu-folageka-7298"),
        ];
        for (text, own, foreign) in cases {
            let mut idx = CanaryIndex::new();
            let own: Vec<usize> = own.iter().map(|c| idx.insert(c, 1, 1)).collect();
            let f = idx.insert(foreign, 0, 2);
            let hits: Vec<Hit> = idx.scan(text).into_iter().filter(|h| h.canary == f).collect();
            assert_eq!(hits.len(), 1, "{text}");
            assert!(!hits[0].whole);
            assert!(idx.echoes_own(text, &hits[0], &own), "{text}");
            // The same words from a request whose own canaries are unrelated are a leak.
            let mut other = CanaryIndex::new();
            let unrelated = other.insert("bodamupe-sotenilu-1111", 1, 1);
            let f = other.insert(foreign, 0, 2);
            let hit = other.scan(text).into_iter().find(|h| h.canary == f).expect("the fragment still matches");
            assert!(!other.echoes_own(text, &hit, &[unrelated]), "{text}");
        }
    }

    #[test]
    fn whole_canaries_and_matches_across_words_are_never_echoes() {
        let mut idx = CanaryIndex::new();
        let own = idx.insert("likritri-trulazesa-6298", 1, 1);
        let foreign = idx.insert("likritra-trulozeso-3368", 0, 2);
        // One letter from the request's own canary in each word, but the whole foreign canary.
        let text = "code: likritra-trulozeso-3368";
        let hit = idx.scan(text).into_iter().find(|h| h.canary == foreign).expect("hit");
        assert!(hit.whole);
        assert!(!idx.echoes_own(text, &hit, &[own]));
        // Both foreign words without the digits: a fragment hit across the hyphen.
        let text = "code: likritra trulozeso!";
        let hit = idx.scan(text).into_iter().find(|h| h.canary == foreign).expect("hit");
        assert!(!hit.whole);
        assert!(!idx.echoes_own(text, &hit, &[own]));
    }

    /// Plain Levenshtein distance, for an oracle independent of `edits_to_a_stretch`.
    fn levenshtein(a: &[u8], b: &[u8]) -> usize {
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, x) in a.iter().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, y) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + usize::from(x != y)).min(prev[j + 1] + 1).min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }

    /// The excuse by brute force: the hit's letters within ECHO_EDITS of some substring of some
    /// own canary word.
    fn oracle(matched: &str, own: &[&str]) -> bool {
        let m = matched.as_bytes();
        own.iter().flat_map(|c| c.split('-').filter(|w| w.bytes().all(|b| b.is_ascii_lowercase()))).any(|w| {
            let w = w.as_bytes();
            (0..=w.len()).any(|i| (i..=w.len()).any(|j| levenshtein(m, &w[i..j]) <= ECHO_EDITS))
        })
    }

    /// Cases the rule was not built from: fresh random canaries (a seed no other test uses),
    /// foreign words copied whole, cut, or garbled by chance, beside unrelated or near own
    /// canaries. Whatever the rule says must agree with the brute-force oracle, and a whole
    /// canary or a cross-word match is never excused.
    #[test]
    fn the_echo_excuse_agrees_with_a_brute_force_oracle_on_random_cases() {
        let mut rng = Rng::new(0x0dd_ba11);
        let (mut excused, mut refused) = (0, 0);
        for case in 0..400 {
            let mut idx = CanaryIndex::new();
            let own: Vec<usize> = (0..rng.range(1, 3)).map(|i| idx.issue(&mut rng, 1, 10 + i)).collect();
            let foreign = idx.issue(&mut rng, 0, 1);
            let ftext = idx.get(foreign).text.clone();
            let fword = ftext.split('-').next().unwrap().to_string();
            // Half the cases: the foreign word garbled from an own word by up to three random
            // letter changes around an exact foreign window (the way echoes arise).
            let word = if case % 2 == 0 {
                fword.clone()
            } else {
                let own_word = idx.get(own[0]).text.split('-').next().unwrap().as_bytes().to_vec();
                let mut w = fword.as_bytes()[..FRAGMENT].to_vec();
                for _ in 0..rng.range(0, 3) {
                    let i = rng.below(own_word.len().min(w.len()));
                    w.push(own_word[i]);
                }
                String::from_utf8(w).unwrap()
            };
            let text = format!("The code is {word}, as said.");
            let Some(hit) = idx.scan(&text).into_iter().find(|h| h.canary == foreign) else { continue };
            let owns: Vec<String> = own.iter().map(|&i| idx.get(i).text.clone()).collect();
            let owns: Vec<&str> = owns.iter().map(String::as_str).collect();
            let matched = text[hit.start..hit.end].to_ascii_lowercase();
            let got = idx.echoes_own(&text, &hit, &own);
            assert_eq!(got, oracle(&matched, &owns), "case {case}: {text:?} own {owns:?} foreign {ftext}");
            if got {
                excused += 1;
            } else {
                refused += 1;
            }
            // The whole foreign canary after the same word is never excused.
            let text = format!("{text} Then {ftext}.");
            let whole = idx.scan(&text).into_iter().find(|h| h.canary == foreign && h.whole).expect("whole hit");
            assert!(!idx.echoes_own(&text, &whole, &own), "case {case}");
        }
        assert!(refused > 100, "{excused} excused, {refused} refused");
    }

    #[test]
    fn edits_to_a_stretch_counts_substitutions_insertions_and_deletions() {
        assert_eq!(edits_to_a_stretch(b"likritra", b"likritri"), 1);
        assert_eq!(edits_to_a_stretch(b"enakezho", b"krenukezho"), 1);
        assert_eq!(edits_to_a_stretch(b"kruzakre", b"guzakregi"), 2);
        assert_eq!(edits_to_a_stretch(b"ivozhazh", b"fivozhazi"), 1);
        assert_eq!(edits_to_a_stretch(b"abcdefgh", b"xxabcdefghxx"), 0);
        assert_eq!(edits_to_a_stretch(b"abcdefgh", b"abcefgh"), 1);
        assert_eq!(edits_to_a_stretch(b"abcdefgh", b"zzzzzzzz"), 8);
    }

    #[test]
    fn context_quotes_around_the_hit_on_char_boundaries() {
        let t = "ééééé secret xyz ééééé";
        let s = t.find("secret").unwrap_or(0);
        let q = context(t, s, s + 6, 3);
        assert!(q.contains("secret"));
        assert!(q.starts_with('…') && q.ends_with('…'));
    }
}
