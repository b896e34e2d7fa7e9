//! The policy that served each call (its model's name and LoRA adapter) in
//! the span store, on every implementation (memory, SQLite, PostgreSQL):
//! read back exactly by `get_trajectory`, `latest_calls` and the export
//! scan; kept by a reopened SQLite file; `None` for calls of a SQLite file
//! from before the store kept it; null in a call's JSON when unset; and
//! refused when malformed.

mod store_support;

use std::sync::Arc;

use store_support::{call, ids, postgres_url};
use tito::store::sqlite::schema;
use tito::store::{CallRecord, DynStore, MemoryStore, StoreError, TrajectoryFilter};

fn stores(dir: &tempfile::TempDir) -> Vec<(&'static str, DynStore)> {
    let path = dir.path().join("spans.db");
    vec![
        ("memory", Arc::new(MemoryStore::new()) as DynStore),
        (
            "sqlite",
            tito::store::open(&format!("sqlite://{}", path.display())).expect("open sqlite"),
        ),
        (
            "postgres",
            tito::store::open(&postgres_url()).expect("open postgres"),
        ),
    ]
}

/// `call` served by `model` (and `adapter`).
fn served(mut call: CallRecord, model: &str, adapter: Option<&str>) -> CallRecord {
    call.model = Some(model.into());
    call.adapter = adapter.map(Into::into);
    call
}

/// A planner call on the base model, a coder call on its adapter
/// continuing it, and a call with no policy recorded.
fn planner_and_coder(traj: &str) -> Vec<CallRecord> {
    vec![
        served(
            call(traj, 0, 0, None, ids(1, 4), ids(10, 3)),
            "planner",
            None,
        ),
        served(
            call(traj, 1, 0, Some(0), ids(20, 2), ids(30, 3)),
            "base",
            Some("coder-lora"),
        ),
        call(traj, 2, 0, Some(1), ids(40, 2), ids(50, 2)),
    ]
}

/// Each call's `(model, adapter)`.
fn policies(calls: &[CallRecord]) -> Vec<(Option<String>, Option<String>)> {
    calls
        .iter()
        .map(|c| (c.model.clone(), c.adapter.clone()))
        .collect()
}

#[tokio::test]
async fn each_calls_policy_reads_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let calls = planner_and_coder("t-policy");
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let t = store
            .get_trajectory("t-policy")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(
            policies(&t.calls),
            [
                (Some("planner".into()), None),
                (Some("base".into()), Some("coder-lora".into())),
                (None, None),
            ],
            "{name}"
        );
        assert_eq!(t.calls, calls, "{name}");
        let latest = store.latest_calls("t-policy", 2).await.expect("latest");
        assert_eq!(latest, calls[1..].to_vec(), "{name}");
        // The export scan keeps the policy (only bodies are left out).
        let scanned: Vec<_> = store
            .scan(&TrajectoryFilter::default())
            .expect("scan")
            .map(|t| t.expect("scan reads"))
            .collect();
        assert_eq!(scanned.len(), 1, "{name}");
        let want: Vec<_> = calls.iter().map(CallRecord::without_bodies).collect();
        assert_eq!(scanned[0].calls, want, "{name}");
    }
}

#[tokio::test]
async fn a_reopened_sqlite_file_keeps_each_calls_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("spans.db").display());
    let calls = planner_and_coder("t-reopen");
    {
        let store = tito::store::open(&url).expect("open");
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
    }
    let store = tito::store::open(&url).expect("reopen");
    let t = store.get_trajectory("t-reopen").await.expect("get");
    assert_eq!(t.expect("stored").calls, calls);
}

/// A SQLite file from before the policy (schema 15) gains the columns on
/// open: its calls read back with no model and no adapter, new calls keep
/// theirs.
#[tokio::test]
async fn a_sqlite_file_from_before_the_policy_gains_it_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    let url = format!("sqlite://{}", path.display());
    let old = call("t-old", 0, 0, None, ids(1, 3), ids(4, 2));
    {
        let mut conn = rusqlite::Connection::open(&path).expect("raw open");
        assert_eq!(schema::migrate_to(&mut conn, 15).expect("v15"), 15);
        let policy_columns: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('calls') \
                 WHERE name IN ('model', 'adapter')",
                [],
                |r| r.get(0),
            )
            .expect("query");
        assert_eq!(policy_columns, 0, "schema 15 keeps no policy");
    }
    {
        // Written by a store, then the version set back: a file a tito of
        // schema 15 wrote holds exactly these rows.
        let store = tito::store::open(&url).expect("open");
        store.append_call(old.clone()).await.expect("append");
    }
    {
        let conn = rusqlite::Connection::open(&path).expect("raw open");
        conn.execute_batch(
            "ALTER TABLE calls DROP COLUMN model; ALTER TABLE calls DROP COLUMN adapter; \
             PRAGMA user_version = 15;",
        )
        .expect("back to schema 15");
    }
    let store = tito::store::open(&url).expect("open migrates");
    let t = store.get_trajectory("t-old").await.expect("get");
    let calls = t.expect("stored").calls;
    assert_eq!(policies(&calls), [(None, None)]);
    assert_eq!(calls, [old]);
    let next = served(
        call("t-old", 1, 0, Some(0), ids(9, 2), ids(11, 2)),
        "base",
        Some("coder-lora"),
    );
    store.append_call(next.clone()).await.expect("append");
    let t = store.get_trajectory("t-old").await.expect("get");
    assert_eq!(t.expect("stored").calls[1], next);
}

/// A model or adapter that is empty, longer than 256 bytes or holds a
/// control character is refused, naming the field, as is an adapter
/// without a model; nothing is stored. 256 bytes and any other text go in.
#[tokio::test]
async fn a_malformed_policy_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let long = "m".repeat(CallRecord::MAX_POLICY_NAME + 1);
    let cases: [(Option<&str>, Option<&str>, &str); 7] = [
        (Some(""), None, "model"),
        (Some(&long), None, "model"),
        (Some("plan\nner"), None, "model"),
        (Some("base"), Some(""), "adapter"),
        (Some("base"), Some(&long), "adapter"),
        (Some("base"), Some("coder\u{7f}lora"), "adapter"),
        (None, Some("coder-lora"), "adapter set without model"),
    ];
    for (name, store) in stores(&dir) {
        for (k, (model, adapter, says)) in cases.iter().enumerate() {
            let traj = format!("t-bad-{k}");
            let mut c = call(&traj, 0, 0, None, ids(1, 2), ids(3, 2));
            c.model = model.map(Into::into);
            c.adapter = adapter.map(Into::into);
            match store.append_call(c).await {
                Err(StoreError::Invalid(msg)) => {
                    assert!(msg.contains(says), "{name} case {k}: {msg}")
                }
                other => panic!("{name} case {k}: {other:?}"),
            }
            assert!(
                store.get_meta(&traj).await.expect("meta").is_none(),
                "{name} case {k}: nothing stored"
            );
        }
        let longest = "m".repeat(CallRecord::MAX_POLICY_NAME);
        let ok = served(
            call("t-ok", 0, 0, None, ids(1, 2), ids(3, 2)),
            &longest,
            Some("coder-lora/v2 ünïcode"),
        );
        store.append_call(ok.clone()).await.expect("a valid policy");
        let t = store.get_trajectory("t-ok").await.expect("get");
        assert_eq!(t.expect("stored").calls, [ok], "{name}");
    }
}

/// As `GET /v1/trajectories/{id}` shows calls: both fields on every call,
/// null where unset; and a call serialized before they existed reads back
/// with both `None`.
#[test]
fn the_policy_in_a_calls_json_is_null_when_unset_and_optional_on_input() {
    let shown = serde_json::to_value(planner_and_coder("t")).expect("json");
    assert_eq!(shown[0]["model"], "planner");
    assert_eq!(shown[0]["adapter"], serde_json::Value::Null);
    assert_eq!(shown[1]["model"], "base");
    assert_eq!(shown[1]["adapter"], "coder-lora");
    let unset = shown[2].as_object().expect("object");
    assert_eq!(unset.get("model"), Some(&serde_json::Value::Null));
    assert_eq!(unset.get("adapter"), Some(&serde_json::Value::Null));

    let mut old = shown[1].clone();
    let map = old.as_object_mut().expect("object");
    map.remove("model");
    map.remove("adapter");
    let read: CallRecord = serde_json::from_value(old).expect("an old record reads");
    assert_eq!((read.model, read.adapter), (None, None));
}
