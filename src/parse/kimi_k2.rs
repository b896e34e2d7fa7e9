//! `kimi_k2` tool calls, as the Kimi K2 chat template writes them:
//!
//! ```text
//! <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>
//! <|tool_call_begin|>...<|tool_call_end|><|tool_calls_section_end|>
//! ```
//!
//! The singular spelling `<|tool_call_section_begin|>` / `..._end|>` is
//! accepted too. `functions.NAME:IDX` is the call's id: Kimi's template
//! writes the ids of earlier calls back into the prompt, so the parsed call
//! carries the id the model wrote (not a generated one), in a full parse and
//! a streamed one alike. The markers are special tokens. Text before the
//! section and after its end is content. Must not: accept a call whose id is
//! not `NAME:DIGITS`, or arguments that are not one JSON object.

use super::json::{short, value_exact};
use super::scan::{scan_markers, Scan};
use super::section::{self, Markers};
use super::{finalize, Extract, IdGen, ParseContext, ParsedOutput, RawCall, ToolParser};

const BEGIN: [&str; 2] = [
    "<|tool_calls_section_begin|>",
    "<|tool_call_section_begin|>",
];
const MARKERS: Markers = Markers {
    begin: &BEGIN,
    end: &["<|tool_calls_section_end|>", "<|tool_call_section_end|>"],
    call_begin: "<|tool_call_begin|>",
    call_end: "<|tool_call_end|>",
};
const ARG_BEGIN: &str = "<|tool_call_argument_begin|>";

#[derive(Debug, Clone, Copy)]
pub struct KimiK2;

/// One call's text between `<|tool_call_begin|>` and `<|tool_call_end|>`:
/// the call and the id the model wrote.
fn one_call(inner: &str) -> Result<(RawCall, String), String> {
    let (id, args) = inner
        .split_once(ARG_BEGIN)
        .ok_or_else(|| format!("tool call without {ARG_BEGIN}"))?;
    let id = id.trim();
    let (head, _) = id
        .rsplit_once(':')
        .filter(|(_, i)| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("call id {:?} is not NAME:INDEX", short(id)))?;
    let name = head.strip_prefix("functions.").unwrap_or(head);
    if name.is_empty() || name.contains(|c: char| c == '<' || c.is_whitespace()) {
        return Err(format!("invalid function name in call id {:?}", short(id)));
    }
    let value = value_exact(args)?;
    if !value.is_object() {
        return Err("arguments is not a JSON object".into());
    }
    Ok((
        RawCall {
            name: name.to_owned(),
            arguments: value.to_string(),
        },
        id.to_owned(),
    ))
}

impl KimiK2 {
    /// The extraction and, per call, the id the model wrote.
    fn extract_with_ids(&self, text: &str) -> (Extract, Vec<String>) {
        match section::calls(text, &MARKERS, one_call) {
            Ok(None) => (Extract::NoCalls, Vec::new()),
            Ok(Some((outside, found))) => {
                let (calls, ids) = found.into_iter().unzip();
                (Extract::Calls { outside, calls }, ids)
            }
            Err(e) => (Extract::Malformed(e), Vec::new()),
        }
    }
}

impl ToolParser for KimiK2 {
    fn name(&self) -> &'static str {
        "kimi_k2"
    }

    fn requires_special_tokens(&self) -> bool {
        true
    }

    fn scan(&self, text: &str, from: usize) -> Scan {
        scan_markers(text, from, &BEGIN)
    }

    fn extract(&self, text: &str) -> Extract {
        self.extract_with_ids(text).0
    }

    /// The shared rules, then each call's id replaced by the model's own.
    fn parse(&self, text: &str, ctx: &ParseContext, ids: &mut IdGen) -> ParsedOutput {
        let (ex, model_ids) = self.extract_with_ids(text);
        let mut out = finalize(ex, text, ctx, ids);
        for (call, id) in out.tool_calls.iter_mut().zip(model_ids) {
            call.id = id;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{IdStyle, ParseOutcome};

    const S: &str = "<|tool_calls_section_begin|>";
    const E: &str = "<|tool_calls_section_end|>";

    fn call(id: &str, args: &str) -> String {
        format!("<|tool_call_begin|>{id}{ARG_BEGIN}{args}<|tool_call_end|>")
    }

    fn parse(text: &str) -> ParsedOutput {
        let ctx = ParseContext {
            tool_names: Some(vec!["get_weather".into(), "calc".into()]),
            ..Default::default()
        };
        KimiK2.parse(text, &ctx, &mut IdGen::seeded(2, IdStyle::OpenAi))
    }

    #[test]
    fn ids_come_from_the_model() {
        let text = format!(
            "I'll check.{S}{}{}{E}",
            call("functions.get_weather:0", "{\"city\": \"Paris\"}"),
            call(
                " functions.calc:1 ",
                "{\"e\": \"1+1\", \"n\": {\"x\": [true]}}"
            )
        );
        let out = parse(&text);
        assert_eq!(out.outcome, ParseOutcome::Calls(2));
        assert_eq!(out.content.as_deref(), Some("I'll check."));
        let got: Vec<_> = out
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "functions.get_weather:0",
                    "get_weather",
                    r#"{"city":"Paris"}"#
                ),
                (
                    "functions.calc:1",
                    "calc",
                    r#"{"e":"1+1","n":{"x":[true]}}"#
                ),
            ]
        );
    }

    #[test]
    fn variants_bare_ids_and_unicode() {
        let text = format!(
            "<|tool_call_section_begin|>\n{}\n<|tool_call_section_end|>\nafter ",
            call("get_weather:12", "{\"city\": \"東京\"}")
        );
        let out = parse(&text);
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.tool_calls[0].id, "get_weather:12");
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"東京"}"#);
        assert_eq!(out.content.as_deref(), Some("\nafter"));
    }

    #[test]
    fn malformed_keeps_whole_text() {
        let good = call("functions.calc:0", "{}");
        for (text, why) in [
            (format!("{S}{good}"), "unterminated"),
            (
                format!("{S}{}{E}", call("functions.calc", "{}")),
                "NAME:INDEX",
            ),
            (
                format!("{S}{}{E}", call("functions.calc:x", "{}")),
                "NAME:INDEX",
            ),
            (
                format!("{S}{}{E}", call("functions.:0", "{}")),
                "invalid function",
            ),
            (
                format!("{S}{}{E}", call("functions.nope:0", "{}")),
                "unknown function",
            ),
            (
                format!("{S}{}{E}", call("functions.calc:0", "{\"a\":")),
                "invalid JSON",
            ),
            (
                format!("{S}{}{E}", call("functions.calc:0", "\"x\"")),
                "not a JSON object",
            ),
            (
                format!("{S}<|tool_call_begin|>functions.calc:0 {{}}<|tool_call_end|>{E}"),
                "without",
            ),
            (format!("{S}{E}"), "no calls"),
        ] {
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
