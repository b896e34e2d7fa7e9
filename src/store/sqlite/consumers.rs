//! Export queues of consumer groups: a lease takes a page of finished
//! trajectories the consumer has not acknowledged and that no unexpired lease
//! of the consumer holds; an ack moves a lease's trajectories to the
//! consumer's acknowledged set. Both run on the writer thread, one job at a
//! time, so two workers of one consumer never lease the same trajectory.

use rusqlite::{params, Connection};

use super::rows::{filter_params, FILTER_SQL};
use crate::store::types::lease_page;
use crate::store::{new_cursor, Acked, Lease, StoreError, TrajectoryFilter, TrajectoryStatus};

pub(crate) fn lease(
    conn: &Connection,
    consumer: &str,
    filter: &TrajectoryFilter,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> Result<Lease, StoreError> {
    let mut filter = filter.clone();
    filter.status = Some(TrajectoryStatus::Finished);
    let (status, since, group, complete, size) = filter_params(&filter);
    // With complete groups a page holds whole groups, so the limit is
    // applied below, not in SQL.
    let sql_limit = if complete {
        i64::MAX
    } else {
        i64::try_from(limit).unwrap_or(i64::MAX)
    };
    let sql = format!(
        "SELECT seq, updated_at, id, group_id FROM trajectories WHERE {FILTER_SQL} \
         AND NOT EXISTS (SELECT 1 FROM export_acks a \
                         WHERE a.consumer = ?8 AND a.traj = trajectories.seq) \
         AND NOT EXISTS (SELECT 1 FROM export_leases l \
                         WHERE l.consumer = ?8 AND l.traj = trajectories.seq AND l.expires_at > ?9) \
         ORDER BY seq LIMIT ?7"
    );
    let rows: Vec<((i64, i64), String, Option<String>)> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![0i64, status, since, group, complete, size, sql_limit, consumer, now],
            |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?, r.get(3)?)),
        )?
        .collect::<Result<_, _>>()?;
    let picked = lease_page(rows, limit, complete);
    let expires_at = now.saturating_add(lease_ms);
    if picked.is_empty() {
        return Ok(Lease::empty(expires_at));
    }
    let cursor = new_cursor();
    let mut insert = conn.prepare_cached(
        "INSERT INTO export_leases (consumer, traj, cursor, expires_at) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT(consumer, traj) DO UPDATE SET cursor = ?3, expires_at = ?4",
    )?;
    for ((seq, _), _) in &picked {
        insert.execute(params![consumer, seq, cursor, expires_at])?;
    }
    Ok(Lease::of(cursor, picked, expires_at))
}

pub(crate) fn ack(
    conn: &Connection,
    consumer: &str,
    cursor: &str,
    now: i64,
) -> Result<Acked, StoreError> {
    let moved = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO export_acks (consumer, traj, cursor, acked_at) \
             SELECT consumer, traj, cursor, ?3 FROM export_leases \
             WHERE consumer = ?1 AND cursor = ?2",
        )?
        .execute(params![consumer, cursor, now])?;
    let leased = conn
        .prepare_cached("DELETE FROM export_leases WHERE consumer = ?1 AND cursor = ?2")?
        .execute(params![consumer, cursor])?;
    if leased > 0 {
        return Ok(Acked {
            trajectories: moved as u64,
            already: false,
        });
    }
    let before = conn
        .prepare_cached("SELECT 1 FROM export_acks WHERE consumer = ?1 AND cursor = ?2 LIMIT 1")?
        .exists(params![consumer, cursor])?;
    if before {
        Ok(Acked {
            trajectories: 0,
            already: true,
        })
    } else {
        Err(StoreError::CursorNotFound(cursor.to_string()))
    }
}
