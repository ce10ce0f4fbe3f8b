//! The functions, filters and Python methods templates call, each as llama.cpp's Jinja engine
//! (common/jinja) defines it where that differs from minijinja's, so output matches byte for byte.

use std::time::SystemTime;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use super::clock::strftime;
use crate::TextError;

/// The message `raise_exception` was called with, carried through minijinja as an error source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

pub(super) fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception called").with_source(Raised(msg)))
}

/// A render failure as the crate's error: the template's own rejection keeps its message.
pub(super) fn map_render_error(e: Error) -> TextError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return TextError::TemplateRaised(r.0.clone());
        }
        src = s.source();
    }
    TextError::TemplateRender(e)
}

/// `strftime_now(format)` bound to one instant: llama.cpp's builtin reads the clock once per
/// render (`context::current_time`); binding it per render lets a conversation pin it.
pub(super) fn strftime_now(now: SystemTime) -> Value {
    Value::from_function(move |format: &str| strftime(now, format))
}

/// `tojson` as llama.cpp writes it (value.cpp, value_to_json_internal): Python's separators
/// (`", "` and `": "`, or `","` between items when indenting), keys in insertion order, only
/// `"`, `\` and control characters escaped (non-ASCII kept, unless `ensure_ascii=true`),
/// numbers as a C++ stream prints them. Python's `json.dumps` would escape non-ASCII and print
/// `1.0` for a float; llama.cpp does neither, and it is the reference.
pub(super) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<i64> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    if kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson sort_keys=true is not supported (nor by llama.cpp)",
        ));
    }
    kwargs.assert_all_used()?;
    let indent = indent.and_then(|i| usize::try_from(i).ok());
    let seps = separators.unwrap_or_default();
    let item_sep = seps.first().cloned().unwrap_or_else(|| if indent.is_some() { "," } else { ", " }.to_string());
    let key_sep = seps.get(1).cloned().unwrap_or_else(|| ": ".to_string());
    let mut out = String::new();
    Writer { indent, item_sep: &item_sep, key_sep: &key_sep }.write(&mut out, &value, 0)?;
    if ensure_ascii.unwrap_or(false) {
        out = escape_non_ascii(&out);
    }
    Ok(Value::from_safe_string(out))
}

struct Writer<'a> {
    /// `None`: one line; `Some(n)`: a newline per item, `n` spaces per level (`Some(0)`:
    /// newlines without indentation, as Python and llama.cpp do for `indent=0`).
    indent: Option<usize>,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Writer<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }

    fn write(&self, out: &mut String, v: &Value, level: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => match v.as_i64() {
                Some(i) if v.is_integer() => out.push_str(&i.to_string()),
                _ => out.push_str(&cpp_double(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
            },
            ValueKind::String => write_string(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, '[', ']', &items, level, |w, out, item| w.write(out, item, level + 1))?;
            }
            ValueKind::Map => {
                let keys: Vec<Value> = v.try_iter()?.collect();
                self.container(out, '{', '}', &keys, level, |w, out, key| {
                    write_string(out, &key.as_str().map_or_else(|| key.to_string(), str::to_string));
                    out.push_str(w.key_sep);
                    w.write(out, &v.get_item(key)?, level + 1)
                })?;
            }
            _ => out.push_str("null"),
        }
        Ok(())
    }

    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        items: &[Value],
        level: usize,
        mut each: impl FnMut(&Self, &mut String, &Value) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if !items.is_empty() {
            for (i, item) in items.iter().enumerate() {
                self.newline(out, level + 1);
                each(self, out, item)?;
                if i + 1 < items.len() {
                    out.push_str(self.item_sep);
                }
            }
            self.newline(out, level);
        }
        out.push(close);
        Ok(())
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `ensure_ascii`: every non-ASCII character as `\uXXXX` (UTF-16 surrogate pairs above
/// the BMP). Only strings can hold non-ASCII, so escaping the finished text is the same.
fn escape_non_ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// A double as `std::ostream << double` prints it: `%g` with six significant digits.
fn cpp_double(f: f64) -> String {
    if f.is_nan() {
        return if f.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-inf" } else { "inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // The exponent after rounding to six significant digits decides the style, as in C.
    let sci = format!("{f:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trim(&format!("{f:.decimals$}"))
    }
}

fn str_arg(args: &[Value], i: usize) -> Option<&str> {
    args.get(i).and_then(|v| v.as_str())
}

/// The Python `str`/`dict` methods chat templates written for HF transformers commonly call.
pub(super) fn python_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let unknown = || Err(Error::from(ErrorKind::UnknownMethod));
    match value.kind() {
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            let chars: Option<Vec<char>> = str_arg(args, 0).map(|c| c.chars().collect());
            let strip_set = |c: char| match &chars {
                Some(set) => set.contains(&c),
                None => c.is_whitespace(),
            };
            Ok(match method {
                "strip" => Value::from(s.trim_matches(strip_set)),
                "lstrip" => Value::from(s.trim_start_matches(strip_set)),
                "rstrip" => Value::from(s.trim_end_matches(strip_set)),
                "startswith" => Value::from(str_arg(args, 0).is_some_and(|p| s.starts_with(p))),
                "endswith" => Value::from(str_arg(args, 0).is_some_and(|p| s.ends_with(p))),
                "upper" => Value::from(s.to_uppercase()),
                "lower" => Value::from(s.to_lowercase()),
                "title" | "capitalize" | "replace" | "split" => state.apply_filter(
                    method,
                    &std::iter::once(value.clone()).chain(args.iter().cloned()).collect::<Vec<_>>(),
                )?,
                "join" => state.apply_filter("join", &[args.first().cloned().unwrap_or_default(), value.clone()])?,
                _ => return unknown(),
            })
        }
        ValueKind::Map => match method {
            "items" => state.apply_filter("items", std::slice::from_ref(value)),
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => {
                let vals: Result<Vec<Value>, Error> = value.try_iter()?.map(|k| value.get_item(&k)).collect();
                Ok(Value::from(vals?))
            }
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() { args.get(1).cloned().unwrap_or(Value::from(())) } else { v })
            }
            _ => unknown(),
        },
        _ => unknown(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_print_as_a_cpp_stream_does() {
        for (f, s) in [
            (18.5, "18.5"),
            (0.1, "0.1"),
            (1e20, "1e+20"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (100000.0, "100000"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(cpp_double(f), s, "{f}");
        }
    }

    #[test]
    fn ensure_ascii_escapes_utf16_units() {
        assert_eq!(escape_non_ascii("\"é😀\""), "\"\\u00e9\\ud83d\\ude00\"");
    }
}
