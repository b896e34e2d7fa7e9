//! The run of a chat call, shared by every surface that translates onto
//! the chat path (Chat Completions, Responses, Messages): claim (an SDK
//! retry is answered from the record) → prepare (the exact prompt) → plan →
//! start → respond in the surface's shape ([`Surface`]), streamed or not.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value as Json;

use super::request::ChatRequest;
use super::sse::sse_response;
use super::stream::{self, Encoder};
use super::{unix_now, AppState};
use crate::backend::SamplingParams;
use crate::call::replies::Claim;
use crate::call::{Answer, Output, ParseSetup, PlanRequest};
use crate::error::ApiError;
use crate::render::{run_render_work, RenderInput};
use crate::store::TrajectoryMetadata;
use crate::surface::Api;
use crate::trajectory::messages::render_bytes;
use crate::trajectory::{CallContext, ChatInput, Prepared};

/// A chat call, parsed and checked, from any surface.
pub(super) struct ChatCall {
    /// The chat request the surface's request translates to.
    pub req: ChatRequest,
    /// The request as received: what the record keeps.
    pub received: Json,
    /// Its bytes, which a retry must repeat.
    pub body: Bytes,
    pub normalized: Vec<&'static str>,
    pub named: Option<String>,
    pub tag: TrajectoryMetadata,
    pub params: SamplingParams,
    pub max_tokens: Option<u32>,
    /// A forced tool call: its schema and the tool's name.
    pub forced: Option<(Json, Option<String>)>,
    pub n: u32,
    pub api: Api,
    /// The answer's id (`chatcmpl-…`, `resp_…`, `msg_…`).
    pub request_id: String,
    /// The id the answer stays retrievable by (a stored Responses answer).
    pub response_id: Option<String>,
    /// Leading messages from the request's own instructions.
    pub instructions: usize,
    /// The LoRA adapter the request's `model` names (`None`: the model).
    pub adapter: Option<String>,
}

/// How one surface answers a chat call.
pub(super) trait Surface: Send + Sync + 'static {
    type Stream: Encoder;
    /// The route, for the log line of a failure.
    fn route(&self) -> &'static str;
    /// The label of `tito_gateway_overhead_seconds`.
    fn overhead_label(&self) -> &'static str;
    /// The answer as one body.
    fn body(&self, state: &AppState, answer: &Answer) -> Result<Response, ApiError>;
    /// The encoder of the answer's stream (`parsing`: the tool / reasoning
    /// parser of a live call; `forced`: a forced tool call).
    fn stream(
        &self,
        state: &AppState,
        created: u64,
        parsing: Option<Arc<ParseSetup>>,
        forced: bool,
    ) -> Self::Stream;
}

/// Runs `call` and answers it as `surface` does; `handled`: when the
/// request's handler began (for the gateway-overhead histogram).
pub(super) async fn run<S: Surface>(
    state: AppState,
    mut call: ChatCall,
    headers: &HeaderMap,
    surface: S,
    handled: Instant,
) -> Result<Response, ApiError> {
    let retry = super::retry_request(headers, call.named.clone(), &call.body)?;
    let owner = match state.calls.claim(retry).await? {
        Claim::Recorded(answer) => return Ok(replay(&state, answer, call.req.stream, &surface)),
        Claim::Owner(owner) => owner,
    };

    // Prepare.
    let adapter = state.adapter_share(call.adapter.as_deref()).await?;
    let images = super::images::take(&state, &mut call.req.messages, &mut call.received).await?;
    let tid = super::trajectory_id(&state, call.named.take());
    state.trajectories.tag(&tid, &call.tag).await?;
    let started_at = crate::store::now_ms();
    let req = &mut call.req;
    let prepared = prepare(&state, &tid, req).await?;
    let images = match images.is_empty() {
        true => None,
        false => Some(super::images::inputs(&state, &prepared.prompt_ids, images)?),
    };
    // A forced tool call is constrained JSON: no tool parser reads it.
    let parsing = match call.forced {
        Some(_) => None,
        None => ParseSetup::new(
            &state.config,
            state.renderer.harmony(),
            req.tools.as_ref(),
            req.tool_choice.as_ref(),
            &prepared.prompt_text,
        )?
        .map(Arc::new),
    };
    let is_forced = call.forced.is_some();
    let output = match call.forced {
        Some((_, name)) => Output::ForcedTools(name),
        None => Output::Chat(parsing.clone()),
    };
    let skip_special_tokens = req.skip_special_tokens.unwrap_or(true)
        && !parsing.as_ref().is_some_and(|p| p.needs_special_tokens);
    let plan = state.calls.plan(PlanRequest {
        ctx: CallContext {
            trajectory_id: tid.clone(),
            request: Arc::new(call.received),
            messages: (!req.continue_final_message.unwrap_or(false))
                .then(|| Arc::new(std::mem::take(&mut req.messages))),
            started_at,
            weight_version: state.router.weight_version(),
            normalized: call.normalized,
            api: call.api,
            response_id: call.response_id,
            instructions: call.instructions,
            images,
            model: Some(state.model_name.clone()),
            adapter,
        },
        prepared,
        params: call.params,
        max_tokens: call.max_tokens,
        n: call.n,
        skip_special_tokens,
        output,
    })?;

    // Run.
    let stream = req.stream;
    let running = state
        .calls
        .start(call.request_id, vec![plan], Some(owner), stream)
        .await?;

    // Respond.
    let headers = super::trajectory_header(&tid);
    if stream {
        let encoder = surface.stream(&state, unix_now(), parsing, is_forced);
        let route = surface.route();
        return Ok(sse_response(&state, headers, move |tx| {
            stream::run(running, encoder, route, tid, tx)
        }));
    }
    let answer = running.finish().await?;
    crate::metrics::gateway_overhead(
        surface.overhead_label(),
        handled.elapsed().saturating_sub(answer.generated_in),
    );
    let mut resp = surface.body(&state, &answer)?;
    resp.headers_mut().extend(headers);
    Ok(resp)
}

/// A recorded answer, given again (an SDK retry or a repeated key).
fn replay<S: Surface>(
    state: &AppState,
    answer: Arc<Answer>,
    stream: bool,
    surface: &S,
) -> Response {
    let headers = super::trajectory_header(&answer.trajectory_id);
    if !stream {
        return match surface.body(state, &answer) {
            Ok(mut resp) => {
                resp.headers_mut().extend(headers);
                resp
            }
            Err(e) => e.into_response(),
        };
    }
    let encoder = surface.stream(state, answer.created, None, false);
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
