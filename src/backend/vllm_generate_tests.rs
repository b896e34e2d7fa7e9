//! Tests of the `/inference/v1/generate` body and of [`GenerateDecoder`]:
//! the collapsed prompt and `content_parts` for images, logprobs with ids
//! (vLLM's "no number" entry, the extra sampled candidate), the echoed
//! prompt's drift check, weight versions and in-stream errors. Over HTTP it
//! is tested in `tests/vision_vllm.rs`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::backend::{FinishReason, ImageInputs, SamplingParams};
use crate::render::image::PromptImage;
use crate::render::vision::ImageGrid;

const PAD: u32 = 151655;

fn image(sha: &str) -> PromptImage {
    PromptImage {
        sha256: sha.into(),
        mime: "image/png".into(),
        width: 2,
        height: 2,
        bytes: Arc::new(vec![1, 2, 3]),
        grid: ImageGrid {
            resized_height: 28,
            resized_width: 28,
            grid_t: 1,
            grid_h: 2,
            grid_w: 2,
            pad_count: 1,
        },
        encoded: Default::default(),
    }
}

fn request(logprobs: Option<u32>, images: bool) -> GenerateRequest {
    let (prompt, images) = if images {
        (
            vec![
                1, 151652, PAD, PAD, PAD, 151653, 2, 151652, PAD, PAD, 151653,
            ],
            Some(ImageInputs {
                pad_id: PAD,
                images: Arc::new(vec![image("a"), image("b")]),
                offsets: Arc::new(vec![2, 8]),
            }),
        )
    } else {
        (vec![1, 2, 3], None)
    };
    GenerateRequest {
        request_id: "req-1".into(),
        prompt_ids: Arc::new(prompt),
        params: SamplingParams {
            max_tokens: 4,
            temperature: Some(0.5),
            seed: Some(7),
            stop_token_ids: vec![2],
            logprobs,
            ..Default::default()
        },
        images,
        adapter: None,
    }
}

fn decode(
    req: &GenerateRequest,
    chunks: &[serde_json::Value],
) -> Result<Vec<GenEvent>, BackendError> {
    let mut d = GenerateDecoder::new("vl", req);
    let mut out = Vec::new();
    for c in chunks {
        out.extend(d.on_data(&c.to_string())?);
    }
    Ok(out)
}

#[test]
fn a_text_body_is_tokens_only_with_vllms_sampling_names() {
    let req = request(Some(2), false);
    assert_eq!(
        serde_json::to_value(body(&req, Some("m"))).unwrap(),
        json!({
            "request_id": "req-1",
            "token_ids": [1, 2, 3],
            "sampling_params": {
                "max_tokens": 4, "n": 1, "temperature": 0.5, "seed": 7,
                "stop_token_ids": [2], "logprobs": 2,
                "skip_special_tokens": false, "spaces_between_special_tokens": false,
            },
            "model": "m",
            "stream": true,
            "output_mode": "tokens",
        })
    );
}

#[test]
fn an_image_body_has_one_pad_per_image_and_the_images_in_order() {
    let req = request(None, true);
    let v = serde_json::to_value(body(&req, None)).unwrap();
    assert_eq!(
        v["token_ids"],
        json!([1, 151652, PAD, 151653, 2, 151652, PAD, 151653])
    );
    assert_eq!(
        v["content_parts"],
        json!([
            {"type": "image_url", "url": "data:image/png;base64,AQID"},
            {"type": "image_url", "url": "data:image/png;base64,AQID"},
        ])
    );
    assert_eq!(v["return_token_ids"], json!(true));
    assert!(v.get("model").is_none());
}

#[test]
fn logprobs_keep_the_top_k_and_read_a_missing_entry_as_no_number() {
    let req = request(Some(1), false);
    let events = decode(
        &req,
        &[
            json!({"choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": null,
            "logprobs": {"content": [
                {"token_id": 5, "logprob": -1.5, "rank": 3, "top_logprobs": [
                    {"token_id": 5, "logprob": -1.5, "rank": 3},
                    {"token_id": 9, "logprob": -0.25, "rank": 1}]},
                {"token_id": 6, "logprob": -9999.0, "top_logprobs": []}]}}]}),
        ],
    )
    .unwrap();
    assert_eq!(
        events,
        vec![GenEvent::Tokens {
            ids: vec![5, 6],
            logprobs: vec![
                TokenLogprob {
                    logprob: Some(-1.5),
                    top: vec![(9, -0.25)]
                },
                TokenLogprob {
                    logprob: None,
                    top: vec![]
                },
            ],
        }]
    );
}

#[test]
fn a_clamped_logprob_is_minus_infinity_and_a_wrong_id_is_refused() {
    let req = request(Some(0), false);
    let events = decode(
        &req,
        &[
            json!({"choices": [{"token_ids": [5], "logprobs": {"content": [
            {"token_id": 5, "logprob": -9999.0, "top_logprobs": [
                {"token_id": 5, "logprob": -9999.0}]}]}}]}),
        ],
    )
    .unwrap();
    assert_eq!(
        events,
        vec![GenEvent::Tokens {
            ids: vec![5],
            logprobs: vec![TokenLogprob {
                logprob: Some(f32::NEG_INFINITY),
                top: vec![]
            }],
        }]
    );
    let err = decode(
        &req,
        &[json!({"choices": [{"token_ids": [5], "logprobs": {"content": [
            {"token_id": 8, "logprob": -1.0, "top_logprobs": [{"token_id": 8, "logprob": -1.0}]}]}}]})],
    )
    .unwrap_err();
    assert!(err.to_string().contains("token 8 where token 5"), "{err}");
    let err = decode(
        &req,
        &[json!({"choices": [{"token_ids": [5, 6], "logprobs": {"content": []}}]})],
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("0 logprobs for 2 token ids"),
        "{err}"
    );
}

#[test]
fn the_last_chunk_reports_versions_before_the_end() {
    let req = request(None, false);
    let events = decode(
        &req,
        &[
            json!({"choices": [{"token_ids": [5]}]}),
            json!({"choices": [{"token_ids": [6], "finish_reason": "length",
                "weight_versions": [{"version": "v1", "start": 0, "end": 2}]}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 3}}),
        ],
    )
    .unwrap();
    assert_eq!(
        events,
        vec![
            GenEvent::Tokens {
                ids: vec![5],
                logprobs: vec![]
            },
            GenEvent::Versions(vec![ServerSpan {
                version: "v1".into(),
                start: 0
            }]),
            GenEvent::Tokens {
                ids: vec![6],
                logprobs: vec![]
            },
            GenEvent::Done {
                finish_reason: FinishReason::Length
            },
        ]
    );
}

#[test]
fn the_echoed_prompt_is_checked_once_against_the_recorded_one() {
    let req = request(None, true);
    let same = req.prompt_ids.to_vec();
    let events = decode(
        &req,
        &[json!({"prompt_token_ids": same, "choices": [{"token_ids": [5]}]})],
    )
    .unwrap();
    assert!(!events.iter().any(|e| matches!(e, GenEvent::PromptDrift(_))));

    let mut longer = req.prompt_ids.to_vec();
    longer.insert(3, PAD);
    let events = decode(
        &req,
        &[
            json!({"prompt_token_ids": longer, "choices": [{"token_ids": [5]}]}),
            json!({"prompt_token_ids": [1], "choices": [{"token_ids": [6]}]}),
        ],
    )
    .unwrap();
    let drifts: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            GenEvent::PromptDrift(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(drifts.len(), 1);
    assert_eq!(drifts[0].position, 5);
    assert_eq!(drifts[0].cause, "image_placeholder");
    assert_eq!(drifts[0].details["backend_len"], json!(12));
}

#[test]
fn an_error_chunk_is_an_error_with_its_status() {
    let req = request(None, false);
    let err = decode(
        &req,
        &[json!({"error": {"message": "bad image", "type": "BadRequestError", "code": 400}})],
    )
    .unwrap_err();
    assert!(matches!(err, BackendError::Rejected { .. }), "{err:?}");
    assert!(err.to_string().contains("bad image"));
    let err = decode(&req, &[json!({"error": {"message": "boom", "code": 500}})]).unwrap_err();
    assert!(!matches!(err, BackendError::Rejected { .. }), "{err:?}");
}
