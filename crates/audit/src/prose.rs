//! The prompts' words: seeded filler prose, the sentences that carry a canary and the closing
//! instructions. Deterministic in the generator, so a plan can be made again from its seed.

use crate::rng::Rng;

/// Sentences that introduce a canary; one is drawn for each.
pub(crate) const CANARY_SENTENCES: [&str; 4] = [
    "The secret code is {}.",
    "Remember this secret code: {}.",
    "Your private access code is {}; keep it safe.",
    "Note the secret code {} for later.",
];

/// The closing instructions (also used by the canary tests as text that must not match).
pub const INSTRUCTIONS: [&str; 4] = [
    "Repeat the secret code exactly.",
    "Repeat the secret codes exactly, in the order given.",
    "Secret code:",
    "Secret codes:",
];

const WORDS: [&str; 120] = [
    "the",
    "river",
    "stone",
    "garden",
    "window",
    "morning",
    "quiet",
    "market",
    "winter",
    "light",
    "paper",
    "bridge",
    "table",
    "music",
    "green",
    "ocean",
    "village",
    "letter",
    "school",
    "mountain",
    "forest",
    "season",
    "history",
    "simple",
    "careful",
    "bright",
    "under",
    "across",
    "before",
    "after",
    "people",
    "small",
    "large",
    "water",
    "road",
    "house",
    "family",
    "friend",
    "story",
    "travel",
    "evening",
    "kitchen",
    "bread",
    "summer",
    "number",
    "picture",
    "animal",
    "weather",
    "city",
    "country",
    "north",
    "south",
    "east",
    "west",
    "old",
    "new",
    "long",
    "short",
    "warm",
    "cold",
    "open",
    "closed",
    "field",
    "farmer",
    "teacher",
    "student",
    "doctor",
    "train",
    "station",
    "harbor",
    "island",
    "valley",
    "hill",
    "cloud",
    "rain",
    "sun",
    "moon",
    "star",
    "night",
    "day",
    "year",
    "week",
    "hour",
    "minute",
    "and",
    "with",
    "from",
    "near",
    "over",
    "into",
    "through",
    "around",
    "while",
    "because",
    "often",
    "always",
    "sometimes",
    "never",
    "slowly",
    "quickly",
    "together",
    "alone",
    "home",
    "work",
    "street",
    "corner",
    "shop",
    "book",
    "library",
    "museum",
    "painting",
    "song",
    "dance",
    "game",
    "ship",
    "boat",
    "lamp",
    "chair",
    "door",
    "wall",
];

/// `words` words of plausible filler prose (sentences of 6-14 words). Deterministic in `rng`.
pub fn filler(rng: &mut Rng, words: usize) -> String {
    let mut out = String::with_capacity(words * 7);
    let mut left = words;
    while left > 0 {
        let n = rng.range(6, 14).min(left);
        for i in 0..n {
            let w = rng.pick(&WORDS);
            if i == 0 {
                if !out.is_empty() {
                    out.push(' ');
                }
                let mut c = w.chars();
                if let Some(f) = c.next() {
                    out.push(f.to_ascii_uppercase());
                    out.push_str(c.as_str());
                }
            } else {
                out.push(' ');
                out.push_str(w);
            }
        }
        out.push('.');
        left -= n;
    }
    out
}
