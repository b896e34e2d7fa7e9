//! `POST /v1/chat/completions`: parse → prepare (render the exact prompt,
//! plan the call) → run (see `call`) → respond in OpenAI's chat shape,
//! streaming or not.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{RawPathParams, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{json, Value as Json};

use super::logprobs::chat_logprobs;
use super::request::{parse_body, ChatRequest};
use super::sse::{sse_response, usage, Chunks};
use super::stream::{self, Encoder, Out};
use super::{new_id, unix_now, AppState};
use crate::call::replies::Claim;
use crate::call::{Answer, ChoiceEvent, Output, ParseSetup, PlanRequest};
use crate::error::ApiError;
use crate::metrics::PHASE;
use crate::parse::ChatStream;
use crate::render::{run_render_work, RenderInput};
use crate::trajectory::messages::render_bytes;
use crate::trajectory::{CallContext, ChatInput, Prepared};

const ROUTE: &str = "/v1/chat/completions";

pub async fn chat_completions(
    State(state): State<AppState>,
    path: RawPathParams,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let ids = super::PathIds::of(&path);
    match handle(state, ids, &headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

/// What the client wants in its response (independent of what is recorded).
#[derive(Clone, Copy)]
struct Shape {
    logprobs: bool,
    token_ids: bool,
    usage_chunk: bool,
    /// The request used the deprecated `functions`: answer `function_call`.
    legacy_functions: bool,
}

/// A chat request, parsed and checked.
struct Parsed {
    req: ChatRequest,
    body_json: Json,
    normalized: Vec<&'static str>,
    named: Option<String>,
    tag: crate::store::TrajectoryMetadata,
    params: crate::backend::SamplingParams,
    max_tokens: Option<u32>,
    forced: Option<(Json, Option<String>)>,
    n: u32,
    shape: Shape,
}

fn parse(
    state: &AppState,
    path: super::PathIds,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Parsed, ApiError> {
    let (mut req, body_json): (ChatRequest, _) = parse_body(body)?;
    let legacy_functions = req.map_legacy_functions()?;
    req.check()?;
    super::unsupported::chat(&body_json)?;
    let normalized =
        crate::trajectory::normalize::messages(&mut req.messages, state.renderer.content_format());
    state.check_model(req.model.as_deref())?;
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
    let shape = Shape {
        logprobs: logprobs_k.is_some(),
        token_ids: req.return_token_ids,
        usage_chunk: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        legacy_functions,
    };
    Ok(Parsed {
        req,
        body_json,
        normalized,
        named,
        tag,
        params,
        max_tokens,
        forced,
        n,
        shape,
    })
}

async fn handle(
    state: AppState,
    path: super::PathIds,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let handled = Instant::now();
    // Parse.
    let Parsed {
        mut req,
        body_json,
        normalized,
        named,
        tag,
        params,
        max_tokens,
        forced,
        n,
        shape,
    } = tracing::info_span!(target: PHASE, "parse")
        .in_scope(|| parse(&state, path, headers, &body))?;
    let owner = match state
        .calls
        .claim(super::retry_request(headers, named.clone(), &body)?)
        .await?
    {
        Claim::Recorded(answer) => return Ok(replay(&state, answer, &req, shape)),
        Claim::Owner(owner) => owner,
    };

    // Prepare.
    let tid = super::trajectory_id(&state, named);
    state.trajectories.tag(&tid, &tag).await?;
    let started_at = crate::store::now_ms();
    let prepared = prepare(&state, &tid, &req).await?;
    // A forced tool call is constrained JSON: no tool parser reads it.
    let parsing = match forced {
        Some(_) => None,
        None => ParseSetup::new(
            &state.config,
            req.tools.as_ref(),
            req.tool_choice.as_ref(),
            &prepared.prompt_text,
        )?
        .map(Arc::new),
    };
    let is_forced = forced.is_some();
    let output = match forced {
        Some((_, name)) => Output::ForcedTools(name),
        None => Output::Chat(parsing.clone()),
    };
    let skip_special_tokens = req.skip_special_tokens.unwrap_or(true)
        && !parsing.as_ref().is_some_and(|p| p.needs_special_tokens);
    let plan = state.calls.plan(PlanRequest {
        ctx: CallContext {
            trajectory_id: tid.clone(),
            request: Arc::new(body_json),
            messages: (!req.continue_final_message.unwrap_or(false))
                .then(|| Arc::new(std::mem::take(&mut req.messages))),
            started_at,
            weight_version: state.router.weight_version(),
            normalized,
        },
        prepared,
        params,
        max_tokens,
        n,
        skip_special_tokens,
        output,
    })?;

    // Run.
    let running = state
        .calls
        .start(new_id("chatcmpl"), vec![plan], Some(owner), req.stream)
        .await?;

    // Respond.
    let headers = super::trajectory_header(&tid);
    if req.stream {
        let chunks = Chunks::new(&state, "chat.completion.chunk", unix_now(), shape);
        let encoder = ChatEncoder::new(chunks, parsing, is_forced);
        return Ok(sse_response(&state, headers, move |tx| {
            stream::run(running, encoder, ROUTE, tid, tx)
        }));
    }
    let answer = running.finish().await?;
    let body = response_body(&state, &answer, shape);
    crate::metrics::gateway_overhead(
        "chat",
        handled.elapsed().saturating_sub(answer.generated_in),
    );
    let response = (headers, axum::Json(body)).into_response();
    Ok(response)
}

/// A recorded answer, given again (an SDK retry or a repeated key).
fn replay(state: &AppState, answer: Arc<Answer>, req: &ChatRequest, shape: Shape) -> Response {
    let headers = super::trajectory_header(&answer.trajectory_id);
    if !req.stream {
        let body = response_body(state, &answer, shape);
        return (headers, axum::Json(body)).into_response();
    }
    let chunks = Chunks::new(state, "chat.completion.chunk", answer.created, shape);
    let encoder = ChatEncoder::new(chunks, None, false);
    sse_response(state, headers, move |tx| {
        stream::replay(answer, encoder, tx)
    })
}

/// Builds the prompt from the trajectory's history (exact or template mode).
async fn prepare(state: &AppState, tid: &str, req: &ChatRequest) -> Result<Prepared, ApiError> {
    if req.continue_final_message.unwrap_or(false) {
        let ids = render_continuation(state, req)?;
        return Ok(state.trajectories.prepare_root(tid, ids).await?);
    }
    let input = ChatInput {
        messages: &req.messages,
        tools: req.tools.as_deref(),
        kwargs: req.chat_template_kwargs.as_ref(),
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
    };
    Ok(state.trajectories.prepare_chat(tid, input).await?)
}

/// `continue_final_message` prompts: rendered without a generation prompt
/// (unless asked) and cut right after the final message's content.
fn render_continuation(state: &AppState, req: &ChatRequest) -> Result<Vec<u32>, ApiError> {
    let renderer = &state.renderer;
    run_render_work(render_bytes(&req.messages, req.tools.as_deref()), || {
        let input = RenderInput {
            messages: &req.messages,
            tools: req.tools.as_deref(),
            add_generation_prompt: req.add_generation_prompt.unwrap_or(false),
            kwargs: req.chat_template_kwargs.as_ref(),
        };
        let text = cut_after_final_message(renderer.render(&input)?, &req.messages)?;
        Ok(renderer.encode(&text)?)
    })
}

/// `continue_final_message`: the prompt ends right after the final message's
/// content, so the model continues it instead of starting a new turn.
fn cut_after_final_message(mut text: String, messages: &[Json]) -> Result<String, ApiError> {
    let content = messages
        .last()
        .and_then(|m| m.get("content"))
        .and_then(Json::as_str)
        .unwrap_or_default();
    match text.rfind(content) {
        Some(pos) if !content.is_empty() => {
            text.truncate(pos + content.len());
            Ok(text)
        }
        _ => Err(ApiError::invalid(
            "continue_final_message",
            "the final message's content was not found in the rendered prompt",
        )),
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

fn response_body<'a>(state: &'a AppState, answer: &'a Answer, shape: Shape) -> Completion<'a> {
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
        model: &state.config.model.name,
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
    parsing: Option<Arc<ParseSetup>>,
    parsers: Vec<Option<ChatStream>>,
    forced: bool,
}

impl ChatEncoder {
    fn new(chunks: ChatChunks, parsing: Option<Arc<ParseSetup>>, forced: bool) -> Self {
        ChatEncoder {
            chunks,
            parsing,
            parsers: Vec::new(),
            forced,
        }
    }
}

impl Encoder for ChatEncoder {
    fn open(&mut self, id: &str, prompts: &[Arc<Vec<u32>>], n: u32) -> Vec<Out> {
        self.parsers = (0..n)
            .map(|i| self.parsing.as_ref().map(|p| p.stream(i)))
            .collect();
        let prompt = prompts.first();
        (0..n)
            .map(|i| {
                let p = prompt.filter(|_| i == 0).map(|p| &p[..]);
                Out::json(&self.chunks.open(id, i, p))
            })
            .collect()
    }

    fn delta(&mut self, id: &str, ev: &ChoiceEvent) -> Vec<Out> {
        let deltas = match self
            .parsers
            .get_mut(ev.index as usize)
            .and_then(Option::as_mut)
        {
            Some(p) => {
                let mut events = p.push(&ev.text);
                if ev.finish.is_some() {
                    events.extend(p.finish());
                }
                events.iter().map(|e| e.to_openai_delta()).collect()
            }
            None if !ev.text.is_empty() && !self.forced => vec![json!({"content": ev.text})],
            None => Vec::new(),
        };
        let chunks = self.chunks.deltas(id, ev, deltas);
        chunks.iter().map(Out::json).collect()
    }

    fn end(&mut self, answer: &Answer) -> Vec<Out> {
        let mut out = Vec::new();
        if self.forced {
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
