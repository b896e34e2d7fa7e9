//! Trajectory routes: list, show (calls, samples with segments and masks,
//! drift records), reward, finish. Handlers only: all state they need is
//! [`StoreState`], pulled from the app state with `FromRef`; they read and
//! write through [`SpanStore`](crate::store::SpanStore) and never touch the
//! trajectory module's in-memory cache (the lead's code updates that).

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRef, Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::store::{
    sample_leaves, segments, CallRecord, DynStore, ListQuery, SegmentKind, TrajectoryFilter,
    TrajectoryMeta, TrajectoryMetadata, TrajectoryStatus,
};

/// Turns token ids into text for segment display; `None` on failure.
/// Decodes ids with the tokenizer of the model named (`None`: the first).
pub type DecodeFn = Arc<dyn Fn(Option<&str>, &[u32]) -> Option<String> + Send + Sync>;

/// Called with a trajectory id once it is finished.
pub type FinishHook = Arc<dyn Fn(&str) + Send + Sync>;

/// What the trajectory and export routes need from the app state.
#[derive(Clone)]
pub struct StoreState {
    pub store: DynStore,
    /// When set, each segment of `GET /v1/trajectories/{id}` carries `text`.
    pub decode: Option<DecodeFn>,
    /// The verl layout's default padding id (the tokenizer's pad token, else
    /// its EOS; 0 when it has neither).
    pub pad_id: u32,
    /// Called with the id after a trajectory is finished (the gateway drops
    /// it from its in-memory view so later calls are refused up front).
    pub on_finish: Option<FinishHook>,
    /// The image processor config `GET /v1/export?pixel_values=true`
    /// computes with, or why there is none (a text-only model, a config
    /// whose output tito does not compute).
    pub pixel_values: Result<crate::render::pixel_values::PixelConfig, String>,
}

/// `GET /v1/trajectories`, `GET /v1/trajectories/{id}`,
/// `POST /v1/trajectories/{id}/reward`, `POST /v1/trajectories/{id}/finish`,
/// `POST /v1/trajectories/{id}/metadata`, `GET /v1/groups/{group}`,
/// `GET /v1/versions`.
pub fn routes<S>() -> Router<S>
where
    StoreState: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/v1/trajectories", get(list))
        .route("/v1/trajectories/{id}", get(show))
        .route("/v1/trajectories/{id}/reward", post(reward))
        .route("/v1/trajectories/{id}/finish", post(finish))
        .route("/v1/trajectories/{id}/metadata", post(metadata))
        .route("/v1/groups/{group}", get(group))
        .route("/v1/versions", get(versions))
}

/// `GET /v1/versions`: every registered weight version, ascending by its
/// sequence number (the numbers `response_versions` and the version filters
/// of the export use), so a trainer can name the weights of each token.
async fn versions(State(st): State<StoreState>) -> Result<Json<Value>, ApiError> {
    let data: Vec<Value> = st
        .store
        .versions()
        .await?
        .into_iter()
        .map(|v| {
            json!({
                "object": "weight_version",
                "seq": v.seq,
                "version": v.label,
                "registered_at": v.registered_at,
            })
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

/// Parses `since`: unix milliseconds, or an RFC 3339 timestamp.
pub(crate) fn parse_since(s: &str) -> Result<i64, ApiError> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|_| {
            ApiError::invalid(
                "since",
                "`since` must be unix milliseconds or an RFC 3339 time",
            )
        })
}

pub(crate) fn parse_status(s: &str) -> Result<TrajectoryStatus, ApiError> {
    TrajectoryStatus::parse(s)
        .ok_or_else(|| ApiError::invalid("status", "expected `active` or `finished`"))
}

/// The filter query parameters shared by listing and export: `status`,
/// `since`, `group`, `complete_groups`, `group_size`.
#[derive(Debug, Default, Deserialize)]
pub struct FilterParams {
    pub status: Option<String>,
    pub since: Option<String>,
    pub group: Option<String>,
    pub complete_groups: Option<bool>,
    pub group_size: Option<u32>,
}

impl FilterParams {
    pub(crate) fn filter(&self) -> Result<TrajectoryFilter, ApiError> {
        let group = self.group.clone().filter(|g| !g.is_empty());
        if let Some(g) = &group {
            super::check_id("group", "group", g)?;
        }
        if self.group_size.is_some() && self.complete_groups != Some(true) {
            return Err(ApiError::invalid(
                "group_size",
                "`group_size` only applies with `complete_groups=true`",
            ));
        }
        if self.group_size == Some(0) {
            return Err(ApiError::invalid(
                "group_size",
                "`group_size` must be positive",
            ));
        }
        Ok(TrajectoryFilter {
            status: self
                .status
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(parse_status)
                .transpose()?,
            since: self
                .since
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(parse_since)
                .transpose()?,
            group,
            complete_groups: self.complete_groups.unwrap_or(false),
            group_size: self.group_size,
        })
    }
}

#[derive(Deserialize)]
struct ListParams {
    status: Option<String>,
    since: Option<String>,
    group: Option<String>,
    complete_groups: Option<bool>,
    group_size: Option<u32>,
    limit: Option<usize>,
    cursor: Option<String>,
}

#[derive(Serialize)]
struct MetaView<'a> {
    object: &'static str,
    #[serde(flatten)]
    meta: &'a TrajectoryMeta,
}

fn meta_json(meta: &TrajectoryMeta) -> Value {
    serde_json::to_value(MetaView {
        object: "trajectory",
        meta,
    })
    .unwrap_or(Value::Null)
}

async fn list(
    State(st): State<StoreState>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(p) = params?;
    let filter = FilterParams {
        status: p.status,
        since: p.since,
        group: p.group,
        complete_groups: p.complete_groups,
        group_size: p.group_size,
    };
    let query = ListQuery {
        filter: filter.filter()?,
        limit: p.limit.unwrap_or(100),
        cursor: p.cursor,
    };
    let page = st.store.list_trajectories(&query).await?;
    Ok(Json(json!({
        "object": "list",
        "data": page.items.iter().map(meta_json).collect::<Vec<_>>(),
        "has_more": page.next_cursor.is_some(),
        "next_cursor": page.next_cursor,
    })))
}

#[derive(Serialize)]
struct SegmentView {
    kind: SegmentKind,
    call: u32,
    ids: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

async fn show(
    State(st): State<StoreState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    super::check_id("trajectory", "id", &id)?;
    let traj = st
        .store
        .get_trajectory(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("trajectory `{id}` not found")))?;
    let decode = st.decode.clone();
    // Sample reconstruction copies every id of the trajectory: off the runtime.
    let body = tokio::task::spawn_blocking(move || -> Result<Value, ApiError> {
        let mut samples = Vec::new();
        for (sample, leaf) in sample_leaves(&traj.calls) {
            let built = crate::store::build_sample(&traj, sample, leaf)?;
            let segs: Vec<SegmentView> = segments(&traj.calls, leaf)?
                .into_iter()
                .map(|s| SegmentView {
                    // Each call's ids in its own model's tokenizer.
                    text: decode.as_ref().and_then(|d| {
                        let model = traj.call(s.call).and_then(|c| c.model.as_deref());
                        d(model, &s.ids)
                    }),
                    kind: s.kind,
                    call: s.call,
                    ids: s.ids,
                })
                .collect();
            // One check per policy of the sample (each compares that
            // policy's tokens); `replay`: the first.
            let replays: Vec<_> = traj
                .replays
                .iter()
                .filter(|r| r.sample == built.sample)
                .collect();
            samples.push(json!({
                "sample": built.sample,
                "replay": replays.first(),
                "replays": replays,
                "calls": built.calls,
                "segments": segs,
                "prompt_ids": built.prompt_ids,
                "response_ids": built.response_ids,
                "response_mask": built.response_mask,
                "response_versions": built.response_versions,
                "reward": built.reward,
                "num_turns": built.num_turns,
                "finish_reason": built.finish_reason,
                "truncated": built.truncated,
                "model": built.model,
                "adapter": built.adapter,
            }));
        }
        let drift: Vec<Value> = traj
            .calls
            .iter()
            .filter_map(|c: &CallRecord| {
                c.drift.as_ref().map(|d| {
                    json!({"call": c.call_index, "position": d.position,
                           "cause": d.cause, "details": d.details})
                })
            })
            .collect();
        let mut body = meta_json(&traj.meta);
        if let Value::Object(map) = &mut body {
            map.insert("calls".into(), json!(traj.calls));
            map.insert("samples".into(), Value::Array(samples));
            map.insert("drift".into(), Value::Array(drift));
        }
        Ok(body)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RewardBody {
    reward: f64,
    #[serde(default)]
    call: Option<u32>,
    /// Named reward parts, exported as `reward_extra_info`.
    #[serde(default)]
    extra: Option<Value>,
}

async fn reward(
    State(st): State<StoreState>,
    Path(id): Path<String>,
    body: Result<Json<RewardBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    super::check_id("trajectory", "id", &id)?;
    let Json(b) = body.map_err(ApiError::from)?;
    if !b.reward.is_finite() {
        return Err(ApiError::invalid("reward", "must be a finite number"));
    }
    super::check_extra_info(b.extra.as_ref(), "extra")?;
    if b.extra.is_some() && b.call.is_some() {
        return Err(ApiError::invalid(
            "extra",
            "reward parts (`extra`) belong to the trajectory: send them without `call`",
        ));
    }
    let meta = st.store.set_reward(&id, b.call, b.reward, b.extra).await?;
    Ok(Json(meta_json(&meta)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MetadataBody {
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    data_source: Option<String>,
    #[serde(default)]
    index: Option<i64>,
    #[serde(default)]
    extra_info: Option<Value>,
}

/// Sets group and task metadata; creates the trajectory when it does not
/// exist yet (a trainer may register a task before its agent starts).
async fn metadata(
    State(st): State<StoreState>,
    Path(id): Path<String>,
    body: Result<Json<MetadataBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(ApiError::from)?;
    super::check_id("trajectory", "id", &id)?;
    if let Some(g) = &b.group {
        super::check_id("group", "group", g)?;
    }
    super::check_extra_info(b.extra_info.as_ref(), "extra_info")?;
    let update = TrajectoryMetadata {
        group: b.group,
        data_source: b.data_source,
        index: b.index,
        extra_info: b.extra_info,
    };
    if update.is_empty() {
        return Err(ApiError::bad_request(
            "set at least one of `group`, `data_source`, `index`, `extra_info`",
        ));
    }
    // The gateway's in-memory view may now be behind: harmless, as the store
    // decides group conflicts and a stale view only costs a redundant write.
    let meta = st.store.set_metadata(&id, &update).await?;
    Ok(Json(meta_json(&meta)))
}

/// `GET /v1/groups/{group}`: its trajectories and rewards; complete when
/// every member is finished.
async fn group(
    State(st): State<StoreState>,
    Path(group): Path<String>,
) -> Result<Json<Value>, ApiError> {
    super::check_id("group", "group", &group)?;
    let members = st.store.group(&group).await?;
    if members.is_empty() {
        return Err(ApiError::not_found(format!("group `{group}` not found")));
    }
    let finished = members
        .iter()
        .filter(|m| m.status == TrajectoryStatus::Finished)
        .count();
    let rewards: Vec<f64> = members.iter().filter_map(|m| m.reward).collect();
    let mean = (!rewards.is_empty()).then(|| rewards.iter().sum::<f64>() / rewards.len() as f64);
    Ok(Json(json!({
        "object": "group",
        "id": group,
        "size": members.len(),
        "finished": finished,
        "complete": finished == members.len(),
        "rewarded": rewards.len(),
        "mean_reward": mean,
        "trajectories": members.iter().map(|m| json!({
            "id": m.id,
            "status": m.status,
            "reward": m.reward,
            "reward_extra_info": m.reward_extra,
            "num_calls": m.num_calls,
            "num_tokens": m.num_tokens,
            "drift_count": m.drift_count,
            "updated_at": m.updated_at,
        })).collect::<Vec<_>>(),
    })))
}

async fn finish(
    State(st): State<StoreState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    super::check_id("trajectory", "id", &id)?;
    let meta = st.store.finish(&id).await?;
    if let Some(hook) = &st.on_finish {
        hook(&id);
    }
    Ok(Json(meta_json(&meta)))
}
