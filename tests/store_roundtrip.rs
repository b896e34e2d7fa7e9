//! Span store behaviour, run against every implementation (memory, SQLite,
//! PostgreSQL): roundtrip,
//! validation errors, rewards, finish, pagination, latest calls; plus the
//! SQLite specifics (reopen, migrations, compact BLOBs, concurrent appends).

mod store_support;

use std::sync::Arc;

use store_support::{branching, call, ids, with_missing_logprobs};
use tito::store::sqlite::schema::{self, SCHEMA_VERSION};
use tito::store::{
    DynStore, ListQuery, MemoryStore, SqliteStore, StoreError, TrajectoryFilter, TrajectoryStatus,
};

fn stores(dir: &tempfile::TempDir) -> Vec<(&'static str, DynStore)> {
    let url = format!("sqlite://{}/nested/dir/spans.db", dir.path().display());
    vec![
        ("memory", Arc::new(MemoryStore::new()) as DynStore),
        (
            "sqlite",
            tito::store::open(&url).expect("open sqlite store"),
        ),
        (
            "postgres",
            tito::store::open(&store_support::postgres_url()).expect("open postgres store"),
        ),
    ]
}

#[tokio::test]
async fn roundtrip_keeps_every_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let mut calls = branching("t-1");
        calls[2].drift = Some(tito::store::Drift {
            position: 7,
            cause: "bpe_retokenization".into(),
            details: serde_json::json!({"expected": [1, 2], "actual": [3]}),
        });
        calls[3].moved_from = Some("http://127.0.0.1:8002".into());
        calls[3].truncated = true;
        calls[4].weight_version = None;
        calls[5].logprobs = vec![Some(f32::MIN_POSITIVE), Some(-0.0), Some(-1e-30)];
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let t = store
            .get_trajectory("t-1")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(t.calls, calls, "{name}");
        assert_eq!(t.meta.status, TrajectoryStatus::Active, "{name}");
        assert_eq!(t.meta.num_calls, 6, "{name}");
        assert_eq!(t.meta.next_call_index, 6, "{name}");
        assert_eq!(t.meta.next_sample_index, 3, "{name}");
        let tokens: usize = calls
            .iter()
            .map(|c| c.prompt_delta_ids.len() + c.sampled_ids.len())
            .sum();
        assert_eq!(t.meta.num_tokens, tokens as u64, "{name}");
        assert_eq!(t.meta.drift_count, 1, "{name}");
        assert!(store.get_trajectory("nope").await.expect("get").is_none());
        assert!(store.get_meta("nope").await.expect("meta").is_none());

        let latest = store.latest_calls("t-1", 2).await.expect("latest");
        assert_eq!(latest, calls[4..].to_vec(), "{name}");
        assert_eq!(
            t.full_prompt_ids(4).expect("prompt"),
            [
                ids(100, 5),
                ids(200, 3),
                ids(300, 2),
                ids(400, 4),
                ids(700, 3),
                ids(800, 5),
                ids(900, 1)
            ]
            .concat(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn appends_are_validated() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        store
            .append_call(call("t", 0, 0, None, ids(1, 2), ids(3, 2)))
            .await
            .expect("first");
        let dup = store
            .append_call(call("t", 0, 0, None, ids(1, 2), ids(3, 2)))
            .await;
        assert!(
            matches!(dup, Err(StoreError::Duplicate { call: 0, .. })),
            "{name}: {dup:?}"
        );
        let missing = store
            .append_call(call("t", 2, 0, Some(1), vec![], ids(3, 2)))
            .await;
        assert!(
            matches!(missing, Err(StoreError::Invalid(_))),
            "{name}: {missing:?}"
        );
        let orphan = store
            .append_call(call("new", 1, 0, Some(0), vec![], ids(3, 2)))
            .await;
        assert!(
            matches!(orphan, Err(StoreError::Invalid(_))),
            "{name}: {orphan:?}"
        );
        assert!(
            store.get_meta("new").await.expect("meta").is_none(),
            "{name}"
        );
        let mut bad = call("t", 1, 0, Some(0), vec![], ids(3, 2));
        bad.logprobs.pop();
        assert!(matches!(
            store.append_call(bad).await,
            Err(StoreError::Invalid(_))
        ));
        let forward = call("t", 1, 0, Some(1), vec![], ids(3, 2));
        assert!(matches!(
            store.append_call(forward).await,
            Err(StoreError::Invalid(_))
        ));
        // A failed append leaves the trajectory as it was.
        let meta = store.get_meta("t").await.expect("meta").expect("stored");
        assert_eq!(meta.num_calls, 1, "{name}");
    }
}

#[tokio::test]
async fn reward_and_finish() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        for c in branching("t") {
            store.append_call(c).await.expect("append");
        }
        let m = store
            .set_reward("t", None, 1.0, None)
            .await
            .expect("reward");
        assert_eq!(m.reward, Some(1.0), "{name}");
        store
            .set_reward("t", Some(2), 0.25, None)
            .await
            .expect("call reward");
        assert!(matches!(
            store.set_reward("t", Some(99), 0.5, None).await,
            Err(StoreError::CallNotFound { call: 99, .. })
        ));
        assert!(matches!(
            store.set_reward("nope", None, 0.5, None).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            store.finish("nope").await,
            Err(StoreError::NotFound(_))
        ));
        let m = store.finish("t").await.expect("finish");
        assert_eq!(m.status, TrajectoryStatus::Finished, "{name}");
        let again = store.finish("t").await.expect("finish twice");
        assert_eq!(again.status, TrajectoryStatus::Finished);
        let late = store
            .append_call(call("t", 6, 0, Some(2), vec![], ids(1, 1)))
            .await;
        assert!(
            matches!(late, Err(StoreError::Finished(_))),
            "{name}: {late:?}"
        );
        // A new root (no parent) is refused too, not a second trajectory.
        let late_root = store
            .append_call(call("t", 6, 9, None, ids(1, 3), ids(5, 1)))
            .await;
        assert!(
            matches!(late_root, Err(StoreError::Finished(_))),
            "{name}: {late_root:?}"
        );
        // Rewards are still accepted after finish.
        store
            .set_reward("t", None, 0.5, None)
            .await
            .expect("late reward");

        let t = store
            .get_trajectory("t")
            .await
            .expect("get")
            .expect("stored");
        let samples = t.samples().expect("samples");
        assert_eq!(samples[0].reward, Some(0.25), "{name}: call reward wins");
        assert_eq!(samples[1].reward, Some(0.5), "{name}: trajectory reward");
    }
}

#[tokio::test]
async fn pagination_and_filters() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        for i in 0..25u32 {
            let id = format!("t-{i:02}");
            store
                .append_call(call(&id, 0, 0, None, ids(i, 3), ids(i, 2)))
                .await
                .expect("append");
            if i % 3 == 0 {
                store.finish(&id).await.expect("finish");
            }
        }
        let mut seen = Vec::new();
        let mut cursor = None;
        let mut pages = 0;
        loop {
            let page = store
                .list_trajectories(&ListQuery {
                    filter: TrajectoryFilter::default(),
                    limit: 10,
                    cursor: cursor.clone(),
                })
                .await
                .expect("page");
            pages += 1;
            seen.extend(page.items.iter().map(|m| m.id.clone()));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(pages, 3, "{name}");
        let expected: Vec<String> = (0..25).map(|i| format!("t-{i:02}")).collect();
        assert_eq!(seen, expected, "{name}: creation order, no gaps or repeats");

        let finished = TrajectoryFilter {
            status: Some(TrajectoryStatus::Finished),
            since: None,
            ..Default::default()
        };
        let page = store
            .list_trajectories(&ListQuery {
                filter: finished.clone(),
                limit: 100,
                cursor: None,
            })
            .await
            .expect("finished page");
        assert_eq!(page.items.len(), 9, "{name}");
        assert!(page.next_cursor.is_none());
        assert_eq!(store.count(&finished).expect("count"), 9, "{name}");
        let scanned: Vec<String> = store
            .scan(&finished)
            .expect("scan")
            .map(|t| t.expect("trajectory").meta.id)
            .collect();
        assert_eq!(
            scanned,
            page.items.iter().map(|m| m.id.clone()).collect::<Vec<_>>()
        );

        let future = TrajectoryFilter {
            status: None,
            since: Some(tito::store::now_ms() + 60_000),
            ..Default::default()
        };
        assert_eq!(store.count(&future).expect("count"), 0, "{name}");
        let past = TrajectoryFilter {
            status: None,
            since: Some(0),
            ..Default::default()
        };
        assert_eq!(store.count(&past).expect("count"), 25, "{name}");
        let bad = store
            .list_trajectories(&ListQuery {
                filter: TrajectoryFilter::default(),
                limit: 10,
                cursor: Some("x".into()),
            })
            .await;
        assert!(matches!(bad, Err(StoreError::Invalid(_))), "{name}");
    }
}

#[tokio::test]
async fn sqlite_reopen_after_drop_keeps_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let calls = branching("t-1");
    {
        let store = SqliteStore::open(&url).expect("open");
        for c in &calls {
            tito::store::SpanStore::append_call(&store, c.clone())
                .await
                .expect("append");
        }
        tito::store::SpanStore::finish(&store, "t-1")
            .await
            .expect("finish");
    }
    let store = tito::store::open(&url).expect("reopen");
    let t = store
        .get_trajectory("t-1")
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(t.calls, calls);
    assert_eq!(t.meta.status, TrajectoryStatus::Finished);
}

#[tokio::test]
async fn sqlite_migrates_an_old_database_and_refuses_a_newer_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    {
        let mut conn = rusqlite::Connection::open(&path).expect("open raw");
        assert_eq!(schema::migrate_to(&mut conn, 1).expect("v1"), 1);
        conn.execute(
            "INSERT INTO trajectories (id, status, created_at, updated_at, reward, num_calls, \
             next_call_index, next_sample_index) VALUES ('old', 1, 5, 6, 0.5, 0, 0, 0)",
            [],
        )
        .expect("insert v1 row");
    }
    let url = format!("sqlite://{}", path.display());
    let store = tito::store::open(&url).expect("open migrates");
    let meta = store.get_meta("old").await.expect("meta").expect("kept");
    assert_eq!(meta.reward, Some(0.5));
    assert_eq!(meta.status, TrajectoryStatus::Finished);
    drop(store);
    let conn = rusqlite::Connection::open(&path).expect("open raw");
    assert_eq!(
        schema::user_version(&conn).expect("version"),
        SCHEMA_VERSION
    );
    // Migration 2 made `trajectories_status_updated`, migration 9 dropped it
    // and left only grouped trajectories in the group index.
    let indexes: Vec<(String, String)> = conn
        .prepare(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' \
             AND tbl_name = 'trajectories' AND sql IS NOT NULL ORDER BY name",
        )
        .expect("index query")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("index rows")
        .collect::<Result<_, _>>()
        .expect("index rows");
    let names: Vec<&str> = indexes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["trajectories_group"], "migrations 2 and 9 applied");
    assert!(
        indexes[0].1.ends_with("WHERE group_id IS NOT NULL"),
        "{}",
        indexes[0].1
    );
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("bump");
    drop(conn);
    match tito::store::open(&url) {
        Err(StoreError::Schema(msg)) => assert!(msg.contains("newer") || msg.contains("upgrade")),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened a database from a newer schema"),
    }
}

#[tokio::test]
async fn sqlite_stores_ids_as_little_endian_blobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("spans.db");
    let url = format!("sqlite://{}", path.display());
    {
        let store = tito::store::open(&url).expect("open");
        let c = call("t", 0, 0, None, vec![1, 0x0102_0304], vec![7, 8, 9]);
        store.append_call(c).await.expect("append");
    }
    let conn = rusqlite::Connection::open(&path).expect("open raw");
    let (prompt, sampled, logprobs): (Vec<u8>, Vec<u8>, Vec<u8>) = conn
        .query_row(
            "SELECT prompt_delta_ids, sampled_ids, logprobs FROM calls",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("row");
    assert_eq!(prompt, vec![1, 0, 0, 0, 4, 3, 2, 1]);
    assert_eq!(sampled.len(), 12);
    assert_eq!(logprobs.len(), 12);
    assert_eq!(&logprobs[0..4], &(-0.01f32).to_le_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_appends_all_land() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!(
        "sqlite://{}/spans.db?synchronous=normal",
        dir.path().display()
    );
    let store = tito::store::open(&url).expect("open");
    let mut tasks = Vec::new();
    for w in 0..16u32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("w-{w}");
            for i in 0..40u32 {
                let parent = i.checked_sub(1);
                let c = call(&id, i, 0, parent, ids(i, 4), ids(w * 1000 + i, 6));
                store.append_call(c).await.expect("append");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let all = TrajectoryFilter::default();
    assert_eq!(store.count(&all).expect("count"), 16);
    for t in store.scan(&all).expect("scan") {
        let t = t.expect("trajectory");
        assert_eq!(t.calls.len(), 40, "{}", t.meta.id);
        assert_eq!(t.samples().expect("samples")[0].num_turns, 40);
    }
}

#[test]
fn bad_urls_are_rejected() {
    for url in [
        "mysql://x",
        "sqlite://",
        "sqlite://a.db?synchronous=off",
        "postgres://u@h:notaport/db",
    ] {
        assert!(
            matches!(tito::store::open(url), Err(StoreError::BadUrl(_))),
            "{url}"
        );
    }
}

#[test]
fn a_bad_postgres_url_is_reported_without_its_password() {
    match tito::store::open("postgres://tito:s3cret@db:notaport/tito") {
        Err(e @ StoreError::BadUrl(_)) => {
            let text = e.to_string();
            assert!(!text.contains("s3cret"), "{text}");
            assert!(text.contains("***@db:notaport/tito"), "{text}");
        }
        Err(e) => panic!("expected a bad url error, got {e}"),
        Ok(_) => panic!("opened a store with a bad url"),
    }
}

#[test]
fn an_unreachable_postgres_is_an_error_naming_it() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("postgres://tito@127.0.0.1:{port}/db");
    match tito::store::open(&url) {
        Err(StoreError::Postgres(e)) => assert!(e.contains("connect"), "{e}"),
        Err(e) => panic!("expected a postgres error, got {e}"),
        Ok(_) => panic!("opened a store on a closed port"),
    }
}

#[tokio::test]
async fn missing_logprobs_roundtrip_as_none_in_both_stores_and_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Real values include 0.0, f32::MIN and -inf.
    let mut calls = with_missing_logprobs("t-lp");
    calls[3].logprobs[3] = Some(f32::NEG_INFINITY);
    for (name, store) in stores(&dir) {
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let t = store
            .get_trajectory("t-lp")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(t.calls, calls, "{name}");
        assert_eq!(
            t.calls[0].logprobs,
            [Some(-0.25), None, Some(0.0)],
            "{name}"
        );
        assert_eq!(t.calls[1].logprobs, [None; 4], "{name}");
        let latest = store.latest_calls("t-lp", 6).await.expect("latest");
        assert_eq!(latest, calls, "{name}");
        let scanned: Vec<_> = store
            .scan(&TrajectoryFilter::default())
            .expect("scan")
            .map(|t| t.expect("trajectory").calls)
            .collect();
        assert_eq!(scanned, [without_bodies(&calls)], "{name}");

        // A NaN logprob is no logprob, in either store.
        let mut nan = call("t-nan", 0, 0, None, ids(1, 2), ids(3, 3));
        nan.logprobs = vec![Some(f32::NAN), Some(-0.5), None];
        store.append_call(nan).await.expect("append");
        let t = store
            .get_trajectory("t-nan")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(t.calls[0].logprobs, [None, Some(-0.5), None], "{name}");
    }

    // Reopened from disk: the same Options, and NaN words (never 0.0) in the
    // BLOB where no logprob was reported.
    let path = dir.path().join("nested/dir/spans.db");
    let store = tito::store::open(&format!("sqlite://{}", path.display())).expect("reopen");
    let t = store
        .get_trajectory("t-lp")
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(t.calls, calls);
    drop(store);
    let conn = rusqlite::Connection::open(&path).expect("open raw");
    let blob: Vec<u8> = conn
        .query_row(
            "SELECT c.logprobs FROM calls c JOIN trajectories t ON t.seq = c.traj \
             WHERE t.id = 't-lp' AND c.call_index = 0",
            [],
            |r| r.get(0),
        )
        .expect("row");
    let words: Vec<f32> = blob
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    assert_eq!(words.len(), 3);
    assert_eq!(words[0], -0.25);
    assert!(words[1].is_nan(), "missing logprob stored as NaN");
    assert_eq!(words[2].to_bits(), 0.0f32.to_bits(), "a real 0.0 stays 0.0");
}

/// Migration 8 counts the tokens and drifted calls of trajectories written
/// before it; appends keep both counts from then on.
#[tokio::test]
async fn sqlite_counts_tokens_and_drift_of_existing_trajectories_when_migrating() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v7.db");
    {
        let mut conn = rusqlite::Connection::open(&path).expect("open raw");
        assert_eq!(schema::migrate_to(&mut conn, 7).expect("v7"), 7);
        conn.execute_batch(
            "INSERT INTO trajectories (seq, id, status, created_at, updated_at, num_calls, \
             next_call_index, next_sample_index) VALUES (1, 'seven', 0, 1, 1, 2, 2, 1);
             INSERT INTO calls (traj, call_index, sample_index, backend, started_at, finished_at, \
             prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, response, drift, \
             tokenizer_sha256, template_sha256, truncated) VALUES \
             (1, 0, 0, 'b', 1, 1, X'0100000002000000', X'03000000', X'00000000', 'stop', '{}', \
              '{}', NULL, 't', 't', 0), \
             (1, 1, 0, 'b', 1, 1, X'04000000', X'0500000006000000', X'0000000000000000', 'stop', \
              '{}', '{}', '{\"position\": 0}', 't', 't', 0);",
        )
        .expect("v7 rows");
    }
    let store = tito::store::open(&format!("sqlite://{}", path.display())).expect("migrates");
    let meta = store.get_meta("seven").await.expect("meta").expect("kept");
    assert_eq!((meta.num_tokens, meta.drift_count), (6, 1));
}

/// An agent's calls, each sending the whole history (the SQLite store keeps
/// each message once): bodies of every shape a call can carry.
fn history_calls(traj: &str) -> Vec<tito::store::CallRecord> {
    use serde_json::json;
    let sys = json!({"role": "system", "content": "You are an agent."});
    let u1 = json!({"role": "user", "content": [{"type": "text", "text": "add 1.0 and 2"}]});
    let a1 = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "add", "arguments": "{\"a\": 1.0, \"b\": 2}"}}]});
    let t1 = json!({"role": "tool", "tool_call_id": "c1", "content": "3.0"});
    let bodies = [
        // A root call's body is stored whole.
        json!({"model": "m", "messages": [sys, u1], "temperature": 0.5}),
        json!({"model": "m", "messages": [sys, u1, a1, t1], "temperature": 0.5}),
        // `messages` first, a message sent twice, keys after it.
        json!({"messages": [sys, u1, a1, t1, t1], "model": "m", "tools": [{"type": "function"}]}),
        json!({"model": "m", "prompt": "no messages here"}),
        json!({"model": "m", "messages": []}),
        json!({"model": "m", "messages": "not a list"}),
        json!(null),
    ];
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let i = i as u32;
            let mut c = call(
                traj,
                i,
                0,
                i.checked_sub(1),
                ids(10 * i, 2),
                ids(100 * i, 2),
            );
            c.request = body.into();
            c
        })
        .collect()
}

/// [`history_calls`] of `traj`, appended to `store`.
async fn store_history(store: &tito::store::DynStore, traj: &str) -> Vec<tito::store::CallRecord> {
    let calls = history_calls(traj);
    for c in &calls {
        store.append_call(c.clone()).await.expect("append");
    }
    calls
}

#[tokio::test]
async fn a_history_sent_with_every_call_reads_back_exactly_from_every_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let calls = store_history(&store, "t-h").await;
        let t = store
            .get_trajectory("t-h")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(t.calls, calls, "{name}");
        // The same text too: keys in their order, numbers as written.
        for (got, sent) in t.calls.iter().zip(&calls) {
            assert_eq!(got.request.to_string(), sent.request.to_string(), "{name}");
        }
        let latest = store.latest_calls("t-h", 6).await.expect("latest");
        assert_eq!(latest[..], calls[1..], "{name}");
    }
}

/// `calls` as the export scans give them out: every field but the bodies.
fn without_bodies(calls: &[tito::store::CallRecord]) -> Vec<tito::store::CallRecord> {
    calls
        .iter()
        .map(tito::store::CallRecord::without_bodies)
        .collect()
}

#[tokio::test]
async fn the_export_scans_leave_bodies_out_and_keep_every_other_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        // Split bodies (continuations sending a history) and whole ones.
        let calls = store_history(&store, "t-s").await;
        let other = call("t-o", 0, 0, None, ids(1, 3), ids(7, 2));
        store.append_call(other.clone()).await.expect("append");
        let full = store
            .get_trajectory("t-s")
            .await
            .expect("get")
            .expect("t-s");
        assert!(full.calls.iter().all(|c| !c.response.is_null()), "{name}");

        let scanned: Vec<_> = store
            .scan(&TrajectoryFilter::default())
            .expect("scan")
            .map(|t| t.expect("trajectory"))
            .collect();
        assert_eq!(scanned.len(), 2, "{name}");
        assert_eq!(scanned[0].meta, full.meta, "{name}");
        assert_eq!(scanned[0].calls, without_bodies(&calls), "{name}");
        assert_eq!(scanned[1].calls, without_bodies(&[other]), "{name}");

        let named: Vec<_> = store
            .scan_ids(vec!["t-s".into(), "unknown".into()])
            .expect("scan ids")
            .map(|t| t.expect("trajectory"))
            .collect();
        assert_eq!(named, scanned[..1], "{name}");
    }
}

#[tokio::test]
async fn sqlite_stores_each_message_of_a_trajectory_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("spans.db");
    let url = format!("sqlite://{}", path.display());
    let calls = history_calls("t-h");
    {
        let store = tito::store::open(&url).expect("open");
        for c in calls.iter().cloned().chain(history_calls("t-other")) {
            store.append_call(c).await.expect("append");
        }
    }
    let conn = rusqlite::Connection::open(&path).expect("open raw");
    // system, user, assistant, tool: once per trajectory.
    let per_traj: Vec<i64> = conn
        .prepare("SELECT count(*) FROM request_messages GROUP BY traj ORDER BY traj")
        .expect("count")
        .query_map([], |r| r.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(per_traj, [4, 4]);
    let stored: Vec<(String, Option<Vec<u8>>)> = conn
        .prepare(
            "SELECT c.request, c.message_refs FROM calls c JOIN trajectories t ON t.seq = c.traj \
                  WHERE t.id = 't-h' ORDER BY c.call_index",
        )
        .expect("calls")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(stored[0], (calls[0].request.to_string(), None));
    assert_eq!(
        stored[1].0,
        r#"{"model":"m","messages":null,"temperature":0.5}"#
    );
    assert_eq!(stored[1].1.as_ref().map(Vec::len), Some(32));
    assert_eq!(stored[2].1.as_ref().map(Vec::len), Some(40));
    assert!(!stored[2].0.contains("agent"), "{}", stored[2].0);
    // Bodies without a message list are stored whole.
    for (text, refs) in &stored[3..] {
        assert!(refs.is_none(), "{text}");
    }
    assert_eq!(stored[6].0, "null");
    // A row stored before this layout (its body whole) still reads back.
    let whole = calls[2].request.to_string();
    conn.execute(
        "UPDATE calls SET request = ?1, message_refs = NULL WHERE call_index = 2 \
         AND traj = (SELECT seq FROM trajectories WHERE id = 't-h')",
        [&whole],
    )
    .expect("old layout");
    drop(conn);
    let store = tito::store::open(&url).expect("reopen");
    let t = store
        .get_trajectory("t-h")
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(t.calls, calls);
}

#[tokio::test]
async fn postgres_stores_each_message_of_a_trajectory_once() {
    let url = store_support::postgres_url();
    let store = tito::store::open(&url).expect("open");
    let calls = history_calls("t-h");
    for c in calls.iter().cloned().chain(history_calls("t-other")) {
        store.append_call(c).await.expect("append");
    }
    let db = store_support::pg_session(&url).await;
    let rows = db
        .query(
            "SELECT count(*) FROM request_messages GROUP BY traj ORDER BY traj",
            &[],
        )
        .await
        .expect("count");
    let per_traj: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(per_traj, [4, 4]);
    let rows = db
        .query(
            "SELECT c.request, c.message_refs FROM calls c JOIN trajectories t \
             ON t.seq = c.traj WHERE t.id = 't-h' ORDER BY c.call_index",
            &[],
        )
        .await
        .expect("calls");
    let stored: Vec<(String, Option<Vec<u8>>)> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(stored[0], (calls[0].request.to_string(), None));
    assert_eq!(
        stored[1].0,
        r#"{"model":"m","messages":null,"temperature":0.5}"#
    );
    // SHA-256 digests, 32 bytes a message.
    assert_eq!(stored[1].1.as_ref().map(Vec::len), Some(4 * 32));
    assert_eq!(stored[2].1.as_ref().map(Vec::len), Some(5 * 32));
    for (text, refs) in &stored[3..] {
        assert!(refs.is_none(), "{text}");
    }
}
