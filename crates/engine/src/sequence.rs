//! A running sequence: its request, its pages, its sampler and how far it has got, and what
//! one step's logits do to it (sample a token, stream it, end it). The loop (`scheduler`)
//! decides which sequences share a step; this is what a step means for each of them.

use kv::{BlockTable, CacheScope};
use sampling::Sampler;
use tokio::sync::mpsc as tmpsc;

use crate::draft::{DraftRate, Drafting};
use crate::inbox::Kind;
use crate::{Event, FinishReason, GenRequest, TokenEvent, Usage};
use protocol::RequestError;

/// How a step's sampling ends a request.
pub(crate) enum End {
    Event(Event),
    /// A prefill-only request: hand its pages over with the first token.
    Handoff(TokenEvent),
}

pub(crate) struct Running {
    pub(crate) req: GenRequest,
    pub(crate) kind: Kind,
    pub(crate) tx: tmpsc::UnboundedSender<Event>,
    pub(crate) kv: BlockTable,
    pub(crate) sampler: Sampler,
    pub(crate) prefilled: usize,
    /// Leading prompt tokens whose KV came from the prefix cache.
    pub(crate) cached: usize,
    /// Where its whole prompt pages are sealed once prefilled; None: no caching.
    pub(crate) scope: Option<CacheScope>,
    pub(crate) generated: Vec<u32>,
    /// Fed at the next decode step: the last sampled token, then any drafts to verify
    /// ([`crate::draft`]).
    pub(crate) input: Vec<u32>,
    /// Drafts fed and drafts kept in the step just sampled.
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
    /// How often its guesses are kept: how many to feed.
    pub(crate) draft_rate: DraftRate,
    /// This step's logits, when the step produced some for this sequence; empty otherwise,
    /// its allocation kept for the next step.
    pub(crate) logits: Vec<f32>,
    /// Set when the request is complete (finished or failed) after this step.
    pub(crate) end: Option<End>,
    /// Its place in its tenant's queue for a decode row, when the tenant is held to a share of
    /// the rows ([`crate::row_share`]): lowest first, and a sequence given a row goes to the
    /// back, so each of the tenant's sequences advances in turn.
    pub(crate) row_turn: u64,
}

impl Running {
    pub(crate) fn decoding(&self) -> bool {
        self.prefilled == self.req.prompt.len()
    }
}

/// Samples a step's rows of `r` (`logits`: one row of `vocab` per token fed, or one row): row
/// `i` is sampled exactly as a step without drafts would sample it, and the next row is
/// sampled only if that token equals draft `i` (then the row's input was the token just
/// drawn, so its logits are those the next step without drafts would compute). Then the next
/// step's drafts, as many as `draft` and the sequence's record allow. Returns how the request
/// ends when it is complete.
pub(crate) fn sample_step(r: &mut Running, logits: &mut [f32], vocab: usize, draft: Drafting) -> Option<End> {
    let rows = logits.len().checked_div(vocab).unwrap_or(1).max(1);
    let drafts = std::mem::take(&mut r.input);
    (r.drafted, r.accepted) = (if rows > 1 { drafts.len().saturating_sub(1) } else { 0 }, 0);
    r.input = Vec::with_capacity(1 + draft.max);
    for (i, row) in logits.chunks_mut(vocab.max(1)).take(rows).enumerate() {
        if let Some(how) = sample_into(r, row) {
            return Some(how);
        }
        match drafts.get(i + 1) {
            Some(&d) if rows > 1 && r.generated.last() == Some(&d) => r.accepted += 1,
            _ => break,
        }
    }
    if rows > 1 {
        r.draft_rate.update(r.drafted, r.accepted);
    }
    // Never past `max_tokens`: every guess kept is a token generated.
    let room = r.req.max_tokens.saturating_sub(r.generated.len() + 1);
    let want = r.draft_rate.length(draft).min(room);
    if want > 0 && r.kind == Kind::Full {
        let mut guess = Vec::new();
        crate::draft::propose(&r.req.prompt, &r.generated, want, &mut guess);
        r.input.extend(guess);
    } else if draft.max > 0 {
        r.draft_rate.update(0, 0);
    }
    None
}

pub(crate) fn end(r: Running, ev: Event) {
    let Running { tx, kv, .. } = r;
    drop(kv);
    let _ = tx.send(ev);
}

/// Samples the next token of `r`; returns how the request ends when it is complete.
pub(crate) fn sample_into(r: &mut Running, logits: &mut [f32]) -> Option<End> {
    let usage = |r: &Running| Usage {
        prompt_tokens: r.req.prompt.len(),
        completion_tokens: r.generated.len(),
        cached_tokens: r.cached,
    };
    let failed = |e: String| Some(End::Event(Event::Failed(RequestError::Internal(e))));
    // Constrained decoding: only tokens that continue the output's grammar stay drawable.
    if let Some(c) = r.req.constraint.as_mut() {
        if let Err(e) = c.mask(logits) {
            return failed(e.to_string());
        }
    }
    let s = match r.sampler.sample(logits, &r.generated) {
        Ok(s) => s,
        Err(e) => return failed(e.to_string()),
    };
    let id = s.token;
    if r.kind == Kind::Prefill {
        return Some(End::Handoff(s));
    }
    if r.req.stop_tokens.contains(id) {
        return Some(End::Event(Event::Finished { reason: FinishReason::Stop, usage: usage(r) }));
    }
    if let Some(c) = r.req.constraint.as_mut() {
        if let Err(e) = c.accept(id) {
            return failed(e.to_string());
        }
    }
    r.generated.push(id);
    r.input.clear();
    r.input.push(id);
    let _ = r.tx.send(Event::Token(s));
    if r.generated.len() >= r.req.max_tokens {
        return Some(End::Event(Event::Finished { reason: FinishReason::Length, usage: usage(r) }));
    }
    None
}
