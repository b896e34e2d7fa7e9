//! The records the span store keeps: one [`CallRecord`] per LLM call, grouped
//! into a [`Trajectory`]. Plain data with serde derives; no I/O here.

use serde::{Deserialize, Serialize};

/// Lifecycle of a trajectory. A finished trajectory accepts rewards but no
/// further calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrajectoryStatus {
    Active,
    Finished,
}

impl TrajectoryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TrajectoryStatus::Active => "active",
            TrajectoryStatus::Finished => "finished",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(TrajectoryStatus::Active),
            "finished" => Some(TrajectoryStatus::Finished),
            _ => None,
        }
    }
}

/// Where the exact prompt of a continued call differs from a fresh template
/// render of the same messages. Produced by the trajectory module; the store
/// only keeps and returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// Index into the call's full prompt ids of the first differing token.
    pub position: u32,
    /// Cause class, e.g. `bpe_retokenization`, `tool_call_rerender`,
    /// `reasoning_stripped`, `boundary_token`, `bos`, `client_edit`, `other`.
    pub cause: String,
    /// Free-form evidence (expected/actual ids around the position, ...).
    #[serde(default)]
    pub details: serde_json::Value,
}

/// One LLM call of a trajectory, exactly as it went to and came from the
/// backend.
///
/// Prompts are stored as deltas: a call's full prompt is
/// `full_prompt(parent) + parent.sampled_ids + prompt_delta_ids`, and just
/// `prompt_delta_ids` when `parent_call` is `None`. See
/// [`crate::store::full_prompt_ids`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub trajectory_id: String,
    /// Unique within the trajectory; assigned by the caller (0, 1, ...).
    pub call_index: u32,
    pub sample_index: u32,
    /// The call whose prompt + sampled ids this call's prompt extends.
    /// Must be smaller than `call_index`.
    pub parent_call: Option<u32>,
    /// Backend name (url or label) that served the call.
    pub backend: String,
    /// Unix milliseconds.
    pub started_at: i64,
    pub finished_at: i64,
    pub prompt_delta_ids: Vec<u32>,
    pub sampled_ids: Vec<u32>,
    /// Same length as `sampled_ids`: the logprob the backend reported for
    /// each sampled token, `None` where it reported none.
    pub logprobs: Vec<Option<f32>>,
    pub finish_reason: String,
    /// The request as received (messages + sampling params).
    pub request: serde_json::Value,
    /// The message returned to the client.
    pub response: serde_json::Value,
    pub drift: Option<Drift>,
    /// Tool-call / reasoning parse outcome, e.g. `ok` or an error string.
    pub parse_outcome: Option<String>,
    /// Set when a sticky session had to move: the backend it moved from.
    pub moved_from: Option<String>,
    pub weight_version: Option<String>,
    pub tokenizer_sha256: String,
    pub template_sha256: String,
    /// Per-call reward; overrides the trajectory reward for samples ending here.
    pub reward: Option<f64>,
    /// The call (or its sample) ran out of its token budget.
    pub truncated: bool,
    /// Normalization rules that changed the request before it was rendered
    /// (e.g. `developer_as_system`); `request` holds it as received.
    #[serde(default)]
    pub normalized: Vec<String>,
}

/// Summary row of a trajectory (no calls).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryMeta {
    pub id: String,
    pub status: TrajectoryStatus,
    /// Unix milliseconds, store clock.
    pub created_at: i64,
    pub updated_at: i64,
    pub reward: Option<f64>,
    pub num_calls: u32,
    /// `max(call_index) + 1`; the next free index after a restart.
    pub next_call_index: u32,
    /// `max(sample_index) + 1`.
    pub next_sample_index: u32,
    /// The gateway crashed while running with `[store] ack = "queued"` and
    /// this trajectory was active: calls answered just before the crash may
    /// be missing.
    #[serde(default)]
    pub incomplete: bool,
}

/// A trajectory with all its calls, sorted by `call_index`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    #[serde(flatten)]
    pub meta: TrajectoryMeta,
    pub calls: Vec<CallRecord>,
}

/// Which trajectories a listing or an export covers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrajectoryFilter {
    pub status: Option<TrajectoryStatus>,
    /// Only trajectories with `updated_at >= since` (unix ms). A finished
    /// trajectory's `updated_at` is its finish (or last reward) time, so
    /// `status=finished&since=T` is "finished since T".
    pub since: Option<i64>,
}

/// One page request of [`crate::store::SpanStore::list_trajectories`].
#[derive(Debug, Clone, PartialEq)]
pub struct ListQuery {
    pub filter: TrajectoryFilter,
    /// Clamped to 1..=1000.
    pub limit: usize,
    /// Opaque cursor from a previous [`Page::next_cursor`].
    pub cursor: Option<String>,
}

/// One page of trajectories, oldest first (creation order, stable under
/// concurrent updates).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    pub items: Vec<TrajectoryMeta>,
    /// `None` on the last page.
    pub next_cursor: Option<String>,
}

/// Creation-order key used by cursors: the cursor is the decimal key of the
/// last item on a page.
pub(crate) fn parse_cursor(cursor: Option<&str>) -> Result<u64, super::StoreError> {
    match cursor {
        None | Some("") => Ok(0),
        Some(c) => c
            .parse::<u64>()
            .map_err(|_| super::StoreError::Invalid(format!("bad cursor `{c}`"))),
    }
}

pub(crate) fn clamp_limit(limit: usize) -> usize {
    limit.clamp(1, 1000)
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
