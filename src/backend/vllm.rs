//! vLLM client, token in / token out: `POST {url}/v1/completions` with
//! `prompt` = token ids, `return_token_ids: true` and always `stream: true`;
//! the chunks are read by the shared [`pump`](super::pump) through
//! [`VllmDecoder`]. Logprobs are asked with `return_tokens_as_token_ids` so
//! alternatives come back keyed by id, never by ambiguous token text. A
//! backend with `vllm_api = "generate"` sends generations to
//! `/inference/v1/generate` instead, the route that takes images
//! ([`vllm_generate`](super::vllm_generate)).
//!
//! A chunk is `{"choices": [{"token_ids": [..], "logprobs": {"token_logprobs":
//! [..], "top_logprobs": [{"token_id:ID": lp, ..}, ..]} | null,
//! "finish_reason": null | "stop" | "length" | ..}]}`; a failure inside the
//! stream is `{"error": {"message", "code"}}` (older vLLM: `{"object":
//! "error", "message", "code"}`). Null logprob fields mean "no number": the
//! token gets `logprob: None` and no alternatives, never an error. vLLM
//! writes -inf as -9999.0 (`max(logprob, -9999.0)` in
//! `_create_completion_logprobs`, `vllm/entrypoints/openai/completion/serving.py`):
//! that value, and anything below it, is read back as -inf, never recorded
//! as a real logprob.
//!
//! The replay check's teacher-forced pass ([`Backend::prompt_logprobs`]) is
//! one non-streamed request with `prompt_logprobs: 1` and `max_tokens: 1`;
//! vLLM answers `choices[0].prompt_logprobs` = `[null, {"<id>": {"logprob",
//! "rank", "decoded_token"}}, ...]` (dict keys are the token ids as strings,
//! -inf written as -9999.0), checked against vLLM's
//! `CompletionResponseChoice` and `clamp_prompt_logprobs`. Each position
//! holds the own token and the most likely one. vLLM's rank counts the
//! tokens at least as likely (`(x >= values).sum(-1)`,
//! `batched_count_greater_than` in `vllm/v1/sample/ops/logprobs.py`), so a
//! token tied with another for the top has rank 2: the own token is read as
//! the argmax when its logprob is not below the top one's, as on SGLang.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

use super::http::HttpBackend;
use super::pump::EventDecoder;
use super::vllm_generate;
use super::{
    AdminOp, Backend, BackendError, FinishReason, GenEvent, GenStream, GenerateRequest,
    PositionLogprob, ScoreRequest, SharedSampling, StructuredOutput, TokenLogprob, UpdateMode,
};
use crate::config::{BackendConfig, RouterConfig, VllmApi};

/// The body of one `/v1/completions` request ([`VllmBackend::request_body`]).
#[derive(Serialize)]
pub struct VllmBody<'a> {
    prompt: &'a [u32],
    max_tokens: u32,
    n: u32,
    stream: bool,
    return_token_ids: bool,
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
    request_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    #[serde(flatten)]
    sampling: SharedSampling<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    structured_outputs: Option<VllmStructured<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    return_tokens_as_token_ids: Option<bool>,
    /// vLLM 0.33+: the last chunk says which weights sampled which tokens.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    return_weight_versions: bool,
}

/// vLLM's `structured_outputs`: `{"json_object": true}` or `{"json": SCHEMA}`.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum VllmStructured<'a> {
    JsonObject(bool),
    Json(&'a Json),
}

pub struct VllmBackend {
    http: HttpBackend,
    model: Option<String>,
    /// The route generations go to (`[[backends]] vllm_api`).
    api: VllmApi,
    /// What `GET /version` answered: `Some(true)` on vLLM 0.33+, which
    /// reports per-token weight versions (asked on every request from
    /// then on); `None` until it answered.
    reports_versions: std::sync::OnceLock<bool>,
}

impl VllmBackend {
    pub fn new(cfg: &BackendConfig, router: &RouterConfig) -> anyhow::Result<Self> {
        Ok(VllmBackend {
            http: HttpBackend::new(cfg, router)?,
            model: (!cfg.model.is_empty()).then(|| cfg.model.clone()),
            api: cfg.vllm_api,
            reports_versions: std::sync::OnceLock::new(),
        })
    }

    /// Whether the server reports per-token weight versions, asking its
    /// `GET /version` once (a server without the route does not).
    async fn reports_versions(&self) -> Result<bool, BackendError> {
        if let Some(known) = self.reports_versions.get() {
            return Ok(*known);
        }
        let info = self.http.server_info(&["/version"]).await?;
        let version = info
            .as_ref()
            .and_then(|v| v.get("version"))
            .and_then(Json::as_str)
            .unwrap_or("");
        let reports = at_least(version, (0, 33));
        Ok(*self.reports_versions.get_or_init(|| reports))
    }

    /// The JSON body sent to vLLM for one request.
    pub fn request_body<'a>(&'a self, req: &'a GenerateRequest) -> VllmBody<'a> {
        let p = &req.params;
        VllmBody {
            prompt: &req.prompt_ids,
            max_tokens: p.max_tokens,
            n: 1,
            stream: true,
            return_token_ids: true,
            return_weight_versions: self.reports_versions.get() == Some(&true),
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
            request_id: &req.request_id,
            // An adapter is asked by its name as the model (vLLM's LoRA
            // serving: `--lora-modules name=path`, `/v1/load_lora_adapter`).
            model: req.adapter.as_deref().or(self.model.as_deref()),
            sampling: SharedSampling::of(p),
            seed: p.seed,
            structured_outputs: p.structured.as_ref().map(|s| match s {
                StructuredOutput::JsonObject => VllmStructured::JsonObject(true),
                StructuredOutput::JsonSchema(s) => VllmStructured::Json(s),
            }),
            logprobs: p.logprobs,
            return_tokens_as_token_ids: p.logprobs.map(|_| true),
        }
    }

    /// The body of a teacher-forced pass: the sequence as the prompt, one
    /// token generated (vLLM wants at least one), and `prompt_logprobs: 1`,
    /// which makes vLLM return every prompt token's own logprob and rank
    /// and the most likely token's.
    /// Not streamed: vLLM refuses prompt logprobs on a stream.
    pub fn score_body(&self, req: &ScoreRequest) -> Json {
        let mut body = json!({
            "prompt": &*req.ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "n": 1,
            "stream": false,
            "prompt_logprobs": 1,
            "request_id": req.request_id,
        });
        // An adapter's samples are scored with the adapter, named as the
        // model as on generation.
        let model = req.adapter.as_deref().or(self.model.as_deref());
        if let (Some(m), Some(obj)) = (model, body.as_object_mut()) {
            obj.insert("model".into(), json!(m));
        }
        body
    }
}

/// A non-streamed completion carrying `prompt_logprobs`.
#[derive(Deserialize)]
struct ScoreAnswer {
    choices: Vec<ScoreChoice>,
}

#[derive(Deserialize)]
struct ScoreChoice {
    /// `[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`.
    #[serde(default)]
    prompt_logprobs: Option<Vec<Option<PromptPosition>>>,
}

/// One position's map read straight into `(token id, entry)` pairs (keys
/// `"ID"` or `"token_id:ID"`; other keys are skipped), without building a
/// map per position.
struct PromptPosition(Vec<(u32, PromptEntry)>);

impl<'de> Deserialize<'de> for PromptPosition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = PromptPosition;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of token id to {logprob, rank, decoded_token}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<PromptPosition, A::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(1));
                while let Some(key) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                    let entry: PromptEntry = m.next_value()?;
                    let id = key.parse().ok().or_else(|| parse_token_key(&key));
                    if let Some(id) = id {
                        out.push((id, entry));
                    }
                }
                Ok(PromptPosition(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

#[derive(Deserialize)]
struct PromptEntry {
    #[serde(default)]
    logprob: Option<f64>,
    /// 1 for the most likely token.
    #[serde(default)]
    rank: Option<u32>,
}

/// Reads vLLM's `prompt_logprobs` for `ids`: the entry of each position's
/// own token (keyed by its id, as a string; `token_id:ID` is accepted too).
fn prompt_logprobs(answer: ScoreAnswer, ids: &[u32]) -> Result<Vec<PositionLogprob>, String> {
    let choice = answer
        .choices
        .into_iter()
        .next()
        .ok_or("answer has no choices")?;
    let list = choice
        .prompt_logprobs
        .ok_or("answer has no prompt_logprobs (does this server support them?)")?;
    if list.len() != ids.len() {
        return Err(format!(
            "{} prompt_logprobs entries for {} prompt tokens",
            list.len(),
            ids.len()
        ));
    }
    let mut out = Vec::with_capacity(ids.len());
    for (i, (entry, &id)) in list.into_iter().zip(ids).enumerate() {
        let Some(position) = entry.filter(|_| i > 0) else {
            out.push(PositionLogprob {
                logprob: None,
                argmax: None,
            });
            continue;
        };
        // The most likely other token's logprob, when vLLM listed one.
        let other = position
            .0
            .iter()
            .filter(|(t, _)| *t != id)
            .filter_map(|(_, e)| e.logprob)
            .map(from_vllm)
            .max_by(f32::total_cmp);
        let own = position
            .0
            .into_iter()
            .find_map(|(t, e)| (t == id).then_some(e))
            .ok_or_else(|| format!("prompt_logprobs[{i}] has no entry for token {id}"))?;
        let logprob = own.logprob.map(from_vllm);
        let argmax = match (logprob, other, own.rank) {
            (Some(lp), Some(other), _) => Some(lp >= other),
            (_, _, rank) => rank.map(|r| r == 1),
        };
        out.push(PositionLogprob { logprob, argmax });
    }
    Ok(out)
}

/// One run of vLLM's `weight_versions` (`vllm/outputs.py`
/// `WeightVersionSpan`, 0.33.0 lines 50-55): output tokens `[start, end)`.
#[derive(Deserialize)]
pub(crate) struct WireSpan {
    pub(crate) version: String,
    pub(crate) start: u32,
}

/// Whether `version` ("0.33.0", "0.33.1rc1+cu128", "v0.5.20") is at least
/// `min` (major, minor).
pub(crate) fn at_least(version: &str, min: (u32, u32)) -> bool {
    let mut parts = version.trim_start_matches('v').split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= min,
        _ => false,
    }
}

/// Whether `version` is at least `min` (major, minor, patch).
pub(crate) fn at_least_patch(version: &str, min: (u32, u32, u32)) -> bool {
    let nums: Vec<u32> = version
        .trim_start_matches('v')
        .split('.')
        .map_while(|p| {
            p.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse::<u32>()
                .ok()
        })
        .collect();
    match nums[..] {
        [a, b, c, ..] => (a, b, c) >= min,
        [a, b] => (a, b, 0) >= min,
        _ => false,
    }
}

/// One streamed completion chunk, or an in-stream error.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    /// `{"message", "type", "code"}` (vLLM's `ErrorResponse`).
    #[serde(default)]
    error: Option<Json>,
    /// `"error"` in older vLLM's flat error shape.
    #[serde(default)]
    object: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    code: Option<Json>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    /// vLLM 0.33+ with `return_weight_versions`, on the last chunk:
    /// `[{"version", "start", "end"}]` over the output tokens.
    #[serde(default)]
    weight_versions: Option<Vec<WireSpan>>,
    #[serde(default)]
    logprobs: Option<CompletionLogprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct CompletionLogprobs {
    #[serde(default)]
    token_logprobs: Option<Vec<Option<f32>>>,
    #[serde(default)]
    top_logprobs: Option<Vec<Option<TopLogprobs>>>,
}

/// One position's `{"token_id:ID": logprob, ...}` read straight into
/// `(id, logprob)` pairs (no JSON map built per token); entries whose key is
/// not a token id or whose value is not a number are skipped.
struct TopLogprobs(Vec<(u32, f32)>);

impl<'de> Deserialize<'de> for TopLogprobs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = TopLogprobs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of token_id:ID to logprob")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<TopLogprobs, A::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(1));
                while let Some(key) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                    let value: Json = m.next_value()?;
                    if let (Some(id), Some(v)) = (parse_token_key(&key), value.as_f64()) {
                        out.push((id, from_vllm(v)));
                    }
                }
                Ok(TopLogprobs(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

pub(super) fn finish_reason(s: Option<&str>) -> Option<FinishReason> {
    match s? {
        "stop" => Some(FinishReason::Stop),
        "length" => Some(FinishReason::Length),
        _ => Some(FinishReason::Abort),
    }
}

/// A logprob as vLLM wrote it: -9999.0 (or below) is its -inf.
pub(super) fn from_vllm(v: impl Into<f64>) -> f32 {
    let v = v.into();
    if v <= -9999.0 {
        f32::NEG_INFINITY
    } else {
        v as f32
    }
}

/// `"token_id:123"` → 123 (vLLM's `return_tokens_as_token_ids` form).
fn parse_token_key(key: &str) -> Option<u32> {
    key.strip_prefix("token_id:")?.parse().ok()
}

/// Turns vLLM completion chunks into events. `logprobs` is the request's
/// `SamplingParams::logprobs`: when `Some(k)`, every token gets one
/// `TokenLogprob` with at most `k` alternatives.
pub struct VllmDecoder {
    backend: String,
    logprobs: Option<u32>,
}

impl VllmDecoder {
    pub fn new(backend: &str, logprobs: Option<u32>) -> Self {
        VllmDecoder {
            backend: backend.to_string(),
            logprobs,
        }
    }

    fn protocol(&self, message: impl Into<String>) -> BackendError {
        BackendError::Protocol {
            backend: self.backend.clone(),
            message: message.into(),
        }
    }

    /// The error a chunk reports, if it is an error chunk.
    fn chunk_error(&self, chunk: &Chunk) -> Option<BackendError> {
        let (message, code) = match (&chunk.error, chunk.object.as_deref()) {
            (Some(e), _) => (
                e.get("message").and_then(Json::as_str).map(str::to_string),
                e.get("code"),
            ),
            (None, Some("error")) => (chunk.message.clone(), chunk.code.as_ref()),
            _ => return None,
        };
        let message = message.unwrap_or_else(|| "error inside the stream".into());
        let code = code
            .and_then(Json::as_u64)
            .and_then(|c| u16::try_from(c).ok());
        Some(match code {
            Some(c) if c >= 400 => super::status_error(&self.backend, c, message),
            _ => self.protocol(message),
        })
    }

    fn choice_events(&self, choice: Choice) -> Result<Vec<GenEvent>, BackendError> {
        let ids = choice
            .token_ids
            .ok_or_else(|| self.protocol("chunk has no token_ids (vLLM older than 0.10.2?)"))?;
        let mut events = Vec::with_capacity(2);
        // The report first: a choice may end on this chunk's tokens, and
        // the pump stops reading its stream then.
        if let Some(spans) = choice.weight_versions.filter(|s| !s.is_empty()) {
            let spans = spans
                .into_iter()
                .map(|s| super::ServerSpan {
                    version: s.version,
                    start: s.start,
                })
                .collect();
            events.push(GenEvent::Versions(spans));
        }
        if !ids.is_empty() {
            let logprobs = match self.logprobs {
                Some(k) => {
                    token_logprobs(choice.logprobs, ids.len(), k).map_err(|m| self.protocol(m))?
                }
                None => Vec::new(),
            };
            events.push(GenEvent::Tokens { ids, logprobs });
        }
        if let Some(fr) = finish_reason(choice.finish_reason.as_deref()) {
            events.push(GenEvent::Done { finish_reason: fr });
        }
        Ok(events)
    }
}

/// One `TokenLogprob` per token, `n` in all. Missing or null numbers stay
/// `None` with no alternatives; alternatives are sorted, at most `k`.
fn token_logprobs(
    lp: Option<CompletionLogprobs>,
    n: usize,
    k: u32,
) -> Result<Vec<TokenLogprob>, String> {
    let unknown = TokenLogprob {
        logprob: None,
        top: Vec::new(),
    };
    let Some(lp) = lp else {
        return Ok(vec![unknown; n]);
    };
    let numbers = lp.token_logprobs.unwrap_or_else(|| vec![None; n]);
    if numbers.len() != n {
        return Err(format!("{} logprobs for {n} token ids", numbers.len()));
    }
    let mut tops = lp.top_logprobs.unwrap_or_default();
    let keep = usize::try_from(k).unwrap_or(usize::MAX);
    Ok(numbers
        .into_iter()
        .enumerate()
        .map(|(i, logprob)| {
            let mut top: Vec<(u32, f32)> = tops
                .get_mut(i)
                .and_then(Option::take)
                .map(|m| m.0)
                .unwrap_or_default();
            // vLLM lists the sampled token besides the top k: keep the top k.
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            top.truncate(keep);
            TokenLogprob {
                logprob: logprob.map(from_vllm),
                top,
            }
        })
        .collect())
}

impl EventDecoder for VllmDecoder {
    fn on_data(&mut self, data: &str) -> Result<Vec<GenEvent>, BackendError> {
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| self.protocol(format!("bad stream chunk: {e}")))?;
        if let Some(e) = self.chunk_error(&chunk) {
            return Err(e);
        }
        let choices = chunk
            .choices
            .ok_or_else(|| self.protocol("chunk has no choices"))?;
        let mut events = Vec::new();
        for choice in choices {
            events.extend(self.choice_events(choice)?);
        }
        Ok(events)
    }
}

#[async_trait::async_trait]
impl Backend for VllmBackend {
    fn name(&self) -> &str {
        self.http.name()
    }

    fn kind(&self) -> &'static str {
        "vllm"
    }

    async fn generate(&self, req: GenerateRequest) -> Result<GenStream, BackendError> {
        if self.api == VllmApi::Generate {
            let body = vllm_generate::body(&req, self.model.as_deref());
            let decoder = vllm_generate::GenerateDecoder::new(self.name(), &req);
            return self
                .http
                .generate(vllm_generate::PATH, &body, decoder)
                .await;
        }
        if req.images.is_some() {
            // /v1/completions takes token ids but no multimodal data.
            return Err(BackendError::Rejected {
                backend: self.name().to_string(),
                message: "vLLM's /v1/completions takes no images with token ids: set \
                          vllm_api = \"generate\" on this backend (vllm serve --enable-scale-out)"
                    .into(),
            });
        }
        let body = self.request_body(&req);
        let decoder = VllmDecoder::new(self.name(), req.params.logprobs);
        self.http.generate("/v1/completions", &body, decoder).await
    }

    async fn prompt_logprobs(
        &self,
        req: ScoreRequest,
    ) -> Result<Vec<PositionLogprob>, BackendError> {
        let answer: ScoreAnswer = self
            .http
            .call_json("/v1/completions", &self.score_body(&req))
            .await?;
        prompt_logprobs(answer, &req.ids).map_err(|message| BackendError::Protocol {
            backend: self.name().to_string(),
            message,
        })
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http.health().await?;
        if self.reports_versions.get().is_none() {
            // Learnt once, before the first calls where possible: streams
            // started before it cannot report where an update kept them.
            if let Err(e) = self.reports_versions().await {
                tracing::debug!(backend = %self.name(), error = %e, "GET /version failed");
            }
        }
        Ok(())
    }

    /// vLLM's dev-mode endpoints (`VLLM_SERVER_DEV_MODE=1`), as in vLLM
    /// 0.33 (reload from a path: 0.16+; start/finish of a trainer-driven
    /// transfer: 0.25+, with `--weight-transfer-config`).
    async fn admin(&self, op: &AdminOp) -> Result<String, BackendError> {
        match op {
            // vLLM's runtime LoRA routes (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`):
            // `LoadLoRAAdapterRequest` / `UnloadLoRAAdapterRequest`,
            // `vllm/entrypoints/serve/lora/protocol.py` lines 7-16.
            AdminOp::LoadAdapter {
                name,
                path,
                replace,
            } => {
                let body = json!({"lora_name": name, "lora_path": path, "load_inplace": replace});
                self.post_admin("/v1/load_lora_adapter", Some(body)).await
            }
            AdminOp::UnloadAdapter { name } => {
                let body = json!({ "lora_name": name });
                self.post_admin("/v1/unload_lora_adapter", Some(body))
                    .await
            }
            AdminOp::SleepCheck => self.sleep_check().await,
            AdminOp::KeepCheck => match self.reports_versions().await? {
                true => Ok("reports per-token weight versions (vLLM 0.33+)".into()),
                false => Err(self.rejected(
                    "GET /version is not vLLM 0.33 or later: the server does not report where in a kept stream the new weights begin",
                )),
            },
            AdminOp::Sleep { level } => {
                self.post_admin(&format!("/sleep?level={level}"), None)
                    .await
            }
            AdminOp::WakeUp => self.post_admin("/wake_up", None).await,
            AdminOp::UpdateWeights {
                path,
                mode: UpdateMode::Wait,
                ..
            } => self.reload(path).await,
            AdminOp::UpdateWeights {
                path,
                version,
                mode: UpdateMode::Keep,
            } => {
                // Generations stay where they are; the reset preempts them
                // (their KV is recomputed on the new weights) and the new
                // label is what their last chunk's `weight_versions` names.
                self.post_admin("/pause?mode=keep", None).await?;
                let loaded = match self.reload(path).await {
                    Ok(text) => {
                        let body = json!({ "new_version": version });
                        self.post_admin("/update_weight_version", Some(body))
                            .await
                            .map(|_| text)
                    }
                    Err(e) => Err(e),
                };
                let resumed = self.post_admin("/resume", None).await;
                let loaded = loaded?;
                resumed?;
                Ok(loaded)
            }
            AdminOp::UpdateWeights {
                path,
                mode: UpdateMode::Abort,
                ..
            } => {
                // Stops every request in flight (each ends with
                // `finish_reason: "abort"`), reloads, and resumes whatever
                // the reload did: generation must not stay paused.
                self.post_admin("/pause?mode=abort", None).await?;
                let loaded = self.reload(path).await;
                let resumed = self.post_admin("/resume", None).await;
                let loaded = loaded?;
                resumed?;
                Ok(loaded)
            }
            AdminOp::BeginWeightUpdate { mode } => {
                // `wait` after the gateway drained: nothing left to wait
                // for; `abort` stops what runs.
                self.post_admin(&format!("/pause?mode={}", mode.as_str()), None)
                    .await?;
                match self.post_admin("/start_weight_update", None).await {
                    Ok(text) => Ok(text),
                    Err(e) => {
                        // Not started: generation must not stay paused.
                        if let Err(r) = self.post_admin("/resume", None).await {
                            tracing::error!(backend = %self.name(), error = %r,
                                "could not resume after a failed start of a weight update");
                        }
                        Err(e)
                    }
                }
            }
            AdminOp::FinishWeightUpdate { version } => {
                let body = json!({ "weight_version": version });
                self.post_admin("/finish_weight_update", Some(body)).await?;
                // Explicitly, not through `/pause`'s deprecated
                // `clear_cache` default: nothing cached under the old
                // weights survives into the resumed generation.
                self.reset_prefix_cache("weights updated").await?;
                self.post_admin("/resume", None).await
            }
            AdminOp::AbortWeightUpdate => {
                // Ends a started update, if this backend started one.
                if let Err(e) = self
                    .post_admin("/finish_weight_update", Some(json!({})))
                    .await
                {
                    tracing::debug!(backend = %self.name(), error = %e,
                        "no weight update to finish while aborting");
                }
                self.post_admin("/resume", None).await
            }
        }
    }
}

impl VllmBackend {
    /// Reloads the weights from `path` (`collective_rpc reload_weights`)
    /// and drops the prefixes cached with the old ones: the reload keeps
    /// them, and later prompts would reuse them.
    async fn reload(&self, path: &str) -> Result<String, BackendError> {
        let body = json!({"method": "reload_weights", "kwargs": {"weights_path": path}});
        let loaded = self.post_admin("/collective_rpc", Some(body)).await?;
        self.reset_prefix_cache("weights reloaded").await?;
        Ok(loaded)
    }

    /// POSTs to an admin endpoint (query in `path`); the answer's text.
    async fn post_admin(&self, path: &str, body: Option<Json>) -> Result<String, BackendError> {
        self.http.post_admin(path, body.as_ref()).await
    }

    fn rejected(&self, message: impl Into<String>) -> BackendError {
        self.http.rejected(message)
    }

    /// Drops every cached prefix, running requests' included
    /// (`reset_running_requests=true`: vLLM otherwise skips the reset while
    /// any block is in use). vLLM 0.26+ confirms with `{"success": true}`;
    /// older ones answer an empty 200, taken as done because every call was
    /// drained or paused first. `{"success": false}` fails the operation.
    async fn reset_prefix_cache(&self, done: &str) -> Result<(), BackendError> {
        let reset = self
            .post_admin("/reset_prefix_cache?reset_running_requests=true", None)
            .await?;
        let success = serde_json::from_str::<Json>(&reset)
            .ok()
            .and_then(|v| v.get("success").and_then(Json::as_bool));
        if success == Some(false) {
            return Err(self.rejected(format!(
                "{done}, but the prefix cache could not be reset: prefixes cached under the old weights would be reused"
            )));
        }
        Ok(())
    }

    /// Sleep is safe only on a server started with `--enable-sleep-mode`
    /// (its weights then go to host memory at level 1 and come back at
    /// wake-up); without it `/sleep` frees nothing. Read from
    /// `GET /server_info?config_format=json` (`vllm_config.model_config.
    /// enable_sleep_mode`), which, like `/sleep`, needs
    /// `VLLM_SERVER_DEV_MODE=1`.
    async fn sleep_check(&self) -> Result<String, BackendError> {
        let Some(info) = self
            .http
            .server_info(&["/server_info?config_format=json"])
            .await?
        else {
            return Err(self.rejected(
                "no /server_info: the server was not started with VLLM_SERVER_DEV_MODE=1, which sleep needs",
            ));
        };
        match info
            .pointer("/vllm_config/model_config/enable_sleep_mode")
            .and_then(Json::as_bool)
        {
            Some(true) => Ok("sleep mode enabled".into()),
            Some(false) => {
                Err(self
                    .rejected("started without --enable-sleep-mode: sleep would free no memory"))
            }
            None => {
                Err(self
                    .rejected("GET /server_info does not say whether --enable-sleep-mode is on"))
            }
        }
    }
}

#[cfg(test)]
#[path = "vllm_tests.rs"]
mod tests;
