//! The writer task of a PostgreSQL store, doing group commit as the SQLite
//! writer does: it waits for a job, drains whatever else is queued (up to
//! [`MAX_BATCH`]), applies the batch in one transaction and commits once
//! before acknowledging any job. Appends are pipelined: every statement of
//! a run of appends is sent before the first answer is read, so a batch
//! costs about one round trip plus its commit, not two per call; a long run
//! of appends goes in with one binary `COPY` ([`super::bulk`]).
//!
//! Several replicas may write one database. The trajectory row is created
//! with `ON CONFLICT DO NOTHING`, a call slot is the primary key
//! `(traj, call_index)`, so two writers can never both store one slot: the
//! second gets [`StoreError::Duplicate`]. Each batch is applied in the
//! writers' one lock order ([`lock_order`]), so two writers' batches that
//! share trajectories wait for each other but never deadlock.

use tokio::sync::mpsc;

pub(super) use super::append::append_pipelined;
use super::rows::{meta_by_id, replays_of, status_code};
use super::settle::{settle, Xact, XACT_SQL};
use super::{consumers, lock_order, Conn};
use crate::store::group_commit::{acknowledge, Done, Job, Op, Outcome, MAX_BATCH, WEIGHT_VERSION};
use crate::store::{
    now_ms, CallRecord, SampleReplay, StoreError, StoredImage, TrajectoryMeta, TrajectoryMetadata,
    TrajectoryStatus,
};

/// Runs of at least this many appends take the bulk path ([`super::bulk`]):
/// a fixed handful of round trips instead of two statements per call.
const BULK_FROM: usize = 8;

/// Runs until every sender is dropped and the queue is drained. A lost
/// connection fails the batch in flight and is opened again for the next.
pub(crate) async fn run(url: String, conn: Conn, mut rx: mpsc::Receiver<Job>) {
    let mut conn = Some(conn);
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
            conn = match Conn::connect(&url).await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(error = %e, "span store: cannot reconnect to postgres");
                    None
                }
            };
        }
        let outcomes = match conn.as_mut() {
            Some(c) => commit_batch(c, &mut batch).await,
            None => batch.iter().map(|_| Err(StoreError::Closed)).collect(),
        };
        acknowledge(&mut batch, outcomes);
    }
}

/// Tries of a batch that PostgreSQL aborted to break a deadlock between
/// replicas (or a serialization failure): the transaction rolled back whole,
/// so running it again is safe.
const TRANSIENT_TRIES: usize = 3;

/// The whole batch in one transaction, first sorted into lock order
/// ([`lock_order`]: the outcomes follow that order); a job that fails sends
/// the batch down [`commit_each`], which isolates it with savepoints.
/// A lost connection fails the batch at once: nothing could isolate a job
/// on it, and the commit's outcome, when it was in doubt, is already
/// settled.
pub(crate) async fn commit_batch(conn: &mut Conn, batch: &mut [Job]) -> Vec<Outcome> {
    lock_order::sort(batch);
    let batch = &*batch;
    for _ in 1..TRANSIENT_TRIES {
        match commit_all(conn, batch).await {
            Ok(outcomes) => return outcomes,
            Err(e) if transient(&e) => retried(conn, &e),
            Err(e) if conn.client.is_closed() => return failed(batch, &e),
            Err(_) => break,
        }
    }
    commit_each(conn, batch).await
}

/// Every job of the batch failed with `e`.
fn failed(batch: &[Job], e: &StoreError) -> Vec<Outcome> {
    let message = match e {
        StoreError::Commit(m) => m.clone(),
        other => other.to_string(),
    };
    batch
        .iter()
        .map(|_| Err(StoreError::Commit(message.clone())))
        .collect()
}

fn retried(conn: &mut Conn, e: &StoreError) {
    conn.transient_retries += 1;
    crate::metrics::store_transient_retry();
    tracing::warn!(error = %e, "span store: transaction rolled back by postgres, running it again");
}

/// A deadlock (40P01) or a serialization failure (40001): PostgreSQL rolled
/// the transaction back and the same work may succeed when run again.
fn transient(e: &StoreError) -> bool {
    matches!(e, StoreError::Postgres(m)
        if m.ends_with("(SQLSTATE 40P01)") || m.ends_with("(SQLSTATE 40001)"))
}

pub(super) async fn commit_all(conn: &mut Conn, batch: &[Job]) -> Result<Vec<Outcome>, StoreError> {
    begin(conn, batch).await?;
    let done = match apply_all(conn, batch, now_ms()).await {
        Ok(outcomes) => commit(conn).await.map(|()| outcomes),
        Err(e) => Err(e),
    };
    if done.is_err() {
        let _ = conn.client.batch_execute("ROLLBACK").await;
    }
    done
}

/// `BEGIN` at READ COMMITTED (whatever the server's default: the row locks
/// below rely on re-reading a row another replica just committed), the
/// marks lock the batch needs (`consumers::marks_lock`), and the
/// transaction's id for [`settle`](super::settle), in one round trip.
/// When the lock fails (a `lock_timeout`, a cancel) the transaction is
/// rolled back here, or it would stay open and aborted and fail every later
/// batch on this connection.
async fn begin(conn: &mut Conn, batch: &[Job]) -> Result<(), StoreError> {
    const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
    let sql = match consumers::marks_lock(batch) {
        Some(lock) => format!("{BEGIN}; {lock}; {XACT_SQL}"),
        None => format!("{BEGIN}; {XACT_SQL}"),
    };
    conn.created = 0;
    match conn.client.simple_query(&sql).await {
        Ok(answer) => {
            conn.xact = Xact::of(&answer);
            Ok(())
        }
        Err(e) => {
            conn.xact = None;
            let _ = conn.client.batch_execute("ROLLBACK").await;
            Err(e.into())
        }
    }
}

/// The advisory lock [`COMMIT_SQL`] takes: "tito_lsq".
const LISTING_LOCK: i64 = 0x7469_746f_5f6c_7371;

/// Commits a transaction that created trajectories: gives them their
/// listing keys (`lseq`, in creation order) under [`LISTING_LOCK`], held
/// until the commit, so every key drawn later belongs to a later commit and
/// a reader paging by `lseq` never skips a trajectory committed late. Only
/// the transaction's own new rows have no key yet (committed ones all do).
static COMMIT_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT pg_advisory_xact_lock({LISTING_LOCK}); \
         UPDATE trajectories t SET lseq = o.n \
         FROM (SELECT s.seq, nextval('trajectories_listing_order') AS n \
               FROM (SELECT seq FROM trajectories WHERE lseq IS NULL ORDER BY seq) s) o \
         WHERE t.seq = o.seq; \
         COMMIT"
    )
});

/// Commits the open transaction (see [`COMMIT_SQL`]). When the connection
/// fails before the server's answer, the outcome is asked for over another
/// connection ([`settle`]): a batch that did commit is reported committed.
pub(super) async fn commit(conn: &mut Conn) -> Result<(), StoreError> {
    let sql = if conn.created > 0 {
        COMMIT_SQL.as_str()
    } else {
        "COMMIT"
    };
    conn.created = 0;
    let xact = conn.xact.take();
    match (conn.client.batch_execute(sql).await, xact) {
        (Ok(()), _) => Ok(()),
        (Err(e), Some(xact)) if in_doubt(&e) || conn.client.is_closed() => {
            settle(&conn.url, &xact, StoreError::from(e).to_string()).await
        }
        (Err(e), _) => Err(e.into()),
    }
}

/// A failed `COMMIT` whose outcome the error does not tell: no answer from
/// the server, or the server's process ending (class 57P: shut down,
/// terminated, crash of another process; class 08: connection failure),
/// which can happen after the commit record was written.
fn in_doubt(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            code.starts_with("57P") || code.starts_with("08")
        }
    }
}

/// Every job in order; the first error fails them all.
async fn apply_all(conn: &mut Conn, batch: &[Job], now: i64) -> Result<Vec<Outcome>, StoreError> {
    let mut out = Vec::with_capacity(batch.len());
    let mut rest = batch;
    while let Some(job) = rest.first() {
        let puts = rest
            .iter()
            .take_while(|j| matches!(j.op, Op::PutImages(_)))
            .count();
        if puts > 0 {
            // One insert for the run, in key order (see `lock_order`).
            let images: Vec<&StoredImage> = rest[..puts]
                .iter()
                .flat_map(|j| match &j.op {
                    Op::PutImages(images) => images.as_slice(),
                    _ => &[],
                })
                .collect();
            super::images::put(conn, &images).await?;
            out.extend((0..puts).map(|_| Ok(Done::Appended)));
            rest = &rest[puts..];
            continue;
        }
        let calls: Vec<&CallRecord> = rest
            .iter()
            .map_while(|j| match &j.op {
                Op::Append(c) => Some(c.as_ref()),
                _ => None,
            })
            .collect();
        if calls.is_empty() {
            out.push(Ok(apply(conn, &job.op, now).await?));
            rest = &rest[1..];
        } else {
            if calls.len() >= BULK_FROM {
                super::bulk::append_many(conn, &calls, now).await?;
            } else {
                for r in append_pipelined(conn, &calls, now).await? {
                    r?;
                }
            }
            out.extend(calls.iter().map(|_| Ok(Done::Appended)));
            rest = &rest[calls.len()..];
        }
    }
    Ok(out)
}

/// Each job under its own savepoint, so one bad record fails alone. When a
/// savepoint itself fails, the transaction is aborted (PostgreSQL would
/// answer `COMMIT` with a rollback): the whole batch fails. A job that lost
/// a deadlock is not failed alone: the locks the jobs before it took would
/// rebuild the same cycle, so the whole transaction is rolled back at once
/// (the jobs after it would each wait out a deadlock of their own) and run
/// again, up to [`TRANSIENT_TRIES`] times; in the last, it fails alone.
/// Between writers the lock order makes that cycle impossible; another
/// client of the database can still close one.
async fn commit_each(conn: &mut Conn, batch: &[Job]) -> Vec<Outcome> {
    let mut tries = 0;
    'tries: loop {
        tries += 1;
        if let Err(e) = begin(conn, batch).await {
            return failed(batch, &e);
        }
        let now = now_ms();
        let mut outcomes = Vec::with_capacity(batch.len());
        for job in batch {
            if let Err(e) = conn.client.batch_execute("SAVEPOINT job").await {
                let _ = conn.client.batch_execute("ROLLBACK").await;
                return failed(batch, &e.into());
            }
            let r = apply(conn, &job.op, now).await;
            let end = if r.is_ok() {
                "RELEASE SAVEPOINT job"
            } else {
                "ROLLBACK TO SAVEPOINT job"
            };
            if let Err(e) = conn.client.batch_execute(end).await {
                let _ = conn.client.batch_execute("ROLLBACK").await;
                return failed(batch, &e.into());
            }
            match r {
                Err(e) if transient(&e) && tries < TRANSIENT_TRIES => {
                    retried(conn, &e);
                    let _ = conn.client.batch_execute("ROLLBACK").await;
                    continue 'tries;
                }
                r => outcomes.push(r),
            }
        }
        return match commit(conn).await {
            Ok(()) => outcomes,
            Err(e) => {
                let _ = conn.client.batch_execute("ROLLBACK").await;
                failed(batch, &e)
            }
        };
    }
}

async fn apply(conn: &mut Conn, op: &Op, now: i64) -> Outcome {
    match op {
        Op::Append(call) => {
            let mut r = append_pipelined(conn, &[call.as_ref()], now).await?;
            r.pop()
                .unwrap_or_else(|| Err(StoreError::Task("append returned nothing".into())))
                .map(|()| Done::Appended)
        }
        Op::PutImages(images) => {
            let images: Vec<&StoredImage> = images.iter().collect();
            super::images::put(conn, &images)
                .await
                .map(|()| Done::Appended)
        }
        Op::Reward {
            trajectory,
            call,
            reward,
            extra,
        } => set_reward(conn, trajectory, *call, *reward, extra.as_ref(), now)
            .await
            .map(|m| Done::Meta(Box::new(m))),
        Op::Metadata { trajectory, update } => set_metadata(conn, trajectory, update, now)
            .await
            .map(|m| Done::Meta(Box::new(m))),
        Op::Replays {
            trajectory,
            replays,
        } => set_replays(conn, trajectory, replays)
            .await
            .map(|()| Done::Appended),
        Op::Lease {
            consumer,
            filter,
            limit,
            lease_ms,
        } => consumers::lease(conn, consumer, filter, *limit, *lease_ms, now)
            .await
            .map(Done::Leased),
        Op::Ack { consumer, cursor } => consumers::ack(conn, consumer, cursor, now)
            .await
            .map(Done::Acked),
        Op::Ping => Ok(Done::Appended),
        Op::WeightVersion(v) => set_state(conn, WEIGHT_VERSION, v, now)
            .await
            .map(|()| Done::Appended),
        Op::RegisterVersion { label } => super::versions::register(conn, label, now)
            .await
            .map(Done::Version),
        Op::Finish { trajectory } => finish(conn, trajectory, now)
            .await
            .map(|m| Done::Meta(Box::new(m))),
        Op::ForgetResponse { response_id, .. } => {
            forget_response(conn, response_id).await.map(Done::Forgot)
        }
        // Several replicas share the database, so no one of them can say
        // which trajectories a crashed queued run left behind; the config
        // refuses `ack = "queued"` with a postgres store.
        Op::BeginRun { queued: false } => Ok(Done::Marked(0)),
        Op::BeginRun { queued: true } => Err(StoreError::Invalid(
            "store.ack = \"queued\" needs a sqlite:// store".into(),
        )),
    }
}

async fn set_state(conn: &mut Conn, key: &str, value: &str, now: i64) -> Result<(), StoreError> {
    let stmt = conn
        .prep(
            "INSERT INTO gateway_state (key, value, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO UPDATE SET value = $2, updated_at = $3",
        )
        .await?;
    conn.client.execute(&stmt, &[&key, &value, &now]).await?;
    Ok(())
}

/// Creates a trajectory unless it exists; returns a row when it created it.
pub(super) const CREATE_SQL: &str =
    "INSERT INTO trajectories (id, status, created_at, updated_at) \
     VALUES ($1, 0, $2, $2) ON CONFLICT (id) DO NOTHING RETURNING seq";

/// Unlinks the response id from its call, keeping the id taken (its
/// `responses` row stays, without a call); whether a call held it. The call
/// keeps its id, for the rebuild of a call that continued it.
const FORGET_SQL: &str = "UPDATE responses SET traj = NULL, call_index = NULL \
     WHERE response_id = $1 AND traj IS NOT NULL";

async fn forget_response(conn: &mut Conn, response_id: &str) -> Result<bool, StoreError> {
    let stmt = conn.prep(FORGET_SQL).await?;
    Ok(conn.client.execute(&stmt, &[&response_id]).await? > 0)
}

async fn existing(conn: &mut Conn, id: &str) -> Result<i64, StoreError> {
    meta_by_id(conn, id)
        .await?
        .map(|(seq, _)| seq)
        .ok_or_else(|| StoreError::NotFound(id.to_string()))
}

/// The trajectory's seq, its row locked until the transaction ends: a
/// read-merge-write (metadata, replay results) must not interleave with
/// another replica's, or one of the two merges is lost.
async fn locked(conn: &mut Conn, id: &str) -> Result<i64, StoreError> {
    let stmt = conn
        .prep("SELECT seq FROM trajectories WHERE id = $1 FOR NO KEY UPDATE")
        .await?;
    match conn.client.query_opt(&stmt, &[&id]).await? {
        Some(row) => Ok(row.try_get(0)?),
        None => Err(StoreError::NotFound(id.to_string())),
    }
}

async fn reread(conn: &mut Conn, id: &str) -> Result<TrajectoryMeta, StoreError> {
    meta_by_id(conn, id)
        .await?
        .map(|(_, m)| m)
        .ok_or_else(|| StoreError::NotFound(id.to_string()))
}

async fn set_metadata(
    conn: &mut Conn,
    id: &str,
    update: &TrajectoryMetadata,
    now: i64,
) -> Result<TrajectoryMeta, StoreError> {
    let create = conn.prep(CREATE_SQL).await?;
    conn.created += conn.client.execute(&create, &[&id, &now]).await?;
    locked(conn, id).await?;
    let (seq, old) = meta_by_id(conn, id)
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    let m = old.metadata.merged(id, update)?;
    let extra = m.extra_info.as_ref().map(serde_json::Value::to_string);
    let stmt = conn
        .prep(
            "UPDATE trajectories SET group_id = $2, data_source = $3, data_index = $4, \
             extra_info = $5, updated_at = GREATEST(updated_at, $6) WHERE seq = $1",
        )
        .await?;
    conn.client
        .execute(
            &stmt,
            &[&seq, &m.group, &m.data_source, &m.index, &extra, &now],
        )
        .await?;
    reread(conn, id).await
}

async fn set_replays(conn: &mut Conn, id: &str, new: &[SampleReplay]) -> Result<(), StoreError> {
    let seq = locked(conn, id).await?;
    let mut all = replays_of(conn, seq).await?;
    all.retain(|old| new.iter().all(|r| !r.same_check(old)));
    all.extend_from_slice(new);
    all.sort_by_key(|r| r.sample);
    let text = serde_json::to_string(&all).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let stmt = conn
        .prep("UPDATE trajectories SET replays = $2 WHERE seq = $1")
        .await?;
    conn.client.execute(&stmt, &[&seq, &text]).await?;
    Ok(())
}

async fn set_reward(
    conn: &mut Conn,
    id: &str,
    call: Option<u32>,
    reward: f64,
    extra: Option<&serde_json::Value>,
    now: i64,
) -> Result<TrajectoryMeta, StoreError> {
    let seq = existing(conn, id).await?;
    match call {
        None => {
            let stmt = conn
                .prep("UPDATE trajectories SET reward = $2 WHERE seq = $1")
                .await?;
            conn.client.execute(&stmt, &[&seq, &reward]).await?;
        }
        Some(idx) => {
            let stmt = conn
                .prep("UPDATE calls SET reward = $3 WHERE traj = $1 AND call_index = $2")
                .await?;
            let n = conn
                .client
                .execute(&stmt, &[&seq, &i64::from(idx), &reward])
                .await?;
            if n == 0 {
                return Err(StoreError::CallNotFound {
                    trajectory: id.to_string(),
                    call: idx,
                });
            }
        }
    }
    if let Some(extra) = extra {
        let stmt = conn
            .prep("UPDATE trajectories SET reward_extra = $2 WHERE seq = $1")
            .await?;
        conn.client
            .execute(&stmt, &[&seq, &extra.to_string()])
            .await?;
    }
    touch(conn, seq, now).await?;
    reread(conn, id).await
}

async fn finish(conn: &mut Conn, id: &str, now: i64) -> Result<TrajectoryMeta, StoreError> {
    let seq = existing(conn, id).await?;
    let finished = status_code(TrajectoryStatus::Finished);
    // `fseq` numbers the finish for the consumers' marks (`consumers`).
    let stmt = conn
        .prep(
            "UPDATE trajectories SET status = $2, fseq = nextval('trajectories_finish_order') \
             WHERE seq = $1 AND status != $2",
        )
        .await?;
    if conn.client.execute(&stmt, &[&seq, &finished]).await? > 0 {
        touch(conn, seq, now).await?;
    }
    reread(conn, id).await
}

async fn touch(conn: &mut Conn, seq: i64, now: i64) -> Result<(), StoreError> {
    let stmt = conn
        .prep("UPDATE trajectories SET updated_at = GREATEST(updated_at, $2) WHERE seq = $1")
        .await?;
    conn.client.execute(&stmt, &[&seq, &now]).await?;
    Ok(())
}
