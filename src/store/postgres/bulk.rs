//! A run of appends in a handful of round trips, whatever its length: the
//! writer's fast path under load. Trajectories are created or locked in
//! one statement (in the writers' lock order, see `super::lock_order`),
//! checked in one, parents in one, the calls go in with one binary `COPY`,
//! and the trajectory counters are bumped in one `UPDATE`.
//!
//! It refuses (returns an error, and the writer redoes the batch call by
//! call, see [`super::writer`]) whenever a call would be refused on its own:
//! an image not stored, a finished trajectory, a parent that is neither
//! stored nor earlier in the run, a call slot already taken (the `COPY` fails on the primary key), a
//! response id taken (the insert into `responses` fails on its key). So
//! when it succeeds, the rows are exactly those the call-by-call path would
//! have written.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::pin_mut;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};

use super::append::AppendParams;
use super::Conn;
use crate::store::{CallRecord, StoreError};

/// Each trajectory of `calls`, in the order of `$1` (id order: see
/// `lock_order`), created when missing or else locked, one row after the
/// other: the step the call-by-call path takes per trajectory (the writer's
/// `CREATE_SQL`, then `APPEND_SQL`'s row lock), in the same order. An
/// existing row is locked by the conflict's `DO UPDATE`, which PostgreSQL
/// locks even where its `WHERE` is false (so no row is written) and, as it
/// sets no key column, `FOR NO KEY UPDATE`: the lock `COUNT_MANY` takes
/// anyway, and which waits for a finish another replica has not committed
/// yet. The count of rows it reports is the count created.
const LOCK_MANY: &str = "INSERT INTO trajectories (id, status, created_at, updated_at) \
     SELECT u.id, 0, $2, $2 FROM unnest($1::TEXT[]) WITH ORDINALITY AS u(id, n) ORDER BY u.n \
     ON CONFLICT (id) DO UPDATE SET updated_at = trajectories.updated_at WHERE false";

/// The rows `LOCK_MANY` created or locked, as they now are.
const STATUS_MANY: &str = "SELECT id, seq, status FROM trajectories WHERE id = ANY($1::TEXT[])";

const PARENTS_MANY: &str = "SELECT c.traj, c.call_index FROM calls c \
     JOIN unnest($1::BIGINT[], $2::BIGINT[]) AS p(traj, call_index) \
     ON c.traj = p.traj AND c.call_index = p.call_index";

const COPY_CALLS: &str = "COPY calls (traj, call_index, sample_index, parent_call, backend, \
     started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
     response, drift, parse_outcome, moved_from, weight_version, tokenizer_sha256, \
     template_sha256, reward, truncated, normalized, request_of, message_refs, api, response_id, \
     versions, images, model, adapter) FROM STDIN (FORMAT binary)";

/// The messages the run's bodies keep apart (see the writer's `APPEND_SQL`).
const MESSAGES_MANY: &str = "INSERT INTO request_messages (traj, sha256, body) \
     SELECT * FROM unnest($1::BIGINT[], $2::BYTEA[], $3::TEXT[]) ON CONFLICT DO NOTHING";

/// The run's response ids (see the writer's `APPEND_SQL`); one taken
/// before fails the statement, and the run goes call by call.
const RESPONSES_MANY: &str = "INSERT INTO responses (response_id, traj, call_index) \
     SELECT * FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[])";

const COPY_TYPES: [Type; 30] = [
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::BYTEA,
    Type::BYTEA,
    Type::BYTEA,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::FLOAT8,
    Type::BOOL,
    Type::TEXT,
    Type::INT8,
    Type::BYTEA,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
];

const COUNT_MANY: &str = "UPDATE trajectories t SET updated_at = GREATEST(t.updated_at, $7), \
     num_calls = t.num_calls + d.n, next_call_index = GREATEST(t.next_call_index, d.next_call), \
     next_sample_index = GREATEST(t.next_sample_index, d.next_sample), \
     num_tokens = t.num_tokens + d.tokens, drift_count = t.drift_count + d.drifted \
     FROM unnest($1::BIGINT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[], \
                 $6::BIGINT[]) AS d(seq, n, next_call, next_sample, tokens, drifted) \
     WHERE t.seq = d.seq";

/// Per trajectory: calls, next call index, next sample index, tokens, drifts.
#[derive(Default)]
struct Counts {
    n: i64,
    next_call: i64,
    next_sample: i64,
    tokens: i64,
    drifted: i64,
}

/// Appends every call of `calls` or none: an error means at least one would
/// be refused on its own (or the database failed), and the caller rolls the
/// transaction back.
pub(super) async fn append_many(
    conn: &mut Conn,
    calls: &[&CallRecord],
    now: i64,
) -> Result<(), StoreError> {
    super::images::check(conn, calls).await?;
    let mut ids: Vec<&str> = calls.iter().map(|c| c.trajectory_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let lock = conn.prep(LOCK_MANY).await?;
    let status = conn.prep(STATUS_MANY).await?;
    let (lock_args, status_args): ([&(dyn ToSql + Sync); 2], [&(dyn ToSql + Sync); 1]) =
        ([&ids, &now], [&ids]);
    // Pipelined: the server runs them in this order.
    let (created, rows) = futures::join!(
        conn.client.execute(&lock, &lock_args),
        conn.client.query(&status, &status_args),
    );
    conn.created += created?;
    let mut seqs: HashMap<String, i64> = HashMap::with_capacity(ids.len());
    for row in rows? {
        let id: String = row.try_get(0)?;
        if row.try_get::<_, i64>(2)? != 0 {
            return Err(StoreError::Finished(id));
        }
        seqs.insert(id, row.try_get(1)?);
    }
    let seq_of = |c: &CallRecord| {
        seqs.get(&c.trajectory_id).copied().ok_or_else(|| {
            StoreError::Task(format!("trajectory `{}` not created", c.trajectory_id))
        })
    };

    // Parents: earlier in this run, else stored.
    let mut in_run: HashSet<(i64, u32)> = HashSet::new();
    let mut stored: Vec<(i64, i64)> = Vec::new();
    for c in calls {
        let seq = seq_of(c)?;
        if let Some(p) = c.parent_call {
            if !in_run.contains(&(seq, p)) {
                stored.push((seq, i64::from(p)));
            }
        }
        in_run.insert((seq, c.call_index));
    }
    if !stored.is_empty() {
        stored.sort_unstable();
        stored.dedup();
        let parents = conn.prep(PARENTS_MANY).await?;
        let (trajs, indexes): (Vec<i64>, Vec<i64>) = stored.iter().copied().unzip();
        let found = conn.client.query(&parents, &[&trajs, &indexes]).await?;
        if found.len() != stored.len() {
            return Err(StoreError::Invalid("a parent call is not stored".into()));
        }
    }

    let params = calls
        .iter()
        .map(|c| AppendParams::of(c, now))
        .collect::<Result<Vec<_>, _>>()?;
    let sink = conn.client.copy_in(COPY_CALLS).await?;
    let writer = BinaryCopyInWriter::new(sink, &COPY_TYPES);
    pin_mut!(writer);
    // `LOCK_MANY` holds every row these counts update.
    let mut counts: BTreeMap<i64, Counts> = BTreeMap::new();
    for (c, p) in calls.iter().zip(&params) {
        let seq = seq_of(c)?;
        let mut row: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(COPY_TYPES.len());
        row.push(&seq);
        row.extend(p.columns());
        writer.as_mut().write(&row).await?;
        let k = counts.entry(seq).or_default();
        k.n += 1;
        k.next_call = k.next_call.max(p.call_index + 1);
        k.next_sample = k.next_sample.max(p.sample_index + 1);
        k.tokens += p.tokens;
        k.drifted += p.drifted;
    }
    // A call slot already taken fails here, on the primary key.
    writer.finish().await?;

    let (mut trajs, mut digests, mut bodies) = (Vec::new(), Vec::new(), Vec::new());
    for (c, p) in calls.iter().zip(&params) {
        let seq = seq_of(c)?;
        for (d, b) in p.message_digests.iter().zip(&p.message_bodies) {
            trajs.push(seq);
            digests.push(d);
            bodies.push(b);
        }
    }
    if !trajs.is_empty() {
        let messages = conn.prep(MESSAGES_MANY).await?;
        conn.client
            .execute(&messages, &[&trajs, &digests, &bodies])
            .await?;
    }

    let (mut responses, mut trajs, mut indexes) = (Vec::new(), Vec::new(), Vec::new());
    for (c, p) in calls.iter().zip(&params) {
        if let Some(id) = &p.response_id {
            responses.push(id);
            trajs.push(seq_of(c)?);
            indexes.push(p.call_index);
        }
    }
    if !responses.is_empty() {
        let insert = conn.prep(RESPONSES_MANY).await?;
        conn.client
            .execute(&insert, &[&responses, &trajs, &indexes])
            .await?;
    }

    let mut cols: [Vec<i64>; 6] = Default::default();
    for (seq, k) in counts {
        for (col, v) in
            cols.iter_mut()
                .zip([seq, k.n, k.next_call, k.next_sample, k.tokens, k.drifted])
        {
            col.push(v);
        }
    }
    let count = conn.prep(COUNT_MANY).await?;
    let [a, b, c, d, e, f] = &cols;
    conn.client
        .execute(&count, &[a, b, c, d, e, f, &now])
        .await?;
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use tokio::sync::oneshot;

    use super::super::rows::{load, Key};
    use super::super::{rows, schema, writer, Conn};
    use super::LOCK_MANY;
    use crate::store::group_commit::{Done, Job, Op};
    use crate::store::{Bodies, CallRecord, ResponseRef, StoreError, Trajectory, TrajectoryFilter};

    /// A fresh database on the test cluster (`TITO_TEST_POSTGRES`, started by
    /// scripts/test.sh), connected and migrated.
    async fn database() -> Conn {
        database_at().await.1
    }

    /// [`database`] and its URL, for a second connection to it.
    pub(crate) async fn database_at() -> (String, Conn) {
        let (url, conn) = super::super::test_database().await;
        schema::migrate(&conn).await.expect("migrate");
        (url, conn)
    }

    pub(crate) fn call(traj: &str, index: u32, parent: Option<u32>) -> CallRecord {
        CallRecord {
            trajectory_id: traj.into(),
            call_index: index,
            sample_index: index % 2,
            parent_call: parent,
            backend: "b".into(),
            started_at: 1,
            finished_at: 2,
            prompt_delta_ids: vec![index, 7, 8],
            sampled_ids: vec![3, index],
            logprobs: vec![Some(-0.5), None],
            finish_reason: "stop".into(),
            request: serde_json::json!({"messages": [{"role": "user", "content": "x"}]}).into(),
            response: serde_json::json!({"role": "assistant", "content": "y"}).into(),
            drift: None,
            parse_outcome: Some("ok".into()),
            moved_from: None,
            weight_version: Some("w".into()),
            tokenizer_sha256: "t".into(),
            template_sha256: "p".into(),
            reward: None,
            truncated: index == 3,
            normalized: vec!["developer_as_system".into()],
            request_of: None,
            api: Some("chat".into()),
            response_id: None,
            images: Vec::new(),
            // Every other call continued on new weights after its first token.
            versions: std::iter::once(0)
                .chain((index % 2 == 1).then_some(1))
                .map(|start| crate::store::VersionSpan {
                    start,
                    version: Some(format!("w{start}")),
                    seq: Some(u64::from(start) + 1),
                })
                .collect(),
            model: None,
            adapter: None,
        }
    }

    pub(crate) fn jobs(calls: Vec<CallRecord>) -> Vec<Job> {
        calls
            .into_iter()
            .map(|c| {
                let (ack, _) = oneshot::channel();
                Job {
                    op: Op::Append(Box::new(c)),
                    ack: Some(ack),
                }
            })
            .collect()
    }

    /// The call slot each append of `batch` writes, in the batch's order.
    fn slots(batch: &[Job]) -> Vec<(String, u32)> {
        batch
            .iter()
            .filter_map(|j| match &j.op {
                Op::Append(c) => Some((c.trajectory_id.clone(), c.call_index)),
                _ => None,
            })
            .collect()
    }

    fn renamed(mut t: Trajectory) -> Trajectory {
        t.meta.id = "x".into();
        for c in &mut t.calls {
            c.trajectory_id = "x".into();
        }
        (t.meta.created_at, t.meta.updated_at) = (0, 0);
        t
    }

    fn drifted(mut c: CallRecord) -> CallRecord {
        c.drift = Some(crate::store::Drift {
            position: 3,
            cause: "bpe_retokenization".into(),
            details: serde_json::json!({"exact_ids": [1, 2]}),
        });
        c
    }

    async fn ids_in_creation_order(conn: &Conn) -> Vec<String> {
        conn.client
            .query("SELECT id FROM trajectories ORDER BY seq", &[])
            .await
            .expect("ids")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    #[tokio::test]
    async fn a_run_goes_in_whole_and_stores_what_call_by_call_stores() {
        let mut conn = database().await;
        // Call 0 of each chain is stored before the run: the run's first
        // calls continue a stored parent, the later ones a parent in the run.
        for t in ["z-bulk", "a-bulk", "single"] {
            let out = writer::commit_batch(&mut conn, &mut jobs(vec![call(t, 0, None)])).await;
            assert!(out[0].is_ok(), "{out:?}");
        }
        fn chain(t: &str) -> impl Iterator<Item = CallRecord> + '_ {
            (1..6).map(move |i| {
                let c = call(t, i, Some(i - 1));
                if i == 2 {
                    drifted(c)
                } else {
                    c
                }
            })
        }
        // New trajectories first seen in this order: "y-new" before "b-new";
        // created in the writers' lock order (by id, see `lock_order`).
        let run: Vec<CallRecord> = chain("z-bulk")
            .chain([call("y-new", 0, None), call("b-new", 0, None)])
            .chain(chain("a-bulk"))
            .collect();
        // All of it in the one transaction of the fast path (no fallback).
        let outcomes = writer::commit_all(&mut conn, &jobs(run)).await;
        let outcomes = outcomes.expect("the run commits whole");
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        // The same calls one batch each: the call-by-call path.
        for c in chain("single") {
            let out = writer::commit_batch(&mut conn, &mut jobs(vec![c])).await;
            assert!(out[0].is_ok(), "{out:?}");
        }
        let single = load(&mut conn, Key::Id("single"), Bodies::Read)
            .await
            .expect("load")
            .expect("one");
        assert_eq!(single.meta.num_calls, 6);
        assert_eq!(single.meta.num_tokens, 30);
        assert_eq!(single.meta.drift_count, 1);
        for t in ["z-bulk", "a-bulk"] {
            let bulk = load(&mut conn, Key::Id(t), Bodies::Read)
                .await
                .expect("load")
                .expect("bulk");
            let spans: Vec<_> = bulk.calls.iter().map(|c| c.versions.clone()).collect();
            let sent: Vec<_> = (0..6).map(|i| call(t, i, None).versions).collect();
            assert_eq!(spans, sent, "{t}");
            assert_eq!(renamed(bulk), renamed(single.clone()), "{t}");
        }
        assert_eq!(
            ids_in_creation_order(&conn).await,
            ["z-bulk", "a-bulk", "single", "b-new", "y-new"]
        );
    }

    #[tokio::test]
    async fn each_refusal_alone_sends_the_run_down_the_call_by_call_path() {
        let mut conn = database().await;
        let stored = [call("done", 0, None), call("kept", 0, None)];
        assert!(writer::commit_batch(&mut conn, &mut jobs(stored.to_vec()))
            .await
            .iter()
            .all(Result::is_ok));
        conn.client
            .batch_execute("UPDATE trajectories SET status = 1 WHERE id = 'done'")
            .await
            .expect("finish");
        type Expected = fn(&StoreError) -> bool;
        let refusals: [(CallRecord, Expected); 4] = [
            (call("done", 1, Some(0)), |e| {
                matches!(e, StoreError::Finished(_))
            }),
            (call("orphan", 1, Some(0)), |e| {
                matches!(e, StoreError::Invalid(_))
            }),
            (call("kept", 0, None), |e| {
                matches!(e, StoreError::Duplicate { .. })
            }),
            (call("late", 2, Some(1)), |e| {
                matches!(e, StoreError::Invalid(_))
            }),
        ];
        for (n, (bad, expected)) in refusals.into_iter().enumerate() {
            let fine = |i: u32| call(&format!("fine-{n}"), i, i.checked_sub(1));
            // Seven good calls around the bad one; "late" names a parent that
            // comes after it in the run.
            let mut run: Vec<CallRecord> = (0..3).map(fine).collect();
            run.push(bad.clone());
            run.extend((3..7).map(fine));
            if bad.trajectory_id == "late" {
                run.push(call("late", 1, None));
            }
            assert!(
                writer::commit_all(&mut conn, &jobs(run.clone()))
                    .await
                    .is_err(),
                "{}: the fast path refuses the run",
                bad.trajectory_id
            );
            // The batch in lock order, each job beside its outcome.
            let mut batch = jobs(run);
            let outcomes = writer::commit_batch(&mut conn, &mut batch).await;
            let failed: Vec<(String, u32)> = slots(&batch)
                .into_iter()
                .zip(&outcomes)
                .filter(|(_, o)| o.is_err())
                .map(|(slot, _)| slot)
                .collect();
            let slot = (bad.trajectory_id.clone(), bad.call_index);
            assert_eq!(failed, [slot], "{}: {outcomes:?}", bad.trajectory_id);
            match outcomes.iter().find(|o| o.is_err()) {
                Some(Err(e)) => assert!(expected(e), "{}: {e}", bad.trajectory_id),
                _ => panic!("{}: stored", bad.trajectory_id),
            }
        }
    }

    #[tokio::test]
    async fn a_refused_call_fails_alone_and_the_rest_of_the_run_commits() {
        let mut conn = database().await;
        let first = writer::commit_batch(&mut conn, &mut jobs(vec![call("done", 0, None)])).await;
        assert!(first[0].is_ok());
        conn.client
            .batch_execute("UPDATE trajectories SET status = 1 WHERE id = 'done'")
            .await
            .expect("finish");
        let run = vec![
            call("t", 0, None),
            call("t", 0, None), // duplicate
            call("t", 1, Some(0)),
            call("u", 1, Some(0)),    // parent never stored
            call("done", 1, Some(0)), // finished trajectory
            call("v", 0, None),
            call("v", 1, Some(0)),
            call("v", 2, Some(1)),
        ];
        let mut batch = jobs(run);
        let outcomes = writer::commit_batch(&mut conn, &mut batch).await;
        // In lock order: by trajectory, each one's calls as they came.
        let ok: Vec<((String, u32), bool)> = slots(&batch)
            .into_iter()
            .zip(outcomes.iter().map(Result::is_ok))
            .collect();
        let slot = |t: &str, i: u32| (t.to_string(), i);
        assert_eq!(
            ok,
            [
                (slot("done", 1), false),
                (slot("t", 0), true),
                (slot("t", 0), false),
                (slot("t", 1), true),
                (slot("u", 1), false),
                (slot("v", 0), true),
                (slot("v", 1), true),
                (slot("v", 2), true),
            ]
        );
        assert!(matches!(outcomes[0], Err(StoreError::Finished(_))));
        assert!(matches!(outcomes[2], Err(StoreError::Duplicate { .. })));
        let stored: i64 = conn
            .client
            .query_one("SELECT count(*) FROM calls", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(stored, 1 + 2 + 3);
        let u = conn
            .client
            .query_opt("SELECT 1 FROM trajectories WHERE id = 'u'", &[])
            .await
            .expect("query");
        assert!(u.is_none(), "a refused first call leaves no trajectory");
    }

    /// A call that records its answer under `id`.
    fn answered(traj: &str, index: u32, parent: Option<u32>, id: &str) -> CallRecord {
        CallRecord {
            api: Some("responses".into()),
            response_id: Some(id.into()),
            ..call(traj, index, parent)
        }
    }

    /// A run whose calls record response ids goes in whole by `COPY`, each
    /// id found; in a run where one call takes an id recorded before (held,
    /// or forgotten) the fast path refuses, and call by call that call
    /// alone fails, with `ResponseIdTaken`.
    #[tokio::test]
    async fn response_ids_go_in_with_a_run_and_a_taken_one_fails_alone() {
        let mut conn = database().await;
        let run: Vec<CallRecord> = (0..10)
            .map(|i| answered("run", i, i.checked_sub(1), &format!("resp_{i}")))
            .collect();
        let outcomes = writer::commit_all(&mut conn, &jobs(run.clone())).await;
        let outcomes = outcomes.expect("the run commits whole");
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        let t = load(&mut conn, Key::Id("run"), Bodies::Read)
            .await
            .expect("load")
            .expect("stored");
        assert_eq!(t.calls, run);
        let found = rows::find_response(&mut conn, "resp_3")
            .await
            .expect("find");
        assert_eq!(
            found,
            Some(ResponseRef {
                trajectory_id: "run".into(),
                call_index: 3
            })
        );
        let forget = Op::ForgetResponse {
            trajectory: "run".into(),
            response_id: "resp_4".into(),
        };
        let out = writer::commit_batch(
            &mut conn,
            &mut [Job {
                op: forget,
                ack: None,
            }],
        )
        .await;
        assert!(matches!(out[0], Ok(Done::Forgot(true))), "{out:?}");

        for taken in ["resp_3", "resp_4"] {
            let mut run: Vec<CallRecord> = (0..10)
                .map(|i| answered(&format!("{taken}-{i}"), 0, None, &format!("{taken}_{i}")))
                .collect();
            run[5].response_id = Some(taken.into());
            assert!(
                writer::commit_all(&mut conn, &jobs(run.clone()))
                    .await
                    .is_err(),
                "{taken}: the fast path refuses the run"
            );
            let mut batch = jobs(run);
            let outcomes = writer::commit_batch(&mut conn, &mut batch).await;
            let failed: Vec<(String, u32)> = slots(&batch)
                .into_iter()
                .zip(&outcomes)
                .filter(|(_, o)| o.is_err())
                .map(|(slot, _)| slot)
                .collect();
            assert_eq!(failed, [(format!("{taken}-5"), 0)], "{outcomes:?}");
            assert!(
                outcomes
                    .iter()
                    .any(|o| matches!(o, Err(StoreError::ResponseIdTaken(id)) if id == taken)),
                "{outcomes:?}"
            );
            let made = conn
                .client
                .query_opt(
                    "SELECT 1 FROM trajectories WHERE id = $1",
                    &[&format!("{taken}-5")],
                )
                .await
                .expect("query");
            assert!(
                made.is_none(),
                "{taken}: the refused call made no trajectory"
            );
        }
        let count = |sql: &'static str| {
            let client = &conn.client;
            async move {
                let n: i64 = client.query_one(sql, &[]).await.expect("count").get(0);
                n
            }
        };
        assert_eq!(
            count("SELECT count(*) FROM responses WHERE traj IS NOT NULL").await,
            9 + 9 + 9,
            "resp_4 forgotten; one call of each later run refused"
        );
        // Forgetting ends the retrieval only: the call keeps its id.
        assert_eq!(
            count("SELECT count(*) FROM calls WHERE response_id IS NOT NULL").await,
            10 + 9 + 9,
        );
    }

    /// Another replica's run holds a trajectory row while this writer
    /// appends the same call slot: the writer waits for the row, then gets
    /// `Duplicate`. With a shared lock that both then upgrade to update the
    /// row, PostgreSQL broke a deadlock here instead (the writer's
    /// transaction rolled back and ran again).
    #[tokio::test]
    async fn racing_another_replica_for_a_slot_is_a_duplicate_not_a_deadlock() {
        let (url, mut other) = database_at().await;
        let mut conn = Conn::connect(&url).await.expect("connect");
        let first = writer::commit_batch(&mut other, &mut jobs(vec![call("slot", 0, None)])).await;
        assert!(first[0].is_ok(), "{first:?}");
        // Both replicas now store call 1.
        let mine = call("slot", 1, Some(0));
        let mut theirs = mine.clone();
        theirs.sampled_ids = vec![4, 4, 4];
        // The other replica's bulk run, up to its row lock.
        other.client.batch_execute("BEGIN").await.expect("begin");
        let ids = vec!["slot"];
        let lock = other.prep(LOCK_MANY).await.expect("prepare");
        other
            .client
            .execute(&lock, &[&ids, &1i64])
            .await
            .expect("lock");
        // This writer's append of the same slot, until it waits on a lock.
        let writer = tokio::spawn(async move {
            let out = writer::commit_batch(&mut conn, &mut jobs(vec![mine])).await;
            (out, conn.transient_retries)
        });
        let probe = Conn::connect(&url).await.expect("connect");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never waited on the other replica's row lock"
            );
            let waiting: i64 = probe
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // The other replica stores the slot and commits.
        let stored = writer::append_pipelined(&mut other, &[&theirs], 2)
            .await
            .expect("the other replica's append is not a deadlock victim");
        assert!(stored.iter().all(Result::is_ok), "{stored:?}");
        writer::commit(&mut other).await.expect("commit");
        let (out, retries) = writer.await.expect("writer task");
        assert!(
            matches!(&out[0], Err(StoreError::Duplicate { call: 1, .. })),
            "{out:?}"
        );
        assert_eq!(
            retries, 0,
            "no transaction was rolled back to break a deadlock"
        );
        let t: Trajectory = load(&mut other, Key::Id("slot"), Bodies::Read)
            .await
            .expect("load")
            .expect("one");
        assert_eq!(t.calls.len(), 2);
        assert_eq!(t.calls[1].sampled_ids, theirs.sampled_ids);
    }

    /// Two replicas: one creates a trajectory and commits late, after the
    /// other created and committed one. A reader that paged past the second
    /// still finds the first on its next page: listing keys are drawn in
    /// commit order, not insert order.
    #[tokio::test]
    async fn a_trajectory_committed_late_is_listed_after_the_cursor() {
        let (url, mut slow) = database_at().await;
        let mut fast = Conn::connect(&url).await.expect("connect");
        let mut reader = Conn::connect(&url).await.expect("connect");
        // The slow replica inserts first (the lower seq) and stays open.
        slow.client.batch_execute("BEGIN").await.expect("begin");
        let stored = writer::append_pipelined(&mut slow, &[&call("slow", 0, None)], 1)
            .await
            .expect("append");
        assert!(stored.iter().all(Result::is_ok), "{stored:?}");
        let out = writer::commit_batch(&mut fast, &mut jobs(vec![call("fast", 0, None)])).await;
        assert!(out[0].is_ok(), "{out:?}");
        let all = TrajectoryFilter::default();
        let page = rows::page(&mut reader, &all, 0, 10).await.expect("page");
        let ids: Vec<&str> = page.iter().map(|(_, m)| m.id.as_str()).collect();
        assert_eq!(ids, ["fast"]);
        let cursor = page[0].0;
        writer::commit(&mut slow).await.expect("commit");
        let next = rows::page(&mut reader, &all, cursor, 10)
            .await
            .expect("page");
        let ids: Vec<&str> = next.iter().map(|(_, m)| m.id.as_str()).collect();
        assert_eq!(ids, ["slow"], "the late commit is after the cursor");
        // A scan by listing key loads it.
        let t = load(&mut reader, Key::Listed(next[0].0), Bodies::Skip)
            .await
            .expect("load")
            .expect("found");
        assert_eq!(t.meta.id, "slow");
    }
}
