//! The served ids: the models and their LoRA adapters. `GET /v1/models`,
//! `GET /v1/models/{model}`, and which adapter a request's `model` names.

use axum::extract::State;
use axum::Json;
use serde_json::json;

use super::{AppState, Gateway};
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

    /// The id a call is answered as: its adapter, else the model.
    pub(crate) fn served_id(&self, adapter: Option<&str>) -> String {
        adapter.unwrap_or(&self.config.model.name).to_string()
    }

    /// The ids `/v1/models` lists: each served model, then its loaded
    /// adapters.
    pub fn served_ids(&self) -> Vec<String> {
        self.peers.ids().unwrap_or_else(|| {
            std::iter::once(self.config.model.name.clone())
                .chain(self.adapters.names())
                .collect()
        })
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

pub(super) async fn list(State(g): State<Gateway>) -> Json<serde_json::Value> {
    let data: Vec<_> = g
        .served_ids()
        .iter()
        .filter_map(|id| Some(model_json(g.by_id(id)?, id)))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{model}`.
pub(super) async fn one(
    State(g): State<Gateway>,
    axum::extract::Path(params): axum::extract::Path<std::collections::HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = params.get("model").map(String::as_str).unwrap_or_default();
    match g.by_id(id) {
        Some(state) => Ok(Json(model_json(state, id))),
        None => Err(ApiError::model_not_found_among(id, &g.served_ids())),
    }
}
