//! `POST /v1/trajectories/{id}/verify`: the teacher-forced replay check of
//! one trajectory (see [`crate::verify`]). A trainer route, like export (it
//! spends backend time). Body, optional (empty is fine):
//! `{"threshold": 0.1, "backend": "name"}`; defaults from `[verify]`.
//!
//! Answers `{"object": "trajectory.verify", "trajectory_id", "backend",
//! "threshold", "samples": [{sample, backend, checked_at, compared,
//! max_abs_diff, mean_abs_diff, threshold, positions, above_threshold,
//! argmax_mismatch_share, by_version}], "by_version"}`, `by_version` being
//! `[{seq, version, compared, max_abs_diff, mean_abs_diff,
//! argmax_mismatch_share}]` per weight version that sampled the compared
//! tokens (over the sample, and at the top over every sample); the same
//! per-sample results are stored with the trajectory. 404 for an unknown trajectory, 400 for a bad body or a
//! sample longer than the context window, backend failures as on the call
//! path (502 / 503 / 504, or 400 when the backend refuses the sequence).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::AppState;
use crate::error::ApiError;
use crate::verify::{sample_json, Options, Report, VerifyError};

pub fn routes() -> Router<super::Gateway> {
    Router::new().route("/v1/trajectories/{id}/verify", post(verify))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyBody {
    threshold: Option<f64>,
    backend: Option<String>,
}

async fn verify(
    State(g): State<super::Gateway>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    super::check_id("trajectory", "id", &id)?;
    let body = parse(&body)?;
    let state = g.primary();
    let opts = prepare(state, body)?;
    // Every served model: each policy of the trajectory on its own.
    let scope = crate::verify::Scope {
        served: g
            .models()
            .iter()
            .map(|m| (&*m.model_name, &*m.router))
            .collect(),
        primary: true,
        whole: true,
    };
    let report = crate::verify::verify_trajectory(&scope, &state.store.store, &id, &opts)
        .await
        .map_err(api_error)?;
    Ok(Json(respond(&report, opts.threshold)))
}

fn parse(body: &Bytes) -> Result<VerifyBody, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(VerifyBody::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// The check's options: the body's, else `[verify]`'s; the window is the
/// gateway's context window.
fn prepare(state: &AppState, body: VerifyBody) -> Result<Options, ApiError> {
    let max_len = Some(state.max_model_len() as usize);
    let mut opts = Options::from_config(&state.config.verify, max_len);
    if let Some(t) = body.threshold {
        if !(t.is_finite() && t >= 0.0) {
            return Err(ApiError::invalid(
                "threshold",
                format!("`threshold` must be a non-negative number of nats, got {t}"),
            ));
        }
        opts.threshold = t;
    }
    if let Some(b) = body.backend.filter(|b| !b.is_empty()) {
        opts.backend = Some(b);
    }
    Ok(opts)
}

fn respond(report: &Report, threshold: f64) -> Value {
    let samples: Vec<Value> = report.samples.iter().map(sample_json).collect();
    json!({
        "object": "trajectory.verify",
        "trajectory_id": report.trajectory_id,
        "backend": report.backend,
        "threshold": threshold,
        "samples": samples,
        "by_version": report.by_version,
    })
}

fn api_error(e: VerifyError) -> ApiError {
    match e {
        VerifyError::Store(s) => s.into(),
        VerifyError::Backend(b) => {
            crate::metrics::replay_failure("api");
            b.into()
        }
        VerifyError::Route(r) => {
            crate::metrics::replay_failure("api");
            r.into()
        }
        e @ VerifyError::UnknownBackend(_) => ApiError::invalid("backend", e.to_string()),
        e @ (VerifyError::Images(_) | VerifyError::NotServed { .. }) => {
            ApiError::bad_request(e.to_string())
        }
        e @ VerifyError::TooLong { .. } => {
            ApiError::bad_request(e.to_string()).with_code("context_length_exceeded")
        }
        VerifyError::Task(m) => {
            crate::metrics::replay_failure("api");
            ApiError::internal(m)
        }
    }
}
