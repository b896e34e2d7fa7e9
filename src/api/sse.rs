//! Server-Sent Events plumbing shared by the streaming endpoints: a response
//! whose events come from one plain async loop (`stream::run`), the usage
//! object, and the chunk head of OpenAI's chat and completions streams. The loop runs in a task; when the client goes
//! away the task is aborted, which drops the running call and so cancels the
//! backends if the last token has not arrived (see `call`). A client that
//! stays connected but stops reading is treated as gone once a chunk has
//! waited `[server] sse_send_timeout_s` for room.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value as Json;
use tokio::sync::mpsc;

/// Where an endpoint's stream loop writes; a failed send means the client
/// left (or stopped reading).
pub struct SseSender {
    tx: mpsc::Sender<Event>,
    send_timeout: Duration,
}

/// The client has gone; stop the loop.
pub struct Gone;

impl SseSender {
    async fn send(&self, ev: Event) -> Result<(), Gone> {
        match tokio::time::timeout(self.send_timeout, self.tx.send(ev)).await {
            Ok(sent) => sent.map_err(|_| Gone),
            Err(_) => {
                crate::metrics::sse_send_timeout();
                tracing::warn!(
                    after_s = self.send_timeout.as_secs(),
                    "stream client stopped reading; ending the stream"
                );
                Err(Gone)
            }
        }
    }

    /// Sends one event of a surface's stream.
    pub async fn send_out(&self, out: &super::stream::Out) -> Result<(), Gone> {
        let mut ev = Event::default().data(&out.data);
        if let Some(name) = out.event {
            ev = ev.event(name);
        }
        self.send(ev).await
    }
}

/// An SSE response fed by `run`, with `headers` added.
pub fn sse_response<F, Fut>(
    state: &super::AppState,
    headers: axum::http::HeaderMap,
    run: F,
) -> Response
where
    F: FnOnce(SseSender) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(32);
    let send_timeout = Duration::from_secs(state.config.server.sse_send_timeout_s);
    // In the request's span: its log lines carry the request id.
    let task = tokio::spawn(tracing::Instrument::in_current_span(run(SseSender {
        tx,
        send_timeout,
    })));
    let events =
        crate::backend::AbortOnDrop::new(tokio_stream::wrappers::ReceiverStream::new(rx), task);
    let mut resp = Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response();
    resp.headers_mut().extend(headers);
    resp
}

/// What every chunk of one streamed answer repeats: `id` aside, the object
/// name, creation time, model and system fingerprint.
pub struct ChunkHead {
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub fingerprint: String,
}

impl ChunkHead {
    /// `model`: the id the request was served as (the model or an adapter).
    pub fn new(state: &super::AppState, object: &'static str, created: u64, model: &str) -> Self {
        ChunkHead {
            object,
            created,
            model: model.to_string(),
            fingerprint: state.system_fingerprint(),
        }
    }

    pub fn chunk(&self, id: &str, choices: Json) -> Json {
        serde_json::json!({"id": id, "object": self.object, "created": self.created,
            "model": self.model, "system_fingerprint": self.fingerprint, "choices": choices})
    }

    /// Each choice's finish chunk (`finish(index, reason)` makes the choice
    /// object; its `stop_reason` is added here), then the usage chunk when
    /// `with_usage`.
    pub fn end(
        &self,
        answer: &crate::call::Answer,
        with_usage: bool,
        finish: impl Fn(u32, &'static str) -> Json,
    ) -> Vec<Json> {
        let id = &answer.request_id;
        let mut out: Vec<Json> = answer
            .choices
            .iter()
            .map(|r| {
                let mut choice = finish(r.index, r.finish_reason);
                choice["stop_reason"] = r.stop_reason_json();
                self.chunk(id, Json::Array(vec![choice]))
            })
            .collect();
        if with_usage {
            let mut u = self.chunk(id, Json::Array(Vec::new()));
            u["usage"] = usage(answer.prompt_tokens(), answer.completion_tokens());
            out.push(u);
        }
        out
    }
}

/// The chunks of one OpenAI chat or completions stream: their head, what
/// the client asked to see (`S`, the endpoint's shape) and the tokenizer
/// its logprobs are written with.
pub struct Chunks<S> {
    pub head: ChunkHead,
    pub shape: S,
    pub renderer: std::sync::Arc<crate::render::Renderer>,
}

impl<S> Chunks<S> {
    pub fn new(
        state: &super::AppState,
        object: &'static str,
        created: u64,
        model: &str,
        shape: S,
    ) -> Self {
        Chunks {
            head: ChunkHead::new(state, object, created, model),
            shape,
            renderer: state.renderer.clone(),
        }
    }

    pub fn chunk(&self, id: &str, choices: Json) -> Json {
        self.head.chunk(id, choices)
    }
}

/// OpenAI `usage` object.
pub fn usage(prompt: usize, completion: usize) -> Json {
    serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}
