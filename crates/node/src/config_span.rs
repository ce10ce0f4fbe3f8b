//! Ties config errors to the text they came from: the TOML reader's errors carry a byte span,
//! validation errors a dotted field path (`engine.max_running`, `tenants[2].id`). The file is
//! parsed a second time with `toml_edit`, which keeps every key's and value's span, to turn a
//! span into the field under it and a field into its line. A file `toml_edit` cannot parse
//! still gets its line and column from the reader's span, only without the field.

use std::ops::Range;
use std::path::Path;

use toml_edit::{ImDocument, Item, TableLike, Value};

use crate::config_error::{ConfigError, Location};

/// 1-based line and column (in characters) of the byte `offset` of `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}

/// The TOML reader's error, with the file, the line and column, and the field the span falls in.
pub(crate) fn parse_error(e: &toml::de::Error, text: &str, path: &str) -> ConfigError {
    let span = e.span();
    let (line, column) = match &span {
        Some(s) => {
            let (l, c) = line_col(text, s.start);
            (Some(l), Some(c))
        }
        None => (None, None),
    };
    let field = span.and_then(|s| {
        let doc = ImDocument::parse(text).ok()?;
        let mut path = String::new();
        field_in(doc.as_table(), s.start, &mut path).then_some(path).filter(|p| !p.is_empty())
    });
    ConfigError::Parse {
        at: Location { path: path.to_string(), line, column },
        field,
        message: e.message().trim_end().to_string(),
    }
}

/// `e` with the file and, when the field (or the table it belongs in) is written in `text`,
/// its line and column. Errors already located, and other kinds, are returned as they are.
pub(crate) fn locate(e: ConfigError, text: &str, path: &str) -> ConfigError {
    match e {
        ConfigError::Invalid { field, message, at: None } => {
            let span = ImDocument::parse(text).ok().and_then(|doc| span_of(doc.as_table(), &field));
            let (line, column) = match span {
                Some(s) => {
                    let (l, c) = line_col(text, s.start);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            ConfigError::Invalid { field, message, at: Some(Location { path: path.to_string(), line, column }) }
        }
        other => other,
    }
}

/// [`locate`] for an error found after loading: the file is read again, as a config keeps no
/// text (one edited since start-up is what the operator will open anyway). Unreadable now: the
/// error as it was.
pub(crate) fn locate_in_file(e: ConfigError, path: &Path) -> ConfigError {
    match std::fs::read_to_string(path) {
        Ok(text) => locate(e, &text, &path.display().to_string()),
        Err(_) => e,
    }
}

fn contains(span: Option<Range<usize>>, offset: usize) -> bool {
    span.is_some_and(|s| s.contains(&offset))
}

/// Appends to `path` the dotted path of the deepest key or value of `table` whose span holds
/// `offset`; false (and `path` as it was) when none does.
fn field_in(table: &dyn TableLike, offset: usize, path: &mut String) -> bool {
    for (name, item) in table.iter() {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(name);
        let key_span = table.get_key_value(name).and_then(|(k, _)| k.span());
        if field_of_item(item, offset, path) || contains(key_span, offset) {
            return true;
        }
        path.truncate(len);
    }
    false
}

fn field_of_item(item: &Item, offset: usize, path: &mut String) -> bool {
    match item {
        Item::None => false,
        // A table's span runs from its header to its last value: the children first, so the
        // deepest field wins and a `missing field` error lands on the table itself.
        Item::Table(t) => field_in(t, offset, path) || contains(t.span(), offset),
        Item::ArrayOfTables(a) => a.iter().enumerate().any(|(i, t)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let hit = field_in(t, offset, path) || contains(t.span(), offset);
            if !hit {
                path.truncate(len);
            }
            hit
        }),
        Item::Value(v) => field_of_value(v, offset, path),
    }
}

fn field_of_value(v: &Value, offset: usize, path: &mut String) -> bool {
    match v {
        Value::InlineTable(t) => field_in(t, offset, path) || contains(v.span(), offset),
        Value::Array(a) => {
            let inner = a.iter().enumerate().any(|(i, e)| {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let hit = field_of_value(e, offset, path);
                if !hit {
                    path.truncate(len);
                }
                hit
            });
            inner || contains(v.span(), offset)
        }
        _ => contains(v.span(), offset),
    }
}

/// The span of `field` (`a.b`, `tenants[2].id`) in `root`: its key when written, else the
/// nearest enclosing table or key that is (a missing `tenants[0].id` points at its
/// `[[tenants]]`).
fn span_of(root: &dyn TableLike, field: &str) -> Option<Range<usize>> {
    let mut table = root;
    let mut best = None;
    for segment in field.split('.') {
        let (name, index) = match segment.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        let Some((key, item)) = table.get_key_value(name) else { break };
        best = key.span().or_else(|| item.span()).or(best);
        let item_table = match (index, item) {
            (None, _) => item.as_table_like(),
            (Some(i), Item::ArrayOfTables(a)) => a.get(i).map(|t| {
                best = t.span().or(best.clone());
                t as &dyn TableLike
            }),
            (Some(i), Item::Value(Value::Array(a))) => a.get(i).and_then(|v| {
                best = v.span().or(best.clone());
                v.as_inline_table().map(|t| t as &dyn TableLike)
            }),
            (Some(_), _) => None,
        };
        match item_table {
            Some(t) => table = t,
            None => break,
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use crate::config::{Chain, Config, ConfigError};

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("pw-span-{}-{name}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    fn load_err(name: &str, text: &str) -> String {
        let p = file(name, text);
        let e = Config::load(&p).err().unwrap();
        std::fs::remove_file(&p).unwrap();
        Chain(&e).to_string()
    }

    #[test]
    fn a_value_of_the_wrong_type_names_file_line_column_and_field() {
        let e = load_err("threads", "listen = \"127.0.0.1:8080\"\nthreads = \"two\"\n");
        for words in ["pw-span-", "threads.toml", "line 2, column 11", "config field `threads`", "expected usize"] {
            assert!(e.contains(words), "{e} does not say {words:?}");
        }
        let e = load_err("engine", "[engine]\nmax_running = 4\nmax_queued = \"many\"\n");
        assert!(e.contains("line 3, column 14") && e.contains("`engine.max_queued`"), "{e}");
        let key = "ab".repeat(32);
        let e = load_err(
            "tenant",
            &format!(
                "[[tenants]]\nid = 1\nname = \"a\"\nkey_sha256 = \"{key}\"\n\n[[tenants]]\nid = 2\nname = \"b\"\n\
                 key_sha256 = \"{key}\"\nmax_concurrent = -1\n"
            ),
        );
        assert!(e.contains("line 10") && e.contains("`tenants[1].max_concurrent`"), "{e}");
        let e = load_err("unknown", "[limits]\nmax_body_byte = 1\n");
        assert!(e.contains("line 2, column 1") && e.contains("`limits.max_body_byte`"), "{e}");
    }

    #[test]
    fn a_missing_file_says_its_os_error_once() {
        let p = std::env::temp_dir().join(format!("pw-span-{}-absent.toml", std::process::id()));
        let e = Config::load(&p).err().unwrap();
        assert!(matches!(e, ConfigError::Read { .. }));
        let text = Chain(&e).to_string();
        assert!(text.contains("absent.toml"), "{text}");
        assert_eq!(text.matches("os error 2").count(), 1, "{text}");
    }

    #[test]
    fn a_value_validation_refuses_names_file_line_and_field() {
        let e = load_err("page", "listen = \"127.0.0.1:8080\"\n[pool]\npage_size = 0\n");
        for words in ["page.toml", "line 3, column 1", "config field `pool.page_size`", "at least 1"] {
            assert!(e.contains(words), "{e} does not say {words:?}");
        }
        // A missing field points at the table it belongs in.
        let e = load_err(
            "noid",
            "\n[[tenants]]\nname = \"a\"\nkey_sha256 = \"{}\"\n".replace("{}", &"ab".repeat(32)).as_str(),
        );
        assert!(e.contains("line 2") && e.contains("`tenants[0].id`"), "{e}");
        // Found when a role starts, long after parsing: located from the file the config came from.
        let p = file("trusted", "[cluster]\nname = \"w\"\ntrusted_nodes = []\n");
        let c = Config::load(&p).unwrap();
        let e = super::locate_in_file(c.cluster.trusted_identities().err().unwrap(), &p).to_string();
        std::fs::remove_file(&p).unwrap();
        for words in ["trusted.toml", "line 3, column 1", "cluster.trusted_nodes", "is empty"] {
            assert!(e.contains(words), "{e} does not say {words:?}");
        }
    }

    #[test]
    fn lines_and_columns_count_from_one_in_characters() {
        assert_eq!(super::line_col("a\nbé = 1", 0), (1, 1));
        assert_eq!(super::line_col("a\nbé = 1", 2), (2, 1));
        assert_eq!(super::line_col("a\nbé = 1", 5), (2, 3));
    }
}
