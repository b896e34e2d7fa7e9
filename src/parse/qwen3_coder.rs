//! `qwen3_coder` tool calls (Qwen3-Coder, Qwen3.5): XML blocks, any number,
//! with content text around them:
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! A value runs to the first `</parameter>` followed (after whitespace) by
//! `<parameter=` or `</function>`, so code holding a literal `</parameter>`
//! survives; one leading and one trailing newline are dropped, nothing is
//! unescaped. Values are typed from the request's schema for the parameter
//! as vLLM's `qwen3coder_tool_parser.py` does (see `convert`). `<tool_call>`
//! is an ordinary added token in Qwen tokenizers (either decode mode). Must
//! not: accept a call outside `<tool_call>…</tool_call>` or any text between
//! the tags but whitespace.

use serde_json::{Map, Number, Value as Json};

use super::json::{short, value_exact};
use super::pylit::literal_exact;
use super::scan::{scan_markers, Scan};
use super::{
    extract_opened, finalize, Extract, IdGen, ParseContext, ParsedOutput, RawCall, ToolParser,
};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAM: &str = "<parameter=";
const PARAM_END: &str = "</parameter>";

#[derive(Debug, Clone, Copy)]
pub struct Qwen3Coder;

/// The declared type of a parameter schema, lower-cased, and whether it
/// admits null: `type`, else the first non-null `anyOf` type, else string.
/// A `type` list is read like `anyOf` (vLLM would stringify it).
fn declared_type(schema: &Json) -> (String, bool) {
    let pick = |types: Vec<String>| {
        let nullable = types.iter().any(|t| t == "null");
        let first = types.iter().find(|t| *t != "null").cloned();
        match first {
            Some(t) => (t, nullable),
            None if nullable => ("null".to_owned(), true),
            None => ("string".to_owned(), false),
        }
    };
    let norm = |t: &Json| t.as_str().map(|s| s.trim().to_lowercase());
    match (schema.get("type"), schema.get("anyOf")) {
        (Some(Json::String(t)), _) => {
            let t = t.trim().to_lowercase();
            let nullable = t == "null";
            (t, nullable)
        }
        (Some(Json::Array(ts)), _) => pick(ts.iter().filter_map(norm).collect()),
        (None, Some(Json::Array(opts))) => pick(
            opts.iter()
                .filter_map(|o| o.get("type").and_then(norm))
                .collect(),
        ),
        _ => ("string".to_owned(), false),
    }
}

/// A JSON number from `raw`, or `None`.
fn json_number(raw: &str) -> Option<Number> {
    match value_exact(raw) {
        Ok(Json::Number(n)) => Some(n),
        _ => None,
    }
}

/// A parameter value typed from its schema (`None`: the request does not
/// declare the parameter, so it stays a string):
/// - string / str / text / varchar / char / enum: the text as is;
/// - `null` / `None` (any case): null when the type is not a string one,
///   or the schema admits null;
/// - int* / uint* / long* / short* / unsigned*: a JSON integer;
/// - num* / float*: a JSON number, integral values as integers (`3.0` → 3);
/// - boolean / bool / binary: `true` / `false` in any case;
/// - object / array / arr / dict* / list*: JSON, then a Python literal;
///   other types: a Python literal.
///
/// A value that does not convert stays the string it was (vLLM turns a
/// non-boolean into `false`; here it is kept, not repaired).
fn convert(raw: &str, schema: Option<&Json>) -> Json {
    let keep = || Json::String(raw.to_owned());
    let Some(schema) = schema else {
        return keep();
    };
    let (ty, nullable) = declared_type(schema);
    let is = |w: &str| raw.eq_ignore_ascii_case(w);
    let is_null = is("null") || is("none");
    if nullable && is_null {
        return Json::Null;
    }
    if ["string", "str", "text", "varchar", "char", "enum"].contains(&ty.as_str()) {
        return keep();
    }
    if is_null {
        return Json::Null;
    }
    let starts = |ps: &[&str]| ps.iter().any(|p| ty.starts_with(p));
    if starts(&["int", "uint", "long", "short", "unsigned"]) {
        return match json_number(raw) {
            Some(n) if !n.is_f64() => Json::Number(n),
            _ => keep(),
        };
    }
    if starts(&["num", "float"]) {
        return match json_number(raw) {
            Some(n) if !n.is_f64() => Json::Number(n),
            Some(n) => match n.as_f64() {
                // 2^53: beyond it an f64 is not an exact integer.
                Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                    Json::from(f as i64)
                }
                _ => Json::Number(n),
            },
            None => keep(),
        };
    }
    if ["boolean", "bool", "binary"].contains(&ty.as_str()) {
        return if is("true") {
            Json::Bool(true)
        } else if is("false") {
            Json::Bool(false)
        } else {
            keep()
        };
    }
    let container = ["object", "array", "arr"].contains(&ty.as_str()) || starts(&["dict", "list"]);
    // A JSON string holding a Python literal (a model trained on a
    // `json.dumps(str(dict))` template) is read once more.
    let again = |v: Json| match &v {
        Json::String(s) if container => literal_exact(s).unwrap_or(v),
        _ => v,
    };
    if container {
        if let Ok(v) = value_exact(raw) {
            return again(v);
        }
    }
    literal_exact(raw).map(again).unwrap_or_else(|_| keep())
}

/// Drops one leading and one trailing `\n`.
fn strip_newlines(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

/// `<NAME>` after a `<function=` / `<parameter=` prefix: the name and the
/// text after `>`.
fn tag_name<'a>(rest: &'a str, what: &str) -> Result<(&'a str, &'a str), String> {
    let (name, after) = rest
        .split_once('>')
        .ok_or_else(|| format!("unterminated {what} tag"))?;
    let bad = |c: char| c.is_whitespace() || "{}<>\"'".contains(c);
    if name.is_empty() || name.contains(bad) {
        return Err(format!("invalid {what} name {:?}", short(name)));
    }
    Ok((name, after))
}

/// One call from the text just after `<tool_call>`: the call and the text
/// after its `</tool_call>`.
fn one_call<'a>(s: &'a str, ctx: &ParseContext) -> Result<(RawCall, &'a str), String> {
    let rest = s
        .trim_start()
        .strip_prefix(FUNCTION)
        .ok_or_else(|| format!("expected {FUNCTION}NAME> after {START}"))?;
    let (name, mut rest) = tag_name(rest, "function")?;
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(FUNCTION_END) {
            rest = after;
            break;
        }
        let Some(p) = rest.strip_prefix(PARAM) else {
            return Err(format!(
                "expected {PARAM} or {FUNCTION_END}, found {:?}",
                short(rest)
            ));
        };
        let (param, body) = tag_name(p, "parameter")?;
        let end = body
            .match_indices(PARAM_END)
            .map(|(i, _)| i)
            .find(|&i| {
                let next = body[i + PARAM_END.len()..].trim_start();
                next.starts_with(PARAM) || next.starts_with(FUNCTION_END)
            })
            .ok_or_else(|| format!("parameter {param:?}: no closing {PARAM_END}"))?;
        let value = strip_newlines(&body[..end]);
        args.insert(
            param.to_owned(),
            convert(value, ctx.parameter_schema(name, param)),
        );
        rest = &body[end + PARAM_END.len()..];
    }
    let after = rest
        .trim_start()
        .strip_prefix(END)
        .ok_or_else(|| format!("expected {END} after {FUNCTION_END}"))?;
    let call = RawCall {
        name: name.to_owned(),
        arguments: Json::Object(args).to_string(),
    };
    Ok((call, after))
}

impl Qwen3Coder {
    /// The calls, typed from `ctx`'s schemas.
    fn extract_with(&self, text: &str, ctx: &ParseContext) -> Extract {
        extract_opened(text, START, |body| one_call(body, ctx))
    }
}

impl ToolParser for Qwen3Coder {
    fn name(&self) -> &'static str {
        "qwen3_coder"
    }

    fn requires_special_tokens(&self) -> bool {
        false
    }

    fn scan(&self, text: &str, from: usize) -> Scan {
        scan_markers(text, from, &[START])
    }

    /// Without a request every value is a string.
    fn extract(&self, text: &str) -> Extract {
        self.extract_with(text, &ParseContext::default())
    }

    fn parse(&self, text: &str, ctx: &ParseContext, ids: &mut IdGen) -> ParsedOutput {
        finalize(self.extract_with(text, ctx), text, ctx, ids)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::parse::{IdStyle, ParseOutcome};

    fn tools() -> Json {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "temp": {"type": "number"},
                    "metric": {"type": "boolean"},
                    "opts": {"type": "object"},
                    "tags": {"type": "array"},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "limit": {"type": ["integer", "null"]},
                    "free": {"description": "no type"}
                }
            }}},
            {"type": "function", "function": {"name": "write_file"}}
        ])
    }

    fn parse(text: &str) -> ParsedOutput {
        let ctx = ParseContext::from_tools(Some(&tools()));
        Qwen3Coder.parse(text, &ctx, &mut IdGen::seeded(6, IdStyle::OpenAi))
    }

    fn call(name: &str, params: &[(&str, &str)]) -> String {
        let body: String = params
            .iter()
            .map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n"))
            .collect();
        format!("<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>")
    }

    #[test]
    fn single_call_typed_from_the_schema() {
        let out = parse(&call("get_weather", &[("city", "Paris"), ("days", "3")]));
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.content, None);
        assert_eq!(out.tool_calls[0].name, "get_weather");
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"Paris","days":3}"#);
        assert!(out.tool_calls[0].id.starts_with("call_"));
    }

    #[test]
    fn several_calls_and_text_around() {
        let text = format!(
            "Checking both.\n\n{}\n{}\nDone. ",
            call("get_weather", &[("days", "1"), ("city", "Oslo")]),
            call("write_file", &[])
        );
        let out = parse(&text);
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.content.as_deref(), Some("Checking both.\n\n\n\nDone."));
        // The model's parameter order is kept.
        assert_eq!(out.tool_calls[0].arguments, r#"{"days":1,"city":"Oslo"}"#);
        assert_eq!(out.tool_calls[1].arguments, "{}");
        assert_ne!(out.tool_calls[0].id, out.tool_calls[1].id);
    }

    #[test]
    fn value_typing() {
        let s = |v: &Json| Some(v.clone());
        let ty = |t: &str| json!({"type": t});
        let cases = [
            ("Paris", s(&ty("string")), json!("Paris")),
            ("3", s(&ty("string")), json!("3")),
            ("null", s(&ty("string")), json!("null")),
            ("3", None, json!("3")),
            ("3", s(&ty("integer")), json!(3)),
            ("-7", s(&ty("int")), json!(-7)),
            ("3.5", s(&ty("integer")), json!("3.5")),
            ("three", s(&ty("integer")), json!("three")),
            ("2.5", s(&ty("number")), json!(2.5)),
            ("3.0", s(&ty("number")), json!(3)),
            ("1e2", s(&ty("float")), json!(100)),
            ("True", s(&ty("boolean")), json!(true)),
            ("false", s(&ty("bool")), json!(false)),
            ("yes", s(&ty("boolean")), json!("yes")),
            ("None", s(&ty("integer")), Json::Null),
            (
                "{\"a\": [1, {\"b\": null}]}",
                s(&ty("object")),
                json!({"a": [1, {"b": null}]}),
            ),
            ("{'a': True}", s(&ty("object")), json!({"a": true})),
            ("\"{'a': 1}\"", s(&ty("dict")), json!({"a": 1})),
            ("[1, 'x']", s(&ty("array")), json!([1, "x"])),
            ("not json", s(&ty("object")), json!("not json")),
            (
                "None",
                s(&json!({"anyOf": [{"type": "string"}, {"type": "null"}]})),
                Json::Null,
            ),
            (
                "x",
                s(&json!({"anyOf": [{"type": "string"}, {"type": "null"}]})),
                json!("x"),
            ),
        ];
        for (raw, schema, want) in cases {
            assert_eq!(convert(raw, schema.as_ref()), want, "{raw} as {schema:?}");
        }
        assert_eq!(
            convert("null", Some(&json!({"type": ["integer", "null"]}))),
            Json::Null
        );
        assert_eq!(
            convert("4", Some(&json!({"type": ["integer", "null"]}))),
            json!(4)
        );
        assert_eq!(convert("4", Some(&json!({"description": "d"}))), json!("4"));
    }

    #[test]
    fn values_are_kept_verbatim() {
        let code = "if a < b && c > d:\n    print(\"&lt;x&gt;\")\n</parameter> in a string\n";
        let text = call(
            "write_file",
            &[
                ("path", "src/é.py"),
                ("content", code),
                ("json", "{\"k\": \"</function>\"}"),
            ],
        );
        let out = parse(&text);
        assert_eq!(out.outcome, ParseOutcome::Calls(1), "{out:?}");
        let args: Json = serde_json::from_str(&out.tool_calls[0].arguments).expect("JSON");
        assert_eq!(args["path"], "src/é.py");
        assert_eq!(args["content"], code);
        assert_eq!(args["json"], "{\"k\": \"</function>\"}");
        // Only one newline comes off each end.
        let text = "<tool_call>\n<function=write_file>\n<parameter=content>\n\n  x\n\n</parameter>\n</function>\n</tool_call>";
        let out = parse(text);
        assert_eq!(out.tool_calls[0].arguments, r#"{"content":"\n  x\n"}"#);
    }

    #[test]
    fn no_schema_keeps_strings() {
        let text = call("get_weather", &[("days", "3"), ("city", "Paris")]);
        match Qwen3Coder.extract(&text) {
            Extract::Calls { calls, .. } => {
                assert_eq!(calls[0].arguments, r#"{"days":"3","city":"Paris"}"#)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_keeps_whole_text() {
        for (text, why) in [
            ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", "expected </tool_call>"),
            ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>", "no closing"),
            ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", "no closing"),
            ("<tool_call>\n<function=get_weather>\n", "expected <parameter="),
            ("<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "expected <function="),
            ("<tool_call>\n<function=get weather>\n</function>\n</tool_call>", "invalid function name"),
            ("<tool_call>\n<function=get_weather>\nhi\n</function>\n</tool_call>", "expected <parameter="),
            ("<tool_call>\n<function=nope>\n</function>\n</tool_call>", "unknown function"),
            ("<tool_call>\n<function=get_weather", "unterminated function"),
        ] {
            let out = parse(text);
            assert_eq!(out.content.as_deref(), Some(text));
            assert!(out.tool_calls.is_empty());
            match out.outcome {
                ParseOutcome::Malformed(r) => assert!(r.contains(why), "{text}: {r} lacks {why}"),
                o => panic!("{text}: {o:?}"),
            }
        }
        let plain = "Use <function=x> tags </tool_call> like this.";
        assert_eq!(parse(plain).outcome, ParseOutcome::NoCalls);
    }
}
