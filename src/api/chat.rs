//! `POST /v1/chat/completions`: validate, render + tokenize, generate token
//! in / token out, answer in OpenAI's chat shape (streaming or not).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawPathParams, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use futures::FutureExt;
use serde_json::{json, Value as Json};

use super::generate::{self, CallPlan, ChoiceResult};
use super::logprobs::chat_logprobs;
use super::request::{parse_body, ChatRequest};
use super::sse::{sse_response, ChoiceStream, StreamSpec};
use super::{finish_str, new_id, unix_now, AppState};
use crate::error::ApiError;
use crate::render::RenderInput;
use crate::trajectory::{CallContext, ChatInput, Prepared};

pub async fn chat_completions(
    State(state): State<AppState>,
    path: RawPathParams,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path_tid = super::path_tid(&path);
    match handle(state, path_tid, &headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn handle(
    state: AppState,
    path_tid: Option<String>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse_body(&body)?;
    req.check()?;
    state.check_model(req.model.as_deref())?;
    let tid = super::resolve_trajectory_id(path_tid, headers, req.trajectory_id.as_deref())?;
    let logprobs_k = req.logprobs_k()?;
    let (mut params, max_tokens) = req.sampling.validate(logprobs_k)?;
    let n = req.sampling.n()?;

    let started_at = crate::store::now_ms();
    let prepared = prepare(&state, &tid, &req).await?;
    state.check_budget(&prepared)?;
    state.finalize_params(&mut params, &prepared, max_tokens)?;
    let plan = CallPlan {
        request_id: new_id("chatcmpl"),
        trajectory_id: tid.clone(),
        prompt_ids: prepared.prompt_ids.clone(),
        params,
        n,
        skip_special_tokens: req.skip_special_tokens.unwrap_or(true),
        stream: req.stream,
    };
    let resp_headers = super::trajectory_header(&tid);
    let ctx = CallContext {
        trajectory_id: tid,
        request: serde_json::from_slice(&body).unwrap_or(Json::Null),
        messages: Some(Arc::new(req.messages.clone())),
        started_at,
        weight_version: state.ops.weight_version(),
    };
    if req.stream {
        return stream(state, plan, req, ctx, prepared, resp_headers).await;
    }
    let results = generate::run_all(&state, &plan).await?;
    state
        .record_call(&ctx, &prepared, &results, served_message)
        .await?;
    let body = response_body(&state, &plan, &req, &results);
    Ok((resp_headers, axum::Json(body)).into_response())
}

/// The assistant message returned to the client for a choice.
fn served_message(r: &ChoiceResult) -> Json {
    json!({"role": "assistant", "content": r.text})
}

/// Builds the prompt from the trajectory's history (exact or template mode).
async fn prepare(state: &AppState, tid: &str, req: &ChatRequest) -> Result<Prepared, ApiError> {
    if req.continue_final_message.unwrap_or(false) {
        let ids = render_prompt(state, req).await?;
        return Ok(state.trajectories.prepare_root(ids)?);
    }
    let input = ChatInput {
        messages: &req.messages,
        tools: req.tools.as_deref(),
        kwargs: req.chat_template_kwargs.as_ref(),
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
    };
    Ok(state.trajectories.prepare_chat(tid, input).await?)
}

/// Renders the conversation to prompt ids, off the async runtime when the
/// conversation is large.
async fn render_prompt(state: &AppState, req: &ChatRequest) -> Result<Vec<u32>, ApiError> {
    let continue_final = req.continue_final_message.unwrap_or(false);
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(!continue_final);
    let renderer = state.renderer.clone();
    let messages = req.messages.clone();
    let tools = req.tools.clone();
    let kwargs = req.chat_template_kwargs.clone();
    let work = move || -> Result<Vec<u32>, ApiError> {
        let input = RenderInput {
            messages: &messages,
            tools: tools.as_deref(),
            add_generation_prompt,
            kwargs: kwargs.as_ref(),
        };
        let mut text = renderer.render(&input)?;
        if continue_final {
            text = cut_after_final_message(text, &messages)?;
        }
        Ok(renderer.encode(&text)?)
    };
    if body_size_hint(req) > 64 * 1024 {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| ApiError::internal(format!("render task failed: {e}")))?
    } else {
        work()
    }
}

fn body_size_hint(req: &ChatRequest) -> usize {
    req.messages
        .iter()
        .map(|m| {
            m.get("content")
                .and_then(Json::as_str)
                .map_or(256, str::len)
        })
        .sum()
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

fn response_body(
    state: &AppState,
    plan: &CallPlan,
    req: &ChatRequest,
    results: &[ChoiceResult],
) -> Json {
    let completion_tokens: usize = results.iter().map(|r| r.ids.len()).sum();
    let choices: Vec<Json> = results
        .iter()
        .map(|r| {
            let mut c = json!({
                "index": r.index,
                "message": {"role": "assistant", "content": r.text},
                "logprobs": Json::Null,
                "finish_reason": finish_str(r.finish),
                "stop_reason": Json::Null,
            });
            if plan.params.logprobs.is_some() {
                c["logprobs"] = chat_logprobs(&state.renderer, &r.ids, &r.logprobs);
            }
            if req.return_token_ids {
                c["token_ids"] = json!(r.ids);
            }
            c
        })
        .collect();
    let mut body = json!({
        "id": plan.request_id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": state.config.model.name,
        "choices": choices,
        "usage": usage(plan.prompt_ids.len(), completion_tokens),
    });
    if req.return_token_ids {
        body["prompt_token_ids"] = json!(*plan.prompt_ids);
    }
    body
}

pub(super) fn usage(prompt: usize, completion: usize) -> Json {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

async fn stream(
    state: AppState,
    plan: CallPlan,
    req: ChatRequest,
    ctx: CallContext,
    prepared: Prepared,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // Start every choice before answering, so failures are plain HTTP errors.
    let started = futures::future::try_join_all(
        (0..plan.n).map(|i| generate::start_choice(&state, &plan, i)),
    )
    .await?;
    let id = plan.request_id.clone();
    let created = unix_now();
    let model = state.config.model.name.clone();
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |choices: Json| json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices})
    };
    let mut initial = Vec::new();
    for i in 0..plan.n {
        let mut c = chunk(
            json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
        );
        if i == 0 && req.return_token_ids {
            c["prompt_token_ids"] = json!(*plan.prompt_ids);
        }
        initial.push(c);
    }
    let choices: Vec<ChoiceStream> = started
        .into_iter()
        .map(|s| ChoiceStream::new(state.renderer.clone(), s, &plan))
        .collect();
    let renderer = state.renderer.clone();
    let want_logprobs = plan.params.logprobs.is_some();
    let return_ids = req.return_token_ids;
    let delta_chunk = chunk.clone();
    let delta = Box::new(move |ev: &generate::ChoiceEvent| {
        if ev.ids.is_empty() && ev.text.is_empty() {
            return Vec::new();
        }
        let mut c = json!({"index": ev.index, "delta": {"content": ev.text}, "logprobs": null, "finish_reason": null});
        if want_logprobs {
            c["logprobs"] = chat_logprobs(&renderer, &ev.ids, &ev.logprobs);
        }
        if return_ids {
            c["token_ids"] = json!(ev.ids);
        }
        vec![delta_chunk(json!([c]))]
    });
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let finalize = Box::new(move |results: Vec<ChoiceResult>| {
        async move {
            state
                .record_call(&ctx, &prepared, &results, served_message)
                .await?;
            let mut out: Vec<Json> = results
                .iter()
                .map(|r| {
                    chunk(json!([{"index": r.index, "delta": {}, "logprobs": null,
                                  "finish_reason": finish_str(r.finish), "stop_reason": null}]))
                })
                .collect();
            if include_usage {
                let completion: usize = results.iter().map(|r| r.ids.len()).sum();
                let mut u = chunk(json!([]));
                u["usage"] = usage(plan.prompt_ids.len(), completion);
                out.push(u);
            }
            Ok(out)
        }
        .boxed()
    });
    Ok(sse_response(
        StreamSpec {
            initial,
            choices,
            delta,
            finalize,
        },
        headers,
    ))
}
