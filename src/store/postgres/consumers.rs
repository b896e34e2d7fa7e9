//! Export queues of consumer groups on PostgreSQL: the same contract as the
//! SQLite store's (`store::sqlite::consumers`). Replicas each run a writer,
//! so a lease or an ack first takes a transaction-scoped advisory lock on its
//! consumer: two workers of one consumer, on any replicas, never lease the
//! same trajectory.
//!
//! # The mark across replicas
//!
//! Each consumer has a mark, as in the SQLite store: every finished
//! trajectory at or below it is acknowledged by the consumer, and a lease
//! looks above it. The SQLite store lowers the mark when an older
//! trajectory finishes; here that would make every finish write the marks'
//! rows, so finishing batches of different replicas would wait on each
//! other, and could deadlock with a lease holding its consumer's lock.
//! Instead a finish only stamps the trajectory with the next number of a
//! sequence (`fseq`), and a mark is a pair: `mark`, and `fmark`, the
//! highest `fseq` when the mark was set. The trajectories a mark has not
//! seen are those whose `fseq` is above `fmark`; a lease (and the next ack)
//! starts below the oldest of them ([`start_of`]).
//!
//! With several writers, an ack could read the store before another
//! replica's finish commits and take an `fmark` above that finish's
//! number. So a batch that holds a finish takes an advisory lock in shared
//! mode as it begins ([`MARKS_LOCK`]), before any row or consumer lock, and
//! an ack moves the mark only when it gets the same lock in exclusive mode
//! at once (`pg_try_advisory_xact_lock`): then no finish is in flight on
//! any replica, and every later finish draws a higher number. When a finish
//! is in flight the ack leaves the mark as it was, which stays true; the
//! next ack tries again. An ack never waits for the lock, so it can neither
//! deadlock nor queue finishes behind it (PostgreSQL would make every new
//! shared request wait behind a waiting exclusive one, and one stuck
//! finishing transaction would then stop finishes on every replica).

use super::rows::{status_code, FilterParams, FILTER_SQL};
use super::Conn;
use crate::store::group_commit::{Job, Op};
use crate::store::types::lease_page;
use crate::store::{new_cursor, Acked, Lease, StoreError, TrajectoryFilter, TrajectoryStatus};

/// The advisory lock that keeps marks from passing finishes in flight on
/// other replicas (module doc); any constant every replica agrees on.
pub const MARKS_LOCK: i64 = 0x7469_746f_5f6d_726b; // "tito_mrk"

/// What a batch runs right after `BEGIN`, before anything else: the marks
/// lock in shared mode when the batch holds a finish, or nothing.
pub(crate) fn marks_lock(batch: &[Job]) -> Option<String> {
    batch
        .iter()
        .any(|j| matches!(j.op, Op::Finish { .. }))
        .then(|| format!("SELECT pg_advisory_xact_lock_shared({MARKS_LOCK})"))
}

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
    let mark = start_of(conn, consumer).await?;
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
                         WHERE a.consumer = $8 AND a.traj > $1 AND a.traj = trajectories.seq) \
         AND NOT EXISTS (SELECT 1 FROM export_leases l \
                         WHERE l.consumer = $8 AND l.traj > $1 AND l.traj = trajectories.seq \
                         AND l.expires_at > $9) \
         ORDER BY seq LIMIT $7"
    );
    // Planned with its values each time (see `one_shot`).
    let rows = conn
        .client
        .query(
            sql.as_str(),
            &[
                &mark,
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
    let seqs: Vec<i64> = picked.iter().map(|((seq, _), _)| *seq).collect();
    // An expired lease whose trajectories are leased again is released
    // whole: its cursor becomes unknown, so its worker's ack is refused (it
    // may have trained on a page someone else now holds), not half-counted.
    let stmt = conn
        .prep(
            "DELETE FROM export_leases WHERE consumer = $1 AND cursor IN \
             (SELECT cursor FROM export_leases WHERE consumer = $1 AND traj = ANY($2::BIGINT[]))",
        )
        .await?;
    conn.client.execute(&stmt, &[&consumer, &seqs]).await?;
    let cursor = new_cursor();
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
        advance_mark(conn, consumer).await?;
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

/// Where a lease of `consumer` starts: below its mark, and below every
/// trajectory finished since the mark was set (`fseq` above `fmark`). A
/// consumer without a mark starts at 0. Two statements, so the planner
/// sees `fmark` as a value (an index range) rather than a column of a
/// subquery, which it guessed at and scanned the table for.
async fn start_of(conn: &mut Conn, consumer: &str) -> Result<i64, StoreError> {
    let stmt = conn
        .prep("SELECT mark, fmark FROM export_marks WHERE consumer = $1")
        .await?;
    let Some(row) = conn.client.query_opt(&stmt, &[&consumer]).await? else {
        return Ok(0);
    };
    let (mark, fmark): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    if mark == 0 {
        return Ok(0);
    }
    let late: Option<i64> = conn
        .client
        .query_one(one_shot::LATE, &[&fmark])
        .await?
        .try_get(0)?;
    Ok(late.map_or(mark, |seq| mark.min(seq - 1)))
}

/// After an ack, when the marks lock is free to take in exclusive mode (no
/// finish in flight; otherwise the mark stays): the mark moves to just
/// below the first finished trajectory above the start that the consumer
/// has not acknowledged, or to the last trajectory when there is none;
/// `fmark` to the highest `fseq`.
async fn advance_mark(conn: &mut Conn, consumer: &str) -> Result<(), StoreError> {
    let stmt = conn.prep("SELECT pg_try_advisory_xact_lock($1)").await?;
    let free: bool = conn
        .client
        .query_one(&stmt, &[&MARKS_LOCK])
        .await?
        .try_get(0)?;
    if !free {
        return Ok(());
    }
    let start = start_of(conn, consumer).await?;
    let finished = status_code(TrajectoryStatus::Finished);
    conn.client
        .execute(one_shot::ADVANCE, &[&start, &finished, &consumer])
        .await?;
    Ok(())
}

/// Statements sent as text, prepared for one run with its values and
/// closed after it, not prepared once and cached: after five runs
/// PostgreSQL may keep a generic plan, which cannot see that a range starts
/// at the end of the table: for `LATE` a generic plan walks the whole
/// primary key looking for the smallest `seq`, so a lease would cost time
/// in proportion to the store (docs/benchmarks.md, "A consumer's lease as
/// the store grows", measures it flat). The lease's own query goes the same
/// way. Each costs one more round trip than a cached statement.
mod one_shot {
    /// The oldest trajectory finished since finish number `$1`.
    pub(super) const LATE: &str = "SELECT MIN(seq) FROM trajectories WHERE fseq > $1";

    /// A consumer's new mark above `$1` (see `advance_mark`).
    pub(super) const ADVANCE: &str = "INSERT INTO export_marks (consumer, mark, fmark) \
         SELECT $3, \
           COALESCE( \
             (SELECT seq - 1 FROM trajectories t WHERE seq > $1 AND status = $2 \
              AND NOT EXISTS (SELECT 1 FROM export_acks a \
                              WHERE a.consumer = $3 AND a.traj = t.seq) \
              ORDER BY seq LIMIT 1), \
             (SELECT MAX(seq) FROM trajectories), 0), \
           COALESCE((SELECT MAX(fseq) FROM trajectories), 0) \
         ON CONFLICT (consumer) DO UPDATE SET mark = EXCLUDED.mark, fmark = EXCLUDED.fmark";
}
