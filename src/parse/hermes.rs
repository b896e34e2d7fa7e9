//! `hermes` tool calls (Qwen2.5 / Qwen3): `<tool_call>\n{"name": ...,
//! "arguments": {...}}\n</tool_call>` blocks, any number, with content text
//! around them. Must not: accept a block that is not exactly one JSON object.

use super::json::{call_from_object, value_exact};
use super::scan::{scan_markers, Scan};
use super::{Extract, ToolParser};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

#[derive(Debug, Clone, Copy)]
pub struct Hermes;

impl ToolParser for Hermes {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn requires_special_tokens(&self) -> bool {
        false
    }

    fn scan(&self, text: &str, from: usize) -> Scan {
        scan_markers(text, from, &[START])
    }

    fn extract(&self, text: &str) -> Extract {
        let mut outside = String::new();
        let mut calls = Vec::new();
        let mut pos = 0;
        while let Some(rel) = text[pos..].find(START) {
            let open = pos + rel;
            outside.push_str(&text[pos..open]);
            let body = open + START.len();
            let Some(close_rel) = text[body..].find(END) else {
                return Extract::Malformed(format!("unterminated {START}"));
            };
            let close = body + close_rel;
            let inner = &text[body..close];
            let call =
                value_exact(inner).and_then(|v| call_from_object(&v, &["arguments", "parameters"]));
            match call {
                Ok(c) => calls.push(c),
                Err(e) => return Extract::Malformed(format!("call {}: {e}", calls.len())),
            }
            pos = close + END.len();
        }
        if calls.is_empty() {
            return Extract::NoCalls;
        }
        outside.push_str(&text[pos..]);
        Extract::Calls { outside, calls }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{IdGen, IdStyle, ParseContext, ParseOutcome};

    fn parse(text: &str, names: Option<&[&str]>) -> crate::parse::ParsedOutput {
        let ctx = ParseContext {
            tool_names: names.map(|n| n.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        Hermes.parse(text, &ctx, &mut IdGen::seeded(1, IdStyle::OpenAi))
    }

    #[test]
    fn single_call_with_odd_spacing() {
        let out = parse(
            "<tool_call>\n{ \"name\":\"calc\" ,\n \"arguments\": {\"expr\" :\"2 + 2\", \"a\": 1.5}}\n</tool_call>",
            Some(&["calc"]),
        );
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.content, None);
        assert_eq!(out.tool_calls[0].name, "calc");
        assert_eq!(out.tool_calls[0].arguments, r#"{"expr":"2 + 2","a":1.5}"#);
        assert!(out.tool_calls[0].id.starts_with("call_"));
    }

    #[test]
    fn text_around_and_several_calls() {
        let text = "Let me check.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"k\": [1]}}\n</tool_call>\nDone.";
        let out = parse(text, None);
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.content.as_deref(), Some("Let me check.\n\n\n\nDone."));
        let names: Vec<_> = out.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_ne!(out.tool_calls[0].id, out.tool_calls[1].id);
        let j = out.tool_calls[1].to_openai_json();
        assert_eq!(j["type"], "function");
        assert_eq!(j["function"]["arguments"], r#"{"k":[1]}"#);
    }

    #[test]
    fn malformed_cases_keep_whole_text() {
        let cases = [
            (
                "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call>",
                "invalid JSON",
            ),
            (
                "Sure <tool_call>\n{\"name\": \"a\", \"arguments\": {}}",
                "unterminated",
            ),
            (
                "<tool_call>\n{\"name\": \"zzz\", \"arguments\": {}}\n</tool_call>",
                "unknown function",
            ),
            (
                "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
                "no \"name\"",
            ),
            (
                "<tool_call>{\"name\":\"a\"} {\"name\":\"a\"}</tool_call>",
                "unexpected text",
            ),
            (
                "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":</tool_call>",
                "call 1",
            ),
        ];
        for (text, why) in cases {
            let out = parse(text, Some(&["a"]));
            assert_eq!(out.content.as_deref(), Some(text), "{text}");
            assert!(out.tool_calls.is_empty());
            match out.outcome {
                ParseOutcome::Malformed(r) => assert!(r.contains(why), "{r} lacks {why}"),
                o => panic!("{text}: {o:?}"),
            }
        }
    }

    #[test]
    fn plain_text_and_stray_close_tag() {
        let out = parse("Hello </tool_call> world ", None);
        assert_eq!(out.outcome, ParseOutcome::NoCalls);
        assert_eq!(out.content.as_deref(), Some("Hello </tool_call> world "));
        assert_eq!(parse("", None).content, None);
    }
}
