//! An in-process model server whose weights have a version, on vLLM's or
//! SGLang's wire. Each sampled token and its logprob are a function of
//! (position in the sequence, weight version), so a test can tell which
//! weights generated each recorded token. It honours what a weight update
//! in `abort` mode sends, as the real servers answer it:
//!
//! - vLLM 0.33: `POST /pause?mode=abort` ends every running stream with a
//!   last chunk `finish_reason: "abort"` and no token; new requests get a
//!   503 until `POST /resume`; `/collective_rpc` `reload_weights` loads the
//!   version named by the last component of `weights_path`;
//!   `/finish_weight_update {"weight_version"}` sets the version.
//! - SGLang 0.5.23: `POST /pause_generation {"mode": "abort"}` ends every
//!   running stream with `finish_reason: {"type": "abort"}`; new requests
//!   wait until `/continue_generation`; `/update_weights_from_disk
//!   {"weight_version"}` sets the version.
//!
//! A stream can hold after k tokens until the next abort (a generation in
//! the middle of an update), and tokens can be paced (a fixed token rate).

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

/// Which server's wire the mock speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Vllm,
    Sglang,
}

/// The token and logprob at sequence position `pos` under `version`.
pub type TokenFn = dyn Fn(usize, &str) -> (u32, f32) + Send + Sync;

struct VState {
    wire: Wire,
    version: Mutex<String>,
    token: Box<TokenFn>,
    /// `true` while generation is paused.
    paused: watch::Sender<bool>,
    /// Bumped by every abort: running streams end.
    aborts: watch::Sender<u64>,
    hold_after: Mutex<Option<usize>>,
    held: AtomicUsize,
    held_changed: Notify,
    running: AtomicUsize,
    interval: Mutex<Duration>,
    requests: Mutex<Vec<Value>>,
    log: Mutex<Vec<String>>,
    /// Tokens generated under each version, all requests together.
    generated: Mutex<std::collections::BTreeMap<String, u64>>,
    stopped: AtomicU64,
    keep_seen: AtomicBool,
    /// Tokens generated, all versions; `progress` wakes at each.
    total: AtomicU64,
    progress: Notify,
    /// What `GET /version` (vLLM) or `/server_info` (SGLang) says.
    server_version: Mutex<String>,
    /// Times the version was asked; `asked` wakes at each.
    version_asked: AtomicUsize,
    asked: Notify,
    /// Ends every hold without an abort.
    released: Notify,
}

pub struct VersionedMock {
    pub addr: std::net::SocketAddr,
    state: Arc<VState>,
}

impl VersionedMock {
    /// Serves on a free loopback port, with weights `version`.
    pub async fn start(wire: Wire, version: &str, token: Box<TokenFn>) -> VersionedMock {
        let state = Arc::new(VState {
            wire,
            version: Mutex::new(version.to_string()),
            token,
            paused: watch::Sender::new(false),
            aborts: watch::Sender::new(0),
            hold_after: Mutex::new(None),
            held: AtomicUsize::new(0),
            held_changed: Notify::new(),
            running: AtomicUsize::new(0),
            interval: Mutex::new(Duration::ZERO),
            requests: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            generated: Mutex::new(Default::default()),
            stopped: AtomicU64::new(0),
            keep_seen: AtomicBool::new(false),
            total: AtomicU64::new(0),
            progress: Notify::new(),
            server_version: Mutex::new(match wire {
                Wire::Vllm => "0.33.0".to_string(),
                Wire::Sglang => "0.5.23".to_string(),
            }),
            version_asked: AtomicUsize::new(0),
            asked: Notify::new(),
            released: Notify::new(),
        });
        let app = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/version", get(vllm_version))
            .route("/server_info", get(sglang_info))
            .route("/v1/completions", post(vllm_completions))
            .route("/generate", post(sglang_generate))
            .fallback(post(admin))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("mock serves");
        });
        VersionedMock { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `[[backends]]` entry of this mock.
    pub fn backend_toml(&self) -> String {
        let kind = match self.state.wire {
            Wire::Vllm => "vllm",
            Wire::Sglang => "sglang",
        };
        format!(
            "[[backends]]\nurl = \"{}\"\nkind = \"{kind}\"\n",
            self.url()
        )
    }

    /// The version the server says it is (default vLLM 0.33.0, SGLang
    /// 0.5.23: both report per-token weight versions).
    pub fn set_server_version(&self, v: &str) {
        *self.state.server_version.lock().expect("lock") = v.to_string();
    }

    /// The trainer's transfer between `begin` and `commit` (NCCL / IPC on
    /// the real servers): the weights become `version`.
    pub fn push_weights(&self, version: &str) {
        *self.state.version.lock().expect("lock") = version.to_string();
    }

    pub fn version(&self) -> String {
        self.state.version.lock().expect("lock").clone()
    }

    /// Streams started from now on hold after `k` tokens until an abort.
    pub fn hold_after(&self, k: Option<usize>) {
        *self.state.hold_after.lock().expect("lock") = k;
    }

    /// Waits until `n` streams are holding.
    pub async fn wait_held(&self, n: usize) {
        loop {
            let changed = self.state.held_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.state.held.load(Ordering::SeqCst) >= n {
                return;
            }
            changed.await;
        }
    }

    /// Waits until `n` tokens were generated in all.
    pub async fn wait_generated(&self, n: u64) {
        loop {
            let more = self.state.progress.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            if self.state.total.load(Ordering::SeqCst) >= n {
                return;
            }
            more.await;
        }
    }

    /// Tokens generated in all.
    pub fn total(&self) -> u64 {
        self.state.total.load(Ordering::SeqCst)
    }

    /// Lets every holding stream go on (no abort).
    pub fn release_held(&self) {
        self.state.released.notify_waiters();
    }

    /// Waits until the gateway has asked the server's version.
    pub async fn wait_version_asked(&self) {
        loop {
            let asked = self.state.asked.notified();
            tokio::pin!(asked);
            asked.as_mut().enable();
            if self.state.version_asked.load(Ordering::SeqCst) > 0 {
                return;
            }
            asked.await;
        }
    }

    /// The pause between two tokens of a stream (a fixed token rate).
    pub fn set_interval(&self, d: Duration) {
        *self.state.interval.lock().expect("lock") = d;
    }

    /// Every generation request body, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.state.requests.lock().expect("lock").clone()
    }

    /// Admin requests, `path?query body`.
    pub fn log(&self) -> Vec<String> {
        self.state.log.lock().expect("lock").clone()
    }

    /// Streams ended by an abort so far.
    pub fn aborted(&self) -> u64 {
        self.state.stopped.load(Ordering::SeqCst)
    }

    /// Tokens generated per version.
    pub fn generated(&self) -> std::collections::BTreeMap<String, u64> {
        self.state.generated.lock().expect("lock").clone()
    }
}

/// One sampled token, and the finish when it is the last (the real servers
/// send a natural finish on the last token's chunk).
type Sampled = (u32, f32, String, Option<&'static str>);

/// What one generation request asks.
struct Ask {
    prompt: Vec<u32>,
    max_tokens: usize,
    stop_ids: Vec<u32>,
}

/// `[{"version", "start", "end"}]` over a stream's tokens, as vLLM 0.33
/// and SGLang 0.5.20 report them on the last chunk.
fn spans(versions: &[String]) -> Value {
    let mut out: Vec<Value> = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        match out.last_mut() {
            Some(last) if last["version"] == v.as_str() => last["end"] = json!(i + 1),
            _ => out.push(json!({"version": v, "start": i, "end": i + 1})),
        }
    }
    json!(out)
}

/// Generates the stream of `ask`: each item is `(id, logprob)`, and the
/// last one the finish (`stop`, `length`, `abort`).
fn generation(
    s: Arc<VState>,
    ask: Ask,
) -> impl futures::Stream<Item = Result<Sampled, &'static str>> + Send {
    let hold = *s.hold_after.lock().expect("lock");
    let interval = *s.interval.lock().expect("lock");
    let mut aborts = s.aborts.subscribe();
    aborts.borrow_and_update();
    s.running.fetch_add(1, Ordering::SeqCst);
    let state = Some((s, ask, aborts, 0usize, false));
    futures::stream::unfold(state, move |state| async move {
        let (s, ask, mut aborts, k, stopped) = state?;
        let end = |s: Arc<VState>, finish: &'static str| {
            if finish == "abort" {
                s.stopped.fetch_add(1, Ordering::SeqCst);
            }
            s.running.fetch_sub(1, Ordering::SeqCst);
            Some((Err(finish), None))
        };
        if stopped {
            return end(s, "stop");
        }
        if aborts.has_changed().unwrap_or(true) {
            return end(s, "abort");
        }
        if k >= ask.max_tokens {
            return end(s, "length");
        }
        if hold == Some(k) {
            let aborted = {
                let released = s.released.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                s.held.fetch_add(1, Ordering::SeqCst);
                s.held_changed.notify_waiters();
                let aborted = tokio::select! {
                    _ = aborts.changed() => true,
                    () = released => false,
                };
                s.held.fetch_sub(1, Ordering::SeqCst);
                aborted
            };
            if aborted {
                return end(s, "abort");
            }
        }
        // Paused in place (vLLM `keep`, SGLang `retract`): wait for the
        // resume, then go on with whatever weights are served then.
        let mut paused = s.paused.subscribe();
        tokio::select! {
            _ = paused.wait_for(|p| !*p) => {}
            _ = aborts.changed() => return end(s, "abort"),
        }
        if interval.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = aborts.changed() => return end(s, "abort"),
            }
        }
        let version = s.version.lock().expect("lock").clone();
        let (id, lp) = (s.token)(ask.prompt.len() + k, &version);
        *s.generated
            .lock()
            .expect("lock")
            .entry(version.clone())
            .or_default() += 1;
        s.total.fetch_add(1, Ordering::SeqCst);
        s.progress.notify_waiters();
        let finish = if ask.stop_ids.contains(&id) {
            Some("stop")
        } else if k + 1 >= ask.max_tokens {
            Some("length")
        } else {
            None
        };
        if finish.is_some() {
            s.running.fetch_sub(1, Ordering::SeqCst);
            return Some((Ok((id, lp, version, finish)), None));
        }
        Some((
            Ok((id, lp, version, None)),
            Some((s, ask, aborts, k + 1, false)),
        ))
    })
}

fn sse(body: impl futures::Stream<Item = String> + Send + 'static) -> Response {
    use futures::StreamExt;
    let body = body
        .chain(futures::stream::once(async {
            "data: [DONE]\n\n".to_string()
        }))
        .map(Ok::<_, std::convert::Infallible>);
    (
        [("content-type", "text/event-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

async fn vllm_completions(State(s): State<Arc<VState>>, Json(body): Json<Value>) -> Response {
    s.requests.lock().expect("lock").push(body.clone());
    if *s.paused.borrow() && !s.keep_seen.load(Ordering::SeqCst) {
        // vLLM 0.33 refuses new requests while paused in `abort` / `wait`
        // (and queues them in `keep`).
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({"error": {"message": "Generation is paused. Please retry after it resumes.",
                "type": "ServiceUnavailableError", "code": 503}}),
            ),
        )
            .into_response();
    }
    let ask = Ask {
        prompt: serde_json::from_value(body["prompt"].clone()).unwrap_or_default(),
        max_tokens: body["max_tokens"].as_u64().unwrap_or(16) as usize,
        stop_ids: serde_json::from_value(body["stop_token_ids"].clone()).unwrap_or_default(),
    };
    let prompt = ask.prompt.clone();
    let mut first = true;
    let report = body["return_weight_versions"] == json!(true);
    let mut versions: Vec<String> = Vec::new();
    use futures::StreamExt;
    let events = generation(s, ask).map(move |item| {
        if let Ok((_, _, v, _)) = &item {
            versions.push(v.clone());
        }
        let mut choice = match item {
            Ok((id, lp, _, finish)) => json!({"index": 0, "text": "x", "token_ids": [id], "finish_reason": finish,
                "logprobs": {"tokens": [format!("token_id:{id}")], "token_logprobs": [lp],
                    "top_logprobs": [{format!("token_id:{id}"): lp}], "text_offset": [0]}}),
            // The last chunk carries the finish and no token.
            Err(finish) => json!({"index": 0, "text": "", "token_ids": [], "finish_reason": finish,
                "logprobs": {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}}),
        };
        if std::mem::take(&mut first) {
            choice["prompt_token_ids"] = json!(prompt);
        }
        if report && !choice["finish_reason"].is_null() {
            choice["weight_versions"] = spans(&versions);
        }
        format!("data: {}\n\n", json!({"id": "cmpl-v", "object": "text_completion", "choices": [choice]}))
    });
    sse(events)
}

async fn sglang_generate(State(s): State<Arc<VState>>, Json(body): Json<Value>) -> Response {
    s.requests.lock().expect("lock").push(body.clone());
    // SGLang holds new requests while paused, then runs them.
    let mut paused = s.paused.subscribe();
    let _ = paused.wait_for(|p| !*p).await;
    let sp = &body["sampling_params"];
    let ask = Ask {
        prompt: serde_json::from_value(body["input_ids"].clone()).unwrap_or_default(),
        max_tokens: sp["max_new_tokens"].as_u64().unwrap_or(16) as usize,
        stop_ids: serde_json::from_value(sp["stop_token_ids"].clone()).unwrap_or_default(),
    };
    let prompt_tokens = ask.prompt.len();
    let mut ids: Vec<u32> = Vec::new();
    let mut lps: Vec<Value> = Vec::new();
    let mut versions: Vec<String> = Vec::new();
    use futures::StreamExt;
    // Default (cumulative) streaming: every chunk has all ids so far.
    let events = generation(s, ask).map(move |item| {
        let finish = match item {
            Ok((id, lp, v, finish)) => {
                ids.push(id);
                lps.push(json!([lp, id, null]));
                versions.push(v);
                finish.map_or(Value::Null, |f| json!({"type": f}))
            }
            Err("abort") => json!({"type": "abort", "message": "Aborted", "status_code": null, "err_type": null}),
            Err(f) => json!({"type": f}),
        };
        let mut out = json!({"text": "", "output_ids": ids, "meta_info": {
            "prompt_tokens": prompt_tokens, "completion_tokens": ids.len(),
            "output_token_logprobs": lps, "finish_reason": finish}});
        if !out["meta_info"]["finish_reason"].is_null() {
            out["meta_info"]["weight_versions"] = spans(&versions);
        }
        format!("data: {out}\n\n")
    });
    sse(events)
}

async fn vllm_version(State(s): State<Arc<VState>>) -> Response {
    s.version_asked.fetch_add(1, Ordering::SeqCst);
    s.asked.notify_waiters();
    match s.wire {
        Wire::Vllm => ok(json!({"version": s.server_version.lock().expect("lock").clone()})),
        Wire::Sglang => (StatusCode::NOT_FOUND, "no such route").into_response(),
    }
}

async fn sglang_info(State(s): State<Arc<VState>>) -> Response {
    s.version_asked.fetch_add(1, Ordering::SeqCst);
    s.asked.notify_waiters();
    match s.wire {
        Wire::Sglang => ok(json!({"version": s.server_version.lock().expect("lock").clone()})),
        Wire::Vllm => (StatusCode::NOT_FOUND, "no such route").into_response(),
    }
}

fn ok(v: Value) -> Response {
    Json(v).into_response()
}

async fn admin(
    State(s): State<Arc<VState>>,
    uri: axum::http::Uri,
    body: axum::body::Bytes,
) -> Response {
    let text = String::from_utf8_lossy(&body).to_string();
    s.log
        .lock()
        .expect("lock")
        .push(format!("{uri} {text}").trim_end().to_string());
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let query = uri.query().unwrap_or("");
    let abort = |s: &VState| {
        s.aborts.send_modify(|n| *n += 1);
    };
    match (s.wire, uri.path()) {
        (Wire::Vllm, "/pause") => {
            s.keep_seen
                .store(query.contains("mode=keep"), Ordering::SeqCst);
            s.paused.send_replace(true);
            if query.contains("mode=abort") {
                abort(&s);
            }
            ok(json!({"status": "paused"}))
        }
        (Wire::Vllm, "/resume") => {
            s.paused.send_replace(false);
            ok(json!({"status": "resumed"}))
        }
        (Wire::Vllm, "/collective_rpc") => {
            let path = v["kwargs"]["weights_path"].as_str().unwrap_or("");
            let version = path.rsplit('/').next().unwrap_or("").to_string();
            *s.version.lock().expect("lock") = version;
            ok(json!({"results": [null]}))
        }
        (Wire::Vllm, "/reset_prefix_cache") => ok(json!({"success": true})),
        (_, "/update_weight_version") => {
            if let Some(version) = v["new_version"].as_str() {
                *s.version.lock().expect("lock") = version.to_string();
            }
            ok(json!({"success": true, "new_version": v["new_version"]}))
        }
        (Wire::Vllm, "/start_weight_update") => ok(json!({"message": "Weight update started"})),
        (Wire::Vllm, "/finish_weight_update") => {
            if let Some(version) = v["weight_version"].as_str() {
                *s.version.lock().expect("lock") = version.to_string();
            }
            ok(json!({"message": "Weight update finished"}))
        }
        (Wire::Sglang, "/pause_generation") => {
            s.keep_seen.store(v["mode"] == "retract", Ordering::SeqCst);
            s.paused.send_replace(true);
            if v["mode"] == "abort" || v["mode"].is_null() {
                abort(&s);
            }
            ok(json!({"message": "Generation paused successfully.", "status": "ok"}))
        }
        (Wire::Sglang, "/continue_generation") => {
            s.paused.send_replace(false);
            ok(json!({"message": "Generation continued successfully.", "status": "ok"}))
        }
        (Wire::Sglang, "/update_weights_from_disk") => {
            if let Some(version) = v["weight_version"].as_str() {
                *s.version.lock().expect("lock") = version.to_string();
            }
            ok(
                json!({"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0}),
            )
        }
        _ => (StatusCode::NOT_FOUND, "no such route").into_response(),
    }
}
