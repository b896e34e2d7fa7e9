//! vLLM's token-in route that takes images: `POST {url}/inference/v1/generate`
//! (`vllm serve --enable-scale-out`), chosen per backend with
//! `vllm_api = "generate"`. Checked against vllm 0.34.0,
//! `vllm/entrypoints/scale_out/token_in_token_out/`:
//!
//! - The body is `GenerateRequest` (`protocol.py` lines 225-256): `token_ids`,
//!   `sampling_params` (vLLM's `SamplingParams` fields: `max_tokens`,
//!   `logprobs`, `stop_token_ids`, `structured_outputs`, ...), `stream`,
//!   `return_token_ids`, `output_mode: "tokens"`, and `content_parts`
//!   (`[{"type": "image_url", "url": ...}]`), which the server resolves into
//!   a `TokensPrompt` with `multi_modal_data` (`serving.py` lines 311-333).
//! - Images: the prompt holds one `<|image_pad|>` per image; vLLM replaces
//!   the i-th pad with the i-th image's run (`PromptReplacement` in
//!   `model_executor/models/qwen2_vl.py` lines 1236-1269), the run tito's
//!   ids hold. `return_token_ids` makes the first chunk carry the prompt
//!   after that expansion (`prompt_token_ids`, `serving.py` lines 824-827),
//!   which is checked against the recorded prompt.
//! - A stream is SSE `data: {json}` chunks ended by `data: [DONE]`
//!   (`serving.py` lines 841-888). A chunk is `{"choices": [{"token_ids",
//!   "logprobs": {"content": [{"token_id", "logprob", "rank",
//!   "top_logprobs": [{"token_id", "logprob", "rank"}]}]} | null,
//!   "finish_reason", "weight_versions"}]}`; an error is `{"error":
//!   {"message", "type", "code"}}`.
//! - Logprobs (`_create_tokens_logprobs`, `serving.py` lines 962-1007): a
//!   sampled token with no number comes as `logprob: -9999.0` and no
//!   `top_logprobs`, read as "no number" (`None`); otherwise `top_logprobs`
//!   lists the sampled token and the top k, and -9999.0 is vLLM's -inf.
//!
//! Owns: this route's wire format. Must not: render, route or record.

use serde::{Deserialize, Serialize};

use super::pump::EventDecoder;
use super::vllm::{finish_reason, from_vllm, VllmStructured, WireSpan};
use super::{
    BackendError, GenEvent, GenerateRequest, ServerSpan, SharedSampling, StructuredOutput,
    TokenLogprob,
};

/// The route, relative to the backend's URL.
pub const PATH: &str = "/inference/v1/generate";

/// The body of one `/inference/v1/generate` request.
#[derive(Serialize)]
pub struct GenerateBody<'a> {
    request_id: &'a str,
    token_ids: std::borrow::Cow<'a, [u32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_parts: Option<Vec<ContentPart<'a>>>,
    sampling_params: Sampling<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    stream: bool,
    /// Asked with images only: the expanded prompt comes back to be checked.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    return_token_ids: bool,
    output_mode: &'static str,
}

#[derive(Serialize)]
struct ContentPart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    url: &'a str,
}

#[derive(Serialize)]
struct Sampling<'a> {
    max_tokens: u32,
    n: u32,
    #[serde(flatten)]
    shared: SharedSampling<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    structured_outputs: Option<VllmStructured<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<u32>,
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
}

/// The body for `req`; `model` is the backend's configured model id.
pub fn body<'a>(req: &'a GenerateRequest, model: Option<&'a str>) -> GenerateBody<'a> {
    let p = &req.params;
    let (token_ids, content_parts) = match &req.images {
        Some(inputs) => (
            inputs.collapsed(&req.prompt_ids).into(),
            Some(
                inputs
                    .images
                    .iter()
                    .map(|im| ContentPart {
                        kind: "image_url",
                        url: im.data_url(),
                    })
                    .collect(),
            ),
        ),
        None => (req.prompt_ids.as_slice().into(), None),
    };
    GenerateBody {
        request_id: &req.request_id,
        token_ids,
        content_parts,
        sampling_params: Sampling {
            max_tokens: p.max_tokens,
            n: 1,
            shared: SharedSampling::of(p),
            seed: p.seed,
            structured_outputs: p.structured.as_ref().map(|s| match s {
                StructuredOutput::JsonObject => VllmStructured::JsonObject(true),
                StructuredOutput::JsonSchema(s) => VllmStructured::Json(s),
            }),
            logprobs: p.logprobs,
            // Stop strings are matched on text: keep every token in it.
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
        },
        // An adapter is asked by its name as the model, as on /v1/completions.
        model: req.adapter.as_deref().or(model),
        stream: true,
        return_token_ids: req.images.is_some(),
        output_mode: "tokens",
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    logprobs: Option<Logprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    weight_versions: Option<Vec<WireSpan>>,
}

#[derive(Deserialize)]
struct Logprobs {
    #[serde(default)]
    content: Option<Vec<Position>>,
}

#[derive(Deserialize)]
struct Position {
    token_id: u32,
    logprob: f64,
    #[serde(default)]
    top_logprobs: Vec<Candidate>,
}

#[derive(Deserialize)]
struct Candidate {
    token_id: u32,
    logprob: f64,
}

/// Turns `/inference/v1/generate` chunks into events.
pub struct GenerateDecoder {
    backend: String,
    logprobs: Option<u32>,
    /// With images, the prompt tito records, checked once against the echo.
    expected_prompt: Option<std::sync::Arc<Vec<u32>>>,
}

impl GenerateDecoder {
    pub fn new(backend: &str, req: &GenerateRequest) -> Self {
        GenerateDecoder {
            backend: backend.to_string(),
            logprobs: req.params.logprobs,
            expected_prompt: req.images.as_ref().map(|_| req.prompt_ids.clone()),
        }
    }

    fn protocol(&self, message: impl Into<String>) -> BackendError {
        BackendError::Protocol {
            backend: self.backend.clone(),
            message: message.into(),
        }
    }

    fn choice_events(&self, choice: Choice) -> Result<Vec<GenEvent>, BackendError> {
        let ids = choice
            .token_ids
            .ok_or_else(|| self.protocol("chunk has no token_ids"))?;
        let mut events = Vec::with_capacity(2);
        // The report first: the pump stops reading once a choice is done.
        if let Some(spans) = choice.weight_versions.filter(|s| !s.is_empty()) {
            events.push(GenEvent::Versions(
                spans
                    .into_iter()
                    .map(|s| ServerSpan {
                        version: s.version,
                        start: s.start,
                    })
                    .collect(),
            ));
        }
        if !ids.is_empty() {
            let logprobs = match self.logprobs {
                Some(k) => {
                    token_logprobs(choice.logprobs, &ids, k).map_err(|m| self.protocol(m))?
                }
                None => Vec::new(),
            };
            events.push(GenEvent::Tokens { ids, logprobs });
        }
        if let Some(fr) = finish_reason(choice.finish_reason.as_deref()) {
            events.push(GenEvent::Done { finish_reason: fr });
        }
        Ok(events)
    }
}

/// One `TokenLogprob` per id. No `logprobs` (or no `content`) leaves every
/// token without a number; a position must name the id it is for.
fn token_logprobs(lp: Option<Logprobs>, ids: &[u32], k: u32) -> Result<Vec<TokenLogprob>, String> {
    let Some(content) = lp.and_then(|l| l.content) else {
        return Ok(vec![
            TokenLogprob {
                logprob: None,
                top: Vec::new(),
            };
            ids.len()
        ]);
    };
    if content.len() != ids.len() {
        return Err(format!(
            "{} logprobs for {} token ids",
            content.len(),
            ids.len()
        ));
    }
    let keep = usize::try_from(k).unwrap_or(usize::MAX);
    content
        .into_iter()
        .zip(ids)
        .map(|(pos, &id)| {
            if pos.token_id != id {
                return Err(format!(
                    "a logprob for token {} where token {id} was sampled",
                    pos.token_id
                ));
            }
            if pos.top_logprobs.is_empty() {
                // vLLM's "no entry for the sampled token": no number.
                return Ok(TokenLogprob {
                    logprob: None,
                    top: Vec::new(),
                });
            }
            let mut top: Vec<(u32, f32)> = pos
                .top_logprobs
                .into_iter()
                .map(|c| (c.token_id, from_vllm(c.logprob)))
                .collect();
            // The sampled token is listed besides the top k: keep the top k.
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            top.truncate(keep);
            Ok(TokenLogprob {
                logprob: Some(from_vllm(pos.logprob)),
                top,
            })
        })
        .collect()
}

impl EventDecoder for GenerateDecoder {
    fn on_data(&mut self, data: &str) -> Result<Vec<GenEvent>, BackendError> {
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| self.protocol(format!("bad stream chunk: {e}")))?;
        if let Some(e) = chunk.error {
            let message = e
                .get("message")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("error inside the stream")
                .to_string();
            return Err(
                match e
                    .get("code")
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|c| u16::try_from(c).ok())
                {
                    Some(c) if c >= 400 => super::status_error(&self.backend, c, message),
                    _ => self.protocol(message),
                },
            );
        }
        let mut events = Vec::new();
        if let (Some(echoed), Some(expected)) =
            (chunk.prompt_token_ids, self.expected_prompt.take())
        {
            events.extend(super::prompt_drift(&expected, &echoed));
        }
        let choices = chunk
            .choices
            .ok_or_else(|| self.protocol("chunk has no choices"))?;
        for choice in choices {
            events.extend(self.choice_events(choice)?);
        }
        Ok(events)
    }
}

#[cfg(test)]
#[path = "vllm_generate_tests.rs"]
mod tests;
