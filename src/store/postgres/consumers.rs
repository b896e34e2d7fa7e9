//! Export queues of consumer groups on PostgreSQL: the same contract as the
//! SQLite store's (`store::sqlite::consumers`). Replicas each run a writer,
//! so a lease or an ack first takes a transaction-scoped advisory lock on its
//! consumer: two workers of one consumer, on any replicas, never lease the
//! same trajectory.

use super::rows::{FilterParams, FILTER_SQL};
use super::Conn;
use crate::store::types::lease_page;
use crate::store::{new_cursor, Acked, Lease, StoreError, TrajectoryFilter, TrajectoryStatus};

async fn lock_consumer(conn: &mut Conn, consumer: &str) -> Result<(), StoreError> {
    let stmt = conn
        .prep("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
        .await?;
    conn.client.execute(&stmt, &[&consumer]).await?;
    Ok(())
}

pub(crate) async fn lease(
    conn: &mut Conn,
    consumer: &str,
    filter: &TrajectoryFilter,
    limit: usize,
    lease_ms: i64,
    now: i64,
) -> Result<Lease, StoreError> {
    lock_consumer(conn, consumer).await?;
    let mut filter = filter.clone();
    filter.status = Some(TrajectoryStatus::Finished);
    let f = FilterParams::of(&filter);
    // With complete groups a page holds whole groups, so the limit is
    // applied below, not in SQL.
    let sql_limit = if f.complete {
        i64::MAX
    } else {
        i64::try_from(limit).unwrap_or(i64::MAX)
    };
    let sql = format!(
        "SELECT seq, updated_at, id, group_id FROM trajectories WHERE {FILTER_SQL} \
         AND NOT EXISTS (SELECT 1 FROM export_acks a \
                         WHERE a.consumer = $8 AND a.traj = trajectories.seq) \
         AND NOT EXISTS (SELECT 1 FROM export_leases l \
                         WHERE l.consumer = $8 AND l.traj = trajectories.seq \
                         AND l.expires_at > $9) \
         ORDER BY seq LIMIT $7"
    );
    let stmt = conn.prep(&sql).await?;
    let rows = conn
        .client
        .query(
            &stmt,
            &[
                &0i64,
                &f.status,
                &f.since,
                &f.group,
                &f.complete,
                &f.size,
                &sql_limit,
                &consumer,
                &now,
            ],
        )
        .await?;
    let rows = rows
        .iter()
        .map(|r| Ok(((r.try_get(0)?, r.try_get(1)?), r.try_get(2)?, r.try_get(3)?)))
        .collect::<Result<Vec<((i64, i64), String, Option<String>)>, StoreError>>()?;
    let picked = lease_page(rows, limit, f.complete);
    let expires_at = now.saturating_add(lease_ms);
    if picked.is_empty() {
        return Ok(Lease::empty(expires_at));
    }
    let cursor = new_cursor();
    let seqs: Vec<i64> = picked.iter().map(|((seq, _), _)| *seq).collect();
    let stmt = conn
        .prep(
            "INSERT INTO export_leases (consumer, traj, cursor, expires_at) \
             SELECT $1, s, $3, $4 FROM unnest($2::BIGINT[]) AS s \
             ON CONFLICT (consumer, traj) DO UPDATE SET cursor = $3, expires_at = $4",
        )
        .await?;
    conn.client
        .execute(&stmt, &[&consumer, &seqs, &cursor, &expires_at])
        .await?;
    Ok(Lease::of(cursor, picked, expires_at))
}

pub(crate) async fn ack(
    conn: &mut Conn,
    consumer: &str,
    cursor: &str,
    now: i64,
) -> Result<Acked, StoreError> {
    lock_consumer(conn, consumer).await?;
    let moved = conn
        .prep(
            "INSERT INTO export_acks (consumer, traj, cursor, acked_at) \
             SELECT consumer, traj, cursor, $3 FROM export_leases \
             WHERE consumer = $1 AND cursor = $2 ON CONFLICT DO NOTHING",
        )
        .await?;
    let moved = conn
        .client
        .execute(&moved, &[&consumer, &cursor, &now])
        .await?;
    let delete = conn
        .prep("DELETE FROM export_leases WHERE consumer = $1 AND cursor = $2")
        .await?;
    let leased = conn.client.execute(&delete, &[&consumer, &cursor]).await?;
    if leased > 0 {
        return Ok(Acked {
            trajectories: moved,
            already: false,
        });
    }
    let before = conn
        .prep("SELECT 1 FROM export_acks WHERE consumer = $1 AND cursor = $2 LIMIT 1")
        .await?;
    if conn
        .client
        .query_opt(&before, &[&consumer, &cursor])
        .await?
        .is_some()
    {
        Ok(Acked {
            trajectories: 0,
            already: true,
        })
    } else {
        Err(StoreError::CursorNotFound(cursor.to_string()))
    }
}
