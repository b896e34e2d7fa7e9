//! The served ids: the model and its LoRA adapters. `GET /v1/models`,
//! `GET /v1/models/{model}`, and which adapter a request's `model` names.

use axum::extract::State;
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::error::ApiError;

impl AppState {
    /// The adapter a request's `model` names: `None` for the model itself
    /// (or no `model`), 404 `model_not_found` naming the served ids for an
    /// id that is neither.
    pub(super) fn check_model(&self, model: Option<&str>) -> Result<Option<String>, ApiError> {
        match model {
            None => Ok(None),
            Some(m) if m == self.config.model.name => Ok(None),
            Some(m) if self.adapters.is_loaded(m) => Ok(Some(m.to_string())),
            Some(m) => Err(ApiError::model_not_found_among(m, &self.served_ids())),
        }
    }

    /// The ids `/v1/models` lists: the model, then its loaded adapters.
    pub fn served_ids(&self) -> Vec<String> {
        std::iter::once(self.config.model.name.clone())
            .chain(self.adapters.names())
            .collect()
    }

    /// A call's share of the adapter `name` (waiting while an operation
    /// changes it), or 404 when it was unloaded meanwhile.
    pub(crate) async fn adapter_share(
        &self,
        name: Option<&str>,
    ) -> Result<Option<crate::router::adapters::AdapterUse>, ApiError> {
        let Some(name) = name else { return Ok(None) };
        match self.adapters.share(name).await {
            Some(share) => Ok(Some(share)),
            None => Err(ApiError::model_not_found_among(name, &self.served_ids())),
        }
    }
}

/// One served id as `/v1/models` lists it; an adapter names its base model
/// as `parent` (as vLLM lists its LoRA adapters).
fn model_json(state: &AppState, id: &str) -> serde_json::Value {
    let base = &state.config.model.name;
    let mut m = json!({
        "id": id,
        "object": "model",
        "created": state.started,
        "owned_by": "tito",
        "root": base,
        "parent": null,
        "max_model_len": state.max_model_len(),
    });
    if id != base {
        m["parent"] = json!(base);
    }
    m
}

pub(super) async fn list(State(state): State<AppState>) -> Json<serde_json::Value> {
    let data: Vec<_> = state
        .served_ids()
        .iter()
        .map(|id| model_json(&state, id))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{model}`.
pub(super) async fn one(
    State(state): State<AppState>,
    axum::extract::Path(params): axum::extract::Path<std::collections::HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = params.get("model").map(String::as_str).unwrap_or_default();
    let served = state.served_ids();
    if !served.iter().any(|s| s == id) {
        return Err(ApiError::model_not_found_among(id, &served));
    }
    Ok(Json(model_json(&state, id)))
}
