//! `POST /v1/completions`: parse → prepare (a text prompt tokenized here,
//! or token ids passed through untouched; one or several prompts, each its
//! own recorded call) → run (see `call`) → respond, streaming or not.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::RawPathParams;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value as Json};

use super::logprobs::completion_logprobs;
use super::request::{parse_body, CompletionRequest, PromptSpec};
use super::sse::{sse_response, usage, Chunks};
use super::stream::{self, Encoder, Out};
use super::{new_id, unix_now, AppState, Picked};
use crate::call::replies::Claim;
use crate::call::{Answer, ChoiceEvent, Output, PlanRequest};
use crate::error::ApiError;
use crate::metrics::PHASE;
use crate::trajectory::CallContext;

const ROUTE: &str = "/v1/completions";

pub async fn completions(
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
        Some(PromptSpec::Text(t)) => vec![encode(t)?],
        Some(PromptSpec::Ids(ids)) => vec![ids.clone()],
        Some(PromptSpec::Texts(ts)) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        Some(PromptSpec::IdLists(ls)) => ls.clone(),
        None => Vec::new(),
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
    path: super::PathIds,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let handled = Instant::now();
    // Parse.
    let (req, body_json, named, tag, params, max_tokens, n, adapter) =
        tracing::info_span!(target: PHASE, "parse").in_scope(|| {
            let (req, body_json): (CompletionRequest, _) = parse_body(&body)?;
            req.check()?;
            super::unsupported::completions(&body_json)?;
            let adapter = state.check_model(req.model.as_deref())?;
            let named =
                super::named_trajectory_id(path.tid, headers, req.trajectory_id.as_deref())?;
            let tag = super::named_metadata(
                path.gid,
                headers,
                req.trajectory_group.as_deref(),
                req.trajectory_metadata.as_ref(),
            )?;
            let (params, max_tokens) = req
                .sampling
                .validate(req.logprobs, state.renderer.vocab_size())?;
            let n = req.sampling.n()?;
            Ok::<_, ApiError>((
                req,
                Arc::new(body_json),
                named,
                tag,
                params,
                max_tokens,
                n,
                adapter,
            ))
        })?;
    let prompts =
        tracing::info_span!(target: PHASE, "render").in_scope(|| prompt_ids(&state, &req))?;
    state.check_sequences(prompts.len(), n)?;
    let shape = Shape {
        logprobs: req.logprobs.is_some(),
        token_ids: req.return_token_ids,
        usage_chunk: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        model: state.served_id(adapter.as_deref()),
    };
    let owner = match state
        .calls
        .claim(super::retry_request(headers, named.clone(), &body)?)
        .await?
    {
        Claim::Recorded(answer) => return Ok(replay(&state, answer, req.stream, shape)),
        Claim::Owner(owner) => owner,
    };

    // Prepare: one call per prompt.
    let adapter = state.adapter_share(adapter.as_deref()).await?;
    let tid = super::trajectory_id(&state, named);
    state.trajectories.tag(&tid, &tag).await?;
    let started_at = crate::store::now_ms();
    let weight_version = state.router.weight_version();
    let mut plans = Vec::with_capacity(prompts.len());
    for ids in prompts {
        let prepared = state.trajectories.prepare_completion(&tid, ids).await?;
        plans.push(state.calls.plan(PlanRequest {
            ctx: CallContext {
                trajectory_id: tid.clone(),
                request: body_json.clone(),
                messages: None,
                started_at,
                weight_version: weight_version.clone(),
                normalized: Vec::new(),
                api: crate::surface::Api::Completions,
                response_id: None,
                instructions: 0,
                images: None,
                model: Some(state.model_name.clone()),
                adapter: adapter.clone(),
            },
            prepared,
            params: params.clone(),
            max_tokens,
            n,
            skip_special_tokens: req.skip_special_tokens.unwrap_or(true),
            output: Output::Text,
        })?);
    }

    // Run.
    let running = state
        .calls
        .start(new_id("cmpl"), plans, Some(owner), req.stream)
        .await?;

    // Respond.
    let headers = super::trajectory_header(&tid);
    if req.stream {
        let model = shape.model.clone();
        let chunks = Chunks::new(&state, "text_completion", unix_now(), &model, shape);
        let encoder = CompletionEncoder::new(chunks);
        return Ok(sse_response(&state, headers, move |tx| {
            stream::run(running, encoder, ROUTE, tid, tx)
        }));
    }
    let answer = running.finish().await?;
    let body = response_body(&state, &answer, &shape);
    crate::metrics::gateway_overhead(
        "completions",
        handled.elapsed().saturating_sub(answer.generated_in),
    );
    Ok((headers, axum::Json(body)).into_response())
}

/// What the client wants in its response (independent of what is recorded).
#[derive(Clone)]
struct Shape {
    logprobs: bool,
    token_ids: bool,
    usage_chunk: bool,
    /// The id the client asked for: the model's name or an adapter's.
    model: String,
}

/// A recorded answer, given again (an SDK retry or a repeated key).
fn replay(state: &AppState, answer: Arc<Answer>, stream: bool, shape: Shape) -> Response {
    let headers = super::trajectory_header(&answer.trajectory_id);
    if !stream {
        let body = response_body(state, &answer, &shape);
        return (headers, axum::Json(body)).into_response();
    }
    let model = shape.model.clone();
    let chunks = Chunks::new(state, "text_completion", answer.created, &model, shape);
    let encoder = CompletionEncoder::new(chunks);
    sse_response(state, headers, move |tx| {
        stream::replay(answer, encoder, tx)
    })
}

fn response_body(state: &AppState, answer: &Answer, shape: &Shape) -> Json {
    let n = answer.n.max(1) as usize;
    let choices: Vec<Json> = answer
        .choices
        .iter()
        .map(|r| {
            let mut c = json!({
                "index": r.index,
                "text": r.text,
                "logprobs": Json::Null,
                "finish_reason": r.finish_reason,
                "stop_reason": r.stop_reason_json(),
            });
            if shape.logprobs {
                c["logprobs"] = completion_logprobs(&state.renderer, &r.ids, &r.logprobs, 0);
            }
            if shape.token_ids {
                if let Some(p) = answer.prompts.get(r.index as usize / n) {
                    c["prompt_token_ids"] = json!(**p);
                }
                c["token_ids"] = json!(r.ids);
            }
            c
        })
        .collect();
    json!({
        "id": answer.request_id,
        "object": "text_completion",
        "created": answer.created,
        "model": shape.model,
        "system_fingerprint": state.system_fingerprint(),
        "choices": choices,
        "usage": usage(answer.prompt_tokens(), answer.completion_tokens()),
    })
}

/// Formats `text_completion` chunks.
type CompletionChunks = Chunks<Shape>;

impl CompletionChunks {
    /// vLLM sends each choice's prompt ids in a first chunk of its own.
    fn open(&self, id: &str, index: u32, prompt: &[u32]) -> Option<Json> {
        self.shape.token_ids.then(|| {
            self.chunk(
                id,
                json!([{"index": index, "text": "", "logprobs": null,
                        "finish_reason": null, "prompt_token_ids": prompt}]),
            )
        })
    }

    /// A delta; `offset` is the byte offset of its text in the choice.
    fn delta(&self, id: &str, ev: &ChoiceEvent, offset: usize) -> Option<Json> {
        if ev.ids.is_empty() && ev.text.is_empty() {
            return None;
        }
        let mut c = json!({"index": ev.index, "text": ev.text, "logprobs": null,
                           "finish_reason": null});
        if self.shape.logprobs {
            c["logprobs"] = completion_logprobs(&self.renderer, &ev.ids, &ev.logprobs, offset);
        }
        if self.shape.token_ids {
            c["token_ids"] = json!(ev.ids);
        }
        Some(self.chunk(id, json!([c])))
    }

    fn end(&self, answer: &Answer) -> Vec<Json> {
        self.head
            .end(answer, self.shape.usage_chunk, |index, finish| {
                json!({"index": index, "text": "", "logprobs": null,
                   "finish_reason": finish})
            })
    }
}

/// The streaming response: prompt-id chunks, each delta as it comes, then,
/// once the call is recorded, the finish chunks and usage.
struct CompletionEncoder {
    chunks: CompletionChunks,
    /// Per choice, the bytes of text sent so far (logprobs' text offsets).
    offsets: Vec<usize>,
}

impl CompletionEncoder {
    fn new(chunks: CompletionChunks) -> Self {
        CompletionEncoder {
            chunks,
            offsets: Vec::new(),
        }
    }
}

impl Encoder for CompletionEncoder {
    fn open(&mut self, id: &str, prompts: &[Arc<Vec<u32>>], n: u32) -> Vec<Out> {
        let n = n.max(1);
        self.offsets = vec![0; prompts.len() * n as usize];
        let mut out = Vec::new();
        for (pi, p) in prompts.iter().enumerate() {
            for j in 0..n {
                out.extend(self.chunks.open(id, pi as u32 * n + j, p));
            }
        }
        out.iter().map(Out::json).collect()
    }

    fn delta(&mut self, id: &str, ev: &ChoiceEvent) -> Vec<Out> {
        let slot = self.offsets.get_mut(ev.index as usize);
        let offset = slot.as_deref().copied().unwrap_or(0);
        if let Some(o) = slot {
            *o += ev.text.len();
        }
        self.chunks
            .delta(id, ev, offset)
            .iter()
            .map(Out::json)
            .collect()
    }

    fn end(&mut self, answer: &Answer) -> Vec<Out> {
        self.chunks.end(answer).iter().map(Out::json).collect()
    }

    /// Prompt-id chunks, one delta per choice with all its text, ids and
    /// logprobs, the finish chunks and usage.
    fn replay(&mut self, answer: &Answer) -> Vec<Out> {
        let id = &answer.request_id;
        let n = answer.n.max(1) as usize;
        let mut out = Vec::new();
        for r in &answer.choices {
            if let Some(p) = answer.prompts.get(r.index as usize / n) {
                out.extend(self.chunks.open(id, r.index, p));
            }
        }
        for r in &answer.choices {
            out.extend(self.chunks.delta(id, &r.as_event(), 0));
        }
        out.extend(self.chunks.end(answer));
        out.iter().map(Out::json).collect()
    }
}
