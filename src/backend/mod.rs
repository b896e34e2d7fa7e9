//! Inference backends: one small trait, one file per implementation.
//!
//! A backend generates *one* sequence from prompt token ids and streams back
//! the sampled token ids with their logprobs. It never sees text on this path
//! (token in, token out). Requests for `n > 1` are fanned out by the API layer.
//!
//! The HTTP clients ([`vllm`], [`sglang`]) share one client ([`http`]: a
//! pooled reqwest client for http:// and https://, health, admin and
//! one-shot calls), always ask their backend to stream and share one
//! reader, [`pump`]: SSE framing ([`sse`]), the first-token and
//! idle timeouts, `[DONE]`, and cancellation when the stream is dropped. Each
//! supplies only how one `data:` payload becomes [`GenEvent`]s.
//!
//! Owns: wire formats of vLLM / SGLang / the bundled engine. Must not: render
//! templates, decode text for clients, or know about trajectories.

pub mod http;
pub mod pump;
pub mod sglang;
mod sglang_score;
pub mod sse;
pub mod vllm;
mod vllm_generate;

use std::pin::Pin;
use std::sync::Arc;

use axum::http::StatusCode;
use futures::Stream;
use serde::Serialize;

use crate::error::ApiError;

/// Sampling parameters, already validated by the API layer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SamplingParams {
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Stop strings. Backends may stop on them natively; the gateway also
    /// checks decoded text, so a backend that ignores them stays correct.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (EOS ids are added by the gateway).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// `Some(k)`: return the sampled token's logprob plus the top `k`
    /// alternatives (`k` may be 0: the sampled token only). `None`: no
    /// logprobs needed. A backend that answers without numbers yields
    /// `TokenLogprob { logprob: None, top: [] }` per token, not an error.
    pub logprobs: Option<u32>,
    /// Constrain the output (OpenAI's `response_format`), with each
    /// backend's structured-output support.
    pub structured: Option<StructuredOutput>,
}

/// An output constraint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum StructuredOutput {
    /// Any JSON object.
    JsonObject,
    /// JSON valid under this JSON Schema.
    JsonSchema(serde_json::Value),
}

/// The sampling fields vLLM's `/v1/completions` body and SGLang's
/// `sampling_params` name alike, serialized straight from the request (no
/// JSON tree is built per call). Each `f32` is written in its shortest form:
/// `0.7` as the client sent it, not the `0.699999988079071` that widening it
/// to a JSON number (`f64`) gave.
#[derive(Serialize)]
pub(crate) struct SharedSampling<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repetition_penalty: Option<f32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_token_ids: &'a [u32],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
}

impl<'a> SharedSampling<'a> {
    pub(crate) fn of(p: &'a SamplingParams) -> Self {
        SharedSampling {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            min_p: p.min_p,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            repetition_penalty: p.repetition_penalty,
            stop: &p.stop,
            stop_token_ids: &p.stop_token_ids,
            ignore_eos: p.ignore_eos,
        }
    }
}

/// One generation request for one sequence. The caller always consumes a
/// stream of events; HTTP backends always stream from the backend.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Unique id, forwarded as the backend's request id where supported.
    pub request_id: String,
    pub prompt_ids: Arc<Vec<u32>>,
    pub params: SamplingParams,
    /// The prompt's images; `None` for a text prompt.
    pub images: Option<ImageInputs>,
    /// The LoRA adapter to generate with; `None`: the base model.
    pub adapter: Option<Arc<str>>,
}

/// The images of a prompt whose ids hold one run of `pad_id` per image, in
/// order, each run as long as the image's pad count.
#[derive(Debug, Clone)]
pub struct ImageInputs {
    pub pad_id: u32,
    pub images: Arc<Vec<crate::render::image::PromptImage>>,
    /// Where each image's run starts in the prompt ids.
    pub offsets: Arc<Vec<u32>>,
}

impl ImageInputs {
    /// `ids` with each run of pads made one pad: the prompt a backend that
    /// expands placeholders itself takes (SGLang's multimodal processor).
    pub fn collapsed(&self, ids: &[u32]) -> Vec<u32> {
        let mut out = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            if id != self.pad_id || i == 0 || ids[i - 1] != self.pad_id {
                out.push(id);
            }
        }
        out
    }
}

/// The logprob of one sampled token and, when asked, its top alternatives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// `None` when the backend produced no number for this token: it is
    /// recorded as null, never as a made-up value.
    pub logprob: Option<f32>,
    /// `(token_id, logprob)` of the most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS, a stop token id, or a stop string.
    Stop,
    /// Hit max_tokens or the context window.
    Length,
    /// Cancelled or aborted by the backend.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What a backend streams back. `Tokens` may carry one or many tokens;
/// `logprobs` is empty when none were asked for, else the same length as `ids`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    Tokens {
        ids: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish_reason: FinishReason,
    },
    /// Which weights sampled which of the sequence's output tokens, as the
    /// server reports them on its last chunk (vLLM 0.33+ with
    /// `return_weight_versions`, SGLang 0.5.20+): runs in order, each from
    /// `start` (an output position) to the next one's.
    Versions(Vec<ServerSpan>),
    /// The prompt the backend built differs from the ids tito sent and
    /// records (a backend that expands image placeholders itself counted
    /// differently): the first difference, cause `image_placeholder`.
    PromptDrift(crate::store::Drift),
}

/// One run of a server's weight-version report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpan {
    /// The server's label for the weights (tito's, once tito set it).
    pub version: String,
    pub start: u32,
}

pub type GenStream = Pin<Box<dyn Stream<Item = Result<GenEvent, BackendError>> + Send>>;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Could not reach the backend (connect refused, DNS, TLS, connect timeout).
    #[error("backend {backend} unreachable: {message}")]
    Unreachable { backend: String, message: String },
    /// The backend answered with an error status.
    #[error("backend {backend} returned HTTP {status}: {message}")]
    Status {
        backend: String,
        status: u16,
        message: String,
    },
    /// The backend answered something we cannot read.
    #[error("backend {backend} sent an invalid response: {message}")]
    Protocol { backend: String, message: String },
    /// No token or no progress within the configured time.
    #[error("backend {backend} timed out: {message}")]
    Timeout { backend: String, message: String },
    /// The backend is alive but refuses more work right now (queue full).
    #[error("backend {backend} is overloaded: {message}")]
    Overloaded { backend: String, message: String },
    /// The request itself is unacceptable to the backend (e.g. too long).
    #[error("backend {backend} rejected the request: {message}")]
    Rejected { backend: String, message: String },
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        let status = match &e {
            BackendError::Unreachable { .. } | BackendError::Protocol { .. } => {
                StatusCode::BAD_GATEWAY
            }
            BackendError::Status { status, .. } if *status == 400 || *status == 422 => {
                StatusCode::BAD_REQUEST
            }
            BackendError::Status { .. } => StatusCode::BAD_GATEWAY,
            BackendError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            BackendError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            BackendError::Rejected { .. } => StatusCode::BAD_REQUEST,
        };
        let kind = if status == StatusCode::BAD_REQUEST {
            "invalid_request_error"
        } else {
            "backend_error"
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl BackendError {
    /// True when the request may be retried on another backend (nothing was
    /// generated for the client yet and the fault is the backend's).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, BackendError::Rejected { .. })
    }

    /// True when the failure says the backend itself is unwell and counts
    /// toward opening its circuit: it could not be reached, timed out or
    /// answered a 5xx other than 503. An overloaded backend (429, 503, a full
    /// queue) is alive and busy: the call is retried elsewhere, but opening
    /// its circuit would only pile its load onto the others. An answer the
    /// gateway could not decode is that call's error only (one client's odd
    /// request must not take a backend away from everyone), and a rejected
    /// request is the request's.
    pub fn counts_against_health(&self) -> bool {
        !matches!(
            self,
            BackendError::Rejected { .. }
                | BackendError::Protocol { .. }
                | BackendError::Overloaded { .. }
        )
    }
}

/// One teacher-forced pass over a whole token sequence: what a backend
/// computes for a sequence given as a prompt, generating nothing (the
/// replay check sends each recorded sample this way).
#[derive(Debug, Clone)]
pub struct ScoreRequest {
    pub request_id: String,
    /// The full sequence: prompt ids followed by response ids.
    pub ids: Arc<Vec<u32>>,
    /// The LoRA adapter to score with; `None`: the base model.
    pub adapter: Option<Arc<str>>,
}

/// What a backend says about one position `i` of a scored sequence: the
/// logprob of `ids[i]` given `ids[..i]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PositionLogprob {
    /// `None` at position 0 (no prefix) and wherever the backend gave no
    /// number.
    pub logprob: Option<f32>,
    /// Whether `ids[i]` is the most likely token there (ties count as most
    /// likely); `None` when the backend does not say.
    pub argmax: Option<bool>,
}

/// Admin operations a backend may support (sleep/wake, weight updates).
/// Each backend maps them to its server's own endpoints (docs/operations.md
/// names the endpoints and the versions they were checked against).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminOp {
    /// Whether the server was started so that sleeping is safe (its
    /// weights come back as they were): asked of every backend before any
    /// is put to sleep. Changes nothing.
    SleepCheck,
    /// Whether the server can keep generations paused in place through a
    /// weight update and report where in each stream the new weights
    /// begin ([`GenEvent::Versions`]). Changes nothing.
    KeepCheck,
    Sleep {
        level: u32,
    },
    WakeUp,
    /// Load new weights from a path on the backend's disk (one step), and
    /// drop caches computed with the old ones. With [`UpdateMode::Abort`]
    /// the generations in flight are stopped first.
    UpdateWeights {
        path: String,
        version: String,
        mode: UpdateMode,
    },
    /// A trainer is about to push weights itself: stop generating (with
    /// [`UpdateMode::Abort`], stop what is in flight too).
    BeginWeightUpdate {
        mode: UpdateMode,
    },
    /// The trainer's push is done: generate again, with the new weights.
    FinishWeightUpdate {
        version: String,
    },
    /// A begun update is called off (another backend refused to begin):
    /// generate again, with the weights as they were.
    AbortWeightUpdate,
    /// Serve the LoRA adapter at `path` (on the backend's disk) as `name`;
    /// `replace`: it is served already, and its weights are replaced.
    LoadAdapter {
        name: String,
        path: String,
        replace: bool,
    },
    /// Stop serving the LoRA adapter `name`.
    UnloadAdapter {
        name: String,
    },
}

/// What a weight update does with the generations in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateMode {
    /// The gateway drains them before the update (nothing is in flight).
    Wait,
    /// The backend stops them now; each call continues on the new weights.
    Abort,
    /// The backend pauses them where they are and goes on after the
    /// update (on the new weights); it reports where in each stream.
    Keep,
}

impl UpdateMode {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateMode::Wait => "wait",
            UpdateMode::Abort => "abort",
            UpdateMode::Keep => "keep",
        }
    }
}

impl AdminOp {
    pub fn name(&self) -> &'static str {
        match self {
            AdminOp::SleepCheck => "sleep_check",
            AdminOp::KeepCheck => "keep_check",
            AdminOp::Sleep { .. } => "sleep",
            AdminOp::WakeUp => "wake_up",
            AdminOp::UpdateWeights { .. } => "update_weights",
            AdminOp::BeginWeightUpdate { .. } => "begin_weight_update",
            AdminOp::FinishWeightUpdate { .. } => "finish_weight_update",
            AdminOp::AbortWeightUpdate => "abort_weight_update",
            AdminOp::LoadAdapter { .. } => "load_adapter",
            AdminOp::UnloadAdapter { .. } => "unload_adapter",
        }
    }

    /// The weight version a successful run of this op leaves the backend
    /// serving, when it changes the weights.
    pub fn new_version(&self) -> Option<&str> {
        match self {
            AdminOp::UpdateWeights { version, .. } | AdminOp::FinishWeightUpdate { version } => {
                Some(version)
            }
            _ => None,
        }
    }
}

#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Stable name used in logs, metrics and error messages.
    fn name(&self) -> &str;
    /// `vllm`, `sglang` or `engine`.
    fn kind(&self) -> &'static str;
    /// The most tokens (prompt and output) one sequence may hold here, when
    /// the backend knows it without asking over the network (the in-process
    /// engine's context); the gateway's window is at most that.
    fn max_model_len(&self) -> Option<u32> {
        None
    }
    /// Starts generating. Dropping the returned stream cancels the request.
    async fn generate(&self, req: GenerateRequest) -> Result<GenStream, BackendError>;
    /// Cheap liveness probe.
    async fn health(&self) -> Result<(), BackendError>;
    /// Forwards an admin operation; returns the backend's answer as text.
    async fn admin(&self, op: &AdminOp) -> Result<String, BackendError>;
    /// Whether new weights loaded while it sleeps are the ones it serves
    /// after the wake-up. Not on vLLM (wake-up copies its host copy of the
    /// old weights back) or SGLang (released weights are restored, or left
    /// uninitialised): those are refused an update while asleep.
    fn reloads_while_asleep(&self) -> bool {
        false
    }
    /// Teacher-forced logprobs of a whole sequence: one entry per id of
    /// `req.ids`, in order (position 0 has no logprob). A backend that
    /// cannot compute them says so with [`BackendError::Rejected`].
    async fn prompt_logprobs(
        &self,
        req: ScoreRequest,
    ) -> Result<Vec<PositionLogprob>, BackendError> {
        Err(BackendError::Rejected {
            backend: self.name().to_string(),
            message: format!(
                "a `{}` backend cannot compute prompt logprobs (request {})",
                self.kind(),
                req.request_id
            ),
        })
    }
}

pub type DynBackend = Arc<dyn Backend>;

/// A finished generation, collected from a stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generation {
    pub ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish_reason: Option<FinishReason>,
}

impl Generation {
    pub fn push(&mut self, ev: GenEvent) {
        match ev {
            GenEvent::Tokens { ids, logprobs } => {
                self.ids.extend(ids);
                self.logprobs.extend(logprobs);
            }
            GenEvent::Done { finish_reason } => self.finish_reason = Some(finish_reason),
            GenEvent::Versions(_) | GenEvent::PromptDrift(_) => {}
        }
    }
}

/// A [`GenEvent::PromptDrift`] when the prompt a backend echoes (after
/// expanding image placeholders itself) differs from the one tito records:
/// the first differing position, cause `image_placeholder`.
pub(crate) fn prompt_drift(expected: &[u32], echoed: &[u32]) -> Option<GenEvent> {
    let common = expected
        .iter()
        .zip(echoed)
        .take_while(|(a, b)| a == b)
        .count();
    if common == expected.len() && common == echoed.len() {
        return None;
    }
    let around = |ids: &[u32]| ids[common..].iter().take(8).copied().collect::<Vec<_>>();
    Some(GenEvent::PromptDrift(crate::store::Drift {
        position: u32::try_from(common).unwrap_or(u32::MAX),
        cause: "image_placeholder".into(),
        details: serde_json::json!({
            "recorded_len": expected.len(),
            "backend_len": echoed.len(),
            "recorded": around(expected),
            "backend": around(echoed),
        }),
    }))
}

/// Builds one HTTP backend client (vLLM or SGLang).
pub fn build_backend(
    b: &crate::config::BackendConfig,
    router: &crate::config::RouterConfig,
) -> anyhow::Result<DynBackend> {
    Ok(match b.kind {
        crate::config::BackendKind::Vllm => Arc::new(vllm::VllmBackend::new(b, router)?),
        crate::config::BackendKind::Sglang => Arc::new(sglang::SglangBackend::new(b, router)?),
        // A remote `tito engine` speaks vLLM's protocol.
        crate::config::BackendKind::Engine if b.url != "engine" => {
            Arc::new(vllm::VllmBackend::new(b, router)?)
        }
        other => anyhow::bail!(
            "backend kind `{}` is not available in this build",
            other.as_str()
        ),
    })
}

/// An HTTP backend's one client, for every call it makes (generate, health,
/// admin, replay), `http://` and `https://` alike: pooled keep-alive
/// connections, the router's connect timeout, and the backend's `ca_file`
/// trusted beside the bundled web roots. It connects to the backend
/// directly, whatever `HTTP_PROXY` says. Credentials in the URL are sent as
/// basic auth.
pub(crate) fn http_client(
    router: &crate::config::RouterConfig,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(std::time::Duration::from_millis(router.connect_timeout_ms))
        .pool_max_idle_per_host(1024)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(path) = ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("backends.ca_file = {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            anyhow::anyhow!(
                "backends.ca_file = {}: not PEM certificates: {e}",
                path.display()
            )
        })?;
        if certs.is_empty() {
            anyhow::bail!(
                "backends.ca_file = {}: holds no certificate",
                path.display()
            );
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    Ok(builder.build()?)
}

/// Idle connections older than this are closed. vLLM and SGLang serve with
/// uvicorn, which closes a connection idle for 5 s (`timeout_keep_alive`);
/// a request sent on one just as the server closes it would fail.
const POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub(crate) fn map_reqwest(backend: &str, e: reqwest::Error) -> BackendError {
    if e.is_connect() {
        BackendError::Unreachable {
            backend: backend.to_string(),
            message: e.to_string(),
        }
    } else if e.is_timeout() {
        timeout(backend, &e.to_string())
    } else if e.is_decode() || e.is_body() {
        BackendError::Protocol {
            backend: backend.to_string(),
            message: e.to_string(),
        }
    } else {
        BackendError::Unreachable {
            backend: backend.to_string(),
            message: e.to_string(),
        }
    }
}

pub(crate) fn timeout(backend: &str, message: &str) -> BackendError {
    BackendError::Timeout {
        backend: backend.to_string(),
        message: message.to_string(),
    }
}

/// Sends a non-streamed request and reads its whole JSON answer as `T`,
/// all within `timeout` (the replay check's one-shot calls).
pub(crate) async fn send_json<T: serde::de::DeserializeOwned>(
    backend: &str,
    request: reqwest::RequestBuilder,
    timeout: std::time::Duration,
) -> Result<T, BackendError> {
    let call = async {
        let resp = request.send().await.map_err(|e| map_reqwest(backend, e))?;
        let resp = check_status(backend, resp).await?;
        resp.bytes().await.map_err(|e| map_reqwest(backend, e))
    };
    let body = tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| self::timeout(backend, &format!("no answer within {timeout:?}")))??;
    serde_json::from_slice(&body).map_err(|e| BackendError::Protocol {
        backend: backend.to_string(),
        message: format!("cannot read the answer: {e}"),
    })
}

/// Turns an error status into a `BackendError` carrying the backend's message.
pub(crate) async fn check_status(
    backend: &str,
    resp: reqwest::Response,
) -> Result<reqwest::Response, BackendError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let text = resp.text().await.unwrap_or_default();
    Err(status_error(backend, status.as_u16(), error_message(&text)))
}

/// The message of an error answer: OpenAI's `error.message`, or a
/// `message` or `detail` field, or the start of the text.
pub(crate) fn error_message(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("detail"))
                .and_then(|m| m.as_str().map(str::to_string))
        })
        .unwrap_or_else(|| text.chars().take(500).collect())
}

/// The error for an HTTP status (or an in-stream error's code) `status`.
pub(crate) fn status_error(backend: &str, status: u16, message: String) -> BackendError {
    let backend = backend.to_string();
    match status {
        429 | 503 => BackendError::Overloaded { backend, message },
        400 | 413 | 422 => BackendError::Rejected { backend, message },
        s => BackendError::Status {
            backend,
            status: s,
            message,
        },
    }
}

/// A stream that aborts its producer task when dropped (used by the API's
/// SSE responses; the backend [`pump`] stops on its own when its stream is
/// dropped).
pub(crate) struct AbortOnDrop<S> {
    inner: S,
    task: tokio::task::JoinHandle<()>,
}

impl<S> AbortOnDrop<S> {
    pub(crate) fn new(inner: S, task: tokio::task::JoinHandle<()>) -> Self {
        AbortOnDrop { inner, task }
    }
}

impl<S> Drop for AbortOnDrop<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<S: Stream + Unpin> Stream for AbortOnDrop<S> {
    type Item = S::Item;
    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}
