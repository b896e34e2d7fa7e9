//! Tests of the SQLite writer: a failed COMMIT, a failing job in a batch,
//! a failed append nobody waits for, lingering batches, and checkpoints.

use super::*;
use crate::store::group_commit::Writer;
use crate::store::Ack;
use serde_json::json;
use tokio::sync::oneshot;

/// A WAL frame of the store's 4 KiB pages: its header and its page.
const FRAME_BYTES: u64 = 24 + 4096;

/// The WAL's limit in these tests' writers, in frames.
const WAL_LIMIT_FRAMES: i32 = 16_000;

fn call(traj: &str, index: u32, parent: Option<u32>) -> CallRecord {
    CallRecord {
        trajectory_id: traj.into(),
        call_index: index,
        sample_index: 0,
        parent_call: parent,
        backend: "b".into(),
        started_at: 1,
        finished_at: 2,
        prompt_delta_ids: vec![1, 2],
        sampled_ids: vec![3],
        logprobs: vec![Some(-0.5)],
        finish_reason: "stop".into(),
        request: json!({}).into(),
        response: json!({}).into(),
        drift: None,
        parse_outcome: None,
        moved_from: None,
        weight_version: None,
        tokenizer_sha256: String::new(),
        template_sha256: String::new(),
        reward: None,
        truncated: false,
        normalized: Vec::new(),
        request_of: None,
        api: None,
        response_id: None,
        versions: Vec::new(),
        images: Vec::new(),
        model: None,
        adapter: None,
    }
}

/// A COMMIT that fails leaves nothing open: the dropped transaction rolls
/// back, and the next one begins and commits.
#[test]
fn a_failed_commit_rolls_back_and_the_next_batch_begins() {
    let conn = Connection::open_in_memory().expect("open");
    conn.execute_batch(
        "PRAGMA foreign_keys = ON;
         CREATE TABLE parent (id INTEGER PRIMARY KEY);
         CREATE TABLE child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);",
    )
    .expect("schema");
    let tx = CachedTx::begin(&conn).expect("begin");
    conn.execute("INSERT INTO child (p) VALUES (7)", [])
        .expect("an orphan is allowed until COMMIT");
    assert!(
        tx.commit().is_err(),
        "the deferred foreign key fails the COMMIT"
    );
    assert!(
        conn.is_autocommit(),
        "the failed transaction was rolled back"
    );
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM child", [], |r| r.get(0))
        .expect("count");
    assert_eq!(rows, 0);

    let tx = CachedTx::begin(&conn).expect("begin again");
    conn.execute("INSERT INTO parent (id) VALUES (7)", [])
        .expect("parent");
    conn.execute("INSERT INTO child (p) VALUES (7)", [])
        .expect("child");
    tx.commit().expect("commit");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM child", [], |r| r.get(0))
        .expect("count");
    assert_eq!(rows, 1);
}

/// A bad job in a batch fails alone: the optimistic whole-batch commit
/// rolls back and the savepoint path keeps every good job.
#[test]
fn one_bad_job_fails_alone_and_the_rest_of_the_batch_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn = Connection::open(dir.path().join("s.db")).expect("open");
    super::super::schema::migrate(&mut conn).expect("migrate");
    let ops = [
        call("t", 0, None),
        call("t", 0, None),    // duplicate
        call("t", 1, Some(0)), // continues call 0 of this batch
        call("u", 1, Some(0)), // parent never stored
        call("v", 0, None),
    ];
    let (jobs, _acks): (Vec<Job>, Vec<_>) = ops
        .into_iter()
        .map(|c| {
            let (ack, rx) = oneshot::channel();
            let op = Op::Append(Box::new(c));
            (Job { op, ack: Some(ack) }, rx)
        })
        .unzip();
    let outcomes = commit_batch(&mut conn, &jobs);
    let ok: Vec<bool> = outcomes.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [true, false, true, false, true]);
    assert!(matches!(outcomes[1], Err(StoreError::Duplicate { .. })));
    let stored: i64 = conn
        .query_row("SELECT count(*) FROM calls", [], |r| r.get(0))
        .expect("count");
    assert_eq!(stored, 3);

    // An all-good batch takes the fast path and commits every job.
    let (jobs, _acks): (Vec<Job>, Vec<_>) = (2..6)
        .map(|i| {
            let (ack, rx) = oneshot::channel();
            let op = Op::Append(Box::new(call("t", i, Some(i - 1))));
            (Job { op, ack: Some(ack) }, rx)
        })
        .unzip();
    assert!(commit_all(&mut conn, &jobs).is_some());
    let stored: i64 = conn
        .query_row("SELECT count(*) FROM calls", [], |r| r.get(0))
        .expect("count");
    assert_eq!(stored, 7);
}

/// A queued append carries no receiver, so a failure of it is marked
/// however soon the writer gets to it (its receiver, dropped only once
/// the append was queued, could still be open when the writer failed
/// it); a caller still waiting hears of its failure instead.
#[test]
fn a_failed_append_nobody_waits_for_is_lost() {
    let job = |traj: &str, ack| Job {
        op: Op::Append(Box::new(call(traj, 0, None))),
        ack,
    };
    let (waiting, _rx) = oneshot::channel();
    let (cancelled, gone) = oneshot::channel();
    drop(gone);
    let batch = [
        job("queued", None),
        job("waited", Some(waiting)),
        job("cancelled", Some(cancelled)),
    ];
    let failed = || Err(StoreError::Invalid("refused".into()));
    let lost = lost_appends(&batch, &[failed(), failed(), failed()]);
    assert_eq!(lost, ["queued", "cancelled"]);
}

fn append_job(traj: &str, ack: Option<oneshot::Sender<Outcome>>) -> Job {
    Job {
        op: Op::Append(Box::new(call(traj, 0, None))),
        ack,
    }
}

/// A batch of appends nobody waits for (`ack = "queued"`) waits for more
/// jobs: what arrives while it waits joins it, until a job someone waits
/// for arrives, which ends the wait at once.
#[test]
fn a_queued_batch_gathers_until_a_job_someone_waits_for() {
    let (tx, mut rx) = mpsc::channel(16);
    let mut batch = vec![append_job("a", None)];
    let (waiting, _outcome) = oneshot::channel();
    let mut arrivals = vec![append_job("c", Some(waiting)), append_job("b", None)];
    let mut waits = 0;
    let until = Instant::now() + Duration::from_secs(3600);
    linger_until(&mut rx, &mut batch, until, |_| {
        waits += 1;
        assert!(waits <= 2, "kept waiting after a job someone waits for");
        if let Some(job) = arrivals.pop() {
            tx.try_send(job).map_err(|_| "full").expect("send");
        }
    });
    let trajs: Vec<&str> = batch
        .iter()
        .map(|j| match &j.op {
            Op::Append(c) => c.trajectory_id.as_str(),
            _ => "?",
        })
        .collect();
    assert_eq!(trajs, ["a", "b", "c"]);
    assert_eq!(waits, 2, "the waited-for job ends the wait");

    // A batch with a job someone waits for commits without waiting, and
    // takes nothing more.
    tx.try_send(append_job("d", None))
        .map_err(|_| "full")
        .expect("send");
    let (waiting, _outcome) = oneshot::channel();
    let mut batch = vec![append_job("e", Some(waiting))];
    linger_until(&mut rx, &mut batch, until, |_| panic!("waited"));
    assert_eq!(batch.len(), 1);

    // A full batch commits without waiting.
    let mut batch: Vec<Job> = (0..MAX_BATCH).map(|_| append_job("f", None)).collect();
    linger_until(&mut rx, &mut batch, until, |_| {
        panic!("waited with a full batch")
    });
    assert_eq!(batch.len(), MAX_BATCH);
}

/// The wait ends at its deadline with nothing more arriving, and at once
/// when every sender is gone.
#[test]
fn a_queued_batch_waits_no_longer_than_its_deadline_or_its_senders() {
    let (tx, mut rx) = mpsc::channel::<Job>(16);
    let mut batch = vec![append_job("a", None)];
    let start = Instant::now();
    let mut waits = 0;
    let step = |d: Duration| {
        waits += 1;
        assert!(waits <= 100, "waited past the deadline");
        std::thread::sleep(d);
    };
    linger_until(&mut rx, &mut batch, start + QUEUED_LINGER, step);
    assert!(start.elapsed() >= QUEUED_LINGER);
    assert_eq!(batch.len(), 1);
    drop(tx);
    let far = Instant::now() + Duration::from_secs(3600);
    linger_until(&mut rx, &mut batch, far, |_| {
        panic!("waited on a closed queue")
    });
}

/// The writing connection on a WAL database, as the store opens it with
/// `synchronous = NORMAL`, checkpointed every 1,000 frames and held past
/// [`WAL_LIMIT_FRAMES`].
fn writing(dir: &std::path::Path) -> Writing {
    let mut conn = Connection::open(dir.join("s.db")).expect("open");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .expect("wal");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "synchronous", "NORMAL")
        .expect("sync");
    super::super::schema::migrate(&mut conn).expect("migrate");
    let checkpointer = Checkpointer::start(&dir.join("s.db"), "NORMAL", 1000, WAL_LIMIT_FRAMES)
        .expect("checkpointer");
    Writing::new(conn, checkpointer)
}

fn calls_stored(dir: &std::path::Path) -> i64 {
    let conn = Connection::open(dir.join("s.db")).expect("open");
    conn.query_row("SELECT count(*) FROM calls", [], |r| r.get(0))
        .expect("count")
}

/// Commits no longer checkpoint by themselves (the WAL hook replaces
/// SQLite's automatic checkpoint), so pages reach the database file only
/// through the checkpointer, whether calls commit one a batch or many.
/// Commits back to back may keep its checkpoints from ever copying the
/// whole WAL between two commits, so the WAL may start over only after a
/// commit waited for one; it never holds more than [`WAL_LIMIT_FRAMES`] and
/// the frames of the commits that crossed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_checkpointed_and_the_wal_stays_bounded() {
    // 11 frames a call (the WAL hook's count grows by 11: the call's leaf
    // and 8 overflow pages, the trajectory's row, the database's header),
    // about 8 of them new pages: 3,000 calls write some 33,000 frames, past
    // the WAL's limit of 16,000, and some 24,000 pages.
    let big = |traj: &str, i: u32| CallRecord {
        sampled_ids: vec![7; 4000],
        logprobs: vec![Some(-0.5); 4000],
        ..call(traj, i, i.checked_sub(1))
    };
    for ack in [Ack::Committed, Ack::Queued] {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = writing(dir.path());
        let (tx, rx) = mpsc::channel(1024);
        let mut writer = Writer::new(tx, ack);
        let thread = std::thread::spawn(move || run(w, rx));
        for i in 0..3000 {
            writer.append(big("t", i)).await.expect("append");
        }
        writer.close();
        let kept = thread.join().expect("writer thread");
        kept.checkpointer.run_now();
        assert_eq!(calls_stored(dir.path()), 3000);
        let size = |name: &str| {
            std::fs::metadata(dir.path().join(name))
                .map(|m| m.len())
                .unwrap_or(0)
        };
        // What is past the last checkpoint is under 1,000 frames.
        let db = size("s.db");
        assert!(
            db > 20_000 * 4096,
            "{ack:?}: a database file of {db} bytes after 33,000 frames: no checkpoint ran"
        );
        if ack == Ack::Committed {
            // Past the limit by at most two calls of 11 frames: the one
            // that crossed it is the last before the writer waits for the
            // checkpoint.
            let wal = size("s.db-wal");
            assert!(
                wal <= (WAL_LIMIT_FRAMES as u64 + 2 * 11) * FRAME_BYTES,
                "a WAL of {wal} bytes after 33,000 frames of lone commits"
            );
        }
    }
}

/// The frames in `dir`'s WAL, and the salt that changes when it starts over.
fn wal_frames(dir: &std::path::Path) -> (u64, Vec<u8>) {
    let wal = std::fs::read(dir.join("s.db-wal")).expect("wal");
    ((wal.len() as u64 - 32) / FRAME_BYTES, wal[16..24].to_vec())
}

/// What a root call of a new trajectory writes, in the peers bench's shape
/// (a 190-byte chat body, 37 token ids): a page of each of three B-trees
/// (the call's row, the trajectory's row, the index of trajectory ids) and
/// the pages that leaf splits and the file's growth add. 3.5 frames a call
/// over 200 calls; 4.5 before schema 12, when the index SQLite kept for the
/// calls' primary key (traj, call_index) was a fourth B-tree.
#[tokio::test]
async fn a_root_call_writes_three_b_trees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = writing(dir.path());
    let (tx, rx) = mpsc::channel(16);
    let mut writer = Writer::new(tx, Ack::Committed);
    let thread = std::thread::spawn(move || run(w, rx));
    let root = |n: u64| {
        let user = format!("Write one short sentence about the sea. (request {n})");
        CallRecord {
            backend: "http://127.0.0.1:45773".into(),
            prompt_delta_ids: (0..30).map(|k| 1000 + k).collect(),
            sampled_ids: vec![39_814, 11, 1_588, 498, 728, 13, 151_645],
            logprobs: vec![Some(-0.5); 7],
            request: json!({"model": "test-model", "max_tokens": 64, "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": user}
            ]})
            .into(),
            response: json!({"role": "assistant", "content": "Sure, here you go."}).into(),
            tokenizer_sha256: "a".repeat(64),
            template_sha256: "b".repeat(64),
            ..call(
                &format!("traj-{:012x}{n:016x}", 1_700_000_000_000u64 + n),
                0,
                None,
            )
        }
    };
    for n in 0..10 {
        writer.append(root(n)).await.expect("append");
    }
    let (before, salt) = wal_frames(dir.path());
    let calls = 200;
    for n in 10..10 + calls {
        writer.append(root(n)).await.expect("append");
    }
    let (after, salt_after) = wal_frames(dir.path());
    writer.close();
    thread.join().expect("writer thread");
    assert_eq!(
        salt, salt_after,
        "the WAL started over: frames not all counted"
    );
    let per_call = (after - before) as f64 / calls as f64;
    eprintln!("{per_call:.2} WAL frames a root call over {calls} calls");
    assert!(
        (3.0..4.0).contains(&per_call),
        "{per_call:.2} frames a root call: three B-trees and their splits"
    );
}

/// A batch whose calls record response ids: one that takes an id another
/// call of the batch took fails alone (nothing of it written, not even its
/// new trajectory), and a forgotten id is refused as a taken one.
#[test]
fn a_taken_response_id_fails_its_call_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn = Connection::open(dir.path().join("s.db")).expect("open");
    super::super::schema::migrate(&mut conn).expect("migrate");
    let answered = |traj: &str, index: u32, parent: Option<u32>, id: &str| CallRecord {
        api: Some("responses".into()),
        response_id: Some(id.into()),
        ..call(traj, index, parent)
    };
    let jobs = |ops: Vec<Op>| -> (Vec<Job>, Vec<_>) {
        ops.into_iter()
            .map(|op| {
                let (ack, rx) = oneshot::channel();
                (Job { op, ack: Some(ack) }, rx)
            })
            .unzip()
    };
    let append = |c: CallRecord| Op::Append(Box::new(c));
    let (batch, _acks) = jobs(vec![
        append(answered("t", 0, None, "resp_a")),
        append(answered("u", 0, None, "resp_a")), // taken in this batch
        append(answered("t", 1, Some(0), "resp_b")),
    ]);
    let outcomes = commit_batch(&mut conn, &batch);
    let ok: Vec<bool> = outcomes.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [true, false, true]);
    assert!(
        matches!(&outcomes[1], Err(StoreError::ResponseIdTaken(id)) if id == "resp_a"),
        "{outcomes:?}"
    );
    let count = |conn: &Connection, sql: &str| -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).expect("count")
    };
    assert_eq!(count(&conn, "SELECT count(*) FROM calls"), 2);
    assert_eq!(
        count(&conn, "SELECT count(*) FROM trajectories WHERE id = 'u'"),
        0
    );
    assert_eq!(count(&conn, "SELECT count(*) FROM responses"), 2);

    let forget = |id: &str| Op::ForgetResponse {
        trajectory: "t".into(),
        response_id: id.into(),
    };
    let (batch, _acks) = jobs(vec![
        forget("resp_a"),
        forget("resp_a"),
        append(answered("v", 0, None, "resp_a")),
    ]);
    let outcomes = commit_batch(&mut conn, &batch);
    assert!(
        matches!(outcomes[0], Ok(Done::Forgot(true))),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[1], Ok(Done::Forgot(false))),
        "{outcomes:?}"
    );
    assert!(
        matches!(&outcomes[2], Err(StoreError::ResponseIdTaken(_))),
        "{outcomes:?}"
    );
    // Only the retrieval goes: the call keeps the id it was answered with.
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM responses WHERE call_key IS NOT NULL"
        ),
        1
    );
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM calls WHERE response_id IS NOT NULL"
        ),
        2
    );
    assert_eq!(
        count(&conn, "SELECT count(*) FROM responses"),
        2,
        "the id stays"
    );
}
