//! OpenAI's Responses API: `POST /v1/responses` (parse → translate onto a
//! chat request, `surface::responses` → the shared chat run → respond as a
//! `Response` or its typed event stream), `GET /v1/responses/{id}`,
//! `GET /v1/responses/{id}/input_items`, `DELETE /v1/responses/{id}` and
//! `POST /v1/responses/input_tokens`.
//!
//! `previous_response_id` is resolved from the store: the response's call
//! names its trajectory, whose view gives the conversation it continues,
//! so the new call continues the same trajectory with every sampled id
//! verbatim. A stored response is retrievable until it is deleted; the
//! call stays in the training store either way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, Query, RawPathParams, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{json, Value as Json};

use super::request::{parse_json, parse_value, ChatRequest};
use super::run::{self, Surface};
use super::{AppState, Picked};
use crate::call::{Answer, ParseSetup};
use crate::error::ApiError;
use crate::metrics::PHASE;
use crate::render::Renderer;
use crate::store::{CallRecord, ResponseRef, Trajectory};
use crate::surface::responses::{self as wire, output};
use crate::surface::Api;

mod events;

const ROUTE: &str = "/v1/responses";

/// The Responses routes, under `/v1` (and each trajectory path prefix).
pub fn routes() -> axum::Router<crate::api::Gateway> {
    axum::Router::new()
        .route("/v1/responses", post(create))
        .route("/v1/responses/input_tokens", post(input_tokens))
        .route("/v1/responses/{id}", get(retrieve).delete(delete))
        .route("/v1/responses/{id}/input_items", get(input_items))
}

pub async fn create(
    path: RawPathParams,
    headers: HeaderMap,
    Picked(state, body): Picked,
) -> Result<Response, ApiError> {
    let handled = Instant::now();
    let ids = super::PathIds::of(&path);
    let parsed = parse(&state, ids, &headers, body).await?;
    let (call, surface) = parsed;
    run::run(state, call, &headers, surface, handled).await
}

/// A fresh response id: `resp_` and 128 random bits.
fn new_response_id() -> String {
    let (a, b): (u64, u64) = (rand::random(), rand::random());
    format!("resp_{a:016x}{b:016x}")
}

async fn parse(
    state: &AppState,
    path: super::PathIds,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(run::ChatCall, ResponsesSurface), ApiError> {
    let received = parse_json(&body)?;
    // The trajectory a `previous_response_id` names, and its conversation.
    let previous = match received.get("previous_response_id") {
        None | Some(Json::Null) => None,
        Some(Json::String(id)) => Some(previous(state, id).await?),
        Some(_) => {
            return Err(ApiError::invalid(
                "previous_response_id",
                "`previous_response_id` must be a string",
            ))
        }
    };
    let span = tracing::info_span!(target: PHASE, "parse");
    let _entered = span.enter();
    let switches = state.trajectories.switches();
    let conversation = previous.as_ref().map(|(_, c)| c.as_slice());
    let translated = wire::translate(&received, conversation, switches.reasoning_effort)?;
    let mut chat = translated.chat;
    if let Some((tid, _)) = &previous {
        let named = super::named_trajectory_id(
            path.tid.clone(),
            headers,
            received.get("trajectory_id").and_then(Json::as_str),
        )?;
        match named {
            Some(n) if n != *tid => {
                return Err(ApiError::invalid(
                    "previous_response_id",
                    format!("the previous response belongs to trajectory `{tid}`, not to `{n}`: a response continues its own trajectory"),
                ))
            }
            _ => {
                if let Some(obj) = chat.as_object_mut() {
                    obj.insert("trajectory_id".into(), json!(tid));
                }
            }
        }
    }
    let req: ChatRequest = parse_value(&chat)?;
    req.check()?;
    super::unsupported::chat(&chat, &[])?;
    let shape = Shape {
        logprobs: translated.logprobs,
        token_ids: req.return_token_ids,
    };
    let id = new_response_id();
    // A path's trajectory is honoured only without a previous response
    // (which then named the same one).
    let path = match previous {
        Some(_) => super::PathIds {
            tid: None,
            gid: path.gid,
        },
        None => path,
    };
    let mut call = super::chat::chat_call(
        state,
        path,
        headers,
        req,
        received.clone(),
        body,
        Api::Responses,
        id.clone(),
    )?;
    call.response_id = translated.store.then(|| id.clone());
    call.instructions = translated.instructions;
    let surface = ResponsesSurface {
        request: Arc::new(received),
        model: state.served_id(call.adapter.as_deref()),
        shape,
    };
    Ok((call, surface))
}

/// The trajectory and conversation of the stored response `id`.
async fn previous(state: &AppState, id: &str) -> Result<(String, Vec<Json>), ApiError> {
    let not_found = || {
        ApiError::not_found(format!("Previous response with id '{id}' not found."))
            .with_param("previous_response_id")
            .with_code("previous_response_not_found")
    };
    let ResponseRef {
        trajectory_id,
        call_index,
    } = state
        .store
        .store
        .find_response(id)
        .await?
        .ok_or_else(not_found)?;
    let conversation = state
        .trajectories
        .conversation(&trajectory_id, call_index)
        .await?
        .ok_or_else(not_found)?;
    Ok((trajectory_id, conversation))
}

/// What the client asked to see beside the output.
#[derive(Debug, Clone, Copy)]
struct Shape {
    logprobs: bool,
    token_ids: bool,
}

/// The Responses answer of a chat call.
struct ResponsesSurface {
    request: Arc<Json>,
    model: String,
    shape: Shape,
}

impl Surface for ResponsesSurface {
    type Stream = events::ResponsesEncoder;

    fn route(&self) -> &'static str {
        ROUTE
    }

    fn overhead_label(&self) -> &'static str {
        "responses"
    }

    fn body(&self, state: &AppState, answer: &Answer) -> Result<Response, ApiError> {
        let head = output::Head {
            id: &answer.request_id,
            created_at: answer.created as i64,
            model: &self.model,
            request: &self.request,
        };
        let o = outcome_of(
            &state.renderer,
            answer,
            self.shape,
            super::unix_now() as i64,
        )?;
        Ok(axum::Json(output::finished(&head, &o)).into_response())
    }

    fn stream(
        &self,
        state: &AppState,
        created: u64,
        parsing: Option<Arc<ParseSetup>>,
        forced: bool,
    ) -> events::ResponsesEncoder {
        events::ResponsesEncoder::new(
            state.renderer.clone(),
            self.request.clone(),
            self.model.clone(),
            created as i64,
            self.shape.logprobs,
            self.shape.token_ids,
            parsing,
            forced,
        )
    }
}

/// The outcome of a live call's one choice.
fn outcome_of<'a>(
    renderer: &Renderer,
    answer: &'a Answer,
    shape: Shape,
    completed_at: i64,
) -> Result<output::Outcome<'a>, ApiError> {
    let choice = answer
        .choices
        .first()
        .ok_or_else(|| ApiError::internal("a response without a choice"))?;
    Ok(output::Outcome {
        served: &choice.served,
        finish_reason: choice.finish_reason,
        completed_at,
        input_tokens: answer.prompt_tokens(),
        output_tokens: choice.ids.len(),
        reasoning_tokens: reasoning_tokens(renderer, &choice.ids, &choice.served),
        logprobs: shape
            .logprobs
            .then(|| text_logprobs(renderer, &choice.ids, &choice.logprobs, true)),
        token_ids: shape.token_ids.then(|| {
            let prompt = answer.prompts.first().map_or(&[][..], |p| p.as_slice());
            (prompt, choice.ids.as_slice())
        }),
    })
}

/// `LogProb` objects of the sampled tokens (`with_bytes`: the non-streamed
/// shape, which carries each token's UTF-8 bytes).
pub(super) fn text_logprobs(
    renderer: &Renderer,
    ids: &[u32],
    logprobs: &[crate::backend::TokenLogprob],
    with_bytes: bool,
) -> Vec<Json> {
    let token = |id: u32| renderer.decode(&[id], false).unwrap_or_default();
    ids.iter()
        .zip(logprobs)
        .map(|(&id, lp)| {
            let t = token(id);
            let top: Vec<Json> = lp
                .top
                .iter()
                .map(|&(alt, l)| {
                    let a = token(alt);
                    let mut o = json!({"token": a, "logprob": l});
                    if with_bytes {
                        o["bytes"] = json!(a.as_bytes());
                    }
                    o
                })
                .collect();
            let mut o = json!({"token": t, "logprob": lp.logprob, "top_logprobs": top});
            if with_bytes {
                o["bytes"] = json!(t.as_bytes());
            }
            o
        })
        .collect()
}

/// Sampled tokens inside the served message's reasoning: those up to the
/// one that completes the reasoning's closing tag, or all of them when the
/// reasoning never closed; 0 without reasoning.
pub(super) fn reasoning_tokens(renderer: &Renderer, ids: &[u32], served: &Json) -> usize {
    const CLOSE: &str = crate::parse::REASONING_CLOSE;
    let has_reasoning = served
        .get("reasoning_content")
        .and_then(Json::as_str)
        .is_some_and(|r| !r.is_empty());
    if !has_reasoning {
        return 0;
    }
    if let Some(h) = renderer.harmony() {
        return h.reasoning_tokens(ids);
    }
    let closes = |k: usize| {
        renderer
            .decode(&ids[..k], false)
            .is_ok_and(|t| t.contains(CLOSE))
    };
    if !closes(ids.len()) {
        return ids.len();
    }
    // The smallest prefix whose text holds the tag: decoding more tokens
    // never removes it.
    let (mut lo, mut hi) = (0, ids.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if closes(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

// ---- Retrieval routes -------------------------------------------------

/// The `{id}` of a retrieval route. Under `/t/{tid}/v1/...` the path names
/// the trajectory too, so the parameters are read by name.
fn response_id(params: &HashMap<String, String>) -> String {
    params.get("id").cloned().unwrap_or_default()
}

/// The stored Responses call `id`, with its trajectory.
async fn stored(state: &AppState, id: &str) -> Result<(Trajectory, usize), ApiError> {
    let not_found = || {
        ApiError::not_found(format!("Response with id '{id}' not found.")).with_param("response_id")
    };
    let r = state
        .store
        .store
        .find_response(id)
        .await?
        .ok_or_else(not_found)?;
    let t = state
        .store
        .store
        .get_trajectory(&r.trajectory_id)
        .await?
        .ok_or_else(not_found)?;
    let at = t
        .calls
        .iter()
        .position(|c| c.call_index == r.call_index && c.api.as_deref() == Some("responses"))
        .ok_or_else(not_found)?;
    Ok((t, at))
}

/// A call's whole prompt length: its parent's prompt and sampled ids, then
/// its own prompt delta.
fn prompt_len(t: &Trajectory, call: &CallRecord) -> usize {
    let mut len = call.prompt_delta_ids.len();
    let mut parent = call.parent_call;
    while let Some(p) = parent.and_then(|p| t.calls.iter().find(|c| c.call_index == p)) {
        len += p.prompt_delta_ids.len() + p.sampled_ids.len();
        parent = p.parent_call;
    }
    len
}

/// The client-facing finish reason of a stored call.
fn finish_of(call: &CallRecord) -> &'static str {
    let calls = call
        .response
        .get("tool_calls")
        .and_then(Json::as_array)
        .is_some_and(|c| !c.is_empty());
    match call.finish_reason.as_str() {
        "length" => "length",
        "abort" => "abort",
        _ if calls => "tool_calls",
        _ => "stop",
    }
}

async fn retrieve(
    State(state): State<AppState>,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let id = response_id(&params);
    let (t, at) = stored(&state, &id).await?;
    let call = &t.calls[at];
    let request = t.request_of(call);
    let head = output::Head {
        id: &id,
        created_at: call.started_at / 1000,
        model: &state.config.model.name,
        request,
    };
    let asked = |s: &str| {
        request
            .get("include")
            .and_then(Json::as_array)
            .is_some_and(|l| l.iter().any(|v| v.as_str() == Some(s)))
    };
    // Stored logprobs are the sampled tokens' own; alternatives are not
    // kept, so a read-back lists none.
    let logprobs = asked("message.output_text.logprobs").then(|| {
        let lps: Vec<crate::backend::TokenLogprob> = call
            .logprobs
            .iter()
            .map(|l| crate::backend::TokenLogprob {
                logprob: *l,
                top: Vec::new(),
            })
            .collect();
        text_logprobs(&state.renderer, &call.sampled_ids, &lps, true)
    });
    let o = output::Outcome {
        served: &call.response,
        finish_reason: finish_of(call),
        completed_at: call.finished_at / 1000,
        input_tokens: prompt_len(&t, call),
        output_tokens: call.sampled_ids.len(),
        reasoning_tokens: reasoning_tokens(&state.renderer, &call.sampled_ids, &call.response),
        logprobs,
        token_ids: None,
    };
    Ok(axum::Json(output::finished(&head, &o)).into_response())
}

async fn delete(
    State(state): State<AppState>,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let id = response_id(&params);
    if !state.store.store.forget_response(&id).await? {
        return Err(
            ApiError::not_found(format!("Response with id '{id}' not found."))
                .with_param("response_id"),
        );
    }
    Ok(axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}

/// `limit`, `order` and `after` of an input-item listing (`include` is
/// accepted and changes nothing: items are given whole).
#[derive(Deserialize)]
struct ItemsQuery {
    limit: Option<usize>,
    order: Option<String>,
    after: Option<String>,
}

async fn input_items(
    State(state): State<AppState>,
    Path(params): Path<HashMap<String, String>>,
    query: Result<Query<ItemsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let id = response_id(&params);
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "`limit` must be between 1 and 100",
        ));
    }
    let (t, at) = stored(&state, &id).await?;
    let mut items = output::input_items(&id, t.request_of(&t.calls[at]));
    match q.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(_) => return Err(ApiError::invalid("order", "`order` must be asc or desc")),
    }
    if let Some(after) = &q.after {
        let pos = items
            .iter()
            .position(|i| i.get("id").and_then(Json::as_str) == Some(after))
            .ok_or_else(|| ApiError::invalid("after", format!("no input item `{after}`")))?;
        items.drain(..=pos);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let first = items.first().and_then(|i| i.get("id")).cloned();
    let last = items.last().and_then(|i| i.get("id")).cloned();
    Ok(axum::Json(json!({
        "object": "list",
        "data": items,
        "first_id": first,
        "last_id": last,
        "has_more": has_more,
    }))
    .into_response())
}

/// `POST /v1/responses/input_tokens`: the prompt tokens the request would
/// render to with the served model's template, as a new conversation or
/// continuing its `previous_response_id`.
async fn input_tokens(Picked(state, body): Picked) -> Result<Response, ApiError> {
    let received = parse_json(&body)?;
    let previous = match received.get("previous_response_id") {
        Some(Json::String(id)) => Some(previous(&state, id).await?),
        _ => None,
    };
    let switches = state.trajectories.switches();
    let conversation = previous.as_ref().map(|(_, c)| c.as_slice());
    let translated = wire::translate(&received, conversation, switches.reasoning_effort)?;
    let n = super::count::prompt_tokens(&state, &translated.chat).await?;
    Ok(axum::Json(json!({"object": "response.input_tokens", "input_tokens": n})).into_response())
}
