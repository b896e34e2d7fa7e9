//! The HTTP backends' shared stream pump, for both vLLM and SGLang, against
//! an in-process mock server (axum on 127.0.0.1, port 0):
//!
//! - a backend that never answers, or answers headers but no event, fails
//!   with `Timeout` under `first_token_timeout` (the idle timeout is set far
//!   longer, so only the first-token deadline can fire);
//! - a backend that stalls after one token yields the token, then `Timeout`
//!   under `idle_stream_timeout` (the first-token timeout is set far longer);
//! - the first-token deadline no longer applies once an event has arrived;
//! - answers with null or missing logprobs give `logprob: None`, no error;
//! - the request always streams and asks for the sampled token's logprob;
//! - a stream that ends without a finish reason is a protocol error;
//! - dropping the stream closes the backend connection.
//!
//! Every case runs twice, over `http://` and over `https://` (the mock
//! behind TLS with a certificate of a private CA, given to the client as the
//! backend's `ca_file`): the backends have one transport for both.
//!
//! Hung backends are handlers that await futures which never complete; the
//! tests wait on the mock through `Notify` / `oneshot`, and every await is
//! wrapped in a generous `tokio::time::timeout` so a broken pump fails the
//! test instead of hanging it.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json as AxJson, Router};
use futures::{Stream, StreamExt};
use serde_json::{json, Value as Json};
use tokio::sync::{oneshot, Notify};

use tito::backend::sglang::SglangBackend;
use tito::backend::vllm::VllmBackend;
use tito::backend::{
    BackendError, DynBackend, FinishReason, GenEvent, GenStream, GenerateRequest, SamplingParams,
    TokenLogprob,
};
use tito::config::{BackendConfig, BackendKind, RouterConfig};

#[path = "common/tls.rs"]
mod tls;

/// Runs the case `$name(tls: bool)` as two tests: `$name::http` and
/// `$name::https`.
macro_rules! over_both_transports {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn http() {
                super::$name(false).await
            }
            #[tokio::test]
            async fn https() {
                super::$name(true).await
            }
        }
    )*};
}

over_both_transports!(
    no_answer_times_out_on_the_first_token_deadline,
    headers_without_an_event_time_out_on_the_first_token_deadline,
    a_stall_after_the_first_token_times_out_on_the_idle_deadline,
    the_first_token_deadline_ends_with_the_first_event,
    null_logprobs_are_unknown_not_errors,
    the_request_streams_and_asks_for_the_sampled_logprob,
    a_stream_without_a_finish_reason_is_a_protocol_error,
    dropping_the_stream_closes_the_backend_connection,
);

/// A short real timeout: the one a test expects to fire.
const SHORT_MS: u64 = 200;
/// A timeout that must not fire during a test.
const LONG_MS: u64 = 60_000;
/// Bound on any single await: a test that reaches it has failed.
const SAFETY: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Vllm,
    Sglang,
}

const KINDS: [Kind; 2] = [Kind::Vllm, Kind::Sglang];

/// What the mock does with a generation request.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Accepts the request and never answers, not even headers.
    NoHeaders,
    /// Sends headers and an SSE comment, then nothing.
    HeadersOnly,
    /// Sends token 7, then nothing.
    OneTokenThenStall,
    /// Sends token 7, waits for `Mock::release`, then token 8 and the finish.
    OneTokenThenRelease,
    /// A complete answer whose logprob fields are null or missing.
    NullLogprobs,
    /// Token 7 and `[DONE]`, without a finish reason.
    NoFinish,
}

struct Mock {
    kind: Kind,
    behaviour: Behaviour,
    /// Request bodies received.
    bodies: Mutex<Vec<Json>>,
    /// Lets `OneTokenThenRelease` go on.
    release: Notify,
    /// Dropped (signalled) when the response body is dropped, which the
    /// server does when the client closes the connection.
    body_dropped: Mutex<Option<oneshot::Sender<()>>>,
}

fn data(v: Json) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// One streamed chunk for `ids` (the new ids; SGLang's chunk is cumulative
/// over `all`), each token with logprob -0.5.
fn token_chunk(kind: Kind, all: &[u32], new: &[u32], finish: Option<&str>) -> Json {
    match kind {
        Kind::Vllm => json!({
            "id": "cmpl-1", "object": "text_completion", "model": "m",
            "choices": [{
                "index": 0, "text": "x", "token_ids": new,
                "logprobs": {
                    "tokens": new.iter().map(|i| format!("token_id:{i}")).collect::<Vec<_>>(),
                    "token_logprobs": new.iter().map(|_| -0.5).collect::<Vec<_>>(),
                    "top_logprobs": new.iter().map(|i| json!({format!("token_id:{i}"): -0.5})).collect::<Vec<_>>(),
                    "text_offset": new.iter().map(|_| 0).collect::<Vec<_>>(),
                },
                "finish_reason": finish, "stop_reason": null
            }]
        }),
        Kind::Sglang => json!({
            "text": "x", "output_ids": all,
            "meta_info": {
                "completion_tokens": all.len(),
                "finish_reason": finish.map(|f| json!({"type": f})),
                "output_token_logprobs": all.iter().map(|i| json!([-0.5, i, null])).collect::<Vec<_>>(),
                "output_top_logprobs": all.iter().map(|_| json!([])).collect::<Vec<_>>(),
            }
        }),
    }
}

/// A complete answer [5, 6, 7, 8] whose logprob fields are null or missing.
fn null_logprob_chunks(kind: Kind) -> Vec<Json> {
    match kind {
        Kind::Vllm => vec![
            json!({"choices": [{"index": 0, "text": "a", "token_ids": [5],
                "logprobs": null, "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "text": "b", "token_ids": [6, 7],
                "logprobs": {"token_logprobs": [null, -0.5], "top_logprobs": null},
                "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "text": "c", "token_ids": [8],
                "logprobs": {"token_logprobs": [-0.25], "top_logprobs": [null]},
                "finish_reason": "stop"}]}),
        ],
        Kind::Sglang => vec![
            json!({"output_ids": [5], "meta_info": {"completion_tokens": 1}}),
            json!({"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3,
                "output_token_logprobs": null, "output_top_logprobs": null}}),
            json!({"output_ids": [5, 6, 7, 8], "meta_info": {"completion_tokens": 4,
                "output_token_logprobs": [[null, 5, null], [null, 6, null],
                    [-0.5, 7, null], [-0.25, 8, null]],
                "output_top_logprobs": null,
                "finish_reason": {"type": "stop"}}}),
        ],
    }
}

type Chunks = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, Infallible>> + Send>>;

fn sse_response(chunks: Chunks) -> Response {
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(chunks),
    )
        .into_response()
}

/// Signals through its sender when dropped.
struct DropSignal(#[allow(dead_code)] Option<oneshot::Sender<()>>);

async fn generate(State(m): State<Arc<Mock>>, AxJson(body): AxJson<Json>) -> Response {
    m.bodies.lock().unwrap().push(body);
    let once = |b: Bytes| futures::stream::once(async move { Ok::<_, Infallible>(b) });
    let chunks: Chunks = match m.behaviour {
        Behaviour::NoHeaders => return std::future::pending::<Response>().await,
        Behaviour::HeadersOnly => Box::pin(
            once(Bytes::from_static(b": keep-alive\n\n")).chain(futures::stream::pending()),
        ),
        Behaviour::OneTokenThenStall => {
            let signal = DropSignal(m.body_dropped.lock().unwrap().take());
            Box::pin(
                once(data(token_chunk(m.kind, &[7], &[7], None)))
                    .chain(futures::stream::pending())
                    .map(move |c| {
                        let _keep = &signal;
                        c
                    }),
            )
        }
        Behaviour::OneTokenThenRelease => {
            let rest = {
                let m = m.clone();
                futures::stream::once(async move {
                    m.release.notified().await;
                    let last = token_chunk(m.kind, &[7, 8], &[8], Some("stop"));
                    Ok::<_, Infallible>(Bytes::from(format!("data: {last}\n\ndata: [DONE]\n\n")))
                })
            };
            Box::pin(once(data(token_chunk(m.kind, &[7], &[7], None))).chain(rest))
        }
        Behaviour::NullLogprobs => {
            let mut all: Vec<Bytes> = null_logprob_chunks(m.kind).into_iter().map(data).collect();
            all.push(Bytes::from_static(b"data: [DONE]\n\n"));
            Box::pin(futures::stream::iter(all.into_iter().map(Ok)))
        }
        Behaviour::NoFinish => Box::pin(futures::stream::iter([
            Ok(data(token_chunk(m.kind, &[7], &[7], None))),
            Ok(Bytes::from_static(b"data: [DONE]\n\n")),
        ])),
    };
    sse_response(chunks)
}

struct Setup {
    backend: DynBackend,
    mock: Arc<Mock>,
    /// The CA the https:// mock's certificate chains to, kept while the
    /// test runs.
    _ca: Option<tls::TestCa>,
}

/// Starts a mock of `kind` (behind TLS when `tls`) and a client for it with
/// the given timeouts.
async fn start(
    kind: Kind,
    tls: bool,
    behaviour: Behaviour,
    first_token_ms: u64,
    idle_ms: u64,
) -> Setup {
    start_with(kind, tls, behaviour, first_token_ms, idle_ms, None).await
}

async fn start_with(
    kind: Kind,
    tls: bool,
    behaviour: Behaviour,
    first_token_ms: u64,
    idle_ms: u64,
    body_dropped: Option<oneshot::Sender<()>>,
) -> Setup {
    let mock = Arc::new(Mock {
        kind,
        behaviour,
        bodies: Mutex::default(),
        release: Notify::new(),
        body_dropped: Mutex::new(body_dropped),
    });
    let app = Router::new()
        .route("/v1/completions", post(generate))
        .route("/generate", post(generate))
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ca = tls.then(tls::TestCa::new);
    match &ca {
        Some(ca) => {
            let listener = ca.listener(listener);
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        }
        None => {
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        }
    }
    let scheme = if tls { "https" } else { "http" };
    let router = RouterConfig {
        first_token_timeout_ms: first_token_ms,
        idle_stream_timeout_ms: idle_ms,
        ..Default::default()
    };
    let cfg = BackendConfig {
        url: format!("{scheme}://{addr}"),
        kind: match kind {
            Kind::Vllm => BackendKind::Vllm,
            Kind::Sglang => BackendKind::Sglang,
        },
        name: format!("mock-{kind:?}"),
        model: String::new(),
        ca_file: ca.as_ref().map(|c| c.ca_file.clone()).unwrap_or_default(),
        api_key: Default::default(),
        admin_api_key: Default::default(),
        vllm_api: Default::default(),
    };
    let backend: DynBackend = match kind {
        Kind::Vllm => Arc::new(VllmBackend::new(&cfg, &router).unwrap()),
        Kind::Sglang => Arc::new(SglangBackend::new(&cfg, &router).unwrap()),
    };
    Setup {
        backend,
        mock,
        _ca: ca,
    }
}

fn request() -> GenerateRequest {
    GenerateRequest {
        request_id: "req-1".into(),
        prompt_ids: Arc::new(vec![1, 2, 3]),
        params: SamplingParams {
            max_tokens: 8,
            logprobs: Some(0),
            ..Default::default()
        },
        images: None,
        adapter: None,
    }
}

async fn generate_call(s: &Setup) -> Result<GenStream, BackendError> {
    tokio::time::timeout(SAFETY, s.backend.generate(request()))
        .await
        .expect("generate() neither answered nor timed out")
}

async fn next(stream: &mut GenStream) -> Option<Result<GenEvent, BackendError>> {
    tokio::time::timeout(SAFETY, stream.next())
        .await
        .expect("the stream neither yielded nor timed out")
}

fn token_ids(ev: Option<Result<GenEvent, BackendError>>) -> Vec<u32> {
    match ev {
        Some(Ok(GenEvent::Tokens { ids, .. })) => ids,
        other => panic!("expected tokens, got {other:?}"),
    }
}

fn assert_timeout(kind: Kind, r: Option<Result<GenEvent, BackendError>>) {
    match r {
        Some(Err(e @ BackendError::Timeout { .. })) => assert!(e.is_retryable()),
        other => panic!("{kind:?}: expected a Timeout, got {other:?}"),
    }
}

async fn no_answer_times_out_on_the_first_token_deadline(tls: bool) {
    for kind in KINDS {
        let s = start(kind, tls, Behaviour::NoHeaders, SHORT_MS, LONG_MS).await;
        match generate_call(&s).await {
            Err(BackendError::Timeout { .. }) => {}
            Err(e) => panic!("{kind:?}: expected a Timeout, got {e}"),
            Ok(_) => panic!("{kind:?}: expected a Timeout, got a stream"),
        }
    }
}

async fn headers_without_an_event_time_out_on_the_first_token_deadline(tls: bool) {
    for kind in KINDS {
        let s = start(kind, tls, Behaviour::HeadersOnly, SHORT_MS, LONG_MS).await;
        let mut stream = generate_call(&s).await.unwrap();
        assert_timeout(kind, next(&mut stream).await);
        assert!(next(&mut stream).await.is_none(), "{kind:?}");
    }
}

async fn a_stall_after_the_first_token_times_out_on_the_idle_deadline(tls: bool) {
    for kind in KINDS {
        let s = start(kind, tls, Behaviour::OneTokenThenStall, LONG_MS, SHORT_MS).await;
        let mut stream = generate_call(&s).await.unwrap();
        assert_eq!(token_ids(next(&mut stream).await), vec![7], "{kind:?}");
        assert_timeout(kind, next(&mut stream).await);
        assert!(next(&mut stream).await.is_none(), "{kind:?}");
    }
}

async fn the_first_token_deadline_ends_with_the_first_event(tls: bool) {
    for kind in KINDS {
        let s = start(kind, tls, Behaviour::OneTokenThenRelease, SHORT_MS, LONG_MS).await;
        let mut stream = generate_call(&s).await.unwrap();
        assert_eq!(token_ids(next(&mut stream).await), vec![7], "{kind:?}");
        // Let the first-token deadline pass while the backend holds the
        // second token: this wait is the condition under test.
        tokio::time::sleep(Duration::from_millis(SHORT_MS * 3)).await;
        s.mock.release.notify_one();
        assert_eq!(token_ids(next(&mut stream).await), vec![8], "{kind:?}");
        match next(&mut stream).await {
            Some(Ok(GenEvent::Done { finish_reason })) => {
                assert_eq!(finish_reason, FinishReason::Stop, "{kind:?}")
            }
            other => panic!("{kind:?}: expected Done, got {other:?}"),
        }
        assert!(next(&mut stream).await.is_none(), "{kind:?}");
    }
}

async fn null_logprobs_are_unknown_not_errors(tls: bool) {
    let some = |l: f32| TokenLogprob {
        logprob: Some(l),
        top: vec![],
    };
    let none = TokenLogprob {
        logprob: None,
        top: vec![],
    };
    for kind in KINDS {
        let s = start(kind, tls, Behaviour::NullLogprobs, LONG_MS, LONG_MS).await;
        let mut stream = generate_call(&s).await.unwrap();
        let mut g = tito::backend::Generation::default();
        while let Some(ev) = next(&mut stream).await {
            g.push(ev.unwrap_or_else(|e| panic!("{kind:?}: {e}")));
        }
        assert_eq!(g.ids, vec![5, 6, 7, 8], "{kind:?}");
        let expected = match kind {
            Kind::Vllm => vec![none.clone(), none.clone(), some(-0.5), some(-0.25)],
            // Tokens 5-7 arrived before SGLang sent any logprob list.
            Kind::Sglang => vec![none.clone(), none.clone(), none.clone(), some(-0.25)],
        };
        assert_eq!(g.logprobs, expected, "{kind:?}");
        assert_eq!(g.finish_reason, Some(FinishReason::Stop), "{kind:?}");
    }
}

async fn the_request_streams_and_asks_for_the_sampled_logprob(tls: bool) {
    for kind in KINDS {
        let s = start(kind, tls, Behaviour::NullLogprobs, LONG_MS, LONG_MS).await;
        let mut stream = generate_call(&s).await.unwrap();
        while next(&mut stream).await.is_some() {}
        let bodies = s.mock.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 1, "{kind:?}");
        let body = &bodies[0];
        assert_eq!(body["stream"], json!(true), "{kind:?}");
        match kind {
            Kind::Vllm => {
                assert_eq!(body["prompt"], json!([1, 2, 3]));
                assert_eq!(body["logprobs"], json!(0));
                assert_eq!(body["return_tokens_as_token_ids"], json!(true));
                assert_eq!(body["return_token_ids"], json!(true));
            }
            Kind::Sglang => {
                assert_eq!(body["input_ids"], json!([1, 2, 3]));
                assert_eq!(body["return_logprob"], json!(true));
                assert_eq!(body["top_logprobs_num"], json!(0));
                assert_eq!(body["logprob_start_len"], json!(-1));
            }
        }
    }
}

async fn a_stream_without_a_finish_reason_is_a_protocol_error(tls: bool) {
    for kind in KINDS {
        let s = start(kind, tls, Behaviour::NoFinish, LONG_MS, LONG_MS).await;
        let mut stream = generate_call(&s).await.unwrap();
        assert_eq!(token_ids(next(&mut stream).await), vec![7], "{kind:?}");
        match next(&mut stream).await {
            Some(Err(BackendError::Protocol { .. })) => {}
            other => panic!("{kind:?}: expected a protocol error, got {other:?}"),
        }
        assert!(next(&mut stream).await.is_none(), "{kind:?}");
    }
}

async fn dropping_the_stream_closes_the_backend_connection(tls: bool) {
    for kind in KINDS {
        let (tx, rx) = oneshot::channel();
        let s = start_with(
            kind,
            tls,
            Behaviour::OneTokenThenStall,
            LONG_MS,
            LONG_MS,
            Some(tx),
        )
        .await;
        let mut stream = generate_call(&s).await.unwrap();
        assert_eq!(token_ids(next(&mut stream).await), vec![7], "{kind:?}");
        drop(stream);
        // The server drops the response body once the client has gone;
        // nothing ever sends on `tx`, so the receiver sees it dropped.
        let closed = tokio::time::timeout(SAFETY, rx).await;
        assert!(
            matches!(closed, Ok(Err(_))),
            "{kind:?}: the backend connection stayed open"
        );
    }
}
