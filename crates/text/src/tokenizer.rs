//! Tokenizer built from GGUF metadata, matching llama.cpp's `llama_tokenize` with
//! `add_special = false`, for two tokenizer families (`tokenizer.ggml.model`):
//!
//! * `"gpt2"`: byte-level BPE (`Encoder::Bpe`);
//! * `"llama"`: SentencePiece-style BPE by token score with `▁` for spaces and `<0xXX>` byte
//!   fallback (`Encoder::Spm`, spm.rs), as llama.cpp's `llm_tokenizer_spm` (Llama 2, Phi-3,
//!   Gemma 3).
//!
//! Encoding runs in two stages, as in llama.cpp: the text is first partitioned on special-token
//! texts (control tokens only when `parse_special`, user-defined tokens always), then every plain
//! fragment is encoded. For BPE it is split into words by the pre-tokenizer (pretokenize.rs:
//! llama.cpp's regexes, written out by hand as llama.cpp does) and each word is merged by BPE rank
//! exactly as llama.cpp's `llm_tokenizer_bpe_session` does. For SPM the whole fragment is escaped
//! (`' '` to `▁`, plus a leading `▁` with `add_space_prefix` at the start of the text or after a
//! special token) and merged by score as `llm_tokenizer_spm_session` does.
//!
//! The BPE merge loop is our own because HF `tokenizers`' BPE silently skips characters that have
//! no token and then merges their neighbours across the gap, where llama.cpp keeps the character
//! as a barrier and drops it only at the end (SmolLM2 has no token for 21 byte values, U+0013
//! among them). Decoding maps each id to its exact bytes from a table built once (for SPM: `▁` as
//! a space, `<0xXX>` as its byte), which makes it lossless for any sequence (even one that splits
//! a UTF-8 character).

use std::collections::HashMap;

use crate::bpe::{self, Bpe};
use crate::pretokenize::PreTokenizer;
use crate::spm::{self, Spm};
use crate::TextError;

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_BYTE: i64 = 6;

/// A special token that the encoder recognises in raw text.
#[derive(Debug, Clone)]
struct SpecialText {
    text: String,
    id: u32,
    /// User-defined tokens are matched even when `parse_special` is false (as in llama.cpp).
    always: bool,
    /// llama.cpp's `LLAMA_TOKEN_ATTR_RSTRIP`: blanks right after the token are dropped.
    rstrip: bool,
}

/// How plain text (between special tokens) becomes ids: one variant per `tokenizer.ggml.model`.
#[derive(Debug, Clone)]
enum Encoder {
    /// `"gpt2"`: byte-level BPE.
    Bpe {
        /// Splits plain text into words (llama.cpp's pre-tokenizer), on raw text.
        pre: PreTokenizer,
        /// Merge rules, applied to each word.
        bpe: Box<Bpe>,
    },
    /// `"llama"`: SentencePiece-style merges by score.
    Spm(Box<Spm>),
}

/// Text to token ids and back for one model's vocabulary. Cheap to share: `Send + Sync`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    encoder: Encoder,
    /// Exact bytes of each token, indexed by id.
    pieces: Vec<Box<[u8]>>,
    /// Control and unknown tokens: they mark structure and carry no text of their own.
    special: Vec<bool>,
    /// Texts split out before BPE, longest first.
    special_texts: Vec<SpecialText>,
    bos: Option<u32>,
    eos: u32,
    stop: Vec<u32>,
    add_bos: bool,
}

/// Token texts that end a turn, as llama.cpp's end-of-generation list (`special_eog_ids`).
const EOG_TEXTS: [&str; 12] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|end_of_text|>",
    "<|return|>",
    "<|call|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
];

/// llama.cpp's end-of-generation texts (`llama_vocab::impl::load`, the `special_eog_ids` loop):
/// it adds the control attribute to a token with one of these texts whatever its type. Only
/// user-defined tokens are changed here (Phi-3's `</s>`); a normal token with such a text, which
/// llama.cpp would then also split out under `parse_special`, stays normal.
const CONTROL_LOOKING: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// GPT-2's reversible map from bytes to printable characters: the alphabet of byte-level BPE
/// vocabularies (a vocabulary for a test or a fuzz target is built from it).
pub fn bytes_to_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            u32::from(b)
        } else {
            extra += 1;
            255 + extra
        };
        table[usize::from(b)] = char::from_u32(cp).unwrap_or('\0');
    }
    table
}

/// Bytes of a normal token: each byte-level character back to its byte; characters outside the
/// byte-level alphabet (not produced by conversion tools, but possible) keep their UTF-8 bytes.
fn byte_level_decode(text: &str, char_to_byte: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte.get(&c) {
            Some(&b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

/// `<0xAB>` to the byte 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A boolean key, `default` when missing.
fn optional_bool(g: &gguf::Gguf, key: &str, default: bool) -> Result<bool, TextError> {
    match g.get(key) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| TextError::InvalidVocab(format!("{key} is not a boolean"))),
    }
}

fn optional_id(g: &gguf::Gguf, key: &str, n: usize) -> Result<Option<u32>, TextError> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let id = match v.as_i64() {
        Some(id) => id,
        // An unsigned value beyond i64: the "none" sentinel of some converters.
        None if v.as_u64().is_some() => return Ok(None),
        None => return Err(TextError::InvalidVocab(format!("{key} is not an integer"))),
    };
    // Some converters write -1 (as an unsigned maximum or a signed value) for "none".
    if id < 0 || id == i64::from(u32::MAX) {
        return Ok(None);
    }
    match u32::try_from(id) {
        Ok(id) if (id as usize) < n => Ok(Some(id)),
        _ => Err(TextError::InvalidVocab(format!("{key} = {id} is outside the vocabulary of {n} tokens"))),
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata (`tokenizer.ggml.*`).
    pub fn from_gguf(g: &gguf::Gguf) -> Result<Tokenizer, TextError> {
        let model = g.str("tokenizer.ggml.model")?;
        let is_spm = match model {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TextError::UnsupportedModel(model.to_string())),
        };

        let tokens = g.str_array("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(TextError::InvalidVocab(format!("vocabulary of {n} tokens")));
        }
        let types = match g.get("tokenizer.ggml.token_type") {
            Some(_) => g.i64_array("tokenizer.ggml.token_type")?,
            None => vec![TYPE_NORMAL; n],
        };
        if types.len() != n {
            return Err(TextError::InvalidVocab(format!("{} token types for {n} tokens", types.len())));
        }

        let to_char = bytes_to_chars();
        let char_to_byte: HashMap<char, u8> = to_char.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        // The bytes of a normal token: byte-level characters for BPE, `▁` for a space for SPM.
        let normal_bytes = |text: &str| -> Vec<u8> {
            if is_spm {
                text.replace(spm::SPACE, " ").into_bytes()
            } else {
                byte_level_decode(text, &char_to_byte)
            }
        };

        // llama.cpp gives Phi-3's special tokens RSTRIP, recognising the model by its name: the
        // chat template's newline after `<|user|>` is then not part of the prompt's text.
        let phi3 = match g.get("general.name").and_then(|v| v.as_str()) {
            Some(name) => {
                let name = name.to_ascii_lowercase();
                name.contains("phi-3") || name.contains("phi3")
            }
            None => false,
        };
        let rstrip = |text: &str| phi3 && !matches!(text, "<unk>" | "<s>" | "<|endoftext|>");

        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(n);
        let mut pieces = Vec::with_capacity(n);
        let mut special = Vec::with_capacity(n);
        let mut special_texts = Vec::new();
        for (id, (&text, &ty)) in tokens.iter().zip(&types).enumerate() {
            let id = id as u32;
            // llama.cpp makes a user-defined token with an end-of-generation text a control
            // token ("control-looking token ... its type will be overridden"), so that plain
            // text never produces it: Phi-3's user-defined "</s>" stays text without
            // `parse_special`.
            let ty = if ty == TYPE_USER_DEFINED && CONTROL_LOOKING.contains(&text) { TYPE_CONTROL } else { ty };
            // Later duplicates win, as in llama.cpp's token_to_id map.
            vocab.insert(text.to_string(), id);
            let bytes = match ty {
                TYPE_CONTROL | TYPE_UNKNOWN | TYPE_USER_DEFINED => text.as_bytes().to_vec(),
                TYPE_BYTE => match parse_byte_token(text) {
                    Some(b) => vec![b],
                    None => normal_bytes(text),
                },
                _ => normal_bytes(text),
            };
            pieces.push(bytes.into_boxed_slice());
            special.push(matches!(ty, TYPE_CONTROL | TYPE_UNKNOWN));
            if matches!(ty, TYPE_CONTROL | TYPE_UNKNOWN | TYPE_USER_DEFINED) && !text.is_empty() {
                special_texts.push(SpecialText {
                    text: text.to_string(),
                    id,
                    always: ty == TYPE_USER_DEFINED,
                    rstrip: rstrip(text),
                });
            }
        }
        // Longest first, so that a token whose text contains another's is matched whole.
        special_texts.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));

        // llama.cpp's defaults when the keys are missing: BOS 1 and EOS 2 for SPM vocabularies;
        // for BPE we look for <|endoftext|> (llama.cpp's fixed 11 is GPT-2's own).
        let default_id = |id: u32| (is_spm && (id as usize) < n).then_some(id);
        let bos = optional_id(g, "tokenizer.ggml.bos_token_id", n)?
            .or_else(|| g.get("tokenizer.ggml.bos_token_id").is_none().then(|| default_id(1)).flatten());
        let find = |text: &str| vocab.get(text).copied();
        let eos = match optional_id(g, "tokenizer.ggml.eos_token_id", n)? {
            Some(id) => id,
            None => default_id(2).or_else(|| find("<|endoftext|>")).ok_or_else(|| {
                TextError::InvalidVocab("no tokenizer.ggml.eos_token_id and no <|endoftext|> token".into())
            })?,
        };
        let mut stop = vec![eos];
        let keyed =
            [optional_id(g, "tokenizer.ggml.eot_token_id", n)?, optional_id(g, "tokenizer.ggml.eom_token_id", n)?];
        for id in keyed.into_iter().chain(EOG_TEXTS.iter().map(|t| find(t))).flatten() {
            if !stop.contains(&id) {
                stop.push(id);
            }
        }

        let (encoder, add_bos) = if is_spm {
            (Encoder::Spm(Box::new(Self::spm(g, vocab, n)?)), optional_bool(g, "tokenizer.ggml.add_bos_token", true)?)
        } else {
            let (pre, bpe) = Self::bpe(g, &vocab, &to_char, &char_to_byte)?;
            let add_bos = optional_bool(g, "tokenizer.ggml.add_bos_token", pre.adds_bos_by_default())?;
            (Encoder::Bpe { pre, bpe: Box::new(bpe) }, add_bos)
        };

        Ok(Tokenizer { encoder, pieces, special, special_texts, bos, eos, stop, add_bos })
    }

    /// The byte-level BPE encoder: pre-tokenizer and merges.
    fn bpe(
        g: &gguf::Gguf,
        vocab: &HashMap<String, u32>,
        to_char: &[char; 256],
        char_to_byte: &HashMap<char, u8>,
    ) -> Result<(PreTokenizer, Bpe), TextError> {
        // llama.cpp treats a missing pre-tokenizer key as "default".
        let pre_name = match g.get("tokenizer.ggml.pre") {
            None => "default",
            Some(v) => {
                v.as_str().ok_or_else(|| TextError::InvalidVocab("tokenizer.ggml.pre is not a string".into()))?
            }
        };
        let pre = PreTokenizer::from_name(pre_name).ok_or_else(|| TextError::UnsupportedPre(pre_name.to_string()))?;

        let merges = match g.get("tokenizer.ggml.merges") {
            Some(_) => g.str_array("tokenizer.ggml.merges")?,
            None => Vec::new(),
        };
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.into_iter().enumerate() {
            // Split at the first space after the first character, as llama.cpp does: byte-level
            // tokens never contain a raw space, but the first part may be a lone " ".
            let split = m.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
            let Some(i) = split else {
                return Err(TextError::InvalidVocab(format!("merge {m:?} has no separating space")));
            };
            let (a, b) = (&m[..i], &m[i + 1..]);
            // A merge whose parts or result are not tokens can never produce a token: skipped.
            let (Some(&l), Some(&r), Some(&merged)) = (vocab.get(a), vocab.get(b), vocab.get(&format!("{a}{b}")))
            else {
                continue;
            };
            // The first occurrence of a pair holds its rank, as in llama.cpp.
            merge_map.entry((l, r)).or_insert((rank as u32, merged));
        }
        let byte_token = std::array::from_fn(|b| vocab.get(to_char[b].encode_utf8(&mut [0u8; 4]) as &str).copied());
        // llama.cpp compares the byte-level encoded word with every token's text, special tokens
        // included; a text with a character outside the byte-level alphabet can never be equal.
        let whole_words = pre.ignores_merges().then(|| {
            vocab
                .iter()
                .filter_map(|(text, &id)| {
                    let bytes: Option<Box<[u8]>> = text.chars().map(|c| char_to_byte.get(&c).copied()).collect();
                    Some((bytes?, id))
                })
                .collect()
        });
        Ok((pre, Bpe { byte_token, merges: merge_map, whole_words }))
    }

    /// The SentencePiece encoder: scores (0 when the file has none, as in llama.cpp) and the
    /// space prefix (`tokenizer.ggml.add_space_prefix`, default true as in llama.cpp). The
    /// pre-tokenizer key means nothing to SPM and is ignored, as llama.cpp does.
    fn spm(g: &gguf::Gguf, vocab: HashMap<String, u32>, n: usize) -> Result<Spm, TextError> {
        let scores = match g.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(v) => {
                let bad = || TextError::InvalidVocab("tokenizer.ggml.scores is not an array of numbers".into());
                let arr = v.as_array().ok_or_else(bad)?;
                if arr.len() != n {
                    return Err(TextError::InvalidVocab(format!("{} token scores for {n} tokens", arr.len())));
                }
                arr.iter().map(|x| x.as_f64().map(|f| f as f32).ok_or_else(bad)).collect::<Result<Vec<f32>, _>>()?
            }
        };
        let add_space_prefix = optional_bool(g, "tokenizer.ggml.add_space_prefix", true)?;
        Ok(Spm::new(vocab, scores, add_space_prefix))
    }

    /// A prompt's token ids: [`encode`](Tokenizer::encode), after the BOS token when the
    /// vocabulary asks for one (llama.cpp's `add_special` for prompts; Gemma does, SmolLM2 not).
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TextError> {
        let mut ids = self.encode(text, parse_special)?;
        if let (true, Some(bos)) = (self.add_bos(), self.bos) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// Token ids of `text`, without BOS. With `parse_special`, control-token texts such as
    /// `<|im_start|>` become their ids; without it they are tokenized as plain text.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TextError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        // SPM's space prefix goes before a fragment at the start or right after a special token.
        let mut after_special = true;
        for frag in self.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                // Empty text has no fragment at all in llama.cpp (and so no space prefix).
                Fragment::Text("") => {}
                Fragment::Text(s) => {
                    self.encode_plain(s, after_special, &mut out)?;
                    after_special = false;
                }
            }
        }
        Ok(out)
    }

    fn encode_plain(&self, text: &str, after_special: bool, out: &mut Vec<u32>) -> Result<(), TextError> {
        match &self.encoder {
            Encoder::Bpe { pre, bpe } => {
                let mut scratch = bpe::Scratch::default();
                for word in pre.split(text) {
                    bpe.word(word.as_bytes(), &mut scratch, out);
                }
                Ok(())
            }
            Encoder::Spm(spm) => spm.fragment(text, after_special, out),
        }
    }

    /// llama.cpp's `tokenizer_st_partition`: for each special text, longest first, split every
    /// remaining plain fragment at each of its occurrences.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        for st in &self.special_texts {
            if !parse_special && !st.always {
                continue;
            }
            if !frags.iter().any(|f| matches!(f, Fragment::Text(s) if s.contains(st.text.as_str()))) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut s) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = s.find(st.text.as_str()) {
                    if at > 0 {
                        next.push(Fragment::Text(&s[..at]));
                    }
                    next.push(Fragment::Token(st.id));
                    s = &s[at + st.text.len()..];
                    if st.rstrip {
                        // C's isspace, as llama.cpp strips byte by byte.
                        s = s.trim_start_matches([' ', '\t', '\n', '\x0B', '\x0C', '\r']);
                    }
                }
                if !s.is_empty() {
                    next.push(Fragment::Text(s));
                }
            }
            frags = next;
        }
        frags
    }

    /// The exact bytes of the tokens concatenated (special tokens as their text).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TextError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.piece(id)?);
        }
        Ok(out)
    }

    /// The tokens as text; invalid UTF-8 (a sequence that splits a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        let bytes = self.decode_bytes(ids)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    pub(crate) fn piece(&self, id: u32) -> Result<&[u8], TextError> {
        self.token_bytes(id).ok_or(TextError::UnknownToken { id, vocab_size: self.pieces.len() })
    }

    /// The raw bytes of one token, `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(|b| &b[..])
    }

    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether the model expects BOS before a prompt (`tokenizer.ggml.add_bos_token`; when the
    /// key is missing, llama.cpp's default: true for SPM, false for byte-level BPE). [`encode`]
    /// never adds it: the caller prepends [`bos`] when this is true.
    ///
    /// [`encode`]: Tokenizer::encode
    /// [`bos`]: Tokenizer::bos
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Control (and unknown) tokens: structure markers such as `<|im_start|>`, never user text.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Ids that end generation: EOS, EOT/EOM when the GGUF names them, and the tokens llama.cpp
    /// treats as end of generation by their text when the vocabulary has them (`<|im_end|>`,
    /// `<|endoftext|>`, `<end_of_turn>`, `<|eot_id|>`, ...). EOS comes first; no duplicates.
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.stop.clone()
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2() {
        let t = bytes_to_chars();
        assert_eq!(t[usize::from(b' ')], 'Ġ');
        assert_eq!(t[usize::from(b'\n')], 'Ċ');
        assert_eq!(t[usize::from(b'a')], 'a');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0x0>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }
}
