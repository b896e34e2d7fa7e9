//! What every request to the gateway's routes passes through, once, around
//! its handler: its request id and span ([`request_id`]), the request
//! metrics, the log line of a 5xx, the OpenAI shape of axum's body-size
//! rejection, and Anthropic's shape for every error of a Messages route. (An error inside a stream, after its 200, is logged where the
//! stream reports it: see `sse`.)
//!
//! One middleware, not four: each `from_fn` layer clones the router's boxed
//! service and boxes a future for every request, so every layer is paid on
//! every call.
//!
//! Owns: the request's span, `X-Request-Id` on the answer,
//! `tito_requests_total`, `tito_request_duration_seconds`,
//! `tito_server_errors_total`. Must not: change a successful answer.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::request_id;
use crate::error::ApiError;

/// Middleware over every route; its state is `server.max_body_bytes`.
pub async fn around(State(limit): State<usize>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id::of(&req);
    // At ERROR level so that the span, and the id on every line inside it,
    // exists whatever level RUST_LOG lets through.
    let span = tracing::error_span!("request", request_id = %id,
        method = %req.method(), path = %req.uri().path());
    // A shared copy of the route template (no new string per request).
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let method = req.method().clone();
    let named = named_trajectory(&req);

    let mut resp = next.run(req).instrument(span.clone()).await;

    let status = resp.status();
    crate::metrics::request(route, status.as_u16(), started.elapsed());
    let _entered = span.enter();
    if status.is_server_error() {
        let trajectory = resp
            .headers()
            .get("x-trajectory-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or(named)
            .unwrap_or_default();
        let cause = resp
            .extensions()
            .get::<ApiError>()
            .map_or("", |e| e.message.as_str());
        tracing::error!(%method, route = %route, trajectory = %trajectory,
            status = %status, cause, "request failed");
        crate::metrics::server_error(route);
    }
    let ours = resp.extensions().get::<ApiError>().is_some();
    if status == StatusCode::PAYLOAD_TOO_LARGE && !ours {
        resp = too_large(limit);
    } else if status.is_client_error() && !ours && is_plain_text(&resp) {
        resp = openai_shaped(resp).await;
    }
    if resp.status().is_client_error() || resp.status().is_server_error() {
        let anthropic = super::messages::ROUTES.iter().any(|r| route.ends_with(r));
        if anthropic {
            resp = anthropic_shaped(resp);
        }
    }
    tracing::debug!(
        status = resp.status().as_u16(),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "request answered"
    );
    request_id::echo(&mut resp, &id);
    resp
}

/// The trajectory a request names in its path (`/t/{id}/...`, also under
/// `/g/{gid}`) or header, for the log line of a 5xx that carries none in
/// its answer.
fn named_trajectory(req: &Request) -> Option<String> {
    let path = req.uri().path();
    let path = path
        .strip_prefix("/g/")
        .and_then(|rest| rest.find('/').map(|at| &rest[at..]))
        .unwrap_or(path);
    path.strip_prefix("/t/")
        .and_then(|rest| rest.split('/').next())
        .map(str::to_string)
        .or_else(|| {
            req.headers()
                .get("x-trajectory-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
}

fn is_plain_text(resp: &Response) -> bool {
    resp.headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/plain"))
}

/// An extractor's plain-text refusal (a path that is not UTF-8, a method a
/// route does not take) in OpenAI's shape, with its status, its text as the
/// message and its other headers (`Allow`).
async fn openai_shaped(resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let message = String::from_utf8_lossy(&text).trim().to_string();
    let mut shaped = ApiError::new(parts.status, "invalid_request_error", message).into_response();
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            shaped.headers_mut().insert(name.clone(), value.clone());
        }
    }
    shaped
}

/// An error of a Messages route in Anthropic's shape, its headers kept
/// (`Retry-After`, `WWW-Authenticate`, `X-Trajectory-Id`).
fn anthropic_shaped(resp: Response) -> Response {
    let Some(e) = resp.extensions().get::<ApiError>().cloned() else {
        return resp;
    };
    let (parts, _) = resp.into_parts();
    let (status, _) = e.anthropic_kind();
    let mut shaped = (status, axum::Json(e.anthropic_body())).into_response();
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            shaped.headers_mut().insert(name.clone(), value.clone());
        }
    }
    shaped.extensions_mut().insert(e);
    shaped
}

/// axum's body-size rejection (a bare 413) in OpenAI's shape.
fn too_large(limit: usize) -> Response {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!("request body is larger than the limit of {limit} bytes (server.max_body_bytes)"),
    )
    .with_code("request_too_large")
    .into_response()
}
