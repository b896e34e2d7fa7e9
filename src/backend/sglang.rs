//! SGLang client, token in / token out, over SGLang's native API:
//! `POST {url}/generate` with `input_ids` and `sampling_params`; sampled ids
//! come back in `output_ids`, logprobs in `meta_info.output_token_logprobs`
//! (`[[logprob, token_id, text|null], ...]`) and `meta_info.output_top_logprobs`
//! (one such list per position), the finish in `meta_info.finish_reason.type`
//! (`stop` | `length` | `abort`, `null` while running).
//!
//! Requests always stream (`stream: true`); the events are read by the
//! shared [`pump`](super::pump) through [`SglangDecoder`]. An answer without
//! `output_token_logprobs` (or with a null logprob) gives tokens with
//! `logprob: None`, never an error.
//!
//! The replay check's teacher-forced pass ([`Backend::prompt_logprobs`]) is
//! one non-streamed `/generate` with `max_new_tokens: 0` (SGLang accepts 0),
//! `return_logprob`, `logprob_start_len: 0` and `top_logprobs_num: 1`; the
//! answer's `meta_info.input_token_logprobs` has one `[logprob, id, text]`
//! per input token (the first logprob null: SGLang prepends None and drops
//! the last position's, see its scheduler's `_process_input_token_logprobs`)
//! and `input_top_logprobs` the top-1 per position (null at position 0).
//!
//! A prompt with images sends them as `image_data` (a list of base64
//! `data:` URLs, all of this request's images in order: `io_struct.py`
//! `GenerateReqInput.image_data`, sglang 0.5.23 lines 194-200) beside
//! `input_ids` holding one `<|image_pad|>` per image: SGLang's multimodal
//! processor replaces the i-th pad with the i-th image's pad run
//! (`multimodal/processors/base_processor.py` lines 1818-1849), which is
//! the run tito's prompt ids hold.
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

use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

use super::http::HttpBackend;
use super::pump::EventDecoder;
use super::sglang_score::{input_logprobs, logprob_entry, ScoreAnswer};
use super::{
    AdminOp, Backend, BackendError, FinishReason, GenEvent, GenStream, GenerateRequest,
    PositionLogprob, ScoreRequest, SharedSampling, StructuredOutput, TokenLogprob, UpdateMode,
};
use crate::config::{BackendConfig, RouterConfig};

/// The body of one `/generate` request ([`SglangBackend::request_body`]).
#[derive(Serialize)]
pub struct SglangBody<'a> {
    input_ids: std::borrow::Cow<'a, [u32]>,
    /// The prompt's images as base64 `data:` URLs, in order; `input_ids`
    /// then holds one `<|image_pad|>` per image, which SGLang's multimodal
    /// processor expands to the image's pad count itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    image_data: Option<Vec<&'a str>>,
    /// The LoRA adapter by its name (`GenerateReqInput.lora_path` takes a
    /// loaded adapter's name: `--lora-paths name=path`, `/load_lora_adapter`).
    #[serde(skip_serializing_if = "Option::is_none")]
    lora_path: Option<&'a str>,
    sampling_params: SglangSampling<'a>,
    stream: bool,
    rid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    return_logprob: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs_num: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprob_start_len: Option<i32>,
    /// With images: SGLang echoes the prompt ids it expanded, checked
    /// against tito's.
    #[serde(skip_serializing_if = "Option::is_none")]
    return_prompt_token_ids: Option<bool>,
}

#[derive(Serialize)]
struct SglangSampling<'a> {
    max_new_tokens: u32,
    #[serde(flatten)]
    shared: SharedSampling<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampling_seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    json_schema: Option<String>,
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
    no_stop_trim: bool,
}

pub struct SglangBackend {
    http: HttpBackend,
    /// A begun update keeps generations paused in place (`retract`): its
    /// commit names the new weights before generation continues.
    keeping: std::sync::atomic::AtomicBool,
}

impl SglangBackend {
    pub fn new(cfg: &BackendConfig, router: &RouterConfig) -> anyhow::Result<Self> {
        Ok(SglangBackend {
            http: HttpBackend::new(cfg, router)?,
            keeping: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The JSON body sent to SGLang's `/generate` for one request.
    pub fn request_body<'a>(&self, req: &'a GenerateRequest) -> SglangBody<'a> {
        let p = &req.params;
        let (input_ids, image_data) = match &req.images {
            Some(inputs) => (
                inputs.collapsed(&req.prompt_ids).into(),
                Some(inputs.images.iter().map(|im| im.data_url()).collect()),
            ),
            None => (req.prompt_ids.as_slice().into(), None),
        };
        SglangBody {
            input_ids,
            image_data,
            lora_path: req.adapter.as_deref(),
            sampling_params: SglangSampling {
                max_new_tokens: p.max_tokens,
                shared: SharedSampling::of(p),
                sampling_seed: p.seed,
                // SGLang takes the schema as a JSON string.
                json_schema: p.structured.as_ref().map(|s| match s {
                    StructuredOutput::JsonObject => r#"{"type":"object"}"#.to_string(),
                    StructuredOutput::JsonSchema(s) => s.to_string(),
                }),
                // Token in, token out: keep every sampled token, trim nothing.
                skip_special_tokens: false,
                spaces_between_special_tokens: false,
                no_stop_trim: true,
            },
            stream: true,
            rid: &req.request_id,
            return_logprob: p.logprobs.map(|_| true),
            top_logprobs_num: p.logprobs,
            // Output tokens only: no prompt logprobs computed or sent.
            logprob_start_len: p.logprobs.map(|_| -1),
            return_prompt_token_ids: req.images.as_ref().map(|_| true),
        }
    }

    /// The body of a teacher-forced pass: the sequence as `input_ids`, no
    /// new token (`max_new_tokens: 0` is valid in SGLang), logprobs of every
    /// input token from position 0, and the top-1 alternative per position
    /// (the argmax). Not streamed.
    pub fn score_body(&self, req: &ScoreRequest) -> Json {
        let mut body = json!({
            "input_ids": &*req.ids,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": true,
            "logprob_start_len": 0,
            "top_logprobs_num": 1,
            "stream": false,
            "rid": req.request_id,
        });
        // An adapter's samples are scored with the adapter, as generated.
        if let (Some(a), Some(obj)) = (&req.adapter, body.as_object_mut()) {
            obj.insert("lora_path".into(), json!(&**a));
        }
        body
    }

    async fn post_admin(&self, path: &str, body: Json) -> Result<String, BackendError> {
        let text = self.http.post_admin(path, Some(&body)).await?;
        // `update_weights_from_disk` answers `{"success": false, ...}` on failure.
        if let Ok(v) = serde_json::from_str::<Json>(&text) {
            if v.get("success").and_then(Json::as_bool) == Some(false) {
                let message = v
                    .get("message")
                    .and_then(Json::as_str)
                    .unwrap_or("backend reported success: false")
                    .to_string();
                return Err(BackendError::Rejected {
                    backend: self.name().to_string(),
                    message,
                });
            }
        }
        Ok(text)
    }
}

impl SglangBackend {
    fn rejected(&self, message: impl Into<String>) -> BackendError {
        self.http.rejected(message)
    }

    /// Sleep is safe only on a server started with `--enable-memory-saver`
    /// (else releasing frees nothing) and `--enable-weights-cpu-backup`
    /// (else the weights' contents are thrown away on release and the
    /// server wakes with uninitialised weights, without a warning). Read
    /// from `GET /server_info` (SGLang 0.5.7+; `/get_server_info` before),
    /// whose top level holds the server's arguments.
    /// SGLang 0.5.20+ reports `meta_info.weight_versions` on a stream's
    /// last chunk (`sglang/srt/utils/weight_versions.py`, 0.5.23 lines
    /// 90-107): where a kept stream's new weights begin.
    async fn keep_check(&self) -> Result<String, BackendError> {
        let info = self
            .http
            .server_info(&["/server_info", "/get_server_info"])
            .await?;
        let version = info
            .as_ref()
            .and_then(|v| v.get("version"))
            .and_then(Json::as_str)
            .unwrap_or("");
        if super::vllm::at_least_patch(version, (0, 5, 20)) {
            Ok(format!(
                "SGLang {version} reports per-token weight versions"
            ))
        } else {
            Err(self.rejected(format!(
                "SGLang `{version}` is older than 0.5.20: it does not report where in a kept stream the new weights begin"
            )))
        }
    }

    async fn sleep_check(&self) -> Result<String, BackendError> {
        let Some(info) = self
            .http
            .server_info(&["/server_info", "/get_server_info"])
            .await?
        else {
            return Err(self.rejected(
                "no /server_info or /get_server_info: cannot tell whether sleeping is safe",
            ));
        };
        let flag = |name: &str| info.get(name).and_then(Json::as_bool);
        match (
            flag("enable_memory_saver"),
            flag("enable_weights_cpu_backup"),
        ) {
            (Some(true), Some(true)) => Ok("memory saver with a CPU copy of the weights".into()),
            (Some(false), _) => Err(self.rejected(
                "started without --enable-memory-saver: sleep would free no memory",
            )),
            (_, Some(false)) => Err(self.rejected(
                "started without --enable-weights-cpu-backup: sleep would throw the weights away and the server would wake with uninitialised weights",
            )),
            _ => Err(self.rejected(
                "GET /server_info does not say whether --enable-memory-saver and --enable-weights-cpu-backup are on",
            )),
        }
    }
}

fn protocol(backend: &str, message: impl Into<String>) -> BackendError {
    BackendError::Protocol {
        backend: backend.to_string(),
        message: message.into(),
    }
}

/// One `/generate` stream event.
#[derive(Deserialize)]
struct GenerateOut {
    #[serde(default)]
    output_ids: Option<Vec<u32>>,
    /// The prompt as SGLang built it (asked with `return_prompt_token_ids`).
    #[serde(default)]
    prompt_token_ids: Option<Vec<u32>>,
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
    prompt_tokens: Option<usize>,
    #[serde(default)]
    output_token_logprobs: Option<Vec<Json>>,
    #[serde(default)]
    output_top_logprobs: Option<Vec<Json>>,
    /// SGLang 0.5.20+, on the last chunk: `[{"version", "start", "end"}]`.
    #[serde(default)]
    weight_versions: Option<Vec<super::vllm::WireSpan>>,
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

/// Turns SGLang stream events (cumulative or incremental) into new tokens.
#[derive(Default)]
struct StreamState {
    emitted: Vec<u32>,
    /// `Some(true)`: the server sends the whole sequence so far; `Some(false)`:
    /// only new ids; `None`: not known yet.
    cumulative: Option<bool>,
    finished: bool,
    /// Prompt ids sent: `meta_info.prompt_tokens` must say the same, or the
    /// server cut the prompt (`--allow-auto-truncate`) and the recorded
    /// prompt is not the one the model saw.
    prompt_len: Option<usize>,
    /// With images, the prompt tito records, which the echoed
    /// `prompt_token_ids` are checked against once (SGLang expands the
    /// placeholders, so the count check above cannot apply).
    expected_prompt: Option<std::sync::Arc<Vec<u32>>>,
}

impl StreamState {
    /// A [`GenEvent::PromptDrift`] when the echoed prompt differs from the
    /// expected one (checked on the first echo only).
    fn check_prompt(&mut self, echoed: Option<Vec<u32>>) -> Option<GenEvent> {
        let echoed = echoed?;
        let expected = self.expected_prompt.take()?;
        super::prompt_drift(&expected, &echoed)
    }

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
        logprobs_k: Option<u32>,
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
        let finish = finish_reason(meta.finish_reason.as_ref());
        if let Some(e) = abnormal_end(backend, meta.finish_reason.as_ref()) {
            return Err(e);
        }
        let versions = meta.weight_versions.filter(|v| !v.is_empty()).map(|v| {
            GenEvent::Versions(
                v.into_iter()
                    .map(|s| super::ServerSpan {
                        version: s.version,
                        start: s.start,
                    })
                    .collect(),
            )
        });
        if finish == Some(FinishReason::Abort) {
            // SGLang's abort event repeats the last token (and counts all of
            // them): it adds nothing but the end.
            return Ok(versions
                .into_iter()
                .chain(self.finish(FinishReason::Abort))
                .collect());
        }
        let drift = self.check_prompt(out.prompt_token_ids);
        if let (Some(seen), Some(sent)) = (meta.prompt_tokens, self.prompt_len) {
            if seen != sent {
                return Err(protocol(
                    backend,
                    format!(
                        "the backend saw {seen} prompt tokens, tito sent {sent} (a server \
                         started with --allow-auto-truncate cuts long prompts)"
                    ),
                ));
            }
        }
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
        let logprobs = match logprobs_k {
            Some(k) if !new_ids.is_empty() => new_logprobs(
                meta.output_token_logprobs,
                meta.output_top_logprobs,
                &ids,
                skip,
                k,
            )
            .map_err(|m| protocol(backend, m))?,
            _ => Vec::new(),
        };
        self.emitted.extend_from_slice(&new_ids);
        // The running total, when sent, must be what was emitted: a stream
        // that lost a delta would otherwise be recorded with tokens missing.
        if let Some(c) = meta.completion_tokens.filter(|c| *c != self.emitted.len()) {
            return Err(protocol(
                backend,
                format!(
                    "completion_tokens is {c} but the stream carried {} token ids",
                    self.emitted.len()
                ),
            ));
        }
        let mut events = Vec::with_capacity(3);
        // The reports first: a choice may end on this chunk's tokens, and
        // the pump stops reading its stream then.
        events.extend(drift);
        if finish.is_some() {
            events.extend(versions);
        }
        if !new_ids.is_empty() {
            events.push(GenEvent::Tokens {
                ids: new_ids,
                logprobs,
            });
        }
        events.extend(finish.and_then(|fr| self.finish(fr)));
        Ok(events)
    }

    /// The one `Done` of a stream.
    fn finish(&mut self, finish_reason: FinishReason) -> Option<GenEvent> {
        (!std::mem::replace(&mut self.finished, true)).then_some(GenEvent::Done { finish_reason })
    }
}

/// A finish that is a failure, not an end: an abort SGLang gives a 4xx
/// status (a request it refused, e.g. too long) is the request's fault and
/// goes back to the client with SGLang's message; its NaN guard (`matched:
/// "NaN happened"`) replaced the sampled token with a stop token, so the last
/// id was never sampled and the call must not be recorded.
fn abnormal_end(backend: &str, finish: Option<&Json>) -> Option<BackendError> {
    let f = finish?.as_object()?;
    let kind = f.get("type").and_then(Json::as_str);
    let message = f.get("message").and_then(Json::as_str);
    let status = f.get("status_code").and_then(Json::as_u64);
    if kind == Some("abort") && status.is_some_and(|s| (400..500).contains(&s)) {
        return Some(BackendError::Rejected {
            backend: backend.to_string(),
            message: message.unwrap_or("request refused").to_string(),
        });
    }
    if kind == Some("stop") && f.get("matched").and_then(Json::as_str) == Some("NaN happened") {
        return Some(protocol(
            backend,
            "the backend's logits were NaN; it ended the sequence with a token it did not sample",
        ));
    }
    None
}

/// The `TokenLogprob`s of `ids[skip..]`, the part not emitted yet, with at
/// most `k` alternatives each. Without `output_token_logprobs` every token's
/// logprob is unknown (`None`). The lists may be whole (indexed by position
/// in the output) or already sliced to the new part, whatever `output_ids`
/// is; the token-id check catches any misreading.
fn new_logprobs(
    lps: Option<Vec<Json>>,
    tops: Option<Vec<Json>>,
    ids: &[u32],
    skip: usize,
    k: u32,
) -> Result<Vec<TokenLogprob>, String> {
    let new_ids = &ids[skip..];
    let Some(lps) = lps else {
        let unknown = TokenLogprob {
            logprob: None,
            top: Vec::new(),
        };
        return Ok(vec![unknown; new_ids.len()]);
    };
    // Whole or sliced, the new tokens' entries are the list's last ones
    // (SGLang before 2026-03 sent whole logprob lists with incremental ids).
    let Some(lp_skip) = lps.len().checked_sub(new_ids.len()) else {
        return Err(format!(
            "{} logprobs for {} new token ids",
            lps.len(),
            new_ids.len()
        ));
    };
    let tops = tops.unwrap_or_default();
    let top_skip = tops.len().checked_sub(new_ids.len());
    let keep = usize::try_from(k).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(new_ids.len());
    for (i, id) in new_ids.iter().enumerate() {
        let (lp_id, logprob) = lps
            .get(lp_skip + i)
            .and_then(logprob_entry)
            .ok_or("malformed output_token_logprobs entry")?;
        if lp_id != *id {
            return Err(format!(
                "logprob entry is for token {lp_id}, output has {id}"
            ));
        }
        let mut top: Vec<(u32, f32)> = top_skip
            .and_then(|s| tops.get(s + i))
            .and_then(Json::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(logprob_entry)
                    .filter_map(|(t, l)| Some((t, l?)))
                    .collect()
            })
            .unwrap_or_default();
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        top.truncate(keep);
        out.push(TokenLogprob { logprob, top });
    }
    Ok(out)
}

/// Turns SGLang `/generate` stream events into events; `logprobs` is the
/// request's `SamplingParams::logprobs`.
pub struct SglangDecoder {
    backend: String,
    logprobs: Option<u32>,
    state: StreamState,
}

impl SglangDecoder {
    /// `prompt_len`: the prompt ids sent, which the stream's
    /// `prompt_tokens` must repeat.
    pub fn new(backend: &str, logprobs: Option<u32>, prompt_len: usize) -> Self {
        SglangDecoder {
            backend: backend.to_string(),
            logprobs,
            state: StreamState {
                prompt_len: Some(prompt_len),
                ..StreamState::default()
            },
        }
    }

    /// For a prompt with images: SGLang expands each image's one pad, so
    /// its echoed prompt is checked against `prompt` instead of its count.
    pub fn with_images(
        backend: &str,
        logprobs: Option<u32>,
        prompt: std::sync::Arc<Vec<u32>>,
    ) -> Self {
        SglangDecoder {
            backend: backend.to_string(),
            logprobs,
            state: StreamState {
                expected_prompt: Some(prompt),
                ..StreamState::default()
            },
        }
    }
}

impl EventDecoder for SglangDecoder {
    fn on_data(&mut self, data: &str) -> Result<Vec<GenEvent>, BackendError> {
        let out: GenerateOut = serde_json::from_str(data)
            .map_err(|e| protocol(&self.backend, format!("bad stream event: {e}")))?;
        self.state.on_event(&self.backend, out, self.logprobs)
    }
}

#[async_trait::async_trait]
impl Backend for SglangBackend {
    fn name(&self) -> &str {
        self.http.name()
    }

    fn kind(&self) -> &'static str {
        "sglang"
    }

    async fn generate(&self, req: GenerateRequest) -> Result<GenStream, BackendError> {
        let body = self.request_body(&req);
        let decoder = match req.images {
            Some(_) => {
                SglangDecoder::with_images(self.name(), req.params.logprobs, req.prompt_ids.clone())
            }
            None => SglangDecoder::new(self.name(), req.params.logprobs, req.prompt_ids.len()),
        };
        self.http.generate("/generate", &body, decoder).await
    }

    async fn prompt_logprobs(
        &self,
        req: ScoreRequest,
    ) -> Result<Vec<PositionLogprob>, BackendError> {
        let answer: ScoreAnswer = self
            .http
            .call_json("/generate", &self.score_body(&req))
            .await?;
        input_logprobs(answer, &req.ids).map_err(|m| protocol(self.name(), m))
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http.health().await
    }

    async fn admin(&self, op: &AdminOp) -> Result<String, BackendError> {
        match op {
            // `LoadLoRAAdapterReqInput` / `UnloadLoRAAdapterReqInput`
            // (`io_struct.py` lines 2516-2545, sglang 0.5.23), served at
            // `/load_lora_adapter` and `/unload_lora_adapter`
            // (`http_server.py` lines 1652-1683). A name is loaded once:
            // replacing its weights is an unload, then a load.
            AdminOp::LoadAdapter {
                name,
                path,
                replace,
            } => {
                if *replace {
                    self.post_admin("/unload_lora_adapter", json!({ "lora_name": name }))
                        .await?;
                }
                let body = json!({"lora_name": name, "lora_path": path});
                self.post_admin("/load_lora_adapter", body).await
            }
            AdminOp::UnloadAdapter { name } => {
                self.post_admin("/unload_lora_adapter", json!({ "lora_name": name }))
                    .await
            }
            AdminOp::SleepCheck => self.sleep_check().await,
            AdminOp::KeepCheck => self.keep_check().await,
            // SGLang has one sleep depth: release weights and KV cache.
            AdminOp::Sleep { .. } => {
                self.post_admin("/release_memory_occupation", json!({}))
                    .await
            }
            AdminOp::WakeUp => {
                self.post_admin("/resume_memory_occupation", json!({}))
                    .await
            }
            // Flushes the radix cache itself (`flush_cache` defaults to true).
            AdminOp::UpdateWeights {
                path,
                version,
                mode: UpdateMode::Wait,
            } => {
                let body = json!({ "model_path": path, "weight_version": version });
                self.post_admin("/update_weights_from_disk", body).await
            }
            // Stops every request in flight (each ends with an `abort`
            // finish), updates while paused, and continues whatever the
            // update did: generation must not stay paused.
            AdminOp::UpdateWeights {
                path,
                version,
                mode: UpdateMode::Abort,
            } => {
                self.post_admin("/pause_generation", json!({"mode": "abort"}))
                    .await?;
                let body = json!({ "model_path": path, "weight_version": version });
                let loaded = self.post_admin("/update_weights_from_disk", body).await;
                let continued = self.post_admin("/continue_generation", json!({})).await;
                let loaded = loaded?;
                continued?;
                Ok(loaded)
            }
            // In place (`retract`: running requests go back to the queue
            // and their KV is recomputed on the new weights when they
            // continue; `in_place` would keep the old weights' KV).
            AdminOp::UpdateWeights {
                path,
                version,
                mode: UpdateMode::Keep,
            } => {
                self.post_admin("/pause_generation", json!({"mode": "retract"}))
                    .await?;
                let body = json!({ "model_path": path, "weight_version": version });
                let loaded = self.post_admin("/update_weights_from_disk", body).await;
                let continued = self.post_admin("/continue_generation", json!({})).await;
                let loaded = loaded?;
                continued?;
                Ok(loaded)
            }
            // The trainer then pushes with `/init_weights_update_group` and
            // `/update_weights_from_distributed`, which flush the cache.
            // `abort` after the gateway's drain (`wait`): nothing is left
            // to stop.
            AdminOp::BeginWeightUpdate { mode } => {
                let keep = *mode == UpdateMode::Keep;
                let how = if keep { "retract" } else { "abort" };
                let text = self
                    .post_admin("/pause_generation", json!({ "mode": how }))
                    .await?;
                self.keeping
                    .store(keep, std::sync::atomic::Ordering::SeqCst);
                Ok(text)
            }
            AdminOp::FinishWeightUpdate { version } => {
                if self
                    .keeping
                    .swap(false, std::sync::atomic::Ordering::SeqCst)
                {
                    // Kept streams name the new weights by this label.
                    let body = json!({ "new_version": version, "abort_all_requests": false });
                    self.post_admin("/update_weight_version", body).await?;
                }
                self.post_admin("/continue_generation", json!({})).await
            }
            AdminOp::AbortWeightUpdate => {
                self.keeping
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                self.post_admin("/continue_generation", json!({})).await
            }
        }
    }
}

#[cfg(test)]
#[path = "sglang_tests.rs"]
mod tests;
