//! `mistral` tool calls. Accepted after the `[TOOL_CALLS]` special token:
//! - a JSON array of `{"name", "arguments"}` objects (Mistral 7B v0.3 era);
//! - `NAME[ARGS]{...}` or `NAME{...}`, each call behind its own
//!   `[TOOL_CALLS]` (v11+ tokenizers).
//!
//! Text before the first `[TOOL_CALLS]` is content; anything but whitespace
//! after the calls is malformed. Ids are 9 alphanumerics, the only shape
//! Mistral chat templates accept. Must not: rewrite quotes or otherwise
//! repair the JSON.

use super::json::{call_from_object, short, value_exact, value_prefix};
use super::scan::{scan_markers, Scan};
use super::{Extract, IdStyle, RawCall, ToolParser};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

#[derive(Debug, Clone, Copy)]
pub struct Mistral;

fn array_form(body: &str) -> Result<Vec<RawCall>, String> {
    let (value, end) = value_prefix(body)?;
    let rest = body[end..].trim();
    if !rest.is_empty() {
        return Err(format!(
            "unexpected text after tool calls: {:?}",
            short(rest)
        ));
    }
    let items = value
        .as_array()
        .ok_or_else(|| "tool calls are not a JSON array".to_string())?;
    if items.is_empty() {
        return Err("empty tool-call array".into());
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| call_from_object(v, &["arguments"]).map_err(|e| format!("call {i}: {e}")))
        .collect()
}

fn named_form(segment: &str) -> Result<RawCall, String> {
    let (name, args) = match segment.find(ARGS) {
        Some(p) => (&segment[..p], &segment[p + ARGS.len()..]),
        None => match segment.find('{') {
            Some(p) => (&segment[..p], &segment[p..]),
            None => return Err("tool call has no arguments object".into()),
        },
    };
    let name = name.trim();
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || !name.chars().all(valid) {
        return Err(format!("invalid function name {:?}", short(name)));
    }
    let value = value_exact(args)?;
    if !value.is_object() {
        return Err("arguments is not a JSON object".into());
    }
    Ok(RawCall {
        name: name.to_owned(),
        arguments: value.to_string(),
    })
}

impl ToolParser for Mistral {
    fn name(&self) -> &'static str {
        "mistral"
    }

    fn requires_special_tokens(&self) -> bool {
        true
    }

    fn id_style(&self) -> IdStyle {
        IdStyle::Mistral9
    }

    fn scan(&self, text: &str, from: usize) -> Scan {
        scan_markers(text, from, &[TOOL_CALLS])
    }

    fn extract(&self, text: &str) -> Extract {
        let Some(start) = text.find(TOOL_CALLS) else {
            return Extract::NoCalls;
        };
        let body = &text[start + TOOL_CALLS.len()..];
        let calls = if body.trim_start().starts_with('[') {
            array_form(body)
        } else {
            body.split(TOOL_CALLS)
                .enumerate()
                .map(|(i, seg)| named_form(seg).map_err(|e| format!("call {i}: {e}")))
                .collect()
        };
        match calls {
            Ok(calls) => Extract::Calls {
                outside: text[..start].to_owned(),
                calls,
            },
            Err(e) => Extract::Malformed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{IdGen, ParseContext, ParseOutcome, ParsedOutput};

    fn parse(text: &str) -> ParsedOutput {
        let ctx = ParseContext {
            tool_names: Some(vec!["add".into(), "search".into()]),
            ..Default::default()
        };
        Mistral.parse(text, &ctx, &mut IdGen::seeded(5, Mistral.id_style()))
    }

    #[test]
    fn array_form_calls() {
        let out = parse(
            "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"search\", \"arguments\": {\"q\": \"rust\"}}]",
        );
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.tool_calls[0].arguments, r#"{"a":1,"b":2}"#);
        assert_eq!(out.tool_calls[1].name, "search");
        assert_eq!(out.content, None);
        assert_eq!(out.tool_calls[0].id.len(), 9);
    }

    #[test]
    fn named_forms_and_content_before() {
        let out =
            parse("I will add.[TOOL_CALLS]add[ARGS]{\"a\": 1}[TOOL_CALLS]search{\"q\": \"x\"}");
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.content.as_deref(), Some("I will add."));
        assert_eq!(out.tool_calls[0].name, "add");
        assert_eq!(out.tool_calls[1].arguments, r#"{"q":"x"}"#);
    }

    #[test]
    fn malformed() {
        for (text, why) in [
            (
                "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1}",
                "invalid JSON",
            ),
            (
                "[TOOL_CALLS] [{\"name\": \"mul\", \"arguments\": {}}]",
                "unknown function",
            ),
            (
                "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {}}] trailing",
                "unexpected text",
            ),
            ("[TOOL_CALLS] []", "empty"),
            ("[TOOL_CALLS]add[ARGS]{\"a\": ", "invalid JSON"),
            ("[TOOL_CALLS]add", "no arguments"),
            ("[TOOL_CALLS]bad name{}", "invalid function name"),
            ("[TOOL_CALLS]add[ARGS][1]", "not a JSON object"),
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

    #[test]
    fn no_marker_is_content() {
        let out = parse("Just text [TOOL] here");
        assert_eq!(out.outcome, ParseOutcome::NoCalls);
        assert_eq!(out.content.as_deref(), Some("Just text [TOOL] here"));
    }
}
