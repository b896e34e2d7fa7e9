//! The chat-template environment: minijinja configured the way Hugging Face
//! transformers configures jinja2 (`trim_blocks`, `lstrip_blocks`, loop
//! controls, `raise_exception`, `strftime_now`, Python-style `tojson`), plus
//! what minijinja does differently from jinja2 by default: Python's text form
//! of printed values (`None`, `True`, `['a']`, `1e-07`), Python string and
//! dict methods, and jinja2's `sequence` / `iterable` / `number` tests.
//!
//! Owns: template compilation and the helpers templates call. Must not:
//! tokenize, or know about HTTP.

use minijinja::value::{from_args, Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State};

use super::pyfmt::{py_str, write_py_json, JsonStyle};
use super::RenderError;

pub(crate) const TEMPLATE_NAME: &str = "chat";

/// Builds an environment holding the compiled template. Fails if the template
/// does not compile, so a server never starts with a broken template.
pub(crate) fn build_env(source: String) -> Result<Environment<'static>, RenderError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(py_method);
    env.set_formatter(py_formatter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("string", string_filter);
    env.add_filter("length", length_filter);
    env.add_filter("count", length_filter);
    env.add_test("sequence", is_sequence);
    env.add_test("iterable", is_iterable);
    env.add_test("number", is_number);
    env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(&source))
        .map_err(|e| RenderError::TemplateCompile(crate::error::with_causes(&e)))?;
    Ok(env)
}

/// transformers' `{% generation %}...{% endgeneration %}` block (it marks
/// assistant tokens for masks) renders its body unchanged; minijinja has no
/// such tag, so it becomes `{% if true %}...{% endif %}` with the same
/// whitespace-control markers, which trims exactly as the original does.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    // Walk the markup: expressions and comments are copied as they are.
    while let Some(start) = rest.find('{') {
        let (before, tag) = rest.split_at(start);
        out.push_str(before);
        let close = match tag.get(..2) {
            Some("{{") => "}}",
            Some("{#") => "#}",
            Some("{%") => "%}",
            _ => {
                out.push('{');
                rest = &tag[1..];
                continue;
            }
        };
        let Some(end) = tag[2..].find(close).map(|i| i + 2) else {
            out.push_str(tag);
            return out;
        };
        let whole = &tag[..end + 2];
        match (close, generation_replacement(&tag[2..end])) {
            ("%}", Some(replacement)) => out.push_str(&replacement),
            _ => out.push_str(whole),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The replacement of a block tag's inside when it is `generation` or
/// `endgeneration`, keeping its whitespace-control markers.
fn generation_replacement(inner: &str) -> Option<String> {
    let (open_ctl, body) = split_control(inner, true);
    let (close_ctl, word) = split_control(body.trim_end(), false);
    let word = match word.trim() {
        "generation" => "if true",
        "endgeneration" => "endif",
        _ => return None,
    };
    Some(format!("{{%{open_ctl} {word} {close_ctl}%}}"))
}

/// Splits a leading (or trailing) `-` / `+` whitespace-control marker off a
/// tag's inside.
fn split_control(s: &str, leading: bool) -> (&str, &str) {
    let marker = if leading {
        s.chars().next()
    } else {
        s.chars().last()
    };
    match marker {
        Some('-' | '+') if leading => (&s[..1], &s[1..]),
        Some('-' | '+') => (&s[s.len() - 1..], &s[..s.len() - 1]),
        _ => ("", s),
    }
}

/// Python methods on values: minijinja-contrib's `pycompat` set, plus the
/// string methods it lacks that chat templates use (`rsplit`,
/// `removeprefix`, `removesuffix`).
fn py_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "removeprefix" | "removesuffix" => {
                let (affix,): (&str,) = from_args(args)?;
                let out = if method == "removeprefix" {
                    s.strip_prefix(affix)
                } else {
                    s.strip_suffix(affix)
                };
                return Ok(Value::from(out.unwrap_or(s)));
            }
            "rsplit" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
                let maxsplit = maxsplit.and_then(|n| usize::try_from(n).ok());
                return Ok(Value::from(py_rsplit(s, sep, maxsplit)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.rsplit(sep, maxsplit)`; `maxsplit` `None` means no limit.
fn py_rsplit(s: &str, sep: Option<&str>, maxsplit: Option<usize>) -> Vec<String> {
    let limit = maxsplit.unwrap_or(usize::MAX);
    let mut parts: Vec<String> = match sep {
        Some(sep) if !sep.is_empty() => s
            .rsplitn(limit.saturating_add(1), sep)
            .map(str::to_string)
            .collect(),
        _ => {
            // Whitespace runs separate; the unsplit rest keeps its leading space.
            let mut parts = Vec::new();
            let mut rest = s.trim_end();
            while !rest.is_empty() {
                if parts.len() == limit {
                    parts.push(rest.to_string());
                    break;
                }
                match rest.rfind(char::is_whitespace) {
                    Some(at) => {
                        let ws_len = rest[at..].chars().next().map_or(1, char::len_utf8);
                        parts.push(rest[at + ws_len..].to_string());
                        rest = rest[..at].trim_end();
                    }
                    None => {
                        parts.push(rest.to_string());
                        break;
                    }
                }
            }
            parts
        }
    };
    parts.reverse();
    parts
}

/// Prints values as jinja2 does, i.e. with Python's `str()`.
fn py_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    // A string prints as itself when nothing is escaped (chat templates are
    // never auto-escaped): written directly, not through `Display`.
    if let (Some(text), AutoEscape::None) = (value.as_str(), state.auto_escape()) {
        return out
            .write_str(text)
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()));
    }
    if value.is_safe() {
        return minijinja::escape_formatter(out, state, value);
    }
    match py_str(value) {
        Some(text) => out
            .write_str(&text)
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string())),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// jinja2's `string` filter is Python's `str()`.
fn string_filter(value: Value) -> Value {
    match py_str(&value) {
        Some(text) => Value::from(text),
        None if value.is_undefined() => Value::from(""),
        None => Value::from(value.to_string()),
    }
}

/// jinja2's `length`: `len()`, and an undefined value has length 0.
fn length_filter(value: Value) -> Result<usize, Error> {
    if value.is_undefined() {
        return Ok(0);
    }
    minijinja::filters::length(&value)
}

/// jinja2: anything with a length and item access (str, list, dict).
fn is_sequence(value: Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Seq
            | ValueKind::Map
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Undefined
    )
}

/// jinja2: anything Python can iterate; `None` cannot.
fn is_iterable(value: Value) -> bool {
    !value.is_none() && value.try_iter().is_ok()
}

/// jinja2: Python numbers, and `bool` is an `int` in Python.
fn is_number(value: Value) -> bool {
    matches!(value.kind(), ValueKind::Number | ValueKind::Bool)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `strftime_now`: local time, `strftime` format. A format
/// chrono cannot write is a template error (never a panic).
fn strftime_now(format: String) -> Result<String, Error> {
    use std::fmt::Write as _;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        )
    })?;
    Ok(out)
}

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False,
/// indent=..., separators=..., sort_keys=...)`, without the HTML escaping of
/// minijinja's built-in `tojson`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
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
    let style = JsonStyle {
        indent,
        item_sep: &item_sep,
        key_sep: &key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_py_json(&json, &style, 0, &mut out);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_now_formats_local_time_and_rejects_bad_formats() {
        let year = chrono::Local::now().format("%Y").to_string();
        let got = strftime_now("%d %b %Y".into()).expect("valid format");
        assert!(got.ends_with(&year) && got.len() == 11, "{got}");
        assert!(strftime_now("%Q".into()).is_err());
    }

    #[test]
    fn generation_tags_become_plain_blocks() {
        assert_eq!(
            rewrite_generation_tags(
                "a{%- generation -%}b{% endgeneration %}{%+ generation%}c{%endgeneration -%}"
            ),
            "a{%- if true -%}b{% endif %}{%+ if true %}c{% endif -%}"
        );
        let untouched = "{% if x %}{{ '{% generation %}' }}{% endif %}{# c #}";
        assert_eq!(rewrite_generation_tags(untouched), untouched);
    }

    /// Jinja snippets rendered by Python jinja2 configured as transformers
    /// configures it (scripts/gen_goldens.py); tito must print the same text.
    #[test]
    fn jinja_snippets_match_python_jinja2() {
        let fixture = include_str!("../../tests/fixtures/goldens/jinja_snippets.json");
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(fixture).expect("snippet fixture parses");
        assert!(cases.len() >= 10, "snippet fixture has too few cases");
        let mut failures = Vec::new();
        for case in &cases {
            let name = case["name"].as_str().unwrap_or("?");
            let source = case["template"].as_str().unwrap_or_default().to_string();
            let want = case["output"].as_str().unwrap_or_default();
            let want_error = case["error"].as_bool().unwrap_or(false);
            let got = build_env(source).and_then(|env| {
                env.get_template(TEMPLATE_NAME)
                    .and_then(|t| t.render(Value::from_serialize(&case["context"])))
                    .map_err(|e| RenderError::Template(crate::error::with_causes(&e)))
            });
            match (got, want_error) {
                (Ok(got), false) if got == want => {}
                (Err(_), true) => {}
                (got, _) => {
                    failures.push(format!("{name}:\n  tito:   {got:?}\n  python: {want:?}"))
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
