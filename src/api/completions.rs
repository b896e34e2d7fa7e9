//! `POST /v1/completions`: a text prompt (tokenized here) or token ids
//! (passed through untouched), one or several prompts, streaming or not.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawPathParams, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use futures::FutureExt;
use serde_json::{json, Value as Json};

use super::generate::{self, CallPlan, ChoiceResult};
use super::logprobs::completion_logprobs;
use super::request::{parse_body, CompletionRequest, PromptSpec};
use super::sse::{sse_response, usage, ChoiceStream, StreamSpec};
use super::{finish_str, new_id, unix_now, AppState};
use crate::error::ApiError;
use crate::trajectory::{CallContext, Prepared};

pub async fn completions(
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

/// Max prompts in one batched completions request.
const MAX_PROMPTS: usize = 256;

fn prompt_ids(state: &AppState, req: &CompletionRequest) -> Result<Vec<Vec<u32>>, ApiError> {
    let add_special = req.add_special_tokens.unwrap_or(true);
    let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
        let enc = state
            .renderer
            .tokenizer()
            .encode_fast(text, add_special)
            .map_err(|e| ApiError::bad_request(format!("cannot tokenize prompt: {e}")))?;
        Ok(enc.get_ids().to_vec())
    };
    let prompts = match &req.prompt {
        PromptSpec::Text(t) => vec![encode(t)?],
        PromptSpec::Ids(ids) => vec![ids.clone()],
        PromptSpec::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        PromptSpec::IdLists(ls) => ls.clone(),
    };
    if prompts.is_empty() || prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("expected 1 to {MAX_PROMPTS} prompts, got {}", prompts.len()),
        ));
    }
    let vocab = state.renderer.vocab_size();
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(ApiError::invalid("prompt", format!("prompt {i} is empty")));
        }
        if let Some(bad) = p.iter().find(|id| **id >= vocab) {
            return Err(ApiError::invalid(
                "prompt",
                format!("token id {bad} in prompt {i} is out of range (vocabulary size {vocab})"),
            ));
        }
    }
    Ok(prompts)
}

async fn handle(
    state: AppState,
    path_tid: Option<String>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let handled = std::time::Instant::now();
    let (req, body_json): (CompletionRequest, _) = parse_body(&body)?;
    req.check()?;
    state.check_model(req.model.as_deref())?;
    let tid =
        super::resolve_trajectory_id(&state, path_tid, headers, req.trajectory_id.as_deref())?;
    let (params, max_tokens) = req.sampling.validate(req.logprobs)?;
    let n = req.sampling.n()?;
    let request_id = new_id("cmpl");
    let started_at = crate::store::now_ms();
    let mut plans = Vec::new();
    let mut prepared_all = Vec::new();
    for (i, ids) in prompt_ids(&state, &req)?.into_iter().enumerate() {
        let prepared = state.trajectories.prepare_completion(&tid, ids).await?;
        state.check_budget(&prepared)?;
        let mut params = params.clone();
        state.finalize_params(&mut params, &prepared, max_tokens)?;
        plans.push(CallPlan {
            request_id: format!("{request_id}-{i}"),
            trajectory_id: tid.clone(),
            prompt_ids: prepared.prompt_ids.clone(),
            params,
            n,
            skip_special_tokens: req.skip_special_tokens.unwrap_or(true),
            stream: req.stream,
        });
        prepared_all.push(prepared);
    }
    let resp_headers = super::trajectory_header(&tid);
    let ctx = CallContext {
        trajectory_id: tid,
        request: body_json,
        messages: None,
        started_at,
        weight_version: state.ops.weight_version(),
    };
    if req.stream {
        return stream(
            state,
            request_id,
            plans,
            prepared_all,
            req,
            ctx,
            resp_headers,
        )
        .await;
    }
    let gen_start = std::time::Instant::now();
    let all =
        futures::future::try_join_all(plans.iter().map(|p| generate::run_all(&state, p))).await?;
    let backend_time = gen_start.elapsed();
    for (prepared, results) in prepared_all.iter().zip(&all) {
        state
            .record_call(&ctx, prepared, results, served_text)
            .await?;
    }
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    let mut prompt_tokens = 0;
    for (pi, (plan, results)) in plans.iter().zip(&all).enumerate() {
        prompt_tokens += plan.prompt_ids.len();
        for r in results {
            completion_tokens += r.ids.len();
            let mut c = json!({
                "index": pi as u32 * n + r.index,
                "text": r.text,
                "logprobs": Json::Null,
                "finish_reason": finish_str(r.finish),
                "stop_reason": Json::Null,
            });
            if plan.params.logprobs.is_some() {
                c["logprobs"] = completion_logprobs(&state.renderer, &r.ids, &r.logprobs, 0);
            }
            if req.return_token_ids {
                c["prompt_token_ids"] = json!(*plan.prompt_ids);
                c["token_ids"] = json!(r.ids);
            }
            choices.push(c);
        }
    }
    let body = json!({
        "id": request_id,
        "object": "text_completion",
        "created": unix_now(),
        "model": state.config.model.name,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    });
    crate::metrics::gateway_overhead(
        "completions",
        handled.elapsed().saturating_sub(backend_time),
    );
    Ok((resp_headers, axum::Json(body)).into_response())
}

/// What is recorded as the served output of a completion choice.
fn served_text(r: &ChoiceResult) -> (Json, Option<String>) {
    (json!({"text": r.text}), None)
}

async fn stream(
    state: AppState,
    request_id: String,
    plans: Vec<CallPlan>,
    prepared_all: Vec<Prepared>,
    req: CompletionRequest,
    ctx: CallContext,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let n = plans.first().map_or(1, |p| p.n);
    let mut choices: Vec<ChoiceStream> = Vec::new();
    for (pi, plan) in plans.iter().enumerate() {
        let started = futures::future::try_join_all(
            (0..plan.n).map(|i| generate::start_choice(&state, plan, i)),
        )
        .await?;
        for mut s in started {
            // Global choice index across prompts.
            s.index += pi as u32 * n;
            choices.push(ChoiceStream::new(state.renderer.clone(), s, plan));
        }
    }
    let created = unix_now();
    let model = state.config.model.name.clone();
    let chunk = {
        let id = request_id.clone();
        move |choices: Json| json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices})
    };
    let return_ids = req.return_token_ids;
    let prompts: Vec<Arc<Vec<u32>>> = plans.iter().map(|p| p.prompt_ids.clone()).collect();
    let mut initial = Vec::new();
    if return_ids {
        // vLLM sends each choice's prompt ids in its first chunk.
        for (pi, p) in prompts.iter().enumerate() {
            for j in 0..n {
                initial.push(chunk(
                    json!([{"index": pi as u32 * n + j, "text": "", "logprobs": null,
                    "finish_reason": null, "prompt_token_ids": **p}]),
                ));
            }
        }
    }
    let renderer = state.renderer.clone();
    let want_logprobs = req.logprobs.is_some();
    let delta_chunk = chunk.clone();
    let mut offsets = vec![0usize; choices.len()];
    let delta = Box::new(move |ev: &generate::ChoiceEvent| {
        if ev.ids.is_empty() && ev.text.is_empty() {
            return Vec::new();
        }
        let mut c =
            json!({"index": ev.index, "text": ev.text, "logprobs": null, "finish_reason": null});
        if want_logprobs {
            let off = offsets.get(ev.index as usize).copied().unwrap_or(0);
            c["logprobs"] = completion_logprobs(&renderer, &ev.ids, &ev.logprobs, off);
        }
        if let Some(o) = offsets.get_mut(ev.index as usize) {
            *o += ev.text.len();
        }
        if return_ids {
            c["token_ids"] = json!(ev.ids);
        }
        vec![delta_chunk(json!([c]))]
    });
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let usage_chunk =
        include_usage.then(|| (chunk(json!([])), prompts.iter().map(|p| p.len()).sum()));
    let finalize = Box::new(move |results: Vec<ChoiceResult>| {
        async move {
            for (pi, prepared) in prepared_all.iter().enumerate() {
                let mine: Vec<ChoiceResult> = results
                    .iter()
                    .filter(|r| r.index / n == pi as u32)
                    .map(|r| ChoiceResult {
                        index: r.index % n,
                        ..r.clone()
                    })
                    .collect();
                state
                    .record_call(&ctx, prepared, &mine, served_text)
                    .await?;
            }
            Ok(results
                .iter()
                .map(|r| {
                    chunk(json!([{"index": r.index, "text": "", "logprobs": null,
                                  "finish_reason": finish_str(r.finish), "stop_reason": null}]))
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
