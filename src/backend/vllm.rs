//! vLLM client, token in / token out: `POST {url}/v1/completions` with
//! `prompt` = token ids and `return_token_ids: true`. Logprobs are asked with
//! `return_tokens_as_token_ids` so alternatives come back keyed by id, never
//! by ambiguous token text.

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

pub struct VllmBackend {
    name: String,
    base: String,
    model: Option<String>,
    client: reqwest::Client,
    first_token_timeout: Duration,
    idle_timeout: Duration,
}

impl VllmBackend {
    pub fn new(cfg: &BackendConfig, router: &RouterConfig) -> anyhow::Result<Self> {
        Ok(VllmBackend {
            name: cfg.display_name().to_string(),
            base: cfg.url.trim_end_matches('/').to_string(),
            model: (!cfg.model.is_empty()).then(|| cfg.model.clone()),
            client: super::http_client(router)?,
            first_token_timeout: Duration::from_millis(router.first_token_timeout_ms),
            idle_timeout: Duration::from_millis(router.idle_stream_timeout_ms),
        })
    }

    /// The JSON body sent to vLLM for one request.
    pub fn request_body(&self, req: &GenerateRequest) -> Json {
        let p = &req.params;
        let mut body = json!({
            "prompt": &*req.prompt_ids,
            "max_tokens": p.max_tokens,
            "n": 1,
            "stream": req.stream,
            "return_token_ids": true,
            "skip_special_tokens": false,
            "spaces_between_special_tokens": false,
            "request_id": req.request_id,
        });
        let obj = body.as_object_mut().expect("json! object");
        let mut put = |k: &str, v: Json| {
            obj.insert(k.to_string(), v);
        };
        if let Some(m) = &self.model {
            put("model", json!(m));
        }
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
            put("seed", json!(v));
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
        if let Some(k) = p.logprobs {
            put("logprobs", json!(k));
            put("return_tokens_as_token_ids", json!(true));
        }
        body
    }

    fn protocol(&self, message: impl Into<String>) -> BackendError {
        BackendError::Protocol {
            backend: self.name.clone(),
            message: message.into(),
        }
    }
}

#[derive(Deserialize)]
struct CompletionResponse {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    logprobs: Option<CompletionLogprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct CompletionLogprobs {
    #[serde(default)]
    token_logprobs: Vec<Option<f32>>,
    #[serde(default)]
    top_logprobs: Vec<Option<serde_json::Map<String, Json>>>,
}

fn finish_reason(s: Option<&str>) -> Option<FinishReason> {
    match s? {
        "stop" => Some(FinishReason::Stop),
        "length" => Some(FinishReason::Length),
        _ => Some(FinishReason::Abort),
    }
}

/// `"token_id:123"` → 123 (vLLM's `return_tokens_as_token_ids` form).
fn parse_token_key(key: &str) -> Option<u32> {
    key.strip_prefix("token_id:")?.parse().ok()
}

impl Choice {
    fn into_events(
        self,
        backend: &str,
        want_logprobs: bool,
    ) -> Result<Vec<GenEvent>, BackendError> {
        let protocol = |message: String| BackendError::Protocol {
            backend: backend.to_string(),
            message,
        };
        let ids = self.token_ids.ok_or_else(|| {
            protocol("response has no token_ids (vLLM older than 0.10.2?)".into())
        })?;
        let mut logprobs = Vec::new();
        if want_logprobs && !ids.is_empty() {
            let lp = self
                .logprobs
                .ok_or_else(|| protocol("logprobs were asked for but not returned".into()))?;
            if lp.token_logprobs.len() != ids.len() {
                return Err(protocol(format!(
                    "{} logprobs for {} token ids",
                    lp.token_logprobs.len(),
                    ids.len()
                )));
            }
            for (i, l) in lp.token_logprobs.iter().enumerate() {
                let mut top: Vec<(u32, f32)> = lp
                    .top_logprobs
                    .get(i)
                    .and_then(|m| m.as_ref())
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, v)| Some((parse_token_key(k)?, v.as_f64()? as f32)))
                            .collect()
                    })
                    .unwrap_or_default();
                top.sort_by(|a, b| b.1.total_cmp(&a.1));
                logprobs.push(TokenLogprob {
                    logprob: l.unwrap_or(f32::NEG_INFINITY),
                    top,
                });
            }
        }
        let mut events = Vec::with_capacity(2);
        if !ids.is_empty() {
            events.push(GenEvent::Tokens { ids, logprobs });
        }
        if let Some(fr) = finish_reason(self.finish_reason.as_deref()) {
            events.push(GenEvent::Done { finish_reason: fr });
        }
        Ok(events)
    }
}

#[async_trait::async_trait]
impl Backend for VllmBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "vllm"
    }

    async fn generate(&self, req: GenerateRequest) -> Result<GenStream, BackendError> {
        let body = self.request_body(&req);
        let want_logprobs = req.params.logprobs.is_some();
        let url = format!("{}/v1/completions", self.base);
        let send = self.client.post(&url).json(&body).send();
        let resp = tokio::time::timeout(self.first_token_timeout, send)
            .await
            .map_err(|_| super::timeout(&self.name, "no response before the first-token timeout"))?
            .map_err(|e| super::map_reqwest(&self.name, e))?;
        let resp = super::check_status(&self.name, resp).await?;
        let this = VllmShared {
            name: self.name.clone(),
            idle: self.idle_timeout,
        };
        if !req.stream {
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| super::map_reqwest(&self.name, e))?;
            let parsed: CompletionResponse = serde_json::from_slice(&bytes)
                .map_err(|e| self.protocol(format!("bad completion JSON: {e}")))?;
            let choice = parsed
                .choices
                .into_iter()
                .next()
                .ok_or_else(|| self.protocol("no choices in response"))?;
            let mut events = choice.into_events(&self.name, want_logprobs)?;
            if !events.iter().any(|e| matches!(e, GenEvent::Done { .. })) {
                events.push(GenEvent::Done {
                    finish_reason: FinishReason::Abort,
                });
            }
            return Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))));
        }
        let mut bytes = resp.bytes_stream();
        let stream = spawn_stream(move |tx| async move {
            let mut dec = SseDecoder::default();
            let mut done = false;
            loop {
                let chunk = match tokio::time::timeout(this.idle, bytes.next()).await {
                    Err(_) => {
                        let _ = tx
                            .send(Err(super::timeout(&this.name, "stream idle timeout")))
                            .await;
                        return;
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        let _ = tx.send(Err(super::map_reqwest(&this.name, e))).await;
                        return;
                    }
                    Ok(Some(Ok(c))) => c,
                };
                dec.push(&chunk);
                while let Some(data) = dec.next_event() {
                    if data.trim() == "[DONE]" {
                        done = true;
                        break;
                    }
                    let parsed: CompletionResponse = match serde_json::from_str(&data) {
                        Ok(p) => p,
                        Err(e) => {
                            let err = this.protocol(format!("bad stream chunk: {e}"));
                            let _ = tx.send(Err(err)).await;
                            return;
                        }
                    };
                    for choice in parsed.choices {
                        match choice.into_events(&this.name, want_logprobs) {
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
                if done {
                    break;
                }
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
        let req = match op {
            AdminOp::Sleep { level } => self
                .client
                .post(format!("{}/sleep", self.base))
                .query(&[("level", level.to_string())]),
            AdminOp::WakeUp => self.client.post(format!("{}/wake_up", self.base)),
            AdminOp::UpdateWeights { path } => self
                .client
                .post(format!("{}/collective_rpc", self.base))
                .json(&json!({"method": "reload_weights", "kwargs": {"weights_path": path}})),
        };
        let resp = req
            .send()
            .await
            .map_err(|e| super::map_reqwest(&self.name, e))?;
        let resp = super::check_status(&self.name, resp).await?;
        resp.text()
            .await
            .map_err(|e| super::map_reqwest(&self.name, e))
    }
}

/// The parts of the client a streaming task needs after `generate` returns.
struct VllmShared {
    name: String,
    idle: Duration,
}

impl VllmShared {
    fn protocol(&self, message: impl Into<String>) -> BackendError {
        BackendError::Protocol {
            backend: self.name.clone(),
            message: message.into(),
        }
    }
}

/// Runs `f` as a task feeding a channel; the returned stream ends when the
/// task ends, and dropping the stream makes the task's sends fail, which
/// stops it (and drops its upstream connection).
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
