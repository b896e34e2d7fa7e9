//! What tests and benches that record calls through [`Trajectories`]
//! directly (no HTTP request around them) pass for a call: its context and
//! a choice that stopped on its own.
//!
//! [`Trajectories`]: super::Trajectories

use std::sync::Arc;

use serde_json::Value as Json;

use super::{CallContext, ChoiceOutcome};

/// The context of a call of `tid` on `request`, with its `messages` when
/// a later turn may continue it.
pub fn context(tid: &str, request: Json, messages: Option<Vec<Json>>) -> CallContext {
    CallContext {
        trajectory_id: tid.into(),
        request: request.into(),
        messages: messages.map(Arc::new),
        started_at: 0,
        weight_version: None,
        normalized: Vec::new(),
        api: crate::surface::Api::Chat,
        response_id: None,
        instructions: 0,
        images: None,
        model: None,
        adapter: None,
    }
}

/// A choice that sampled `sampled_ids` and stopped, served as `served`,
/// from backend `b`, without logprobs.
pub fn stopped(sampled_ids: Vec<u32>, served: Json) -> ChoiceOutcome {
    ChoiceOutcome {
        sampled_ids,
        logprobs: Vec::new(),
        finish_reason: Some(crate::backend::FinishReason::Stop),
        served: served.into(),
        backend: "b".into(),
        moved_from: None,
        weight_version: None,
        parse_outcome: None,
        versions: Vec::new(),
        stale: false,
        prompt_drift: None,
    }
}
