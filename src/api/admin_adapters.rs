//! `GET /admin/adapters` and `POST /admin/adapters`: the LoRA adapters the
//! fleet serves, loaded, replaced and unloaded on every backend in
//! rotation. A change takes the adapter's gate whole
//! ([`crate::router::adapters`]): it waits (`mode: "wait"`, up to
//! `drain_timeout_s`) for the adapter's calls in flight to be recorded, or
//! (`mode: "abort"`) stops their generations, which continue from what they
//! sampled once the change is done; the adapter's new calls wait for it,
//! and calls of the base model and of other adapters go on. Each adapter
//! carries its own weight version.

use axum::body::Bytes;
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::admin::{check_version, parse_json, report, Timing};
use super::{AdminModel, AppState};
use crate::backend::AdminOp;
use crate::error::ApiError;

/// `POST /admin/adapters`'s body.
#[derive(Deserialize)]
struct Change {
    name: String,
    /// `load` (the default: a new adapter, or new weights for a served one)
    /// or `unload`.
    action: Option<String>,
    /// Where the backends load it from; needed to load.
    path: Option<String>,
    /// The label of the adapter's weights (default: `path`).
    version: Option<String>,
    /// `wait` (the default: the adapter's calls in flight finish first) or
    /// `abort` (they stop now and continue after the change).
    mode: Option<String>,
    #[serde(flatten)]
    timing: Timing,
}

pub(super) async fn list(AdminModel(state): AdminModel) -> Json<Value> {
    let adapters: Vec<Value> = state
        .adapters
        .all()
        .iter()
        .map(|a| {
            let s = a.state();
            json!({"name": &*a.name, "path": s.path, "version": s.version, "loaded": s.loaded,
                   "parent": state.config.model.name})
        })
        .collect();
    Json(json!({ "adapters": adapters }))
}

pub(super) async fn change(
    AdminModel(state): AdminModel,
    body: Bytes,
) -> Result<Response, ApiError> {
    let c: Change = parse_json(&body)?;
    if !crate::config::usable_model_id(&c.name) || c.name == state.config.model.name {
        return Err(ApiError::invalid(
            "name",
            "`name` must be 1 to 256 printable ASCII characters without spaces, other than \
             the model's own name",
        ));
    }
    let own = state.adapters.all().iter().any(|a| *a.name == c.name);
    if !own && state.served_ids().contains(&c.name) {
        return Err(ApiError::invalid(
            "name",
            format!(
                "`{}` is served by another model: an adapter's changes go to its base model \
                 (POST /admin/adapters?model=BASE)",
                c.name
            ),
        ));
    }
    let abort = match c.mode.as_deref() {
        None | Some("wait") => false,
        Some("abort") => true,
        Some(m) => {
            return Err(ApiError::invalid(
                "mode",
                format!("unknown mode `{m}` for an adapter change: expected `wait` or `abort`"),
            ))
        }
    };
    let load = match c.action.as_deref() {
        None | Some("load") => true,
        Some("unload") => false,
        Some(a) => {
            return Err(ApiError::invalid(
                "action",
                format!("unknown action `{a}`: expected `load` or `unload`"),
            ))
        }
    };
    let path = match (load, c.path.as_deref().map(str::trim)) {
        (true, Some(p)) if !p.is_empty() => p.to_string(),
        (true, _) => return Err(ApiError::invalid("path", "loading an adapter needs `path`")),
        (false, _) => String::new(),
    };
    let version = match (load, c.version) {
        (true, Some(v)) => {
            check_version(&v)?;
            Some(v)
        }
        (true, None) => Some(path.clone()),
        (false, _) => None,
    };
    if !load && !state.adapters.is_loaded(&c.name) {
        return Err(ApiError::not_found(format!(
            "no adapter `{}` is loaded",
            c.name
        )));
    }
    // In a task of its own: a client that leaves does not cut the change
    // half-way with the gate held.
    let task = tokio::spawn(run(state, c.name, path, version, abort, c.timing));
    task.await
        .map_err(|e| ApiError::internal(format!("adapter change ended abnormally: {e}")))?
}

async fn run(
    state: AppState,
    name: String,
    path: String,
    version: Option<String>,
    abort: bool,
    timing: Timing,
) -> Result<Response, ApiError> {
    // Held to the end: the aborted calls and new ones wait until it drops.
    let _mark = abort.then(|| state.adapters.abort(&name)).flatten();
    let lock = tokio::time::timeout(timing.drain(), state.adapters.lock(&name, &path))
        .await
        .map_err(|_| {
            ApiError::overloaded(format!(
                "adapter `{name}`'s calls in flight did not finish within {}s: nothing changed",
                timing.drain().as_secs()
            ))
        })?;
    let before = lock.adapter.state();
    let op = match version {
        Some(_) => AdminOp::LoadAdapter {
            name: name.clone(),
            path: path.clone(),
            replace: before.loaded,
        },
        None => AdminOp::UnloadAdapter { name: name.clone() },
    };
    let results = state
        .router
        .broadcast_admin(&op, timing.deadline(&state))
        .await;
    let ok = results.iter().all(|r| r.ok);
    match (&op, ok) {
        (AdminOp::LoadAdapter { .. }, true) => lock.set(&path, version.clone(), true),
        (AdminOp::UnloadAdapter { .. }, true) => lock.set(&before.path, None, false),
        // A failed change leaves the adapter as it was where it succeeded
        // nowhere; the answer names each backend's outcome.
        _ => {}
    }
    let after = lock.adapter.state();
    drop(lock);
    if !after.loaded {
        state.adapters.forget_unloaded(&name);
    }
    tracing::info!(adapter = %name, ok, abort, loaded = after.loaded,
        version = ?after.version, "adapter change");
    Ok(report(
        &state,
        results,
        json!({"mode": if abort { "abort" } else { "wait" },
               "adapter": {"name": name, "path": after.path, "version": after.version,
                           "loaded": after.loaded}}),
    ))
}
