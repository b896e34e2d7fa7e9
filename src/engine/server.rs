//! `tito engine`: the bundled engine alone, as an HTTP server that speaks
//! vLLM's token-in completions protocol and SGLang's `/generate`, so engine
//! replicas can stand behind one gateway (or any vLLM/SGLang client).
//!
//! Owns: the wire shapes of `POST /v1/completions`, `POST /generate`,
//! `GET /health` and `GET /v1/models`, and text ⇄ ids with the GGUF's own
//! tokenizer for text prompts and `text` fields. Must not: render chat
//! templates or apply stop *strings* (clients such as the tito gateway apply
//! those on decoded text; only stop token ids and EOS stop the engine).
//! Logprobs go on the wire only when the client asks for them, in the
//! quantity `[engine] logprobs_mode` names (raw by default, as vLLM).
//! Prompt logprobs (the replay check's teacher-forced pass) are answered in
//! both forms: vLLM's `prompt_logprobs: 0 | 1` (not streamed) and SGLang's
//! `return_logprob` with `logprob_start_len >= 0` and `top_logprobs_num <= 1`
//! (see [`score`](super::score)).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value as Json_};
use tokio_stream::wrappers::ReceiverStream;

use super::{score, EngineBackend};
use crate::backend::{
    Backend, FinishReason, GenEvent, GenStream, GenerateRequest, SamplingParams, StructuredOutput,
    TokenLogprob,
};
use crate::config::EngineConfig;
use crate::error::ApiError;
use crate::render::detok::{Decode, Detokenizer, TextAssembler};

/// What the routes share: the engine, its tokenizer and the served name.
pub struct EngineServer {
    pub backend: Arc<EngineBackend>,
    pub detok: Arc<Detokenizer>,
    pub model_name: String,
}

impl EngineServer {
    /// Starts the engine and loads the tokenizer from the same GGUF file.
    pub fn start(cfg: &EngineConfig) -> anyhow::Result<Arc<EngineServer>> {
        let source = crate::render::gguf::load_tokenizer(&cfg.model)?;
        let backend = EngineBackend::start(cfg)?;
        let model_name = cfg.model.file_stem().map_or_else(
            || "engine".to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        Ok(Arc::new(EngineServer {
            backend,
            detok: Arc::new(Detokenizer::new(source.tokenizer)),
            model_name,
        }))
    }
}

/// The engine server's routes.
pub fn app(state: Arc<EngineServer>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate))
        .with_state(state)
}

/// 200 while the engine thread runs, else 503 (the gateway's probe then
/// counts it down).
async fn health(State(s): State<Arc<EngineServer>>) -> Result<&'static str, ApiError> {
    s.backend.health().await.map(|()| "").map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            e.to_string(),
        )
    })
}

/// Runs `tito engine` until `shutdown` resolves.
pub async fn serve(
    cfg: &EngineConfig,
    listen: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let cfg = cfg.clone();
    let state = tokio::task::spawn_blocking(move || EngineServer::start(&cfg)).await??;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(addr = %listener.local_addr()?, model = %state.model_name, "tito engine listening");
    let cap = crate::config::DEFAULT_MAX_CONNECTIONS;
    crate::server::serve(listener, cap, app(state), shutdown).await;
    Ok(())
}

async fn models(State(s): State<Arc<EngineServer>>) -> Json<Json_> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.model_name, "object": "model", "owned_by": "tito",
            "max_model_len": s.backend.info().max_seq_len,
        }],
    }))
}

/// A prompt as token ids or text.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Ids(Vec<u32>),
    Text(String),
    Batch(Vec<Vec<u32>>),
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CompletionBody {
    prompt: Option<Prompt>,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    seed: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stop_token_ids: Option<Vec<u32>>,
    ignore_eos: bool,
    logprobs: Option<u32>,
    return_token_ids: bool,
    return_tokens_as_token_ids: bool,
    skip_special_tokens: Option<bool>,
    stream: bool,
    n: Option<u32>,
    request_id: Option<String>,
    /// vLLM's `{"json": schema}` or `{"json_object": true}`.
    structured_outputs: Option<serde_json::Value>,
    /// Logprobs of the prompt's own tokens (0), plus the most likely (1).
    prompt_logprobs: Option<u32>,
}

/// vLLM's `structured_outputs` as a constraint; other kinds are refused.
fn vllm_structured(v: Option<&serde_json::Value>) -> Result<Option<StructuredOutput>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if let Some(schema) = v.get("json").filter(|s| !s.is_null()) {
        // vLLM also takes the schema as a JSON string.
        let schema = match schema.as_str() {
            Some(text) => serde_json::from_str(text).map_err(|e| {
                ApiError::invalid("structured_outputs.json", format!("not a JSON schema: {e}"))
            })?,
            None => schema.clone(),
        };
        return Ok(Some(StructuredOutput::JsonSchema(schema)));
    }
    if v.get("json_object").and_then(serde_json::Value::as_bool) == Some(true) {
        return Ok(Some(StructuredOutput::JsonObject));
    }
    Err(ApiError::invalid(
        "structured_outputs",
        "only `json` and `json_object` structured outputs are supported",
    ))
}

/// SGLang's `json_schema` (a JSON string) as a constraint.
fn sglang_structured(v: Option<&str>) -> Result<Option<StructuredOutput>, ApiError> {
    v.map(|text| {
        serde_json::from_str(text)
            .map(StructuredOutput::JsonSchema)
            .map_err(|e| ApiError::invalid("sampling_params.json_schema", format!("not JSON: {e}")))
    })
    .transpose()
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SglSampling {
    max_new_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    seed: Option<i64>,
    sampling_seed: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stop_token_ids: Option<Vec<u32>>,
    ignore_eos: bool,
    skip_special_tokens: Option<bool>,
    json_schema: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct GenerateBody {
    input_ids: Option<Vec<u32>>,
    text: Option<String>,
    sampling_params: SglSampling,
    return_logprob: bool,
    /// With `return_logprob`: input token logprobs from this position on
    /// (-1, the default: none).
    logprob_start_len: Option<i64>,
    top_logprobs_num: Option<u32>,
    stream: bool,
    rid: Option<String>,
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

fn encode(s: &EngineServer, text: &str) -> Result<Vec<u32>, ApiError> {
    let enc = s
        .detok
        .tokenizer()
        .encode_fast(text, false)
        .map_err(|e| ApiError::bad_request(format!("cannot tokenize the prompt: {e}")))?;
    Ok(enc.get_ids().to_vec())
}

fn decode(s: &EngineServer, ids: &[u32], skip_special: bool) -> String {
    s.detok.decode_text(ids, skip_special)
}

/// A stream's text, released as its ids arrive (see [`TextAssembler`]).
fn assembler(s: &EngineServer, skip_special: bool) -> TextAssembler {
    TextAssembler::new(s.detok.clone(), skip_special, Vec::new())
}

/// The sampling fields both protocols take, checked as vLLM checks them
/// (the gateway checks its own requests; this guards the engine's direct
/// clients).
struct Sampling {
    temperature: Option<f32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    top_k: Option<i32>,
    repetition_penalty: Option<f32>,
    /// Top alternatives per sampled token.
    logprobs: Option<u32>,
}

/// vLLM's default `max_logprobs`: more would sort the vocabulary for every
/// token of every sequence in the batch.
const MAX_LOGPROBS: u32 = 20;

fn check_sampling(p: Sampling) -> Result<(), ApiError> {
    if p.temperature.is_some_and(|t| !(0.0..=100.0).contains(&t)) {
        return Err(ApiError::invalid(
            "temperature",
            "temperature must be in [0, 100]",
        ));
    }
    if p.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
    }
    if p.min_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err(ApiError::invalid("min_p", "min_p must be in [0, 1]"));
    }
    if p.top_k.is_some_and(|k| k < -1) {
        return Err(ApiError::invalid(
            "top_k",
            "top_k must be -1 or 0 (disabled) or at least 1",
        ));
    }
    if p.repetition_penalty
        .is_some_and(|r| !(r.is_finite() && r > 0.0))
    {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "repetition_penalty must be greater than 0",
        ));
    }
    if p.logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
        return Err(ApiError::invalid(
            "logprobs",
            format!("at most {MAX_LOGPROBS} logprobs per token"),
        ));
    }
    Ok(())
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

async fn start(s: &EngineServer, req: GenerateRequest) -> Result<GenStream, ApiError> {
    Ok(s.backend.generate(req).await?)
}

/// Spawns `f` feeding SSE events into a channel. When the response stream
/// is dropped (the client left), `f` is dropped at once, with the generation
/// stream it holds, which cancels the sequence in the engine: also while it
/// still waits in the queue or in its prefill, before it has sent anything.
fn sse<F, Fut>(f: F) -> Response
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Event, Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let gone = tx.clone();
    let feed = f(tx);
    tokio::spawn(async move {
        tokio::select! {
            () = feed => {}
            () = gone.closed() => {}
        }
    });
    Sse::new(ReceiverStream::new(rx)).into_response()
}

/// An error inside a stream, as vLLM writes it: the HTTP status the
/// request would have had in `code`, so a client (the gateway) tells a
/// refused request from a failed engine.
fn stream_error(e: crate::backend::BackendError) -> Json_ {
    let e = ApiError::from(e);
    let mut body = e.body();
    body["error"]["code"] = serde_json::json!(e.status.as_u16());
    body
}

fn data(v: &Json_) -> Result<Event, Infallible> {
    Ok(Event::default().data(v.to_string()))
}

fn done_event() -> Result<Event, Infallible> {
    Ok(Event::default().data("[DONE]"))
}

// ---------------------------------------------------------------- vLLM

struct CompletionCtx {
    id: String,
    created: i64,
    model: String,
    return_token_ids: bool,
    as_ids: bool,
    want_top: bool,
    skip_special: bool,
    /// The request's `stop_token_ids`, and whether EOS ends it too.
    stop_token_ids: Vec<u32>,
    ignore_eos: bool,
}

impl CompletionCtx {
    /// vLLM's `stop_reason`: the token that ended the sequence when it is
    /// one of `stop_token_ids` and not EOS, else null.
    fn stop_reason(&self, s: &EngineServer, finish: FinishReason, last: Option<u32>) -> Json_ {
        let eos = |id: u32| !self.ignore_eos && s.backend.info().eog_ids.binary_search(&id).is_ok();
        match last {
            Some(id)
                if finish == FinishReason::Stop
                    && self.stop_token_ids.contains(&id)
                    && !eos(id) =>
            {
                json!(id)
            }
            _ => Json_::Null,
        }
    }

    fn logprobs(&self, s: &EngineServer, ids: &[u32], lps: &[TokenLogprob]) -> Json_ {
        let token_str = |id: u32| {
            if self.as_ids {
                format!("token_id:{id}")
            } else {
                decode(s, &[id], false)
            }
        };
        let tokens: Vec<String> = ids.iter().map(|&id| token_str(id)).collect();
        let token_logprobs: Vec<Option<f32>> = lps.iter().map(|l| l.logprob).collect();
        let top: Vec<Json_> = ids
            .iter()
            .zip(lps)
            .map(|(&id, l)| {
                let mut m = Map::new();
                for &(t, lp) in &l.top {
                    m.insert(token_str(t), json!(lp));
                }
                m.entry(token_str(id)).or_insert(json!(l.logprob));
                Json_::Object(m)
            })
            .collect();
        let mut offset = 0usize;
        let offsets: Vec<usize> = tokens
            .iter()
            .map(|t| {
                let o = offset;
                offset += t.len();
                o
            })
            .collect();
        json!({
            "tokens": tokens, "token_logprobs": token_logprobs,
            "top_logprobs": if self.want_top { json!(top) } else { Json_::Null },
            "text_offset": offsets,
        })
    }

    fn choice(
        &self,
        s: &EngineServer,
        text: String,
        ids: &[u32],
        lps: Option<&[TokenLogprob]>,
        prompt: Option<&[u32]>,
        finish: Option<FinishReason>,
    ) -> Json_ {
        let mut c = json!({
            "index": 0, "text": text,
            "logprobs": lps.map_or(Json_::Null, |l| self.logprobs(s, ids, l)),
            "finish_reason": finish.map(|f| f.as_str()),
            "stop_reason": Json_::Null,
        });
        if self.return_token_ids {
            c["token_ids"] = json!(ids);
            if let Some(p) = prompt {
                c["prompt_token_ids"] = json!(p);
            }
        }
        c
    }

    fn envelope(&self, choice: Json_) -> Json_ {
        json!({
            "id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model, "choices": [choice],
        })
    }
}

async fn completions(
    State(s): State<Arc<EngineServer>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let b: CompletionBody = parse(&body)?;
    if b.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "n",
            "the bundled engine serves n = 1 only",
        ));
    }
    check_sampling(Sampling {
        temperature: b.temperature,
        top_p: b.top_p,
        min_p: b.min_p,
        top_k: b.top_k,
        repetition_penalty: b.repetition_penalty,
        logprobs: b.logprobs,
    })?;
    match b.prompt_logprobs {
        Some(k) if k > 1 => {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                "the bundled engine returns prompt_logprobs 0 (each prompt token's own) or 1 (and the most likely)",
            ))
        }
        Some(_) if b.stream => {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                "`prompt_logprobs` are not available when `stream=True`",
            ))
        }
        _ => {}
    }
    let prompt = match b.prompt {
        Some(Prompt::Ids(ids)) => ids,
        Some(Prompt::Text(t)) => encode(&s, &t)?,
        Some(Prompt::Batch(mut v)) if v.len() == 1 => v.remove(0),
        Some(Prompt::Batch(_)) => {
            return Err(ApiError::invalid("prompt", "one prompt per request"))
        }
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
    };
    let params = SamplingParams {
        max_tokens: b.max_tokens.unwrap_or(16),
        temperature: b.temperature,
        top_p: b.top_p,
        top_k: b.top_k,
        min_p: b.min_p,
        seed: b.seed,
        presence_penalty: b.presence_penalty,
        frequency_penalty: b.frequency_penalty,
        repetition_penalty: b.repetition_penalty,
        stop: Vec::new(),
        stop_token_ids: b.stop_token_ids.unwrap_or_default(),
        ignore_eos: b.ignore_eos,
        logprobs: b.logprobs,
        structured: vllm_structured(b.structured_outputs.as_ref())?,
    };
    let ctx = CompletionCtx {
        id: format!("cmpl-{}", b.request_id.as_deref().unwrap_or("engine")),
        created: unix_now(),
        model: s.model_name.clone(),
        return_token_ids: b.return_token_ids,
        as_ids: b.return_tokens_as_token_ids,
        want_top: b.logprobs.is_some(),
        skip_special: b.skip_special_tokens.unwrap_or(true),
        stop_token_ids: params.stop_token_ids.clone(),
        ignore_eos: params.ignore_eos,
    };
    let want_lp = b.logprobs.is_some();
    let prompt_logprobs = match b.prompt_logprobs {
        Some(k) => {
            let scores = s.backend.score(prompt.clone()).await?;
            let decode_one = |id: u32| decode(&s, &[id], false);
            Some(score::vllm_prompt_logprobs(&prompt, &scores, k, decode_one))
        }
        None => None,
    };
    let prompt = Arc::new(prompt);
    let req = GenerateRequest {
        request_id: ctx.id.clone(),
        prompt_ids: prompt.clone(),
        params,
        images: None,
        adapter: None,
    };
    let mut stream = start(&s, req).await?;
    if !b.stream {
        let mut g = crate::backend::Generation::default();
        while let Some(ev) = stream.next().await {
            g.push(ev?);
        }
        let text = decode(&s, &g.ids, ctx.skip_special);
        let finish = g.finish_reason.unwrap_or(FinishReason::Abort);
        let mut choice = ctx.choice(
            &s,
            text,
            &g.ids,
            want_lp.then_some(&g.logprobs[..]),
            Some(&prompt[..]),
            Some(finish),
        );
        choice["stop_reason"] = ctx.stop_reason(&s, finish, g.ids.last().copied());
        if let Some(pl) = prompt_logprobs {
            choice["prompt_logprobs"] = pl;
        }
        let mut out = ctx.envelope(choice);
        out["usage"] = json!({
            "prompt_tokens": prompt.len(), "completion_tokens": g.ids.len(),
            "total_tokens": prompt.len() + g.ids.len(),
        });
        return Ok(Json(out).into_response());
    }
    Ok(sse(move |tx| async move {
        let mut text = assembler(&s, ctx.skip_special);
        let mut last: Option<u32> = None;
        let mut first = true;
        while let Some(ev) = stream.next().await {
            let chunk = match ev {
                Ok(GenEvent::Tokens { ids, logprobs }) => {
                    last = ids.last().copied().or(last);
                    let delta: String = ids.iter().map(|&id| text.push(id)).collect();
                    let p = first.then_some(&prompt[..]);
                    first = false;
                    ctx.envelope(ctx.choice(
                        &s,
                        delta,
                        &ids,
                        want_lp.then_some(&logprobs[..]),
                        p,
                        None,
                    ))
                }
                Ok(GenEvent::Versions(_) | GenEvent::PromptDrift(_)) => continue,
                Ok(GenEvent::Done { finish_reason }) => {
                    let p = first.then_some(&prompt[..]);
                    first = false;
                    // Bytes of a character the last id left unfinished, as
                    // the whole reply's decode ends them.
                    let mut choice = ctx.choice(
                        &s,
                        text.finish(),
                        &[],
                        want_lp.then_some(&[][..]),
                        p,
                        Some(finish_reason),
                    );
                    choice["stop_reason"] = ctx.stop_reason(&s, finish_reason, last);
                    ctx.envelope(choice)
                }
                Err(e) => stream_error(e),
            };
            if tx.send(data(&chunk)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(done_event()).await;
    }))
}

// ---------------------------------------------------------------- SGLang

/// SGLang's input logprobs when asked (`return_logprob` with
/// `logprob_start_len >= 0`): `(input_token_logprobs, input_top_logprobs)`.
async fn sglang_input(
    s: &EngineServer,
    (return_logprob, start_len, top_num): (bool, Option<i64>, Option<u32>),
    prompt: &[u32],
) -> Result<Option<(Json_, Json_)>, ApiError> {
    let Some(start) = start_len.filter(|&v| return_logprob && v >= 0) else {
        return Ok(None);
    };
    let start = usize::try_from(start).unwrap_or(usize::MAX);
    if start >= prompt.len() {
        return Err(ApiError::invalid(
            "logprob_start_len",
            format!(
                "logprob_start_len {start} is not inside the {}-token input",
                prompt.len()
            ),
        ));
    }
    let k = top_num.unwrap_or(0);
    if k > 1 {
        return Err(ApiError::invalid(
            "top_logprobs_num",
            "with input logprobs the bundled engine returns at most 1 top logprob per position",
        ));
    }
    let scores = s.backend.score(prompt.to_vec()).await?;
    Ok(Some(score::sglang_input_logprobs(
        prompt,
        &scores,
        start,
        k == 1,
    )))
}

async fn generate(State(s): State<Arc<EngineServer>>, body: Bytes) -> Result<Response, ApiError> {
    let b: GenerateBody = parse(&body)?;
    let sp = b.sampling_params;
    check_sampling(Sampling {
        temperature: sp.temperature,
        top_p: sp.top_p,
        min_p: sp.min_p,
        top_k: sp.top_k,
        repetition_penalty: sp.repetition_penalty,
        logprobs: None,
    })?;
    let prompt = match (b.input_ids, b.text) {
        (Some(ids), _) => ids,
        (None, Some(text)) => encode(&s, &text)?,
        (None, None) => {
            return Err(ApiError::invalid(
                "input_ids",
                "`input_ids` or `text` is required",
            ))
        }
    };
    let params = SamplingParams {
        max_tokens: sp.max_new_tokens.unwrap_or(128),
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: sp.top_k,
        min_p: sp.min_p,
        seed: sp.seed.or(sp.sampling_seed),
        presence_penalty: sp.presence_penalty,
        frequency_penalty: sp.frequency_penalty,
        repetition_penalty: sp.repetition_penalty,
        stop: Vec::new(),
        stop_token_ids: sp.stop_token_ids.unwrap_or_default(),
        ignore_eos: sp.ignore_eos,
        logprobs: b.return_logprob.then_some(0),
        structured: sglang_structured(sp.json_schema.as_deref())?,
    };
    let asked = (b.return_logprob, b.logprob_start_len, b.top_logprobs_num);
    let input_lp = sglang_input(&s, asked, &prompt).await?;
    let skip_special = sp.skip_special_tokens.unwrap_or(true);
    let rid = b.rid.unwrap_or_else(|| "engine".to_string());
    let prompt_len = prompt.len();
    let req = GenerateRequest {
        request_id: rid.clone(),
        prompt_ids: Arc::new(prompt),
        params,
        images: None,
        adapter: None,
    };
    let mut stream = start(&s, req).await?;
    let want_lp = b.return_logprob;
    let body =
        move |text: &str, ids: &[u32], lps: &[TokenLogprob], finish: Option<FinishReason>| {
            let finish_reason = finish.map(|f| match f {
                FinishReason::Stop => json!({"type": "stop", "matched": ids.last()}),
                other => json!({"type": other.as_str()}),
            });
            let mut meta = json!({
                "id": rid, "prompt_tokens": prompt_len, "completion_tokens": ids.len(),
                "finish_reason": finish_reason,
            });
            if want_lp {
                let lp: Vec<Json_> = ids
                    .iter()
                    .zip(lps)
                    .map(|(id, l)| json!([l.logprob, id, null]))
                    .collect();
                meta["output_token_logprobs"] = json!(lp);
            }
            if let Some((tokens, tops)) = &input_lp {
                meta["input_token_logprobs"] = tokens.clone();
                meta["input_top_logprobs"] = tops.clone();
            }
            json!({"text": text, "output_ids": ids, "meta_info": meta})
        };
    if !b.stream {
        let mut g = crate::backend::Generation::default();
        while let Some(ev) = stream.next().await {
            g.push(ev?);
        }
        let fr = Some(g.finish_reason.unwrap_or(FinishReason::Abort));
        let text = decode(&s, &g.ids, skip_special);
        return Ok(Json(body(&text, &g.ids, &g.logprobs, fr)).into_response());
    }
    Ok(sse(move |tx| async move {
        let mut g = crate::backend::Generation::default();
        // SGLang's chunks carry the text so far; it grows by what the
        // assembler releases.
        let mut assembled = assembler(&s, skip_special);
        let mut text = String::new();
        let mut error: Option<Json_> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    match &ev {
                        GenEvent::Tokens { ids, .. } => {
                            ids.iter()
                                .for_each(|&id| text.push_str(&assembled.push(id)));
                        }
                        GenEvent::Done { .. } => text.push_str(&assembled.finish()),
                        GenEvent::Versions(_) | GenEvent::PromptDrift(_) => {}
                    }
                    g.push(ev);
                }
                Err(e) => {
                    error = Some(stream_error(e));
                    break;
                }
            }
            let chunk = body(&text, &g.ids, &g.logprobs, g.finish_reason);
            if tx.send(data(&chunk)).await.is_err() {
                return;
            }
        }
        if let Some(err) = error {
            let _ = tx.send(data(&err)).await;
        }
        let _ = tx.send(done_event()).await;
    }))
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
