//! `llama3_json` tool calls (Llama 3.1+ JSON tool calling): the reply is
//! `{"name": ..., "parameters": {...}}` (or `"arguments"`), optionally after
//! `<|python_tag|>`, possibly several objects separated by `;`.
//!
//! A region starts at `<|python_tag|>` anywhere (text before it is content),
//! or at a `{` that is the reply's first non-whitespace character. An
//! untagged reply whose first JSON object has no `"name"` is an ordinary
//! JSON answer (no calls). Anything but whitespace after the last call is
//! malformed. Must not: look for JSON in the middle of prose.

use serde_json::Value as Json;

use super::json::{call_from_object, short, value_prefix};
use super::scan::{scan_markers, Scan};
use super::{Extract, ToolParser};

const TAG: &str = "<|python_tag|>";
const ARG_KEYS: [&str; 2] = ["parameters", "arguments"];

#[derive(Debug, Clone, Copy)]
pub struct Llama3Json;

/// Where the region starts, where its body starts, and whether it is tagged.
fn region(text: &str) -> Option<(usize, usize, bool)> {
    let lead = text.len() - text.trim_start().len();
    if text[lead..].starts_with('{') {
        return Some((lead, lead, false));
    }
    text.find(TAG).map(|p| (p, p + TAG.len(), true))
}

impl ToolParser for Llama3Json {
    fn name(&self) -> &'static str {
        "llama3_json"
    }

    fn requires_special_tokens(&self) -> bool {
        true
    }

    fn scan(&self, text: &str, from: usize) -> Scan {
        let lead = text.len() - text.trim_start().len();
        if lead == text.len() {
            // Only whitespace so far: a `{` may still come first.
            return if text.is_empty() {
                Scan::Clear
            } else {
                Scan::Partial(0)
            };
        }
        if text[lead..].starts_with('{') {
            return Scan::Start(lead);
        }
        scan_markers(text, from, &[TAG])
    }

    fn extract(&self, text: &str) -> Extract {
        let Some((start, body, tagged)) = region(text) else {
            return Extract::NoCalls;
        };
        let mut calls = Vec::new();
        let mut pos = body;
        loop {
            let rest = &text[pos..];
            let (value, end) = match value_prefix(rest) {
                Ok(v) => v,
                Err(_) if !tagged && calls.is_empty() => return Extract::NoCalls,
                Err(e) => return Extract::Malformed(format!("call {}: {e}", calls.len())),
            };
            if !tagged && calls.is_empty() && value.get("name").is_none() {
                return Extract::NoCalls;
            }
            if !matches!(value, Json::Object(_)) {
                return Extract::Malformed(format!("call {}: not a JSON object", calls.len()));
            }
            match call_from_object(&value, &ARG_KEYS) {
                Ok(c) => calls.push(c),
                Err(e) => return Extract::Malformed(format!("call {}: {e}", calls.len())),
            }
            let after = rest[end..].trim_start();
            if after.is_empty() {
                break;
            }
            match after.strip_prefix(';') {
                Some(next) if !next.trim().is_empty() => pos = text.len() - next.len(),
                Some(_) => break,
                None => {
                    return Extract::Malformed(format!(
                        "unexpected text after tool call: {:?}",
                        short(after)
                    ))
                }
            }
        }
        Extract::Calls {
            outside: text[..start].to_owned(),
            calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{IdGen, IdStyle, ParseContext, ParseOutcome, ParsedOutput};

    fn parse(text: &str) -> ParsedOutput {
        let ctx = ParseContext {
            tool_names: Some(vec!["get_weather".into(), "lookup".into()]),
            ..Default::default()
        };
        Llama3Json.parse(text, &ctx, &mut IdGen::seeded(3, IdStyle::OpenAi))
    }

    #[test]
    fn bare_tagged_and_multiple() {
        let out = parse(r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#);
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(out.content, None);

        let out = parse("<|python_tag|>{\"name\": \"lookup\", \"arguments\": {\"q\": \"x\"}}");
        assert_eq!(out.outcome, ParseOutcome::Calls(1));

        let out = parse(
            "\n{\"name\": \"lookup\", \"parameters\": {\"q\": 1}}; {\"name\": \"get_weather\", \"parameters\": {}}",
        );
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.tool_calls[1].name, "get_weather");
        assert_eq!(out.content, None);

        let out = parse("Checking.<|python_tag|>{\"name\": \"lookup\", \"parameters\": {}};");
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.content.as_deref(), Some("Checking."));
    }

    #[test]
    fn plain_answers_are_not_calls() {
        for text in [
            "The answer is {x}.",
            r#"{"answer": 42}"#,
            "{not json at all",
            "  ",
        ] {
            let out = parse(text);
            assert_eq!(out.outcome, ParseOutcome::NoCalls, "{text}");
            assert_eq!(out.content.as_deref(), Some(text));
        }
    }

    #[test]
    fn malformed() {
        for (text, why) in [
            (
                "<|python_tag|>{\"name\": \"lookup\", \"parameters\": {",
                "invalid JSON",
            ),
            (r#"{"name": "nope", "parameters": {}}"#, "unknown function"),
            (
                r#"{"name": "lookup", "parameters": {}} and more"#,
                "unexpected text",
            ),
            (
                r#"{"name": "lookup", "parameters": {}}; {"name": "#,
                "call 1",
            ),
            (
                r#"{"name": "lookup", "parameters": 5}"#,
                "not a JSON object",
            ),
            (
                r#"{"name": "lookup", "parameters": {}, "arguments": {}}"#,
                "both",
            ),
        ] {
            let out = parse(text);
            assert_eq!(out.content.as_deref(), Some(text));
            assert!(out.tool_calls.is_empty());
            match out.outcome {
                ParseOutcome::Malformed(r) => assert!(r.contains(why), "{r} lacks {why}"),
                o => panic!("{text}: {o:?}"),
            }
        }
    }
}
