//! OpenAI's Responses API (`POST /v1/responses`, shapes of
//! `shared/openai/openapi.yaml`'s `CreateResponse` and `Response`) as a chat
//! request, and its answer built from what a call recorded.
//!
//! A request's history is `instructions` (one system message), then the
//! conversation the request continues (`previous_response_id`: the earlier
//! call's history without its own instructions, then the message it
//! served), then the `input` items:
//! - a message (`type: "message"`, or no `type` with a `role`) keeps its
//!   role; `input_text` / `output_text` parts become chat text parts;
//! - consecutive `reasoning`, assistant `message` and `function_call` items
//!   form one assistant message (`reasoning_content`, `content`,
//!   `tool_calls` with the `call_id` as the tool call's id and `arguments`
//!   verbatim), in that order; an item that comes back in that order opens
//!   the next one;
//! - `function_call_output` becomes a `tool` message for its `call_id`.
//!
//! Built-in tools, images, files and item references are refused by name.
//!
//! The answer's output items come from the served message: `reasoning`,
//! then `message` (`output_text`), then one `function_call` per tool call.
//! Their ids derive from the response id, so the same record always gives
//! the same object.

pub mod output;

use serde_json::{json, Map, Value as Json};

use super::{chat_content, History, SurfaceError};

/// The `include` values accepted: logprobs are given when asked; reasoning
/// is never encrypted (its `encrypted_content` is `null`); the others name
/// outputs of built-in tools, which are refused anyway.
const INCLUDE: &[&str] = &[
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
];

/// Top-level fields refused unless null (or, for `background`, false):
/// what each would ask for and tito does not do.
const REFUSED: &[(&str, &str)] = &[
    (
        "background",
        "background responses are not supported: answers are generated while the request waits",
    ),
    (
        "conversation",
        "conversations are not supported: continue a response with `previous_response_id`",
    ),
    (
        "prompt",
        "stored prompt templates are not supported: send `input` and `instructions`",
    ),
    (
        "context_management",
        "context management is not supported: tito never drops history",
    ),
    ("moderation", "moderation is not supported"),
    (
        "audio",
        "audio output is not supported: the served model is text-only",
    ),
    ("modalities", "only text output is supported"),
];

/// Sampling fields and tito's extensions a Responses body may carry,
/// passed to the chat request as they are.
const PASSED: &[&str] = &[
    "temperature",
    "top_p",
    "top_logprobs",
    "stream",
    "parallel_tool_calls",
    "return_token_ids",
    "trajectory_id",
    "trajectory_group",
    "trajectory_metadata",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "skip_special_tokens",
];

/// What a Responses body asks that is not in its history.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    /// The chat request (`messages`, `tools`, `tool_choice`,
    /// `response_format`, `max_tokens`, sampling, tito's extensions).
    pub chat: Json,
    /// Leading messages that come from `instructions`.
    pub instructions: usize,
    /// `store` (default true): whether the answer is kept retrievable.
    pub store: bool,
    /// `include` asks for the output text's logprobs.
    pub logprobs: bool,
}

/// The chat request for Responses `body`, continuing `previous` (the
/// conversation of the response named by `previous_response_id`).
/// `template_kwargs`: the `reasoning.effort` the template reads, if any.
pub fn translate(
    body: &Json,
    previous: Option<&[Json]>,
    effort_kwarg: bool,
) -> Result<Translated, SurfaceError> {
    let obj = body
        .as_object()
        .ok_or_else(|| SurfaceError::invalid("body", "the request body must be a JSON object"))?;
    refuse(obj)?;
    let History {
        messages,
        instructions,
    } = history(body, previous)?;
    let mut chat = Map::new();
    if let Some(m) = obj.get("model") {
        chat.insert("model".into(), m.clone());
    }
    chat.insert("messages".into(), Json::Array(messages));
    for key in PASSED {
        if let Some(v) = obj.get(*key).filter(|v| !v.is_null()) {
            chat.insert((*key).into(), v.clone());
        }
    }
    match obj.get("max_output_tokens") {
        None | Some(Json::Null) => {}
        Some(v) if v.as_u64().is_some_and(|n| n >= 1) => {
            chat.insert("max_tokens".into(), v.clone());
        }
        Some(v) => {
            return Err(SurfaceError::invalid(
                "max_output_tokens",
                format!("`max_output_tokens` must be a positive integer, got {v}"),
            ))
        }
    }
    if let Some(tools) = tools(obj.get("tools"))? {
        chat.insert("tools".into(), tools);
    }
    if let Some(choice) = tool_choice(obj.get("tool_choice"))? {
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(format) = response_format(body.pointer("/text/format"))? {
        chat.insert("response_format".into(), format);
    }
    let include = include(obj.get("include"))?;
    let logprobs = include.iter().any(|i| i == "message.output_text.logprobs");
    if logprobs {
        chat.insert("logprobs".into(), Json::Bool(true));
    }
    let mut kwargs = match obj.get("chat_template_kwargs") {
        Some(Json::Object(k)) => k.clone(),
        None | Some(Json::Null) => Map::new(),
        Some(_) => {
            return Err(SurfaceError::invalid(
                "chat_template_kwargs",
                "`chat_template_kwargs` must be an object",
            ))
        }
    };
    if let Some(effort) = body.pointer("/reasoning/effort").filter(|e| !e.is_null()) {
        if !effort.is_string() {
            return Err(SurfaceError::invalid(
                "reasoning.effort",
                "`reasoning.effort` must be a string",
            ));
        }
        if effort_kwarg && !kwargs.contains_key("reasoning_effort") {
            kwargs.insert("reasoning_effort".into(), effort.clone());
        }
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Json::Object(kwargs));
    }
    let store = match obj.get("store") {
        None | Some(Json::Null) => true,
        Some(Json::Bool(b)) => *b,
        Some(_) => return Err(SurfaceError::invalid("store", "`store` must be a boolean")),
    };
    Ok(Translated {
        chat: Json::Object(chat),
        instructions,
        store,
        logprobs,
    })
}

fn refuse(obj: &Map<String, Json>) -> Result<(), SurfaceError> {
    for (field, why) in REFUSED {
        let neutral = match obj.get(*field) {
            None | Some(Json::Null) => true,
            Some(Json::Bool(false)) => *field == "background",
            Some(v) => *field == "modalities" && *v == json!(["text"]),
        };
        if !neutral {
            return Err(SurfaceError::unsupported(*field, *why));
        }
    }
    match obj.get("truncation").and_then(Json::as_str) {
        None | Some("disabled") => {}
        Some(_) => {
            return Err(SurfaceError::unsupported(
                "truncation",
                "only `truncation: \"disabled\"` is supported: tito never drops history",
            ))
        }
    }
    Ok(())
}

fn include(v: Option<&Json>) -> Result<Vec<String>, SurfaceError> {
    let list = match v {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::Array(l)) => l,
        Some(_) => return Err(SurfaceError::invalid("include", "`include` must be a list")),
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| match v.as_str() {
            Some(s) if INCLUDE.contains(&s) => Ok(s.to_string()),
            _ => Err(SurfaceError::invalid(
                format!("include[{i}]"),
                format!("`include[{i}]`: unknown value {v}"),
            )),
        })
        .collect()
}

/// Function tools as chat tools; every other tool type is refused.
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
        let kind = t.get("type").and_then(Json::as_str).unwrap_or_default();
        if kind != "function" {
            return Err(SurfaceError::unsupported(
                &param,
                format!("`{param}`: tools of type `{kind}` are not supported; only `function` tools are"),
            ));
        }
        let name = t.get("name").and_then(Json::as_str).ok_or_else(|| {
            SurfaceError::invalid(
                format!("{param}.name"),
                format!("`{param}.name` must be a string"),
            )
        })?;
        let mut f = Map::new();
        f.insert("name".into(), json!(name));
        for key in ["description", "parameters", "strict"] {
            if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                f.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Some(Json::Array(out)))
}

fn tool_choice(v: Option<&Json>) -> Result<Option<Json>, SurfaceError> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => {
            Ok(Some(json!(s)))
        }
        Some(c) if c.get("type").and_then(Json::as_str) == Some("function") => {
            let name = c.get("name").and_then(Json::as_str).ok_or_else(|| {
                SurfaceError::invalid("tool_choice.name", "`tool_choice.name` must be a string")
            })?;
            Ok(Some(
                json!({"type": "function", "function": {"name": name}}),
            ))
        }
        Some(c) => Err(SurfaceError::unsupported(
            "tool_choice",
            format!(
                "`tool_choice` {c} is not supported: use \"none\", \"auto\", \"required\" or \
                 {{\"type\": \"function\", \"name\": ...}}"
            ),
        )),
    }
}

/// `text.format` as the chat request's `response_format`.
fn response_format(v: Option<&Json>) -> Result<Option<Json>, SurfaceError> {
    let Some(f) = v.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Json::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = f.get("schema").ok_or_else(|| {
                SurfaceError::invalid("text.format.schema", "`text.format.schema` is required")
            })?;
            let mut js = Map::new();
            js.insert(
                "name".into(),
                f.get("name").cloned().unwrap_or_else(|| json!("response")),
            );
            js.insert("schema".into(), schema.clone());
            for key in ["strict", "description"] {
                if let Some(v) = f.get(key).filter(|v| !v.is_null()) {
                    js.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(SurfaceError::invalid(
            "text.format.type",
            format!("`text.format.type` must be text, json_object or json_schema, got {f}"),
        )),
    }
}

/// The chat history of Responses `body` continuing `previous` (module doc).
pub fn history(body: &Json, previous: Option<&[Json]>) -> Result<History, SurfaceError> {
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) if s.is_empty() => {}
        Some(Json::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => {
            return Err(SurfaceError::invalid(
                "instructions",
                "`instructions` must be a string",
            ))
        }
    }
    let instructions = messages.len();
    if let Some(prev) = previous {
        messages.extend_from_slice(prev);
    }
    match body.get("input") {
        None | Some(Json::Null) if previous.is_some() => {}
        None | Some(Json::Null) => {
            return Err(SurfaceError::invalid("input", "`input` is required"));
        }
        Some(Json::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Json::Array(items)) => Items::default().read(items, &mut messages)?,
        Some(_) => {
            return Err(SurfaceError::invalid(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
    }
    if messages.len() == instructions {
        return Err(SurfaceError::invalid("input", "`input` must not be empty"));
    }
    Ok(History {
        messages,
        instructions,
    })
}

/// Whether an assistant message in `history` made the tool call `id`.
fn answers_a_call(history: &[Json], id: &str) -> bool {
    history
        .iter()
        .filter_map(|m| m.get("tool_calls").and_then(Json::as_array))
        .flatten()
        .any(|c| c.get("id").and_then(Json::as_str) == Some(id))
}

/// The assistant message being gathered from consecutive items, and how
/// far into its order (reasoning, content, tool calls) it has come.
#[derive(Default)]
struct Items {
    open: Option<Map<String, Json>>,
    stage: u8,
}

impl Items {
    fn read(mut self, items: &[Json], out: &mut Vec<Json>) -> Result<(), SurfaceError> {
        for (i, item) in items.iter().enumerate() {
            let param = format!("input[{i}]");
            let kind = match item.get("type").and_then(Json::as_str) {
                Some(k) => k,
                None if item.get("role").is_some() => "message",
                None => {
                    return Err(SurfaceError::invalid(
                        &param,
                        format!("`{param}` has neither a `type` nor a `role`"),
                    ))
                }
            };
            match kind {
                "message" => self.message(item, &param, out)?,
                "reasoning" => {
                    let text = reasoning_text(item, &param)?;
                    let m = self.assistant(0, out);
                    if !text.is_empty() {
                        m.insert("reasoning_content".into(), json!(text));
                    }
                }
                "function_call" => {
                    let field = |k: &str| {
                        item.get(k).and_then(Json::as_str).ok_or_else(|| {
                            SurfaceError::invalid(
                                format!("{param}.{k}"),
                                format!("`{param}.{k}` must be a string"),
                            )
                        })
                    };
                    let call = json!({"id": field("call_id")?, "type": "function",
                        "function": {"name": field("name")?, "arguments": field("arguments")?}});
                    let m = self.assistant(2, out);
                    match m.get_mut("tool_calls") {
                        Some(Json::Array(calls)) => calls.push(call),
                        _ => {
                            m.insert("tool_calls".into(), Json::Array(vec![call]));
                        }
                    }
                }
                "function_call_output" => {
                    self.close(out);
                    let call_id = item.get("call_id").and_then(Json::as_str).ok_or_else(|| {
                        SurfaceError::invalid(
                            format!("{param}.call_id"),
                            format!("`{param}.call_id` must be a string"),
                        )
                    })?;
                    if !answers_a_call(out, call_id) {
                        return Err(SurfaceError::invalid(
                            format!("{param}.call_id"),
                            format!("`{param}.call_id`: no earlier `function_call` has the call id {call_id:?}"),
                        ));
                    }
                    let output = item.get("output").unwrap_or(&Json::Null);
                    let content =
                        chat_content(output, &["input_text", "output_text", "input_image"], &format!("{param}.output"))?;
                    out.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
                }
                "item_reference" => {
                    return Err(SurfaceError::unsupported(
                        &param,
                        format!("`{param}`: item references are not supported; continue a response with `previous_response_id`"),
                    ))
                }
                other => {
                    return Err(SurfaceError::unsupported(
                        &param,
                        format!("`{param}`: items of type `{other}` are not supported"),
                    ))
                }
            }
        }
        self.close(out);
        Ok(())
    }

    fn message(
        &mut self,
        item: &Json,
        param: &str,
        out: &mut Vec<Json>,
    ) -> Result<(), SurfaceError> {
        let role = item.get("role").and_then(Json::as_str).unwrap_or_default();
        let content = item.get("content").unwrap_or(&Json::Null);
        let cparam = format!("{param}.content");
        match role {
            "user" | "system" | "developer" => {
                self.close(out);
                let content = chat_content(content, &["input_text", "input_image"], &cparam)?;
                out.push(json!({"role": role, "content": content}));
            }
            "assistant" => {
                let text = match content {
                    Json::String(s) => s.clone(),
                    Json::Array(parts) => assistant_text(parts, &cparam)?,
                    _ => {
                        return Err(SurfaceError::invalid(
                            &cparam,
                            format!("`{cparam}` must be a string or a list of output parts"),
                        ))
                    }
                };
                let m = self.assistant(1, out);
                let joined = match m.get("content").and_then(Json::as_str) {
                    Some(before) if !before.is_empty() => format!("{before}{text}"),
                    _ => text,
                };
                m.insert("content".into(), json!(joined));
            }
            _ => {
                return Err(SurfaceError::invalid(
                    format!("{param}.role"),
                    format!("`{param}.role` must be user, system, developer or assistant"),
                ))
            }
        }
        Ok(())
    }

    /// The open assistant message, for an item of order `stage` (0
    /// reasoning, 1 text, 2 tool call): one that comes back in the order
    /// (or repeats reasoning or text) closes the open one first.
    fn assistant(&mut self, stage: u8, out: &mut Vec<Json>) -> &mut Map<String, Json> {
        let goes_back =
            self.open.is_some() && (stage < self.stage || (stage == self.stage && stage < 2));
        if goes_back {
            self.close(out);
        }
        self.stage = stage;
        self.open.get_or_insert_with(|| {
            let mut m = Map::new();
            m.insert("role".into(), json!("assistant"));
            m
        })
    }

    fn close(&mut self, out: &mut Vec<Json>) {
        if let Some(mut m) = self.open.take() {
            m.entry("content").or_insert_with(|| json!(""));
            out.push(Json::Object(m));
        }
        self.stage = 0;
    }
}

/// An assistant message's text: its `output_text` parts (and `refusal`
/// parts' text) in order.
fn assistant_text(parts: &[Json], param: &str) -> Result<String, SurfaceError> {
    let mut text = String::new();
    for (i, p) in parts.iter().enumerate() {
        let key = match p.get("type").and_then(Json::as_str) {
            Some("output_text") | Some("input_text") => "text",
            Some("refusal") => "refusal",
            Some(other) => {
                return Err(SurfaceError::unsupported(
                    format!("{param}[{i}]"),
                    format!("`{param}[{i}]`: parts of type `{other}` are not supported"),
                ))
            }
            None => {
                return Err(SurfaceError::invalid(
                    format!("{param}[{i}]"),
                    format!("`{param}[{i}]` has no `type`"),
                ))
            }
        };
        let t = p.get(key).and_then(Json::as_str).ok_or_else(|| {
            SurfaceError::invalid(
                format!("{param}[{i}].{key}"),
                format!("`{param}[{i}].{key}` must be a string"),
            )
        })?;
        text.push_str(t);
    }
    Ok(text)
}

/// A reasoning item's text: its `content` (`reasoning_text` parts), else
/// its `summary` (`summary_text` parts), each joined.
fn reasoning_text(item: &Json, param: &str) -> Result<String, SurfaceError> {
    if let Some(Json::String(e)) = item.get("encrypted_content") {
        if !e.is_empty() {
            return Err(SurfaceError::unsupported(
                format!("{param}.encrypted_content"),
                format!("`{param}.encrypted_content`: tito keeps reasoning in the clear and cannot read encrypted reasoning"),
            ));
        }
    }
    let join = |key: &str, kind: &str| -> Result<String, SurfaceError> {
        let Some(Json::Array(parts)) = item.get(key) else {
            return Ok(String::new());
        };
        let mut text = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let t = p.get("text").and_then(Json::as_str);
            match (p.get("type").and_then(Json::as_str), t) {
                (Some(k), Some(t)) if k == kind => text.push(t),
                _ => {
                    return Err(SurfaceError::invalid(
                        format!("{param}.{key}[{i}]"),
                        format!("`{param}.{key}[{i}]` must be a `{kind}` part with `text`"),
                    ))
                }
            }
        }
        Ok(text.join("\n"))
    };
    let content = join("content", "reasoning_text")?;
    if !content.is_empty() {
        return Ok(content);
    }
    join("summary", "summary_text")
}

/// The conversation a later call continuing this one starts from: its
/// history without its instructions, then the message it served.
pub fn continued(history: &[Json], instructions: usize, served: &Json) -> Vec<Json> {
    let mut out: Vec<Json> = history.get(instructions..).unwrap_or_default().to_vec();
    // Checked image parts go back to the `image_url` parts a request holds,
    // naming the stored image: the next call checks them again.
    for part in out
        .iter_mut()
        .filter_map(|m| m.get_mut("content").and_then(Json::as_array_mut))
        .flatten()
    {
        if crate::render::placeholders::part_size(part).is_some() {
            let url = part.get("image").cloned().unwrap_or(Json::Null);
            *part = json!({"type": "image_url", "image_url": {"url": url}});
        }
    }
    out.push(served.clone());
    out
}

#[cfg(test)]
mod tests;
