//! The one stream pump of the HTTP backends. vLLM and SGLang are always asked
//! to stream; this module sends the request, reads the SSE body and turns
//! each `data:` payload into [`GenEvent`]s through a per-backend
//! [`EventDecoder`], under one timeout policy:
//!
//! - sending the request and waiting for the *first* decoded event is bounded
//!   by [`StreamTimeouts::first_token`] (`[router] first_token_timeout_ms`);
//! - every later wait for the next event by [`StreamTimeouts::idle`]
//!   (`[router] idle_stream_timeout_ms`).
//!
//! Bytes that decode to no event (SSE comments, keep-alives, a cumulative
//! chunk with nothing new) do not reset either clock. A timeout is
//! [`BackendError::Timeout`]. `data: [DONE]` or the end of the body ends the
//! stream; ending before a `Done` event is a protocol error.
//!
//! Dropping the returned stream before its `Done` event closes the upstream
//! connection, which cancels the request on the backend. After `Done` the
//! pump reads the body to its end (bounded by the idle timeout and a byte
//! cap) so the connection can go back to the pool.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::sse::SseDecoder;
use super::{BackendError, GenEvent, GenStream};
use crate::config::RouterConfig;

/// How a backend's SSE `data:` payload becomes events. One impl per backend.
pub trait EventDecoder: Send + 'static {
    /// Decodes one `data:` payload (never `[DONE]`, which the pump handles).
    /// May return no event (nothing new yet). An error ends the stream.
    fn on_data(&mut self, data: &str) -> Result<Vec<GenEvent>, BackendError>;
}

/// The two deadlines of one streamed backend call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTimeouts {
    /// From sending the request to the first decoded event.
    pub first_token: Duration,
    /// Between two decoded events after the first.
    pub idle: Duration,
}

impl StreamTimeouts {
    pub fn from_router(router: &RouterConfig) -> Self {
        StreamTimeouts {
            first_token: Duration::from_millis(router.first_token_timeout_ms),
            idle: Duration::from_millis(router.idle_stream_timeout_ms),
        }
    }
}

/// Events buffered between the pump task and the consumer.
const CHANNEL_CAPACITY: usize = 64;

/// At most this many bytes are read after `Done` while draining the body.
const DRAIN_LIMIT: usize = 1 << 20;

/// Sends `request`, checks its status and pumps the body through `decoder`.
/// The first-token clock starts here, before the request is sent: a backend
/// that never answers fails with `Timeout` from this call, one that answers
/// but never produces an event fails with `Timeout` from the stream.
pub async fn send_and_pump<D: EventDecoder>(
    backend: &str,
    request: reqwest::RequestBuilder,
    timeouts: StreamTimeouts,
    decoder: D,
) -> Result<GenStream, BackendError> {
    let first_deadline = Instant::now() + timeouts.first_token;
    let resp = tokio::time::timeout_at(first_deadline, request.send())
        .await
        .map_err(|_| super::timeout(backend, "no response before the first-token timeout"))?
        .map_err(|e| super::map_reqwest(backend, e))?;
    let resp = tokio::time::timeout_at(first_deadline, super::check_status(backend, resp))
        .await
        .map_err(|_| super::timeout(backend, "no error body before the first-token timeout"))??;
    Ok(pump(backend, resp, first_deadline, timeouts.idle, decoder))
}

/// Pumps an already status-checked streaming response: the first event must
/// arrive by `first_deadline`, each later one within `idle` of the previous.
pub fn pump<D: EventDecoder>(
    backend: &str,
    resp: reqwest::Response,
    first_deadline: Instant,
    idle: Duration,
    decoder: D,
) -> GenStream {
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let out = Out {
        backend: backend.to_string(),
        tx,
    };
    // In the caller's span (the request's): log lines carry its id.
    let task = run(out, resp, first_deadline, idle, decoder);
    tokio::spawn(tracing::Instrument::in_current_span(task));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The pump task: reads, decodes and sends until `Done`, an error, or the
/// consumer dropping the stream.
async fn run<D: EventDecoder>(
    out: Out,
    resp: reqwest::Response,
    first_deadline: Instant,
    idle: Duration,
    mut decoder: D,
) {
    let mut body = resp.bytes_stream();
    let mut sse = SseDecoder::default();
    let mut deadline = first_deadline;
    let mut any_event = false;
    loop {
        let chunk = match out.read(&mut body, deadline, any_event).await {
            Read::Chunk(c) => c,
            Read::End => break,
            Read::Failed(e) => return out.fail(e).await,
            // Returning drops `body`: the connection closes, the backend
            // cancels the request.
            Read::Gone => return,
        };
        sse.push(&chunk);
        while let Some(data) = sse.next_event() {
            if data.trim() == "[DONE]" {
                return out.fail(out.ended("[DONE]")).await;
            }
            let events = match decoder.on_data(&data) {
                Ok(events) => events,
                Err(e) => return out.fail(e).await,
            };
            if events.is_empty() {
                continue;
            }
            for ev in events {
                let done = matches!(ev, GenEvent::Done { .. });
                if out.tx.send(Ok(ev)).await.is_err() {
                    return;
                }
                if done {
                    drop(out);
                    drain(body, idle).await;
                    return;
                }
            }
            any_event = true;
            // The idle clock runs while waiting on the backend only, not
            // while a slow consumer keeps the channel full.
            deadline = Instant::now() + idle;
        }
    }
    out.fail(out.ended("the end of the body")).await;
}

/// The sending side of a pump, and the backend's name for its errors.
struct Out {
    backend: String,
    tx: mpsc::Sender<Result<GenEvent, BackendError>>,
}

/// What reading the next chunk of the body gave.
enum Read {
    Chunk(bytes::Bytes),
    End,
    Failed(BackendError),
    /// The consumer dropped the stream.
    Gone,
}

impl Out {
    /// The next body chunk, unless the deadline passes or the consumer goes.
    async fn read<S>(&self, body: &mut S, deadline: Instant, any_event: bool) -> Read
    where
        S: futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    {
        tokio::select! {
            _ = self.tx.closed() => Read::Gone,
            next = tokio::time::timeout_at(deadline, body.next()) => match next {
                Err(_) => Read::Failed(super::timeout(
                    &self.backend,
                    if any_event {
                        "no event within the idle stream timeout"
                    } else {
                        "no token before the first-token timeout"
                    },
                )),
                Ok(None) => Read::End,
                Ok(Some(Err(e))) => Read::Failed(super::map_reqwest(&self.backend, e)),
                Ok(Some(Ok(c))) => Read::Chunk(c),
            },
        }
    }

    fn ended(&self, how: &str) -> BackendError {
        BackendError::Protocol {
            backend: self.backend.clone(),
            message: format!("stream reached {how} without a finish_reason"),
        }
    }

    async fn fail(&self, e: BackendError) {
        // The consumer may be gone already; then nobody needs the error.
        let _ = self.tx.send(Err(e)).await;
    }
}

/// Reads what follows `Done` (a usage chunk, `[DONE]`, the end of a chunked
/// body) and discards it, so a well-behaved backend's connection is reused.
async fn drain<S>(mut body: S, idle: Duration)
where
    S: futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
{
    let mut read = 0usize;
    while read <= DRAIN_LIMIT {
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(Ok(c))) => read += c.len(),
            _ => return,
        }
    }
}
