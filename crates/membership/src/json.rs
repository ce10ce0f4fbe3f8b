//! The gateway's JSON shapes, read leniently where etcd is lenient: protobuf's JSON mapping
//! writes int64 as strings ("revision":"2") and leaves out fields at their default (no `kvs`
//! in an empty range, no `TTL` for a lease that is gone), so every field here has a default
//! and every integer accepts a string or a number. Keys and values are base64 (standard).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Deserializer};

pub(crate) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

pub(crate) fn unb64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    STANDARD.decode(text)
}

/// The end of the range holding every key that starts with `prefix` (etcd's own rule, as
/// `clientv3.GetPrefixRangeEnd`): the prefix with its last byte below 0xff incremented and
/// what follows dropped; all keys ("\0") when there is no such byte.
pub(crate) fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// An int64 as the gateway writes it: a string, a number, or absent / null (0).
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Lenient {
        Number(i64),
        Text(String),
        Null(()),
    }
    match Lenient::deserialize(d)? {
        Lenient::Number(n) => Ok(n),
        Lenient::Text(s) => s.trim().parse().map_err(serde::de::Error::custom),
        Lenient::Null(()) => Ok(0),
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Header {
    #[serde(default, deserialize_with = "int64")]
    pub revision: i64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct GrantResponse {
    #[serde(rename = "ID", default, deserialize_with = "int64")]
    pub id: i64,
    #[serde(default)]
    pub error: String,
}

/// One message of a streamed answer (keep-alive, watch): a result or an error.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamLine<T> {
    pub result: Option<T>,
    pub error: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct KeepAliveResult {
    #[serde(rename = "TTL", default, deserialize_with = "int64")]
    pub ttl: i64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Kv {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub value: String,
    #[serde(default, deserialize_with = "int64")]
    pub mod_revision: i64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RangeResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub kvs: Vec<Kv>,
    #[serde(default)]
    pub more: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WatchResult {
    #[serde(default)]
    pub created: bool,
    #[serde(default)]
    pub canceled: bool,
    #[serde(default, deserialize_with = "int64")]
    pub compact_revision: i64,
    #[serde(default)]
    pub cancel_reason: String,
    #[serde(default)]
    pub events: Vec<WatchEvent>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WatchEvent {
    /// "PUT" is the default and so is left out; "DELETE" otherwise.
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub kv: Kv,
}

/// etcd's message out of an error body (`{"error": "...", "message": "...", "code": 5}`, or a
/// stream's `{"error": {"message": ...}}`), else the text itself, cut short.
pub(crate) fn error_message(body: &[u8]) -> String {
    let value: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    value.as_ref().and_then(message_of).unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        match text.char_indices().nth(200) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text.to_string(),
        }
    })
}

/// The message in an error value: `message`, else `error` (a string or an object holding one).
pub(crate) fn message_of(v: &serde_json::Value) -> Option<String> {
    if let Some(s) = v.as_str() {
        return Some(s.to_string());
    }
    let m = v.get("message").and_then(serde_json::Value::as_str).filter(|s| !s.is_empty());
    m.map(str::to_string).or_else(|| v.get("error").and_then(message_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_come_as_strings_or_numbers_or_not_at_all() {
        let g: GrantResponse = serde_json::from_str(r#"{"ID":"7587899334887988999","TTL":"3"}"#).expect("grant");
        assert_eq!(g.id, 7587899334887988999);
        let k: KeepAliveResult = serde_json::from_str(r#"{"ID":"1","TTL":3}"#).expect("keepalive");
        assert_eq!(k.ttl, 3);
        let k: KeepAliveResult = serde_json::from_str(r#"{"ID":"1"}"#).expect("keepalive");
        assert_eq!(k.ttl, 0);
        let r: RangeResponse = serde_json::from_str(r#"{"header":{"revision":"2"}}"#).expect("range");
        assert_eq!((r.header.revision, r.kvs.len()), (2, 0));
        assert!(serde_json::from_str::<Header>(r#"{"revision":"x"}"#).is_err());
    }

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(prefix_range_end(b"/a/"), b"/a0");
        assert_eq!(prefix_range_end(b"a\xff"), b"b");
        assert_eq!(prefix_range_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_range_end(b""), b"\0");
    }

    #[test]
    fn error_messages_are_etcds_own() {
        let body = br#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#;
        assert_eq!(error_message(body), "etcdserver: requested lease not found");
        let stream = br#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}}"#;
        assert_eq!(error_message(stream), "etcdserver: no leader");
        assert_eq!(error_message(b"plain text\n"), "plain text");
    }
}
