//! Admin routes: backend status, runtime add/remove, sleep / wake-up and
//! weight updates fanned out to every backend, with per-backend results
//! (partial failures are reported, not hidden). Guarded by the admin role
//! (see [`super::auth`]).

use std::sync::RwLock;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::AppState;
use crate::backend::AdminOp;
use crate::config::{BackendConfig, BackendKind};
use crate::error::ApiError;
use crate::router::BackendId;

/// Operational state: the current weight version.
#[derive(Default)]
pub struct Ops {
    weight_version: RwLock<Option<String>>,
}

impl Ops {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn weight_version(&self) -> Option<String> {
        self.weight_version
            .read()
            .map(|v| v.clone())
            .unwrap_or(None)
    }

    fn set_weight_version(&self, v: String) {
        if let Ok(mut g) = self.weight_version.write() {
            *g = Some(v);
        }
    }
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/backends", get(backends).post(add_backend))
        .route("/admin/backends/{id}", delete(remove_backend))
        .route("/admin/sleep", post(sleep))
        .route("/admin/wake_up", post(wake_up))
        .route("/admin/weights", post(weights))
}

async fn backends(State(state): State<AppState>) -> Json<Value> {
    let c = state.router.counters();
    Json(json!({
        "policy": state.router.policy_name(),
        "paused": state.router.is_paused(),
        "in_flight": state.router.in_flight(),
        "weight_version": state.ops.weight_version(),
        "backends": state.router.snapshot(),
        "counters": c,
    }))
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let v: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?
    };
    super::request::from_value(v)
}

#[derive(Deserialize)]
struct AddBackend {
    url: String,
    kind: BackendKind,
    #[serde(default)]
    name: String,
    #[serde(default)]
    model: String,
}

async fn add_backend(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let b: AddBackend = parse_json(&body)?;
    if b.kind == BackendKind::Engine && b.url == "engine" {
        return Err(ApiError::invalid(
            "url",
            "the in-process engine can only be configured at start-up",
        ));
    }
    if !(b.url.starts_with("http://") || b.url.starts_with("https://")) {
        return Err(ApiError::invalid(
            "url",
            "expected an http:// or https:// URL",
        ));
    }
    let cfg = BackendConfig {
        url: b.url.clone(),
        kind: b.kind,
        name: b.name,
        model: b.model,
    };
    let backend = crate::backend::build_backend(&cfg, &state.config.router)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let id = state.router.add_backend(backend, b.url)?;
    tracing::info!(backend = cfg.display_name(), id = %id, "backend added");
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "backends": state.router.snapshot()})),
    )
        .into_response())
}

async fn remove_backend(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id: BackendId = match id.parse::<u64>() {
        Ok(n) => BackendId(n),
        Err(_) => state
            .router
            .backend_id(&id)
            .ok_or_else(|| ApiError::not_found(format!("no backend `{id}`")))?,
    };
    let removed = state.router.remove_backend(id)?;
    tracing::info!(id = %id, "backend removed");
    Ok(Json(json!({"removed": removed})))
}

fn report(results: Vec<(String, Result<String, String>)>) -> (bool, Vec<Value>) {
    let ok = results.iter().all(|(_, r)| r.is_ok());
    let items = results
        .into_iter()
        .map(|(name, r)| match r {
            Ok(body) => json!({"backend": name, "ok": true, "response": body}),
            Err(e) => json!({"backend": name, "ok": false, "error": e}),
        })
        .collect();
    (ok, items)
}

fn status_for(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_GATEWAY
    }
}

#[derive(Deserialize, Default)]
struct SleepParams {
    level: Option<u32>,
    /// Seconds to wait for in-flight calls before giving up.
    drain_timeout_s: Option<u64>,
}

const DEFAULT_DRAIN: Duration = Duration::from_secs(300);

/// Stops admitting calls (new ones wait), drains in-flight calls, then puts
/// every backend to sleep. On a drain timeout, admission resumes.
async fn sleep(
    State(state): State<AppState>,
    Query(q): Query<SleepParams>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let b: SleepParams = parse_json(&body)?;
    let level = b.level.or(q.level).unwrap_or(1);
    if !(1..=2).contains(&level) {
        return Err(ApiError::invalid("level", "sleep level must be 1 or 2"));
    }
    let drain = b
        .drain_timeout_s
        .or(q.drain_timeout_s)
        .map_or(DEFAULT_DRAIN, Duration::from_secs);
    state.router.pause_admission();
    if let Err(e) = state.router.drain(drain).await {
        state.router.resume_admission();
        return Err(e.into());
    }
    let (ok, items) = report(
        state
            .router
            .broadcast_admin(&AdminOp::Sleep { level })
            .await,
    );
    tracing::info!(level, ok, "backends put to sleep");
    Ok((
        status_for(ok),
        Json(json!({"ok": ok, "level": level, "backends": items})),
    )
        .into_response())
}

/// Wakes every backend up, then admits calls again.
async fn wake_up(State(state): State<AppState>) -> Response {
    let (ok, items) = report(state.router.broadcast_admin(&AdminOp::WakeUp).await);
    state.router.resume_admission();
    tracing::info!(ok, "backends woken up");
    (status_for(ok), Json(json!({"ok": ok, "backends": items}))).into_response()
}

#[derive(Deserialize)]
struct Weights {
    version: String,
    path: Option<String>,
    drain_timeout_s: Option<u64>,
}

/// Tags later calls with `version`; with a `path`, drains and asks every
/// backend to load the weights from it first.
async fn weights(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let w: Weights = parse_json(&body)?;
    if w.version.trim().is_empty() {
        return Err(ApiError::invalid("version", "`version` must not be empty"));
    }
    let Some(path) = w.path else {
        state.ops.set_weight_version(w.version.clone());
        return Ok(Json(json!({"ok": true, "version": w.version, "backends": []})).into_response());
    };
    let drain = w.drain_timeout_s.map_or(DEFAULT_DRAIN, Duration::from_secs);
    state.router.pause_admission();
    if let Err(e) = state.router.drain(drain).await {
        state.router.resume_admission();
        return Err(e.into());
    }
    let (ok, items) = report(
        state
            .router
            .broadcast_admin(&AdminOp::UpdateWeights { path })
            .await,
    );
    state.ops.set_weight_version(w.version.clone());
    state.router.resume_admission();
    tracing::info!(version = %w.version, ok, "weights updated");
    Ok((
        status_for(ok),
        Json(json!({"ok": ok, "version": w.version, "backends": items})),
    )
        .into_response())
}
