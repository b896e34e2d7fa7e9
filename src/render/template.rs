//! The chat-template environment: minijinja configured the way Hugging Face
//! renders templates (`trim_blocks`, `lstrip_blocks`, loop controls), plus the
//! Python-compatible helpers HF templates call.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};

use super::RenderError;

pub(crate) const TEMPLATE_NAME: &str = "chat";

/// Builds an environment holding the compiled template. Fails if the template
/// does not compile, so a server never starts with a broken template.
pub(crate) fn build_env(source: String) -> Result<Environment<'static>, RenderError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE_NAME, source)
        .map_err(|e| RenderError::TemplateCompile(format_error(&e)))?;
    Ok(env)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    chrono::Local::now().format(&format).to_string()
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=..., sort_keys=...)`
/// as transformers exposes it: `", "` and `": "` separators without indent,
/// no HTML escaping (minijinja's built-in `tojson` escapes `<`, `>`, `&`, `'`).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let json = if sort_keys.unwrap_or(false) {
        sort_json_keys(json)
    } else {
        json
    };
    let indent = match indent {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(
            usize::try_from(v)
                .map_err(|_| Error::new(ErrorKind::InvalidOperation, "indent must be an int"))?,
        ),
        None => None,
    };
    let (item_sep, key_sep) = match separators {
        Some(seps) if !seps.is_none() && !seps.is_undefined() => {
            let a = seps.get_item(&Value::from(0))?;
            let b = seps.get_item(&Value::from(1))?;
            (
                a.as_str().unwrap_or(",").to_string(),
                b.as_str().unwrap_or(":").to_string(),
            )
        }
        _ => {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        }
    };
    let mut out = String::new();
    write_py_json(&json, indent, 0, &item_sep, &key_sep, &mut out);
    Ok(Value::from_safe_string(out))
}

fn sort_json_keys(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_json_keys(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_json_keys).collect())
        }
        other => other,
    }
}

/// Writes JSON the way Python's `json.dumps(..., ensure_ascii=False)` does.
pub(crate) fn write_py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    depth: usize,
    item_sep: &str,
    key_sep: &str,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                out.push_str(&py_float(f));
            } else {
                out.push_str(&n.to_string());
            }
        }
        J::String(s) => write_py_str(s, out),
        J::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_py_json(item, indent, depth + 1, item_sep, key_sep, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_py_str(k, out);
                out.push_str(key_sep);
                write_py_json(item, indent, depth + 1, item_sep, key_sep, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn py_float(f: f64) -> String {
    if f.is_finite() && f == f.trunc() && f.abs() < 1e16 {
        format!("{f:.1}")
    } else if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        // Rust's shortest round-trip repr matches Python's repr for normal ranges.
        let s = format!("{f}");
        if s.contains('e') || s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    }
}

fn write_py_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

pub(crate) fn format_error(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        msg.push_str(": ");
        msg.push_str(&inner.to_string());
        src = inner.source();
    }
    msg
}
