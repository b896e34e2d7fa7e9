//! A Responses answer (`Response`, its output items and `usage`) built from
//! what a call recorded: the same record always gives the same object, so
//! `GET /v1/responses/{id}` reads back what `POST` answered.

use serde_json::{json, Map, Value as Json};

/// What every view of one response shares: known when the call starts.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// `resp_…`.
    pub id: &'a str,
    /// Unix seconds.
    pub created_at: i64,
    pub model: &'a str,
    /// The Responses body as received.
    pub request: &'a Json,
}

/// What a finished call recorded, for its answer.
#[derive(Debug, Clone)]
pub struct Outcome<'a> {
    /// The assistant message served (chat form: `content`,
    /// `reasoning_content`, `tool_calls`).
    pub served: &'a Json,
    /// `stop`, `length`, `tool_calls` or `abort`.
    pub finish_reason: &'a str,
    /// Unix seconds.
    pub completed_at: i64,
    pub input_tokens: usize,
    pub output_tokens: usize,
    /// Sampled tokens inside the reasoning (0 without reasoning).
    pub reasoning_tokens: usize,
    /// The output text's logprobs (`LogProb` objects), when `include` asks.
    pub logprobs: Option<Vec<Json>>,
    /// tito's `return_token_ids`: the prompt's ids and the sampled ids.
    pub token_ids: Option<(&'a [u32], &'a [u32])>,
}

/// What follows `resp_` in a response id.
fn suffix(id: &str) -> &str {
    id.strip_prefix("resp_").unwrap_or(id)
}

/// The id of a response's message item.
pub fn message_id(id: &str) -> String {
    format!("msg_{}", suffix(id))
}

/// The id of a response's reasoning item.
pub fn reasoning_id(id: &str) -> String {
    format!("rs_{}", suffix(id))
}

/// The id of a response's `i`-th function call item.
pub fn call_item_id(id: &str, i: usize) -> String {
    format!("fc_{}_{i}", suffix(id))
}

/// `status` and `incomplete_details` / `error` for a finish reason.
fn status(finish: &str) -> (&'static str, Json, Json) {
    match finish {
        "length" => (
            "incomplete",
            json!({"reason": "max_output_tokens"}),
            Json::Null,
        ),
        "abort" => (
            "failed",
            Json::Null,
            json!({"code": "server_error", "message": "the backend aborted the generation"}),
        ),
        _ => ("completed", Json::Null, Json::Null),
    }
}

/// Whether an item of a response that ended with `finish` is complete.
pub fn item_status(finish: &str) -> &'static str {
    match finish {
        "length" | "abort" => "incomplete",
        _ => "completed",
    }
}

/// The served message's parts in output order: reasoning, text, calls.
pub struct Parts<'a> {
    pub reasoning: Option<&'a str>,
    pub text: Option<&'a str>,
    pub calls: Vec<&'a Json>,
}

pub fn parts(served: &Json) -> Parts<'_> {
    let nonempty = |k: &str| {
        served
            .get(k)
            .and_then(Json::as_str)
            .filter(|s| !s.is_empty())
    };
    Parts {
        reasoning: nonempty("reasoning_content"),
        text: nonempty("content"),
        calls: served
            .get("tool_calls")
            .and_then(Json::as_array)
            .map(|c| c.iter().collect())
            .unwrap_or_default(),
    }
}

/// A reasoning item holding `text`.
pub fn reasoning_item(id: &str, text: &str, status: &str) -> Json {
    json!({"type": "reasoning", "id": reasoning_id(id), "summary": [],
           "content": [{"type": "reasoning_text", "text": text}],
           "encrypted_content": null, "status": status})
}

/// An `output_text` part.
pub fn text_part(text: &str, logprobs: Vec<Json>) -> Json {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

/// A message item holding one `output_text` part.
pub fn message_item(id: &str, text: &str, logprobs: Vec<Json>, status: &str) -> Json {
    json!({"type": "message", "id": message_id(id), "role": "assistant", "status": status,
           "content": [text_part(text, logprobs)]})
}

/// A function call item for the served tool call `call` (`i`-th).
pub fn call_item(id: &str, i: usize, call: &Json, status: &str) -> Json {
    let f = call.get("function").unwrap_or(&Json::Null);
    json!({"type": "function_call", "id": call_item_id(id, i),
           "call_id": call.get("id").cloned().unwrap_or(Json::Null),
           "name": f.get("name").cloned().unwrap_or(Json::Null),
           "arguments": f.get("arguments").cloned().unwrap_or_else(|| json!("")),
           "status": status})
}

/// The output items of a finished response.
pub fn output_items(head: &Head<'_>, o: &Outcome<'_>) -> Vec<Json> {
    let st = item_status(o.finish_reason);
    let p = parts(o.served);
    let mut out = Vec::new();
    if let Some(r) = p.reasoning {
        out.push(reasoning_item(head.id, r, st));
    }
    if let Some(t) = p.text {
        out.push(message_item(
            head.id,
            t,
            o.logprobs.clone().unwrap_or_default(),
            st,
        ));
    }
    for (i, c) in p.calls.iter().enumerate() {
        out.push(call_item(head.id, i, c, st));
    }
    out
}

/// `usage` of a finished response. tito keeps no prompt cache of its own,
/// so `cached_tokens` and `cache_write_tokens` count none (what a backend
/// reused of its KV cache is not a cache hit in this sense).
pub fn usage(o: &Outcome<'_>) -> Json {
    json!({
        "input_tokens": o.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": o.output_tokens,
        "output_tokens_details": {"reasoning_tokens": o.reasoning_tokens},
        "total_tokens": o.input_tokens + o.output_tokens,
    })
}

/// The `Response` before any output: `status: "in_progress"`, no usage.
pub fn in_progress(head: &Head<'_>) -> Json {
    let mut r = base(head);
    r.insert("status".into(), json!("in_progress"));
    r.insert("completed_at".into(), Json::Null);
    r.insert("error".into(), Json::Null);
    r.insert("incomplete_details".into(), Json::Null);
    r.insert("output".into(), json!([]));
    Json::Object(r)
}

/// The finished `Response`.
pub fn finished(head: &Head<'_>, o: &Outcome<'_>) -> Json {
    let (status, incomplete, error) = status(o.finish_reason);
    let mut r = base(head);
    r.insert("status".into(), json!(status));
    r.insert("completed_at".into(), json!(o.completed_at));
    r.insert("error".into(), error);
    r.insert("incomplete_details".into(), incomplete);
    r.insert("output".into(), Json::Array(output_items(head, o)));
    r.insert("usage".into(), usage(o));
    if let Some((prompt, sampled)) = o.token_ids {
        r.insert("prompt_token_ids".into(), json!(prompt));
        r.insert("token_ids".into(), json!(sampled));
    }
    Json::Object(r)
}

/// The `Response` of a call that failed after it started (`response.failed`).
pub fn failed(head: &Head<'_>, code: &str, message: &str) -> Json {
    let mut r = base(head);
    r.insert("status".into(), json!("failed"));
    r.insert("completed_at".into(), Json::Null);
    r.insert("error".into(), json!({"code": code, "message": message}));
    r.insert("incomplete_details".into(), Json::Null);
    r.insert("output".into(), json!([]));
    Json::Object(r)
}

/// The fields every view shares: identity, and the request's settings
/// echoed as OpenAI echoes them (its defaults where the request had none).
fn base(head: &Head<'_>) -> Map<String, Json> {
    let req = head.request;
    let get = |k: &str| req.get(k).filter(|v| !v.is_null()).cloned();
    let mut r = Map::new();
    r.insert("id".into(), json!(head.id));
    r.insert("object".into(), json!("response"));
    r.insert("created_at".into(), json!(head.created_at));
    r.insert("model".into(), json!(head.model));
    r.insert(
        "instructions".into(),
        get("instructions").unwrap_or(Json::Null),
    );
    r.insert(
        "previous_response_id".into(),
        get("previous_response_id").unwrap_or(Json::Null),
    );
    r.insert("tools".into(), get("tools").unwrap_or_else(|| json!([])));
    r.insert(
        "tool_choice".into(),
        get("tool_choice").unwrap_or_else(|| json!("auto")),
    );
    r.insert(
        "parallel_tool_calls".into(),
        get("parallel_tool_calls").unwrap_or(Json::Bool(true)),
    );
    r.insert(
        "temperature".into(),
        get("temperature").unwrap_or(Json::Null),
    );
    r.insert("top_p".into(), get("top_p").unwrap_or(Json::Null));
    r.insert(
        "max_output_tokens".into(),
        get("max_output_tokens").unwrap_or(Json::Null),
    );
    r.insert(
        "top_logprobs".into(),
        get("top_logprobs").unwrap_or(Json::Null),
    );
    let mut text = match get("text") {
        Some(Json::Object(t)) => t,
        _ => Map::new(),
    };
    if text.get("format").is_none_or(Json::is_null) {
        text.insert("format".into(), json!({"type": "text"}));
    }
    r.insert("text".into(), Json::Object(text));
    r.insert(
        "reasoning".into(),
        get("reasoning").unwrap_or_else(|| json!({"effort": null, "summary": null})),
    );
    r.insert("truncation".into(), json!("disabled"));
    r.insert("store".into(), get("store").unwrap_or(Json::Bool(true)));
    r.insert("background".into(), Json::Bool(false));
    r.insert(
        "metadata".into(),
        get("metadata").unwrap_or_else(|| json!({})),
    );
    // A string in OpenAI's schema, not nullable: echoed only when given.
    if let Some(user) = get("user") {
        r.insert("user".into(), user);
    }
    r.insert(
        "service_tier".into(),
        get("service_tier").unwrap_or(Json::Null),
    );
    r
}

/// The input items of a request as `ResponseItemList` items: every item
/// gets an id (`in_{id}_{n}`, the response id's suffix and its place,
/// where the client gave none) and a
/// message's string content becomes one `input_text` part.
pub fn input_items(id: &str, request: &Json) -> Vec<Json> {
    let items: Vec<Json> = match request.get("input") {
        Some(Json::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Json::Array(list)) => list.clone(),
        _ => Vec::new(),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(n, item)| {
            let mut m = match item {
                Json::Object(m) => m,
                other => {
                    let mut m = Map::new();
                    m.insert("value".into(), other);
                    m
                }
            };
            if m.get("type").is_none() && m.get("role").is_some() {
                m.insert("type".into(), json!("message"));
            }
            if !m.get("id").is_some_and(Json::is_string) {
                m.insert("id".into(), json!(format!("in_{}_{n}", suffix(id))));
            }
            let kind = m
                .get("type")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_string();
            if kind == "message" {
                if let Some(Json::String(s)) = m.get("content").cloned() {
                    let part = if m.get("role").and_then(Json::as_str) == Some("assistant") {
                        text_part(&s, Vec::new())
                    } else {
                        json!({"type": "input_text", "text": s})
                    };
                    m.insert("content".into(), json!([part]));
                }
                m.entry("status").or_insert_with(|| json!("completed"));
            }
            if kind == "function_call" || kind == "function_call_output" {
                m.entry("status").or_insert_with(|| json!("completed"));
            }
            Json::Object(m)
        })
        .collect()
}
