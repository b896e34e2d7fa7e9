//! `deepseek_v31` tool calls, as the DeepSeek V3.1 chat template writes them:
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//! <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! Unlike `deepseek_v3` there is no `function` type word and no ```` ```json ````
//! fence: the arguments object follows `<｜tool▁sep｜>` directly. Text before
//! `<｜tool▁calls▁begin｜>` and after `<｜tool▁calls▁end｜>` is content;
//! whitespace between the markers is allowed. The markers are ordinary added
//! tokens, as in V3. Must not: accept a call without the closing markers or
//! arguments that are not one JSON object.

use super::deepseek_v3::{CALLS_BEGIN, MARKERS, SEP};
use super::json::value_exact;
use super::scan::{scan_markers, Scan};
use super::section;
use super::{Extract, RawCall, ToolParser};

#[derive(Debug, Clone, Copy)]
pub struct DeepSeekV31;

/// One call's text between `<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`.
fn one_call(inner: &str) -> Result<RawCall, String> {
    let (name, args) = inner
        .split_once(SEP)
        .ok_or_else(|| format!("tool call without {SEP}"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err("empty function name".into());
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

impl ToolParser for DeepSeekV31 {
    fn name(&self) -> &'static str {
        "deepseek_v31"
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

    const BEGIN: &str = "<｜tool▁calls▁begin｜>";
    const END: &str = "<｜tool▁calls▁end｜>";

    fn call(name: &str, args: &str) -> String {
        format!("<｜tool▁call▁begin｜>{name}{SEP}{args}<｜tool▁call▁end｜>")
    }

    fn parse(text: &str) -> ParsedOutput {
        let ctx = ParseContext {
            tool_names: Some(vec!["get_weather".into(), "calc".into()]),
            ..Default::default()
        };
        DeepSeekV31.parse(text, &ctx, &mut IdGen::seeded(9, IdStyle::OpenAi))
    }

    #[test]
    fn one_and_several_calls_with_text_around() {
        let one = format!(
            "{BEGIN}{}{END}",
            call("get_weather", "{\"city\": \"Paris\"}")
        );
        let out = parse(&one);
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.tool_calls[0].name, "get_weather");
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(out.content, None);

        let two = format!(
            "Let me see.{BEGIN}{}\n{}{END}\nDone. ",
            call(
                "get_weather",
                "{\"city\": \"Zürich\", \"n\": {\"a\": [1, 2.5]}}"
            ),
            call("calc", " {} ")
        );
        let out = parse(&two);
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.content.as_deref(), Some("Let me see.\nDone."));
        assert_eq!(
            out.tool_calls[0].arguments,
            r#"{"city":"Zürich","n":{"a":[1,2.5]}}"#
        );
        assert_eq!(out.tool_calls[1].arguments, "{}");
        assert_ne!(out.tool_calls[0].id, out.tool_calls[1].id);
    }

    #[test]
    fn malformed_keeps_whole_text() {
        let cases = [
            (format!("{BEGIN}{}", call("calc", "{}")), "unterminated"),
            (
                format!("{BEGIN}{}{END}", call("calc", "{\"e\": ")),
                "invalid JSON",
            ),
            (
                format!("{BEGIN}{}{END}", call("nope", "{}")),
                "unknown function",
            ),
            (
                format!("{BEGIN}{}{END}", call("calc", "[1]")),
                "not a JSON object",
            ),
            (
                format!("{BEGIN}<｜tool▁call▁begin｜>calc{{}}<｜tool▁call▁end｜>{END}"),
                "without",
            ),
            (
                format!("{BEGIN}{}{END}", call("", "{}")),
                "empty function name",
            ),
            // The deepseek_v3 shape is not this format.
            (
                format!("{BEGIN}{}{END}", call("function", "calc\n```json\n{}\n```")),
                "invalid JSON",
            ),
            (format!("{BEGIN}{END}"), "no calls"),
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
        let plain = "No call ｜ here <｜tool";
        assert_eq!(parse(plain).outcome, ParseOutcome::NoCalls);
    }
}
