//! Row <-> record mapping for the SQLite store (ids and logprobs in the
//! [`crate::store::codec`] layout) and the SELECTs every reader shares. No
//! writes here.

use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::store::codec::{ids_from_bytes, logprobs_from_bytes};
use crate::store::{
    Bodies, CallRecord, Drift, ResponseRef, SampleReplay, StoreError, Trajectory, TrajectoryFilter,
    TrajectoryMeta, TrajectoryMetadata, TrajectoryStatus, VersionRecord,
};

/// The largest trajectory seq a call can be keyed under: a call's key is
/// `seq * 2^32 + call_index` (schema version 12), an `i64`.
const MAX_KEYED_SEQ: i64 = i64::MAX >> 32;

/// The `calls` row key of call `call_index` of the trajectory with `seq`.
pub(crate) fn call_key(seq: i64, call_index: u32) -> Result<i64, StoreError> {
    if !(0..=MAX_KEYED_SEQ).contains(&seq) {
        return Err(StoreError::Schema(format!(
            "trajectory seq {seq} is past the {MAX_KEYED_SEQ} trajectories a SQLite store \
             keys calls under (seq * 2^32 + call index)"
        )));
    }
    Ok((seq << 32) | i64::from(call_index))
}

/// The keys of every call of the trajectory with `seq`, `first..=last`;
/// `None` for a seq no call can be keyed under (it has no calls).
fn call_keys(seq: i64) -> Option<(i64, i64)> {
    Some((call_key(seq, 0).ok()?, call_key(seq, u32::MAX).ok()?))
}

fn conversion(col: usize, e: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, Type::Blob, e.into())
}

fn ids_col(row: &Row<'_>, col: usize) -> rusqlite::Result<Vec<u32>> {
    ids_from_bytes(row.get_ref(col)?.as_blob()?).map_err(|e| conversion(col, e))
}

fn logprobs_col(row: &Row<'_>, col: usize) -> rusqlite::Result<Vec<Option<f32>>> {
    logprobs_from_bytes(row.get_ref(col)?.as_blob()?).map_err(|e| conversion(col, e))
}

fn json_col<T: serde::de::DeserializeOwned>(row: &Row<'_>, col: usize) -> rusqlite::Result<T> {
    let text = row.get_ref(col)?.as_str()?;
    serde_json::from_str(text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(col, Type::Text, Box::new(e)))
}

/// A nullable JSON TEXT column.
fn json_opt_col<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    col: usize,
) -> rusqlite::Result<Option<T>> {
    match row.get_ref(col)?.as_str_or_null()? {
        Some(text) => serde_json::from_str(text)
            .map(Some)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(col, Type::Text, Box::new(e))),
        None => Ok(None),
    }
}

/// A JSON value as TEXT for a nullable column.
pub(crate) fn json_text(v: Option<&serde_json::Value>) -> Option<String> {
    v.map(serde_json::Value::to_string)
}

pub(crate) fn status_code(s: TrajectoryStatus) -> i64 {
    match s {
        TrajectoryStatus::Active => 0,
        TrajectoryStatus::Finished => 1,
    }
}

fn status_from(code: i64) -> TrajectoryStatus {
    if code == 1 {
        TrajectoryStatus::Finished
    } else {
        TrajectoryStatus::Active
    }
}

pub(crate) const META_COLS: &str = "seq, id, status, created_at, updated_at, reward, num_calls, \
     next_call_index, next_sample_index, incomplete, group_id, data_source, data_index, \
     extra_info, reward_extra, num_tokens, drift_count";

/// Maps a row selected with [`META_COLS`] to `(seq, meta)`.
pub(crate) fn meta_from_row(row: &Row<'_>) -> rusqlite::Result<(i64, TrajectoryMeta)> {
    Ok((
        row.get(0)?,
        TrajectoryMeta {
            id: row.get(1)?,
            status: status_from(row.get(2)?),
            created_at: row.get(3)?,
            updated_at: row.get(4)?,
            reward: row.get(5)?,
            num_calls: row.get(6)?,
            num_tokens: row.get::<_, i64>(15)?.max(0) as u64,
            drift_count: row.get(16)?,
            next_call_index: row.get(7)?,
            next_sample_index: row.get(8)?,
            incomplete: row.get(9)?,
            metadata: TrajectoryMetadata {
                group: row.get(10)?,
                data_source: row.get(11)?,
                index: row.get(12)?,
                extra_info: json_opt_col(row, 13)?,
            },
            reward_extra: json_opt_col(row, 14)?,
        },
    ))
}

/// A call's columns, in the order [`call_from_row`] reads them, with the
/// three that hold its bodies (request, response, message ids) given.
macro_rules! call_cols {
    ($request:literal, $response:literal, $refs:literal) => {
        concat!(
            "call_index, sample_index, parent_call, backend, started_at, finished_at, \
             prompt_delta_ids, sampled_ids, logprobs, finish_reason, ",
            $request,
            ", ",
            $response,
            ", drift, parse_outcome, moved_from, weight_version, tokenizer_sha256, \
             template_sha256, reward, truncated, normalized, request_of, api, response_id, \
             versions, images, model, adapter, ",
            $refs
        )
    };
}

/// The columns of a call as [`call_from_row`] reads them.
fn call_cols(bodies: Bodies) -> &'static str {
    match bodies {
        Bodies::Read => call_cols!("request", "response", "message_refs"),
        Bodies::Skip => call_cols!("NULL", "NULL", "NULL"),
    }
}

/// A call as read from its row (selected with [`call_cols`] of `bodies`),
/// and its message ids when its body's messages are stored apart (see
/// [`super::requests`]).
fn call_from_row(
    row: &Row<'_>,
    trajectory_id: &str,
    bodies: Bodies,
) -> rusqlite::Result<(CallRecord, Option<Vec<u8>>)> {
    let body = |col| match bodies {
        Bodies::Read => json_col(row, col),
        Bodies::Skip => Ok(std::sync::Arc::new(serde_json::Value::Null)),
    };
    let drift: Option<String> = row.get(12)?;
    let drift =
        match drift {
            Some(text) => Some(serde_json::from_str::<Drift>(&text).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(12, Type::Text, Box::new(e))
            })?),
            None => None,
        };
    let call = CallRecord {
        trajectory_id: trajectory_id.to_string(),
        call_index: row.get(0)?,
        sample_index: row.get(1)?,
        parent_call: row.get(2)?,
        backend: row.get(3)?,
        started_at: row.get(4)?,
        finished_at: row.get(5)?,
        prompt_delta_ids: ids_col(row, 6)?,
        sampled_ids: ids_col(row, 7)?,
        logprobs: logprobs_col(row, 8)?,
        finish_reason: row.get(9)?,
        request: body(10)?,
        response: body(11)?,
        drift,
        parse_outcome: row.get(13)?,
        moved_from: row.get(14)?,
        weight_version: row.get(15)?,
        tokenizer_sha256: row.get(16)?,
        template_sha256: row.get(17)?,
        reward: row.get(18)?,
        truncated: row.get(19)?,
        normalized: json_opt_col(row, 20)?.unwrap_or_default(),
        request_of: row.get(21)?,
        api: row.get(22)?,
        response_id: row.get(23)?,
        versions: json_opt_col(row, 24)?.unwrap_or_default(),
        images: json_opt_col(row, 25)?.unwrap_or_default(),
        model: row.get(26)?,
        adapter: row.get(27)?,
    };
    Ok((call, row.get(28)?))
}

pub(crate) fn meta_by_id(
    conn: &Connection,
    id: &str,
) -> Result<Option<(i64, TrajectoryMeta)>, StoreError> {
    let sql = format!("SELECT {META_COLS} FROM trajectories WHERE id = ?1");
    Ok(conn
        .prepare_cached(&sql)?
        .query_row(params![id], meta_from_row)
        .optional()?)
}

fn meta_by_seq(conn: &Connection, seq: i64) -> Result<Option<TrajectoryMeta>, StoreError> {
    let sql = format!("SELECT {META_COLS} FROM trajectories WHERE seq = ?1");
    Ok(conn
        .prepare_cached(&sql)?
        .query_row(params![seq], meta_from_row)
        .optional()?
        .map(|(_, m)| m))
}

/// All calls of a trajectory, ascending, or the last `limit` of them.
pub(crate) fn calls_of(
    conn: &Connection,
    seq: i64,
    trajectory_id: &str,
    limit: Option<usize>,
    bodies: Bodies,
) -> Result<Vec<CallRecord>, StoreError> {
    let cols = call_cols(bodies);
    let read = |r: &Row<'_>| call_from_row(r, trajectory_id, bodies);
    let Some((first, last)) = call_keys(seq) else {
        return Ok(Vec::new());
    };
    let calls: Vec<(CallRecord, Option<Vec<u8>>)> = match limit {
        None => {
            let sql = format!(
                "SELECT {cols} FROM calls WHERE call_key BETWEEN ?1 AND ?2 ORDER BY call_key"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![first, last], read)?;
            rows.collect::<Result<Vec<_>, _>>()?
        }
        Some(n) => {
            let sql = format!(
                "SELECT {cols} FROM calls WHERE call_key BETWEEN ?1 AND ?2 \
                 ORDER BY call_key DESC LIMIT ?3"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            let rows = stmt.query_map(params![first, last, n], read)?;
            let mut v = rows.collect::<Result<Vec<_>, _>>()?;
            v.reverse();
            v
        }
    };
    let mut messages = None;
    let mut out = Vec::with_capacity(calls.len());
    for (mut call, refs) in calls {
        if let Some(refs) = refs {
            let messages = match &mut messages {
                Some(m) => m,
                None => messages.insert(super::requests::messages_of(conn, seq)?),
            };
            let shell = std::sync::Arc::unwrap_or_clone(call.request);
            call.request = super::requests::rebuild(shell, &refs, messages)?.into();
        }
        out.push(call);
    }
    Ok(out)
}

/// Reads one trajectory (meta + calls) in one read transaction.
pub(crate) fn load_by_seq(
    conn: &Connection,
    seq: i64,
    bodies: Bodies,
) -> Result<Option<Trajectory>, StoreError> {
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let Some(meta) = meta_by_seq(conn, seq)? else {
            return Ok(None);
        };
        let calls = calls_of(conn, seq, &meta.id, None, bodies)?;
        let replays = replays_of(conn, seq)?;
        Ok(Some(Trajectory {
            meta,
            calls,
            replays,
        }))
    })();
    conn.execute_batch("COMMIT")?;
    result
}

/// The stored replay checks of a trajectory.
pub(crate) fn replays_of(conn: &Connection, seq: i64) -> Result<Vec<SampleReplay>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT replays FROM trajectories WHERE seq = ?1")?
        .query_row(params![seq], |r| json_opt_col(r, 0))
        .optional()?
        .flatten()
        .unwrap_or_default())
}

pub(crate) fn load_by_id(
    conn: &Connection,
    id: &str,
    bodies: Bodies,
) -> Result<Option<Trajectory>, StoreError> {
    match meta_by_id(conn, id)? {
        Some((seq, _)) => load_by_seq(conn, seq, bodies),
        None => Ok(None),
    }
}

/// `WHERE` clause shared by listing, counting, scanning and leasing;
/// parameters are `?1` = seq after, then [`filter_params`] as `?2` to `?6`:
/// status code, since, group, complete groups only (0/1), group size (each
/// NULL when unset). A complete group has no active member.
pub(crate) const FILTER_SQL: &str = "seq > ?1 AND (?2 IS NULL OR status = ?2) \
     AND (?3 IS NULL OR updated_at >= ?3) AND (?4 IS NULL OR group_id = ?4) \
     AND (?5 = 0 OR (group_id IS NOT NULL \
       AND NOT EXISTS (SELECT 1 FROM trajectories g \
                       WHERE g.group_id = trajectories.group_id AND g.status = 0) \
       AND (?6 IS NULL OR (SELECT count(*) FROM trajectories g \
                           WHERE g.group_id = trajectories.group_id) >= ?6)))";

pub(crate) type FilterParams = (Option<i64>, Option<i64>, Option<String>, bool, Option<u32>);

pub(crate) fn filter_params(filter: &TrajectoryFilter) -> FilterParams {
    (
        filter.status.map(status_code),
        filter.since,
        filter.group.clone(),
        filter.complete_groups,
        filter.group_size,
    )
}

/// Up to `limit` `(seq, meta)` matching `filter` after `after`, in seq order.
pub(crate) fn page(
    conn: &Connection,
    filter: &TrajectoryFilter,
    after: i64,
    limit: usize,
) -> Result<Vec<(i64, TrajectoryMeta)>, StoreError> {
    let sql =
        format!("SELECT {META_COLS} FROM trajectories WHERE {FILTER_SQL} ORDER BY seq LIMIT ?7");
    let (status, since, group, complete, size) = filter_params(filter);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(
        params![after, status, since, group, complete, size, limit],
        meta_from_row,
    )?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

pub(crate) fn count(conn: &Connection, filter: &TrajectoryFilter) -> Result<u64, StoreError> {
    let sql = format!("SELECT COUNT(*) FROM trajectories WHERE {FILTER_SQL}");
    let (status, since, group, complete, size) = filter_params(filter);
    let n: i64 = conn
        .prepare_cached(&sql)?
        .query_row(params![0i64, status, since, group, complete, size], |r| {
            r.get(0)
        })?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The trajectory id and key of the call holding response id `?1` (a
/// call's key is its trajectory's seq times 2^32 plus its index).
pub(crate) const FIND_RESPONSE_SQL: &str = "SELECT t.id, r.call_key FROM responses r \
     JOIN trajectories t ON t.seq = r.call_key >> 32 \
     WHERE r.response_id = ?1 AND r.call_key IS NOT NULL";

/// The trajectory id and call index of the call holding `response_id`.
pub(crate) fn find_response(
    conn: &Connection,
    response_id: &str,
) -> Result<Option<ResponseRef>, StoreError> {
    let found: Option<(String, i64)> = conn
        .prepare_cached(FIND_RESPONSE_SQL)?
        .query_row(params![response_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    found
        .map(|(trajectory_id, key)| {
            // The low 32 bits of a call key are its call index.
            let call_index = u32::try_from(key & i64::from(u32::MAX))
                .map_err(|_| StoreError::Corrupt(format!("call key {key}")))?;
            Ok(ResponseRef {
                trajectory_id,
                call_index,
            })
        })
        .transpose()
}

/// Every trajectory of a group, in creation order.
pub(crate) fn group(conn: &Connection, group: &str) -> Result<Vec<TrajectoryMeta>, StoreError> {
    let sql = format!("SELECT {META_COLS} FROM trajectories WHERE group_id = ?1 ORDER BY seq");
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params![group], meta_from_row)?;
    Ok(rows
        .map(|r| r.map(|(_, m)| m))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Every registered weight version, ascending by seq.
pub(crate) fn versions(conn: &Connection) -> Result<Vec<VersionRecord>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT seq, label, registered_at FROM weight_versions ORDER BY seq")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?)))?;
    rows.map(|row| {
        let (seq, label, registered_at) = row?;
        let seq = u64::try_from(seq)
            .map_err(|_| StoreError::Corrupt(format!("weight version seq {seq}")))?;
        Ok(VersionRecord {
            seq,
            label,
            registered_at,
        })
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_keys_order_calls_by_trajectory_then_index_and_stop_at_i64() {
        assert_eq!(call_key(0, 0).ok(), Some(0));
        assert_eq!(call_key(1, 0).ok(), Some(1 << 32));
        assert_eq!(call_key(1, u32::MAX).ok(), Some((2 << 32) - 1));
        assert!(call_key(1, u32::MAX).ok() < call_key(2, 0).ok());
        assert_eq!(call_key(MAX_KEYED_SEQ, u32::MAX).ok(), Some(i64::MAX));
        assert!(matches!(
            call_key(MAX_KEYED_SEQ + 1, 0),
            Err(StoreError::Schema(_))
        ));
        assert!(matches!(call_key(-1, 0), Err(StoreError::Schema(_))));
        assert_eq!(call_keys(3), Some((3 << 32, (4 << 32) - 1)));
        assert_eq!(call_keys(MAX_KEYED_SEQ + 1), None);
    }
}
