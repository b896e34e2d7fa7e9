//! gpt-oss's Harmony format through OpenAI's `openai-harmony` crate: a chat
//! request becomes a Harmony conversation, which the crate renders to the
//! prompt ids; sampled ids are read back by the crate's streaming parser
//! (see [`HarmonyStream`]).
//!
//! The mapping follows vLLM's gpt-oss chat serving (`harmony_utils.py`:
//! `build_harmony_preamble`, `parse_chat_input_to_harmony_message`,
//! `auto_drop_analysis_messages`; docs/api.md cites the lines), with one
//! difference made for training: the system message's date is
//! `chat_template_kwargs.conversation_start_date`, never the clock (the
//! trajectory layer fills it with the trajectory's first day).
//!
//! Must not: tokenize text itself (the crate writes every id), or reach the
//! network (the encoding file is checked to be local before the crate loads).

use std::collections::HashMap;
use std::path::PathBuf;

use openai_harmony::chat::{
    Author, Conversation, DeveloperContent, Message, ReasoningEffort, Role, SystemContent,
    ToolDescription,
};
use openai_harmony::{
    load_harmony_encoding, HarmonyEncoding, HarmonyEncodingName, StreamableParser,
};
use serde_json::{Map, Value as Json};

use super::harmony_cache::RenderCache;
use super::RenderError;

/// The variable naming the folder of `o200k_base.tiktoken`, read by the crate.
pub const ENCODINGS_VAR: &str = "TIKTOKEN_ENCODINGS_BASE";
/// The file the crate's gpt-oss encoding loads (and checks the SHA-256 of).
pub const ENCODING_FILE: &str = "o200k_base.tiktoken";
/// The `openai-harmony` version tito renders with (Cargo.toml pins it).
pub const CRATE_VERSION: &str = "0.0.8";
/// The name `[model] chat_template` gives this format.
pub const TEMPLATE_NAME: &str = "harmony";

/// The template kwargs Harmony reads.
pub const KWARG_EFFORT: &str = "reasoning_effort";
pub const KWARG_DATE: &str = "conversation_start_date";

/// The gpt-oss encoding and the ids of its formatting tokens.
pub struct Harmony {
    enc: HarmonyEncoding,
    /// `<|return|>` and `<|call|>`: where a sampled assistant turn ends.
    stop_ids: Vec<u32>,
    end_id: u32,
    start_id: u32,
    assistant_ids: Vec<u32>,
    cache: RenderCache,
}

impl std::fmt::Debug for Harmony {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harmony")
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

impl Harmony {
    /// Loads the gpt-oss encoding from `$TIKTOKEN_ENCODINGS_BASE`, refusing
    /// (instead of letting the crate download it) when the file is absent.
    pub fn load() -> Result<Harmony, RenderError> {
        let load_err = |message: String| RenderError::Load {
            path: format!("${ENCODINGS_VAR}/{ENCODING_FILE}"),
            message,
        };
        let dir = std::env::var_os(ENCODINGS_VAR).ok_or_else(|| {
            load_err(format!(
                "the Harmony format needs {ENCODING_FILE}: set {ENCODINGS_VAR} to the folder \
                 holding it (scripts/fetch-tokenizers.sh builds it from the gpt-oss tokenizer.json)"
            ))
        })?;
        let file = PathBuf::from(dir).join(ENCODING_FILE);
        if !file.is_file() {
            return Err(load_err(format!("{} does not exist", file.display())));
        }
        let enc = load_harmony_encoding(HarmonyEncodingName::HarmonyGptOss)
            .map_err(|e| load_err(format!("{e:#}")))?;
        let special = |t: &str| {
            enc.tokenizer()
                .encode_with_special_tokens(t)
                .first()
                .copied()
                .ok_or_else(|| load_err(format!("the encoding has no {t}")))
        };
        let mut stop_ids: Vec<u32> = enc
            .stop_tokens_for_assistant_actions()
            .map_err(|e| load_err(format!("{e:#}")))?
            .into_iter()
            .collect();
        stop_ids.sort_unstable();
        Ok(Harmony {
            end_id: special("<|end|>")?,
            start_id: special("<|start|>")?,
            assistant_ids: enc.tokenizer().encode_ordinary("assistant"),
            stop_ids,
            enc,
            cache: RenderCache::new(),
        })
    }

    /// The crate's encoding (for [`HarmonyStream`]).
    pub fn encoding(&self) -> &HarmonyEncoding {
        &self.enc
    }

    /// The ids that end a sampled assistant turn (`<|return|>`, `<|call|>`).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// How many of `ids` (sampled) belong to `analysis` messages, headers
    /// and end tokens included: the reasoning tokens of a Responses usage.
    pub fn reasoning_tokens(&self, ids: &[u32]) -> usize {
        let Ok(mut p) = StreamableParser::new(self.enc.clone(), Some(Role::Assistant)) else {
            return 0;
        };
        let (mut start, mut n) = (0, 0);
        for (i, &id) in ids.iter().enumerate() {
            let before = p.messages().len();
            if p.process(id).is_err() {
                return n;
            }
            if p.messages().len() > before {
                let last = p.messages().last();
                if last.is_some_and(|m| m.channel.as_deref() == Some("analysis")) {
                    n += i + 1 - start;
                }
                start = i + 1;
            }
        }
        if p.current_channel().as_deref() == Some("analysis") {
            n += ids.len() - start;
        }
        n
    }

    /// The prompt ids of a whole conversation.
    pub fn render_ids(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        kwargs: Option<&Map<String, Json>>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, RenderError> {
        let (preamble, rest) = harmony_conversation(messages, tools, kwargs)?;
        let failed = |e: anyhow::Error| RenderError::Template(format!("{e:#}"));
        // The preamble as a conversation: the crate words the system message
        // by whether the developer message declares functions.
        let mut out = self
            .cache
            .get_or_render(key(preamble.as_slice())?, || {
                self.enc
                    .render_conversation(&preamble, None)
                    .map_err(failed)
            })?
            .to_vec();
        for m in &rest {
            let ids = self
                .cache
                .get_or_render(key(m)?, || self.enc.render(m, None).map_err(failed))?;
            out.extend_from_slice(&ids);
        }
        if add_generation_prompt {
            out.push(self.start_id);
            out.extend_from_slice(&self.assistant_ids);
        }
        Ok(out)
    }

    /// The ids that follow a served assistant turn: `messages[from..]`
    /// rendered one by one (tool names looked up in all of `messages`),
    /// then the generation prompt. `ended`: the sampled ids ended the turn
    /// (on `<|return|>` / `<|call|>`); otherwise `<|end|>` closes it first.
    pub fn continuation_ids(
        &self,
        messages: &[Json],
        from: usize,
        ended: bool,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, RenderError> {
        let names = tool_names_by_id(messages);
        let mut out = Vec::new();
        if !ended {
            out.push(self.end_id);
        }
        for m in messages.get(from..).unwrap_or_default() {
            for hm in harmony_messages(m, &names)? {
                let ids = self
                    .enc
                    .render(&hm, None)
                    .map_err(|e| RenderError::Template(format!("{e:#}")))?;
                out.extend(ids);
            }
        }
        if add_generation_prompt {
            out.push(self.start_id);
            out.extend_from_slice(&self.assistant_ids);
        }
        Ok(out)
    }
}

/// A request's conversation in Harmony messages (see the module doc).
pub fn conversation(
    messages: &[Json],
    tools: Option<&[Json]>,
    kwargs: Option<&Map<String, Json>>,
) -> Result<Conversation, RenderError> {
    let (mut preamble, rest) = harmony_conversation(messages, tools, kwargs)?;
    preamble.extend(rest);
    Ok(Conversation::from_messages(preamble))
}

/// The cache key of what renders to ids: its JSON.
fn key(v: &(impl serde::Serialize + ?Sized)) -> Result<String, RenderError> {
    serde_json::to_string(v).map_err(|e| RenderError::Template(e.to_string()))
}

/// The system and developer preamble, and the conversation's other
/// messages (analysis before the last `final` dropped).
fn harmony_conversation(
    messages: &[Json],
    tools: Option<&[Json]>,
    kwargs: Option<&Map<String, Json>>,
) -> Result<(Vec<Message>, Vec<Message>), RenderError> {
    let bad = |m: String| RenderError::Template(m);
    let kwarg = |k: &str| kwargs.and_then(|m| m.get(k)).filter(|v| !v.is_null());
    let effort = match kwarg(KWARG_EFFORT) {
        None => ReasoningEffort::Medium,
        Some(v) => match v.as_str() {
            Some("low") => ReasoningEffort::Low,
            Some("medium") => ReasoningEffort::Medium,
            Some("high") => ReasoningEffort::High,
            _ => {
                return Err(bad(format!(
                    "{KWARG_EFFORT} {v} is not one of \"low\", \"medium\", \"high\""
                )))
            }
        },
    };
    let mut system = SystemContent::new().with_reasoning_effort(effort);
    match kwarg(KWARG_DATE) {
        None => {}
        Some(Json::String(d)) => system = system.with_conversation_start_date(d.clone()),
        Some(v) => return Err(bad(format!("{KWARG_DATE} must be a string, not {v}"))),
    }
    let mut out = vec![Message::from_role_and_content(Role::System, system)];

    let (instructions, rest) = match messages.first() {
        Some(m) if matches!(role(m), Some("system" | "developer")) => {
            let text = flatten(m.get("content")).filter(|t| !t.is_empty());
            (text, &messages[1..])
        }
        _ => (None, messages),
    };
    let functions = function_tools(tools)?;
    if instructions.is_some() || !functions.is_empty() {
        let mut dev = DeveloperContent::new();
        if let Some(i) = instructions {
            dev = dev.with_instructions(i);
        }
        if !functions.is_empty() {
            dev = dev.with_function_tools(functions);
        }
        out.push(Message::from_role_and_content(Role::Developer, dev));
    }
    let names = tool_names_by_id(messages);
    let mut body = Vec::new();
    for m in rest {
        body.extend(harmony_messages(m, &names)?);
    }
    Ok((out, drop_early_analysis(body)))
}

/// The `type: "function"` tools as Harmony tool descriptions.
fn function_tools(tools: Option<&[Json]>) -> Result<Vec<ToolDescription>, RenderError> {
    let mut out = Vec::new();
    for t in tools.unwrap_or_default() {
        if t.get("type").and_then(Json::as_str) != Some("function") {
            return Err(RenderError::Template(format!(
                "tool type {} is not supported by the Harmony format (only \"function\")",
                t.get("type").unwrap_or(&Json::Null)
            )));
        }
        let f = t.get("function").unwrap_or(&Json::Null);
        let name = f.get("name").and_then(Json::as_str).unwrap_or_default();
        let description = f.get("description").and_then(Json::as_str).unwrap_or("");
        let parameters = f.get("parameters").filter(|p| !p.is_null()).cloned();
        out.push(ToolDescription::new(name, description, parameters));
    }
    Ok(out)
}

fn role(m: &Json) -> Option<&str> {
    m.get("role").and_then(Json::as_str)
}

/// A content's text: the string, or the joined `text` of its parts; None
/// when there is no text at all.
fn flatten(content: Option<&Json>) -> Option<String> {
    match content? {
        Json::String(s) => Some(s.clone()),
        Json::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p {
                    Json::String(s) => Some(s.as_str()),
                    p => p.get("text").and_then(Json::as_str),
                })
                .collect();
            (!texts.is_empty()).then(|| texts.concat())
        }
        _ => None,
    }
}

/// A message's reasoning text, under any of the names clients send it.
fn reasoning(m: &Json) -> Option<&str> {
    ["reasoning_content", "reasoning", "thinking"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Json::as_str))
        .filter(|r| !r.is_empty())
}

/// Tool-call id → function name, over every assistant message.
fn tool_names_by_id(messages: &[Json]) -> HashMap<&str, &str> {
    messages
        .iter()
        .filter_map(|m| m.get("tool_calls").and_then(Json::as_array))
        .flatten()
        .filter_map(|c| {
            let id = c.get("id")?.as_str()?;
            let name = c.pointer("/function/name")?.as_str()?;
            Some((id, name))
        })
        .collect()
}

/// One chat message as Harmony messages.
fn harmony_messages(m: &Json, names: &HashMap<&str, &str>) -> Result<Vec<Message>, RenderError> {
    let assistant = |text: &str, channel: &str| {
        Message::from_role_and_content(Role::Assistant, text).with_channel(channel)
    };
    let content = flatten(m.get("content"));
    let mut out = Vec::new();
    match role(m) {
        Some("assistant") => {
            let calls = m
                .get("tool_calls")
                .and_then(Json::as_array)
                .filter(|c| !c.is_empty());
            if let Some(calls) = calls {
                if let Some(c) = content.as_deref().filter(|c| !c.is_empty()) {
                    out.push(assistant(c, "commentary"));
                }
                if let Some(r) = reasoning(m) {
                    out.push(assistant(r, "analysis"));
                }
                for call in calls {
                    let name = call.pointer("/function/name").and_then(Json::as_str);
                    let args = call.pointer("/function/arguments").and_then(Json::as_str);
                    out.push(
                        assistant(args.unwrap_or(""), "commentary")
                            .with_recipient(format!("functions.{}", name.unwrap_or("")))
                            .with_content_type("json"),
                    );
                }
            } else {
                if let Some(r) = reasoning(m) {
                    out.push(assistant(r, "analysis"));
                }
                if let Some(c) = content.as_deref().filter(|c| !c.is_empty()) {
                    out.push(assistant(c, "final"));
                }
            }
        }
        Some("tool") => {
            let by_id = m
                .get("tool_call_id")
                .and_then(Json::as_str)
                .and_then(|id| names.get(id).copied());
            let name = by_id
                .or_else(|| m.get("name").and_then(Json::as_str))
                .unwrap_or("");
            let author = Author::new(Role::Tool, format!("functions.{name}"));
            out.push(
                Message::from_author_and_content(author, content.unwrap_or_default())
                    .with_channel("commentary")
                    .with_recipient("assistant"),
            );
        }
        // Only a leading one is instructions (see `conversation`); a later
        // one stays a plain message of its role.
        Some(r @ ("system" | "developer")) => {
            let role = if r == "system" {
                Role::System
            } else {
                Role::Developer
            };
            out.push(Message::from_role_and_content(
                role,
                content.unwrap_or_default(),
            ));
        }
        Some("user") => {
            out.push(Message::from_role_and_content(
                Role::User,
                content.unwrap_or_default(),
            ));
        }
        other => {
            return Err(RenderError::Template(format!(
                "message role {} is not one the Harmony format has \
                 (system, developer, user, assistant, tool)",
                other.map_or("(none)".to_string(), |r| format!("'{r}'"))
            )))
        }
    }
    Ok(out)
}

/// Drops the analysis messages before the last assistant `final` message:
/// a finished answer's chain of thought is not shown to later turns.
fn drop_early_analysis(msgs: Vec<Message>) -> Vec<Message> {
    let last_final = msgs
        .iter()
        .rposition(|m| m.author.role == Role::Assistant && m.channel.as_deref() == Some("final"));
    let Some(last_final) = last_final else {
        return msgs;
    };
    msgs.into_iter()
        .enumerate()
        .filter(|(i, m)| !(*i < last_final && m.channel.as_deref() == Some("analysis")))
        .map(|(_, m)| m)
        .collect()
}

/// The template kwargs with `conversation_start_date` set to `date` when
/// the request gave none.
pub fn with_start_date(kwargs: Option<&Map<String, Json>>, date: &str) -> Map<String, Json> {
    let mut out = kwargs.cloned().unwrap_or_default();
    if out.get(KWARG_DATE).is_none_or(Json::is_null) {
        out.insert(KWARG_DATE.into(), Json::String(date.to_owned()));
    }
    out
}

pub use super::harmony_stream::HarmonyStream;
