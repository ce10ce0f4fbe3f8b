//! How a client's JSON schema is read before it is compiled, where the JSON Schema default is
//! not what a client of an inference server means.
//!
//! - **Compact JSON.** No free whitespace between tokens unless the schema asks for it: a small
//!   model offered "any whitespace" can spend its whole budget on newlines.
//! - **Closed objects.** An object schema that lists `properties` and says nothing of
//!   `additionalProperties` admits no other keys, as llama.cpp's schema-to-grammar conversion
//!   reads it (JSON Schema itself would admit any key). Left open, a small model asked for a
//!   tool call's arguments invents key after key until `max_tokens` and never closes the
//!   object. A schema that wants other keys says so (`"additionalProperties": true` or a schema).

use serde_json::{json, Value};

/// The schema as it is compiled: compact and with closed objects (see the module doc). Public
/// for schemas embedded in a Lark grammar (`%json`), which do not pass through
/// [`crate::OutputFormat::JsonSchema`].
pub fn compact(mut schema: Value) -> Value {
    close_objects(&mut schema);
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    schema
}

/// Keywords whose value is one schema.
const ONE: &[&str] = &[
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "not",
    "contains",
    "if",
    "then",
    "else",
    "propertyNames",
];
/// Keywords whose value is an array of schemas.
const LIST: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems", "items"];
/// Keywords whose value maps names to schemas (the names are not schemas: a property called
/// `properties` must not be read as a keyword).
const NAMED: &[&str] = &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];

/// Closes every object schema in `schema` that lists properties and is silent about others.
/// Recursion follows the schema keywords only, so it is as deep as the schema's nesting, which
/// the gateway bounds (`crate::MAX_SCHEMA_DEPTH`).
fn close_objects(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    if o.contains_key("properties") && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in o.iter_mut() {
        let key = key.as_str();
        match value {
            Value::Object(_) if ONE.contains(&key) => close_objects(value),
            Value::Array(items) if LIST.contains(&key) => items.iter_mut().for_each(close_objects),
            Value::Object(named) if NAMED.contains(&key) => named.values_mut().for_each(close_objects),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_with_properties_is_closed_unless_it_says_otherwise_at_every_level() {
        let s = compact(json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
                "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
                "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": true},
                "properties": {"type": "object", "properties": {"x": {}}}
            },
            "anyOf": [{"properties": {"y": {}}}],
            "$defs": {"d": {"properties": {"z": {}}}}
        }));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["where"]["additionalProperties"], false);
        assert_eq!(s["properties"]["tags"]["items"]["additionalProperties"], false);
        assert_eq!(s["properties"]["open"]["additionalProperties"], true);
        // A property named `properties` is a schema, not a keyword: closed, and the map of
        // properties itself gains no key.
        assert_eq!(s["properties"]["properties"]["additionalProperties"], false);
        assert!(s["properties"].get("additionalProperties").is_none());
        assert_eq!(s["anyOf"][0]["additionalProperties"], false);
        assert_eq!(s["$defs"]["d"]["additionalProperties"], false);
        assert_eq!(s["x-guidance"], json!({"whitespace_flexible": false}));
    }

    #[test]
    fn schemas_without_properties_are_left_as_they_are() {
        let s = compact(json!({"type": "object"}));
        assert!(s.get("additionalProperties").is_none());
        let s = compact(json!({"type": "object", "additionalProperties": {"type": "integer"}, "properties": {}}));
        assert_eq!(s["additionalProperties"], json!({"type": "integer"}));
    }
}
