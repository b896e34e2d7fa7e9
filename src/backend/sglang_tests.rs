//! Tests of the SGLang client against an in-process mock of SGLang's native
//! API (axum on port 0): request shape, cumulative and incremental streams,
//! answers without logprobs, error statuses, in-stream errors, unreachable
//! server, and the admin endpoints. Timeouts are tested in
//! `tests/backend_timeouts.rs`.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json as AxJson, Router};
use futures::StreamExt;
use serde_json::{json, Value as Json};

use super::*;
use crate::backend::{Generation, SamplingParams};

/// What the mock answers on `/generate`.
#[derive(Clone, Copy)]
enum Mode {
    Cumulative,
    Incremental,
    /// Incremental without `completion_tokens`, with a repeated token.
    IncrementalNoTotal,
    Status(u16),
    StreamError,
    NoFinish,
    /// Incremental, without any logprob fields.
    NoLogprobs,
}

#[derive(Clone)]
struct Mock {
    mode: Mode,
    calls: Arc<Mutex<Vec<(String, Json)>>>,
}

/// The sampled sequence every mock answer describes.
const IDS: [u32; 4] = [11, 12, 12, 13];

fn lp_entry(id: u32) -> Json {
    json!([-(id as f64) / 100.0, id, null])
}

fn top_entry(id: u32) -> Json {
    json!([[-(id as f64) / 100.0, id, null], [-5.0, 999, null]])
}

/// A `/generate` output object covering `ids[from..to]` (cumulative: from 0).
fn out(from: usize, to: usize, total: Option<usize>, finished: bool) -> Json {
    let ids = &IDS[from..to];
    let mut meta = json!({
        "finish_reason": if finished { json!({"type": "length", "length": 4}) } else { Json::Null },
        "prompt_tokens": 3,
        "output_token_logprobs": ids.iter().map(|&i| lp_entry(i)).collect::<Vec<_>>(),
        "output_top_logprobs": ids.iter().map(|&i| top_entry(i)).collect::<Vec<_>>(),
    });
    if let Some(t) = total {
        meta["completion_tokens"] = json!(t);
    }
    json!({"text": "", "output_ids": ids, "meta_info": meta})
}

fn sse(events: Vec<Json>) -> Response {
    let mut body = String::new();
    for e in events {
        body.push_str(&format!("data: {e}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    ([("content-type", "text/event-stream")], body).into_response()
}

async fn generate(State(m): State<Mock>, AxJson(body): AxJson<Json>) -> Response {
    m.calls
        .lock()
        .unwrap()
        .push(("/generate".into(), body.clone()));
    if body["stream"] != json!(true) {
        return (StatusCode::BAD_REQUEST, "the client must always stream").into_response();
    }
    match m.mode {
        Mode::Status(s) => (
            StatusCode::from_u16(s).unwrap(),
            AxJson(json!({"error": {"message": format!("mock status {s}")}})),
        )
            .into_response(),
        Mode::Cumulative => sse(vec![
            out(0, 1, Some(1), false),
            out(0, 3, Some(3), false),
            out(0, 3, Some(3), false), // no progress: nothing new to emit
            out(0, 4, Some(4), true),
        ]),
        Mode::Incremental => sse(vec![
            out(0, 1, Some(1), false),
            out(1, 2, Some(2), false),
            out(2, 3, Some(3), false),
            out(3, 4, Some(4), true),
        ]),
        // [11,12] then [12] then [13]: the second chunk repeats a token and
        // does not extend [11,12], so it must read as incremental.
        Mode::IncrementalNoTotal => sse(vec![
            out(0, 2, None, false),
            out(2, 3, None, false),
            out(3, 4, None, true),
        ]),
        Mode::StreamError => sse(vec![json!({"error": {"message": "input too long"}})]),
        Mode::NoFinish => sse(vec![out(0, 2, Some(2), false)]),
        Mode::NoLogprobs => sse(vec![
            json!({"output_ids": [11, 12], "meta_info": {"completion_tokens": 2}}),
            json!({"output_ids": [12, 13], "meta_info": {"completion_tokens": 4,
                "output_token_logprobs": null, "output_top_logprobs": null,
                "finish_reason": {"type": "stop"}}}),
        ]),
    }
}

/// SGLang 0.5.23's admin endpoints as far as shapes go: a JSON object body
/// (unknown keys ignored), the fields they require, 400 otherwise.
async fn admin(
    State(m): State<Mock>,
    uri: axum::http::Uri,
    AxJson(body): AxJson<Json>,
) -> Response {
    let bad = |why: &str| {
        (
            StatusCode::BAD_REQUEST,
            AxJson(json!({"error": {"message": why}})),
        )
    };
    if !body.is_object() {
        return bad("body must be an object").into_response();
    }
    let path = uri.path().to_string();
    m.calls.lock().unwrap().push((path.clone(), body.clone()));
    match path.as_str() {
        "/update_weights_from_disk" => match body.get("model_path").and_then(Json::as_str) {
            Some(p) if p.starts_with("/missing") => AxJson(
                json!({"success": false, "message": "no such checkpoint", "num_paused_requests": 0}),
            )
            .into_response(),
            Some(_) => AxJson(json!({"success": true, "message": "ok", "num_paused_requests": 0}))
                .into_response(),
            None => bad("model_path is required").into_response(),
        },
        "/pause_generation" => match body.get("mode").and_then(Json::as_str) {
            None | Some("abort" | "retract" | "in_place") => {
                AxJson(json!({"message": "paused", "status": "ok"})).into_response()
            }
            Some(_) => bad("mode").into_response(),
        },
        "/continue_generation" => {
            AxJson(json!({"message": "continued", "status": "ok"})).into_response()
        }
        _ => AxJson(Json::Null).into_response(),
    }
}

async fn start(mode: Mode) -> (SglangBackend, Mock) {
    let mock = Mock {
        mode,
        calls: Arc::default(),
    };
    let app = Router::new()
        .route("/generate", post(generate))
        .route("/health", get(|| async { "ok" }))
        .route("/release_memory_occupation", post(admin))
        .route("/resume_memory_occupation", post(admin))
        .route("/update_weights_from_disk", post(admin))
        .route("/pause_generation", post(admin))
        .route("/continue_generation", post(admin))
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (backend_at(&format!("http://{addr}")), mock)
}

fn backend_at(url: &str) -> SglangBackend {
    let cfg = BackendConfig {
        url: url.to_string(),
        kind: crate::config::BackendKind::Sglang,
        name: "sg".into(),
        model: String::new(),
        ca_file: Default::default(),
        api_key: Default::default(),
        admin_api_key: Default::default(),
        vllm_api: Default::default(),
    };
    SglangBackend::new(&cfg, &RouterConfig::default()).unwrap()
}

fn request(logprobs: Option<u32>) -> GenerateRequest {
    GenerateRequest {
        request_id: "req-1".into(),
        prompt_ids: Arc::new(vec![1, 2, 3]),
        params: SamplingParams {
            max_tokens: 4,
            temperature: Some(0.5),
            top_k: Some(20),
            seed: Some(7),
            stop: vec!["</s>".into()],
            stop_token_ids: vec![2],
            logprobs,
            ..Default::default()
        },
        images: None,
        adapter: None,
    }
}

async fn collect(b: &SglangBackend, req: GenerateRequest) -> Result<Generation, BackendError> {
    let mut s = b.generate(req).await?;
    let mut g = Generation::default();
    while let Some(ev) = s.next().await {
        g.push(ev?);
    }
    Ok(g)
}

fn expected_logprobs() -> Vec<TokenLogprob> {
    IDS.iter()
        .map(|&i| TokenLogprob {
            logprob: Some(-(i as f32) / 100.0),
            top: vec![(i, -(i as f32) / 100.0), (999, -5.0)],
        })
        .collect()
}

#[test]
fn request_body_matches_sglang_native_api() {
    let b = backend_at("http://127.0.0.1:1/");
    let body = serde_json::to_value(b.request_body(&request(Some(2)))).expect("json");
    assert_eq!(
        body,
        json!({
            "input_ids": [1, 2, 3],
            "sampling_params": {
                "max_new_tokens": 4, "temperature": 0.5, "top_k": 20, "sampling_seed": 7,
                "stop": ["</s>"], "stop_token_ids": [2],
                "skip_special_tokens": false, "spaces_between_special_tokens": false,
                "no_stop_trim": true
            },
            "stream": true,
            "rid": "req-1",
            "return_logprob": true,
            "top_logprobs_num": 2,
            "logprob_start_len": -1
        })
    );
    let plain = serde_json::to_value(b.request_body(&request(None))).expect("json");
    assert!(plain.get("return_logprob").is_none());
    // An f32 goes out as the client wrote it (vllm_tests has every field).
    let mut req = request(None);
    req.params.temperature = Some(0.7);
    let text = serde_json::to_string(&b.request_body(&req)).expect("json");
    let sent: Json = serde_json::from_str(&text).expect("json");
    assert_eq!(sent["sampling_params"]["temperature"].as_f64(), Some(0.7));
    assert_eq!(plain["stream"], json!(true));
}

#[tokio::test]
async fn cumulative_stream_emits_each_token_once() {
    let (b, mock) = start(Mode::Cumulative).await;
    let mut s = b.generate(request(Some(2))).await.unwrap();
    let mut chunks = Vec::new();
    let mut g = Generation::default();
    while let Some(ev) = s.next().await {
        let ev = ev.unwrap();
        if let GenEvent::Tokens { ids, .. } = &ev {
            chunks.push(ids.clone());
        }
        g.push(ev);
    }
    assert_eq!(chunks, vec![vec![11], vec![12, 12], vec![13]]);
    assert_eq!(g.ids, IDS);
    assert_eq!(g.logprobs, expected_logprobs());
    assert_eq!(g.finish_reason, Some(FinishReason::Length));
    let calls = mock.calls.lock().unwrap();
    assert_eq!(calls[0].0, "/generate");
    assert_eq!(calls[0].1["input_ids"], json!([1, 2, 3]));
}

#[tokio::test]
async fn incremental_stream_emits_each_token_once() {
    let (b, _) = start(Mode::Incremental).await;
    let g = collect(&b, request(Some(2))).await.unwrap();
    assert_eq!(g.ids, IDS);
    assert_eq!(g.logprobs, expected_logprobs());
    assert_eq!(g.finish_reason, Some(FinishReason::Length));
}

#[tokio::test]
async fn top_alternatives_are_cut_to_k() {
    let (b, _) = start(Mode::Incremental).await;
    let g = collect(&b, request(Some(0))).await.unwrap();
    assert_eq!(g.ids, IDS);
    let sampled_only: Vec<TokenLogprob> = expected_logprobs()
        .into_iter()
        .map(|l| TokenLogprob {
            logprob: l.logprob,
            top: vec![],
        })
        .collect();
    assert_eq!(g.logprobs, sampled_only);
}

#[tokio::test]
async fn answers_without_logprobs_give_unknown_logprobs() {
    let (b, _) = start(Mode::NoLogprobs).await;
    let g = collect(&b, request(Some(0))).await.unwrap();
    assert_eq!(g.ids, IDS);
    let unknown = TokenLogprob {
        logprob: None,
        top: vec![],
    };
    assert_eq!(g.logprobs, vec![unknown; 4]);
    assert_eq!(g.finish_reason, Some(FinishReason::Stop));
}

#[tokio::test]
async fn incremental_stream_without_totals_keeps_repeated_tokens() {
    let (b, _) = start(Mode::IncrementalNoTotal).await;
    let g = collect(&b, request(None)).await.unwrap();
    assert_eq!(g.ids, IDS);
    assert!(g.logprobs.is_empty());
}

#[tokio::test]
async fn error_statuses_map_to_backend_errors() {
    let (b, _) = start(Mode::Status(400)).await;
    let e = collect(&b, request(None)).await.unwrap_err();
    assert!(matches!(&e, BackendError::Rejected { message, .. } if message == "mock status 400"));
    assert!(!e.is_retryable());
    let (b, _) = start(Mode::Status(503)).await;
    let e = collect(&b, request(None)).await.unwrap_err();
    assert!(matches!(e, BackendError::Overloaded { .. }));
    let (b, _) = start(Mode::Status(500)).await;
    let e = collect(&b, request(None)).await.unwrap_err();
    assert!(matches!(e, BackendError::Status { status: 500, .. }));
}

#[tokio::test]
async fn in_stream_errors_and_missing_finish_are_errors() {
    let (b, _) = start(Mode::StreamError).await;
    let e = collect(&b, request(None)).await.unwrap_err();
    assert!(matches!(&e, BackendError::Rejected { message, .. } if message == "input too long"));
    let (b, _) = start(Mode::NoFinish).await;
    let e = collect(&b, request(None)).await.unwrap_err();
    assert!(matches!(e, BackendError::Protocol { .. }));
}

#[tokio::test]
async fn unreachable_server_is_unreachable() {
    // Bind then drop a listener: nothing listens on that port any more.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let b = backend_at(&format!("http://{addr}"));
    let e = collect(&b, request(None)).await.unwrap_err();
    assert!(matches!(e, BackendError::Unreachable { .. }), "{e}");
    assert!(e.is_retryable());
    assert!(matches!(
        b.health().await,
        Err(BackendError::Unreachable { .. })
    ));
}

#[tokio::test]
async fn health_and_admin_use_sglang_endpoints() {
    let (b, mock) = start(Mode::Incremental).await;
    b.health().await.unwrap();
    b.admin(&AdminOp::Sleep { level: 1 }).await.unwrap();
    b.admin(&AdminOp::WakeUp).await.unwrap();
    b.admin(&AdminOp::UpdateWeights {
        path: "/ckpt/step-3".into(),
        version: "step-3".into(),
        mode: UpdateMode::Wait,
    })
    .await
    .unwrap();
    b.admin(&AdminOp::BeginWeightUpdate {
        mode: UpdateMode::Wait,
    })
    .await
    .unwrap();
    b.admin(&AdminOp::FinishWeightUpdate {
        version: "step-4".into(),
    })
    .await
    .unwrap();
    // `success: false` is a failure, whatever the status.
    let e = b
        .admin(&AdminOp::UpdateWeights {
            path: "/missing/ckpt".into(),
            version: "step-5".into(),
            mode: UpdateMode::Wait,
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no such checkpoint"), "{e}");
    let calls = mock.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            ("/release_memory_occupation".to_string(), json!({})),
            ("/resume_memory_occupation".to_string(), json!({})),
            (
                "/update_weights_from_disk".to_string(),
                json!({"model_path": "/ckpt/step-3", "weight_version": "step-3"})
            ),
            ("/pause_generation".to_string(), json!({"mode": "abort"})),
            ("/continue_generation".to_string(), json!({})),
            (
                "/update_weights_from_disk".to_string(),
                json!({"model_path": "/missing/ckpt", "weight_version": "step-5"})
            ),
        ]
    );
}

#[test]
fn stream_state_prefers_completion_tokens() {
    // Incremental chunk [11] after [11]: the prefix alone would read it as
    // "cumulative, nothing new"; completion_tokens = 2 says it is new.
    let mut st = StreamState {
        emitted: vec![11],
        ..Default::default()
    };
    assert_eq!(st.already_emitted(&[11], Some(2)), 0);
    assert_eq!(st.cumulative, Some(false));
    let mut st = StreamState {
        emitted: vec![11],
        ..Default::default()
    };
    assert_eq!(st.already_emitted(&[11, 11], Some(2)), 1);
    assert_eq!(st.cumulative, Some(true));
}

#[test]
fn finish_reason_shapes() {
    assert_eq!(
        finish_reason(Some(&json!({"type": "stop", "matched": 2}))),
        Some(FinishReason::Stop)
    );
    assert_eq!(
        finish_reason(Some(&json!({"type": "abort", "message": "x"}))),
        Some(FinishReason::Abort)
    );
    assert_eq!(finish_reason(Some(&Json::Null)), None);
    assert_eq!(finish_reason(None), None);
}

#[test]
fn misaligned_logprobs_are_a_protocol_error() {
    let mut st = StreamState::default();
    let ev: GenerateOut = serde_json::from_value(json!({
        "output_ids": [11, 12],
        "meta_info": {"completion_tokens": 2, "finish_reason": null,
                      "output_token_logprobs": [[-0.1, 11, null], [-0.2, 99, null]]}
    }))
    .unwrap();
    let e = st.on_event("sg", ev, Some(1)).unwrap_err();
    assert!(matches!(e, BackendError::Protocol { .. }), "{e}");
    let mut st = StreamState::default();
    let ev: GenerateOut = serde_json::from_value(json!({
        "output_ids": [11, 12],
        "meta_info": {"completion_tokens": 2, "output_token_logprobs": [[-0.1, 11, null]]}
    }))
    .unwrap();
    assert!(st.on_event("sg", ev, Some(1)).is_err(), "too few logprobs");
}

/// What a stream emitted: token ids, their logprobs, its finish.
type Fed = (Vec<u32>, Vec<Option<f32>>, Option<FinishReason>);

/// Events through one `StreamState`: what they emitted, or the first error.
fn feed(events: Vec<Json>) -> Result<Fed, BackendError> {
    let mut st = StreamState::default();
    let (mut ids, mut lps, mut finish) = (Vec::new(), Vec::new(), None);
    for e in events {
        let ev: GenerateOut = serde_json::from_value(e).unwrap();
        for g in st.on_event("sg", ev, Some(0))? {
            match g {
                GenEvent::Tokens { ids: i, logprobs } => {
                    ids.extend(i);
                    lps.extend(logprobs.into_iter().map(|l| l.logprob));
                }
                GenEvent::Done { finish_reason } => finish = Some(finish_reason),
                GenEvent::Versions(_) | GenEvent::PromptDrift(_) => {}
            }
        }
    }
    Ok((ids, lps, finish))
}

fn lps(ids: &[u32]) -> Json {
    json!(ids.iter().map(|&i| lp_entry(i)).collect::<Vec<_>>())
}

#[test]
fn incremental_ids_with_whole_logprob_lists_take_the_last_entries() {
    // SGLang before 2026-03 with --incremental-streaming-output: new ids,
    // but the logprob list of the whole output so far.
    let events = |second: u32| {
        vec![
            json!({"output_ids": [11], "meta_info": {"completion_tokens": 1,
                   "output_token_logprobs": lps(&[11])}}),
            json!({"output_ids": [second], "meta_info": {"completion_tokens": 2,
                   "output_token_logprobs": lps(&[11, second]),
                   "finish_reason": {"type": "length", "length": 2}}}),
        ]
    };
    let (ids, got, finish) = feed(events(12)).unwrap();
    assert_eq!(ids, [11, 12]);
    assert_eq!(got, [Some(-0.11), Some(-0.12)]);
    assert_eq!(finish, Some(FinishReason::Length));
    // A repeated token takes its own position's entry, not the first's.
    let mut e = events(11);
    e[1]["meta_info"]["output_token_logprobs"] = json!([[-0.11, 11, null], [-0.5, 11, null]]);
    let (ids, got, _) = feed(e).unwrap();
    assert_eq!(ids, [11, 11]);
    assert_eq!(got, [Some(-0.11), Some(-0.5)]);
}

#[test]
fn a_stream_that_lost_tokens_is_a_protocol_error() {
    // Incremental [11] (1 so far), then [13] with 3 so far: 12 was dropped.
    let e = feed(vec![
        json!({"output_ids": [11], "meta_info": {"completion_tokens": 1,
               "output_token_logprobs": lps(&[11])}}),
        json!({"output_ids": [13], "meta_info": {"completion_tokens": 3,
               "output_token_logprobs": lps(&[13]),
               "finish_reason": {"type": "stop", "matched": 13}}}),
    ])
    .unwrap_err();
    assert!(matches!(e, BackendError::Protocol { .. }), "{e}");
}

#[test]
fn abnormal_ends_are_errors_and_an_abort_event_adds_no_token() {
    let first = json!({"output_ids": [11, 12], "meta_info": {"completion_tokens": 2,
                       "output_token_logprobs": lps(&[11, 12])}});
    // SGLang's abort event repeats the last id and counts all of them.
    let abort = json!({"output_ids": [12], "meta_info": {"completion_tokens": 2,
                       "output_token_logprobs": lps(&[11, 12]),
                       "finish_reason": {"type": "abort", "message": "paused",
                                         "status_code": 503}}});
    let (ids, _, finish) = feed(vec![first.clone(), abort]).unwrap();
    assert_eq!(ids, [11, 12]);
    assert_eq!(finish, Some(FinishReason::Abort));
    // A 4xx abort is the request's fault: refused, with SGLang's message.
    let refused = json!({"output_ids": [], "meta_info": {"completion_tokens": 0,
                         "finish_reason": {"type": "abort", "message": "too long",
                                           "status_code": 400}}});
    match feed(vec![refused]).unwrap_err() {
        BackendError::Rejected { message, .. } => assert_eq!(message, "too long"),
        e => panic!("{e}"),
    }
    // The NaN guard replaced the sampled token: nothing to record.
    let nan = json!({"output_ids": [11, 12, 2], "meta_info": {"completion_tokens": 3,
                     "output_token_logprobs": lps(&[11, 12, 2]),
                     "finish_reason": {"type": "stop", "matched": "NaN happened"}}});
    let e = feed(vec![first, nan]).unwrap_err();
    assert!(matches!(e, BackendError::Protocol { .. }), "{e}");
}

#[test]
fn a_prompt_the_server_cut_is_a_protocol_error() {
    let event = |prompt_tokens: usize| -> GenerateOut {
        serde_json::from_value(
            json!({"output_ids": [11], "meta_info": {"completion_tokens": 1,
            "prompt_tokens": prompt_tokens, "output_token_logprobs": lps(&[11]),
            "finish_reason": {"type": "length", "length": 1}}}),
        )
        .unwrap()
    };
    let mut st = StreamState {
        prompt_len: Some(5),
        ..Default::default()
    };
    assert!(st.on_event("sg", event(5), Some(0)).is_ok());
    let mut st = StreamState {
        prompt_len: Some(5),
        ..Default::default()
    };
    let e = st.on_event("sg", event(3), Some(0)).unwrap_err();
    assert!(matches!(e, BackendError::Protocol { .. }), "{e}");
}

#[test]
fn structured_outputs_are_sglang_json_schema_strings() {
    let b = backend_at("http://127.0.0.1:1/");
    let mut req = request(None);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    req.params.structured = Some(crate::backend::StructuredOutput::JsonSchema(schema.clone()));
    let body = serde_json::to_value(b.request_body(&req)).expect("json");
    let sent: serde_json::Value = serde_json::from_str(
        body["sampling_params"]["json_schema"]
            .as_str()
            .expect("a string"),
    )
    .expect("json");
    assert_eq!(sent, schema);
    req.params.structured = Some(crate::backend::StructuredOutput::JsonObject);
    let body = serde_json::to_value(b.request_body(&req)).expect("json");
    assert_eq!(
        body["sampling_params"]["json_schema"],
        json!(r#"{"type":"object"}"#)
    );
}

fn read_input_logprobs(answer: Json, ids: &[u32]) -> Result<Vec<PositionLogprob>, String> {
    input_logprobs(
        serde_json::from_value(answer).map_err(|e| e.to_string())?,
        ids,
    )
}

#[test]
fn score_body_asks_for_input_logprobs_and_no_new_token() {
    let req = ScoreRequest {
        request_id: "verify-1".into(),
        ids: Arc::new(vec![4, 5]),
        adapter: None,
    };
    let body = backend_at("http://127.0.0.1:1").score_body(&req);
    assert_eq!(body["input_ids"], json!([4, 5]));
    assert_eq!(body["sampling_params"]["max_new_tokens"], 0);
    assert_eq!(body["return_logprob"], true);
    assert_eq!(body["logprob_start_len"], 0);
    assert_eq!(body["top_logprobs_num"], 1);
    assert_eq!(body["stream"], false);
}

#[test]
fn input_logprobs_are_read_with_the_top_one_as_argmax() {
    let answer = json!({"text": "", "output_ids": [], "meta_info": {
        "input_token_logprobs": [[null, 4, null], [-0.5, 5, null], [-2.0, 6, null], [-1.0, 7, null]],
        "input_top_logprobs": [null, [[-0.5, 5, null]], [[-0.1, 9, null]], null]
    }});
    let got = read_input_logprobs(answer, &[4, 5, 6, 7]).unwrap();
    assert_eq!(
        got[0],
        PositionLogprob {
            logprob: None,
            argmax: None
        }
    );
    assert_eq!(
        got[1],
        PositionLogprob {
            logprob: Some(-0.5),
            argmax: Some(true)
        }
    );
    assert_eq!(
        got[2],
        PositionLogprob {
            logprob: Some(-2.0),
            argmax: Some(false)
        }
    );
    assert_eq!(
        got[3],
        PositionLogprob {
            logprob: Some(-1.0),
            argmax: None
        },
        "no top list"
    );
}

#[test]
fn input_logprobs_for_other_ids_or_lengths_are_protocol_errors() {
    let wrong = json!({"meta_info": {"input_token_logprobs": [[null, 4, null], [-0.5, 8, null]]}});
    let e = read_input_logprobs(wrong, &[4, 5]).unwrap_err();
    assert!(e.contains("for token 8"), "{e}");
    let short = json!({"meta_info": {"input_token_logprobs": [[null, 4, null]]}});
    let e = read_input_logprobs(short, &[4, 5]).unwrap_err();
    assert!(e.contains("1 input_token_logprobs for 2"), "{e}");
    let none = json!({"meta_info": {}});
    let e = read_input_logprobs(none, &[4, 5]).unwrap_err();
    assert!(e.contains("no input_token_logprobs"), "{e}");
}

/// A server answering only `path` with `info` (SGLang's server arguments
/// at the top level, as `GET /server_info` gives them).
async fn info_server(path: &'static str, info: Json) -> SglangBackend {
    let app = Router::new().route(path, get(move || async move { AxJson(info) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    backend_at(&format!("http://{addr}"))
}

#[tokio::test]
async fn sleep_needs_the_memory_saver_and_a_cpu_copy_of_the_weights() {
    let flags = |saver: bool, backup: bool| json!({"enable_memory_saver": saver, "enable_weights_cpu_backup": backup, "version": "0.5.23"});
    let b = info_server("/server_info", flags(true, true)).await;
    b.admin(&AdminOp::SleepCheck).await.unwrap();
    let b = info_server("/server_info", flags(false, true)).await;
    let e = b.admin(&AdminOp::SleepCheck).await.unwrap_err();
    assert!(e.to_string().contains("--enable-memory-saver"), "{e}");
    let b = info_server("/server_info", flags(true, false)).await;
    let e = b.admin(&AdminOp::SleepCheck).await.unwrap_err();
    assert!(e.to_string().contains("--enable-weights-cpu-backup"), "{e}");
    // Before SGLang 0.5.7 the route was /get_server_info.
    let b = info_server("/get_server_info", flags(true, true)).await;
    b.admin(&AdminOp::SleepCheck).await.unwrap();
    let b = info_server("/get_server_info", json!({"version": "0.5.5"})).await;
    let e = b.admin(&AdminOp::SleepCheck).await.unwrap_err();
    assert!(e.to_string().contains("does not say"), "{e}");
}
