//! Row <-> record mapping for the PostgreSQL store and the SELECTs every
//! reader shares. No writes here.

use std::collections::HashMap;

use serde_json::Value;
use tokio_postgres::Row;

use super::Conn;
use crate::store::codec::{ids_from_bytes, join_request, logprobs_from_bytes};
use crate::store::{
    Bodies, CallRecord, Drift, ResponseRef, SampleReplay, StoreError, Trajectory, TrajectoryFilter,
    TrajectoryMeta, TrajectoryMetadata, TrajectoryStatus,
};

pub(crate) fn status_code(s: TrajectoryStatus) -> i64 {
    match s {
        TrajectoryStatus::Active => 0,
        TrajectoryStatus::Finished => 1,
    }
}

fn corrupt(col: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("column `{col}`: {e}"))
}

/// A non-negative BIGINT column as u32.
fn u32_col(row: &Row, col: &str) -> Result<u32, StoreError> {
    let v: i64 = row.try_get(col)?;
    u32::try_from(v).map_err(|_| corrupt(col, format!("{v} is not a u32")))
}

fn opt_u32_col(row: &Row, col: &str) -> Result<Option<u32>, StoreError> {
    let v: Option<i64> = row.try_get(col)?;
    v.map(|v| u32::try_from(v).map_err(|_| corrupt(col, format!("{v} is not a u32"))))
        .transpose()
}

fn json_opt_col<T: serde::de::DeserializeOwned>(
    row: &Row,
    col: &str,
) -> Result<Option<T>, StoreError> {
    let text: Option<&str> = row.try_get(col)?;
    text.map(|t| serde_json::from_str(t).map_err(|e| corrupt(col, e)))
        .transpose()
}

fn json_col<T: serde::de::DeserializeOwned>(row: &Row, col: &str) -> Result<T, StoreError> {
    let text: &str = row.try_get(col)?;
    serde_json::from_str(text).map_err(|e| corrupt(col, e))
}

pub(crate) const META_COLS: &str = "seq, id, status, created_at, updated_at, reward, num_calls, \
     next_call_index, next_sample_index, incomplete, group_id, data_source, data_index, \
     extra_info, reward_extra, num_tokens, drift_count";

/// Maps a row selected with [`META_COLS`] to `(seq, meta)`.
pub(crate) fn meta_from_row(row: &Row) -> Result<(i64, TrajectoryMeta), StoreError> {
    let status: i64 = row.try_get("status")?;
    let num_tokens: i64 = row.try_get("num_tokens")?;
    Ok((
        row.try_get("seq")?,
        TrajectoryMeta {
            id: row.try_get("id")?,
            status: if status == 1 {
                TrajectoryStatus::Finished
            } else {
                TrajectoryStatus::Active
            },
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            reward: row.try_get("reward")?,
            num_calls: u32_col(row, "num_calls")?,
            num_tokens: u64::try_from(num_tokens).unwrap_or(0),
            drift_count: u32_col(row, "drift_count")?,
            next_call_index: u32_col(row, "next_call_index")?,
            next_sample_index: u32_col(row, "next_sample_index")?,
            incomplete: row.try_get("incomplete")?,
            metadata: TrajectoryMetadata {
                group: row.try_get("group_id")?,
                data_source: row.try_get("data_source")?,
                index: row.try_get("data_index")?,
                extra_info: json_opt_col(row, "extra_info")?,
            },
            reward_extra: json_opt_col(row, "reward_extra")?,
        },
    ))
}

/// A call's columns (read by name), the three that hold its bodies
/// (request, response, message digests) left out as typed NULLs for
/// [`Bodies::Skip`].
fn call_cols(bodies: Bodies) -> &'static str {
    macro_rules! cols {
        ($bodies:literal) => {
            concat!(
                "call_index, sample_index, parent_call, backend, started_at, finished_at, \
                 prompt_delta_ids, sampled_ids, logprobs, finish_reason, drift, parse_outcome, \
                 moved_from, weight_version, tokenizer_sha256, template_sha256, reward, \
                 truncated, normalized, request_of, api, response_id, versions, images, model, adapter, ",
                $bodies
            )
        };
    }
    match bodies {
        Bodies::Read => cols!("request, response, message_refs"),
        Bodies::Skip => {
            cols!("NULL::text AS request, NULL::text AS response, NULL::bytea AS message_refs")
        }
    }
}

fn call_from_row(row: &Row, trajectory_id: &str, bodies: Bodies) -> Result<CallRecord, StoreError> {
    let bytes = |col: &str| -> Result<&[u8], StoreError> { Ok(row.try_get(col)?) };
    let body = |col| match bodies {
        Bodies::Read => json_col(row, col),
        Bodies::Skip => Ok(std::sync::Arc::new(Value::Null)),
    };
    Ok(CallRecord {
        trajectory_id: trajectory_id.to_string(),
        call_index: u32_col(row, "call_index")?,
        sample_index: u32_col(row, "sample_index")?,
        parent_call: opt_u32_col(row, "parent_call")?,
        backend: row.try_get("backend")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        prompt_delta_ids: ids_from_bytes(bytes("prompt_delta_ids")?)
            .map_err(|e| corrupt("prompt_delta_ids", e))?,
        sampled_ids: ids_from_bytes(bytes("sampled_ids")?)
            .map_err(|e| corrupt("sampled_ids", e))?,
        logprobs: logprobs_from_bytes(bytes("logprobs")?).map_err(|e| corrupt("logprobs", e))?,
        finish_reason: row.try_get("finish_reason")?,
        request: body("request")?,
        response: body("response")?,
        drift: json_opt_col::<Drift>(row, "drift")?,
        parse_outcome: row.try_get("parse_outcome")?,
        moved_from: row.try_get("moved_from")?,
        weight_version: row.try_get("weight_version")?,
        tokenizer_sha256: row.try_get("tokenizer_sha256")?,
        template_sha256: row.try_get("template_sha256")?,
        reward: row.try_get("reward")?,
        truncated: row.try_get("truncated")?,
        normalized: json_opt_col(row, "normalized")?.unwrap_or_default(),
        request_of: opt_u32_col(row, "request_of")?,
        api: row.try_get("api")?,
        response_id: row.try_get("response_id")?,
        versions: json_opt_col(row, "versions")?.unwrap_or_default(),
        images: json_opt_col(row, "images")?.unwrap_or_default(),
        model: row.try_get("model")?,
        adapter: row.try_get("adapter")?,
    })
}

pub(crate) async fn meta_by_id(
    conn: &mut Conn,
    id: &str,
) -> Result<Option<(i64, TrajectoryMeta)>, StoreError> {
    let sql = format!("SELECT {META_COLS} FROM trajectories WHERE id = $1");
    let stmt = conn.prep(&sql).await?;
    match conn.client.query_opt(&stmt, &[&id]).await? {
        Some(row) => Ok(Some(meta_from_row(&row)?)),
        None => Ok(None),
    }
}

/// All calls of a trajectory, ascending, or the last `limit` of them.
pub(crate) async fn calls_of(
    conn: &mut Conn,
    seq: i64,
    trajectory_id: &str,
    limit: Option<usize>,
    bodies: Bodies,
) -> Result<Vec<CallRecord>, StoreError> {
    let cols = call_cols(bodies);
    let rows = match limit {
        None => {
            let sql = format!("SELECT {cols} FROM calls WHERE traj = $1 ORDER BY call_index");
            let stmt = conn.prep(&sql).await?;
            conn.client.query(&stmt, &[&seq]).await?
        }
        Some(n) => {
            let sql = format!(
                "SELECT {cols} FROM calls WHERE traj = $1 ORDER BY call_index DESC LIMIT $2"
            );
            let stmt = conn.prep(&sql).await?;
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            let mut rows = conn.client.query(&stmt, &[&seq, &n]).await?;
            rows.reverse();
            rows
        }
    };
    let mut messages = None;
    let mut calls = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut call = call_from_row(row, trajectory_id, bodies)?;
        if let Some(refs) = row.try_get::<_, Option<&[u8]>>("message_refs")? {
            if messages.is_none() {
                messages = Some(messages_of(conn, seq).await?);
            }
            let shell = std::sync::Arc::unwrap_or_clone(call.request);
            // Keys are the messages' 32-byte SHA-256 digests.
            let stored = messages.as_ref();
            call.request = join_request(shell, refs, 32, |d| stored.and_then(|m| m.get(d)))?.into();
        }
        calls.push(call);
    }
    Ok(calls)
}

/// Every message trajectory `seq` keeps apart, parsed, by digest.
async fn messages_of(conn: &mut Conn, seq: i64) -> Result<HashMap<Vec<u8>, Value>, StoreError> {
    let stmt = conn
        .prep("SELECT sha256, body FROM request_messages WHERE traj = $1")
        .await?;
    let mut out = HashMap::new();
    for row in conn.client.query(&stmt, &[&seq]).await? {
        let body: &str = row.try_get(1)?;
        let body = serde_json::from_str(body).map_err(|e| corrupt("request_messages", e))?;
        out.insert(row.try_get(0)?, body);
    }
    Ok(out)
}

/// The stored replay checks of a trajectory.
pub(crate) async fn replays_of(conn: &mut Conn, seq: i64) -> Result<Vec<SampleReplay>, StoreError> {
    let stmt = conn
        .prep("SELECT replays FROM trajectories WHERE seq = $1")
        .await?;
    match conn.client.query_opt(&stmt, &[&seq]).await? {
        Some(row) => Ok(json_opt_col(&row, "replays")?.unwrap_or_default()),
        None => Ok(Vec::new()),
    }
}

/// Reads one trajectory (meta, calls, replay checks) in one snapshot.
pub(crate) async fn load(
    conn: &mut Conn,
    key: Key<'_>,
    bodies: Bodies,
) -> Result<Option<Trajectory>, StoreError> {
    conn.client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let result = load_in_snapshot(conn, key, bodies).await;
    conn.client.batch_execute("COMMIT").await?;
    result
}

/// How a trajectory is named: its id, or its listing key (`lseq`).
#[derive(Clone, Copy)]
pub(crate) enum Key<'a> {
    Id(&'a str),
    Listed(i64),
}

async fn load_in_snapshot(
    conn: &mut Conn,
    key: Key<'_>,
    bodies: Bodies,
) -> Result<Option<Trajectory>, StoreError> {
    let found = match key {
        Key::Id(id) => meta_by_id(conn, id).await?,
        Key::Listed(lseq) => {
            let sql = format!("SELECT {META_COLS} FROM trajectories WHERE lseq = $1");
            let stmt = conn.prep(&sql).await?;
            match conn.client.query_opt(&stmt, &[&lseq]).await? {
                Some(row) => Some(meta_from_row(&row)?),
                None => None,
            }
        }
    };
    let Some((seq, meta)) = found else {
        return Ok(None);
    };
    let calls = calls_of(conn, seq, &meta.id, None, bodies).await?;
    let replays = replays_of(conn, seq).await?;
    Ok(Some(Trajectory {
        meta,
        calls,
        replays,
    }))
}

/// The filter conditions after the key: [`FilterParams`] as `$2` to `$6`:
/// status code, since, group, complete groups only, group size (each NULL
/// when unset). A complete group has no active member.
macro_rules! filter_rest {
    () => {
        "($2::BIGINT IS NULL OR status = $2) \
         AND ($3::BIGINT IS NULL OR updated_at >= $3) AND ($4::TEXT IS NULL OR group_id = $4) \
         AND (NOT $5::BOOLEAN OR (group_id IS NOT NULL \
           AND NOT EXISTS (SELECT 1 FROM trajectories g \
                           WHERE g.group_id = trajectories.group_id AND g.status = 0) \
           AND ($6::BIGINT IS NULL OR (SELECT count(*) FROM trajectories g \
                                       WHERE g.group_id = trajectories.group_id) >= $6)))"
    };
}

/// `WHERE` clause of counting and leasing: `$1` = seq after, then the
/// filter (see `filter_rest`).
pub(crate) const FILTER_SQL: &str = concat!("seq > $1 AND ", filter_rest!());

/// `WHERE` clause of listing and scanning: `$1` = listing key after. The
/// listing key (`lseq`) is drawn when the creating transaction commits, in
/// commit order (see `writer::COMMIT_SQL`): a reader paging past a key
/// never misses a trajectory committed later with a lower one, as it could
/// with `seq` (drawn at insert) when replicas commit out of order.
const LISTING_FILTER_SQL: &str = concat!("lseq > $1 AND ", filter_rest!());

pub(crate) struct FilterParams {
    pub status: Option<i64>,
    pub since: Option<i64>,
    pub group: Option<String>,
    pub complete: bool,
    pub size: Option<i64>,
}

impl FilterParams {
    pub(crate) fn of(filter: &TrajectoryFilter) -> Self {
        FilterParams {
            status: filter.status.map(status_code),
            since: filter.since,
            group: filter.group.clone(),
            complete: filter.complete_groups,
            size: filter.group_size.map(i64::from),
        }
    }
}

/// Up to `limit` `(lseq, meta)` matching `filter` after listing key
/// `after`, in listing order.
pub(crate) async fn page(
    conn: &mut Conn,
    filter: &TrajectoryFilter,
    after: i64,
    limit: usize,
) -> Result<Vec<(i64, TrajectoryMeta)>, StoreError> {
    let sql = format!(
        "SELECT lseq, {META_COLS} FROM trajectories WHERE {LISTING_FILTER_SQL} \
         ORDER BY lseq LIMIT $7"
    );
    let stmt = conn.prep(&sql).await?;
    let f = FilterParams::of(filter);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = conn
        .client
        .query(
            &stmt,
            &[
                &after,
                &f.status,
                &f.since,
                &f.group,
                &f.complete,
                &f.size,
                &limit,
            ],
        )
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("lseq")?, meta_from_row(row)?.1)))
        .collect()
}

pub(crate) async fn count(conn: &mut Conn, filter: &TrajectoryFilter) -> Result<u64, StoreError> {
    let sql = format!("SELECT count(*) FROM trajectories WHERE {FILTER_SQL}");
    let stmt = conn.prep(&sql).await?;
    let f = FilterParams::of(filter);
    let row = conn
        .client
        .query_one(
            &stmt,
            &[&0i64, &f.status, &f.since, &f.group, &f.complete, &f.size],
        )
        .await?;
    let n: i64 = row.try_get(0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Every trajectory of a group, in creation order.
pub(crate) async fn group(conn: &mut Conn, group: &str) -> Result<Vec<TrajectoryMeta>, StoreError> {
    let sql = format!("SELECT {META_COLS} FROM trajectories WHERE group_id = $1 ORDER BY seq");
    let stmt = conn.prep(&sql).await?;
    let rows = conn.client.query(&stmt, &[&group]).await?;
    rows.iter()
        .map(|r| meta_from_row(r).map(|(_, m)| m))
        .collect()
}

/// The trajectory id and call index of the call holding `response_id`
/// (a forgotten id's row names no call).
pub(crate) async fn find_response(
    conn: &mut Conn,
    response_id: &str,
) -> Result<Option<ResponseRef>, StoreError> {
    let stmt = conn
        .prep(
            "SELECT t.id, r.call_index FROM responses r JOIN trajectories t ON t.seq = r.traj \
             WHERE r.response_id = $1",
        )
        .await?;
    match conn.client.query_opt(&stmt, &[&response_id]).await? {
        Some(row) => Ok(Some(ResponseRef {
            trajectory_id: row.try_get(0)?,
            call_index: u32_col(&row, "call_index")?,
        })),
        None => Ok(None),
    }
}

/// A `gateway_state` value.
pub(crate) async fn state(conn: &mut Conn, key: &str) -> Result<Option<String>, StoreError> {
    let stmt = conn
        .prep("SELECT value FROM gateway_state WHERE key = $1")
        .await?;
    match conn.client.query_opt(&stmt, &[&key]).await? {
        Some(row) => Ok(Some(row.try_get(0)?)),
        None => Ok(None),
    }
}
