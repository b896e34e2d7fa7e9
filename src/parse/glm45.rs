//! `glm45` tool calls (GLM-4.5, GLM-4.6): blocks, any number, with content
//! text around them:
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! </tool_call>
//! ```
//!
//! The name runs to the first newline or `<arg_key>`; a key is trimmed, a
//! value runs to the first `</arg_value>` and nothing is unescaped. Typing
//! as vLLM's `glm4_moe_tool_parser.py` does: a parameter the request's
//! schema types `"string"` keeps its text exactly; any other value is
//! trimmed and read as JSON, else as a Python literal, else kept as the
//! trimmed text. The tags are not special tokens in GLM's tokenizer (either
//! decode mode). Must not: accept anything but whitespace between the
//! pairs, or a block without its `</tool_call>`.

use serde_json::{Map, Value as Json};

use super::json::{short, value_exact};
use super::pylit::literal_exact;
use super::scan::{scan_markers, Scan};
use super::{
    extract_opened, finalize, Extract, IdGen, ParseContext, ParsedOutput, RawCall, ToolParser,
};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";
const KEY: &str = "<arg_key>";
const KEY_END: &str = "</arg_key>";
const VALUE: &str = "<arg_value>";
const VALUE_END: &str = "</arg_value>";

#[derive(Debug, Clone, Copy)]
pub struct Glm45;

/// A value typed from its parameter schema (see the module doc).
fn convert(raw: &str, schema: Option<&Json>) -> Json {
    if schema.and_then(|s| s.get("type")).and_then(Json::as_str) == Some("string") {
        return Json::String(raw.to_owned());
    }
    let t = raw.trim();
    value_exact(t)
        .or_else(|_| literal_exact(t))
        .unwrap_or_else(|_| Json::String(t.to_owned()))
}

/// One call from the text just after `<tool_call>`: the call and the text
/// after its `</tool_call>`.
fn one_call<'a>(s: &'a str, ctx: &ParseContext) -> Result<(RawCall, &'a str), String> {
    let cut = [s.find('\n'), s.find(KEY), s.find(END)]
        .into_iter()
        .flatten()
        .min()
        .ok_or_else(|| format!("unterminated {START}"))?;
    let name = s[..cut].trim();
    let bad = |c: char| c.is_whitespace() || "{}<>\"'".contains(c);
    if name.is_empty() || name.contains(bad) {
        return Err(format!("invalid function name {:?}", short(name)));
    }
    let mut rest = &s[cut..];
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(END) {
            rest = after;
            break;
        }
        let Some(k) = rest.strip_prefix(KEY) else {
            return Err(if rest.is_empty() {
                format!("unterminated {START}")
            } else {
                format!("expected {KEY} or {END}, found {:?}", short(rest))
            });
        };
        let (key, after) = k
            .split_once(KEY_END)
            .ok_or_else(|| format!("unterminated {KEY}"))?;
        let key = key.trim();
        let v = after
            .trim_start()
            .strip_prefix(VALUE)
            .ok_or_else(|| format!("{key:?}: expected {VALUE} after {KEY_END}"))?;
        let (value, after) = v
            .split_once(VALUE_END)
            .ok_or_else(|| format!("{key:?}: unterminated {VALUE}"))?;
        args.insert(
            key.to_owned(),
            convert(value, ctx.parameter_schema(name, key)),
        );
        rest = after;
    }
    let call = RawCall {
        name: name.to_owned(),
        arguments: Json::Object(args).to_string(),
    };
    Ok((call, rest))
}

impl Glm45 {
    /// The calls, typed from `ctx`'s schemas.
    fn extract_with(&self, text: &str, ctx: &ParseContext) -> Extract {
        extract_opened(text, START, |body| one_call(body, ctx))
    }
}

impl ToolParser for Glm45 {
    fn name(&self) -> &'static str {
        "glm45"
    }

    fn requires_special_tokens(&self) -> bool {
        false
    }

    fn scan(&self, text: &str, from: usize) -> Scan {
        scan_markers(text, from, &[START])
    }

    /// Without a request no parameter is known to be a string.
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

    fn ctx() -> ParseContext {
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "code": {"type": "string"}
                }
            }}},
            {"type": "function", "function": {"name": "get_time"}}
        ]);
        ParseContext::from_tools(Some(&tools))
    }

    fn parse(text: &str) -> ParsedOutput {
        Glm45.parse(text, &ctx(), &mut IdGen::seeded(8, IdStyle::OpenAi))
    }

    fn call(name: &str, pairs: &[(&str, &str)]) -> String {
        let body: String = pairs
            .iter()
            .map(|(k, v)| format!("<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"))
            .collect();
        format!("<tool_call>{name}\n{body}</tool_call>")
    }

    #[test]
    fn single_call_typed() {
        let out = parse(&call("get_weather", &[("city", "Paris"), ("days", "3")]));
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.content, None);
        assert_eq!(out.tool_calls[0].name, "get_weather");
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"Paris","days":3}"#);
    }

    #[test]
    fn several_calls_and_text_around() {
        let text = format!(
            "Let me look.\n{}\n{}\nThen answer. ",
            call("get_weather", &[("city", "東京")]),
            call("get_time", &[])
        );
        let out = parse(&text);
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(
            out.content.as_deref(),
            Some("Let me look.\n\n\nThen answer.")
        );
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"東京"}"#);
        assert_eq!(out.tool_calls[1].arguments, "{}");
        // A call without a newline after the name, as GLM-4.7 writes it.
        let out =
            parse("<tool_call>get_time<arg_key>tz</arg_key><arg_value>UTC</arg_value></tool_call>");
        assert_eq!(out.tool_calls[0].arguments, r#"{"tz":"UTC"}"#);
    }

    #[test]
    fn value_typing() {
        let text = call(
            "get_weather",
            &[
                ("city", " 42 "),
                ("days", " 7 "),
                ("obj", "{\"a\": [1, {\"b\": \"</x>\"}]}"),
                ("py", "{'a': True, 'b': None}"),
                ("flag", "true"),
                ("word", " hello "),
                ("quoted", "\"hi\""),
                ("code", "&lt;b&gt; \\n"),
            ],
        );
        let out = parse(&text);
        assert_eq!(
            out.tool_calls[0].arguments,
            r#"{"city":" 42 ","days":7,"obj":{"a":[1,{"b":"</x>"}]},"py":{"a":true,"b":null},"flag":true,"word":"hello","quoted":"hi","code":"&lt;b&gt; \\n"}"#
        );
        // Unknown tools: every value is read as JSON or a literal.
        let out = parse(&call("get_time", &[("n", "5"), ("s", "five")]));
        assert_eq!(out.tool_calls[0].arguments, r#"{"n":5,"s":"five"}"#);
    }

    #[test]
    fn malformed_keeps_whole_text() {
        for (text, why) in [
            (
                "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
                "unterminated <tool_call>",
            ),
            (
                "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris\n</tool_call>",
                "unterminated <arg_value>",
            ),
            (
                "<tool_call>get_weather\n<arg_key>city\n</tool_call>",
                "unterminated <arg_key>",
            ),
            (
                "<tool_call>get_weather\n<arg_key>city</arg_key>Paris</tool_call>",
                "expected <arg_value>",
            ),
            (
                "<tool_call>get_weather\njunk\n</tool_call>",
                "expected <arg_key>",
            ),
            (
                "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",
                "invalid function name",
            ),
            ("<tool_call>nope\n</tool_call>", "unknown function"),
            ("<tool_call>get_weather", "unterminated"),
        ] {
            let out = parse(text);
            assert_eq!(out.content.as_deref(), Some(text));
            assert!(out.tool_calls.is_empty());
            match out.outcome {
                ParseOutcome::Malformed(r) => assert!(r.contains(why), "{text}: {r} lacks {why}"),
                o => panic!("{text}: {o:?}"),
            }
        }
        assert_eq!(parse("a <arg_key> b").outcome, ParseOutcome::NoCalls);
    }
}
