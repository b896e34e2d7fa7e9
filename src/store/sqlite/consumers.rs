//! Export queues of consumer groups: a lease takes a page of finished
//! trajectories the consumer has not acknowledged and that no unexpired lease
//! of the consumer holds; an ack moves a lease's trajectories to the
//! consumer's acknowledged set. Both run on the writer thread, one job at a
//! time, so two workers of one consumer never lease the same trajectory.
//!
//! # The mark
//!
//! Each consumer has a mark (table `export_marks`): every *finished*
//! trajectory with `seq` at or below it is acknowledged by the consumer. A
//! lease looks above the mark only, so a consumer that keeps up pays for
//! the trajectories it has not acknowledged, not for the whole store.
//!
//! - An ack moves the mark up to just below the first finished trajectory
//!   the consumer has not acknowledged (leased or not), or to the store's
//!   last trajectory when there is none. Active trajectories do not hold it
//!   back: one that is never finished costs nothing.
//! - A finish lowers every mark at or above the finished trajectory to just
//!   below it, in the same transaction, so a trajectory that finishes late
//!   is leased like any other.
//! - A consumer without a mark (none acknowledged yet) starts at 0.

use rusqlite::{params, Connection, OptionalExtension};

use super::rows::{filter_params, status_code, FILTER_SQL};
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
    let mark = mark_of(conn, consumer)?;
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
                         WHERE a.consumer = ?8 AND a.traj > ?1 AND a.traj = trajectories.seq) \
         AND NOT EXISTS (SELECT 1 FROM export_leases l \
                         WHERE l.consumer = ?8 AND l.traj > ?1 AND l.traj = trajectories.seq \
                         AND l.expires_at > ?9) \
         ORDER BY seq LIMIT ?7"
    );
    let rows: Vec<((i64, i64), String, Option<String>)> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![mark, status, since, group, complete, size, sql_limit, consumer, now],
            |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?, r.get(3)?)),
        )?
        .collect::<Result<_, _>>()?;
    let picked = lease_page(rows, limit, complete);
    let expires_at = now.saturating_add(lease_ms);
    if picked.is_empty() {
        return Ok(Lease::empty(expires_at));
    }
    // An expired lease whose trajectories are leased again is released
    // whole: its cursor becomes unknown, so its worker's ack is refused (it
    // may have trained on a page someone else now holds), not half-counted.
    let mut release = conn.prepare_cached(
        "DELETE FROM export_leases WHERE consumer = ?1 AND cursor = \
         (SELECT cursor FROM export_leases WHERE consumer = ?1 AND traj = ?2)",
    )?;
    for ((seq, _), _) in &picked {
        release.execute(params![consumer, seq])?;
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
        advance_mark(conn, consumer)?;
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

fn mark_of(conn: &Connection, consumer: &str) -> Result<i64, StoreError> {
    let mark = conn
        .prepare_cached("SELECT mark FROM export_marks WHERE consumer = ?1")?
        .query_row(params![consumer], |r| r.get(0))
        .optional()?;
    Ok(mark.unwrap_or(0))
}

/// After an ack: the mark moves up to just below the first finished
/// trajectory above it that the consumer has not acknowledged, or to the
/// last trajectory when every finished one is acknowledged.
fn advance_mark(conn: &Connection, consumer: &str) -> Result<(), StoreError> {
    let mark = mark_of(conn, consumer)?;
    let first_open: Option<i64> = conn
        .prepare_cached(
            "SELECT seq FROM trajectories t WHERE seq > ?1 AND status = ?2 \
             AND NOT EXISTS (SELECT 1 FROM export_acks a \
                             WHERE a.consumer = ?3 AND a.traj = t.seq) \
             ORDER BY seq LIMIT 1",
        )?
        .query_row(
            params![mark, status_code(TrajectoryStatus::Finished), consumer],
            |r| r.get(0),
        )
        .optional()?;
    let next = match first_open {
        Some(seq) => seq - 1,
        None => conn
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM trajectories")?
            .query_row([], |r| r.get(0))?,
    };
    if next > mark {
        conn.prepare_cached(
            "INSERT INTO export_marks (consumer, mark) VALUES (?1, ?2) \
             ON CONFLICT(consumer) DO UPDATE SET mark = ?2",
        )?
        .execute(params![consumer, next])?;
    }
    Ok(())
}

/// Trajectory `seq` has just finished: no consumer's mark may stay at or
/// above it, or the consumer would never lease it.
pub(crate) fn finished(conn: &Connection, seq: i64) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE export_marks SET mark = ?1 - 1 WHERE mark >= ?1")?
        .execute(params![seq])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_of(statuses: &[TrajectoryStatus]) -> Connection {
        let mut conn = Connection::open_in_memory().expect("open");
        super::super::schema::migrate(&mut conn).expect("migrate");
        for (i, s) in statuses.iter().enumerate() {
            conn.execute(
                "INSERT INTO trajectories (id, status, created_at, updated_at, num_calls, \
                 next_call_index, next_sample_index) VALUES (?1, ?2, 0, 0, 0, 0, 0)",
                params![format!("t{i}"), status_code(*s)],
            )
            .expect("insert");
        }
        conn
    }

    fn lease_all(conn: &Connection) -> Lease {
        let f = TrajectoryFilter::default();
        lease(conn, "c", &f, 100, 60_000, 0).expect("lease")
    }

    /// The mark passes a trajectory that never finishes (an abandoned
    /// agent), so leases do not walk from it again; its finish lowers the
    /// mark below it.
    #[test]
    fn an_active_trajectory_does_not_hold_the_mark_back_and_its_finish_lowers_it() {
        use TrajectoryStatus::{Active, Finished};
        let conn = store_of(&[Finished, Active, Finished, Finished]);
        assert_eq!(mark_of(&conn, "c").expect("mark"), 0);
        let page = lease_all(&conn);
        assert_eq!(page.ids, ["t0", "t2", "t3"]);
        ack(&conn, "c", page.cursor.as_deref().expect("cursor"), 0).expect("ack");
        assert_eq!(mark_of(&conn, "c").expect("mark"), 4, "past the active t1");

        conn.execute(
            "UPDATE trajectories SET status = ?1 WHERE seq = 2",
            params![status_code(Finished)],
        )
        .expect("finish");
        finished(&conn, 2).expect("lower");
        assert_eq!(mark_of(&conn, "c").expect("mark"), 1);
        let page = lease_all(&conn);
        assert_eq!(page.ids, ["t1"]);
        // Acknowledged, the mark is back at the last trajectory.
        ack(&conn, "c", page.cursor.as_deref().expect("cursor"), 0).expect("ack");
        assert_eq!(mark_of(&conn, "c").expect("mark"), 4);
    }

    /// A leased page not yet acknowledged holds the mark below it, whatever
    /// is acknowledged after it.
    #[test]
    fn an_unacknowledged_lease_holds_the_mark_below_it() {
        use TrajectoryStatus::Finished;
        let conn = store_of(&[Finished; 6]);
        let f = TrajectoryFilter::default();
        let held = lease(&conn, "c", &f, 2, 60_000, 0).expect("lease");
        assert_eq!(held.ids, ["t0", "t1"]);
        let next = lease(&conn, "c", &f, 2, 60_000, 0).expect("lease");
        ack(&conn, "c", next.cursor.as_deref().expect("cursor"), 0).expect("ack");
        assert_eq!(mark_of(&conn, "c").expect("mark"), 0);
        ack(&conn, "c", held.cursor.as_deref().expect("cursor"), 0).expect("ack");
        assert_eq!(mark_of(&conn, "c").expect("mark"), 4, "up to t4, unleased");
    }
}
