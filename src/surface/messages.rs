//! Anthropic's Messages API (`POST /v1/messages`, the shapes of the
//! `anthropic` SDK's `MessageCreateParams` and `Message` types) as a chat
//! request, and its answer built from what a call recorded.
//!
//! A request's history is `system` (one system message), then `messages`:
//! - a user message's `tool_result` blocks become `tool` messages (for
//!   their `tool_use_id`), placed before the rest of that message, whose
//!   `text` blocks become chat text parts;
//! - an assistant message's `thinking` blocks become `reasoning_content`
//!   (their signature is checked: it must be the one tito gave that
//!   thinking), its `text` blocks `content`, its `tool_use` blocks
//!   `tool_calls` (the block's id as the call's, `input` as JSON text);
//!   `redacted_thinking` is opaque and never shown to the model.
//!
//! Images, documents, citations and server tools are refused by name.

use serde_json::{json, Map, Value as Json};
use sha2::{Digest, Sha256};

use super::{chat_content, History, SurfaceError};

/// Sampling fields and tito's extensions passed to the chat request as
/// they are.
const PASSED: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "return_token_ids",
    "trajectory_id",
    "trajectory_group",
    "trajectory_metadata",
    "min_p",
    "seed",
    "skip_special_tokens",
];

/// Top-level fields refused unless null: what each asks for.
const REFUSED: &[(&str, &str)] = &[
    (
        "container",
        "containers (server-side code execution) are not supported",
    ),
    (
        "mcp_servers",
        "MCP servers are not supported: give the tools as `tools`",
    ),
    (
        "context_management",
        "context management is not supported: tito never drops history",
    ),
];

/// What a Messages body asks that is not in its history.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub chat: Json,
    /// `stop_sequences`, to tell `stop_sequence` from `end_turn`.
    pub stop_sequences: Vec<String>,
}

/// The chat request for Messages `body`. `thinking_kwarg`: the chat
/// template reads `enable_thinking`, which `thinking` then sets.
pub fn translate(body: &Json, thinking_kwarg: bool) -> Result<Translated, SurfaceError> {
    let obj = body
        .as_object()
        .ok_or_else(|| SurfaceError::invalid("body", "the request body must be a JSON object"))?;
    for (field, why) in REFUSED {
        if obj.get(*field).is_some_and(|v| !v.is_null()) {
            return Err(SurfaceError::unsupported(*field, *why));
        }
    }
    if obj.get("model").and_then(Json::as_str).is_none() {
        return Err(SurfaceError::invalid("model", "`model` is required"));
    }
    let max_tokens = match obj.get("max_tokens") {
        Some(v) if v.as_u64().is_some_and(|n| n >= 1) => v.clone(),
        Some(v) => {
            return Err(SurfaceError::invalid(
                "max_tokens",
                format!("`max_tokens` must be a positive integer, got {v}"),
            ))
        }
        None => {
            return Err(SurfaceError::invalid(
                "max_tokens",
                "`max_tokens` is required",
            ))
        }
    };
    let History { messages, .. } = history(body)?;
    let mut chat = Map::new();
    chat.insert("model".into(), obj["model"].clone());
    chat.insert("messages".into(), Json::Array(messages));
    chat.insert("max_tokens".into(), max_tokens.clone());
    for key in PASSED {
        if let Some(v) = obj.get(*key).filter(|v| !v.is_null()) {
            chat.insert((*key).into(), v.clone());
        }
    }
    let stop_sequences = stop_sequences(obj.get("stop_sequences"))?;
    if !stop_sequences.is_empty() {
        chat.insert("stop".into(), json!(stop_sequences));
    }
    if let Some(tools) = tools(obj.get("tools"))? {
        chat.insert("tools".into(), tools);
    }
    let (choice, parallel) = tool_choice(obj.get("tool_choice"))?;
    if let Some(c) = choice {
        chat.insert("tool_choice".into(), c);
    }
    if let Some(p) = parallel {
        chat.insert("parallel_tool_calls".into(), json!(p));
    }
    if let Some(f) = output_format(obj.get("output_config"))? {
        chat.insert("response_format".into(), f);
    }
    let mut kwargs = Map::new();
    if let Some(on) = thinking(obj.get("thinking"), &max_tokens)? {
        if thinking_kwarg {
            kwargs.insert("enable_thinking".into(), json!(on));
        }
    }
    if let Some(Json::Object(extra)) = obj.get("chat_template_kwargs") {
        for (k, v) in extra {
            kwargs.insert(k.clone(), v.clone());
        }
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Json::Object(kwargs));
    }
    Ok(Translated {
        chat: Json::Object(chat),
        stop_sequences,
    })
}

fn stop_sequences(v: Option<&Json>) -> Result<Vec<String>, SurfaceError> {
    match v {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(l)) => l
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    SurfaceError::invalid(
                        format!("stop_sequences[{i}]"),
                        format!("`stop_sequences[{i}]` must be a string"),
                    )
                })
            })
            .collect(),
        Some(_) => Err(SurfaceError::invalid(
            "stop_sequences",
            "`stop_sequences` must be a list of strings",
        )),
    }
}

/// `thinking` as the template's thinking switch: `Some(true)` for
/// `enabled`, `Some(false)` for `disabled`.
fn thinking(v: Option<&Json>, max_tokens: &Json) -> Result<Option<bool>, SurfaceError> {
    let Some(t) = v.filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    match t.get("type").and_then(Json::as_str) {
        Some("disabled") => Ok(Some(false)),
        Some("enabled") => {
            let budget = t
                .get("budget_tokens")
                .and_then(Json::as_u64)
                .ok_or_else(|| {
                    SurfaceError::invalid(
                        "thinking.budget_tokens",
                        "`thinking.budget_tokens` must be a positive integer",
                    )
                })?;
            let max = max_tokens.as_u64().unwrap_or(0);
            if budget < 1024 || budget >= max {
                return Err(SurfaceError::invalid(
                    "thinking.budget_tokens",
                    format!("`thinking.budget_tokens` must be at least 1024 and less than `max_tokens` ({max}), got {budget}"),
                ));
            }
            Ok(Some(true))
        }
        other => Err(SurfaceError::unsupported(
            "thinking.type",
            format!(
                "`thinking.type` {} is not supported: use \"enabled\" or \"disabled\"",
                other.map_or("(missing)".to_string(), |o| format!("\"{o}\""))
            ),
        )),
    }
}

/// Custom tools as chat function tools (`input_schema` as `parameters`);
/// Anthropic's server tools (any other `type`) are refused.
fn tools(v: Option<&Json>) -> Result<Option<Json>, SurfaceError> {
    let list = match v {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(l)) => l,
        Some(_) => return Err(SurfaceError::invalid("tools", "`tools` must be a list")),
    };
    if list.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        match t.get("type").and_then(Json::as_str) {
            None | Some("custom") => {}
            Some(kind) => {
                return Err(SurfaceError::unsupported(
                    &param,
                    format!(
                    "`{param}`: server tools (`{kind}`) are not supported; only custom tools are"
                ),
                ))
            }
        }
        let name = t.get("name").and_then(Json::as_str).ok_or_else(|| {
            SurfaceError::invalid(
                format!("{param}.name"),
                format!("`{param}.name` must be a string"),
            )
        })?;
        let schema = t
            .get("input_schema")
            .filter(|s| s.is_object())
            .ok_or_else(|| {
                SurfaceError::invalid(
                    format!("{param}.input_schema"),
                    format!("`{param}.input_schema` must be a JSON Schema object"),
                )
            })?;
        let mut f = Map::new();
        f.insert("name".into(), json!(name));
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            f.insert("description".into(), d.clone());
        }
        f.insert("parameters".into(), schema.clone());
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Some(Json::Array(out)))
}

/// `tool_choice` as the chat one, and `disable_parallel_tool_use` as
/// `parallel_tool_calls: false`.
fn tool_choice(v: Option<&Json>) -> Result<(Option<Json>, Option<bool>), SurfaceError> {
    let Some(c) = v.filter(|c| !c.is_null()) else {
        return Ok((None, None));
    };
    let parallel = match c.get("disable_parallel_tool_use") {
        None | Some(Json::Null) => None,
        Some(Json::Bool(b)) => Some(!b),
        Some(_) => {
            return Err(SurfaceError::invalid(
                "tool_choice.disable_parallel_tool_use",
                "`tool_choice.disable_parallel_tool_use` must be a boolean",
            ))
        }
    };
    let choice = match c.get("type").and_then(Json::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = c.get("name").and_then(Json::as_str).ok_or_else(|| {
                SurfaceError::invalid("tool_choice.name", "`tool_choice.name` must be a string")
            })?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(SurfaceError::invalid(
                "tool_choice.type",
                format!("`tool_choice.type` must be auto, any, tool or none, got {c}"),
            ))
        }
    };
    Ok((Some(choice), parallel))
}

/// `output_config.format` as the chat request's `response_format`; its
/// `effort` is kept with the request and has no effect.
fn output_format(v: Option<&Json>) -> Result<Option<Json>, SurfaceError> {
    let Some(f) = v.and_then(|c| c.get("format")).filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Json::as_str) {
        Some("json_schema") => {
            let schema = f.get("schema").ok_or_else(|| {
                SurfaceError::invalid("output_config.format.schema", "`output_config.format.schema` is required")
            })?;
            Ok(Some(json!({"type": "json_schema",
                "json_schema": {"name": "output", "schema": schema}})))
        }
        _ => Err(SurfaceError::unsupported(
            "output_config.format.type",
            format!("`output_config.format` {f} is not supported: use {{\"type\": \"json_schema\", \"schema\": ...}}"),
        )),
    }
}

/// The chat history of Messages `body` (module doc).
pub fn history(body: &Json) -> Result<History, SurfaceError> {
    let mut out = Vec::new();
    match body.get("system") {
        None | Some(Json::Null) => {}
        Some(system) => {
            let content = chat_content(system, &["text"], "system")?;
            out.push(json!({"role": "system", "content": content}));
        }
    }
    let list = match body.get("messages") {
        Some(Json::Array(l)) if !l.is_empty() => l,
        Some(Json::Array(_)) => {
            return Err(SurfaceError::invalid(
                "messages",
                "`messages` must not be empty",
            ))
        }
        _ => {
            return Err(SurfaceError::invalid(
                "messages",
                "`messages` must be a list",
            ))
        }
    };
    // The ids of the tool calls so far: a tool result answers one of them.
    let mut tool_ids = std::collections::HashSet::new();
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let content = m.get("content").unwrap_or(&Json::Null);
        match m.get("role").and_then(Json::as_str) {
            Some("user") => user(content, &format!("{param}.content"), &tool_ids, &mut out)?,
            Some("assistant") => {
                let message = assistant(content, &format!("{param}.content"))?;
                let calls = message.get("tool_calls").and_then(Json::as_array);
                for id in calls.into_iter().flatten().filter_map(|c| c.get("id")) {
                    tool_ids.insert(id.as_str().unwrap_or_default().to_string());
                }
                out.push(message);
            }
            Some("system") => {
                let content = chat_content(content, &["text"], &format!("{param}.content"))?;
                out.push(json!({"role": "system", "content": content}));
            }
            _ => {
                return Err(SurfaceError::invalid(
                    format!("{param}.role"),
                    format!("`{param}.role` must be user, assistant or system"),
                ))
            }
        }
    }
    Ok(History {
        messages: out,
        instructions: 0,
    })
}

/// The block at `param` as an object with a `type`.
fn block_type<'a>(b: &'a Json, param: &str) -> Result<&'a str, SurfaceError> {
    b.get("type").and_then(Json::as_str).ok_or_else(|| {
        SurfaceError::invalid(
            param,
            format!("`{param}` must be a content block with a `type`"),
        )
    })
}

fn string_field<'a>(b: &'a Json, key: &str, param: &str) -> Result<&'a str, SurfaceError> {
    b.get(key).and_then(Json::as_str).ok_or_else(|| {
        SurfaceError::invalid(
            format!("{param}.{key}"),
            format!("`{param}.{key}` must be a string"),
        )
    })
}

fn unsupported_block(param: &str, kind: &str) -> SurfaceError {
    SurfaceError::unsupported(
        param,
        format!("`{param}`: `{kind}` blocks are not supported; the served model takes text"),
    )
}

fn text_block(b: &Json, param: &str) -> Result<String, SurfaceError> {
    if b.get("citations")
        .is_some_and(|c| c.as_array().is_some_and(|l| !l.is_empty()))
    {
        return Err(SurfaceError::unsupported(
            format!("{param}.citations"),
            format!("`{param}.citations`: citations are not supported"),
        ));
    }
    Ok(string_field(b, "text", param)?.to_string())
}

/// A user message: its tool results as tool messages, then its text.
/// `tool_ids`: the ids of the earlier `tool_use` blocks, one of which each
/// `tool_result` must answer.
fn user(
    content: &Json,
    param: &str,
    tool_ids: &std::collections::HashSet<String>,
    out: &mut Vec<Json>,
) -> Result<(), SurfaceError> {
    let blocks = match content {
        Json::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Json::Array(b) => b,
        _ => {
            return Err(SurfaceError::invalid(
                param,
                format!("`{param}` must be a string or a list of content blocks"),
            ))
        }
    };
    let mut parts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bparam = format!("{param}[{j}]");
        match block_type(b, &bparam)? {
            "text" => parts.push(json!({"type": "text", "text": text_block(b, &bparam)?})),
            "image" => {
                let url = super::image_url(b, "image", &bparam)?.unwrap_or_default();
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            "tool_result" => {
                let id = string_field(b, "tool_use_id", &bparam)?;
                if !tool_ids.contains(id) {
                    return Err(SurfaceError::invalid(
                        format!("{bparam}.tool_use_id"),
                        format!(
                            "`{bparam}.tool_use_id`: no earlier `tool_use` block has the id {id:?}"
                        ),
                    ));
                }
                let content = match b.get("content") {
                    None | Some(Json::Null) => json!(""),
                    Some(c) => chat_content(c, &["text", "image"], &format!("{bparam}.content"))?,
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            kind => return Err(unsupported_block(&bparam, kind)),
        }
    }
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

/// An assistant message as a chat assistant message.
fn assistant(content: &Json, param: &str) -> Result<Json, SurfaceError> {
    let blocks = match content {
        Json::String(s) => return Ok(json!({"role": "assistant", "content": s})),
        Json::Array(b) => b,
        _ => {
            return Err(SurfaceError::invalid(
                param,
                format!("`{param}` must be a string or a list of content blocks"),
            ))
        }
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bparam = format!("{param}[{j}]");
        match block_type(b, &bparam)? {
            "text" => text.push_str(&text_block(b, &bparam)?),
            "thinking" => {
                let thought = string_field(b, "thinking", &bparam)?;
                let signature = string_field(b, "signature", &bparam)?;
                if !signature_matches(signature, thought) {
                    return Err(SurfaceError::invalid(
                        format!("{bparam}.signature"),
                        format!("`{bparam}.signature` is not the signature tito gave this thinking: the thinking was changed, or did not come from tito"),
                    ));
                }
                reasoning.push_str(thought);
            }
            "redacted_thinking" => {}
            "tool_use" => {
                let id = string_field(b, "id", &bparam)?;
                let name = string_field(b, "name", &bparam)?;
                let input = b.get("input").filter(|i| i.is_object()).ok_or_else(|| {
                    SurfaceError::invalid(
                        format!("{bparam}.input"),
                        format!("`{bparam}.input` must be an object"),
                    )
                })?;
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            kind => return Err(unsupported_block(&bparam, kind)),
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert("content".into(), json!(text));
    if !reasoning.is_empty() {
        m.insert("reasoning_content".into(), json!(reasoning));
    }
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Json::Array(calls));
    }
    Ok(Json::Object(m))
}

/// The signature tito gives a thinking block of message `id`: the id,
/// then a digest of the id and the thinking, so that the block comes back
/// checked (a changed thinking no longer matches) and names its message.
pub fn signature(id: &str, thinking: &str) -> String {
    format!("{id}.{}", digest(id, thinking))
}

fn digest(id: &str, thinking: &str) -> String {
    let mut h = Sha256::new();
    h.update(id.as_bytes());
    h.update([0u8]);
    h.update(thinking.as_bytes());
    hex::encode(&h.finalize()[..16])
}

fn signature_matches(signature: &str, thinking: &str) -> bool {
    signature
        .rsplit_once('.')
        .is_some_and(|(id, d)| digest(id, thinking) == d)
}

/// `stop_reason` and `stop_sequence` for a finish: `tool_calls` →
/// `tool_use`, `length` → `max_tokens`, a stop on one of the request's
/// `stop_sequences` → `stop_sequence` (naming it), another stop →
/// `end_turn`; an aborted generation has none.
pub fn stop_reason(
    finish: &str,
    stopped_on: Option<&str>,
    stop_sequences: &[String],
) -> (Json, Json) {
    match finish {
        "tool_calls" => (json!("tool_use"), Json::Null),
        "length" => (json!("max_tokens"), Json::Null),
        "stop" => match stopped_on.filter(|s| stop_sequences.iter().any(|q| q == s)) {
            Some(s) => (json!("stop_sequence"), json!(s)),
            None => (json!("end_turn"), Json::Null),
        },
        _ => (Json::Null, Json::Null),
    }
}

/// The content blocks of the served message: thinking (signed), text,
/// then one `tool_use` per tool call (`input` parsed from its arguments).
pub fn content_blocks(id: &str, served: &Json) -> Vec<Json> {
    let nonempty = |k: &str| {
        served
            .get(k)
            .and_then(Json::as_str)
            .filter(|s| !s.is_empty())
    };
    let mut out = Vec::new();
    if let Some(r) = nonempty("reasoning_content") {
        out.push(json!({"type": "thinking", "thinking": r, "signature": signature(id, r)}));
    }
    if let Some(t) = nonempty("content") {
        out.push(json!({"type": "text", "text": t}));
    }
    for c in tool_calls(served) {
        out.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}));
    }
    out
}

/// A served tool call as a `tool_use` block wants it.
pub struct ToolUse<'a> {
    pub id: &'a str,
    pub name: &'a str,
    /// The arguments as sampled (JSON text).
    pub arguments: &'a str,
    /// The arguments parsed: an object (the tool parsers only make calls
    /// whose arguments are JSON objects).
    pub input: Json,
}

pub fn tool_calls(served: &Json) -> Vec<ToolUse<'_>> {
    let Some(Json::Array(calls)) = served.get("tool_calls") else {
        return Vec::new();
    };
    calls
        .iter()
        .map(|c| {
            let f = c.get("function");
            let arguments = f
                .and_then(|f| f.get("arguments"))
                .and_then(Json::as_str)
                .unwrap_or("{}");
            ToolUse {
                id: c.get("id").and_then(Json::as_str).unwrap_or_default(),
                name: f
                    .and_then(|f| f.get("name"))
                    .and_then(Json::as_str)
                    .unwrap_or_default(),
                arguments,
                input: serde_json::from_str::<Json>(arguments)
                    .ok()
                    .filter(Json::is_object)
                    .unwrap_or_else(|| json!({})),
            }
        })
        .collect()
}

/// The `Message` of a finished call.
pub fn message(
    id: &str,
    model: &str,
    served: &Json,
    (stop_reason, stop_sequence): (Json, Json),
    input_tokens: usize,
    output_tokens: usize,
) -> Json {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(id, served),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &Json) -> Json {
        translate(body, true).expect("translates").chat
    }

    #[test]
    fn system_tool_use_and_results_become_chat_messages() {
        let sig = signature("msg_1", "plan");
        let body = json!({"model": "m", "max_tokens": 64, "system": "be brief",
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": sig},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_a", "name": "w", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "sunny", "is_error": false},
                {"type": "text", "text": "and tomorrow?"}]},
        ]});
        let c = chat(&body);
        assert_eq!(c["max_tokens"], 64);
        assert_eq!(
            c["messages"],
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "Checking.", "reasoning_content": "plan",
                 "tool_calls": [{"id": "call_a", "type": "function",
                    "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
                {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]},
            ])
        );
    }

    #[test]
    fn a_changed_thinking_fails_its_signature() {
        let sig = signature("msg_1", "plan");
        let body = json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "another plan", "signature": sig}]},
            {"role": "user", "content": "y"}]});
        let e = translate(&body, false).expect_err("refused");
        assert_eq!(e.param, "messages[1].content[0].signature");
    }

    #[test]
    fn tools_choice_thinking_and_stops_map() {
        let body = json!({"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "w", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "stop_sequences": ["END"], "temperature": 0.2, "top_k": 5});
        let t = translate(&body, true).expect("translates");
        let c = &t.chat;
        assert_eq!(
            c["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(c["tool_choice"], "required");
        assert_eq!(c["parallel_tool_calls"], false);
        assert_eq!(c["chat_template_kwargs"]["enable_thinking"], true);
        assert_eq!(c["stop"], json!(["END"]));
        assert_eq!(c["top_k"], 5);
        assert_eq!(t.stop_sequences, ["END"]);
        let off = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
            "thinking": {"type": "disabled"}});
        assert_eq!(chat(&off)["chat_template_kwargs"]["enable_thinking"], false);
    }

    #[test]
    fn bad_and_unbuilt_requests_are_refused_by_name() {
        let base = |extra: Json| {
            let mut b = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]});
            if let (Some(o), Json::Object(e)) = (b.as_object_mut(), extra) {
                o.extend(e);
            }
            b
        };
        let cases = [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (
                base(json!({"tools": [{"type": "web_search_20250305", "name": "s"}]})),
                "tools[0]",
            ),
            (base(json!({"container": "c1"})), "container"),
            (
                base(json!({"thinking": {"type": "enabled", "budget_tokens": 100}})),
                "thinking.budget_tokens",
            ),
            (
                base(json!({"thinking": {"type": "adaptive"}})),
                "thinking.type",
            ),
            (
                base(json!({"messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]})),
                "messages[0].content[0].source",
            ),
            (
                base(json!({"messages": [{"role": "user", "content": [
                {"type": "tool_result", "content": "x"}]}]})),
                "messages[0].content[0].tool_use_id",
            ),
            (
                base(json!({"messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_a", "name": "w", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_b", "content": "x"}]}]})),
                "messages[2].content[0].tool_use_id",
            ),
            (base(json!({"messages": []})), "messages"),
        ];
        for (body, param) in cases {
            let e = translate(&body, true).expect_err("refused");
            assert_eq!(e.param, param, "{body}");
        }
    }

    #[test]
    fn the_answer_signs_thinking_and_names_its_stop() {
        let served = json!({"role": "assistant", "reasoning_content": "r", "content": "t",
            "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]});
        let blocks = content_blocks("msg_9", &served);
        assert_eq!(blocks[0]["type"], "thinking");
        assert!(signature_matches(
            blocks[0]["signature"].as_str().unwrap_or_default(),
            "r"
        ));
        assert_eq!(blocks[1], json!({"type": "text", "text": "t"}));
        assert_eq!(blocks[2]["input"], json!({"a": 1}));
        let stops = vec!["END".to_string()];
        assert_eq!(
            stop_reason("stop", Some("END"), &stops),
            (json!("stop_sequence"), json!("END"))
        );
        assert_eq!(
            stop_reason("stop", None, &stops),
            (json!("end_turn"), Json::Null)
        );
        assert_eq!(stop_reason("length", None, &stops).0, json!("max_tokens"));
        assert_eq!(stop_reason("tool_calls", None, &stops).0, json!("tool_use"));
    }
}
