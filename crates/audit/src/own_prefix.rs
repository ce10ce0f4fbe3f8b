//! The one definition of a cross-tenant cache hit, used in every phase: a reported
//! `cached_tokens` beyond the longest prefix the tenant itself sent before.
//!
//! A tenant's own cache, and the chat template's head it sent itself, never count; anything
//! more is KV the tenant did not compute, whoever computed it. The audit keeps, per tenant,
//! every prompt it sent (as token ids when it can count them, else as bytes of its text), and
//! asks, once each answer is in, how far the longest of the tenant's other prompts agrees with
//! the one answered.
//!
//! "Before" is before the answer, not before the send: the server may take two requests of a
//! tenant sent together in either order, so every prompt the tenant sent until its answer came
//! (in flight, or sent a moment later) may have filled the cache it hit.

use std::sync::Mutex;

use serde_json::Value;

use crate::sync::lock;

/// Tokens of its own prompt a hit may leave to compute and still be the request's own: a server
/// that runs a request again after a fault (on a worker that already prefilled it) serves it
/// nearly whole from its own first attempt. No other tenant ever sent that prompt (each carries
/// its own canary or nonce, and the audit puts at least this many tokens after anything two
/// tenants share), so a hit this close to the whole prompt can only be the request's own.
pub const RETRY_SLACK: usize = 16;

/// Whether `cached` reported tokens cross tenants: beyond `allowed` (the tenant's own other
/// prompts) and short of the request's own whole prompt (`own_len` tokens, when known) by more
/// than [`RETRY_SLACK`].
pub fn crosses(cached: usize, allowed: usize, own_len: Option<usize>) -> bool {
    cached > allowed && own_len.is_none_or(|n| cached + RETRY_SLACK < n)
}

/// Tokens the chat template may put before the first message (a default system prompt, a
/// date line): allowed on top of a byte-counted prefix, which cannot see the template.
pub const TEMPLATE_HEAD_TOKENS: usize = 64;

/// A prompt as the ledger compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Units {
    /// Token ids, as the audit (or the target's tokenizer endpoint) counted them.
    Tokens(Vec<u32>),
    /// The prompt's bytes (no tokenizer): a shared prefix of `n` bytes is at most `n` tokens,
    /// plus the template's head for chat.
    Bytes { bytes: Vec<u8>, chat: bool },
}

impl Units {
    /// The prompt's length in tokens, when it was counted.
    pub fn tokens(&self) -> Option<usize> {
        match self {
            Units::Tokens(t) => Some(t.len()),
            Units::Bytes { .. } => None,
        }
    }

    /// The prompt of `body` as bytes: a completion's text, or each message's role and content
    /// (what every chat template renders, in order).
    pub fn bytes_of(body: &Value) -> Units {
        if let Some(p) = body.get("prompt").and_then(Value::as_str) {
            return Units::Bytes { bytes: p.as_bytes().to_vec(), chat: false };
        }
        let mut bytes = Vec::new();
        for m in body["messages"].as_array().into_iter().flatten() {
            bytes.push(0x1e);
            bytes.extend_from_slice(m["role"].as_str().unwrap_or_default().as_bytes());
            bytes.push(0x1f);
            bytes.extend_from_slice(m["content"].as_str().unwrap_or_default().as_bytes());
        }
        Units::Bytes { bytes, chat: true }
    }
}

/// Every tenant's prompts so far.
pub struct OwnPrefixes {
    by_tenant: Mutex<Vec<Vec<Units>>>,
}

/// One prompt recorded as sent: [`OwnPrefixes::allowed`] takes it once the answer is in.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    tenant: usize,
    index: usize,
}

impl OwnPrefixes {
    pub fn new(tenants: usize) -> Self {
        OwnPrefixes { by_tenant: Mutex::new(vec![Vec::new(); tenants]) }
    }

    /// Records that `tenant` sends `prompt` now.
    pub fn send(&self, tenant: usize, prompt: Units) -> Sent {
        let mut all = lock(&self.by_tenant);
        let index = match all.get_mut(tenant) {
            Some(mine) => {
                mine.push(prompt);
                mine.len() - 1
            }
            None => usize::MAX,
        };
        Sent { tenant, index }
    }

    /// How many cached tokens the answer to `sent` may report, asked once it is in: the
    /// longest prefix its prompt shares with any other prompt its tenant sent until now.
    pub fn allowed(&self, sent: Sent) -> usize {
        let all = lock(&self.by_tenant);
        let Some(mine) = all.get(sent.tenant) else { return 0 };
        let Some(prompt) = mine.get(sent.index) else { return 0 };
        mine.iter().enumerate().filter(|(i, _)| *i != sent.index).map(|(_, p)| shared(p, prompt)).max().unwrap_or(0)
    }
}

/// Tokens of `new`'s prefix that `old` can account for.
fn shared(old: &Units, new: &Units) -> usize {
    match (old, new) {
        (Units::Tokens(a), Units::Tokens(b)) => common(a, b),
        (Units::Bytes { bytes: a, .. }, Units::Bytes { bytes: b, chat }) => {
            // Every prompt of a chat tenant starts with the template's head, which the bytes
            // do not hold; plus one token a boundary may straddle.
            common(a, b) + if *chat { TEMPLATE_HEAD_TOKENS + 1 } else { 1 }
        }
        // The same tenant counted two ways (cannot happen within one model): be generous.
        _ => usize::MAX,
    }
}

fn common<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_hit_is_allowed_only_as_far_as_the_tenants_own_other_prompts_reach() {
        let l = OwnPrefixes::new(2);
        let send = |t: usize, ids: &[u32]| {
            let s = l.send(t, Units::Tokens(ids.to_vec()));
            l.allowed(s)
        };
        // Nothing else sent: no cached token is the tenant's own.
        assert_eq!(send(0, &[1, 2, 3, 4]), 0);
        assert_eq!(send(0, &[1, 2, 9]), 2);
        assert_eq!(send(0, &[1, 2, 3, 4, 5]), 4);
        // Another tenant's prompts never count for it.
        assert_eq!(send(1, &[1, 2, 3, 4, 5]), 0);
        // An unknown tenant may claim nothing.
        assert_eq!(send(7, &[1]), 0);
    }

    #[test]
    fn a_prompt_the_tenant_sent_while_the_answer_was_on_its_way_counts_as_its_own() {
        let l = OwnPrefixes::new(1);
        // Two requests sent together: the server may have taken the second one first.
        let first = l.send(0, Units::Tokens(vec![5, 6, 7, 8]));
        let second = l.send(0, Units::Tokens(vec![5, 6, 7, 9]));
        assert_eq!(l.allowed(first), 3);
        assert_eq!(l.allowed(second), 3);
    }

    #[test]
    fn a_hit_on_nearly_the_whole_prompt_is_the_requests_own_retry_and_anything_short_of_it_crosses() {
        assert!(!crosses(10, 10, Some(100)));
        assert!(crosses(11, 10, Some(100)));
        assert!(crosses(100 - RETRY_SLACK - 1, 0, Some(100)));
        assert!(!crosses(100 - RETRY_SLACK, 0, Some(100)));
        assert!(!crosses(99, 0, Some(100)));
        assert!(crosses(99, 0, None));
    }

    #[test]
    fn bytes_allow_the_template_head_for_chat_and_one_boundary_token() {
        let l = OwnPrefixes::new(1);
        let chat = |c: &str| Units::bytes_of(&json!({"messages": [{"role": "user", "content": c}]}));
        let first = l.send(0, chat("hello there"));
        assert_eq!(l.allowed(first), 0);
        let prefix = "\u{1e}user\u{1f}hello ".len();
        assert_eq!(l.allowed(l.send(0, chat("hello world"))), prefix + TEMPLATE_HEAD_TOKENS + 1);
        let l = OwnPrefixes::new(1);
        let raw = |p: &str| Units::bytes_of(&json!({"prompt": p}));
        assert_eq!(l.allowed(l.send(0, raw("abcdef"))), 0);
        assert_eq!(l.allowed(l.send(0, raw("abcxyz"))), 4);
    }
}
