//! Drafts for speculative decoding, looked up in the sequence's own tokens.
//!
//! Batch-1 decode reads every weight once per token, so it is bound by memory bandwidth; a step
//! that feeds the last token and a few guessed ones reads the weights once for all of them and
//! costs little more. The guesses come from prompt lookup: the tokens that followed the latest
//! earlier occurrence of the sequence's last few tokens, in the sequence itself (its prompt and
//! what it generated). Summaries, edits, code and extraction repeat spans of their prompt, so
//! such guesses are often right; where nothing repeats, nothing is guessed and nothing is spent.
//!
//! Drafts are taken from the request's own tokens only, never from another request's or
//! another tenant's (a shared lookup table would tell one tenant what another's text holds
//! through which guesses are accepted, which shows in speed). Verification (`sequence`) samples
//! every row as a step without drafts would and keeps a guess only where it equals that sample,
//! so the output is exactly what decoding without drafts gives.

/// Longest and shortest run of trailing tokens looked up; longer runs first (fewer, better
/// guesses). A single token repeats too often by chance to be worth a guess.
const NGRAM_MAX: usize = 4;
const NGRAM_MIN: usize = 2;

/// Writes into `out` (cleared first) up to `max` tokens continuing `prompt ++ generated`: those
/// that followed the latest earlier occurrence of its last `n` tokens, for the largest `n` in
/// `NGRAM_MIN..=NGRAM_MAX` that occurs earlier.
pub(crate) fn propose(prompt: &[u32], generated: &[u32], max: usize, out: &mut Vec<u32>) {
    out.clear();
    let len = prompt.len() + generated.len();
    let at = |i: usize| if i < prompt.len() { prompt[i] } else { generated[i - prompt.len()] };
    if max == 0 {
        return;
    }
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let tail = len - n;
        // Latest start first; a match must end before the sequence's last token, so at least
        // one token follows it.
        for start in (0..tail).rev() {
            if (0..n).all(|k| at(start + k) == at(tail + k)) {
                let from = start + n;
                out.extend((from..len.min(from + max)).map(at));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess(prompt: &[u32], generated: &[u32], max: usize) -> Vec<u32> {
        let mut out = vec![99];
        propose(prompt, generated, max, &mut out);
        out
    }

    #[test]
    fn the_tokens_after_the_latest_earlier_occurrence_of_the_tail_are_proposed() {
        // "1 2 3 4 5 ... 1 2 3" -> 4 5 6
        assert_eq!(guess(&[1, 2, 3, 4, 5, 6, 7, 9, 1, 2], &[3], 3), vec![4, 5, 6]);
        // The latest occurrence wins: "2 3 x" twice, the later followed by 8.
        assert_eq!(guess(&[2, 3, 7, 5, 2, 3, 8, 6, 2], &[3], 2), vec![8, 6]);
        // Across prompt and output alike.
        assert_eq!(guess(&[5, 6], &[7, 8, 5, 6], 4), vec![7, 8, 5, 6]);
    }

    #[test]
    fn longer_matches_are_preferred_and_a_single_token_is_never_enough() {
        // Tail "1 2 3": a 3-gram occurs (followed by 4) and a later 2-gram "2 3" (followed by 9).
        assert_eq!(guess(&[1, 2, 3, 4, 0, 2, 3, 9, 0, 1, 2, 3], &[], 1), vec![4]);
        // Only the last token repeats: no guess.
        assert!(guess(&[4, 1, 5, 6, 1], &[], 4).is_empty());
        assert!(guess(&[], &[], 4).is_empty());
        assert!(guess(&[1, 2, 1, 2], &[], 0).is_empty());
    }

    #[test]
    fn a_guess_stops_at_the_end_of_what_exists() {
        // "1 2 1 2": the match at 0 is followed by "1 2" only.
        assert_eq!(guess(&[1, 2, 1, 2], &[], 8), vec![1, 2]);
    }
}
