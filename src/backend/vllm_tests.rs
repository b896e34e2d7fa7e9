//! Tests of the vLLM client's request body and of [`VllmDecoder`] over
//! completion chunks: ids, logprobs (present, null, partly null), top-k
//! alternatives, finish reasons and in-stream errors. Streaming over HTTP
//! and the timeouts are tested in `tests/backend_timeouts.rs`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::backend::SamplingParams;

fn backend() -> VllmBackend {
    let cfg = BackendConfig {
        url: "http://127.0.0.1:1/".into(),
        kind: crate::config::BackendKind::Vllm,
        name: "vl".into(),
        model: "m".into(),
        ca_file: Default::default(),
        api_key: Default::default(),
        admin_api_key: Default::default(),
        vllm_api: Default::default(),
    };
    VllmBackend::new(&cfg, &RouterConfig::default()).unwrap()
}

fn request(logprobs: Option<u32>) -> GenerateRequest {
    GenerateRequest {
        request_id: "req-1".into(),
        prompt_ids: Arc::new(vec![1, 2, 3]),
        params: SamplingParams {
            max_tokens: 4,
            temperature: Some(0.5),
            seed: Some(7),
            stop_token_ids: vec![2],
            logprobs,
            ..Default::default()
        },
        images: None,
        adapter: None,
    }
}

fn decode(logprobs: Option<u32>, chunk: serde_json::Value) -> Result<Vec<GenEvent>, BackendError> {
    VllmDecoder::new("vl", logprobs).on_data(&chunk.to_string())
}

fn unknown() -> TokenLogprob {
    TokenLogprob {
        logprob: None,
        top: vec![],
    }
}

#[test]
fn request_body_always_streams_and_asks_logprobs_by_id() {
    let b = backend();
    assert_eq!(
        serde_json::to_value(b.request_body(&request(Some(0)))).expect("json"),
        json!({
            "prompt": [1, 2, 3], "max_tokens": 4, "n": 1, "stream": true,
            "return_token_ids": true, "skip_special_tokens": false,
            "spaces_between_special_tokens": false, "request_id": "req-1",
            "model": "m", "temperature": 0.5, "seed": 7, "stop_token_ids": [2],
            "logprobs": 0, "return_tokens_as_token_ids": true
        })
    );
    let plain = serde_json::to_value(b.request_body(&request(None))).expect("json");
    assert_eq!(plain["stream"], json!(true));
    assert!(plain.get("logprobs").is_none());
    assert!(plain.get("return_tokens_as_token_ids").is_none());
}

#[test]
fn chunk_gives_ids_logprobs_top_k_and_finish() {
    let events = decode(
        Some(1),
        json!({"id": "c", "object": "text_completion", "choices": [{
            "index": 0, "text": "ab", "token_ids": [5, 6],
            "logprobs": {
                "tokens": ["token_id:5", "token_id:6"],
                "token_logprobs": [-0.5, -0.25],
                // vLLM lists the sampled token besides the top k.
                "top_logprobs": [
                    {"token_id:5": -0.5, "token_id:9": -0.1},
                    {"token_id:6": -0.25}
                ],
                "text_offset": [0, 1]
            },
            "finish_reason": "length", "stop_reason": null
        }]}),
    )
    .unwrap();
    assert_eq!(
        events,
        vec![
            GenEvent::Tokens {
                ids: vec![5, 6],
                logprobs: vec![
                    TokenLogprob {
                        logprob: Some(-0.5),
                        top: vec![(9, -0.1)]
                    },
                    TokenLogprob {
                        logprob: Some(-0.25),
                        top: vec![(6, -0.25)]
                    },
                ],
            },
            GenEvent::Done {
                finish_reason: FinishReason::Length
            },
        ]
    );
}

#[test]
fn sampled_only_logprobs_have_no_alternatives() {
    let events = decode(
        Some(0),
        json!({"choices": [{"token_ids": [5], "finish_reason": null,
            "logprobs": {"token_logprobs": [-0.5], "top_logprobs": [{"token_id:5": -0.5}]}}]}),
    )
    .unwrap();
    assert_eq!(
        events,
        vec![GenEvent::Tokens {
            ids: vec![5],
            logprobs: vec![TokenLogprob {
                logprob: Some(-0.5),
                top: vec![]
            }],
        }]
    );
}

#[test]
fn null_logprobs_are_unknown_not_errors() {
    let tokens = |logprobs: serde_json::Value| {
        let events = decode(
            Some(2),
            json!({"choices": [{"token_ids": [5, 6], "logprobs": logprobs, "finish_reason": null}]}),
        )
        .unwrap();
        match &events[..] {
            [GenEvent::Tokens { ids, logprobs }] => {
                assert_eq!(ids, &[5, 6]);
                logprobs.clone()
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(tokens(json!(null)), vec![unknown(), unknown()]);
    assert_eq!(
        tokens(json!({"token_logprobs": null, "top_logprobs": null})),
        vec![unknown(), unknown()]
    );
    assert_eq!(
        tokens(json!({"token_logprobs": [null, -0.5], "top_logprobs": null})),
        vec![
            unknown(),
            TokenLogprob {
                logprob: Some(-0.5),
                top: vec![]
            }
        ]
    );
    assert_eq!(
        tokens(
            json!({"token_logprobs": [-0.1, -0.5], "top_logprobs": [null, {"token_id:6": -0.5}]})
        ),
        vec![
            TokenLogprob {
                logprob: Some(-0.1),
                top: vec![]
            },
            TokenLogprob {
                logprob: Some(-0.5),
                top: vec![(6, -0.5)]
            }
        ]
    );
    // vLLM writes -inf as -9999.0: read back as -inf, the sampled token's
    // and an alternative's alike.
    assert_eq!(
        tokens(
            json!({"token_logprobs": [-9999.0, -0.5], "top_logprobs": [null, {"token_id:6": -0.5, "token_id:7": -9999.0}]})
        ),
        vec![
            TokenLogprob {
                logprob: Some(f32::NEG_INFINITY),
                top: vec![]
            },
            TokenLogprob {
                logprob: Some(-0.5),
                top: vec![(6, -0.5), (7, f32::NEG_INFINITY)]
            }
        ]
    );
    // A chunk without the field at all reads the same as null.
    let events = decode(Some(0), json!({"choices": [{"token_ids": [5]}]})).unwrap();
    assert_eq!(
        events,
        vec![GenEvent::Tokens {
            ids: vec![5],
            logprobs: vec![unknown()]
        }]
    );
}

#[test]
fn no_logprobs_asked_gives_none() {
    let events = decode(
        None,
        json!({"choices": [{"token_ids": [5], "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.5], "top_logprobs": null}}]}),
    )
    .unwrap();
    assert_eq!(
        events,
        vec![
            GenEvent::Tokens {
                ids: vec![5],
                logprobs: vec![]
            },
            GenEvent::Done {
                finish_reason: FinishReason::Stop
            },
        ]
    );
}

#[test]
fn empty_and_usage_chunks_give_no_tokens() {
    assert_eq!(
        decode(
            Some(0),
            json!({"choices": [], "usage": {"completion_tokens": 3}})
        )
        .unwrap(),
        vec![]
    );
    assert_eq!(
        decode(
            Some(0),
            json!({"choices": [{"token_ids": [], "logprobs": null, "finish_reason": "abort"}]})
        )
        .unwrap(),
        vec![GenEvent::Done {
            finish_reason: FinishReason::Abort
        }]
    );
}

#[test]
fn malformed_chunks_are_protocol_errors() {
    let protocol = |r: Result<Vec<GenEvent>, BackendError>| {
        assert!(matches!(r, Err(BackendError::Protocol { .. })), "{r:?}");
    };
    protocol(decode(
        Some(0),
        json!({"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.5]}}]}),
    ));
    protocol(decode(None, json!({"choices": [{"text": "a"}]})));
    protocol(decode(None, json!({"id": "x"})));
    protocol(VllmDecoder::new("vl", None).on_data("{not json"));
}

#[test]
fn in_stream_errors_map_by_code() {
    let e = decode(
        None,
        json!({"error": {"message": "too long", "type": "BadRequestError", "code": 400}}),
    )
    .unwrap_err();
    assert!(
        matches!(&e, BackendError::Rejected { message, .. } if message == "too long"),
        "{e}"
    );
    let e = decode(
        None,
        json!({"object": "error", "message": "boom", "type": "InternalServerError", "code": 500}),
    )
    .unwrap_err();
    assert!(matches!(e, BackendError::Status { status: 500, .. }), "{e}");
    let e = decode(None, json!({"error": {"message": "odd"}})).unwrap_err();
    assert!(matches!(e, BackendError::Protocol { .. }), "{e}");
}

#[test]
fn structured_outputs_use_vllms_structured_outputs_field() {
    let b = backend();
    let mut req = request(Some(0));
    let schema = json!({"type": "object", "required": ["a"]});
    req.params.structured = Some(crate::backend::StructuredOutput::JsonSchema(schema.clone()));
    assert_eq!(
        serde_json::to_value(b.request_body(&req)).expect("json")["structured_outputs"],
        json!({"json": schema})
    );
    req.params.structured = Some(crate::backend::StructuredOutput::JsonObject);
    assert_eq!(
        serde_json::to_value(b.request_body(&req)).expect("json")["structured_outputs"],
        json!({"json_object": true})
    );
    req.params.structured = None;
    assert!(serde_json::to_value(b.request_body(&req))
        .expect("json")
        .get("structured_outputs")
        .is_none());
}

/// The backend reads the sampling numbers the client wrote: an `f32` goes
/// out in its shortest form, which a JSON reader (Python's `float`) reads
/// back as the client's decimal. Widened to a JSON number first, 0.7
/// went out as 0.699999988079071.
#[test]
fn sampling_numbers_go_out_as_the_client_wrote_them() {
    let b = backend();
    let mut req = request(None);
    req.params.temperature = Some(0.7);
    req.params.top_p = Some(0.95);
    req.params.min_p = Some(0.05);
    req.params.presence_penalty = Some(0.1);
    req.params.frequency_penalty = Some(-0.3);
    req.params.repetition_penalty = Some(1.1);
    let text = serde_json::to_string(&b.request_body(&req)).unwrap();
    let sent: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (key, decimal) in [
        ("temperature", 0.7),
        ("top_p", 0.95),
        ("min_p", 0.05),
        ("presence_penalty", 0.1),
        ("frequency_penalty", -0.3),
        ("repetition_penalty", 1.1),
    ] {
        assert_eq!(sent[key].as_f64(), Some(decimal), "{key} in {text}");
    }
    assert_ne!(
        json!(0.7f32).as_f64(),
        Some(0.7),
        "the widened form this replaced"
    );
}

fn score_request(ids: Vec<u32>) -> ScoreRequest {
    ScoreRequest {
        request_id: "verify-1".into(),
        ids: Arc::new(ids),
        adapter: None,
    }
}

fn read_prompt_logprobs(
    answer: serde_json::Value,
    ids: &[u32],
) -> Result<Vec<PositionLogprob>, String> {
    prompt_logprobs(
        serde_json::from_value(answer).map_err(|e| e.to_string())?,
        ids,
    )
}

#[test]
fn score_body_asks_for_prompt_logprobs_without_streaming() {
    let body = backend().score_body(&score_request(vec![5, 6, 7]));
    assert_eq!(body["prompt"], json!([5, 6, 7]));
    // The own token's logprob and rank, and the most likely token's.
    assert_eq!(body["prompt_logprobs"], 1);
    assert_eq!(body["max_tokens"], 1);
    assert_eq!(body["stream"], false);
    assert_eq!(body["model"], "m");
}

#[test]
fn prompt_logprobs_are_read_per_position_with_rank() {
    // vLLM's shape: null first, then the own token keyed by its id (with
    // prompt_logprobs > 0 also the top alternatives, ignored here).
    let answer = json!({"choices": [{"index": 0, "text": "", "prompt_logprobs": [
        null,
        {"6": {"logprob": -0.25, "rank": 1, "decoded_token": "a"}},
        {"7": {"logprob": -9999.0, "rank": 40, "decoded_token": "b"},
         "3": {"logprob": -0.01, "rank": 1, "decoded_token": "c"}}
    ]}]});
    let got = read_prompt_logprobs(answer, &[5, 6, 7]).unwrap();
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
            logprob: Some(-0.25),
            argmax: Some(true)
        }
    );
    // vLLM's -9999.0 is its -inf.
    assert_eq!(
        got[2],
        PositionLogprob {
            logprob: Some(f32::NEG_INFINITY),
            argmax: Some(false)
        }
    );
    // A token tied with another for the top has vLLM rank 2 (it counts the
    // tokens at least as likely) and is the argmax, as SGLang reads a tie.
    let tie = json!({"choices": [{"prompt_logprobs": [null,
        {"6": {"logprob": -0.69, "rank": 2}, "9": {"logprob": -0.69, "rank": 2}}]}]});
    let got = read_prompt_logprobs(tie, &[5, 6]).unwrap();
    assert_eq!(
        got[1],
        PositionLogprob {
            logprob: Some(-0.69),
            argmax: Some(true)
        }
    );
    // No rank: the argmax is unknown, the number still counts.
    let answer =
        json!({"choices": [{"prompt_logprobs": [null, {"token_id:6": {"logprob": -1.0}}]}]});
    let got = read_prompt_logprobs(answer, &[5, 6]).unwrap();
    assert_eq!(
        got[1],
        PositionLogprob {
            logprob: Some(-1.0),
            argmax: None
        }
    );
}

#[test]
fn malformed_prompt_logprobs_are_protocol_errors() {
    let missing = json!({"choices": [{"index": 0, "text": ""}]});
    let e = read_prompt_logprobs(missing, &[1, 2]).unwrap_err();
    assert!(e.contains("no prompt_logprobs"), "{e}");
    let short = json!({"choices": [{"prompt_logprobs": [null]}]});
    let e = read_prompt_logprobs(short, &[1, 2]).unwrap_err();
    assert!(e.contains("1 prompt_logprobs entries for 2"), "{e}");
    let other =
        json!({"choices": [{"prompt_logprobs": [null, {"9": {"logprob": -1.0, "rank": 1}}]}]});
    let e = read_prompt_logprobs(other, &[1, 2]).unwrap_err();
    assert!(e.contains("no entry for token 2"), "{e}");
}

/// `https://` backends speak TLS: the first bytes on the wire are a TLS
/// handshake record (0x16), and credentials in the URL show as `***`.
#[tokio::test]
async fn https_backends_open_with_a_tls_handshake() {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let first_byte = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut b = [0u8; 1];
        sock.read_exact(&mut b).await.unwrap();
        b[0]
    });
    let cfg = BackendConfig {
        url: format!("https://user:s3cret@{addr}"),
        kind: crate::config::BackendKind::Vllm,
        name: String::new(),
        model: "m".into(),
        ca_file: Default::default(),
        api_key: Default::default(),
        admin_api_key: Default::default(),
        vllm_api: Default::default(),
    };
    let b = VllmBackend::new(&cfg, &RouterConfig::default()).unwrap();
    assert_eq!(b.name(), format!("https://***@{addr}"));
    let health = tokio::spawn(async move { b.health().await });
    assert_eq!(first_byte.await.unwrap(), 0x16);
    let e = health.await.unwrap().unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
}
