//! An in-process mock of vLLM's token-in/token-out `/v1/completions`: it
//! records every request body and answers from a script of token ids and
//! logprobs, streaming one token per SSE chunk. A response can hang after k
//! tokens so tests can observe client-disconnect cancellation.
//!
//! It also answers vLLM's `prompt_logprobs` (the replay check's
//! teacher-forced pass) as a model that remembers what it sampled: a token
//! it sampled after a prefix gets the logprob and rank it was sampled with;
//! any other position gets [`UNSEEN_LOGPROB`] at rank [`UNSEEN_RANK`]. A
//! test can shift chosen sequence positions ([`MockVllm::shift_replay`]).
//! Scoring requests use no script entry and are counted in `scored`.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::Notify;

#[derive(Clone, Debug, Default)]
pub struct Scripted {
    pub ids: Vec<u32>,
    /// Per-token logprob; defaults to -0.5 - i/100.
    pub logprobs: Option<Vec<f32>>,
    pub finish_reason: Option<String>,
    /// Stream this many tokens, then hang until the client goes away.
    pub hang_after: Option<usize>,
    /// Answer with this HTTP error instead.
    pub error: Option<(u16, String)>,
    /// Send `"logprobs": null` even when logprobs were asked for.
    pub no_logprobs: bool,
    /// Wait this long before each streamed token (a slow backend).
    pub token_delay_ms: u64,
    /// Answer a stream whose first event is not a completion chunk.
    pub garbage: bool,
    /// Send `null` for every optional logprobs field but the numbers.
    pub null_optionals: bool,
    /// Per-token rank (1 = argmax) a later replay reports; default 1.
    pub ranks: Option<Vec<u32>>,
    /// Stream this many tokens, then wait for [`MockVllm::release_held`].
    pub hold_after: Option<usize>,
}

impl Scripted {
    pub fn ids(ids: Vec<u32>) -> Self {
        Scripted {
            ids,
            ..Default::default()
        }
    }
}

#[derive(Default)]
pub struct MockState {
    pub requests: Mutex<Vec<Value>>,
    pub script: Mutex<VecDeque<Scripted>>,
    /// Used when the script is empty.
    pub default: Mutex<Scripted>,
    pub cancelled: AtomicUsize,
    pub cancel_notify: Notify,
    pub healthy: std::sync::atomic::AtomicBool,
    /// Every request's path (and query), in arrival order.
    pub log: Mutex<Vec<String>>,
    /// Benchmarks: keep no request bodies, log, sampled-token table or
    /// completed answers (they would grow unbounded).
    pub quiet: std::sync::atomic::AtomicBool,
    /// Content of the text `/v1/chat/completions` answer ("ok" when unset).
    pub chat_content: Mutex<Option<String>>,
    /// (prompt, sampled ids) of every streamed answer sent to its end (none
    /// when quiet).
    pub completed: Mutex<Vec<(Vec<u32>, Vec<u32>)>>,
    /// The answer to a request carrying `structured_outputs`, as a backend
    /// honouring the constraint would give (unset: the script applies).
    pub structured_reply: Mutex<Option<Vec<u32>>>,
    /// What was sampled: hash of prefix + token → (logprob, rank).
    pub sampled: Mutex<HashMap<u64, (f32, u32)>>,
    /// Replays: sequence position → added to the replayed logprob.
    pub replay_shift: Mutex<HashMap<usize, f32>>,
    /// Prompt-logprob (scoring) requests answered.
    pub scored: AtomicUsize,
    pub scored_notify: Notify,
    /// Admin requests never get an answer (a hung backend).
    pub hang_admin: std::sync::atomic::AtomicBool,
    /// `reload_weights` fails as a missing checkpoint does.
    pub fail_reload: std::sync::atomic::AtomicBool,
    /// Started with `--weight-transfer-config` (start/finish work).
    pub transfer_configured: std::sync::atomic::AtomicBool,
    /// A weight transfer was started and not finished.
    pub transfer_started: std::sync::atomic::AtomicBool,
    /// Generation paused with `/pause`.
    pub paused: std::sync::atomic::AtomicBool,
    /// Started with `--enable-sleep-mode` (what `/server_info` reports).
    pub sleep_mode: std::sync::atomic::AtomicBool,
    /// Admin requests received (hung ones included).
    pub admin_seen: Notify,
    /// Streams waiting at their `hold_after` point (ever).
    pub held: AtomicUsize,
    pub held_notify: Notify,
    pub released: std::sync::atomic::AtomicBool,
    pub release_notify: Notify,
    /// Every request's path and `Authorization` header, in arrival order
    /// (none when quiet).
    pub authorizations: Mutex<Vec<(String, Option<String>)>>,
    /// LoRA adapters loaded: name → path.
    pub loras: Mutex<std::collections::BTreeMap<String, String>>,
    /// For each LoRA load, how many streams had been sent to their end.
    pub lora_loads_after: Mutex<Vec<usize>>,
}

/// Records each request's path and `Authorization` header.
async fn record_authorization(
    State(s): State<Arc<MockState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !s.quiet.load(Ordering::Relaxed) {
        let auth = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let path = req.uri().path().to_string();
        s.authorizations.lock().expect("lock").push((path, auth));
    }
    next.run(req).await
}

/// Waits until `ready()` holds, woken by `notify` (registered before each
/// check, so a change in between is not missed).
async fn wait_until(notify: &Notify, ready: impl Fn() -> bool) {
    loop {
        let woken = notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if ready() {
            return;
        }
        woken.await;
    }
}

/// A replayed position the mock never sampled (prompt, observations).
pub const UNSEEN_LOGPROB: f32 = -2.5;
pub const UNSEEN_RANK: u32 = 3;

/// Hash of a prefix, extended one token at a time.
fn extend_hash(h: u64, token: u32) -> u64 {
    (h ^ u64::from(token)).wrapping_mul(0x100_0000_01b3) ^ 0x9e37_79b9
}

fn prefix_hash(ids: &[u32]) -> u64 {
    ids.iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &t| extend_hash(h, t))
}

pub struct MockVllm {
    pub addr: SocketAddr,
    pub state: Arc<MockState>,
    /// Served over TLS (`https://`).
    pub tls: bool,
}

impl MockVllm {
    pub async fn start(default: Scripted) -> MockVllm {
        Self::start_on("127.0.0.1:0", default).await
    }

    pub async fn start_on(addr: &str, default: Scripted) -> MockVllm {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        // vLLM and SGLang (uvicorn on asyncio) send with TCP_NODELAY, as
        // this listener does.
        let listener =
            tito::server::CappedListener::new(listener, tito::config::DEFAULT_MAX_CONNECTIONS);
        Self::serve_on(listener, false, default)
    }

    /// The same mock served on any axum listener (`tls`: it speaks TLS, so
    /// its URL is `https://`).
    pub fn serve_on<L>(listener: L, tls: bool, default: Scripted) -> MockVllm
    where
        L: axum::serve::Listener<Addr = SocketAddr>,
    {
        let addr = listener.local_addr().expect("addr");
        let (state, app) = Self::app(default);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockVllm { addr, state, tls }
    }

    fn app(default: Scripted) -> (Arc<MockState>, Router) {
        let state = Arc::new(MockState {
            default: Mutex::new(default),
            healthy: std::sync::atomic::AtomicBool::new(true),
            sleep_mode: std::sync::atomic::AtomicBool::new(true),
            ..Default::default()
        });
        let app = Router::new()
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(chat_text))
            .route("/health", get(health))
            .route("/sleep", post(admin))
            .route("/wake_up", post(admin))
            .route("/collective_rpc", post(admin))
            .route("/reset_prefix_cache", post(admin))
            .route("/pause", post(admin))
            .route("/resume", post(admin))
            .route("/start_weight_update", post(admin))
            .route("/finish_weight_update", post(admin))
            .route("/v1/load_lora_adapter", post(admin))
            .route("/v1/unload_lora_adapter", post(admin))
            .route("/server_info", get(server_info))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                record_authorization,
            ))
            .with_state(state.clone());
        (state, app)
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// For benchmarks: stop recording request bodies, paths and completed
    /// answers.
    pub fn quiet(&self) {
        self.state.quiet.store(true, Ordering::SeqCst);
    }

    /// What the text chat endpoint answers (for gateways that forward text).
    pub fn set_chat_content(&self, content: &str) {
        *self.state.chat_content.lock().expect("lock") = Some(content.to_string());
    }

    pub fn push(&self, s: Scripted) {
        self.state.script.lock().expect("lock").push_back(s);
    }

    /// Waits until `n` streams reached their `hold_after` point.
    pub async fn wait_held(&self, n: usize) {
        let s = &self.state;
        wait_until(&s.held_notify, || s.held.load(Ordering::SeqCst) >= n).await;
    }

    /// Lets every held stream (and every later one) go on.
    pub fn release_held(&self) {
        self.state.released.store(true, Ordering::SeqCst);
        self.state.release_notify.notify_waiters();
    }

    pub fn log(&self) -> Vec<String> {
        self.state.log.lock().expect("lock").clone()
    }

    /// (prompt, sampled ids) of every streamed answer sent to its end (none
    /// when quiet).
    pub fn completed(&self) -> Vec<(Vec<u32>, Vec<u32>)> {
        self.state.completed.lock().expect("lock").clone()
    }

    /// Replays of sequence position `pos` report `delta` more than sampled.
    pub fn shift_replay(&self, pos: usize, delta: f32) {
        self.state
            .replay_shift
            .lock()
            .expect("lock")
            .insert(pos, delta);
    }

    /// Resolves once `n` scoring requests were answered.
    pub async fn wait_scored(&self, n: usize) {
        loop {
            let notified = self.state.scored_notify.notified();
            if self.state.scored.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }

    /// Whether `/server_info` says the server runs with
    /// `--enable-sleep-mode` (default yes).
    pub fn set_sleep_mode(&self, on: bool) {
        self.state.sleep_mode.store(on, Ordering::SeqCst);
    }

    /// Every request's path and `Authorization` header, in arrival order.
    pub fn authorizations(&self) -> Vec<(String, Option<String>)> {
        self.state.authorizations.lock().expect("lock").clone()
    }

    pub fn requests(&self) -> Vec<Value> {
        self.state.requests.lock().expect("lock").clone()
    }

    pub fn last_request(&self) -> Value {
        self.requests()
            .last()
            .cloned()
            .expect("a request was received")
    }

    /// Resolves once a streaming response was dropped by its client.
    pub async fn wait_cancelled(&self) {
        loop {
            let notified = self.state.cancel_notify.notified();
            if self.state.cancelled.load(Ordering::SeqCst) > 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Text chat completions, for gateways that forward text (benchmark peers).
async fn chat_text(State(s): State<Arc<MockState>>, Json(body): Json<Value>) -> Response {
    let n = s.default.lock().expect("lock").ids.len();
    let stream = body["stream"].as_bool().unwrap_or(false);
    let content = s
        .chat_content
        .lock()
        .expect("lock")
        .clone()
        .unwrap_or_else(|| "ok".to_string());
    if stream {
        let chunks = vec![
            json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": null}]}),
            json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ];
        let events = chunks
            .into_iter()
            .map(|c| Ok::<_, Infallible>(Event::default().data(c.to_string())))
            .chain(std::iter::once(Ok(Event::default().data("[DONE]"))));
        return Sse::new(futures::stream::iter(events)).into_response();
    }
    Json(json!({"id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}))
    .into_response()
}

/// vLLM 0.33's dev-mode admin endpoints, shapes checked as vLLM checks
/// them (a request vLLM would refuse is refused here too); logged.
async fn admin(
    State(s): State<Arc<MockState>>,
    uri: axum::http::Uri,
    body: axum::body::Bytes,
) -> Response {
    let mut entry = uri.to_string();
    if !body.is_empty() {
        entry.push(' ');
        entry.push_str(&String::from_utf8_lossy(&body));
    }
    s.log.lock().expect("lock").push(entry);
    s.admin_seen.notify_waiters();
    if s.hang_admin.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let query: HashMap<String, String> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(_) => return refuse(StatusCode::BAD_REQUEST, "body is not JSON"),
        }
    };
    let mode_ok = |q: &HashMap<String, String>| {
        q.get("mode")
            .is_none_or(|m| ["abort", "wait", "keep"].contains(&m.as_str()))
    };
    let flag = |f: &std::sync::atomic::AtomicBool| f.load(Ordering::SeqCst);
    match uri.path() {
        "/sleep" => {
            let level = match query.get("level").map(|l| l.parse::<u32>()) {
                None => 1,
                Some(Ok(l)) if l <= 2 => l,
                _ => return refuse(StatusCode::BAD_REQUEST, "level must be 0, 1 or 2"),
            };
            if !mode_ok(&query) {
                return refuse(StatusCode::BAD_REQUEST, "mode");
            }
            Json(json!({"status": "sleeping", "level": level})).into_response()
        }
        "/wake_up" => Json(json!({"status": "awake", "tags": null})).into_response(),
        "/collective_rpc" => {
            let Some(b) = json_body.filter(Value::is_object) else {
                return refuse(StatusCode::BAD_REQUEST, "a JSON object body is required");
            };
            let Some(method) = b.get("method").and_then(Value::as_str) else {
                return refuse(StatusCode::BAD_REQUEST, "method is required");
            };
            if method != "reload_weights" {
                return refuse(StatusCode::INTERNAL_SERVER_ERROR, "unknown worker method");
            }
            // GPUModelRunner.reload_weights(weights_iterator=None,
            // weights_path=None, is_checkpoint_format=True)
            let allowed = ["weights_iterator", "weights_path", "is_checkpoint_format"];
            let kwargs = b.get("kwargs").cloned().unwrap_or(json!({}));
            let Some(kw) = kwargs.as_object() else {
                return refuse(StatusCode::BAD_REQUEST, "kwargs must be an object");
            };
            if let Some(k) = kw.keys().find(|k| !allowed.contains(&k.as_str())) {
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("reload_weights() got an unexpected keyword argument '{k}'"),
                );
            }
            if b.get("args")
                .is_some_and(|a| a.as_array().is_none_or(|a| !a.is_empty()))
            {
                return refuse(StatusCode::INTERNAL_SERVER_ERROR, "positional args");
            }
            if flag(&s.fail_reload) {
                return refuse(StatusCode::INTERNAL_SERVER_ERROR, "no such checkpoint");
            }
            Json(json!({"results": [null]})).into_response()
        }
        "/reset_prefix_cache" => Json(json!({"success": true})).into_response(),
        // vLLM's `_check_load_lora_adapter_request` /
        // `_check_unload_lora_adapter_request`
        // (`vllm/entrypoints/openai/models/serving.py` lines 251-298).
        "/v1/load_lora_adapter" => {
            let b = json_body.unwrap_or_default();
            let (Some(name), Some(path)) = (b["lora_name"].as_str(), b["lora_path"].as_str())
            else {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "Both 'lora_name' and 'lora_path' must be provided.",
                );
            };
            let mut loras = s.loras.lock().expect("lock");
            if b["load_inplace"] != json!(true) && loras.contains_key(name) {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("The lora adapter '{name}' has already been loaded."),
                );
            }
            loras.insert(name.to_string(), path.to_string());
            let done = s.completed.lock().expect("lock").len();
            s.lora_loads_after.lock().expect("lock").push(done);
            format!("Success: LoRA adapter '{name}' added successfully.").into_response()
        }
        "/v1/unload_lora_adapter" => {
            let b = json_body.unwrap_or_default();
            let name = b["lora_name"].as_str().unwrap_or_default();
            if s.loras.lock().expect("lock").remove(name).is_none() {
                return refuse(
                    StatusCode::NOT_FOUND,
                    &format!("The lora adapter '{name}' cannot be found."),
                );
            }
            format!("Success: LoRA adapter '{name}' removed successfully.").into_response()
        }
        "/pause" => {
            if !mode_ok(&query) {
                return refuse(StatusCode::BAD_REQUEST, "mode");
            }
            s.paused.store(true, Ordering::SeqCst);
            Json(json!({"status": "paused"})).into_response()
        }
        "/resume" => {
            s.paused.store(false, Ordering::SeqCst);
            Json(json!({"status": "resumed"})).into_response()
        }
        "/start_weight_update" => {
            if !flag(&s.transfer_configured) {
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Weight transfer not configured",
                );
            }
            if s.transfer_started.swap(true, Ordering::SeqCst) {
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "weight update already started",
                );
            }
            Json(json!({"message": "Weight update started"})).into_response()
        }
        "/finish_weight_update" => {
            if json_body.as_ref().is_some_and(|b| {
                !b.is_object()
                    || b.get("weight_version")
                        .is_some_and(|v| !v.is_string() && !v.is_null())
            }) {
                return refuse(StatusCode::BAD_REQUEST, "weight_version must be a string");
            }
            if !s.transfer_started.swap(false, Ordering::SeqCst) {
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "no weight update started",
                );
            }
            Json(json!({"message": "Weight update finished"})).into_response()
        }
        _ => refuse(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// vLLM's dev-mode `GET /server_info`: with `config_format=json` the
/// config as JSON (`vllm_config.model_config.enable_sleep_mode`), else its
/// text form, which carries no such field.
async fn server_info(State(s): State<Arc<MockState>>, uri: axum::http::Uri) -> Response {
    s.log.lock().expect("lock").push(uri.to_string());
    if !uri.query().unwrap_or("").contains("config_format=json") {
        return Json(json!({"vllm_config": "model='mock', ...", "vllm_env": {}})).into_response();
    }
    let sleep = s.sleep_mode.load(Ordering::SeqCst);
    Json(json!({
        "vllm_config": {"model_config": {"model": "mock", "enable_sleep_mode": sleep},
                        "weight_transfer_config": null},
        "vllm_env": {"VLLM_SERVER_DEV_MODE": "1"},
        "system_env": {},
    }))
    .into_response()
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": {"message": message, "type": "BadRequestError", "param": null, "code": status.as_u16()}}))).into_response()
}

async fn health(State(s): State<Arc<MockState>>) -> StatusCode {
    if s.healthy.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

struct CancelGuard {
    state: Arc<MockState>,
    finished: bool,
    /// Prompt and sampled ids of this request, logged when it completes.
    sample: Option<(Vec<u32>, Vec<u32>)>,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.finished {
            if let Some(s) = self.sample.take() {
                self.state.completed.lock().expect("lock").push(s);
            }
        } else {
            self.state.cancelled.fetch_add(1, Ordering::SeqCst);
            self.state.cancel_notify.notify_waiters();
        }
    }
}

/// vLLM's `logprobs` object of a non-streamed answer (the same writer as
/// the streamed events').
fn logprobs_json(ids: &[u32], lps: &[f32], k: u64) -> Value {
    let mut o = Vec::new();
    put_logprobs(&mut o, ids, lps, k, false);
    serde_json::from_slice(&o).expect("the logprobs object is JSON")
}

/// Remembers that `ids` were sampled after `prompt` (when not quiet).
fn remember(s: &MockState, prompt: &[u32], ids: &[u32], lps: &[f32], ranks: Option<&[u32]>) {
    if s.quiet.load(Ordering::Relaxed) {
        return;
    }
    let mut table = s.sampled.lock().expect("lock");
    let mut h = prefix_hash(prompt);
    for (i, (&id, &lp)) in ids.iter().zip(lps).enumerate() {
        let rank = ranks.and_then(|r| r.get(i)).copied().unwrap_or(1);
        h = extend_hash(h, id);
        table.insert(h, (lp, rank));
    }
}

/// vLLM's answer to `prompt_logprobs: k`: per position the own token's
/// `{logprob, rank, decoded_token}`, and with k >= 1 the most likely token
/// when that is another one (rank above 1: another token, a little more
/// likely); null at position 0.
fn prompt_logprobs(s: &MockState, prompt: &[u32], k: u64) -> Value {
    let table = s.sampled.lock().expect("lock");
    let shift = s.replay_shift.lock().expect("lock");
    let mut h = prefix_hash(&[]);
    let mut out = Vec::with_capacity(prompt.len());
    for (pos, &id) in prompt.iter().enumerate() {
        h = extend_hash(h, id);
        if pos == 0 {
            out.push(Value::Null);
        } else {
            let (lp, rank) = table
                .get(&h)
                .copied()
                .unwrap_or((UNSEEN_LOGPROB, UNSEEN_RANK));
            let lp = lp + shift.get(&pos).copied().unwrap_or(0.0);
            let mut m = serde_json::Map::new();
            m.insert(
                id.to_string(),
                json!({"logprob": lp, "rank": rank, "decoded_token": format!("t{id}")}),
            );
            if k >= 1 && rank > 1 {
                let other = id.wrapping_add(1);
                m.insert(
                    other.to_string(),
                    json!({"logprob": lp / 2.0, "rank": 1, "decoded_token": format!("t{other}")}),
                );
            }
            out.push(Value::Object(m));
        }
    }
    Value::Array(out)
}

/// A teacher-forced pass: the prompt's logprobs and one token, from no
/// script entry.
fn score(s: &MockState, body: &Value) -> Response {
    if body["stream"].as_bool().unwrap_or(false) {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": "`prompt_logprobs` are not available when `stream=True`.", "type": "BadRequestError", "code": 400}})),
        )
            .into_response();
    }
    let prompt: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap_or_default();
    let choice = json!({"index": 0, "text": "", "token_ids": [0], "finish_reason": "length",
        "stop_reason": null, "logprobs": null, "prompt_logprobs": prompt_logprobs(s, &prompt, body["prompt_logprobs"].as_u64().unwrap_or(0))});
    s.scored.fetch_add(1, Ordering::SeqCst);
    s.scored_notify.notify_waiters();
    Json(json!({"id": "cmpl-mock", "object": "text_completion", "model": "mock", "choices": [choice],
        "usage": {"prompt_tokens": prompt.len(), "completion_tokens": 1, "total_tokens": prompt.len() + 1}}))
    .into_response()
}

async fn completions(State(s): State<Arc<MockState>>, Json(body): Json<Value>) -> Response {
    if !s.quiet.load(Ordering::Relaxed) {
        s.requests.lock().expect("lock").push(body.clone());
        s.log.lock().expect("lock").push("/v1/completions".into());
    }
    if !body["prompt_logprobs"].is_null() {
        return score(&s, &body);
    }
    let structured = body.get("structured_outputs").is_some();
    let script = match s.structured_reply.lock().expect("lock").clone() {
        Some(ids) if structured => Scripted::ids(ids),
        _ => {
            let mut q = s.script.lock().expect("lock");
            q.pop_front()
                .unwrap_or_else(|| s.default.lock().expect("lock").clone())
        }
    };
    if let Some((status, message)) = &script.error {
        let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (
            code,
            Json(json!({"error": {"message": message, "type": "mock", "code": status}})),
        )
            .into_response();
    }
    if script.garbage {
        let text = "data: {\"choices\": \"not a list\"}\n\ndata: [DONE]\n\n";
        return ([("content-type", "text/event-stream")], text).into_response();
    }
    let prompt: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap_or_default();
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16) as usize;
    let stop_ids: Vec<u32> =
        serde_json::from_value(body["stop_token_ids"].clone()).unwrap_or_default();
    let mut ids = Vec::new();
    let mut finish = "length".to_string();
    for id in &script.ids {
        if ids.len() >= max_tokens {
            break;
        }
        ids.push(*id);
        if stop_ids.contains(id) {
            finish = "stop".into();
            break;
        }
    }
    // The script's own end is the model's (EOS): vLLM reports it as
    // "stop" even on the last token max_tokens allows. Only a cut is
    // "length".
    if ids.len() == script.ids.len() && finish != "stop" {
        finish = script
            .finish_reason
            .clone()
            .unwrap_or_else(|| "stop".into());
    }
    let lps: Vec<f32> = match &script.logprobs {
        Some(l) => l.iter().take(ids.len()).copied().collect(),
        None => (0..ids.len()).map(|i| -0.5 - i as f32 / 100.0).collect(),
    };
    remember(&s, &prompt, &ids, &lps, script.ranks.as_deref());
    let k = body["logprobs"].as_u64().filter(|_| !script.no_logprobs);
    if !body["stream"].as_bool().unwrap_or(false) {
        let mut choice = json!({"index": 0, "text": "", "finish_reason": finish, "stop_reason": null,
            "prompt_token_ids": prompt, "token_ids": ids, "logprobs": null});
        if let Some(k) = k {
            choice["logprobs"] = logprobs_json(&ids, &lps, k);
        }
        return Json(
            json!({"id": "cmpl-mock", "object": "text_completion", "choices": [choice],
            "usage": {"prompt_tokens": prompt.len(), "completion_tokens": ids.len()}}),
        )
        .into_response();
    }
    let hang_after = script.hang_after;
    let guard = CancelGuard {
        state: s.clone(),
        finished: false,
        // Quiet (benchmarks): nothing kept, as for requests.
        sample: (!s.quiet.load(Ordering::Relaxed)).then(|| (prompt.clone(), ids.clone())),
    };
    let delay = std::time::Duration::from_millis(script.token_delay_ms);
    let pace = Pace {
        hang_after,
        hold_after: script.hold_after,
        delay,
        state: s.clone(),
    };
    let answer = Answer {
        ids,
        lps,
        k,
        finish,
        prompt,
        null_optionals: script.null_optionals,
    };
    stream_answer(answer, pace, guard)
}

/// When a streamed answer stalls: forever after `hang_after` tokens, and
/// `delay` before every token.
struct Pace {
    hang_after: Option<usize>,
    hold_after: Option<usize>,
    delay: std::time::Duration,
    state: Arc<MockState>,
}

/// What every chunk of one streamed answer is written from.
struct Answer {
    ids: Vec<u32>,
    lps: Vec<f32>,
    k: Option<u64>,
    finish: String,
    prompt: Vec<u32>,
    null_optionals: bool,
}

/// Writes `v` as JSON text.
fn put_json(out: &mut Vec<u8>, v: &(impl serde::Serialize + ?Sized)) {
    serde_json::to_writer(&mut *out, v).expect("JSON of a number or string");
}

/// Writes `"token_id:ID"` (vLLM's token string with
/// `return_tokens_as_token_ids`; nothing in it needs escaping).
fn put_token_id(out: &mut Vec<u8>, id: u32) {
    use std::io::Write;
    write!(out, "\"token_id:{id}\"").expect("writing to a Vec");
}

/// Writes a logprob as vLLM does (a float32 value as a Python float: widened
/// to f64), `null` when not finite.
fn put_logprob(out: &mut Vec<u8>, lp: f32) {
    put_json(out, &f64::from(lp));
}

/// vLLM's `logprobs` object for `ids` sampled with logprobs `lps`, with `k`
/// alternatives a token (at least the sampled one); `null_optionals`: every
/// field but the numbers `null`.
fn put_logprobs(out: &mut Vec<u8>, ids: &[u32], lps: &[f32], k: u64, null_optionals: bool) {
    let list = |out: &mut Vec<u8>, each: &dyn Fn(&mut Vec<u8>, usize)| {
        if null_optionals {
            out.extend_from_slice(b"null");
            return;
        }
        out.push(b'[');
        for t in 0..ids.len() {
            if t > 0 {
                out.push(b',');
            }
            each(out, t);
        }
        out.push(b']');
    };
    out.extend_from_slice(b"{\"tokens\":");
    list(out, &|out, t| put_token_id(out, ids[t]));
    out.extend_from_slice(b",\"token_logprobs\":[");
    for (t, &lp) in lps.iter().enumerate() {
        if t > 0 {
            out.push(b',');
        }
        put_logprob(out, lp);
    }
    out.extend_from_slice(b"],\"top_logprobs\":");
    list(out, &|out, t| {
        out.push(b'{');
        for j in 0..k.max(1) {
            if j > 0 {
                out.push(b',');
            }
            put_token_id(out, ids[t] + j as u32);
            out.push(b':');
            put_logprob(out, lps[t] - j as f32);
        }
        out.push(b'}');
    });
    out.extend_from_slice(b",\"text_offset\":");
    list(out, &|out, _| out.push(b'0'));
    out.push(b'}');
}

impl Answer {
    /// The SSE event of step `i`: token `i`, or the finish chunk at the end,
    /// written as text in vLLM's key order (no JSON tree for every token).
    fn event(&self, i: usize) -> bytes::Bytes {
        let mut o = Vec::with_capacity(256);
        o.extend_from_slice(b"data: {\"choices\":[{\"index\":0,");
        if i == self.ids.len() {
            o.extend_from_slice(b"\"text\":\"\",\"token_ids\":[],\"finish_reason\":");
            put_json(&mut o, &self.finish);
            o.extend_from_slice(b"}]}\n\n");
            return o.into();
        }
        o.extend_from_slice(b"\"text\":\"x\",\"token_ids\":");
        put_json(&mut o, &self.ids[i..=i]);
        o.extend_from_slice(b",\"finish_reason\":null");
        if i == 0 {
            o.extend_from_slice(b",\"prompt_token_ids\":");
            put_json(&mut o, &self.prompt);
        }
        if let Some(k) = self.k {
            o.extend_from_slice(b",\"logprobs\":");
            let (ids, lps) = (&self.ids[i..=i], &self.lps[i..=i]);
            put_logprobs(&mut o, ids, lps, k, self.null_optionals);
            if self.null_optionals {
                o.extend_from_slice(b",\"stop_reason\":null");
            }
        }
        o.extend_from_slice(b"}]}\n\n");
        o.into()
    }
}

/// The streamed answer's SSE body: one event per token, the finish chunk,
/// `[DONE]` and a closing comment, paced by `pace`.
fn stream_answer(answer: Answer, pace: Pace, guard: CancelGuard) -> Response {
    let Pace {
        hang_after,
        hold_after,
        delay,
        state,
    } = pace;
    let answer = Arc::new(answer);
    let n = answer.ids.len();
    let steps = futures::stream::iter(0..=n).then(move |i| {
        let answer = answer.clone();
        let state = state.clone();
        async move {
            if hang_after == Some(i) {
                std::future::pending::<()>().await;
            }
            if hold_after == Some(i) {
                state.held.fetch_add(1, Ordering::SeqCst);
                state.held_notify.notify_waiters();
                wait_until(&state.release_notify, || {
                    state.released.load(Ordering::SeqCst)
                })
                .await;
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, Infallible>(answer.event(i))
        }
    });
    let body = steps
        .chain(futures::stream::once(async {
            Ok(bytes::Bytes::from_static(b"data: [DONE]\n\n"))
        }))
        .chain(futures::stream::once(async move {
            let mut g = guard;
            g.finished = true;
            drop(g);
            Ok(bytes::Bytes::from_static(b": end\n\n"))
        }));
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}
