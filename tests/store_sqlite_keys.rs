//! The SQLite store's call keys (schema version 12): a call's row is keyed
//! by `traj * 2^32 + call_index`, the table's rowid, so an append writes one
//! B-tree for the call instead of two. A database written before keeps every
//! field through the rebuild, and the keys keep what the old primary key
//! enforced.

mod store_support;

use store_support::{branching, call, ids, with_missing_logprobs};
use tito::store::sqlite::schema::{self, SCHEMA_VERSION};
use tito::store::{Drift, StoreError, Trajectory};

/// The columns `calls` had at schema version 11 (all but `call_key`).
const V11_CALL_COLS: &str = "traj, call_index, sample_index, parent_call, backend, started_at, \
     finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, response, \
     drift, parse_outcome, moved_from, weight_version, tokenizer_sha256, template_sha256, reward, \
     truncated, normalized, request_of, message_refs";

fn url(path: &std::path::Path) -> String {
    format!("sqlite://{}", path.display())
}

/// Two trajectories written by today's store, with every optional field of
/// a call set somewhere, bodies split into stored messages, a call's reward
/// and a finished trajectory.
async fn write_today(path: &std::path::Path) -> Vec<Trajectory> {
    let store = tito::store::open(&url(path)).expect("open");
    let mut a = with_missing_logprobs("t-a");
    a[2].drift = Some(Drift {
        position: 3,
        cause: "bpe_retokenization".into(),
        details: serde_json::json!({"expected": [1], "actual": [2, 3]}),
    });
    a[3].moved_from = Some("http://127.0.0.1:8002".into());
    a[3].truncated = true;
    a[4].normalized = vec!["merge_system".into()];
    a[5].weight_version = None;
    for c in a.iter().chain(branching("t-b").iter()) {
        store.append_call(c.clone()).await.expect("append");
    }
    store
        .set_reward("t-b", Some(2), 0.75, None)
        .await
        .expect("call reward");
    store.finish("t-a").await.expect("finish");
    let mut out = Vec::new();
    for id in ["t-a", "t-b"] {
        out.push(store.get_trajectory(id).await.expect("get").expect("kept"));
    }
    out
}

/// A database at schema version 11 holding the rows of `today`'s store.
fn copy_to_v11(today: &std::path::Path, old: &std::path::Path) {
    let mut conn = rusqlite::Connection::open(old).expect("open raw");
    assert_eq!(schema::migrate_to(&mut conn, 11).expect("v11"), 11);
    conn.execute("ATTACH DATABASE ?1 AS today", [today.display().to_string()])
        .expect("attach");
    conn.execute_batch(&format!(
        "INSERT INTO trajectories SELECT * FROM today.trajectories;
         INSERT INTO request_messages SELECT * FROM today.request_messages;
         INSERT INTO calls ({V11_CALL_COLS}) SELECT {V11_CALL_COLS} FROM today.calls;"
    ))
    .expect("copy rows");
    let keyed: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE tbl_name = 'calls' AND type = 'index'",
            [],
            |r| r.get(0),
        )
        .expect("indexes");
    assert_eq!(keyed, 1, "version 11 keeps the (traj, call_index) index");
}

#[tokio::test]
async fn a_version_11_database_keeps_every_call_through_the_rekeying() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (today, old) = (dir.path().join("today.db"), dir.path().join("v11.db"));
    let expected = write_today(&today).await;
    copy_to_v11(&today, &old);

    let store = tito::store::open(&url(&old)).expect("open migrates");
    for want in &expected {
        let got = store
            .get_trajectory(&want.meta.id)
            .await
            .expect("get")
            .expect("kept");
        assert_eq!(&got, want);
    }
    let conn = rusqlite::Connection::open(&old).expect("open raw");
    assert_eq!(
        schema::user_version(&conn).expect("version"),
        SCHEMA_VERSION
    );
    let (indexes, off_key): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM sqlite_master WHERE tbl_name = 'calls' \
             AND type = 'index'), \
             (SELECT count(*) FROM calls WHERE call_key != traj * 4294967296 + call_index)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("layout");
    assert_eq!((indexes, off_key), (0, 0), "one B-tree, every row keyed");

    // Appends go on where the old rows end, and the key refuses what the
    // primary key refused.
    let next = call("t-b", 6, 2, Some(5), ids(1300, 2), ids(1400, 3));
    store.append_call(next.clone()).await.expect("append");
    match store.append_call(next.clone()).await {
        Err(StoreError::Duplicate { trajectory, call }) => {
            assert_eq!((trajectory.as_str(), call), ("t-b", 6))
        }
        other => panic!("a second call 6: {other:?}"),
    }
    let orphan = call("t-b", 7, 2, Some(40), ids(1500, 1), ids(1600, 1));
    assert!(
        store.append_call(orphan).await.is_err(),
        "parent 40 missing"
    );
    store
        .set_reward("t-b", Some(6), -1.0, None)
        .await
        .expect("reward of the new call");
    let latest = store.latest_calls("t-b", 2).await.expect("latest");
    let indexes: Vec<u32> = latest.iter().map(|c| c.call_index).collect();
    assert_eq!(indexes, [5, 6]);
    assert_eq!(latest[1].reward, Some(-1.0));
    assert_eq!(latest[1].sampled_ids, next.sampled_ids);
    match store.set_reward("t-b", Some(8), 1.0, None).await {
        Err(StoreError::CallNotFound { call: 8, .. }) => {}
        other => panic!("reward of a call never made: {other:?}"),
    }
}

/// A call of a trajectory whose seq is past what a key can hold is refused
/// with an error naming the limit, and nothing of it is written (not even
/// a new trajectory's row); a trajectory already there still reads back.
#[tokio::test]
async fn a_seq_past_the_key_range_is_refused_not_wrapped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("far.db");
    let store = tito::store::open(&url(&path)).expect("open");
    let limit = i64::MAX >> 32;
    for (seq, id) in [(limit, "last"), (limit + 1, "past")] {
        let conn = rusqlite::Connection::open(&path).expect("open raw");
        conn.execute(
            "INSERT INTO trajectories (seq, id, status, created_at, updated_at, num_calls, \
             next_call_index, next_sample_index) VALUES (?1, ?2, 0, 1, 1, 0, 0, 0)",
            rusqlite::params![seq, id],
        )
        .expect("raw trajectory");
    }
    let last = call("last", 0, 0, None, ids(1, 2), ids(3, 1));
    store.append_call(last.clone()).await.expect("the last key");
    let got = store.get_trajectory("last").await.expect("get");
    assert_eq!(got.expect("kept").calls, [last]);
    match store
        .append_call(call("past", 0, 0, None, ids(1, 2), ids(3, 1)))
        .await
    {
        Err(StoreError::Schema(msg)) => assert!(msg.contains("2^32"), "{msg}"),
        other => panic!("a call keyed past i64: {other:?}"),
    }
    let past = store.get_trajectory("past").await.expect("get");
    assert!(past.expect("row").calls.is_empty());
    // A new trajectory would be numbered past the range too: its first
    // call is refused and its row rolled back with it.
    match store
        .append_call(call("new", 0, 0, None, ids(1, 2), ids(3, 1)))
        .await
    {
        Err(StoreError::Schema(_)) => {}
        other => panic!("a new trajectory's call keyed past i64: {other:?}"),
    }
    assert!(store.get_meta("new").await.expect("meta").is_none());
}
