//! Streaming detokenization: a byte-level BPE token, or a SentencePiece byte-fallback token
//! (`<0xC4>`), can end in the middle of a UTF-8 character, so text is released only once its
//! characters are complete.

use crate::{TextError, Tokenizer};

/// Turns a stream of token ids into UTF-8 text chunks, holding back an incomplete trailing
/// multi-byte sequence until the tokens that complete it arrive. Bytes that can never become
/// valid UTF-8 are released as U+FFFD, exactly as [`Tokenizer::decode`] would render them.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text it completed (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TextError> {
        self.pending.extend_from_slice(tok.piece(id)?);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..start + valid]));
                    start += valid;
                    match e.error_len() {
                        // Invalid whatever follows: release it as one replacement character.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += bad;
                        }
                        // A character cut short at the end: wait for more bytes.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..start);
        Ok(out)
    }

    /// Whether bytes are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: whatever is still held back, rendered lossily.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}
