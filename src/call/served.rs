//! What a choice serves: for chat, which tool-call and reasoning parsers
//! apply and how the choice's text becomes the OpenAI assistant message
//! (`content`, `reasoning_content`, `tool_calls`, finish reason); for
//! completions, the text. The token ids are never touched here: they stay
//! exactly as sampled.

use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::assemble::ChoiceResult;
use crate::config::Config;
use crate::error::ApiError;
use crate::parse::{
    parse_output, prompt_closes_reasoning, prompt_opens_reasoning, reasoning_parser, tool_parser,
    ChatOutput, ChatStream, DeltaEvent, IdGen, IdStyle, ParseContext, ParseOutcome,
    ReasoningParser,
};
use crate::render::harmony::{Harmony, HarmonyStream};

/// The parsers that apply to one chat request.
pub struct ParseSetup {
    /// The Harmony format: `openai-harmony` reads the sampled ids, and the
    /// text parsers below are off.
    harmony: Option<Arc<Harmony>>,
    tool_parser: Option<String>,
    reasoning: Option<ReasoningParser>,
    ctx: ParseContext,
    style: IdStyle,
    /// Seeds the tool-call ids: the streamed deltas and the message recorded
    /// for the same choice carry the same ids, so an agent that echoes the
    /// streamed message continues the call it got.
    seed: u64,
    /// The tool parser needs special tokens in the text it reads.
    pub needs_special_tokens: bool,
}

impl ParseSetup {
    /// None when no parser applies (plain text content). `harmony`: the
    /// renderer's Harmony format, when it renders one.
    pub fn new(
        config: &Config,
        harmony: Option<&Arc<Harmony>>,
        tools: Option<&Vec<Json>>,
        tool_choice: Option<&Json>,
        prompt_text: &str,
    ) -> Result<Option<Self>, ApiError> {
        let internal = |e: crate::parse::ParseError| ApiError::internal(e.to_string());
        let tools_on = tools.is_some_and(|t| !t.is_empty())
            && tool_choice.and_then(Json::as_str) != Some("none");
        if let Some(h) = harmony {
            // Tools off (or `tool_parser = "none"`): a message to a function
            // is content, as any unknown function's is.
            let parse_tools = tools_on && config.model.tool_parser != "none";
            let ctx = match (parse_tools, tools) {
                (true, Some(t)) => ParseContext::from_tools(Some(&Json::Array(t.clone()))),
                _ => ParseContext {
                    tool_names: Some(Vec::new()),
                    ..ParseContext::default()
                },
            };
            return Ok(Some(ParseSetup {
                harmony: Some(h.clone()),
                tool_parser: None,
                reasoning: None,
                ctx,
                style: IdStyle::OpenAi,
                seed: rand::random(),
                needs_special_tokens: true,
            }));
        }
        let tp = if tools_on {
            tool_parser(&config.model.tool_parser).map_err(internal)?
        } else {
            None
        };
        let reasoning = reasoning_parser(
            &config.model.reasoning_parser,
            prompt_opens_reasoning(prompt_text),
        )
        .map_err(internal)?
        .filter(|_| !prompt_closes_reasoning(prompt_text));
        if tp.is_none() && reasoning.is_none() {
            return Ok(None);
        }
        let tools = tools.map(|t| Json::Array(t.clone()));
        Ok(Some(ParseSetup {
            harmony: None,
            needs_special_tokens: tp.as_ref().is_some_and(|p| p.requires_special_tokens()),
            style: tp.as_ref().map_or(IdStyle::OpenAi, |p| p.id_style()),
            tool_parser: tp.as_ref().map(|_| config.model.tool_parser.clone()),
            reasoning,
            ctx: ParseContext::from_tools(tools.as_ref()),
            seed: rand::random(),
        }))
    }

    /// The id generator of choice `index`: equal for its stream and its parse.
    fn ids(&self, index: u32) -> IdGen {
        IdGen::seeded(self.seed ^ (u64::from(index) << 40), self.style)
    }

    fn parser(&self) -> Option<Box<dyn crate::parse::ToolParser>> {
        self.tool_parser
            .as_deref()
            .and_then(|n| tool_parser(n).ok().flatten())
    }

    /// Choice `index`'s whole text (decoded from `ids`), parsed.
    pub fn parse(&self, index: u32, text: &str, ids: &[u32]) -> ChatOutput {
        if let Some(h) = &self.harmony {
            return HarmonyStream::parse(h.encoding(), ids, self.ctx.clone(), self.ids(index));
        }
        let tp = self.parser();
        parse_output(
            text,
            self.reasoning.as_ref(),
            tp.as_deref(),
            &self.ctx,
            &mut self.ids(index),
        )
    }

    /// Choice `index`'s text as it streams.
    pub fn stream(&self, index: u32) -> ChoiceStream {
        if let Some(h) = &self.harmony {
            return ChoiceStream::Harmony(Box::new(HarmonyStream::new(
                h.encoding(),
                self.ctx.clone(),
                self.ids(index),
            )));
        }
        ChoiceStream::Text(Box::new(ChatStream::new(
            self.reasoning.as_ref(),
            self.parser(),
            self.ctx.clone(),
            self.ids(index),
        )))
    }
}

/// One choice's parse as it streams: over its text, or (Harmony) its ids.
#[derive(Debug)]
pub enum ChoiceStream {
    Text(Box<ChatStream>),
    Harmony(Box<HarmonyStream>),
}

impl ChoiceStream {
    /// Feeds one delta: its text and the sampled ids it was decoded from.
    pub fn push(&mut self, text: &str, ids: &[u32]) -> Vec<DeltaEvent> {
        match self {
            ChoiceStream::Text(s) => s.push(text),
            ChoiceStream::Harmony(s) => s.push(ids),
        }
    }

    /// Ends the choice; returns the last events.
    pub fn finish(&mut self) -> Vec<DeltaEvent> {
        match self {
            ChoiceStream::Text(s) => s.finish(),
            ChoiceStream::Harmony(s) => s.finish(),
        }
    }

    /// The message assembled from the events sent so far.
    pub fn output(&self) -> ChatOutput {
        match self {
            ChoiceStream::Text(s) => s.output(),
            ChoiceStream::Harmony(s) => s.output(),
        }
    }
}

/// The OpenAI assistant message for a parsed output.
pub fn message_json(out: &ChatOutput) -> Json {
    let mut m = json!({"role": "assistant"});
    let calls = out.tool_calls_json();
    m["content"] = match (&out.content, &calls) {
        (Some(c), _) => json!(c),
        (None, Some(_)) => Json::Null,
        (None, None) => json!(""),
    };
    if let Some(r) = &out.reasoning_content {
        m["reasoning_content"] = json!(r);
    }
    if let Some(c) = calls {
        m["tool_calls"] = c;
    }
    m
}

/// `tool_calls` when calls were parsed, else the backend's finish reason.
pub fn finish_reason(out: &ChatOutput, backend: &'static str) -> &'static str {
    match out.outcome {
        ParseOutcome::Calls(_) => "tool_calls",
        _ => backend,
    }
}

/// How a call's choices are served.
#[derive(Clone)]
pub enum Output {
    /// `/v1/completions`: the text.
    Text,
    /// `/v1/chat/completions`: an assistant message, parsed when a parser applies.
    Chat(Option<Arc<ParseSetup>>),
    /// `tool_choice` forced a call, so the output was constrained to JSON:
    /// the named function's arguments, or (`None`, `"required"`) a list of
    /// `{"name", "parameters"}`.
    ForcedTools(Option<String>),
}

/// Fills what `r` serves: message or text, client finish reason, parse outcome.
pub fn serve(output: &Output, r: &mut ChoiceResult) {
    let backend_finish = r
        .finish
        .map_or("stop", crate::backend::FinishReason::as_str);
    match output {
        Output::Text => {
            r.served = json!({"text": r.text}).into();
            r.finish_reason = backend_finish;
        }
        Output::Chat(None) => {
            r.served = json!({"role": "assistant", "content": r.text}).into();
            r.finish_reason = backend_finish;
        }
        Output::ForcedTools(name) => match forced_calls(name.as_deref(), &r.text) {
            Ok(calls) => {
                let n = calls.len();
                r.served =
                    json!({"role": "assistant", "content": null, "tool_calls": calls}).into();
                r.finish_reason = "tool_calls";
                r.parse_outcome = Some(crate::parse::ParseOutcome::Calls(n).to_string());
            }
            Err(why) => {
                r.served = json!({"role": "assistant", "content": r.text}).into();
                r.finish_reason = backend_finish;
                r.parse_outcome = Some(crate::parse::ParseOutcome::Malformed(why).to_string());
            }
        },
        Output::Chat(Some(p)) => {
            let o = p.parse(r.index, &r.text, &r.ids);
            r.served = message_json(&o).into();
            r.finish_reason = finish_reason(&o, backend_finish);
            r.parse_outcome = Some(o.outcome.to_string());
        }
    }
}

/// The tool calls of a constrained answer (see [`Output::ForcedTools`]).
fn forced_calls(name: Option<&str>, text: &str) -> Result<Vec<Json>, String> {
    let v: Json = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let mut ids = IdGen::random(IdStyle::OpenAi);
    let mut call = |name: &str, args: &Json| {
        json!({"id": ids.next_id(), "type": "function",
               "function": {"name": name, "arguments": args.to_string()}})
    };
    match (name, &v) {
        (Some(n), Json::Object(_)) => Ok(vec![call(n, &v)]),
        (None, Json::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|it| {
                let n = it
                    .get("name")
                    .and_then(Json::as_str)
                    .ok_or("a call without a name")?;
                let args = it.get("parameters").ok_or("a call without parameters")?;
                Ok(call(n, args))
            })
            .collect::<Result<_, &str>>()
            .map_err(str::to_string),
        _ => Err("not the constrained shape".into()),
    }
}
