//! The trajectory viewer: `GET /ui` (trajectory list) and
//! `GET /ui/trajectories/{id}` (token view), a page embedded in the binary
//! (no CDN: it works offline).
//!
//! The page shell (HTML, JS, CSS) is served to anyone: it holds no data, and
//! it must load to ask for the trainer token. Everything it shows comes from
//! the trainer-guarded API (`/v1/trajectories*` and `POST /ui/api/decode`,
//! see [`trainer_routes`]), called with the token the user typed, kept in the
//! browser's `sessionStorage`; a 401 brings the login field back.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::AppState;
use crate::error::ApiError;

const INDEX: &str = include_str!("../../ui/index.html");

/// Static files under `/ui/assets/`: name, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "list.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/list.js"),
    ),
    (
        "trajectory.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/trajectory.js"),
    ),
    (
        "tokens.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/tokens.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/style.css"),
    ),
];

/// Only this origin's scripts and styles, no inline code, no framing; images
/// also from the `blob:` URLs the viewer makes of image bytes it fetched
/// with the trainer token.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
    frame-ancestors 'none'; form-action 'self'";

/// Most distinct token ids one decode request may name.
pub const MAX_DECODE_IDS: usize = 65_536;

/// The page shell and its assets: open to all (they carry no data).
pub fn routes() -> Router<super::Gateway> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/trajectories/{id}", get(page))
        .route("/ui/assets/{name}", get(asset))
}

/// What the page reads besides `/v1/trajectories*`: behind the trainer role.
pub fn trainer_routes() -> Router<super::Gateway> {
    Router::new().route("/ui/api/decode", post(decode))
}

fn with_headers(content_type: &str, body: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Every page route answers the same shell; the script reads the path.
async fn page() -> Response {
    with_headers("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, ct, body)) => with_headers(ct, body),
        None => ApiError::not_found(format!("no asset `{name}`")).into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeBody {
    ids: Vec<u32>,
}

/// `POST /ui/api/decode` `{"ids": [..]}` → `{"object": "tokens", "tokens":
/// {"<id>": "<text>"}}`: each id decoded on its own (special tokens kept), so
/// the page can show every token's text. An id the tokenizer does not know
/// is left out.
async fn decode(
    State(state): State<AppState>,
    body: Result<Json<DecodeBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(ApiError::from)?;
    let mut ids = b.ids;
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > MAX_DECODE_IDS {
        return Err(ApiError::invalid(
            "ids",
            format!(
                "{} distinct ids; at most {MAX_DECODE_IDS} per request",
                ids.len()
            ),
        ));
    }
    let renderer = state.renderer.clone();
    let tokens = tokio::task::spawn_blocking(move || {
        let mut out = Map::with_capacity(ids.len());
        let vocab = renderer.vocab_size();
        for id in ids.into_iter().filter(|&id| id < vocab) {
            if let Ok(text) = renderer.decode(&[id], false) {
                out.insert(id.to_string(), Value::String(text));
            }
        }
        out
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(json!({"object": "tokens", "tokens": tokens})))
}
