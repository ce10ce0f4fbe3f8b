//! JSON that keeps its keys in the order they were written, and the template value it becomes.
//!
//! llama.cpp hands templates `nlohmann::ordered_json`, so a tool's schema or a call's arguments
//! reach the prompt (through `tojson` or a loop over `items()`) key by key in request order.
//! `serde_json::Value` and minijinja's own maps sort their keys, which would reorder every schema;
//! [`Json`] and [`JsonMap`] keep the order. [`JsonMap`] also records which keys a template read,
//! which is how llama.cpp decides what a template supports (see `caps.rs`).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value whose objects keep their keys in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    /// Keys in document order (a repeated key keeps its first place and its last value, as in
    /// nlohmann's ordered_json).
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parses JSON text, keeping object keys in order.
    pub fn parse(text: &str) -> Result<Json, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// An empty object, `{}`.
    pub fn empty_object() -> Json {
        Json::Object(Vec::new())
    }

    /// The template value: objects become [`JsonMap`]s so their order survives.
    pub(crate) fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::from(()),
            Json::Bool(b) => Value::from(*b),
            Json::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::from(i)
                } else if let Some(u) = n.as_u64() {
                    Value::from(u)
                } else {
                    Value::from(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Json::String(s) => Value::from(s.as_str()),
            Json::Array(items) => Value::from(items.iter().map(Json::to_value).collect::<Vec<_>>()),
            Json::Object(entries) => JsonMap::value(entries.iter().map(|(k, v)| (k.clone(), v.to_value())).collect()),
        }
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Json, E> {
        Ok(Json::Number(i.into()))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Json, E> {
        Ok(Json::Number(u.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(f).map(Json::Number).ok_or_else(|| E::custom("a number that is not finite"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries: Vec<(String, Json)> = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            match entries.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => entries.push((k, v)),
            }
        }
        Ok(Json::Object(entries))
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

/// A template map that keeps insertion order and remembers which keys were read.
#[derive(Debug)]
pub(crate) struct JsonMap {
    entries: Vec<(String, Value)>,
    read: Vec<AtomicBool>,
}

impl JsonMap {
    pub(crate) fn value(entries: Vec<(String, Value)>) -> Value {
        let read = entries.iter().map(|_| AtomicBool::new(false)).collect();
        Value::from_object(JsonMap { entries, read })
    }

    /// The value at `key`, without marking it read (for the probes' own bookkeeping).
    pub(crate) fn peek(&self, key: &str) -> Option<Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    /// Whether the template looked `key` up (attribute, subscript, `items()`, `tojson`).
    pub(crate) fn was_read(&self, key: &str) -> bool {
        self.entries.iter().zip(&self.read).any(|((k, _), r)| k == key && r.load(Ordering::Relaxed))
    }
}

impl Object for JsonMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        if let Some(r) = self.read.get(i) {
            r.store(true, Ordering::Relaxed);
        }
        self.entries.get(i).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.entries.iter().map(|(k, _)| Value::from(k.as_str())).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_document_order() {
        let j = Json::parse(r#"{"z": 1, "a": [true, null, 1.5], "m": {"y": "s", "b": 2}}"#).expect("parses");
        let Json::Object(entries) = &j else { panic!("object") };
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a", "m"]);
        let v = j.to_value();
        let keys: Vec<String> = v.try_iter().expect("iterable").map(|k| k.to_string()).collect();
        assert_eq!(keys, ["z", "a", "m"]);
    }
}
