//! Anthropic's Messages API: `POST /v1/messages` (parse → translate onto a
//! chat request, `surface::messages` → the shared chat run → respond as a
//! `Message` or its event stream) and `POST /v1/messages/count_tokens`.
//! Errors on these routes are in Anthropic's shape (`api::around`); the
//! client role's token may come as `x-api-key` (`api::auth`). The
//! `anthropic-version` and `anthropic-beta` headers are kept with the
//! recorded request, under `tito_headers`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::RawPathParams;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{json, Value as Json};

use super::request::{parse_json, parse_value, ChatRequest};
use super::run::{self, Surface};
use super::{AppState, Picked};
use crate::call::assemble::StopReason;
use crate::call::{Answer, ParseSetup};
use crate::error::ApiError;
use crate::metrics::PHASE;
use crate::surface::messages as wire;
use crate::surface::Api;

mod events;

const ROUTE: &str = "/v1/messages";

/// The routes whose errors are in Anthropic's shape.
pub const ROUTES: [&str; 2] = ["/v1/messages", "/v1/messages/count_tokens"];

pub fn routes() -> axum::Router<crate::api::Gateway> {
    axum::Router::new()
        .route("/v1/messages", post(create))
        .route("/v1/messages/count_tokens", post(count_tokens))
}

/// A fresh message id: `msg_` and 96 random bits.
fn new_message_id() -> String {
    let (a, b): (u64, u32) = (rand::random(), rand::random());
    format!("msg_{a:016x}{b:08x}")
}

/// The request as recorded: the body, with the Anthropic headers it came
/// with under `tito_headers`.
fn received_with_headers(mut received: Json, headers: &HeaderMap) -> Json {
    let mut kept = serde_json::Map::new();
    for name in ["anthropic-version", "anthropic-beta"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            kept.insert(name.into(), json!(v));
        }
    }
    if let (false, Some(obj)) = (kept.is_empty(), received.as_object_mut()) {
        obj.insert("tito_headers".into(), Json::Object(kept));
    }
    received
}

pub async fn create(
    path: RawPathParams,
    headers: HeaderMap,
    Picked(state, body): Picked,
) -> Result<Response, ApiError> {
    let handled = Instant::now();
    let ids = super::PathIds::of(&path);
    let (call, surface) = tracing::info_span!(target: PHASE, "parse")
        .in_scope(|| parse(&state, ids, &headers, body))?;
    run::run(state, call, &headers, surface, handled).await
}

fn parse(
    state: &AppState,
    path: super::PathIds,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(run::ChatCall, MessagesSurface), ApiError> {
    let received = parse_json(&body)?;
    if received.get("tito_headers").is_some() {
        return Err(ApiError::invalid(
            "tito_headers",
            "`tito_headers` is where tito records the request's Anthropic headers; a request may not set it",
        ));
    }
    let translated = wire::translate(&received, state.trajectories.switches().enable_thinking)?;
    let req: ChatRequest = parse_value(&translated.chat)?;
    req.check()?;
    super::unsupported::chat(&translated.chat, &[])?;
    let token_ids = req.return_token_ids;
    let received = received_with_headers(received, headers);
    let call = super::chat::chat_call(
        state,
        path,
        headers,
        req,
        received,
        body,
        Api::Messages,
        new_message_id(),
    )?;
    let surface = MessagesSurface {
        model: state.served_id(call.adapter.as_deref()),
        stop_sequences: Arc::new(translated.stop_sequences),
        token_ids,
    };
    Ok((call, surface))
}

/// The Messages answer of a chat call.
struct MessagesSurface {
    model: String,
    stop_sequences: Arc<Vec<String>>,
    token_ids: bool,
}

/// `stop_reason` / `stop_sequence` of a choice.
fn stop_of(choice: &crate::call::ChoiceResult, stop_sequences: &[String]) -> (Json, Json) {
    let stopped_on = match &choice.stop_reason {
        Some(StopReason::Text(s)) => Some(s.as_str()),
        _ => None,
    };
    wire::stop_reason(choice.finish_reason, stopped_on, stop_sequences)
}

impl Surface for MessagesSurface {
    type Stream = events::MessagesEncoder;

    fn route(&self) -> &'static str {
        ROUTE
    }

    fn overhead_label(&self) -> &'static str {
        "messages"
    }

    fn body(&self, _state: &AppState, answer: &Answer) -> Result<Response, ApiError> {
        let choice = answer
            .choices
            .first()
            .ok_or_else(|| ApiError::internal("a message without a choice"))?;
        let mut m = wire::message(
            &answer.request_id,
            &self.model,
            &choice.served,
            stop_of(choice, &self.stop_sequences),
            answer.prompt_tokens(),
            choice.ids.len(),
        );
        if self.token_ids {
            m["prompt_token_ids"] = json!(answer.prompts.first().map(|p| p.as_slice()));
            m["token_ids"] = json!(choice.ids);
        }
        Ok(axum::Json(m).into_response())
    }

    fn stream(
        &self,
        _state: &AppState,
        _created: u64,
        parsing: Option<Arc<ParseSetup>>,
        forced: bool,
    ) -> events::MessagesEncoder {
        events::MessagesEncoder::new(
            self.model.clone(),
            self.stop_sequences.clone(),
            parsing,
            forced,
        )
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the prompt the
/// request renders to with the served model's template.
async fn count_tokens(Picked(state, body): Picked) -> Result<Response, ApiError> {
    let mut received = parse_json(&body)?;
    // The count needs no `max_tokens`; the translation does.
    if let Some(obj) = received.as_object_mut() {
        obj.entry("max_tokens").or_insert(json!(1));
        if let Some(t) = obj.get_mut("thinking") {
            // A budget is checked against `max_tokens`, which a count has
            // none of: only the switch matters here.
            if t.get("type").and_then(Json::as_str) == Some("enabled") {
                *t = json!({"type": "enabled", "budget_tokens": 1024});
                obj.insert("max_tokens".into(), json!(1025));
            }
        }
    }
    let translated = wire::translate(&received, state.trajectories.switches().enable_thinking)?;
    let n = super::count::prompt_tokens(&state, &translated.chat).await?;
    Ok(axum::Json(json!({"input_tokens": n})).into_response())
}
