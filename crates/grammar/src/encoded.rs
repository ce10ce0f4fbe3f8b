//! An output format as it travels between nodes: a bounded string, opaque to the message that
//! carries it. A tenant's schema is the one part of a control message whose shape the tenant
//! picks; carried as a value, a schema nested near serde_json's depth limit made the whole
//! message undecodable one level up, and the link that carried it (every other tenant's routes
//! on it) ended. As a string it adds one level to the message whatever it holds, and a string
//! that does not decode fails only the route that carries it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{GrammarError, OutputFormat};

/// The deepest JSON nesting a schema (a `response_format` schema, or one tool's `parameters`)
/// may have. Real schemas sit far below (an object ten levels deep is about 21); the bound
/// keeps every wrapper the format travels in (the tools' call schema, the format itself, a
/// Lark `%json` block) well inside serde_json's recursion limit of 128 everywhere it is read.
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// The most bytes an output format may take, encoded: a schema, or all offered tools' schemas
/// together in their call grammar.
pub const MAX_FORMAT_BYTES: usize = 256 * 1024;

/// The JSON nesting depth of `v` (a scalar is 1, `[]` or `{}` is 1, `[[]]` is 2), counted
/// without recursion.
pub fn depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// The deepest a format's schema may be once the server wrapped a client's schema (a tool's
/// `parameters` sit four levels down in the call schema).
const MAX_FORMAT_DEPTH: usize = MAX_SCHEMA_DEPTH + 8;

/// Refuses a client's schema deeper than [`MAX_SCHEMA_DEPTH`].
pub fn check_schema_depth(schema: &Value) -> Result<(), GrammarError> {
    check_depth(schema, MAX_SCHEMA_DEPTH)
}

fn check_depth(schema: &Value, max: usize) -> Result<(), GrammarError> {
    let d = depth(schema);
    if d > max {
        return Err(GrammarError::TooLarge(format!("the schema nests {d} levels deep; at most {max} are allowed")));
    }
    Ok(())
}

/// An [`OutputFormat`] encoded for a control message: at most [`MAX_FORMAT_BYTES`], its
/// schemas within [`MAX_SCHEMA_DEPTH`]. Only [`EncodedFormat::encode`] builds one on the
/// sending side; a received one is checked again by [`EncodedFormat::decode`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EncodedFormat(String);

impl EncodedFormat {
    pub fn encode(format: &OutputFormat) -> Result<EncodedFormat, GrammarError> {
        format.check_bounds()?;
        let text = serde_json::to_string(format).map_err(|e| GrammarError::TooLarge(e.to_string()))?;
        if text.len() > MAX_FORMAT_BYTES {
            return Err(GrammarError::TooLarge(format!(
                "the output format takes {} bytes; at most {MAX_FORMAT_BYTES} are allowed",
                text.len()
            )));
        }
        Ok(EncodedFormat(text))
    }

    /// The format, or why it cannot be one (its sender's fault: the route fails, nothing else).
    pub fn decode(&self) -> Result<OutputFormat, GrammarError> {
        if self.0.len() > MAX_FORMAT_BYTES {
            return Err(GrammarError::TooLarge(format!(
                "the output format takes {} bytes; at most {MAX_FORMAT_BYTES} are allowed",
                self.0.len()
            )));
        }
        let format: OutputFormat = serde_json::from_str(&self.0)
            .map_err(|e| GrammarError::Compile(format!("undecodable output format: {e}")))?;
        format.check_bounds()?;
        Ok(format)
    }

    /// The encoded bytes (a cache key: two routes with equal bytes compile to the same grammar).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// A string as a peer could send it; only [`EncodedFormat::decode`] says whether it is one.
    pub fn from_wire(text: String) -> EncodedFormat {
        EncodedFormat(text)
    }
}

impl OutputFormat {
    /// A JSON schema's depth within [`MAX_SCHEMA_DEPTH`] and the server's wrapping; a Lark
    /// grammar's size within [`MAX_FORMAT_BYTES`] (its `%json` blocks were checked as schemas
    /// before they were embedded).
    pub fn check_bounds(&self) -> Result<(), GrammarError> {
        match self {
            OutputFormat::JsonObject => Ok(()),
            OutputFormat::JsonSchema { schema } => check_depth(schema, MAX_FORMAT_DEPTH),
            OutputFormat::Lark { grammar } if grammar.len() > MAX_FORMAT_BYTES => Err(GrammarError::TooLarge(format!(
                "the grammar takes {} bytes; at most {MAX_FORMAT_BYTES} are allowed",
                grammar.len()
            ))),
            OutputFormat::Lark { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn nested(levels: usize) -> Value {
        let mut v = json!(0);
        for _ in 1..levels {
            v = Value::Array(vec![v]);
        }
        v
    }

    #[test]
    fn depth_counts_every_level_of_arrays_and_objects() {
        assert_eq!(depth(&json!(1)), 1);
        assert_eq!(depth(&json!([])), 1);
        assert_eq!(depth(&json!({"a": [1]})), 3);
        assert_eq!(depth(&nested(100)), 100);
    }

    #[test]
    fn a_schema_at_the_depth_limit_travels_and_one_more_level_is_refused() {
        let at = json!({"type": "string", "default": nested(MAX_SCHEMA_DEPTH - 1)});
        assert_eq!(depth(&at), MAX_SCHEMA_DEPTH);
        let f = OutputFormat::JsonSchema { schema: at };
        assert_eq!(EncodedFormat::encode(&f).unwrap().decode().unwrap(), f);
        let over = json!({"type": "string", "default": nested(MAX_SCHEMA_DEPTH)});
        assert!(matches!(check_schema_depth(&over), Err(GrammarError::TooLarge(_))));
        // A server's wrapping of a schema at the limit still travels; far beyond it, nothing does.
        let wrapped = OutputFormat::JsonSchema { schema: json!({"anyOf": [{"properties": {"arguments": over}}]}) };
        assert!(EncodedFormat::encode(&wrapped).is_ok());
        let far = OutputFormat::JsonSchema { schema: nested(MAX_FORMAT_DEPTH + 1) };
        assert!(matches!(EncodedFormat::encode(&far), Err(GrammarError::TooLarge(_))));
    }

    #[test]
    fn a_received_format_is_checked_again_and_garbage_is_an_error_not_a_panic() {
        // Deeper than serde_json reads at all, and deeper than we accept.
        let deep = format!("{{\"kind\":\"json_schema\",\"schema\":{}0{}}}", "[".repeat(200), "]".repeat(200));
        assert!(EncodedFormat::from_wire(deep).decode().is_err());
        let over = serde_json::to_string(&OutputFormat::JsonSchema { schema: nested(MAX_FORMAT_DEPTH + 1) }).unwrap();
        assert!(matches!(EncodedFormat::from_wire(over).decode(), Err(GrammarError::TooLarge(_))));
        assert!(EncodedFormat::from_wire("not json".into()).decode().is_err());
        let big = OutputFormat::Lark { grammar: "x".repeat(MAX_FORMAT_BYTES + 1) };
        assert!(EncodedFormat::encode(&big).is_err());
        assert!(EncodedFormat::from_wire(serde_json::to_string(&big).unwrap()).decode().is_err());
    }
}
