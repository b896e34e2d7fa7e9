//! What the store keeps for the Responses and Messages surfaces, on every
//! store (memory, SQLite, PostgreSQL): each call's surface (`api`) and
//! response id round trip through every read; a response is found by its id
//! and forgotten without losing its call; an id is taken once, across
//! trajectories, and a refused call writes nothing; a Responses body's
//! `input` items are kept apart and read back byte for byte; and a SQLite
//! database of the previous schema version reads back with both fields
//! null.

mod store_support;

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};
use store_support::{call, ids};
use tito::error::ApiError;
use tito::store::sqlite::schema::{self, SCHEMA_VERSION};
use tito::store::{
    CallRecord, DynStore, MemoryStore, ResponseRef, StoreError, Trajectory, TrajectoryFilter,
};

fn stores(dir: &tempfile::TempDir) -> Vec<(&'static str, DynStore)> {
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    vec![
        ("memory", Arc::new(MemoryStore::new()) as DynStore),
        ("sqlite", tito::store::open(&url).expect("open sqlite")),
        (
            "postgres",
            tito::store::open(&store_support::postgres_url()).expect("open postgres"),
        ),
    ]
}

/// `c` as it came through `api`, its answer kept as `response_id`.
fn via(mut c: CallRecord, api: Option<&str>, response_id: Option<&str>) -> CallRecord {
    c.api = api.map(str::to_string);
    c.response_id = response_id.map(str::to_string);
    c
}

/// A chain of calls of `traj`, one per surface and one from before the
/// store kept it.
fn surfaces(traj: &str) -> Vec<CallRecord> {
    vec![
        via(
            call(traj, 0, 0, None, ids(1, 4), ids(10, 2)),
            Some("chat"),
            None,
        ),
        via(
            call(traj, 1, 0, Some(0), ids(20, 2), ids(30, 3)),
            Some("responses"),
            Some(&format!("resp_{traj}_1")),
        ),
        via(
            call(traj, 2, 0, Some(1), ids(40, 1), ids(50, 2)),
            Some("messages"),
            None,
        ),
        via(
            call(traj, 3, 1, None, ids(60, 3), ids(70, 1)),
            Some("completions"),
            None,
        ),
        via(call(traj, 4, 2, None, ids(80, 2), ids(90, 2)), None, None),
        via(
            call(traj, 5, 0, Some(2), ids(95, 1), ids(96, 2)),
            Some("responses"),
            Some(&format!("resp_{traj}_5")),
        ),
    ]
}

/// The calls of the trajectories a scan gave, by trajectory.
fn scanned(iter: tito::store::TrajectoryIter) -> Vec<Trajectory> {
    iter.collect::<Result<Vec<_>, _>>().expect("scan")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_and_response_id_come_back_from_every_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let calls = surfaces("t");
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let t = store.get_trajectory("t").await.expect("get").expect("kept");
        assert_eq!(t.calls, calls, "{name}");
        let latest = store.latest_calls("t", 2).await.expect("latest");
        assert_eq!(latest, calls[4..].to_vec(), "{name}");
        let bodiless: Vec<CallRecord> = calls.iter().map(CallRecord::without_bodies).collect();
        let blocking = store.clone();
        let (by_filter, by_ids) = tokio::task::spawn_blocking(move || {
            let all = TrajectoryFilter::default();
            (
                scanned(blocking.scan(&all).expect("scan")),
                scanned(blocking.scan_ids(vec!["t".into()]).expect("scan ids")),
            )
        })
        .await
        .expect("scan task");
        for got in [&by_filter, &by_ids] {
            assert_eq!(got.len(), 1, "{name}");
            assert_eq!(got[0].calls, bodiless, "{name}: the export's rows");
        }
        // The trajectory as `GET /v1/trajectories/{id}` shows its calls:
        // both fields on every call, null where not kept.
        let shown = serde_json::to_value(&t.calls).expect("json");
        assert_eq!(shown[0]["api"], "chat", "{name}");
        assert_eq!(shown[0]["response_id"], Value::Null, "{name}");
        assert_eq!(shown[1]["response_id"], "resp_t_1", "{name}");
        assert_eq!(shown[4]["api"], Value::Null, "{name}");
    }
}

#[test]
fn a_call_recorded_before_the_fields_existed_reads_with_both_null() {
    let mut old = serde_json::to_value(call("t", 0, 0, None, ids(1, 2), ids(3, 1))).expect("json");
    let map = old.as_object_mut().expect("object");
    map.remove("api");
    map.remove("response_id");
    let read: CallRecord = serde_json::from_value(old).expect("an old record reads");
    assert_eq!((read.api, read.response_id), (None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_is_found_by_its_id_and_forgotten_without_its_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let calls = surfaces("t");
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let found = store.find_response("resp_t_1").await.expect("find");
        assert_eq!(
            found,
            Some(ResponseRef {
                trajectory_id: "t".into(),
                call_index: 1
            }),
            "{name}"
        );
        assert_eq!(
            store.find_response("resp_t_5").await.expect("find"),
            Some(ResponseRef {
                trajectory_id: "t".into(),
                call_index: 5
            }),
            "{name}"
        );
        for unknown in ["resp_none", "resp_t_", "RESP_T_1"] {
            assert_eq!(
                store.find_response(unknown).await.expect("find"),
                None,
                "{name}: {unknown}"
            );
        }

        assert!(
            store.forget_response("resp_t_1").await.expect("forget"),
            "{name}"
        );
        assert_eq!(
            store.find_response("resp_t_1").await.expect("find"),
            None,
            "{name}: forgotten"
        );
        assert!(
            !store.forget_response("resp_t_1").await.expect("again"),
            "{name}: forgetting twice forgets nothing"
        );
        assert!(
            !store.forget_response("resp_none").await.expect("unknown"),
            "{name}: an unknown id"
        );
        // The call keeps everything, its id included (a later call that
        // continued it is rebuilt by it); the other response stays.
        let t = store.get_trajectory("t").await.expect("get").expect("kept");
        assert_eq!(t.calls, calls, "{name}");
        assert_eq!(t.meta.num_calls, 6, "{name}");
        assert!(
            store
                .find_response("resp_t_5")
                .await
                .expect("find")
                .is_some(),
            "{name}"
        );

        // A forgotten id stays taken: no later call records it.
        let reuse = via(
            call("u", 0, 0, None, ids(1, 2), ids(3, 1)),
            Some("responses"),
            Some("resp_t_1"),
        );
        match store.append_call(reuse).await {
            Err(StoreError::ResponseIdTaken(id)) => assert_eq!(id, "resp_t_1", "{name}"),
            other => panic!("{name}: a forgotten id recorded again: {other:?}"),
        }
        assert!(store.get_meta("u").await.expect("meta").is_none(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_response_id_is_refused_in_any_trajectory_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let first = via(
            call("a", 0, 0, None, ids(1, 3), ids(10, 2)),
            Some("responses"),
            Some("resp_x"),
        );
        store.append_call(first.clone()).await.expect("first");
        let before = store.get_trajectory("a").await.expect("get");

        // A new trajectory's first call: refused, and no trajectory made.
        let other = via(
            call("b", 0, 0, None, ids(1, 3), ids(10, 2)),
            Some("responses"),
            Some("resp_x"),
        );
        let refused = store.append_call(other).await;
        match &refused {
            Err(StoreError::ResponseIdTaken(id)) => assert_eq!(id, "resp_x", "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        assert!(store.get_meta("b").await.expect("meta").is_none(), "{name}");
        if let Err(e) = refused {
            let api = ApiError::from(e);
            assert_eq!(api.status, StatusCode::CONFLICT, "{name}");
        }

        // A continuing call of the same trajectory, its messages split:
        // refused, and its trajectory as it was.
        let mut next = via(
            call("a", 1, 0, Some(0), ids(20, 2), ids(30, 2)),
            Some("responses"),
            Some("resp_x"),
        );
        next.request = json!({"model": "m", "input": [
            {"type": "message", "role": "user", "content": "one"},
            {"type": "message", "role": "user", "content": "two"}
        ]})
        .into();
        assert!(
            matches!(
                store.append_call(next.clone()).await,
                Err(StoreError::ResponseIdTaken(_))
            ),
            "{name}"
        );
        assert_eq!(
            store.get_trajectory("a").await.expect("get"),
            before,
            "{name}"
        );
        // The same call under a free id goes in and reads back whole.
        next.response_id = Some("resp_y".into());
        store.append_call(next.clone()).await.expect("a free id");
        let t = store.get_trajectory("a").await.expect("get").expect("kept");
        assert_eq!(t.calls, [first, next], "{name}");
        assert_eq!(t.meta.num_calls, 2, "{name}");
    }
}

#[tokio::test]
async fn response_ids_and_apis_are_validated() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let long = "r".repeat(129);
        for bad in ["", "resp x", "resp/1", "résp", long.as_str()] {
            let c = via(
                call("t", 0, 0, None, ids(1, 2), ids(3, 1)),
                Some("responses"),
                Some(bad),
            );
            assert!(
                matches!(store.append_call(c).await, Err(StoreError::Invalid(_))),
                "{name}: `{bad}`"
            );
        }
        for bad in ["", "Chat", "embeddings"] {
            let c = via(call("t", 0, 0, None, ids(1, 2), ids(3, 1)), Some(bad), None);
            assert!(
                matches!(store.append_call(c).await, Err(StoreError::Invalid(_))),
                "{name}: api `{bad}`"
            );
        }
        assert!(store.get_meta("t").await.expect("meta").is_none(), "{name}");
        let longest = "a-Z_9".repeat(25) + "xyz";
        assert_eq!(longest.len(), 128);
        let c = via(
            call("t", 0, 0, None, ids(1, 2), ids(3, 1)),
            Some("responses"),
            Some(&longest),
        );
        store.append_call(c).await.expect("128 characters");
        assert!(
            store.find_response(&longest).await.expect("find").is_some(),
            "{name}"
        );
    }
}

/// A Responses agent replays its history as `input` items: a continuing
/// call's body reads back byte for byte (keys in order), and the durable
/// stores keep each distinct item of the trajectory once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_items_are_kept_once_and_bodies_read_back_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let item = |k: u32| -> Value {
        match k % 3 {
            0 => json!({"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": format!("turn {k}")}]}),
            1 => json!({"type": "function_call", "call_id": format!("call_{k}"),
                        "name": "lookup", "arguments": format!("{{\"q\":{k}}}")}),
            _ => json!({"type": "function_call_output", "call_id": format!("call_{}", k - 1),
                        "output": "ok"}),
        }
    };
    for (name, store) in stores(&dir) {
        let mut calls = Vec::new();
        for i in 0..6u32 {
            let history: Vec<Value> = (0..=2 * i).map(item).collect();
            let mut c = via(
                call(
                    "r",
                    i,
                    0,
                    i.checked_sub(1),
                    ids(100 * i, 2),
                    ids(100 * i + 50, 2),
                ),
                Some("responses"),
                Some(&format!("resp_{i}")),
            );
            // `input` between other keys, whose order must hold.
            let text = format!(
                r#"{{"model":"m","instructions":"be brief","input":{},"store":true,"tools":[{{"type":"function","name":"lookup"}}]}}"#,
                Value::Array(history)
            );
            c.request = Arc::new(serde_json::from_str(&text).expect("body"));
            calls.push((c, text));
        }
        for (c, _) in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let t = store.get_trajectory("r").await.expect("get").expect("kept");
        for ((want, text), got) in calls.iter().zip(&t.calls) {
            assert_eq!(
                got.request.to_string(),
                *text,
                "{name}: call {}",
                want.call_index
            );
        }
        let latest = store.latest_calls("r", 1).await.expect("latest");
        assert_eq!(latest[0].request.to_string(), calls[5].1, "{name}");
    }
    // Items 0..=10, each once, from the five continuing calls (the root's
    // body is kept whole).
    let conn = rusqlite::Connection::open(dir.path().join("spans.db")).expect("open raw");
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM request_messages", [], |r| r.get(0))
        .expect("count");
    assert_eq!(kept, 11);
}

/// The columns `calls` had at schema version 12.
const V12_CALL_COLS: &str = "call_key, traj, call_index, sample_index, parent_call, backend, \
     started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
     response, drift, parse_outcome, moved_from, weight_version, tokenizer_sha256, \
     template_sha256, reward, truncated, normalized, request_of, message_refs";

/// A database at schema version 12 keeps its calls through the migration
/// that adds `api` and `response_id`: both read back null, and new calls
/// record them.
#[tokio::test]
async fn a_version_12_database_reads_back_with_api_and_response_id_null() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (today, old) = (dir.path().join("today.db"), dir.path().join("v12.db"));
    let url = |p: &std::path::Path| format!("sqlite://{}", p.display());
    let mut expected = Vec::new();
    {
        let store = tito::store::open(&url(&today)).expect("open");
        for c in surfaces("t-a") {
            store.append_call(c).await.expect("append");
        }
        store.finish("t-a").await.expect("finish");
        let mut t = store
            .get_trajectory("t-a")
            .await
            .expect("get")
            .expect("kept");
        // What a version 12 database could hold: neither field.
        for c in &mut t.calls {
            (c.api, c.response_id) = (None, None);
        }
        expected.push(t);
    }
    {
        let mut conn = rusqlite::Connection::open(&old).expect("open raw");
        assert_eq!(schema::migrate_to(&mut conn, 12).expect("v12"), 12);
        conn.execute("ATTACH DATABASE ?1 AS today", [today.display().to_string()])
            .expect("attach");
        conn.execute_batch(&format!(
            "INSERT INTO trajectories SELECT * FROM today.trajectories;
             INSERT INTO request_messages SELECT * FROM today.request_messages;
             INSERT INTO calls ({V12_CALL_COLS}) SELECT {V12_CALL_COLS} FROM today.calls;"
        ))
        .expect("copy rows");
    }
    let store = tito::store::open(&url(&old)).expect("open migrates");
    let got = store.get_trajectory("t-a").await.expect("get");
    assert_eq!(got.as_ref(), expected.first(), "old rows, both fields null");
    assert_eq!(
        store.find_response("resp_t-a_1").await.expect("find"),
        None,
        "no old row holds a response id"
    );
    let conn = rusqlite::Connection::open(&old).expect("open raw");
    assert_eq!(
        schema::user_version(&conn).expect("version"),
        SCHEMA_VERSION
    );
    let nulls: i64 = conn
        .query_row(
            "SELECT count(*) FROM calls WHERE api IS NULL AND response_id IS NULL",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(nulls, 6);
    // New calls record both, and their ids are found.
    let new = via(
        call("t-new", 0, 0, None, ids(1, 2), ids(3, 1)),
        Some("responses"),
        Some("resp_new"),
    );
    store.append_call(new.clone()).await.expect("append");
    let t = store
        .get_trajectory("t-new")
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(t.calls, [new]);
    assert_eq!(
        store.find_response("resp_new").await.expect("find"),
        Some(ResponseRef {
            trajectory_id: "t-new".into(),
            call_index: 0
        })
    );
}
