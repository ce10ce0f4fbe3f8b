//! The one definition of a cross-tenant cache hit, used in every phase: a reported
//! `cached_tokens` beyond the longest prefix the tenant itself sent before.
//!
//! A tenant's own cache, and the chat template's head it sent itself, never count; anything
//! more is KV the tenant did not compute, whoever computed it. The audit keeps, per tenant,
//! every prompt it sent (as token ids when it can count them, else as bytes of its text), and
//! asks, before each request leaves, how far the longest of them agrees with the new one.
//!
//! "Before" is when the request is sent, not when an earlier one finished: a request in
//! flight may already have filled the cache its tenant's next one hits.

use std::sync::Mutex;

use serde_json::Value;

use crate::sync::lock;

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

impl OwnPrefixes {
    pub fn new(tenants: usize) -> Self {
        OwnPrefixes { by_tenant: Mutex::new(vec![Vec::new(); tenants]) }
    }

    /// Records that `tenant` sends `prompt` now; returns how many cached tokens its answer may
    /// report: the longest prefix it shares with any prompt the tenant sent before.
    pub fn send(&self, tenant: usize, prompt: Units) -> usize {
        let mut all = lock(&self.by_tenant);
        let Some(mine) = all.get_mut(tenant) else { return 0 };
        let allowed = mine.iter().map(|p| shared(p, &prompt)).max().unwrap_or(0);
        mine.push(prompt);
        allowed
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
    fn a_hit_is_allowed_only_as_far_as_the_tenants_own_earlier_prompts_reach() {
        let l = OwnPrefixes::new(2);
        // Nothing sent before: no cached token is the tenant's own.
        assert_eq!(l.send(0, Units::Tokens(vec![1, 2, 3, 4])), 0);
        assert_eq!(l.send(0, Units::Tokens(vec![1, 2, 9])), 2);
        assert_eq!(l.send(0, Units::Tokens(vec![1, 2, 3, 4, 5])), 4);
        // Another tenant's prompts never count for it.
        assert_eq!(l.send(1, Units::Tokens(vec![1, 2, 3, 4, 5])), 0);
        // An unknown tenant may claim nothing.
        assert_eq!(l.send(7, Units::Tokens(vec![1])), 0);
    }

    #[test]
    fn bytes_allow_the_template_head_for_chat_and_one_boundary_token() {
        let l = OwnPrefixes::new(1);
        let chat = |c: &str| Units::bytes_of(&json!({"messages": [{"role": "user", "content": c}]}));
        assert_eq!(l.send(0, chat("hello there")), 0);
        let prefix = "\u{1e}user\u{1f}hello ".len();
        assert_eq!(l.send(0, chat("hello world")), prefix + TEMPLATE_HEAD_TOKENS + 1);
        let l = OwnPrefixes::new(1);
        let raw = |p: &str| Units::bytes_of(&json!({"prompt": p}));
        assert_eq!(l.send(0, raw("abcdef")), 0);
        assert_eq!(l.send(0, raw("abcxyz")), 4);
    }
}
