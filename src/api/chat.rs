//! `POST /v1/chat/completions`: parse → prepare (render the exact prompt,
//! plan the call) → run (see `call`) → respond in OpenAI's chat shape,
//! streaming or not.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::RawPathParams;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{json, Value as Json};

use super::logprobs::chat_logprobs;
use super::request::{parse_body, ChatRequest};
use super::run::{self, ChatCall, Surface};
use super::sse::{usage, Chunks};
use super::stream::{Deltas, Encoder, Out};
use super::{new_id, AppState, Picked};
use crate::call::{Answer, ChoiceEvent, ParseSetup};
use crate::error::ApiError;
use crate::metrics::PHASE;
use crate::parse::DeltaEvent;
use crate::surface::Api;

const ROUTE: &str = "/v1/chat/completions";

pub async fn chat_completions(
    path: RawPathParams,
    headers: HeaderMap,
    Picked(state, body): Picked,
) -> Response {
    let ids = super::PathIds::of(&path);
    match handle(state, ids, &headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

/// What the client wants in its response (independent of what is recorded).
#[derive(Clone)]
struct Shape {
    logprobs: bool,
    token_ids: bool,
    usage_chunk: bool,
    /// The request used the deprecated `functions`: answer `function_call`.
    legacy_functions: bool,
    /// The id it is answered as (the model or an adapter).
    model: String,
}

/// Parses and checks a chat request into the call the shared run makes.
fn parse(
    state: &AppState,
    path: super::PathIds,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(ChatCall, Shape), ApiError> {
    let (mut req, received): (ChatRequest, _) = parse_body(&body)?;
    let legacy_functions = req.map_legacy_functions()?;
    req.check()?;
    // A template that reads `reasoning_effort` (Harmony's does) takes the
    // request's top-level field as that kwarg, unless the kwargs set it.
    const EFFORT: &str = "reasoning_effort";
    let effort = received.get(EFFORT).filter(|v| !v.is_null());
    let honoured: &[&str] = match effort {
        Some(e) if state.renderer.template_reads(EFFORT) => {
            let kwargs = req
                .chat_template_kwargs
                .get_or_insert_with(Default::default);
            kwargs.entry(EFFORT).or_insert_with(|| e.clone());
            &[EFFORT]
        }
        _ => &[],
    };
    super::unsupported::chat(&received, honoured)?;
    let mut shape = Shape {
        logprobs: req.logprobs_k()?.is_some(),
        token_ids: req.return_token_ids,
        usage_chunk: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        legacy_functions,
        model: String::new(),
    };
    let call = chat_call(
        state,
        path,
        headers,
        req,
        received,
        body,
        Api::Chat,
        new_id("chatcmpl"),
    )?;
    shape.model = state.served_id(call.adapter.as_deref());
    Ok((call, shape))
}

/// The call of a checked chat request `req`, which came through `api` as
/// `received` (`body` its bytes), answered under `request_id`: the
/// trajectory it names, sampling, structured output, forced tools.
#[allow(clippy::too_many_arguments)]
pub(super) fn chat_call(
    state: &AppState,
    path: super::PathIds,
    headers: &HeaderMap,
    mut req: ChatRequest,
    received: Json,
    body: Bytes,
    api: Api,
    request_id: String,
) -> Result<ChatCall, ApiError> {
    let normalized =
        crate::trajectory::normalize::messages(&mut req.messages, state.renderer.content_format());
    let adapter = state.check_model(req.model.as_deref())?;
    let named = super::named_trajectory_id(path.tid, headers, req.trajectory_id.as_deref())?;
    let tag = super::named_metadata(
        path.gid,
        headers,
        req.trajectory_group.as_deref(),
        req.trajectory_metadata.as_ref(),
    )?;
    let logprobs_k = req.logprobs_k()?;
    let (mut params, max_tokens) = req
        .sampling
        .validate(logprobs_k, state.renderer.vocab_size())?;
    params.structured = req.structured()?;
    let forced = req.forced_tools()?;
    if let Some((schema, _)) = &forced {
        params.structured = Some(crate::backend::StructuredOutput::JsonSchema(schema.clone()));
    }
    let n = req.sampling.n()?;
    state.check_sequences(1, n)?;
    Ok(ChatCall {
        req,
        received,
        body,
        normalized,
        named,
        tag,
        params,
        max_tokens,
        forced,
        n,
        api,
        request_id,
        response_id: None,
        instructions: 0,
        adapter,
    })
}

async fn handle(
    state: AppState,
    path: super::PathIds,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let handled = Instant::now();
    let (call, shape) = tracing::info_span!(target: PHASE, "parse")
        .in_scope(|| parse(&state, path, headers, body))?;
    run::run(state, call, headers, ChatSurface { shape }, handled).await
}

/// Chat Completions' answer: a `chat.completion` body or
/// `chat.completion.chunk` events.
struct ChatSurface {
    shape: Shape,
}

impl Surface for ChatSurface {
    type Stream = ChatEncoder;

    fn route(&self) -> &'static str {
        ROUTE
    }

    fn overhead_label(&self) -> &'static str {
        "chat"
    }

    fn body(&self, state: &AppState, answer: &Answer) -> Result<Response, ApiError> {
        Ok(axum::Json(response_body(state, answer, &self.shape)).into_response())
    }

    fn stream(
        &self,
        state: &AppState,
        created: u64,
        parsing: Option<Arc<ParseSetup>>,
        forced: bool,
    ) -> ChatEncoder {
        let chunks = Chunks::new(
            state,
            "chat.completion.chunk",
            created,
            &self.shape.model,
            self.shape.clone(),
        );
        ChatEncoder::new(chunks, parsing, forced)
    }
}

/// A `chat.completion` body, serialized straight from the answer: no JSON
/// tree is built per call, and the served messages are borrowed.
#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: String,
    choices: Vec<CompletionChoice<'a>>,
    usage: Json,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    index: u32,
    message: Message<'a>,
    logprobs: Json,
    finish_reason: &'static str,
    stop_reason: Json,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<&'a [u32]>,
}

/// A served message as OpenAI shapes it: with `refusal: null` (tito never
/// refuses; what it served is recorded without the field), and in the
/// deprecated function-calling shape when the request used `functions`.
enum Message<'a> {
    Served(&'a Json),
    Legacy(Json),
}

impl Serialize for Message<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let served = match self {
            Message::Legacy(m) => return m.serialize(s),
            Message::Served(m) => m,
        };
        let Some(fields) = served.as_object() else {
            return served.serialize(s);
        };
        let has_refusal = fields.contains_key("refusal");
        let mut map = s.serialize_map(Some(fields.len() + usize::from(!has_refusal)))?;
        for (k, v) in fields {
            match k.as_str() {
                "refusal" => map.serialize_entry(k, &Json::Null)?,
                _ => map.serialize_entry(k, v)?,
            }
        }
        if !has_refusal {
            map.serialize_entry("refusal", &Json::Null)?;
        }
        map.end()
    }
}

fn response_body<'a>(state: &'a AppState, answer: &'a Answer, shape: &'a Shape) -> Completion<'a> {
    let choices = answer
        .choices
        .iter()
        .map(|r| {
            let (message, finish_reason) = if shape.legacy_functions {
                let mut m = Json::clone(&r.served);
                if let Some(obj) = m.as_object_mut() {
                    obj.insert("refusal".into(), Json::Null);
                }
                as_function_call(&mut m);
                (Message::Legacy(m), legacy_finish(r.finish_reason))
            } else {
                (Message::Served(&r.served), r.finish_reason)
            };
            CompletionChoice {
                index: r.index,
                message,
                logprobs: match shape.logprobs {
                    true => chat_logprobs(&state.renderer, &r.ids, &r.logprobs),
                    false => Json::Null,
                },
                finish_reason,
                stop_reason: r.stop_reason_json(),
                token_ids: shape.token_ids.then_some(r.ids.as_slice()),
            }
        })
        .collect();
    Completion {
        id: &answer.request_id,
        object: "chat.completion",
        created: answer.created,
        model: &shape.model,
        system_fingerprint: state.system_fingerprint(),
        choices,
        usage: usage(answer.prompt_tokens(), answer.completion_tokens()),
        prompt_token_ids: answer
            .prompts
            .first()
            .filter(|_| shape.token_ids)
            .map(|p| p.as_slice()),
    }
}

/// Formats `chat.completion.chunk` objects.
type ChatChunks = Chunks<Shape>;

impl ChatChunks {
    /// The opening chunk of choice `i` (role; prompt ids on choice 0).
    fn open(&self, id: &str, i: u32, prompt: Option<&[u32]>) -> Json {
        let mut c = self.chunk(
            id,
            json!([{"index": i, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null}]),
        );
        if let (true, Some(p)) = (self.shape.token_ids, prompt) {
            c["prompt_token_ids"] = json!(p);
        }
        c
    }

    /// One chunk per message delta; this event's ids and logprobs ride on
    /// the first (an event with ids but no text still gets one chunk).
    fn deltas(&self, id: &str, ev: &ChoiceEvent, mut deltas: Vec<Json>) -> Vec<Json> {
        if deltas.is_empty() && !ev.ids.is_empty() {
            deltas.push(json!({}));
        }
        deltas
            .into_iter()
            .enumerate()
            .map(|(k, mut d)| {
                if self.shape.legacy_functions {
                    as_function_call(&mut d);
                }
                let mut c = json!({"index": ev.index, "delta": d, "logprobs": null,
                                   "finish_reason": null});
                if k == 0 && self.shape.logprobs {
                    c["logprobs"] = chat_logprobs(&self.renderer, &ev.ids, &ev.logprobs);
                }
                if k == 0 && self.shape.token_ids {
                    c["token_ids"] = json!(ev.ids);
                }
                self.chunk(id, json!([c]))
            })
            .collect()
    }

    /// Finish chunks, then the usage chunk when asked for.
    fn end(&self, answer: &Answer) -> Vec<Json> {
        let legacy = self.shape.legacy_functions;
        self.head
            .end(answer, self.shape.usage_chunk, |index, finish| {
                let finish = if legacy {
                    legacy_finish(finish)
                } else {
                    finish
                };
                json!({"index": index, "delta": {}, "logprobs": null,
                   "finish_reason": finish})
            })
    }
}

/// The streaming response: role chunks, then each backend delta as it comes
/// (through the incremental tool / reasoning parser when one applies), then,
/// once the call is recorded, the finish chunks and usage. With `forced` (a
/// forced tool call), the constrained JSON is not streamed as content: the
/// tool calls are sent once the call is recorded.
struct ChatEncoder {
    chunks: ChatChunks,
    deltas: Deltas,
}

impl ChatEncoder {
    fn new(chunks: ChatChunks, parsing: Option<Arc<ParseSetup>>, forced: bool) -> Self {
        ChatEncoder {
            chunks,
            deltas: Deltas::new(parsing, forced),
        }
    }
}

impl Encoder for ChatEncoder {
    fn open(&mut self, id: &str, prompts: &[Arc<Vec<u32>>], n: u32) -> Vec<Out> {
        self.deltas.open(n);
        let prompt = prompts.first();
        (0..n)
            .map(|i| {
                let p = prompt.filter(|_| i == 0).map(|p| &p[..]);
                Out::json(&self.chunks.open(id, i, p))
            })
            .collect()
    }

    fn delta(&mut self, id: &str, ev: &ChoiceEvent) -> Vec<Out> {
        let deltas = self
            .deltas
            .of(ev)
            .iter()
            .map(DeltaEvent::to_openai_delta)
            .collect();
        let chunks = self.chunks.deltas(id, ev, deltas);
        chunks.iter().map(Out::json).collect()
    }

    fn end(&mut self, answer: &Answer) -> Vec<Out> {
        let mut out = Vec::new();
        if self.deltas.forced() {
            for r in &answer.choices {
                let ev = ChoiceEvent {
                    index: r.index,
                    ..Default::default()
                };
                let delta = served_delta(&r.served);
                out.extend(self.chunks.deltas(&answer.request_id, &ev, vec![delta]));
            }
        }
        out.extend(self.chunks.end(answer));
        out.iter().map(Out::json).collect()
    }

    /// Per choice, the role chunk, one delta with the whole served message
    /// (tool calls indexed as OpenAI streams them) and every id and
    /// logprob; then the finish chunks and usage.
    fn replay(&mut self, answer: &Answer) -> Vec<Out> {
        let id = &answer.request_id;
        let prompt = answer.prompts.first();
        let mut out = Vec::new();
        for r in &answer.choices {
            let p = prompt.filter(|_| r.index == 0).map(|p| &p[..]);
            out.push(self.chunks.open(id, r.index, p));
            out.extend(
                self.chunks
                    .deltas(id, &r.as_event(), vec![served_delta(&r.served)]),
            );
        }
        out.extend(self.chunks.end(answer));
        out.iter().map(Out::json).collect()
    }
}

/// The deprecated function-calling shape of a message or delta: its first
/// tool call (index 0) as `function_call`, no `tool_calls`.
fn as_function_call(v: &mut Json) {
    let Some(obj) = v.as_object_mut() else {
        return;
    };
    if let Some(Json::Array(calls)) = obj.remove("tool_calls") {
        let first = calls
            .iter()
            .find(|c| c.get("index").is_none_or(|i| i == 0))
            .and_then(|c| c.get("function"));
        if let Some(f) = first {
            obj.insert("function_call".into(), f.clone());
        }
    }
}

fn legacy_finish(finish: &'static str) -> &'static str {
    if finish == "tool_calls" {
        "function_call"
    } else {
        finish
    }
}

/// A served message as one stream delta: no role (the opening chunk has
/// it), tool calls indexed as OpenAI streams them.
fn served_delta(served: &Json) -> Json {
    let mut delta = served.clone();
    if let Some(obj) = delta.as_object_mut() {
        obj.remove("role");
        if let Some(Json::Array(calls)) = obj.get_mut("tool_calls") {
            for (i, c) in calls.iter_mut().enumerate() {
                c["index"] = json!(i);
            }
        }
    }
    delta
}
