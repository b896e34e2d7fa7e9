//! The one error type the HTTP layer returns, and the one place errors become
//! OpenAI-shaped JSON (`{"error": {message, type, param, code}}`) or an SSE
//! error event. Handlers convert module errors into [`ApiError`] with `?`;
//! each module's `From<ItsError> for ApiError` lives beside its error type,
//! so this module depends on no other module of the crate.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400 invalid_request_error, naming the offending parameter.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 404 for `model`, naming the ids that are served.
    pub fn model_not_found_among(model: &str, served: &[String]) -> Self {
        ApiError {
            message: format!(
                "The model `{model}` does not exist. Served: {}.",
                served.join(", ")
            ),
            ..Self::model_not_found(model)
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist."),
            )
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("not_found"),
            ..Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong `Authorization: Bearer` token",
            )
        }
    }

    /// 429: the gateway is at its concurrency limit (OpenAI's rate-limit
    /// shape; the caller adds `Retry-After`).
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("rate_limit_exceeded"),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "requests", message)
        }
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
    }

    /// 409: the request conflicts with the state it finds.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body, also used as the payload of an SSE error event.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or(serde_json::Value::Null)
    }
}

impl ApiError {
    /// Anthropic's error `type` and HTTP status for this error: its status
    /// kept, but an overload (503) as Anthropic's 529 `overloaded_error`.
    pub fn anthropic_kind(&self) -> (StatusCode, &'static str) {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        };
        let status = match self.status.as_u16() {
            503 => StatusCode::from_u16(529).unwrap_or(self.status),
            _ => self.status,
        };
        (status, kind)
    }

    /// The body in Anthropic's shape: `{"type": "error", "error": {"type",
    /// "message"}}` (also the payload of a stream's `error` event).
    pub fn anthropic_body(&self) -> serde_json::Value {
        let (_, kind) = self.anthropic_kind();
        serde_json::json!({"type": "error", "error": {"type": kind, "message": self.message}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut resp = (status, Json(self.body())).into_response();
        // `api::around` reads it (the 5xx log line, the 413 check) without
        // re-parsing the body.
        resp.extensions_mut().insert(self);
        resp
    }
}

/// A query string that does not parse: 400 naming the parameter when the
/// deserializer's path or an unknown field gives it.
impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        let text = e.body_text();
        ApiError {
            param: query_param_of(&text),
            ..Self::bad_request(text)
        }
    }
}

/// A JSON body the extractor refused: a body over the size limit stays a
/// 413 and one without `Content-Type: application/json` a 415; anything
/// else (bad syntax, a wrong type) is a 400 naming the field when the
/// message gives it.
impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        let text = e.body_text();
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE || status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            return Self::new(status, "invalid_request_error", text);
        }
        ApiError {
            param: query_param_of(&text),
            ..Self::bad_request(text)
        }
    }
}

/// `…: prompt_length: invalid digit found in string` → `prompt_length`;
/// `…: unknown field `groupsize`, expected …` → `groupsize`.
fn query_param_of(text: &str) -> Option<String> {
    let (_, detail) = text.split_once(": ")?;
    if let Some((_, rest)) = detail.split_once("unknown field `") {
        return rest.split('`').next().map(str::to_string);
    }
    let (name, _) = detail.split_once(": ")?;
    let is_name = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    is_name.then(|| name.to_string())
}

/// `e`'s text followed by each of its causes' (`a: b: c`): minijinja and
/// hyper name only the kind of failure at the top.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
