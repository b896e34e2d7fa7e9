//! The records the span store keeps: one [`CallRecord`] per LLM call, grouped
//! into a [`Trajectory`]. Plain data with serde derives; no I/O here.

use serde::{Deserialize, Serialize};

use super::StoreError;

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
    /// The request as received (messages + sampling params); `null` when
    /// `request_of` points at the call that holds it.
    pub request: std::sync::Arc<serde_json::Value>,
    /// The message returned to the client.
    pub response: std::sync::Arc<serde_json::Value>,
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
    /// The calls one HTTP request started (its `n` choices, its prompts)
    /// share one request body, stored with the first of them: the others
    /// name that call here. See [`Trajectory::request_of`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_of: Option<u32>,
    /// The surface the call came through: `chat`, `completions`,
    /// `responses` or `messages` (see [`CallRecord::APIS`]); `None` for
    /// calls recorded before the store kept it.
    #[serde(default)]
    pub api: Option<String>,
    /// The id under which the call's answer can be retrieved (`GET
    /// /v1/responses/{id}`): unique across the store, `None` for calls
    /// that keep none and once forgotten
    /// ([`crate::store::SpanStore::forget_response`]).
    #[serde(default)]
    pub response_id: Option<String>,
    /// The weights that generated `sampled_ids`, as runs of tokens: empty
    /// when unknown (calls recorded before the store kept it, answers no
    /// backend generated); otherwise the first span starts at 0, starts
    /// increase strictly and each is below `sampled_ids.len()`. A call
    /// continued on new weights after an update interrupted it has a second
    /// span starting at the seam.
    #[serde(default)]
    pub versions: Vec<VersionSpan>,
    /// The images of the call's full prompt, in the order their placeholder
    /// runs appear in it; each image's bytes are stored once per store
    /// ([`crate::store::SpanStore::put_images`]). Empty for a text prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<CallImage>,
    /// The policy that served the call: the served model's name (`[model]
    /// name`); `None` for calls recorded before the store kept it.
    #[serde(default)]
    pub model: Option<String>,
    /// The LoRA adapter of [`CallRecord::model`] that served the call;
    /// `None` for the base model (and for calls recorded before the store
    /// kept it). Set only with `model`.
    #[serde(default)]
    pub adapter: Option<String>,
}

/// An image of a call's prompt, by reference to its stored bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallImage {
    /// Lowercase hex SHA-256 of the encoded bytes: the stored image's key.
    pub sha256: String,
    /// `image/png`, `image/jpeg`, `image/webp` or `image/gif`.
    pub mime: String,
    pub width: u32,
    pub height: u32,
    /// The vision processor's `(t, h, w)` patch grid of the image, whose
    /// `t * h * w / merge_size^2` pad tokens stand for it in the prompt.
    pub grid_thw: [u32; 3],
    /// Where its run of pad tokens starts in the call's full prompt ids,
    /// and how many it has.
    pub offset: u32,
    pub tokens: u32,
}

/// An image's encoded bytes as stored, content-addressed by `sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredImage {
    pub sha256: String,
    pub mime: String,
    pub width: u32,
    pub height: u32,
    pub bytes: std::sync::Arc<Vec<u8>>,
}

impl StoredImage {
    /// An image keyed by the SHA-256 of `bytes`.
    pub fn new(mime: &str, width: u32, height: u32, bytes: Vec<u8>) -> Self {
        StoredImage {
            sha256: sha256_hex(&bytes),
            mime: mime.to_string(),
            width,
            height,
            bytes: std::sync::Arc::new(bytes),
        }
    }
}

/// Lowercase hex SHA-256 of `bytes`: the key an image is stored under.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// The weights that generated a run of a call's sampled tokens: tokens
/// `start..` (up to the next span's start) came from `version` (the user's
/// label) whose fleet sequence number is `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSpan {
    pub start: u32,
    pub version: Option<String>,
    pub seq: Option<u64>,
}

/// A weight version the fleet has served: its label and the sequence
/// number [`crate::store::SpanStore::register_version`] gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub seq: u64,
    pub label: String,
    /// Unix milliseconds.
    pub registered_at: i64,
}

impl CallRecord {
    /// The values [`CallRecord::api`] takes.
    pub const APIS: [&'static str; 4] = ["chat", "completions", "responses", "messages"];

    /// Longest [`CallRecord::response_id`] the store takes.
    pub const MAX_RESPONSE_ID: usize = 128;

    /// Longest [`CallRecord::model`] and [`CallRecord::adapter`], in bytes.
    pub const MAX_POLICY_NAME: usize = 256;

    /// The call as the export scans give it out ([`Bodies::Skip`]): every
    /// field but `request` and `response`, which are `null`.
    pub fn without_bodies(&self) -> CallRecord {
        let null = std::sync::Arc::new(serde_json::Value::Null);
        CallRecord {
            request: null.clone(),
            response: null,
            ..self.clone()
        }
    }

    /// The distinct keys of [`CallRecord::images`], sorted: what must be
    /// stored before the call is.
    pub(crate) fn image_keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.images.iter().map(|i| i.sha256.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// The span of [`CallRecord::versions`] covering sampled token `i`;
    /// `None` when the versions are unknown.
    pub fn version_at(&self, i: usize) -> Option<&VersionSpan> {
        let after = self.versions.partition_point(|s| s.start as usize <= i);
        after.checked_sub(1).and_then(|k| self.versions.get(k))
    }

    /// One entry per sampled id: the fleet sequence number of the weights
    /// that generated it, `None` where unknown.
    pub fn sampled_versions(&self) -> Vec<Option<u64>> {
        let n = self.sampled_ids.len();
        let mut out = vec![None; n];
        for (i, span) in self.versions.iter().enumerate() {
            let end = self
                .versions
                .get(i + 1)
                .map_or(n, |next| (next.start as usize).min(n));
            if let Some(run) = out.get_mut((span.start as usize).min(end)..end) {
                run.fill(span.seq);
            }
        }
        out
    }
}

/// Where a retrievable response was recorded
/// ([`crate::store::SpanStore::find_response`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseRef {
    pub trajectory_id: String,
    pub call_index: u32,
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
    /// Token ids recorded: every call's new prompt ids and sampled ids.
    #[serde(default)]
    pub num_tokens: u64,
    /// Calls whose exact prompt differed from a fresh render (drift).
    #[serde(default)]
    pub drift_count: u32,
    /// `max(call_index) + 1`; the next free index after a restart.
    pub next_call_index: u32,
    /// `max(sample_index) + 1`.
    pub next_sample_index: u32,
    /// The gateway crashed while running with `[store] ack = "queued"` and
    /// this trajectory was active: calls answered just before the crash may
    /// be missing.
    #[serde(default)]
    pub incomplete: bool,
    /// Group and task metadata (see [`TrajectoryMetadata`]).
    #[serde(flatten)]
    pub metadata: TrajectoryMetadata,
    /// Named parts of the reward (`{"acc": 1, "format": 0.5}`), exported as
    /// `reward_extra_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_extra: Option<serde_json::Value>,
}

/// What task a trajectory came from: its GRPO/RLOO group and the dataset
/// fields verl carries (`data_source`, `index`, `extra_info`). Set when the
/// trajectory is created (by its first call, or by `POST
/// /v1/trajectories/{id}/metadata` before it) or later; a group, once set,
/// never changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<i64>,
    /// Free JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_info: Option<serde_json::Value>,
}

impl TrajectoryMetadata {
    pub fn is_empty(&self) -> bool {
        self == &TrajectoryMetadata::default()
    }

    /// `self` with every field `update` sets replaced. A different group
    /// than the one already set is a [`StoreError::Conflict`].
    pub fn merged(&self, id: &str, update: &TrajectoryMetadata) -> Result<Self, StoreError> {
        if let (Some(old), Some(new)) = (&self.group, &update.group) {
            if old != new {
                return Err(StoreError::Conflict(format!(
                    "trajectory `{id}` is in group `{old}`, not `{new}`: a group never changes"
                )));
            }
        }
        Ok(TrajectoryMetadata {
            group: update.group.clone().or_else(|| self.group.clone()),
            data_source: update
                .data_source
                .clone()
                .or_else(|| self.data_source.clone()),
            index: update.index.or(self.index),
            extra_info: update
                .extra_info
                .clone()
                .or_else(|| self.extra_info.clone()),
        })
    }
}

/// The teacher-forced replay check of one sample: the recorded logprob of
/// every sampled token against the logprob a backend computes for the same
/// token given the same prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleReplay {
    pub sample: u32,
    /// The backend that recomputed the logprobs.
    pub backend: String,
    /// Unix milliseconds.
    pub checked_at: i64,
    /// Sampled tokens compared (those with a recorded and a replayed logprob).
    pub compared: u32,
    /// `None` when no token could be compared.
    pub max_abs_diff: Option<f64>,
    pub mean_abs_diff: Option<f64>,
    /// The |Δ| above which a position is listed in `positions`.
    pub threshold: f64,
    /// Positions (into the sample's `response_ids`) whose |Δ| is above the
    /// threshold, largest first, at most [`SampleReplay::MAX_POSITIONS`].
    pub positions: Vec<ReplayPosition>,
    /// Share of compared tokens that are not the replay's most likely token;
    /// `None` when the backend reports no ranks.
    pub argmax_mismatch_share: Option<f64>,
    /// The same numbers over the compared tokens of each weight version
    /// that sampled them ([`CallRecord::versions`]), ascending by `seq`,
    /// tokens of unknown version last (under `seq: null`); empty when
    /// nothing was compared (and for checks stored before it was kept).
    #[serde(default)]
    pub by_version: Vec<VersionReplay>,
    /// The policy the check replayed the sample as (its tokens of that
    /// policy were compared, on its weights): the served model and the
    /// LoRA adapter; `None` for a check of calls recorded without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
}

impl SampleReplay {
    pub const MAX_POSITIONS: usize = 256;

    /// Whether `other` is a check of the same sample as the same policy,
    /// which a new check replaces.
    pub fn same_check(&self, other: &SampleReplay) -> bool {
        self.sample == other.sample && self.model == other.model && self.adapter == other.adapter
    }
}

/// A replay check's numbers over the tokens one weight version sampled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionReplay {
    /// The version's fleet sequence number; `None` for tokens whose
    /// version is unknown.
    pub seq: Option<u64>,
    /// Its label, as the calls recorded it.
    pub version: Option<String>,
    pub compared: u32,
    pub max_abs_diff: Option<f64>,
    pub mean_abs_diff: Option<f64>,
    pub argmax_mismatch_share: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayPosition {
    pub position: u32,
    pub token_id: u32,
    pub recorded: f32,
    pub replayed: f32,
}

/// A trajectory with all its calls, sorted by `call_index`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    #[serde(flatten)]
    pub meta: TrajectoryMeta,
    pub calls: Vec<CallRecord>,
    /// Replay checks of its samples, by sample index (empty when none ran).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replays: Vec<SampleReplay>,
}

/// Whether a read of a trajectory's calls includes their bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bodies {
    /// Each call's `request` and `response` as stored.
    Read,
    /// Neither is read; both are `null`. The export scans read this way:
    /// no export column holds a body, and an agent's request carries its
    /// whole history, so the bodies outweigh the token ids they would be
    /// read with (`cargo bench --bench export`, docs/benchmarks.md).
    Skip,
}

/// Which trajectories a listing or an export covers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrajectoryFilter {
    pub status: Option<TrajectoryStatus>,
    /// Only trajectories with `updated_at >= since` (unix ms). A finished
    /// trajectory's `updated_at` is its finish (or last reward) time, so
    /// `status=finished&since=T` is "finished since T".
    pub since: Option<i64>,
    /// Only trajectories of this group.
    pub group: Option<String>,
    /// Only trajectories whose group is complete: every trajectory of the
    /// group finished (and at least `group_size` of them, when set).
    pub complete_groups: bool,
    pub group_size: Option<u32>,
}

/// A page of an export consumer's queue, leased until `expires_at`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lease {
    /// `None` when nothing was left to lease.
    pub cursor: Option<String>,
    /// Leased trajectory ids, in creation order.
    pub ids: Vec<String>,
    /// Unix milliseconds.
    pub expires_at: i64,
    /// The earliest `updated_at` among the leased trajectories (for a
    /// finished trajectory its finish, or a reward set after it): how long
    /// the oldest of them waited to be exported. `None` when nothing was
    /// leased.
    #[serde(skip)]
    pub oldest_updated_at: Option<i64>,
}

impl Lease {
    /// Nothing was left to lease.
    pub(crate) fn empty(expires_at: i64) -> Lease {
        Lease {
            cursor: None,
            ids: Vec::new(),
            expires_at,
            oldest_updated_at: None,
        }
    }

    /// A lease of `picked` `((seq, updated_at), id)` rows.
    pub(crate) fn of<K>(cursor: String, picked: Vec<((K, i64), String)>, expires_at: i64) -> Lease {
        Lease {
            cursor: Some(cursor),
            oldest_updated_at: picked.iter().map(|((_, at), _)| *at).min(),
            ids: picked.into_iter().map(|(_, id)| id).collect(),
            expires_at,
        }
    }
}

/// The page out of eligible `(seq, id, group)` rows in creation order: the
/// first `limit`, or with `whole_groups` every eligible member of the groups
/// the first `limit` rows start (a group is never split between pages, so
/// workers sharing a consumer each get whole GRPO groups).
pub(crate) fn lease_page<K>(
    rows: Vec<(K, String, Option<String>)>,
    limit: usize,
    whole_groups: bool,
) -> Vec<(K, String)> {
    if !whole_groups {
        return rows
            .into_iter()
            .take(limit)
            .map(|(k, id, _)| (k, id))
            .collect();
    }
    let mut groups = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (k, id, group) in rows {
        let Some(group) = group else { continue };
        if groups.contains(&group) || out.len() < limit {
            groups.insert(group);
            out.push((k, id));
        }
    }
    out
}

/// What `POST /v1/export/ack` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Acked {
    /// Trajectories acknowledged by this call.
    pub trajectories: u64,
    /// The cursor had been acknowledged before (a retried ack).
    pub already: bool,
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

/// One page of trajectories, oldest first (creation order; on PostgreSQL
/// the order their creations committed), stable under concurrent updates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    pub items: Vec<TrajectoryMeta>,
    /// `None` on the last page.
    pub next_cursor: Option<String>,
}

/// Listing key used by cursors: the cursor is the decimal key of the last
/// item on a page.
pub(crate) fn parse_cursor(cursor: Option<&str>) -> Result<u64, super::StoreError> {
    match cursor {
        None | Some("") => Ok(0),
        Some(c) => c
            .parse::<u64>()
            .map_err(|_| super::StoreError::Invalid(format!("bad cursor `{c}`"))),
    }
}

/// [`parse_cursor`] as the durable stores' key (a SQL `BIGINT`).
pub(crate) fn cursor_key(cursor: Option<&str>) -> Result<i64, super::StoreError> {
    i64::try_from(parse_cursor(cursor)?)
        .map_err(|_| super::StoreError::Invalid("bad cursor".into()))
}

pub(crate) fn clamp_limit(limit: usize) -> usize {
    limit.clamp(1, 1000)
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
