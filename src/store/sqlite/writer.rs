//! The writing side of a SQLite store: one connection, owned by the writer
//! thread, which does group commit with it.
//!
//! The thread waits for a job, drains whatever else is queued (up to
//! [`MAX_BATCH`]), applies the whole batch in one transaction, commits once,
//! and only then acknowledges every job. Under load many appends share one
//! commit; idle, a lone append commits at once (no timer, no added latency).
//! The exception is a batch nobody waits for (`[store] ack = "queued"`
//! appends): it gathers for up to [`QUEUED_LINGER`] first (see [`linger`]).
//! Every SQLite call, `write(2)` and `fsync` of a commit runs on this thread,
//! never on one of the async runtime's workers, so a slow disk delays the
//! commits and nothing else.
//!
//! Checkpoints stay off this connection: SQLite's automatic checkpoint
//! (which runs inside the commit that crosses its limit, and `fsync`s) is
//! replaced by the [`Checkpointer`], told the WAL's size after every commit,
//! which checkpoints on a connection of its own while commits go on.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rusqlite::hooks::Wal;
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, ToSql};
use tokio::sync::mpsc;

use super::checkpoint::Checkpointer;
use super::consumers;
use super::rows::{call_key, json_text, meta_by_id, replays_of, status_code};
use crate::store::codec::{ids_to_bytes, images_text, logprobs_to_bytes};
use crate::store::group_commit::{
    acknowledge, lost_appends, Done, Job, Op, Outcome, MAX_BATCH, WEIGHT_VERSION,
};
use crate::store::{
    now_ms, CallRecord, SampleReplay, StoreError, TrajectoryMeta, TrajectoryMetadata,
    TrajectoryStatus,
};

thread_local! {
    /// Frames in the WAL after this thread's last commit, set by the WAL hook
    /// that runs inside the commit (0 when none ran since the last read).
    static WAL_FRAMES: Cell<i32> = const { Cell::new(0) };
}

fn note_wal_frames(_: &Wal, frames: i32) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(frames));
    Ok(())
}

/// The writing connection and what checkpoints its WAL; moved into the
/// writer thread ([`run`]).
pub(crate) struct Writing {
    conn: Connection,
    checkpointer: Checkpointer,
}

impl Writing {
    /// Takes over `conn`: its commits no longer checkpoint by themselves
    /// (a WAL hook replaces SQLite's automatic checkpoint) but ask
    /// `checkpointer`.
    pub(crate) fn new(conn: Connection, checkpointer: Checkpointer) -> Self {
        conn.wal_hook(Some(note_wal_frames));
        // The writing connection caches 35 statements (20 in writer.rs, 11
        // in consumers.rs, two from rows.rs, two in images.rs), more than
        // rusqlite's default of 16 keeps.
        conn.set_prepared_statement_cache_capacity(64);
        Writing { conn, checkpointer }
    }

    /// After a batch committed and was acknowledged: tells the checkpointer
    /// the WAL's size, and when the WAL is past its limit waits for a
    /// checkpoint. Nothing commits meanwhile (this thread is the only
    /// writer; jobs queue), so that checkpoint copies the whole WAL (unless
    /// a reader still needs a part of it) and the next commit starts the WAL
    /// over.
    fn after_commit(&mut self) {
        if self
            .checkpointer
            .after_commit(WAL_FRAMES.with(|f| f.replace(0)))
        {
            self.checkpointer.run_now();
        }
    }
}

/// Runs until every sender is dropped and the queue is drained; a gateway
/// run begun on this writer is then recorded as ended cleanly. Returns the
/// connection and its checkpointer, for the caller to close.
pub(crate) fn run(mut w: Writing, mut rx: mpsc::Receiver<Job>) -> Writing {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    let mut run_begun = false;
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        take_queued(&mut rx, &mut batch);
        linger(&mut rx, &mut batch);
        run_begun |= batch.iter().any(|j| matches!(j.op, Op::BeginRun { .. }));
        let outcomes = commit_batch(&mut w.conn, &batch);
        for id in lost_appends(&batch, &outcomes) {
            let marked = w.conn.execute(
                "UPDATE trajectories SET incomplete = 1 WHERE id = ?1",
                [&id],
            );
            if let Err(e) = marked {
                tracing::error!(trajectory = %id, error = %e, "could not mark the trajectory incomplete");
            }
        }
        acknowledge(&mut batch, outcomes);
        w.after_commit();
    }
    if run_begun {
        if let Err(e) = w
            .conn
            .execute("UPDATE gateway_run SET clean = 1 WHERE id = 1", [])
        {
            tracing::error!(error = %e, "could not record the clean end of this run");
        }
    }
    w
}

/// Adds what is queued to `batch`, up to [`MAX_BATCH`] jobs.
fn take_queued(rx: &mut mpsc::Receiver<Job>, batch: &mut Vec<Job>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
}

/// How long the writer gathers a batch that nobody waits for (`[store] ack
/// = "queued"` appends, whose clients were answered before the commit)
/// before committing it. No answer waits for it; what it costs is the loss
/// window of `queued`, longer by as much (docs/configuration.md states it),
/// and what it buys is that the appends of concurrent calls arriving within
/// it share one commit. A millisecond is short beside the generation each
/// of those calls waited for, so the window stays a small fraction of one
/// call's time.
const QUEUED_LINGER: Duration = Duration::from_millis(1);
/// How often a lingering writer looks at its queue: the longest a job
/// someone waits for (a reward, a finish, a readiness check) that arrives
/// while a batch lingers waits before that batch commits with it (also
/// stated in docs/configuration.md). Four looks a linger.
const LINGER_STEP: Duration = Duration::from_micros(250);

/// While every job of `batch` is one nobody waits for, gathers more for up
/// to [`QUEUED_LINGER`]; a job someone waits for ends the wait.
fn linger(rx: &mut mpsc::Receiver<Job>, batch: &mut Vec<Job>) {
    let until = Instant::now() + QUEUED_LINGER;
    linger_until(rx, batch, until, std::thread::sleep);
}

/// [`linger`] until `until`, waiting with `wait` between looks at the queue.
fn linger_until(
    rx: &mut mpsc::Receiver<Job>,
    batch: &mut Vec<Job>,
    until: Instant,
    mut wait: impl FnMut(Duration),
) {
    let mut seen = 0;
    loop {
        if batch[seen..].iter().any(|j| j.ack.is_some()) || batch.len() >= MAX_BATCH {
            return;
        }
        seen = batch.len();
        let now = Instant::now();
        if now >= until || rx.is_closed() && rx.is_empty() {
            return;
        }
        wait((until - now).min(LINGER_STEP));
        take_queued(rx, batch);
    }
}

/// The whole batch in one transaction, no savepoints; a job that fails sends
/// the batch down [`commit_each`], which isolates it. A savepoint costs two
/// more statements per job, paid on every batch, for a case that is rare
/// (duplicates, finished trajectories, a full disk).
fn commit_batch(conn: &mut Connection, batch: &[Job]) -> Vec<Outcome> {
    match commit_all(conn, batch) {
        Some(outcomes) => outcomes,
        None => commit_each(conn, batch),
    }
}

fn commit_all(conn: &mut Connection, batch: &[Job]) -> Option<Vec<Outcome>> {
    let tx = CachedTx::begin(conn).ok()?;
    let now = now_ms();
    let mut outcomes = Vec::with_capacity(batch.len());
    for job in batch {
        // An error drops `tx`, which rolls every job of the batch back.
        outcomes.push(Ok(apply(tx.conn, &job.op, now).ok()?));
    }
    tx.commit().ok()?;
    Some(outcomes)
}

/// A transaction whose `BEGIN` and `COMMIT` come from the connection's
/// statement cache, where `Connection::transaction` would parse both anew
/// for every batch. Dropped with its transaction still open (not
/// committed, and not already rolled back by SQLite), it rolls back.
struct CachedTx<'c> {
    conn: &'c Connection,
}

impl<'c> CachedTx<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        // Only a failed ROLLBACK leaves one open; without this every later
        // batch would fail until a restart.
        if !conn.is_autocommit() {
            conn.execute_batch("ROLLBACK")?;
        }
        conn.prepare_cached("BEGIN")?.execute([])?;
        Ok(CachedTx { conn })
    }

    fn commit(self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    }
}

impl Drop for CachedTx<'_> {
    fn drop(&mut self) {
        // A failed COMMIT may leave the transaction open (busy, a deferred
        // constraint); SQLite rolls back by itself after some errors.
        if !self.conn.is_autocommit() {
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::error!(error = %e, "could not roll back a failed batch");
            }
        }
    }
}

/// Each job under its own savepoint, so one bad record fails alone.
fn commit_each(conn: &mut Connection, batch: &[Job]) -> Vec<Outcome> {
    let failed = |e: &StoreError| -> Vec<Outcome> {
        batch
            .iter()
            .map(|_| Err(StoreError::Commit(e.to_string())))
            .collect()
    };
    let mut tx = match conn.transaction() {
        Ok(tx) => tx,
        Err(e) => return failed(&e.into()),
    };
    let now = now_ms();
    let mut outcomes = Vec::with_capacity(batch.len());
    for job in batch {
        let outcome = match tx.savepoint() {
            Ok(sp) => {
                let r = apply(&sp, &job.op, now);
                if r.is_ok() {
                    match sp.commit() {
                        Ok(()) => r,
                        Err(e) => Err(e.into()),
                    }
                } else {
                    // Dropping the savepoint rolls this job back (rusqlite's
                    // default drop behaviour for savepoints).
                    drop(sp);
                    r
                }
            }
            Err(e) => Err(e.into()),
        };
        outcomes.push(outcome);
    }
    match tx.commit() {
        Ok(()) => outcomes,
        Err(e) => failed(&e.into()),
    }
}

fn apply(conn: &Connection, op: &Op, now: i64) -> Outcome {
    match op {
        Op::Append(call) => append(conn, call, now).map(|()| Done::Appended),
        Op::PutImages(images) => super::images::put(conn, images).map(|()| Done::Appended),
        Op::Reward {
            trajectory,
            call,
            reward,
            extra,
        } => set_reward(conn, trajectory, *call, *reward, extra.as_ref(), now)
            .map(|m| Done::Meta(Box::new(m))),
        Op::Metadata { trajectory, update } => {
            set_metadata(conn, trajectory, update, now).map(|m| Done::Meta(Box::new(m)))
        }
        Op::Replays {
            trajectory,
            replays,
        } => set_replays(conn, trajectory, replays).map(|()| Done::Appended),
        Op::Lease {
            consumer,
            filter,
            limit,
            lease_ms,
        } => consumers::lease(conn, consumer, filter, *limit, *lease_ms, now).map(Done::Leased),
        Op::Ping => Ok(Done::Appended),
        Op::WeightVersion(v) => set_state(conn, WEIGHT_VERSION, v, now).map(|()| Done::Appended),
        Op::RegisterVersion { label } => register_version(conn, label, now).map(Done::Version),
        Op::Ack { consumer, cursor } => {
            consumers::ack(conn, consumer, cursor, now).map(Done::Acked)
        }
        Op::Finish { trajectory } => finish(conn, trajectory, now).map(|m| Done::Meta(Box::new(m))),
        Op::ForgetResponse { response_id, .. } => {
            forget_response(conn, response_id).map(Done::Forgot)
        }
        Op::BeginRun { queued } => begin_run(conn, *queued, now).map(Done::Marked),
    }
}

fn set_state(conn: &Connection, key: &str, value: &str, now: i64) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO gateway_state (key, value, updated_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT(key) DO UPDATE SET value = ?2, updated_at = ?3",
        params![key, value, now],
    )?;
    Ok(())
}

/// The sequence number of the weight version `label`, numbered (largest so
/// far) + 1 when new. Only this connection writes, so nothing registers a
/// label between the lookup and the insert.
fn register_version(conn: &Connection, label: &str, now: i64) -> Result<u64, StoreError> {
    let found: Option<i64> = conn
        .prepare_cached("SELECT seq FROM weight_versions WHERE label = ?1")?
        .query_row(params![label], |r| r.get(0))
        .optional()?;
    let seq = match found {
        Some(seq) => seq,
        None => conn
            .prepare_cached(
                "INSERT INTO weight_versions (seq, label, registered_at) \
                 SELECT COALESCE(MAX(seq), 0) + 1, ?1, ?2 FROM weight_versions RETURNING seq",
            )?
            .query_row(params![label, now], |r| r.get(0))?,
    };
    u64::try_from(seq).map_err(|_| StoreError::Corrupt(format!("weight version seq {seq}")))
}

/// A call's version spans as the JSON text of its `versions` column; `None`
/// when it has none.
fn versions_text(call: &CallRecord) -> Result<Option<String>, StoreError> {
    if call.versions.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(&call.versions)
        .map(Some)
        .map_err(|e| StoreError::Invalid(e.to_string()))
}

/// Marks the active trajectories of a crashed queued run, then records this run.
fn begin_run(conn: &Connection, queued: bool, now: i64) -> Result<u64, StoreError> {
    let previous: Option<(bool, bool)> = conn
        .query_row(
            "SELECT ack_queued, clean FROM gateway_run WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map(Some)
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            e => Err(e),
        })?;
    let mut marked = 0;
    if previous == Some((true, false)) {
        marked = conn.execute(
            "UPDATE trajectories SET incomplete = 1 WHERE status = ?1",
            params![status_code(TrajectoryStatus::Active)],
        )? as u64;
    }
    conn.execute(
        "INSERT INTO gateway_run (id, ack_queued, clean, started_at) VALUES (1, ?1, 0, ?2) \
         ON CONFLICT(id) DO UPDATE SET ack_queued = ?1, clean = 0, started_at = ?2",
        params![queued, now],
    )?;
    Ok(marked)
}

/// What a call adds to its trajectory's row (all zero for a row that starts
/// without a call).
#[derive(Default)]
struct Added {
    calls: i64,
    next_call: i64,
    next_sample: i64,
    tokens: i64,
    drifts: i64,
}

impl Added {
    fn by(call: &CallRecord) -> Added {
        Added {
            calls: 1,
            next_call: i64::from(call.call_index) + 1,
            next_sample: i64::from(call.sample_index) + 1,
            tokens: (call.prompt_delta_ids.len() + call.sampled_ids.len()) as i64,
            drifts: i64::from(call.drift.is_some()),
        }
    }

    /// The parameters of the statements that write these counts: `?1` the
    /// row's key, `?2` the time, `?3` to `?7` the counts.
    fn bound<'a>(&'a self, key: &'a dyn ToSql, now: &'a i64) -> [&'a dyn ToSql; 7] {
        [
            key,
            now,
            &self.calls,
            &self.next_call,
            &self.next_sample,
            &self.tokens,
            &self.drifts,
        ]
    }
}

/// Inserts an active trajectory, counting what `added` adds, unless one
/// with this id exists; its seq when inserted.
fn create_new(
    conn: &Connection,
    id: &str,
    now: i64,
    added: &Added,
) -> Result<Option<i64>, StoreError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO trajectories (id, status, created_at, updated_at, reward, num_calls, \
             next_call_index, next_sample_index, num_tokens, drift_count) \
             VALUES (?1, 0, ?2, ?2, NULL, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(id) DO NOTHING",
        )?
        .execute(&added.bound(&id, &now)[..])?;
    Ok((inserted == 1).then(|| conn.last_insert_rowid()))
}

/// The seq of a trajectory that calls can still be appended to: `None` when
/// there is none with this id, `Finished` when it is finished.
fn open_slot(conn: &Connection, id: &str) -> Result<Option<i64>, StoreError> {
    let row: Option<(i64, i64)> = conn
        .prepare_cached("SELECT seq, status FROM trajectories WHERE id = ?1")?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match row {
        Some((_, status)) if status == status_code(TrajectoryStatus::Finished) => {
            Err(StoreError::Finished(id.to_string()))
        }
        other => Ok(other.map(|(seq, _)| seq)),
    }
}

fn append(conn: &Connection, call: &CallRecord, now: i64) -> Result<(), StoreError> {
    super::images::check(conn, call)?;
    let id = &call.trajectory_id;
    let added = Added::by(call);
    // A root call usually starts its trajectory: insert the row, already
    // counting this call, and look it up only when it exists.
    let (seq, counted) = match call.parent_call {
        None => match create_new(conn, id, now, &added)? {
            Some(seq) => (seq, true),
            None => (
                open_slot(conn, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?,
                false,
            ),
        },
        Some(_) => (
            open_slot(conn, id)?.ok_or_else(|| missing_parent(call))?,
            false,
        ),
    };
    if let Some(parent) = call.parent_call {
        let exists = conn
            .prepare_cached("SELECT 1 FROM calls WHERE call_key = ?1")?
            .exists(params![call_key(seq, parent)?])?;
        if !exists {
            return Err(missing_parent(call));
        }
    }
    let key = call_key(seq, call.call_index)?;
    let request = super::requests::store(conn, seq, &call.request, call.parent_call.is_some())?;
    let drift = match &call.drift {
        Some(d) => Some(serde_json::to_string(d).map_err(|e| StoreError::Invalid(e.to_string()))?),
        None => None,
    };
    let inserted = conn
        .prepare_cached(
            "INSERT INTO calls (traj, call_index, sample_index, parent_call, backend, started_at, \
             finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
             response, drift, parse_outcome, moved_from, weight_version, tokenizer_sha256, \
             template_sha256, reward, truncated, normalized, request_of, message_refs, \
             call_key, api, response_id, versions, images, model, adapter) VALUES (?1, ?2, ?3, \
             ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, \
             ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31)",
        )?
        .execute(params![
            seq,
            call.call_index,
            call.sample_index,
            call.parent_call,
            call.backend,
            call.started_at,
            call.finished_at,
            ids_to_bytes(&call.prompt_delta_ids),
            ids_to_bytes(&call.sampled_ids),
            logprobs_to_bytes(&call.logprobs),
            call.finish_reason,
            request.text,
            call.response.to_string(),
            drift,
            call.parse_outcome,
            call.moved_from,
            call.weight_version,
            call.tokenizer_sha256,
            call.template_sha256,
            call.reward,
            call.truncated,
            (!call.normalized.is_empty())
                .then(|| serde_json::Value::from(call.normalized.clone()).to_string()),
            call.request_of,
            request.refs,
            key,
            call.api,
            call.response_id,
            versions_text(call)?,
            images_text(&call.images)?,
            call.model,
            call.adapter,
        ]);
    match inserted {
        Ok(_) => {}
        Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == ErrorCode::ConstraintViolation => {
            return Err(StoreError::Duplicate {
                trajectory: id.clone(),
                call: call.call_index,
            })
        }
        Err(e) => return Err(e.into()),
    }
    if let Some(response_id) = &call.response_id {
        take_response_id(conn, response_id, key)?;
    }
    if counted {
        return Ok(());
    }
    conn.prepare_cached(
        "UPDATE trajectories SET updated_at = max(updated_at, ?2), num_calls = num_calls + ?3, \
         next_call_index = max(next_call_index, ?4), \
         next_sample_index = max(next_sample_index, ?5), num_tokens = num_tokens + ?6, \
         drift_count = drift_count + ?7 WHERE seq = ?1",
    )?
    .execute(&added.bound(&seq, &now)[..])?;
    Ok(())
}

/// Records that the call keyed `key` holds `response_id`; an id recorded
/// before (held, or forgotten) is [`StoreError::ResponseIdTaken`].
fn take_response_id(conn: &Connection, response_id: &str, key: i64) -> Result<(), StoreError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO responses (response_id, call_key) VALUES (?1, ?2) \
             ON CONFLICT(response_id) DO NOTHING",
        )?
        .execute(params![response_id, key])?;
    if inserted == 0 {
        return Err(StoreError::ResponseIdTaken(response_id.to_string()));
    }
    Ok(())
}

/// Unlinks `response_id` from its call, so it is no longer found, and keeps
/// the id taken; whether a call held it. The call keeps its id: a later
/// call that continued it by `previous_response_id` is still rebuilt from
/// the store exactly.
fn forget_response(conn: &Connection, response_id: &str) -> Result<bool, StoreError> {
    let unlinked = conn
        .prepare_cached(
            "UPDATE responses SET call_key = NULL WHERE response_id = ?1 AND call_key IS NOT NULL",
        )?
        .execute(params![response_id])?;
    Ok(unlinked > 0)
}

fn existing(conn: &Connection, id: &str) -> Result<i64, StoreError> {
    meta_by_id(conn, id)?
        .map(|(seq, _)| seq)
        .ok_or_else(|| StoreError::NotFound(id.to_string()))
}

fn reread(conn: &Connection, id: &str) -> Result<TrajectoryMeta, StoreError> {
    meta_by_id(conn, id)?
        .map(|(_, m)| m)
        .ok_or_else(|| StoreError::NotFound(id.to_string()))
}

fn set_metadata(
    conn: &Connection,
    id: &str,
    update: &TrajectoryMetadata,
    now: i64,
) -> Result<TrajectoryMeta, StoreError> {
    let (seq, old) = match meta_by_id(conn, id)? {
        Some((seq, meta)) => (seq, meta.metadata),
        None => {
            // Only this connection writes: nothing can have inserted the row
            // since the lookup.
            let seq = create_new(conn, id, now, &Added::default())?
                .ok_or_else(|| StoreError::NotFound(id.into()))?;
            (seq, TrajectoryMetadata::default())
        }
    };
    let m = old.merged(id, update)?;
    conn.prepare_cached(
        "UPDATE trajectories SET group_id = ?2, data_source = ?3, data_index = ?4, \
         extra_info = ?5, updated_at = max(updated_at, ?6) WHERE seq = ?1",
    )?
    .execute(params![
        seq,
        m.group,
        m.data_source,
        m.index,
        json_text(m.extra_info.as_ref()),
        now
    ])?;
    reread(conn, id)
}

fn set_replays(conn: &Connection, id: &str, new: &[SampleReplay]) -> Result<(), StoreError> {
    let seq = existing(conn, id)?;
    let mut all = replays_of(conn, seq)?;
    all.retain(|old| new.iter().all(|r| !r.same_check(old)));
    all.extend_from_slice(new);
    all.sort_by_key(|r| r.sample);
    let text = serde_json::to_string(&all).map_err(|e| StoreError::Invalid(e.to_string()))?;
    conn.prepare_cached("UPDATE trajectories SET replays = ?2 WHERE seq = ?1")?
        .execute(params![seq, text])?;
    Ok(())
}

fn set_reward(
    conn: &Connection,
    id: &str,
    call: Option<u32>,
    reward: f64,
    extra: Option<&serde_json::Value>,
    now: i64,
) -> Result<TrajectoryMeta, StoreError> {
    let seq = existing(conn, id)?;
    match call {
        None => {
            conn.prepare_cached("UPDATE trajectories SET reward = ?2 WHERE seq = ?1")?
                .execute(params![seq, reward])?;
        }
        Some(idx) => {
            let n = conn
                .prepare_cached("UPDATE calls SET reward = ?2 WHERE call_key = ?1")?
                .execute(params![call_key(seq, idx)?, reward])?;
            if n == 0 {
                return Err(StoreError::CallNotFound {
                    trajectory: id.to_string(),
                    call: idx,
                });
            }
        }
    }
    if let Some(extra) = extra {
        conn.prepare_cached("UPDATE trajectories SET reward_extra = ?2 WHERE seq = ?1")?
            .execute(params![seq, extra.to_string()])?;
    }
    touch(conn, seq, now)?;
    reread(conn, id)
}

fn finish(conn: &Connection, id: &str, now: i64) -> Result<TrajectoryMeta, StoreError> {
    let seq = existing(conn, id)?;
    let finished = status_code(TrajectoryStatus::Finished);
    let n = conn
        .prepare_cached("UPDATE trajectories SET status = ?2 WHERE seq = ?1 AND status != ?2")?
        .execute(params![seq, finished])?;
    if n > 0 {
        touch(conn, seq, now)?;
        consumers::finished(conn, seq)?;
    }
    reread(conn, id)
}

fn touch(conn: &Connection, seq: i64, now: i64) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE trajectories SET updated_at = max(updated_at, ?2) WHERE seq = ?1")?
        .execute(params![seq, now])?;
    Ok(())
}

fn missing_parent(call: &CallRecord) -> StoreError {
    StoreError::Invalid(format!(
        "call {} of `{}`: parent {:?} is not stored",
        call.call_index, call.trajectory_id, call.parent_call
    ))
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
