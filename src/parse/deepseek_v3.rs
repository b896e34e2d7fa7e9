//! `deepseek_v3` tool calls, as the DeepSeek V3 chat template writes them:
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//! ```json
//! {...}
//! ```<｜tool▁call▁end｜>
//! <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! Text before `<｜tool▁calls▁begin｜>` and after `<｜tool▁calls▁end｜>` is
//! content. Whitespace between the markers is allowed. Must not: accept a
//! call without the closing markers or without the fenced JSON.

use super::json::{short, value_exact};
use super::scan::{scan_markers, Scan};
use super::section::{self, Markers};
use super::{Extract, RawCall, ToolParser};

pub(super) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
pub(super) const SEP: &str = "<｜tool▁sep｜>";

/// The section markers, shared with `deepseek_v31`.
pub(super) const MARKERS: Markers = Markers {
    begin: &[CALLS_BEGIN],
    end: &[CALLS_END],
    call_begin: CALL_BEGIN,
    call_end: CALL_END,
};

#[derive(Debug, Clone, Copy)]
pub struct DeepSeekV3;

/// One call's text between `<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`.
fn one_call(inner: &str) -> Result<RawCall, String> {
    let (kind, rest) = inner
        .split_once(SEP)
        .ok_or_else(|| format!("tool call without {SEP}"))?;
    if kind.trim() != "function" {
        return Err(format!(
            "tool call type {:?} is not \"function\"",
            short(kind)
        ));
    }
    let (name, rest) = rest
        .split_once('\n')
        .ok_or_else(|| "no newline after the function name".to_string())?;
    let name = name.trim();
    if name.is_empty() {
        return Err("empty function name".into());
    }
    let fenced = rest
        .trim()
        .strip_prefix("```json")
        .and_then(|r| r.strip_suffix("```"))
        .ok_or_else(|| "arguments are not in a ```json block".to_string())?;
    let value = value_exact(fenced)?;
    if !value.is_object() {
        return Err("arguments is not a JSON object".into());
    }
    Ok(RawCall {
        name: name.to_owned(),
        arguments: value.to_string(),
    })
}

impl ToolParser for DeepSeekV3 {
    fn name(&self) -> &'static str {
        "deepseek_v3"
    }

    fn requires_special_tokens(&self) -> bool {
        false
    }

    fn scan(&self, text: &str, from: usize) -> Scan {
        scan_markers(text, from, &[CALLS_BEGIN])
    }

    fn extract(&self, text: &str) -> Extract {
        match section::calls(text, &MARKERS, one_call) {
            Ok(None) => Extract::NoCalls,
            Ok(Some((outside, calls))) => Extract::Calls { outside, calls },
            Err(e) => Extract::Malformed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{IdGen, IdStyle, ParseContext, ParseOutcome, ParsedOutput};

    fn call(name: &str, args: &str) -> String {
        format!("{CALL_BEGIN}function{SEP}{name}\n```json\n{args}\n```{CALL_END}")
    }

    fn parse(text: &str) -> ParsedOutput {
        let ctx = ParseContext {
            tool_names: Some(vec!["get_weather".into(), "calc".into()]),
            ..Default::default()
        };
        DeepSeekV3.parse(text, &ctx, &mut IdGen::seeded(9, IdStyle::OpenAi))
    }

    #[test]
    fn template_shape_one_and_two_calls() {
        let one = format!(
            "{CALLS_BEGIN}{}{CALLS_END}",
            call("get_weather", "{\"city\": \"Oslo\"}")
        );
        let out = parse(&one);
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(out.content, None);

        let two = format!(
            "Let me see.{CALLS_BEGIN}{}\n{}{CALLS_END}",
            call("get_weather", "{}"),
            call("calc", "{\"e\": \"1+1\"}")
        );
        let out = parse(&two);
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.content.as_deref(), Some("Let me see."));
        assert_eq!(out.tool_calls[1].name, "calc");
    }

    #[test]
    fn malformed() {
        let good = call("calc", "{}");
        let cases = [
            (format!("{CALLS_BEGIN}{good}"), "unterminated"),
            (
                format!("{CALLS_BEGIN}{}{CALLS_END}", call("calc", "{\"e\": ")),
                "invalid JSON",
            ),
            (
                format!("{CALLS_BEGIN}{}{CALLS_END}", call("nope", "{}")),
                "unknown function",
            ),
            (
                format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}calc\n{{}}{CALL_END}{CALLS_END}"),
                "```json",
            ),
            (
                format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}calc\n```json\n{{}}"),
                "unterminated",
            ),
            (format!("{CALLS_BEGIN}{CALLS_END}"), "no calls"),
            (format!("{CALLS_BEGIN}junk{CALLS_END}"), "expected"),
        ];
        for (text, why) in cases {
            let out = parse(&text);
            assert_eq!(out.content.as_deref(), Some(text.as_str()));
            assert!(out.tool_calls.is_empty());
            match out.outcome {
                ParseOutcome::Malformed(r) => assert!(r.contains(why), "{r} lacks {why}"),
                o => panic!("{text}: {o:?}"),
            }
        }
    }
}
