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
//! chunk with nothing new) do not reset either clock. Both run only while the
//! consumer waits: the idle clock starts when it asks for the next event, and
//! a deadline found passed just as bytes that waited for it are read starts
//! over (the consumer was away, not the backend). A timeout is
//! [`BackendError::Timeout`]. `data: [DONE]` or the end of the body ends the
//! stream; ending before a `Done` event is a protocol error.
//!
//! Dropping the returned stream before its `Done` event closes the upstream
//! connection, which cancels the request on the backend. After `Done` the
//! pump reads the body to its end (bounded by the idle timeout and a byte
//! cap) so the connection can go back to the pool.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

use super::http::HttpBackend;
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

/// At most this many bytes are read after `Done` while draining the body.
const DRAIN_LIMIT: usize = 1 << 20;

/// At most this many bytes of an error answer are read for its message.
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// Sends `body` as JSON to `path`, checks the answer's status and pumps its
/// body through `decoder`. The first-token clock starts here, before the
/// request is sent: a backend that never answers fails with `Timeout` from
/// this call, one that answers but never produces an event fails with
/// `Timeout` from the stream.
pub async fn send_and_pump<D: EventDecoder + Unpin>(
    http: &HttpBackend,
    path: &str,
    body: &impl serde::Serialize,
    decoder: D,
) -> Result<GenStream, BackendError> {
    let backend = http.name();
    let timeouts = http.timeouts();
    let first_deadline = Instant::now() + timeouts.first_token;
    let body = serde_json::to_vec(body).map_err(|e| BackendError::Protocol {
        backend: backend.to_string(),
        message: format!("cannot write the request: {e}"),
    })?;
    let (status, mut resp) = tokio::time::timeout_at(first_deadline, http.post_stream(path, body))
        .await
        .map_err(|_| super::timeout(backend, "no response before the first-token timeout"))??;
    if !(200..300).contains(&status) {
        let mut text = Vec::new();
        let read = async {
            while let Some(Ok(chunk)) = resp.next().await {
                text.extend_from_slice(&chunk);
                if text.len() > ERROR_BODY_LIMIT {
                    break;
                }
            }
        };
        tokio::time::timeout_at(first_deadline, read)
            .await
            .map_err(|_| super::timeout(backend, "no error body before the first-token timeout"))?;
        let text = String::from_utf8_lossy(&text);
        return Err(super::status_error(
            backend,
            status,
            super::error_message(&text),
        ));
    }
    Ok(pump(backend, resp, first_deadline, timeouts.idle, decoder))
}

/// Pumps an already status-checked streaming response: the first event must
/// arrive by `first_deadline`, each later one within `idle` of the consumer
/// asking for it.
///
/// The stream decodes in its consumer's task, as the consumer polls it: no
/// task or channel of its own sits between the body and the call, so an
/// event costs no hand-off between tasks.
pub fn pump<D: EventDecoder + Unpin>(
    backend: &str,
    body: Body,
    first_deadline: Instant,
    idle: Duration,
    decoder: D,
) -> GenStream {
    Box::pin(Pump {
        backend: backend.to_string(),
        body: Some(body),
        sse: SseDecoder::default(),
        decoder,
        deadline: Box::pin(tokio::time::sleep_until(first_deadline)),
        idle,
        any_event: false,
        rearm: false,
        ready: VecDeque::new(),
        failed: None,
    })
}

/// An answer's body, as it is read.
pub type Body = Pin<Box<dyn Stream<Item = Result<bytes::Bytes, BackendError>> + Send>>;

/// One streamed backend call, read as its consumer polls.
struct Pump<D> {
    backend: String,
    /// `None` once the body has ended, failed, or gone to the drain after
    /// `Done`: nothing then follows `ready` (and `failed`).
    body: Option<Body>,
    sse: SseDecoder,
    decoder: D,
    /// The first-token deadline, then the idle one.
    deadline: Pin<Box<Sleep>>,
    idle: Duration,
    any_event: bool,
    /// Events were handed out: the idle clock restarts at the next wait.
    rearm: bool,
    /// Decoded, not yet handed out (one chunk may hold several events).
    ready: VecDeque<GenEvent>,
    /// What ends the stream once `ready` is handed out.
    failed: Option<BackendError>,
}

impl<D: EventDecoder> Pump<D> {
    /// Ends the stream with `e`, after the events already decoded. Dropping
    /// the body closes the connection: the backend cancels the request.
    fn fail(&mut self, e: BackendError) {
        self.body = None;
        self.failed = Some(e);
    }

    fn ended_without_finish(&self, how: &str) -> BackendError {
        BackendError::Protocol {
            backend: self.backend.clone(),
            message: format!("stream reached {how} without a finish_reason"),
        }
    }

    /// Decodes every complete SSE event of the buffer into `ready`; on
    /// `Done` reads the rest of the body, or hands it to the drain if it has
    /// not all come. An error ends the stream.
    fn decode(&mut self, cx: &mut Context<'_>) -> Result<(), BackendError> {
        while let Some(data) = self.sse.next_event() {
            if data.trim() == "[DONE]" {
                return Err(self.ended_without_finish("[DONE]"));
            }
            let events = self.decoder.on_data(data)?;
            if events.is_empty() {
                continue;
            }
            self.any_event = true;
            self.rearm = true;
            for ev in events {
                let done = matches!(ev, GenEvent::Done { .. });
                self.ready.push_back(ev);
                if done {
                    if let Some(body) = self.body.take() {
                        drain_now_or_later(body, self.idle, cx);
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

impl<D: EventDecoder + Unpin> Stream for Pump<D> {
    type Item = Result<GenEvent, BackendError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        // Bytes read in this poll: the consumer may have come back after
        // being away past the deadline, to data that waited for it.
        let mut read_now = false;
        loop {
            if let Some(ev) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(ev)));
            }
            let Some(body) = this.body.as_mut() else {
                return Poll::Ready(this.failed.take().map(Err));
            };
            if std::mem::take(&mut this.rearm) {
                // The idle clock runs while waiting on the backend only, not
                // while the consumer is busy with earlier events.
                this.deadline.as_mut().reset(Instant::now() + this.idle);
            }
            match body.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    read_now = true;
                    this.sse.push(&chunk);
                    if let Err(e) = this.decode(cx) {
                        this.fail(e);
                    }
                }
                Poll::Ready(Some(Err(e))) => this.fail(e),
                Poll::Ready(None) => {
                    let e = this.ended_without_finish("the end of the body");
                    this.fail(e);
                }
                Poll::Pending => {
                    if this.deadline.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    if std::mem::take(&mut read_now) {
                        // The deadline passed while bytes (a keep-alive, part
                        // of an event) sat unread: the consumer was away, not
                        // the backend. The wait starts now.
                        this.deadline.as_mut().reset(Instant::now() + this.idle);
                        continue;
                    }
                    let why = if this.any_event {
                        "no event within the idle stream timeout"
                    } else {
                        "no token before the first-token timeout"
                    };
                    let e = super::timeout(&this.backend, why);
                    this.fail(e);
                }
            }
        }
    }
}

/// Reads what follows `Done` (a usage chunk, `[DONE]`, the end of a chunked
/// body) and discards it, so a well-behaved backend's connection is reused:
/// what has already come at once, in the caller's task, the rest (if any) in
/// a task of its own.
fn drain_now_or_later(mut body: Body, idle: Duration, cx: &mut Context<'_>) {
    let mut read = 0usize;
    while read <= DRAIN_LIMIT {
        match body.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(c))) => read += c.len(),
            Poll::Ready(_) => return,
            Poll::Pending => break,
        }
    }
    if read <= DRAIN_LIMIT {
        tokio::spawn(drain(body, idle, read));
    }
}

async fn drain(mut body: Body, idle: Duration, mut read: usize) {
    while read <= DRAIN_LIMIT {
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(Ok(c))) => read += c.len(),
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FinishReason;

    /// `t N` is a token, `done` the finish, anything else an error.
    struct Lines;

    impl EventDecoder for Lines {
        fn on_data(&mut self, data: &str) -> Result<Vec<GenEvent>, BackendError> {
            match data.split_once(' ') {
                Some(("t", n)) => Ok(vec![GenEvent::Tokens {
                    ids: vec![n.parse().map_err(|_| protocol("bad id"))?],
                    logprobs: Vec::new(),
                }]),
                _ if data == "done" => Ok(vec![GenEvent::Done {
                    finish_reason: FinishReason::Stop,
                }]),
                _ if data == "nothing" => Ok(Vec::new()),
                _ => Err(protocol("bad chunk")),
            }
        }
    }

    fn protocol(message: &str) -> BackendError {
        BackendError::Protocol {
            backend: "b".into(),
            message: message.into(),
        }
    }

    /// A pump over a body sent in `chunks`, then held open (never ended).
    fn pumped(chunks: &[&'static str], idle: Duration) -> GenStream {
        let parts: Vec<Result<bytes::Bytes, BackendError>> = chunks
            .iter()
            .map(|c| Ok(bytes::Bytes::from_static(c.as_bytes())))
            .collect();
        let body = futures::stream::iter(parts).chain(futures::stream::pending());
        over(Box::pin(body), idle)
    }

    /// A pump over `body`, with `idle` as both deadlines.
    fn over(body: Body, idle: Duration) -> GenStream {
        pump("b", body, Instant::now() + idle, idle, Lines)
    }

    fn ids(ev: Option<Result<GenEvent, BackendError>>) -> Vec<u32> {
        match ev {
            Some(Ok(GenEvent::Tokens { ids, .. })) => ids,
            other => panic!("expected tokens, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn events_of_one_chunk_come_in_order_and_done_ends_the_stream() {
        let mut s = pumped(
            &[
                "data: t 1\n\ndata: t",
                " 2\n\ndata: nothing\n\ndata: done\n\ndata: t 9\n\n",
            ],
            Duration::from_secs(5),
        );
        assert_eq!(ids(s.next().await), vec![1]);
        assert_eq!(ids(s.next().await), vec![2]);
        assert!(matches!(s.next().await, Some(Ok(GenEvent::Done { .. }))));
        // What follows `Done` goes to the drain, not to the consumer.
        assert!(s.next().await.is_none());
    }

    #[tokio::test]
    async fn events_decoded_before_an_error_come_first() {
        let mut s = pumped(&["data: t 1\n\ndata: garbage\n\n"], Duration::from_secs(5));
        assert_eq!(ids(s.next().await), vec![1]);
        assert!(matches!(
            s.next().await,
            Some(Err(BackendError::Protocol { .. }))
        ));
        assert!(s.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_clock_restarts_when_the_consumer_asks_again() {
        let idle = Duration::from_millis(100);
        let mut s = pumped(&["data: t 1\n\n"], idle);
        assert_eq!(ids(s.next().await), vec![1]);
        // A consumer busy for longer than the idle timeout is not the
        // backend's silence: the clock starts at the next wait.
        tokio::time::advance(idle * 3).await;
        let t0 = Instant::now();
        match s.next().await {
            Some(Err(BackendError::Timeout { message, .. })) => {
                assert!(message.contains("idle"), "{message}");
            }
            other => panic!("expected an idle timeout, got {other:?}"),
        }
        assert_eq!(t0.elapsed(), idle);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_that_waited_for_an_absent_consumer_are_not_silence() {
        use futures::FutureExt;
        let idle = Duration::from_millis(100);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<bytes::Bytes, BackendError>>();
        let body = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut s = over(Box::pin(body), idle);
        let send = |text: &'static str| tx.send(Ok(bytes::Bytes::from_static(text.as_bytes())));
        send("data: t 1\n\n").expect("send");
        assert_eq!(ids(s.next().await), vec![1]);
        // The consumer waits (the idle clock runs), then is away for longer
        // than the idle timeout while a keep-alive and half an event arrive.
        assert!(s.next().now_or_never().is_none());
        send(": keep-alive\n\ndata: t").expect("send");
        tokio::time::advance(idle * 3).await;
        // Back, it waits a full idle period for the rest of the event.
        let next =
            tokio::spawn(async move { (s.next().await.map(|r| r.map_err(|e| e.to_string())), s) });
        tokio::time::advance(idle / 2).await;
        send(" 2\n\n").expect("send");
        let (ev, _s) = next.await.expect("join");
        match ev {
            Some(Ok(GenEvent::Tokens { ids, .. })) => assert_eq!(ids, vec![2]),
            other => panic!("expected token 2, got {other:?}"),
        }
    }

    /// A server on port 0 whose `/ok` answers an SSE body and `/busy` a 503
    /// with an OpenAI-shaped error.
    async fn answering_server() -> String {
        use axum::response::IntoResponse;
        let app = axum::Router::new()
            .route(
                "/p/ok",
                axum::routing::post(|| async {
                    "data: t 4\n\ndata: t 5\n\ndata: done\n\ndata: [DONE]\n\n"
                }),
            )
            .route(
                "/p/busy",
                axum::routing::post(|| async {
                    let body = r#"{"error": {"message": "queue is full"}}"#;
                    (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response()
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/p")
    }

    #[tokio::test]
    async fn the_transport_reads_streams_and_error_answers() {
        let base = answering_server().await;
        let cfg = crate::config::BackendConfig {
            url: base,
            kind: crate::config::BackendKind::Vllm,
            name: "b".into(),
            model: String::new(),
            ca_file: Default::default(),
            api_key: Default::default(),
            admin_api_key: Default::default(),
            vllm_api: Default::default(),
        };
        let http = HttpBackend::new(&cfg, &RouterConfig::default()).expect("client");
        let body = serde_json::json!({});
        let mut s = send_and_pump(&http, "/ok", &body, Lines)
            .await
            .expect("a stream");
        assert_eq!(ids(s.next().await), vec![4]);
        assert_eq!(ids(s.next().await), vec![5]);
        assert!(matches!(s.next().await, Some(Ok(GenEvent::Done { .. }))));
        assert!(s.next().await.is_none());
        match send_and_pump(&http, "/busy", &body, Lines).await {
            Err(BackendError::Overloaded { message, .. }) => {
                assert_eq!(message, "queue is full")
            }
            Err(other) => panic!("expected overloaded, got {other:?}"),
            Ok(_) => panic!("expected overloaded, got a stream"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_event_before_the_first_deadline_times_out() {
        let mut s = pumped(
            &[": keep-alive\n\ndata: nothing\n\n"],
            Duration::from_millis(50),
        );
        match s.next().await {
            Some(Err(BackendError::Timeout { message, .. })) => {
                assert!(message.contains("first-token"), "{message}");
            }
            other => panic!("expected a first-token timeout, got {other:?}"),
        }
    }
}
