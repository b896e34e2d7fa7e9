//! A run of appends in a handful of round trips, whatever its length: the
//! writer's fast path under load. Trajectories are created in one
//! statement, checked in one, parents in one, the calls go in with one
//! binary `COPY`, and the trajectory counters are bumped in one `UPDATE`.
//!
//! It refuses (returns an error, and the writer redoes the batch call by
//! call, see [`super::writer`]) whenever a call would be refused on its own:
//! a finished trajectory, a parent that is neither stored nor earlier in the
//! run, a call slot already taken (the `COPY` fails on the primary key). So
//! when it succeeds, the rows are exactly those the call-by-call path would
//! have written.

use std::collections::{HashMap, HashSet};

use futures::pin_mut;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};

use super::writer::AppendParams;
use super::Conn;
use crate::store::{CallRecord, StoreError};

/// The trajectories of `calls`, created if missing, in the order of their
/// first call (creation order is export order).
const CREATE_MANY: &str = "INSERT INTO trajectories (id, status, created_at, updated_at) \
     SELECT u.id, 0, $2, $2 FROM unnest($1::TEXT[]) WITH ORDINALITY AS u(id, n) ORDER BY u.n \
     ON CONFLICT (id) DO NOTHING";

const STATUS_MANY: &str = "SELECT id, seq, status FROM trajectories WHERE id = ANY($1::TEXT[])";

const PARENTS_MANY: &str = "SELECT c.traj, c.call_index FROM calls c \
     JOIN unnest($1::BIGINT[], $2::BIGINT[]) AS p(traj, call_index) \
     ON c.traj = p.traj AND c.call_index = p.call_index";

const COPY_CALLS: &str = "COPY calls (traj, call_index, sample_index, parent_call, backend, \
     started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
     response, drift, parse_outcome, moved_from, weight_version, tokenizer_sha256, \
     template_sha256, reward, truncated, normalized, request_of) FROM STDIN (FORMAT binary)";

const COPY_TYPES: [Type; 23] = [
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
    let mut ids: Vec<&str> = Vec::new();
    let mut seen = HashSet::new();
    for c in calls {
        if seen.insert(c.trajectory_id.as_str()) {
            ids.push(&c.trajectory_id);
        }
    }
    let create = conn.prep(CREATE_MANY).await?;
    let status = conn.prep(STATUS_MANY).await?;
    let (create_args, status_args): ([&(dyn ToSql + Sync); 2], [&(dyn ToSql + Sync); 1]) =
        ([&ids, &now], [&ids]);
    // Pipelined: the server runs them in this order.
    let (created, rows) = futures::join!(
        conn.client.execute(&create, &create_args),
        conn.client.query(&status, &status_args),
    );
    created?;
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
    let mut counts: HashMap<i64, Counts> = HashMap::with_capacity(ids.len());
    for (c, p) in calls.iter().zip(&params) {
        let seq = seq_of(c)?;
        let row: [&(dyn ToSql + Sync); 23] = [
            &seq,
            &p.call_index,
            &p.sample_index,
            &p.parent,
            &p.backend,
            &p.started_at,
            &p.finished_at,
            &p.delta,
            &p.sampled,
            &p.logprobs,
            &p.finish_reason,
            &p.request,
            &p.response,
            &p.drift,
            &p.parse_outcome,
            &p.moved_from,
            &p.weight_version,
            &p.tokenizer_sha256,
            &p.template_sha256,
            &p.reward,
            &p.truncated,
            &p.normalized,
            &p.request_of,
        ];
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
mod tests {
    use tokio::sync::oneshot;

    use super::super::rows::{load, Key};
    use super::super::{schema, writer, Conn};
    use crate::store::group_commit::{Job, Op};
    use crate::store::{CallRecord, StoreError, Trajectory};

    /// A fresh database on the test cluster (`TITO_TEST_POSTGRES`, started by
    /// scripts/test.sh), connected and migrated.
    async fn database() -> Conn {
        let base = std::env::var("TITO_TEST_POSTGRES")
            .unwrap_or_else(|_| panic!("TITO_TEST_POSTGRES is unset: run scripts/test.sh"));
        let admin = Conn::connect(&format!("{base}/postgres"))
            .await
            .expect("connect");
        let name = format!("tito_unit_{:016x}", rand::random::<u64>());
        admin
            .client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        let conn = Conn::connect(&format!("{base}/{name}"))
            .await
            .expect("connect");
        schema::migrate(&conn).await.expect("migrate");
        conn
    }

    fn call(traj: &str, index: u32, parent: Option<u32>) -> CallRecord {
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
            request: serde_json::json!({"messages": [{"role": "user", "content": "x"}]}),
            response: serde_json::json!({"role": "assistant", "content": "y"}),
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
        }
    }

    fn jobs(calls: Vec<CallRecord>) -> Vec<Job> {
        calls
            .into_iter()
            .map(|c| {
                let (ack, _) = oneshot::channel();
                Job {
                    op: Op::Append(Box::new(c)),
                    ack,
                }
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

    #[tokio::test]
    async fn a_run_goes_in_whole_and_stores_what_call_by_call_stores() {
        let mut conn = database().await;
        // 12 appends, chains continuing within the run: the bulk path.
        fn chain(t: &str) -> impl Iterator<Item = CallRecord> + '_ {
            (0..6).map(move |i| call(t, i, i.checked_sub(1)))
        }
        let run: Vec<CallRecord> = chain("bulk").chain(chain("bulk-2")).collect();
        // All of it in the one transaction of the fast path (no fallback).
        let outcomes = writer::commit_all(&mut conn, &jobs(run)).await;
        let outcomes = outcomes.expect("the run commits whole");
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        // The same calls one batch each: the call-by-call path.
        for c in chain("single") {
            let out = writer::commit_batch(&mut conn, &jobs(vec![c])).await;
            assert!(out[0].is_ok(), "{out:?}");
        }
        let bulk = load(&mut conn, Key::Id("bulk"))
            .await
            .expect("load")
            .expect("bulk");
        let single = load(&mut conn, Key::Id("single"))
            .await
            .expect("load")
            .expect("one");
        assert_eq!(bulk.meta.num_calls, 6);
        assert_eq!(bulk.meta.next_call_index, 6);
        assert_eq!(bulk.meta.num_tokens, 30);
        assert_eq!(renamed(bulk), renamed(single));
    }

    #[tokio::test]
    async fn a_refused_call_fails_alone_and_the_rest_of_the_run_commits() {
        let mut conn = database().await;
        let first = writer::commit_batch(&mut conn, &jobs(vec![call("done", 0, None)])).await;
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
        let outcomes = writer::commit_batch(&mut conn, &jobs(run)).await;
        let ok: Vec<bool> = outcomes.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, true, false, false, true, true, true]);
        assert!(matches!(outcomes[1], Err(StoreError::Duplicate { .. })));
        assert!(matches!(outcomes[4], Err(StoreError::Finished(_))));
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
}
