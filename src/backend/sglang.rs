//! SGLang client, token in / token out, over SGLang's native API:
//! `POST {url}/generate` with `input_ids` and `sampling_params`; sampled ids
//! come back in `output_ids`, logprobs in `meta_info.output_token_logprobs`
//! (`[[logprob, token_id, text|null], ...]`) and `meta_info.output_top_logprobs`
//! (one such list per position), the finish in `meta_info.finish_reason.type`
//! (`stop` | `length` | `abort`, `null` while running).
//!
//! Owns: SGLang's wire format. Must not: render, decode text, or route.
//!
//! Checked against (November 2026):
//! - docs.sglang.io "Sampling Parameters" (`/generate` arguments `input_ids`,
//!   `rid`, `return_logprob`, `top_logprobs_num`, `logprob_start_len`,
//!   `stream`; sampling parameters `max_new_tokens`, `stop`,
//!   `stop_token_ids`, `min_p`, `ignore_eos`, `skip_special_tokens`,
//!   `no_stop_trim`) and SGLang's
//!   `sampling_params.py`, where the per-request seed is `sampling_seed`.
//! - SGLang `http_server.py`: a stream is SSE `data: {json}` events ended by
//!   `data: [DONE]`; a failure inside a stream is sent as
//!   `data: {"error": {"message": ...}}`; `/health`,
//!   `/release_memory_occupation`, `/resume_memory_occupation` (JSON body,
//!   `{}` = all memory), `/update_weights_from_disk` (`{"model_path": ...}`,
//!   answers `{"success": bool, "message": ...}`).
//! - SGLang's tokenizer-manager output processor: by default a stream sends
//!   the *cumulative* `output_ids` (and cumulative logprob lists); with the
//!   server flag `--incremental-streaming-output` it sends only the new ids
//!   and slices the logprob lists to match. `meta_info.completion_tokens` is
//!   the running total in both modes, which is what tells them apart here.

use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value as Json};

use super::sse::SseDecoder;
use super::{
    AdminOp, Backend, BackendError, FinishReason, GenEvent, GenStream, GenerateRequest,
    TokenLogprob,
};
use crate::config::{BackendConfig, RouterConfig};

pub struct SglangBackend {
    name: String,
    base: String,
    client: reqwest::Client,
    first_token_timeout: Duration,
    idle_timeout: Duration,
}

impl SglangBackend {
    pub fn new(cfg: &BackendConfig, router: &RouterConfig) -> anyhow::Result<Self> {
        Ok(SglangBackend {
            name: cfg.display_name().to_string(),
            base: cfg.url.trim_end_matches('/').to_string(),
            client: super::http_client(router)?,
            first_token_timeout: Duration::from_millis(router.first_token_timeout_ms),
            idle_timeout: Duration::from_millis(router.idle_stream_timeout_ms),
        })
    }

    /// The JSON body sent to SGLang's `/generate` for one request.
    pub fn request_body(&self, req: &GenerateRequest) -> Json {
        let p = &req.params;
        let mut sp = serde_json::Map::new();
        let mut put = |k: &str, v: Json| {
            sp.insert(k.to_string(), v);
        };
        put("max_new_tokens", json!(p.max_tokens));
        if let Some(v) = p.temperature {
            put("temperature", json!(v));
        }
        if let Some(v) = p.top_p {
            put("top_p", json!(v));
        }
        if let Some(v) = p.top_k {
            put("top_k", json!(v));
        }
        if let Some(v) = p.min_p {
            put("min_p", json!(v));
        }
        if let Some(v) = p.seed {
            put("sampling_seed", json!(v));
        }
        if let Some(v) = p.presence_penalty {
            put("presence_penalty", json!(v));
        }
        if let Some(v) = p.frequency_penalty {
            put("frequency_penalty", json!(v));
        }
        if let Some(v) = p.repetition_penalty {
            put("repetition_penalty", json!(v));
        }
        if !p.stop.is_empty() {
            put("stop", json!(p.stop));
        }
        if !p.stop_token_ids.is_empty() {
            put("stop_token_ids", json!(p.stop_token_ids));
        }
        if p.ignore_eos {
            put("ignore_eos", json!(true));
        }
        // Token in, token out: keep every sampled token, trim nothing.
        put("skip_special_tokens", json!(false));
        put("spaces_between_special_tokens", json!(false));
        put("no_stop_trim", json!(true));
        let mut body = json!({
            "input_ids": &*req.prompt_ids,
            "sampling_params": Json::Object(sp),
            "stream": req.stream,
            "rid": req.request_id,
        });
        if let (Some(k), Some(obj)) = (p.logprobs, body.as_object_mut()) {
            obj.insert("return_logprob".into(), json!(true));
            obj.insert("top_logprobs_num".into(), json!(k));
            // Output tokens only: no prompt logprobs computed or sent.
            obj.insert("logprob_start_len".into(), json!(-1));
        }
        body
    }

    fn protocol(&self, message: impl Into<String>) -> BackendError {
        protocol(&self.name, message)
    }

    async fn post_admin(&self, path: &str, body: Json) -> Result<String, BackendError> {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .map_err(|e| super::map_reqwest(&self.name, e))?;
        let resp = super::check_status(&self.name, resp).await?;
        let text = resp
            .text()
            .await
            .map_err(|e| super::map_reqwest(&self.name, e))?;
        // `update_weights_from_disk` answers `{"success": false, ...}` on failure.
        if let Ok(v) = serde_json::from_str::<Json>(&text) {
            if v.get("success").and_then(Json::as_bool) == Some(false) {
                let message = v
                    .get("message")
                    .and_then(Json::as_str)
                    .unwrap_or("backend reported success: false")
                    .to_string();
                return Err(BackendError::Rejected {
                    backend: self.name.clone(),
                    message,
                });
            }
        }
        Ok(text)
    }
}

fn protocol(backend: &str, message: impl Into<String>) -> BackendError {
    BackendError::Protocol {
        backend: backend.to_string(),
        message: message.into(),
    }
}

/// One `/generate` answer or stream event.
#[derive(Deserialize)]
struct GenerateOut {
    #[serde(default)]
    output_ids: Option<Vec<u32>>,
    #[serde(default)]
    meta_info: Option<MetaInfo>,
    #[serde(default)]
    error: Option<Json>,
}

#[derive(Deserialize, Default)]
struct MetaInfo {
    #[serde(default)]
    finish_reason: Option<Json>,
    #[serde(default)]
    completion_tokens: Option<usize>,
    #[serde(default)]
    output_token_logprobs: Option<Vec<Json>>,
    #[serde(default)]
    output_top_logprobs: Option<Vec<Json>>,
}

fn finish_reason(v: Option<&Json>) -> Option<FinishReason> {
    let v = v?;
    let kind = match v {
        Json::Null => return None,
        Json::String(s) => s.as_str(),
        other => other.get("type").and_then(Json::as_str).unwrap_or("abort"),
    };
    Some(match kind {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        _ => FinishReason::Abort,
    })
}

/// `[logprob, token_id, text|null]` → `(token_id, logprob)`; a null logprob
/// (SGLang serializes -inf as null) reads as -inf.
fn logprob_entry(v: &Json) -> Option<(u32, f32)> {
    let arr = v.as_array()?;
    let lp = match arr.first()? {
        Json::Null => f32::NEG_INFINITY,
        x => x.as_f64()? as f32,
    };
    let id = u32::try_from(arr.get(1)?.as_u64()?).ok()?;
    Some((id, lp))
}

/// Turns SGLang stream events (cumulative or incremental) into new tokens.
#[derive(Default)]
struct StreamState {
    emitted: Vec<u32>,
    /// `Some(true)`: the server sends the whole sequence so far; `Some(false)`:
    /// only new ids; `None`: not known yet.
    cumulative: Option<bool>,
    finished: bool,
}

impl StreamState {
    /// How many leading entries of this event were already emitted.
    fn already_emitted(&mut self, ids: &[u32], completion_tokens: Option<usize>) -> usize {
        let e = self.emitted.len();
        if e == 0 {
            return 0;
        }
        if self.cumulative.is_none() {
            let extends = ids.len() >= e && ids[..e] == self.emitted[..];
            self.cumulative = match completion_tokens {
                // The running total decides it whenever the two readings differ.
                Some(c) if c == ids.len() && c != e + ids.len() && extends => Some(true),
                Some(c) if c == e + ids.len() && c != ids.len() => Some(false),
                // No usable total: a chunk that does not extend what was sent
                // can only be incremental; one that does is taken as cumulative.
                _ if !extends => Some(false),
                _ => Some(true),
            };
        }
        if self.cumulative == Some(true) {
            e.min(ids.len())
        } else {
            0
        }
    }

    fn on_event(
        &mut self,
        backend: &str,
        out: GenerateOut,
        want_logprobs: bool,
    ) -> Result<Vec<GenEvent>, BackendError> {
        if let Some(err) = out.error {
            let message = err
                .get("message")
                .and_then(Json::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| err.to_string());
            // SGLang reports request validation failures (ValueError) this way.
            return Err(BackendError::Rejected {
                backend: backend.to_string(),
                message,
            });
        }
        let meta = out.meta_info.unwrap_or_default();
        let ids = out
            .output_ids
            .ok_or_else(|| protocol(backend, "event has no output_ids"))?;
        if self.cumulative == Some(true) && ids.len() < self.emitted.len() {
            return Err(protocol(
                backend,
                format!(
                    "cumulative stream shrank from {} to {} ids",
                    self.emitted.len(),
                    ids.len()
                ),
            ));
        }
        let skip = self.already_emitted(&ids, meta.completion_tokens);
        let new_ids = ids[skip..].to_vec();
        let mut logprobs = Vec::new();
        if want_logprobs && !new_ids.is_empty() {
            let lps = meta
                .output_token_logprobs
                .ok_or_else(|| protocol(backend, "logprobs were asked for but not returned"))?;
            // The logprob lists follow the same convention as `output_ids`;
            // accept them either whole (indexed by position in the output,
            // never shorter than `output_ids`) or already sliced to the new
            // part. The token-id check below catches any misreading.
            let lp_skip = if lps.len() >= ids.len() {
                skip
            } else if lps.len() == new_ids.len() {
                0
            } else {
                return Err(protocol(
                    backend,
                    format!("{} logprobs for {} token ids", lps.len(), ids.len()),
                ));
            };
            let tops = meta.output_top_logprobs.unwrap_or_default();
            for (i, id) in new_ids.iter().enumerate() {
                let (lp_id, lp) = lps
                    .get(lp_skip + i)
                    .and_then(logprob_entry)
                    .ok_or_else(|| protocol(backend, "malformed output_token_logprobs entry"))?;
                if lp_id != *id {
                    return Err(protocol(
                        backend,
                        format!("logprob entry is for token {lp_id}, output has {id}"),
                    ));
                }
                let top_at = if tops.len() >= ids.len() {
                    skip + i
                } else if tops.len() == new_ids.len() {
                    i
                } else {
                    usize::MAX
                };
                let mut top: Vec<(u32, f32)> = tops
                    .get(top_at)
                    .and_then(Json::as_array)
                    .map(|a| a.iter().filter_map(logprob_entry).collect())
                    .unwrap_or_default();
                top.sort_by(|a, b| b.1.total_cmp(&a.1));
                logprobs.push(TokenLogprob { logprob: lp, top });
            }
        }
        self.emitted.extend_from_slice(&new_ids);
        let mut events = Vec::with_capacity(2);
        if !new_ids.is_empty() {
            events.push(GenEvent::Tokens {
                ids: new_ids,
                logprobs,
            });
        }
        if let Some(fr) = finish_reason(meta.finish_reason.as_ref()) {
            if !self.finished {
                self.finished = true;
                events.push(GenEvent::Done { finish_reason: fr });
            }
        }
        Ok(events)
    }
}

#[async_trait::async_trait]
impl Backend for SglangBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "sglang"
    }

    async fn generate(&self, req: GenerateRequest) -> Result<GenStream, BackendError> {
        let body = self.request_body(&req);
        let want_logprobs = req.params.logprobs.is_some();
        let first_deadline = tokio::time::Instant::now() + self.first_token_timeout;
        let send = self
            .client
            .post(format!("{}/generate", self.base))
            .json(&body)
            .send();
        let resp = tokio::time::timeout_at(first_deadline, send)
            .await
            .map_err(|_| super::timeout(&self.name, "no response before the first-token timeout"))?
            .map_err(|e| super::map_reqwest(&self.name, e))?;
        let resp = super::check_status(&self.name, resp).await?;
        if !req.stream {
            let bytes = tokio::time::timeout_at(first_deadline, resp.bytes())
                .await
                .map_err(|_| {
                    super::timeout(&self.name, "no answer before the first-token timeout")
                })?
                .map_err(|e| super::map_reqwest(&self.name, e))?;
            let parsed: GenerateOut = serde_json::from_slice(&bytes)
                .map_err(|e| self.protocol(format!("bad /generate JSON: {e}")))?;
            let mut state = StreamState::default();
            let mut events = state.on_event(&self.name, parsed, want_logprobs)?;
            if !state.finished {
                events.push(GenEvent::Done {
                    finish_reason: FinishReason::Abort,
                });
            }
            return Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))));
        }
        let name = self.name.clone();
        let idle = self.idle_timeout;
        let mut bytes = resp.bytes_stream();
        let stream = spawn_stream(move |tx| async move {
            let mut dec = SseDecoder::default();
            let mut state = StreamState::default();
            loop {
                let deadline = if state.emitted.is_empty() {
                    first_deadline
                } else {
                    tokio::time::Instant::now() + idle
                };
                let chunk = match tokio::time::timeout_at(deadline, bytes.next()).await {
                    Err(_) => {
                        let what = if state.emitted.is_empty() {
                            "no token before the first-token timeout"
                        } else {
                            "stream idle timeout"
                        };
                        let _ = tx.send(Err(super::timeout(&name, what))).await;
                        return;
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        let _ = tx.send(Err(super::map_reqwest(&name, e))).await;
                        return;
                    }
                    Ok(Some(Ok(c))) => c,
                };
                dec.push(&chunk);
                while let Some(data) = dec.next_event() {
                    if data.trim() == "[DONE]" {
                        if !state.finished {
                            let err = protocol(&name, "stream ended without a finish_reason");
                            let _ = tx.send(Err(err)).await;
                        }
                        return;
                    }
                    let events = serde_json::from_str::<GenerateOut>(&data)
                        .map_err(|e| protocol(&name, format!("bad stream event: {e}")))
                        .and_then(|out| state.on_event(&name, out, want_logprobs));
                    match events {
                        Ok(events) => {
                            for ev in events {
                                if tx.send(Ok(ev)).await.is_err() {
                                    return; // client gone: dropping `bytes` cancels upstream
                                }
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                }
            }
            if !state.finished {
                let _ = tx
                    .send(Err(protocol(&name, "stream closed before a finish_reason")))
                    .await;
            }
        });
        Ok(stream)
    }

    async fn health(&self) -> Result<(), BackendError> {
        let resp = self
            .client
            .get(format!("{}/health", self.base))
            .send()
            .await
            .map_err(|e| super::map_reqwest(&self.name, e))?;
        super::check_status(&self.name, resp).await.map(|_| ())
    }

    async fn admin(&self, op: &AdminOp) -> Result<String, BackendError> {
        match op {
            // SGLang has one sleep depth: release weights and KV cache.
            AdminOp::Sleep { .. } => {
                self.post_admin("/release_memory_occupation", json!({}))
                    .await
            }
            AdminOp::WakeUp => {
                self.post_admin("/resume_memory_occupation", json!({}))
                    .await
            }
            AdminOp::UpdateWeights { path } => {
                self.post_admin("/update_weights_from_disk", json!({ "model_path": path }))
                    .await
            }
        }
    }
}

/// Runs `f` as a task feeding a channel; the returned stream ends when the
/// task ends, and dropping the stream aborts the task (and its connection).
fn spawn_stream<F, Fut>(f: F) -> GenStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<GenEvent, BackendError>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(f(tx));
    Box::pin(super::AbortOnDrop::new(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        task,
    ))
}

#[cfg(test)]
#[path = "sglang_tests.rs"]
mod tests;
