//! Constrained decoding: a request's output held to a JSON schema, to any JSON object, or to a
//! grammar, by masking at every step the tokens that cannot continue it.
//!
//! The grammar engine is llguidance (Earley parsing over a lexer, token masks from a trie of the
//! vocabulary); this crate owns the bridge to the model's own tokenizer ([`Grammars`], built
//! once per node) and a request's parser state ([`Constraint`]). An [`OutputFormat`] is what
//! travels: the gateway compiles it to refuse a bad schema with a 400 before anything runs, and
//! each worker compiles it again for the sequences it samples.

#![forbid(unsafe_code)]

mod encoded;
mod schema;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use text::Tokenizer;

pub use encoded::{check_schema_depth, depth, EncodedFormat, MAX_FORMAT_BYTES, MAX_SCHEMA_DEPTH};
pub use schema::compact;

/// What constrained decoding refused.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error("cannot build the grammar engine's view of the vocabulary: {0}")]
    Vocabulary(String),
    #[error("the schema or grammar does not compile: {0}")]
    Compile(String),
    #[error("the grammar engine failed: {0}")]
    Matcher(String),
    #[error("{0}")]
    TooLarge(String),
}

/// The shape a request's output must have.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutputFormat {
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// JSON valid against this schema (`json_schema`, and tool calls).
    JsonSchema { schema: Value },
    /// A Lark grammar (tool choice `auto`: free text or a call).
    Lark { grammar: String },
}

impl OutputFormat {
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            OutputFormat::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({"type": "object"}))),
            OutputFormat::JsonSchema { schema } => TopLevelGrammar::from_json_schema(compact(schema.clone())),
            OutputFormat::Lark { grammar } => TopLevelGrammar::from_lark(grammar.clone()),
        }
    }
}

/// The model's vocabulary as llguidance sees it: every token's bytes, control tokens marked so
/// that no text can spell them, and text tokenized by the model's own tokenizer.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// The compiler of one model's constraints: built once per node (it indexes the vocabulary),
/// shared by every request.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    vocab: usize,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

impl Grammars {
    pub fn new(tokenizer: &Tokenizer) -> Result<Grammars, GrammarError> {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if tokenizer.is_special(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(bytes);
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let mut info = TokRxInfo::new(n as u32, tokenizer.eos());
        info.tok_bos = tokenizer.bos();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        // Its diagnostics go nowhere: they can quote the output.
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars { factory: Arc::new(factory), vocab: n })
    }

    /// A fresh parser state for one sequence.
    pub fn compile(&self, format: &OutputFormat) -> Result<Constraint, GrammarError> {
        // The grammar is a tenant's text: a panic inside the engine is that request's error,
        // never the caller's crash (mask and accept are guarded inside llguidance's matcher).
        let built =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.factory.create_parser(format.grammar())));
        let parser = match built {
            Ok(p) => p.map_err(|e| GrammarError::Compile(e.to_string()))?,
            Err(_) => return Err(GrammarError::Compile("the grammar engine failed on this grammar".into())),
        };
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(e));
        }
        Ok(Constraint { matcher, format: Arc::new(format.clone()), vocab: self.vocab })
    }
}

/// The grammar engine's budgets, set here rather than left to its defaults: a tenant's schema
/// is compiled on every worker and its masks are computed on the engine thread that every
/// tenant's sequences share, so what one grammar may cost is part of the isolation contract.
/// A grammar over a budget fails its own request (a 400 at the gateway's compile, an error
/// for a mask mid-answer), never another's.
fn limits() -> llguidance::api::ParserLimits {
    llguidance::api::ParserLimits {
        // Compile: regexes' lexer nodes (50k/ms, so about 20 ms) and grammar symbols.
        initial_lexer_fuel: 1_000_000,
        max_grammar_size: 200_000,
        // Per mask, on the engine thread: lexer work (14k/ms) and Earley items (20k/ms), each
        // a few ms at most. Lexer states are cached, so a grammar pays this while its lexer
        // is new and far less once warm.
        step_lexer_fuel: 100_000,
        step_max_items: 20_000,
        max_items_in_row: 2_000,
        // Memory: 1-2 kB a state, so at most about 100 MB for one grammar.
        max_lexer_states: 50_000,
        precompute_large_lexemes: true,
        // Errors must not carry the parser's state: it holds the output so far.
        verbose_errors: false,
    }
}

/// One sequence's position in its grammar.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    format: Arc<OutputFormat>,
    vocab: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("format", &self.format).finish_non_exhaustive()
    }
}

impl Constraint {
    pub fn format(&self) -> &OutputFormat {
        &self.format
    }

    /// Sets every token that cannot come next to -inf in `logits` (once the grammar is
    /// complete, everything but end-of-sequence).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| GrammarError::Matcher(e.to_string()))?;
        for (id, l) in logits.iter_mut().enumerate() {
            // Ids past the tokenizer's vocabulary (padding rows of the model) never fit.
            if id >= self.vocab || !allowed.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past a sampled token.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher.consume_token(token).map_err(|e| GrammarError::Matcher(e.to_string()))
    }

    /// Whether the output so far is complete.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}
