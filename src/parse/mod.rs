//! Tool-call and reasoning parsers: turn the decoded text of one sampled
//! completion into an OpenAI assistant message (`reasoning_content`,
//! `content`, `tool_calls`), either at once or as streamed deltas.
//!
//! Owns: the [`ToolParser`] trait and one implementation per format
//! (`hermes`, `llama3_json`, `mistral`, `deepseek_v3`, `deepseek_v31`,
//! `qwen3_coder`, `glm45`, `kimi_k2`, `pythonic`), the [`ReasoningParser`]
//! and its modes (`think`, `deepseek_r1`, `glm45`, `kimi_k2`), tool-call
//! ids, and the streaming drivers. Harmony (gpt-oss) output is not parsed
//! here: `render::harmony` reads it from the sampled ids with
//! `openai-harmony`, into this module's types. Must not: touch token ids,
//! HTTP, or the trajectory; it never fails on model output.
//!
//! # What the caller passes in
//!
//! The decoded text of the sampled ids **without the terminating stop token**
//! (the EOS / end-of-turn id the backend stopped on; the ids themselves are
//! kept verbatim elsewhere). Decode mode: each parser says so through
//! [`ToolParser::requires_special_tokens`]: `mistral` needs
//! `skip_special_tokens = false` (`[TOOL_CALLS]` is a special token);
//! `hermes` and `deepseek_v3` markers are ordinary added tokens in the
//! Qwen / DeepSeek tokenizers and survive either mode; `llama3_json` sees
//! `<|python_tag|>` only with `skip_special_tokens = false`, and otherwise
//! still recognises a reply that starts with a JSON object; `kimi_k2`'s
//! section markers are special tokens (`skip_special_tokens = false`);
//! `qwen3_coder`, `glm45`, `pythonic` and `deepseek_v31` markers survive
//! either mode. The `<think>` tags of Qwen3 / DeepSeek-R1 are ordinary
//! added tokens too.
//!
//! # Results
//!
//! [`ParsedOutput`] / [`ChatOutput`]: `content` is `None` when empty. When
//! calls were found, `content` is the text outside the calls with trailing
//! whitespace removed (`None` if only whitespace). Malformed output (broken
//! JSON, an unknown function name when the request lists its tools, an
//! unterminated tag) is never an error and never repaired: the WHOLE text
//! becomes `content`, there are no calls, and the outcome says why.
//!
//! `message.tool_calls` in the OpenAI format, as [`ToolCall::to_openai_json`]
//! writes it: `[{"id": "call_…", "type": "function", "function": {"name":
//! "…", "arguments": "<JSON object text>"}}]`. `arguments` is the model's
//! arguments object re-serialized compactly with the model's key order.
//!
//! # Streaming
//!
//! See [`stream`]: text deltas in, [`DeltaEvent`]s out; for every input and
//! every chunking the assembled events equal the non-streamed result.
//!
//! # Use from a chat handler
//!
//! Parse tool calls only when the request has `tools` and `tool_choice` is
//! not `"none"`; the reasoning parser runs whenever one is configured.
//!
//! ```
//! use tito::parse::*;
//! let tools = serde_json::json!([{"type": "function", "function": {"name": "calc"}}]);
//! let tp = tool_parser("hermes").expect("valid config name");
//! let rp = reasoning_parser("think", prompt_opens_reasoning("...<|im_start|>assistant\n"))
//!     .expect("valid config name");
//! let style = tp.as_ref().map_or(IdStyle::OpenAi, |p| p.id_style());
//! let ctx = ParseContext::from_tools(Some(&tools));
//! let text = "<think>\nadd\n</think>\n\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"e\": \"1+1\"}}\n</tool_call>";
//!
//! // Non-streaming.
//! let out = parse_output(text, rp.as_ref(), tp.as_deref(), &ctx, &mut IdGen::random(style));
//! assert_eq!(out.outcome, ParseOutcome::Calls(1)); // finish_reason "tool_calls"
//!
//! // Streaming: feed each released text delta, send each event's delta.
//! let mut s = ChatStream::new(rp.as_ref(), tool_parser("hermes").expect("valid"), ctx, IdGen::random(style));
//! let mut deltas: Vec<serde_json::Value> = Vec::new();
//! for piece in ["<think>\nad", "d\n</think>\n\n<tool_", &text[28..]] {
//!     deltas.extend(s.push(piece).iter().map(DeltaEvent::to_openai_delta));
//! }
//! deltas.extend(s.finish().iter().map(DeltaEvent::to_openai_delta));
//! assert_eq!(s.output().tool_calls[0].arguments, out.tool_calls[0].arguments);
//! ```

mod deepseek_v3;
mod deepseek_v31;
mod glm45;
mod hermes;
mod ids;
mod json;
mod kimi_k2;
mod llama3_json;
mod mistral;
mod pylit;
mod pythonic;
mod qwen3_coder;
mod reasoning;
mod scan;
mod section;
pub mod stream;

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

pub use ids::{IdGen, IdStyle};
pub use reasoning::{
    prompt_closes_reasoning, prompt_opens_reasoning, Mode as ReasoningMode, ReasoningParser,
    ReasoningStream, CLOSE as REASONING_CLOSE,
};
pub use scan::Scan;
pub use stream::{ChatStream, DeltaEvent, EventAssembler, ToolStream};

/// Errors of this module: only configuration names can be wrong.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("unknown tool parser '{0}' (hermes | llama3_json | mistral | deepseek_v3 | deepseek_v31 | qwen3_coder | glm45 | kimi_k2 | pythonic | gpt_oss | none)")]
    UnknownToolParser(String),
    #[error("unknown reasoning parser '{0}' (think | deepseek_r1 | glm45 | kimi_k2 | gpt_oss | none, or empty)")]
    UnknownReasoningParser(String),
}

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments object as compact JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI `message.tool_calls[i]` object.
    pub fn to_openai_json(&self) -> Json {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// What the tool parser made of one completion (recorded per call).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParseOutcome {
    /// No tool-call syntax: everything is content.
    NoCalls,
    /// This many well-formed calls.
    Calls(usize),
    /// Tool-call syntax that did not parse; the whole text is content.
    Malformed(String),
}

impl ParseOutcome {
    /// Short label: `no_calls`, `calls` or `malformed`.
    pub fn label(&self) -> &'static str {
        match self {
            ParseOutcome::NoCalls => "no_calls",
            ParseOutcome::Calls(_) => "calls",
            ParseOutcome::Malformed(_) => "malformed",
        }
    }
}

impl fmt::Display for ParseOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseOutcome::NoCalls => f.write_str("no_calls"),
            ParseOutcome::Calls(n) => write!(f, "calls({n})"),
            ParseOutcome::Malformed(r) => write!(f, "malformed: {r}"),
        }
    }
}

/// Result of a full (non-streaming) tool parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedOutput {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub outcome: ParseOutcome,
}

/// Request-side facts the parsers check against.
#[derive(Debug, Clone, Default)]
pub struct ParseContext {
    /// Function names the request's `tools` declare; `None` accepts any name.
    pub tool_names: Option<Vec<String>>,
    /// Each declared function's `parameters` JSON schema by name (the first
    /// declaration wins): the XML formats type their values from it.
    pub tool_parameters: std::collections::BTreeMap<String, Json>,
}

impl ParseContext {
    /// From the request's OpenAI `tools` array (`[{"type": "function",
    /// "function": {"name": ..., "parameters": ...}}]`); `None` or a
    /// non-array accepts any name.
    pub fn from_tools(tools: Option<&Json>) -> Self {
        let arr = tools.and_then(Json::as_array);
        let tool_names = arr.map(|arr| {
            arr.iter()
                .filter_map(|t| t.pointer("/function/name").and_then(Json::as_str))
                .map(str::to_owned)
                .collect()
        });
        let mut tool_parameters = std::collections::BTreeMap::new();
        for t in arr.into_iter().flatten() {
            let name = t.pointer("/function/name").and_then(Json::as_str);
            if let (Some(name), Some(p)) = (name, t.pointer("/function/parameters")) {
                tool_parameters
                    .entry(name.to_owned())
                    .or_insert_with(|| p.clone());
            }
        }
        ParseContext {
            tool_names,
            tool_parameters,
        }
    }

    /// The schema of parameter `param` of function `tool`
    /// (`parameters.properties.<param>`), when the request declares it.
    pub fn parameter_schema(&self, tool: &str, param: &str) -> Option<&Json> {
        self.tool_parameters
            .get(tool)?
            .get("properties")?
            .get(param)
    }

    fn knows(&self, name: &str) -> bool {
        self.tool_names
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n == name))
    }
}

/// A call as a format found it, before name checks and ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawCall {
    pub name: String,
    pub arguments: String,
}

/// What a format's extractor found in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extract {
    NoCalls,
    /// `outside`: the text outside the calls, in order, verbatim.
    Calls {
        outside: String,
        calls: Vec<RawCall>,
    },
    Malformed(String),
}

/// The calls of a format whose every call opens with `start`: `one_call`
/// reads one from just after its marker and returns it with the text that
/// follows it. Text between calls is `outside`; a call that does not read
/// makes the whole text malformed.
pub(crate) fn extract_opened<'a>(
    text: &'a str,
    start: &str,
    mut one_call: impl FnMut(&'a str) -> Result<(RawCall, &'a str), String>,
) -> Extract {
    let mut outside = String::new();
    let mut calls = Vec::new();
    let mut pos = 0;
    while let Some(rel) = text[pos..].find(start) {
        let open = pos + rel;
        outside.push_str(&text[pos..open]);
        match one_call(&text[open + start.len()..]) {
            Ok((call, after)) => {
                calls.push(call);
                pos = text.len() - after.len();
            }
            Err(e) => return Extract::Malformed(format!("call {}: {e}", calls.len())),
        }
    }
    if calls.is_empty() {
        return Extract::NoCalls;
    }
    outside.push_str(&text[pos..]);
    Extract::Calls { outside, calls }
}

/// One tool-call format. Implementations are stateless.
pub trait ToolParser: Send + Sync + fmt::Debug {
    /// The config name (`[model] tool_parser`).
    fn name(&self) -> &'static str;

    /// True when the format's markers are special tokens, so the caller must
    /// decode with `skip_special_tokens = false`.
    fn requires_special_tokens(&self) -> bool;

    /// The id shape the format's chat template accepts.
    fn id_style(&self) -> IdStyle {
        IdStyle::OpenAi
    }

    /// Finds the calls in a complete text.
    fn extract(&self, text: &str) -> Extract;

    /// Where a tool-call region starts in a growing text, looking at
    /// positions `from..` only (everything before `from` was `Clear`).
    /// Must agree with [`ToolParser::extract`]: the region starts at the
    /// first position `extract` treats as part of a call.
    fn scan(&self, text: &str, from: usize) -> Scan;

    /// Full parse: extraction, function-name check, content rules, ids.
    fn parse(&self, text: &str, ctx: &ParseContext, ids: &mut IdGen) -> ParsedOutput {
        finalize(self.extract(text), text, ctx, ids)
    }
}

fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// Applies the shared rules to an extraction (see the module doc).
pub fn finalize(ex: Extract, text: &str, ctx: &ParseContext, ids: &mut IdGen) -> ParsedOutput {
    let plain = |outcome| ParsedOutput {
        content: nonempty(text),
        tool_calls: Vec::new(),
        outcome,
    };
    match ex {
        Extract::NoCalls => plain(ParseOutcome::NoCalls),
        Extract::Malformed(reason) => plain(ParseOutcome::Malformed(reason)),
        Extract::Calls { calls, .. } if calls.is_empty() => plain(ParseOutcome::NoCalls),
        Extract::Calls { outside, calls } => {
            if let Some(bad) = calls.iter().find(|c| !ctx.knows(&c.name)) {
                return plain(ParseOutcome::Malformed(format!(
                    "unknown function name '{}'",
                    bad.name
                )));
            }
            let n = calls.len();
            let tool_calls = calls
                .into_iter()
                .map(|c| ToolCall {
                    id: ids.next_id(),
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect();
            ParsedOutput {
                content: nonempty(outside.trim_end()),
                tool_calls,
                outcome: ParseOutcome::Calls(n),
            }
        }
    }
}

/// The tool parser named by `[model] tool_parser`; `Ok(None)` for `none`.
pub fn tool_parser(name: &str) -> Result<Option<Box<dyn ToolParser>>, ParseError> {
    Ok(Some(match name {
        "hermes" => Box::new(hermes::Hermes),
        "llama3_json" => Box::new(llama3_json::Llama3Json),
        "mistral" => Box::new(mistral::Mistral),
        "deepseek_v3" => Box::new(deepseek_v3::DeepSeekV3),
        "deepseek_v31" => Box::new(deepseek_v31::DeepSeekV31),
        "qwen3_coder" => Box::new(qwen3_coder::Qwen3Coder),
        "glm45" => Box::new(glm45::Glm45),
        "kimi_k2" => Box::new(kimi_k2::KimiK2),
        "pythonic" => Box::new(pythonic::Pythonic),
        // Harmony output is read from its ids by the renderer (render::harmony).
        "gpt_oss" | "none" => return Ok(None),
        other => return Err(ParseError::UnknownToolParser(other.to_owned())),
    }))
}

/// The reasoning parser named by `[model] reasoning_parser` (`think`,
/// `deepseek_r1`, `glm45`, `kimi_k2`), or `Ok(None)` for `""` / `none` /
/// `gpt_oss`. `started_in_reasoning`: the rendered prompt already opened
/// `<think>` (see [`prompt_opens_reasoning`]).
pub fn reasoning_parser(
    name: &str,
    started_in_reasoning: bool,
) -> Result<Option<ReasoningParser>, ParseError> {
    let mode = match name {
        "" | "none" => return Ok(None),
        // Harmony output is parsed by the Harmony renderer from token ids.
        "gpt_oss" => return Ok(None),
        "think" => ReasoningMode::Think,
        "deepseek_r1" => ReasoningMode::DeepSeekR1,
        "glm45" => ReasoningMode::Glm45,
        "kimi_k2" => ReasoningMode::KimiK2,
        other => return Err(ParseError::UnknownReasoningParser(other.to_owned())),
    };
    Ok(Some(ReasoningParser::with_mode(mode, started_in_reasoning)))
}

/// The full assistant message parsed from one completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatOutput {
    pub reasoning_content: Option<String>,
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub outcome: ParseOutcome,
}

impl ChatOutput {
    /// The OpenAI `tool_calls` array, or `None` when there are no calls.
    pub fn tool_calls_json(&self) -> Option<Json> {
        (!self.tool_calls.is_empty()).then(|| {
            Json::Array(
                self.tool_calls
                    .iter()
                    .map(ToolCall::to_openai_json)
                    .collect(),
            )
        })
    }
}

/// Non-streaming parse of one completion: reasoning first, then tool calls
/// on the content part. With no parsers the text is the content.
pub fn parse_output(
    text: &str,
    reasoning: Option<&ReasoningParser>,
    tools: Option<&dyn ToolParser>,
    ctx: &ParseContext,
    ids: &mut IdGen,
) -> ChatOutput {
    let (reasoning_content, rest) = match reasoning {
        Some(r) => r.split(text),
        None => (None, text),
    };
    match tools {
        Some(p) => {
            let parsed = p.parse(rest, ctx, ids);
            ChatOutput {
                reasoning_content,
                content: parsed.content,
                tool_calls: parsed.tool_calls,
                outcome: parsed.outcome,
            }
        }
        None => ChatOutput {
            reasoning_content,
            content: nonempty(rest),
            tool_calls: Vec::new(),
            outcome: ParseOutcome::NoCalls,
        },
    }
}
