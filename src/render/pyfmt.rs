//! Python's text forms of values, as HF chat templates print them under
//! jinja2: `json.dumps(..., ensure_ascii=False)` for `tojson`, `repr()` for
//! printed lists and dicts, and Python's float repr (`1e-07`, `1e+22`).
//!
//! Owns: formatting only. Must not: know about templates or tokenizers.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use serde_json::Value as Json;

/// Python's `repr(float)`; with `json` set, `json.dumps`'s spelling of the
/// non-finite values (`NaN`, `Infinity`) instead of `nan`, `inf`.
pub(crate) fn py_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = match (json, f > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        };
        return s.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let ndigits = digits.len() as i32;
    // Python: the decimal point sits after `decpt` digits; repr switches to
    // exponent notation when decpt <= -4 or decpt > 16.
    let decpt = exp + 1;
    let mut out = String::new();
    if f.is_sign_negative() {
        out.push('-');
    }
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if ndigits > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        let _ = write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-decpt) as usize));
        out.push_str(&digits);
    } else if decpt >= ndigits {
        out.push_str(&digits);
        out.push_str(&"0".repeat((decpt - ndigits) as usize));
        out.push_str(".0");
    } else {
        out.push_str(&digits[..decpt as usize]);
        out.push('.');
        out.push_str(&digits[decpt as usize..]);
    }
    out
}

/// Separators and indent of a `json.dumps` call.
pub(crate) struct JsonStyle<'a> {
    pub indent: Option<usize>,
    pub item_sep: &'a str,
    pub key_sep: &'a str,
    /// Escape non-ASCII characters as `\uXXXX` (surrogate pairs above the BMP).
    pub ensure_ascii: bool,
}

/// Writes JSON the way Python's `json.dumps(..., ensure_ascii=False)` does.
pub(crate) fn write_py_json(v: &Json, style: &JsonStyle<'_>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
            Some(f) => out.push_str(&py_float(f, true)),
            None => out.push_str(&n.to_string()),
        },
        Json::String(s) => write_json_str(s, style.ensure_ascii, out),
        Json::Array(items) if items.is_empty() => out.push_str("[]"),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_sep);
                }
                newline(out, depth + 1);
                write_py_json(item, style, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(map) if map.is_empty() => out.push_str("{}"),
        Json::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_sep);
                }
                newline(out, depth + 1);
                write_json_str(k, style.ensure_ascii, out);
                out.push_str(style.key_sep);
                write_py_json(item, style, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

/// A JSON string literal as Python's `json.dumps` writes it.
fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
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
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str(value)` for what a template prints: `None`, `True`,
/// float repr, and `repr()` of lists and dicts. `None` when the value is not
/// one of those (strings, ints, undefined, objects): print it as usual.
pub(crate) fn py_str(v: &Value) -> Option<String> {
    match v.kind() {
        ValueKind::None => Some("None".into()),
        ValueKind::Bool => Some(if v.is_true() { "True" } else { "False" }.into()),
        ValueKind::Number if !v.is_integer() => {
            f64::try_from(v.clone()).ok().map(|f| py_float(f, false))
        }
        ValueKind::Seq | ValueKind::Map if is_plain_data(v) => {
            let mut out = String::new();
            write_py_repr(v, &mut out);
            Some(out)
        }
        _ => None,
    }
}

/// Lists and dicts that came from data (not loop or namespace objects).
fn is_plain_data(v: &Value) -> bool {
    serde_json::to_value(v).is_ok()
}

/// Python's `repr()` of a value built from JSON data.
fn write_py_repr(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::String => write_repr_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_repr(&key, out);
                out.push_str(": ");
                write_py_repr(&v.get_item(&key).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => match py_str(v) {
            Some(s) => out.push_str(&s),
            None => {
                let _ = write!(out, "{v}");
            }
        },
    }
}

/// A Python string literal as `repr()` writes it: single quotes unless the
/// text has a single quote and no double quote; non-printable characters
/// escaped as `\xNN`, `\uNNNN` or `\UNNNNNNNN`.
fn write_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let n = c as u32;
                let _ = match n {
                    0..=0xff => write!(out, "\\x{n:02x}"),
                    0x100..=0xffff => write!(out, "\\u{n:04x}"),
                    _ => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character, for the characters chat
/// text contains: controls, separators other than the space, and format
/// characters (zero-width joiners, bidi marks, BOM) are not printable.
/// Unassigned code points are treated as printable (an approximation).
fn py_printable(c: char) -> bool {
    let n = c as u32;
    !matches!(n,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e
        | 0x1680 | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xd800..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_match_python_repr() {
        for (f, want) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1e-7, "1e-07"),
            (1.5e-300, "1.5e-300"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (123.456, "123.456"),
            (-42.125, "-42.125"),
            (1.0 / 3.0, "0.3333333333333333"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(py_float(f, false), want, "repr of {f:e}");
        }
        assert_eq!(py_float(f64::NEG_INFINITY, true), "-Infinity");
        assert_eq!(py_float(f64::NAN, true), "NaN");
    }

    #[test]
    fn json_matches_python_dumps() {
        let v: Json =
            serde_json::from_str(r#"{"a": [1, 2.0, null, true], "b": "é\n\u0001\"", "c": {}}"#)
                .expect("test JSON parses");
        let mut out = String::new();
        let mut style = JsonStyle {
            indent: None,
            item_sep: ", ",
            key_sep: ": ",
            ensure_ascii: false,
        };
        write_py_json(&v, &style, 0, &mut out);
        assert_eq!(
            out,
            r#"{"a": [1, 2.0, null, true], "b": "é\n\u0001\"", "c": {}}"#
        );
        style.ensure_ascii = true;
        out.clear();
        write_py_json(&Json::from("é😀"), &style, 0, &mut out);
        assert_eq!(out, r#""\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn repr_matches_python() {
        let v = Value::from_serialize(serde_json::json!(
            ["it's", "say \"hi\"", "both ' \"", "tab\t\u{1b}\u{200d}é😀", 1, 2.5, null, false, {"k": []}]
        ));
        let got = py_str(&v).expect("a list has a Python repr");
        assert_eq!(
            got,
            r#"["it's", 'say "hi"', 'both \' "', 'tab\t\x1b\u200dé😀', 1, 2.5, None, False, {'k': []}]"#
        );
    }
}
