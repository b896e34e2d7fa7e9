//! Admin routes: backend status, runtime add/remove, sleep / wake-up and
//! weight updates fanned out to every backend, with per-backend results
//! (partial failures are reported, not hidden). Guarded by the admin role
//! (see [`super::auth`]).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{AdminModel, AppState};
use crate::backend::{AdminOp, UpdateMode};
use crate::config::{BackendConfig, BackendKind};
use crate::error::ApiError;
use crate::router::{AdminResult, BackendId, Pause};

pub fn routes() -> Router<super::Gateway> {
    Router::new()
        .route("/admin/backends", get(backends).post(add_backend))
        .route("/admin/backends/{id}", delete(remove_backend))
        .route("/admin/sleep", post(sleep))
        .route("/admin/wake_up", post(wake_up))
        .route("/admin/weights", post(weights))
        .route("/admin/weights/begin", post(weights_begin))
        .route("/admin/weights/cancel", post(weights_cancel))
        .route("/admin/weights/commit", post(weights_commit))
        .route(
            "/admin/adapters",
            get(super::admin_adapters::list).post(super::admin_adapters::change),
        )
}

async fn backends(AdminModel(state): AdminModel) -> Json<Value> {
    let c = state.router.counters();
    Json(json!({
        "policy": state.router.policy_name(),
        "paused": state.router.is_paused(),
        "paused_for": state.router.paused_for(),
        "in_flight": state.router.in_flight(),
        "weight_version": state.router.weight_version(),
        "backends": state.router.snapshot(),
        "counters": c,
    }))
}

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
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
    #[serde(default)]
    ca_file: std::path::PathBuf,
    #[serde(default)]
    api_key: crate::config::Secret,
    #[serde(default)]
    admin_api_key: crate::config::Secret,
    #[serde(default)]
    vllm_api: crate::config::VllmApi,
}

async fn add_backend(AdminModel(state): AdminModel, body: Bytes) -> Result<Response, ApiError> {
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
        ca_file: b.ca_file,
        api_key: b.api_key,
        admin_api_key: b.admin_api_key,
        vllm_api: b.vllm_api,
    };
    if cfg.vllm_api != crate::config::VllmApi::Completions && cfg.kind != BackendKind::Vllm {
        return Err(ApiError::invalid(
            "vllm_api",
            "`vllm_api` applies to kind \"vllm\" only",
        ));
    }
    for (field, key) in [
        ("api_key", &cfg.api_key),
        ("admin_api_key", &cfg.admin_api_key),
    ] {
        if key.get().is_some_and(|k| !crate::config::usable_token(k)) {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` must be 8 to 4096 printable ASCII characters without spaces"),
            ));
        }
    }
    if cfg.ca_file().is_some() && !cfg.url.starts_with("https://") {
        return Err(ApiError::invalid(
            "ca_file",
            "applies to an https:// url only",
        ));
    }
    let backend = crate::backend::build_backend(&cfg, &state.config.router)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let id = state.router.add_backend(backend, b.url)?;
    tracing::info!(backend = %cfg.display_name(), id = %id, "backend added");
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "backends": state.router.snapshot()})),
    )
        .into_response())
}

async fn remove_backend(
    AdminModel(state): AdminModel,
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

/// A fan-out's answer: 200 when every backend succeeded, else 502; each
/// backend's outcome and state, and the fleet's weight version.
pub(super) fn report(state: &AppState, results: Vec<AdminResult>, extra: Value) -> Response {
    let ok = results.iter().all(|r| r.ok);
    let mut body = json!({
        "ok": ok,
        "backends": results,
        "weight_version": state.router.weight_version(),
        "paused": state.router.is_paused(),
        "paused_for": state.router.paused_for(),
    });
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_GATEWAY
    };
    (status, Json(body)).into_response()
}

/// Seconds fields every fan-out takes.
#[derive(Deserialize, Default)]
pub(super) struct Timing {
    /// Seconds to wait for in-flight calls before giving up (sleep and
    /// weight updates drain first).
    drain_timeout_s: Option<u64>,
    /// Seconds each backend may take to answer; default
    /// `[router] admin_timeout_s`.
    timeout_s: Option<u64>,
}

impl Timing {
    pub(super) fn drain(&self) -> Duration {
        self.drain_timeout_s
            .map_or(DEFAULT_DRAIN, Duration::from_secs)
    }

    pub(super) fn deadline(&self, state: &AppState) -> Duration {
        Duration::from_secs(
            self.timeout_s
                .unwrap_or(state.config.router.admin_timeout_s)
                .max(1),
        )
    }
}

const DEFAULT_DRAIN: Duration = Duration::from_secs(300);

/// Pauses admission for the operation and waits for calls in flight; on a
/// drain timeout that pause ends and the error says how many were left.
async fn pause_and_drain(state: &AppState, drain: Duration) -> Result<(), ApiError> {
    state.router.pause_admission(Pause::Operation);
    if let Err(e) = state.router.drain(drain).await {
        state.router.resume_admission(Pause::Operation);
        return Err(e.into());
    }
    Ok(())
}

/// Runs an admin operation (sleep, wake-up, a weight update's steps) one at
/// a time (a 409 while another runs) and in a task of its own: a client that
/// leaves (an HTTP timeout during a long drain) does not cut it half-way,
/// which would leave admission paused or the backends in an update tito no
/// longer tracks.
async fn one_at_a_time<F>(
    state: &AppState,
    op: impl FnOnce(AppState) -> F,
) -> Result<Response, ApiError>
where
    F: std::future::Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    let lock = state.router.admin_operation().ok_or_else(|| {
        ApiError::conflict(
            "another admin operation (sleep, wake_up or a weight update) is running: retry when it has answered",
        )
    })?;
    let run = op(state.clone());
    let task = tokio::spawn(async move {
        let _lock = lock;
        run.await
    });
    task.await
        .map_err(|e| ApiError::internal(format!("admin operation ended abnormally: {e}")))?
}

/// A 409 naming the sleeping backends that would lose new weights loaded
/// now (vLLM copies its host copy of the old weights back at wake-up;
/// SGLang's released weights are restored or left uninitialised), and a
/// trainer cannot push into a sleeping server.
fn awake(state: &AppState) -> Result<(), ApiError> {
    let asleep = state.router.asleep_without_reload();
    if asleep.is_empty() {
        return Ok(());
    }
    Err(ApiError::conflict(format!(
        "backends asleep: {}; POST /admin/wake_up first, then update the weights (a reload into a sleeping vLLM or SGLang server is lost at wake-up)",
        asleep.join(", ")
    )))
}

/// Asks every backend whether it can sleep safely: a 409 naming each that
/// cannot (and why: the server flag it lacks), before any is put to sleep.
async fn can_sleep(state: &AppState, deadline: std::time::Duration) -> Result<(), ApiError> {
    let checks = state
        .router
        .broadcast_admin(&AdminOp::SleepCheck, deadline)
        .await;
    let refused = refusals(&checks);
    if refused.is_empty() {
        return Ok(());
    }
    Err(ApiError::conflict(format!(
        "no backend was put to sleep: {}",
        refused.join("; ")
    )))
}

/// Each backend of a check that said no, with why.
fn refusals(checks: &[AdminResult]) -> Vec<String> {
    checks
        .iter()
        .filter(|r| !r.ok)
        .map(|r| match &r.outcome {
            crate::router::AdminOutcome::Failed { error } => format!("{}: {error}", r.backend),
            crate::router::AdminOutcome::TimedOut { after_s } => {
                format!("{}: no answer within {after_s} s", r.backend)
            }
            crate::router::AdminOutcome::Done { .. } => r.backend.clone(),
        })
        .collect()
}

/// A 409 while a two-step weight update is begun and not committed.
fn not_updating(state: &AppState) -> Result<(), ApiError> {
    if state.router.is_paused_for(Pause::Updating) {
        return Err(ApiError::conflict(
            "a weight update is in progress: POST /admin/weights/commit first",
        ));
    }
    Ok(())
}

/// `/admin/sleep`'s fields, in the body or the query string. Not a
/// flattened [`Timing`]: a query string's values are strings, which a
/// flattened number field refuses.
#[derive(Deserialize, Default)]
struct SleepParams {
    level: Option<u32>,
    drain_timeout_s: Option<u64>,
    timeout_s: Option<u64>,
}

/// Stops admitting calls (new ones wait), drains in-flight calls, then puts
/// every backend to sleep; admission stays paused until `wake_up`. A
/// backend that failed or did not answer is named with its state.
async fn sleep(
    AdminModel(state): AdminModel,
    q: Result<Query<SleepParams>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let b: SleepParams = parse_json(&body)?;
    let level = b.level.or(q.level).unwrap_or(1);
    if !(1..=2).contains(&level) {
        return Err(ApiError::invalid("level", "sleep level must be 1 or 2"));
    }
    let timing = Timing {
        drain_timeout_s: b.drain_timeout_s.or(q.drain_timeout_s),
        timeout_s: b.timeout_s.or(q.timeout_s),
    };
    one_at_a_time(&state, move |state| async move {
        // A level-2 sleep would drop the weights a trainer is pushing.
        not_updating(&state)?;
        can_sleep(&state, timing.deadline(&state)).await?;
        pause_and_drain(&state, timing.drain()).await?;
        let op = AdminOp::Sleep { level };
        let results = state
            .router
            .broadcast_admin(&op, timing.deadline(&state))
            .await;
        state.router.pause_admission(Pause::Asleep);
        state.router.resume_admission(Pause::Operation);
        tracing::info!(
            level,
            ok = results.iter().all(|r| r.ok),
            "backends put to sleep"
        );
        Ok(report(&state, results, json!({"level": level})))
    })
    .await
}

/// Wakes every backend up, then ends the sleep's pause (always: a backend
/// that did not wake stays out of rotation and is named). Refused during a
/// two-step weight update, whose pause only its commit ends.
async fn wake_up(AdminModel(state): AdminModel, body: Bytes) -> Result<Response, ApiError> {
    let timing: Timing = parse_json(&body)?;
    one_at_a_time(&state, move |state| async move {
        not_updating(&state)?;
        let results = state
            .router
            .broadcast_admin(&AdminOp::WakeUp, timing.deadline(&state))
            .await;
        state.router.resume_admission(Pause::Asleep);
        tracing::info!(ok = results.iter().all(|r| r.ok), "backends woken up");
        Ok(report(&state, results, json!({})))
    })
    .await
}

#[derive(Deserialize)]
struct Weights {
    version: String,
    path: Option<String>,
    mode: Option<String>,
    #[serde(flatten)]
    timing: Timing,
}

/// `/admin/weights/begin`'s fields.
#[derive(Deserialize, Default)]
struct Begin {
    mode: Option<String>,
    #[serde(flatten)]
    timing: Timing,
}

/// What an update does with in-flight calls: `wait` (drain them first,
/// the default), `abort` (stop them now; each continues on the new
/// weights) or `keep` (pause them in place; they go on after the update),
/// which runs as `abort` unless every backend can keep ([`settle_keep`]).
fn update_mode(mode: Option<&str>) -> Result<UpdateMode, ApiError> {
    match mode {
        None | Some("wait") => Ok(UpdateMode::Wait),
        Some("abort") => Ok(UpdateMode::Abort),
        Some("keep") => Ok(UpdateMode::Keep),
        Some(m) => Err(ApiError::invalid(
            "mode",
            format!("unknown mode `{m}`: expected `wait`, `abort` or `keep`"),
        )),
    }
}

/// `keep` needs every backend to pause in place and report where in each
/// stream the new weights begin (vLLM 0.33+, SGLang 0.5.20+); asked of each
/// now. When one cannot, the update runs as `abort`, and the reason is
/// returned for the answer.
async fn settle_keep(
    state: &AppState,
    mode: UpdateMode,
    deadline: Duration,
) -> (UpdateMode, Option<String>) {
    if mode != UpdateMode::Keep {
        return (mode, None);
    }
    let checks = state
        .router
        .broadcast_admin(&AdminOp::KeepCheck, deadline)
        .await;
    let refused = refusals(&checks);
    if refused.is_empty() {
        return (UpdateMode::Keep, None);
    }
    let why = format!(
        "keep runs as abort: not every backend can keep a generation paused in place and say where the new weights begin ({})",
        refused.join("; ")
    );
    (UpdateMode::Abort, Some(why))
}

/// The `mode` fields of an update's answer.
fn mode_fields(mode: UpdateMode, fallback: Option<&str>) -> Value {
    match fallback {
        None => json!({"mode": mode.as_str()}),
        Some(why) => json!({"mode": mode.as_str(), "asked_mode": "keep", "fallback": why}),
    }
}

/// Pauses admission for an update in `mode`: `wait` drains the calls in
/// flight; `abort` marks every backend interrupted, so the calls it stops
/// continue after the update instead of failing.
async fn pause_for_update(
    state: &AppState,
    mode: UpdateMode,
    drain: Duration,
) -> Result<(), ApiError> {
    match mode {
        UpdateMode::Wait => pause_and_drain(state, drain).await,
        UpdateMode::Abort => {
            state.router.pause_admission(Pause::Operation);
            state.router.interrupt_all();
            Ok(())
        }
        UpdateMode::Keep => {
            state.router.pause_admission(Pause::Operation);
            state.router.keep_all();
            Ok(())
        }
    }
}

pub(super) fn check_version(v: &str) -> Result<(), ApiError> {
    if v.trim().is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "version",
            "`version` must be 1 to 256 characters, none of them a control character",
        ));
    }
    Ok(())
}

/// Records in the store, before backends may change their weights, that an
/// update to `version` is under way: until every backend took it (then
/// [`commit_version`] replaces the record) a restart cannot know what each
/// backend serves ([`super::AppState::restore`]).
async fn mark_in_doubt(state: &AppState, version: &str) -> Result<(), ApiError> {
    let marked = format!("{}{version}", crate::api::IN_DOUBT);
    Ok(state.store.store.set_weight_version(&marked).await?)
}

/// Records the fleet's version once every backend took it: in the router
/// and durably in the store, so a restart keeps tagging calls with it.
async fn commit_version(state: &AppState, version: &str) -> Result<u64, ApiError> {
    state.store.store.set_weight_version(version).await?;
    let seq = state.store.store.register_version(version).await?;
    state.router.set_fleet_version(version, Some(seq));
    Ok(seq)
}

/// One step. Without a `path`: the trainer changed the weights itself;
/// later calls are tagged `version`. With a `path`: drains, asks every
/// backend to load the weights from it, then ends its pause whatever
/// happened (admission stays paused if the backends are asleep). Each
/// backend that took them is tagged `version`; one that failed or did not
/// answer is named and kept out of rotation. The fleet's version changes
/// only when every backend took the update. Refused during a two-step
/// update.
async fn weights(AdminModel(state): AdminModel, body: Bytes) -> Result<Response, ApiError> {
    state.check_weights_model()?;
    let w: Weights = parse_json(&body)?;
    check_version(&w.version)?;
    let mode = update_mode(w.mode.as_deref())?;
    one_at_a_time(&state, move |state| update_weights(state, w, mode)).await
}

async fn update_weights(
    state: AppState,
    w: Weights,
    mode: UpdateMode,
) -> Result<Response, ApiError> {
    not_updating(&state)?;
    let (mode, fallback) = if w.path.is_some() {
        settle_keep(&state, mode, w.timing.deadline(&state)).await
    } else {
        (mode, None)
    };
    let fallback = fallback.as_deref();
    let Some(path) = w.path else {
        state.store.store.set_weight_version(&w.version).await?;
        let seq = state.store.store.register_version(&w.version).await?;
        state.router.set_weight_version(&w.version, Some(seq));
        tracing::info!(version = %w.version, seq, "weight version set");
        let mut extra = mode_fields(mode, fallback);
        extra["version"] = json!(w.version);
        extra["version_seq"] = json!(seq);
        return Ok(report(&state, Vec::new(), extra));
    };
    awake(&state)?;
    let paused_at = std::time::Instant::now();
    pause_for_update(&state, mode, w.timing.drain()).await?;
    if let Err(e) = mark_in_doubt(&state, &w.version).await {
        state.router.resume_admission(Pause::Operation);
        return Err(e);
    }
    let op = AdminOp::UpdateWeights {
        path,
        version: w.version.clone(),
        mode,
    };
    let results = state
        .router
        .broadcast_admin(&op, w.timing.deadline(&state))
        .await;
    let ok = results.iter().all(|r| r.ok);
    let stored = if ok {
        commit_version(&state, &w.version).await.map(Some)
    } else {
        Ok(None)
    };
    state.router.resume_admission(Pause::Operation);
    crate::metrics::update_pause(mode.as_str(), paused_at.elapsed());
    let seq = stored?;
    tracing::info!(version = %w.version, ok, mode = mode.as_str(), "weights updated");
    let mut extra = mode_fields(mode, fallback);
    extra["version"] = json!(w.version);
    extra["version_seq"] = json!(seq);
    Ok(report(&state, results, extra))
}

/// Two steps, first: drains, then tells every backend a weight update
/// starts (generation paused). Admission stays paused until `commit`. When
/// a backend fails, the others are told the update ended without new
/// weights and the pause ends: nothing to push. Refused while an update is
/// already begun (a retried `begin`).
async fn weights_begin(AdminModel(state): AdminModel, body: Bytes) -> Result<Response, ApiError> {
    state.check_weights_model()?;
    let b: Begin = parse_json(&body)?;
    let mode = update_mode(b.mode.as_deref())?;
    one_at_a_time(&state, move |state| begin_update(state, b.timing, mode)).await
}

async fn begin_update(
    state: AppState,
    timing: Timing,
    mode: UpdateMode,
) -> Result<Response, ApiError> {
    not_updating(&state)?;
    awake(&state)?;
    let (mode, fallback) = settle_keep(&state, mode, timing.deadline(&state)).await;
    let fallback = fallback.as_deref();
    let paused_at = std::time::Instant::now();
    pause_for_update(&state, mode, timing.drain()).await?;
    // Recorded before any backend starts: from then on the trainer may
    // change the weights. Called off, the record goes back as it was.
    let before = match state.store.store.weight_version().await {
        Ok(v) => v,
        Err(e) => {
            state.router.resume_admission(Pause::Operation);
            return Err(e.into());
        }
    };
    if let Err(e) = mark_in_doubt(&state, "(pushed by the trainer)").await {
        state.router.resume_admission(Pause::Operation);
        return Err(e);
    }
    let deadline = timing.deadline(&state);
    let results = state
        .router
        .broadcast_admin(&AdminOp::BeginWeightUpdate { mode }, deadline)
        .await;
    if results.iter().all(|r| r.ok) {
        state.router.pause_admission(Pause::Updating);
        state.router.resume_admission(Pause::Operation);
        state.router.update_begun(mode.as_str(), paused_at, before);
        tracing::info!(
            mode = mode.as_str(),
            "weight update begun: push the weights, then commit"
        );
        return Ok(report(&state, results, mode_fields(mode, fallback)));
    }
    let undo = state
        .router
        .broadcast_admin(&AdminOp::AbortWeightUpdate, deadline)
        .await;
    let restored = state
        .store
        .store
        .set_weight_version(before.as_deref().unwrap_or(""))
        .await;
    state.router.resume_admission(Pause::Operation);
    crate::metrics::update_pause(mode.as_str(), paused_at.elapsed());
    restored?;
    tracing::warn!("weight update not begun: a backend refused; its pause ended");
    Ok(report(&state, results, json!({"aborted": undo})))
}

#[derive(Deserialize)]
struct Commit {
    version: String,
    #[serde(flatten)]
    timing: Timing,
}

/// Two steps, last: tells every backend the update is done, tags each that
/// answered with `version`, and ends the update's pause whatever happened.
async fn weights_commit(AdminModel(state): AdminModel, body: Bytes) -> Result<Response, ApiError> {
    state.check_weights_model()?;
    let c: Commit = parse_json(&body)?;
    check_version(&c.version)?;
    one_at_a_time(&state, move |state| commit_update(state, c)).await
}

async fn commit_update(state: AppState, c: Commit) -> Result<Response, ApiError> {
    if !state.router.is_paused_for(Pause::Updating) {
        return Err(ApiError::conflict(
            "no weight update is in progress: POST /admin/weights/begin first",
        ));
    }
    let results = state
        .router
        .broadcast_admin(
            &AdminOp::FinishWeightUpdate {
                version: c.version.clone(),
            },
            c.timing.deadline(&state),
        )
        .await;
    let ok = results.iter().all(|r| r.ok);
    let stored = if ok {
        commit_version(&state, &c.version).await.map(Some)
    } else {
        Ok(None)
    };
    state.router.resume_admission(Pause::Updating);
    if let Some(begun) = state.router.update_ended() {
        crate::metrics::update_pause(begun.mode, begun.at.elapsed());
    }
    let seq = stored?;
    tracing::info!(version = %c.version, ok, "weight update committed");
    Ok(report(
        &state,
        results,
        json!({"version": c.version, "version_seq": seq}),
    ))
}

/// Two steps, called off: the trainer's push failed before it changed any
/// backend's weights. Tells every backend the update ended without new
/// weights, puts back the weight version recorded before `begin` and ends
/// the pause; interrupted calls go on with the weights they had.
async fn weights_cancel(AdminModel(state): AdminModel, body: Bytes) -> Result<Response, ApiError> {
    state.check_weights_model()?;
    let t: Timing = parse_json(&body)?;
    one_at_a_time(&state, move |state| cancel_update(state, t)).await
}

async fn cancel_update(state: AppState, timing: Timing) -> Result<Response, ApiError> {
    if !state.router.is_paused_for(Pause::Updating) {
        return Err(ApiError::conflict(
            "no weight update is in progress: nothing to call off",
        ));
    }
    let results = state
        .router
        .broadcast_admin(&AdminOp::AbortWeightUpdate, timing.deadline(&state))
        .await;
    let begun = state.router.update_ended();
    let before = begun.as_ref().and_then(|b| b.before.clone());
    let restored = state
        .store
        .store
        .set_weight_version(before.as_deref().unwrap_or(""))
        .await;
    state.router.resume_admission(Pause::Updating);
    if let Some(b) = &begun {
        crate::metrics::update_pause(b.mode, b.at.elapsed());
    }
    restored?;
    tracing::info!("weight update called off: the weights stay as they were");
    Ok(report(&state, results, json!({"called_off": true})))
}
