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
use super::sse::{sse_response, usage, ChoiceStream, StreamSpec};
use super::toolcalls::{self, ParseSetup};
use super::{finish_str, new_id, unix_now, AppState};
use crate::error::ApiError;
use crate::parse::ChatOutput;
use crate::render::{run_render_work, RenderInput};
use crate::trajectory::messages::content_bytes;
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
    let handled = std::time::Instant::now();
    let (mut req, body_json): (ChatRequest, _) = parse_body(&body)?;
    req.check()?;
    toolcalls::normalize_messages(&mut req.messages);
    state.check_model(req.model.as_deref())?;
    let tid =
        super::resolve_trajectory_id(&state, path_tid, headers, req.trajectory_id.as_deref())?;
    let logprobs_k = req.logprobs_k()?;
    let (mut params, max_tokens) = req.sampling.validate(logprobs_k)?;
    let n = req.sampling.n()?;

    let started_at = crate::store::now_ms();
    let prepared = prepare(&state, &tid, &req).await?;
    state.check_budget(&prepared)?;
    state.finalize_params(&mut params, &prepared, max_tokens)?;
    let parsing = ParseSetup::new(&state.config, &req, &prepared.prompt_text)?.map(Arc::new);
    let skip_special = req.skip_special_tokens.unwrap_or(true)
        && !parsing.as_ref().is_some_and(|p| p.needs_special_tokens);
    let plan = CallPlan {
        request_id: new_id("chatcmpl"),
        trajectory_id: tid.clone(),
        prompt_ids: prepared.prompt_ids.clone(),
        params,
        n,
        skip_special_tokens: skip_special,
        stream: req.stream,
    };
    let resp_headers = super::trajectory_header(&tid);
    let ctx = CallContext {
        trajectory_id: tid,
        request: body_json,
        messages: Some(Arc::new(req.messages.clone())),
        started_at,
        weight_version: state.ops.weight_version(),
    };
    if req.stream {
        return stream(state, plan, req, ctx, prepared, parsing, resp_headers).await;
    }
    let gen_start = std::time::Instant::now();
    let results = generate::run_all(&state, &plan).await?;
    let backend_time = gen_start.elapsed();
    let outputs: Vec<Served> = results
        .iter()
        .map(|r| served(parsing.as_deref(), r))
        .collect();
    state
        .record_call(&ctx, &prepared, &results, |r| {
            outputs[r.index as usize].record()
        })
        .await?;
    let body = response_body(&state, &plan, &req, &results, &outputs);
    crate::metrics::gateway_overhead("chat", handled.elapsed().saturating_sub(backend_time));
    Ok((resp_headers, axum::Json(body)).into_response())
}

/// What a choice returns to the client: its message and finish reason.
struct Served {
    message: Json,
    finish: &'static str,
    outcome: Option<String>,
}

impl Served {
    fn record(&self) -> (Json, Option<String>) {
        (self.message.clone(), self.outcome.clone())
    }
}

fn served_from(out: Option<ChatOutput>, r: &ChoiceResult) -> Served {
    let backend_finish = finish_str(r.finish);
    match out {
        Some(o) => Served {
            message: toolcalls::message_json(&o),
            finish: toolcalls::finish_reason(&o, backend_finish),
            outcome: Some(o.outcome.to_string()),
        },
        None => Served {
            message: json!({"role": "assistant", "content": r.text}),
            finish: backend_finish,
            outcome: None,
        },
    }
}

fn served(parsing: Option<&ParseSetup>, r: &ChoiceResult) -> Served {
    served_from(parsing.map(|p| p.parse(&r.text)), r)
}

/// Builds the prompt from the trajectory's history (exact or template mode).
async fn prepare(state: &AppState, tid: &str, req: &ChatRequest) -> Result<Prepared, ApiError> {
    if req.continue_final_message.unwrap_or(false) {
        let ids = render_continuation(state, req)?;
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

/// `continue_final_message` prompts: rendered without a generation prompt
/// (unless asked) and cut right after the final message's content.
fn render_continuation(state: &AppState, req: &ChatRequest) -> Result<Vec<u32>, ApiError> {
    let renderer = &state.renderer;
    run_render_work(content_bytes(&req.messages), || {
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

fn response_body(
    state: &AppState,
    plan: &CallPlan,
    req: &ChatRequest,
    results: &[ChoiceResult],
    outputs: &[Served],
) -> Json {
    let completion_tokens: usize = results.iter().map(|r| r.ids.len()).sum();
    let choices: Vec<Json> = results
        .iter()
        .zip(outputs)
        .map(|(r, out)| {
            let mut c = json!({
                "index": r.index,
                "message": out.message,
                "logprobs": Json::Null,
                "finish_reason": out.finish,
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

async fn stream(
    state: AppState,
    plan: CallPlan,
    req: ChatRequest,
    ctx: CallContext,
    prepared: Prepared,
    parsing: Option<Arc<ParseSetup>>,
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
    // One incremental parser per choice; its final output is what the
    // finish chunk and the span record use.
    let mut parsers: Vec<_> = (0..plan.n)
        .map(|_| parsing.as_ref().map(|p| p.stream()))
        .collect();
    let outputs: Arc<std::sync::Mutex<Vec<Option<ChatOutput>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; plan.n as usize]));
    let outputs_in = outputs.clone();
    let delta = Box::new(move |ev: &generate::ChoiceEvent| {
        let i = ev.index as usize;
        let mut deltas: Vec<Json> = match parsers.get_mut(i).and_then(Option::as_mut) {
            Some(p) => {
                let mut events = p.push(&ev.text);
                if ev.finish.is_some() {
                    events.extend(p.finish());
                    if let Ok(mut o) = outputs_in.lock() {
                        o[i] = Some(p.output());
                    }
                }
                events.iter().map(|e| e.to_openai_delta()).collect()
            }
            None if !ev.text.is_empty() => vec![json!({"content": ev.text})],
            None => Vec::new(),
        };
        if deltas.is_empty() && !ev.ids.is_empty() {
            deltas.push(json!({}));
        }
        deltas
            .into_iter()
            .enumerate()
            .map(|(k, d)| {
                let mut c =
                    json!({"index": ev.index, "delta": d, "logprobs": null, "finish_reason": null});
                // Ids and logprobs ride on the first chunk of this event.
                if k == 0 && want_logprobs {
                    c["logprobs"] = chat_logprobs(&renderer, &ev.ids, &ev.logprobs);
                }
                if k == 0 && return_ids {
                    c["token_ids"] = json!(ev.ids);
                }
                delta_chunk(json!([c]))
            })
            .collect()
    });
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let usage_chunk = include_usage.then(|| (chunk(json!([])), plan.prompt_ids.len()));
    let finalize = Box::new(move |results: Vec<ChoiceResult>| {
        async move {
            let parsed = outputs.lock().map(|o| o.clone()).unwrap_or_default();
            let served: Vec<Served> = results
                .iter()
                .map(|r| served_from(parsed.get(r.index as usize).cloned().flatten(), r))
                .collect();
            state
                .record_call(&ctx, &prepared, &results, |r| {
                    served[r.index as usize].record()
                })
                .await?;
            Ok(results
                .iter()
                .zip(&served)
                .map(|(r, s)| {
                    chunk(json!([{"index": r.index, "delta": {}, "logprobs": null,
                                  "finish_reason": s.finish, "stop_reason": null}]))
                })
                .collect())
        }
        .boxed()
    });
    Ok(sse_response(
        StreamSpec {
            initial,
            choices,
            delta,
            finalize,
            usage: usage_chunk,
        },
        headers,
    ))
}
