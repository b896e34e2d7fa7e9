//! An in-process backend on vLLM 0.33's wire that generates at a fixed
//! token rate, for the weight-update bench. Every stream emits its tokens
//! on a schedule (token `k` is due `k` intervals after the request
//! arrived, a chunk holding `chunk` tokens), so a late timer wake-up does
//! not slow the rate down. It honours what an update sends:
//!
//! - `POST /pause?mode=abort` ends every running stream with a last chunk
//!   `finish_reason: "abort"` and no token; `mode=wait` lets them finish.
//!   Either answers once no stream runs; new `/v1/completions` get a 503
//!   until `POST /resume`.
//! - `/start_weight_update`, `/finish_weight_update` answer their message,
//!   `/reset_prefix_cache` answers `{"success": true}`.
//!
//! It counts the tokens it generated, and those of streams whose request
//! the gateway sent again (it withdraws a request still waiting for its
//! first token when an update begins, and routes it again after).
//!
//! Sampled token `k` of a request is `b'a' + (position % 26)` (one byte of
//! text under the test tokenizer), logprob -0.5.

use std::collections::HashMap;
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
use tokio::time::Instant;

struct Paced {
    interval: Duration,
    chunk: usize,
    paused: AtomicBool,
    /// Bumped by every abort: running streams end.
    aborts: watch::Sender<u64>,
    running: AtomicUsize,
    /// Woken whenever a stream ends.
    ended: Notify,
    generated: AtomicU64,
    /// Every ended stream: request id, arrival number, tokens generated.
    ended_streams: Mutex<Vec<(String, u64, u64)>>,
}

pub struct PacedVllm {
    pub addr: std::net::SocketAddr,
    state: Arc<Paced>,
}

impl PacedVllm {
    /// Serves on a free loopback port: one token every `interval` per
    /// stream, `chunk` tokens a chunk.
    pub async fn start(interval: Duration, chunk: usize) -> PacedVllm {
        let state = Arc::new(Paced {
            interval,
            chunk: chunk.max(1),
            paused: AtomicBool::new(false),
            aborts: watch::Sender::new(0),
            running: AtomicUsize::new(0),
            ended: Notify::new(),
            generated: AtomicU64::new(0),
            ended_streams: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/v1/completions", post(completions))
            .fallback(post(admin))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("mock serves");
        });
        PacedVllm { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Tokens generated so far, all streams.
    pub fn generated(&self) -> u64 {
        self.state.generated.load(Ordering::SeqCst)
    }

    /// Waits until no stream runs.
    pub async fn idle(&self) {
        wait_idle(&self.state).await;
    }
}

/// Ended streams, on any of `mocks`, whose request the gateway sent again
/// later (same `request_id`, to the same backend or another): how many,
/// and the tokens they had generated, which no answer holds.
pub fn superseded(mocks: &[PacedVllm]) -> (u64, u64) {
    let ended: Vec<(String, u64, u64)> = mocks
        .iter()
        .flat_map(|m| m.state.ended_streams.lock().expect("lock").clone())
        .collect();
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (id, arrival, _) in &ended {
        let l = last.entry(id.as_str()).or_default();
        *l = (*l).max(*arrival);
    }
    ended
        .iter()
        .filter(|(id, arrival, _)| last.get(id.as_str()).is_some_and(|l| arrival < l))
        .fold((0, 0), |(n, t), (_, _, sent)| (n + 1, t + sent))
}

/// Numbers generation requests in arrival order, over every mock.
static ARRIVALS: AtomicU64 = AtomicU64::new(0);

async fn wait_idle(s: &Paced) {
    loop {
        let ended = s.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if s.running.load(Ordering::SeqCst) == 0 {
            return;
        }
        ended.await;
    }
}

/// Counts a stream as running until dropped (ended, or its client left).
struct Running(Arc<Paced>);

impl Running {
    fn new(s: Arc<Paced>) -> Running {
        s.running.fetch_add(1, Ordering::SeqCst);
        Running(s)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

/// Where one stream is.
struct Gen {
    run: Running,
    id: String,
    arrival: u64,
    aborts: watch::Receiver<u64>,
    start: Instant,
    prompt_len: usize,
    max_tokens: usize,
    sent: usize,
    done: bool,
}

impl Drop for Gen {
    fn drop(&mut self) {
        let ended = (std::mem::take(&mut self.id), self.arrival, self.sent as u64);
        let s = &self.run.0;
        s.ended_streams.lock().expect("lock").push(ended);
    }
}

fn chunk_json(ids: &[u32], lps: &[f32], finish: Option<&str>, prompt: Option<&[u32]>) -> String {
    let tokens: Vec<String> = ids.iter().map(|id| format!("token_id:{id}")).collect();
    let top: Vec<Value> = tokens
        .iter()
        .zip(lps)
        .map(|(t, lp)| json!({ t.as_str(): lp }))
        .collect();
    let mut choice = json!({"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
        "logprobs": {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top,
            "text_offset": vec![0; ids.len()]}});
    if let Some(p) = prompt {
        choice["prompt_token_ids"] = json!(p);
    }
    format!(
        "data: {}\n\n",
        json!({"id": "cmpl-paced", "object": "text_completion", "choices": [choice]})
    )
}

async fn completions(State(s): State<Arc<Paced>>, Json(body): Json<Value>) -> Response {
    // Subscribed before the pause is read: an abort after this point is seen.
    let mut aborts = s.aborts.subscribe();
    aborts.borrow_and_update();
    if s.paused.load(Ordering::SeqCst) {
        // vLLM 0.33 refuses new requests while paused.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({"error": {"message": "Generation is paused. Please retry after it resumes.",
                "type": "ServiceUnavailableError", "code": 503}}),
            ),
        )
            .into_response();
    }
    let prompt: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap_or_default();
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16) as usize;
    let gen = Gen {
        id: body["request_id"].as_str().unwrap_or("").to_string(),
        arrival: ARRIVALS.fetch_add(1, Ordering::SeqCst),
        run: Running::new(s),
        aborts,
        start: Instant::now(),
        prompt_len: prompt.len(),
        max_tokens,
        sent: 0,
        done: false,
    };
    let mut prompt = Some(prompt);
    let events = futures::stream::unfold(gen, move |mut g| {
        let prompt = prompt.take();
        async move {
            if g.done {
                return None;
            }
            let s = g.run.0.clone();
            let n = s.chunk.min(g.max_tokens - g.sent);
            let due = g.start + s.interval * (g.sent + n) as u32;
            let aborted = tokio::select! {
                _ = tokio::time::sleep_until(due) => g.aborts.has_changed().unwrap_or(true),
                _ = g.aborts.changed() => true,
            };
            if aborted || n == 0 {
                g.done = true;
                let finish = if aborted { "abort" } else { "length" };
                let last = chunk_json(&[], &[], Some(finish), prompt.as_deref());
                return Some((last, g));
            }
            let ids: Vec<u32> = (g.sent..g.sent + n)
                .map(|k| u32::from(b'a' + ((g.prompt_len + k) % 26) as u8))
                .collect();
            g.sent += n;
            s.generated.fetch_add(n as u64, Ordering::SeqCst);
            // vLLM puts the finish on the chunk of the last token.
            g.done = g.sent == g.max_tokens;
            let finish = g.done.then_some("length");
            let text = chunk_json(&ids, &vec![-0.5; n], finish, prompt.as_deref());
            Some((text, g))
        }
    });
    use futures::StreamExt;
    let body = events
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

async fn admin(State(s): State<Arc<Paced>>, uri: axum::http::Uri) -> Response {
    let query = uri.query().unwrap_or("");
    let answer = match uri.path() {
        "/pause" => {
            s.paused.store(true, Ordering::SeqCst);
            if query.contains("mode=abort") {
                s.aborts.send_modify(|n| *n += 1);
            }
            wait_idle(&s).await;
            json!({"status": "paused"})
        }
        "/resume" => {
            s.paused.store(false, Ordering::SeqCst);
            json!({"status": "resumed"})
        }
        "/start_weight_update" => json!({"message": "Weight update started"}),
        "/finish_weight_update" => json!({"message": "Weight update finished"}),
        "/reset_prefix_cache" => json!({"success": true}),
        _ => return (StatusCode::NOT_FOUND, "no such route").into_response(),
    };
    Json(answer).into_response()
}
