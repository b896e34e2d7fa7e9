//! The agent APIs tito serves beside OpenAI's Chat Completions, as
//! translations onto the one chat call path: OpenAI's Responses API
//! ([`responses`]) and Anthropic's Messages API ([`messages`]).
//!
//! Each surface's request becomes a chat request (messages, tools,
//! sampling) that the chat path renders, routes, assembles and records; the
//! recorded call keeps the request as received and which surface it came
//! through ([`Api`]). The translation of a request's history into chat
//! messages lives here, below `trajectory`, because a trajectory rebuilt
//! from the store must translate a stored request exactly as the live call
//! did ([`chat_messages`]). The answer's shape for each surface is built
//! here too, from what the call recorded, so an answer given live and one
//! read back later (`GET /v1/responses/{id}`) are the same object.
//!
//! Must not: render, tokenize, route or touch the store; know HTTP beyond
//! the error shapes.

pub mod messages;
pub mod responses;

use serde_json::Value as Json;

use crate::error::ApiError;

/// The surface a call came through, as recorded with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
    Responses,
    Messages,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }

    pub fn from_name(name: &str) -> Option<Api> {
        Some(match name {
            "chat" => Api::Chat,
            "completions" => Api::Completions,
            "responses" => Api::Responses,
            "messages" => Api::Messages,
            _ => return None,
        })
    }
}

/// A request a surface cannot translate: the parameter at fault (in the
/// surface's own names, e.g. `input[2].content[0]`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SurfaceError {
    pub param: String,
    pub message: String,
    /// `unsupported_parameter` for a feature tito does not implement.
    pub code: Option<&'static str>,
}

impl SurfaceError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        SurfaceError {
            param: param.into(),
            message: message.into(),
            code: None,
        }
    }

    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        SurfaceError {
            code: Some("unsupported_parameter"),
            ..Self::invalid(param, message)
        }
    }
}

impl From<SurfaceError> for ApiError {
    fn from(e: SurfaceError) -> Self {
        let api = ApiError::invalid(&e.param, e.message);
        match e.code {
            Some(code) => api.with_code(code),
            None => api,
        }
    }
}

/// What a translated request's history is: the chat messages, and how many
/// of them lead it from the request's own instructions (a Responses call's
/// `instructions`), which a later call continuing it does not inherit.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    pub messages: Vec<Json>,
    pub instructions: usize,
}

/// The chat template's switches a surface sets when the template reads
/// them: Responses' `reasoning.effort` as `reasoning_effort`, Messages'
/// `thinking` as `enable_thinking`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Switches {
    pub reasoning_effort: bool,
    pub enable_thinking: bool,
}

/// The chat request a recorded call's `request` translated to when it ran
/// through `api`, and how many of its messages came from its instructions:
/// `None` for a chat or completions call (the request is its own chat
/// request) and for a request that no longer translates. `previous` gives
/// the conversation a Responses call continued (`previous_response_id`).
pub fn chat_request(
    api: Api,
    request: &Json,
    previous: impl Fn(&str) -> Option<Vec<Json>>,
    switches: Switches,
) -> Option<(Json, usize)> {
    match api {
        Api::Chat | Api::Completions => None,
        Api::Responses => {
            let prev = match request.get("previous_response_id").and_then(Json::as_str) {
                Some(id) => Some(previous(id)?),
                None => None,
            };
            let t =
                responses::translate(request, prev.as_deref(), switches.reasoning_effort).ok()?;
            Some((t.chat, t.instructions))
        }
        Api::Messages => {
            let t = messages::translate(request, switches.enable_thinking).ok()?;
            Some((t.chat, 0))
        }
    }
}

/// A message's content for the chat template: a string as it is, a list of
/// text parts (`{"type": T, "text"}`, `T` one of `types`) as chat text parts
/// (`{"type": "text", "text"}`), which normalization joins as it joins any
/// chat message's parts; `param` names the value in an error. An image part
/// whose type is in `types` (Responses' `input_image`, Messages' `image`)
/// becomes a chat `image_url` part, checked on the chat path.
pub(crate) fn chat_content(
    value: &Json,
    types: &[&str],
    param: &str,
) -> Result<Json, SurfaceError> {
    match value {
        Json::String(s) => Ok(Json::String(s.clone())),
        Json::Array(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for (i, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Json::as_str).unwrap_or_default();
                if !types.contains(&kind) {
                    return Err(unsupported_part(&format!("{param}[{i}]"), kind));
                }
                if let Some(url) = image_url(p, kind, &format!("{param}[{i}]"))? {
                    out.push(serde_json::json!({"type": "image_url", "image_url": {"url": url}}));
                    continue;
                }
                let t = p.get("text").and_then(Json::as_str).ok_or_else(|| {
                    SurfaceError::invalid(
                        format!("{param}[{i}].text"),
                        format!("`{param}[{i}].text` must be a string"),
                    )
                })?;
                out.push(serde_json::json!({"type": "text", "text": t}));
            }
            Ok(Json::Array(out))
        }
        _ => Err(SurfaceError::invalid(
            param,
            format!("`{param}` must be a string or a list of content parts"),
        )),
    }
}

/// The URL of an image part: Responses' `{"type": "input_image",
/// "image_url"}` or Messages' `{"type": "image", "source": {"type":
/// "base64", "media_type", "data"} | {"type": "url", "url"}}`; `None` for a
/// part of another type.
pub(crate) fn image_url(
    part: &Json,
    kind: &str,
    param: &str,
) -> Result<Option<String>, SurfaceError> {
    let field = |v: Option<&Json>, name: &str| {
        v.and_then(Json::as_str).map(str::to_string).ok_or_else(|| {
            SurfaceError::invalid(
                format!("{param}.{name}"),
                format!("`{param}.{name}` must be a string"),
            )
        })
    };
    match kind {
        "input_image" => {
            if part.get("file_id").is_some_and(|f| !f.is_null()) {
                return Err(SurfaceError::unsupported(
                    format!("{param}.file_id"),
                    format!("`{param}.file_id`: uploaded files are not supported; send `image_url` as a data: URL"),
                ));
            }
            field(part.get("image_url"), "image_url").map(Some)
        }
        "image" => {
            let source = part.get("source");
            match source.and_then(|s| s.get("type")).and_then(Json::as_str) {
                Some("base64") => {
                    let source = source.unwrap_or(&Json::Null);
                    let mime = field(source.get("media_type"), "source.media_type")?;
                    let data = field(source.get("data"), "source.data")?;
                    Ok(Some(format!("data:{mime};base64,{data}")))
                }
                Some("url") => {
                    field(source.and_then(|s| s.get("url")), "source.url").map(Some)
                }
                _ => Err(SurfaceError::invalid(
                    format!("{param}.source"),
                    format!("`{param}.source` must be {{\"type\": \"base64\", \"media_type\", \"data\"}} or {{\"type\": \"url\", \"url\"}}"),
                )),
            }
        }
        _ => Ok(None),
    }
}

fn unsupported_part(param: &str, kind: &str) -> SurfaceError {
    let what = if kind.is_empty() {
        "a part without a `type`".to_string()
    } else {
        format!("content of type `{kind}`")
    };
    SurfaceError::unsupported(
        param,
        format!("`{param}`: {what} is not supported; the served model takes text and images"),
    )
}
