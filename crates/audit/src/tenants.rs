//! The tenants file: the API keys the audit acts with.
//!
//! ```toml
//! [[tenants]]
//! name = "alice"
//! key = "pw-..."
//! ```
//!
//! A small reader for exactly this shape (array-of-tables entries with string values, comments,
//! basic and literal strings): the binary does not otherwise parse TOML, and a file of keys
//! should be strict anyway. Anything else is an error naming its line.

use std::path::Path;

use crate::error::AuditError;

/// Returns the file's problem (`line N: ...`); [`load`] names the file.
macro_rules! refuse {
    ($($why:tt)*) => {
        return Err(AuditError::Tenants { file: None, problem: format!($($why)*) })
    };
}

/// One tenant the audit acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKey {
    pub name: String,
    pub key: String,
}

/// A TOML string value: `"basic"` with escapes or `'literal'`, then only a comment.
fn parse_string(v: &str, line: usize) -> Result<String, AuditError> {
    let mut chars = v.chars();
    let quote = chars.next();
    let mut out = String::new();
    let rest: String;
    match quote {
        Some('\'') => {
            let body: String = chars.collect();
            let Some(end) = body.find('\'') else { refuse!("line {line}: unterminated string") };
            out.push_str(&body[..end]);
            rest = body[end + 1..].to_string();
        }
        Some('"') => {
            let mut closed = None;
            let body: Vec<char> = chars.collect();
            let mut i = 0;
            while i < body.len() {
                match body[i] {
                    '"' => {
                        closed = Some(i);
                        break;
                    }
                    '\\' => {
                        i += 1;
                        match body.get(i) {
                            Some('"') => out.push('"'),
                            Some('\\') => out.push('\\'),
                            Some('n') => out.push('\n'),
                            Some('t') => out.push('\t'),
                            Some('u') => {
                                let hex: String = body.iter().skip(i + 1).take(4).collect();
                                let c = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                                let Some(c) = c else { refuse!("line {line}: bad \\u escape") };
                                out.push(c);
                                i += 4;
                            }
                            _ => refuse!("line {line}: unsupported escape in string"),
                        }
                    }
                    c => out.push(c),
                }
                i += 1;
            }
            let Some(end) = closed else { refuse!("line {line}: unterminated string") };
            rest = body[end + 1..].iter().collect();
        }
        _ => refuse!("line {line}: expected a quoted string"),
    }
    let rest = rest.trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        refuse!("line {line}: unexpected text after the string");
    }
    Ok(out)
}

/// Parses the tenants file's text.
pub fn parse(text: &str) -> Result<Vec<TenantKey>, AuditError> {
    let mut tenants: Vec<(Option<String>, Option<String>, usize)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if l.starts_with('[') {
            let header = l.split('#').next().unwrap_or_default().trim();
            if header != "[[tenants]]" {
                refuse!("line {line}: only [[tenants]] entries are allowed, found {header}");
            }
            tenants.push((None, None, line));
            continue;
        }
        let Some((k, v)) = l.split_once('=') else { refuse!("line {line}: expected `key = \"value\"`") };
        let Some(entry) = tenants.last_mut() else { refuse!("line {line}: a value before the first [[tenants]]") };
        let k = k.trim().trim_matches('"');
        let v = parse_string(v.trim(), line)?;
        let slot = match k {
            "name" => &mut entry.0,
            "key" => &mut entry.1,
            other => refuse!("line {line}: unknown field `{other}` (a tenant has `name` and `key`)"),
        };
        if slot.is_some() {
            refuse!("line {line}: `{k}` given twice");
        }
        *slot = Some(v);
    }
    let mut out: Vec<TenantKey> = Vec::new();
    for (name, key, line) in tenants {
        let Some(name) = name.filter(|n| !n.is_empty()) else { refuse!("the tenant at line {line} has no `name`") };
        let Some(key) = key.filter(|k| !k.is_empty()) else { refuse!("tenant `{name}` (line {line}) has no `key`") };
        if out.iter().any(|t| t.name == name) {
            refuse!("tenant `{name}` appears twice");
        }
        if out.iter().any(|t| t.key == key) {
            refuse!("tenant `{name}` has the same key as another tenant: the audit needs distinct tenants");
        }
        out.push(TenantKey { name, key });
    }
    if out.is_empty() {
        refuse!("no [[tenants]] entries");
    }
    Ok(out)
}

pub fn load(path: &Path) -> Result<Vec<TenantKey>, AuditError> {
    let text = std::fs::read_to_string(path).map_err(AuditError::file("reading", path))?;
    parse(&text).map_err(|e| match e {
        AuditError::Tenants { problem, .. } => AuditError::Tenants { file: Some(path.to_path_buf()), problem },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tenants_with_comments_and_both_string_kinds() {
        let t = parse(
            "# keys for the audit\n[[tenants]]\nname = \"alice\" # first\nkey = \"pw-a\\u0041\"\n\n\
             [[tenants]] # second\n\"name\" = 'bob'\nkey='pw-b\\x'\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].name.as_str(), t[0].key.as_str()), ("alice", "pw-aA"));
        assert_eq!((t[1].name.as_str(), t[1].key.as_str()), ("bob", "pw-b\\x"));
    }

    #[test]
    fn refuses_what_it_does_not_understand() {
        for (text, msg) in [
            ("", "no [[tenants]]"),
            ("[tenants]\nname = \"a\"\n", "only [[tenants]]"),
            ("name = \"a\"\n", "before the first"),
            ("[[tenants]]\nname = \"a\"\n", "no `key`"),
            ("[[tenants]]\nkey = \"k\"\n", "no `name`"),
            ("[[tenants]]\nname = \"a\"\nkey = \"k\"\nkey_sha256 = \"x\"\n", "unknown field"),
            ("[[tenants]]\nname = \"a\"\nkey = \"k\"\n[[tenants]]\nname = \"b\"\nkey = \"k\"\n", "same key"),
            ("[[tenants]]\nname = \"a\"\nkey = \"k\"\n[[tenants]]\nname = \"a\"\nkey = \"j\"\n", "twice"),
            ("[[tenants]]\nname = a\n", "quoted string"),
            ("[[tenants]]\nname = \"a\" b\n", "after the string"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(msg), "{text:?}: {e}");
        }
    }
}
