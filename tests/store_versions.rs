//! Per-token policy versions in the span store, on every implementation
//! (memory, SQLite, PostgreSQL): a call's version spans read back as
//! stored, bad span lists are refused, weight version labels are numbered
//! 1, 2, ... once each (replicas sharing PostgreSQL agree), and databases
//! written before the store kept versions read back with none.

mod store_support;

use std::sync::Arc;

use store_support::{branching, call, ids};
use tito::store::sqlite::schema::{self, SCHEMA_VERSION};
use tito::store::{DynStore, MemoryStore, PgStore, StoreError, VersionSpan};

fn stores(dir: &tempfile::TempDir) -> Vec<(&'static str, DynStore)> {
    let url = format!("sqlite://{}/spans.db", dir.path().display());
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

fn span(start: u32, version: Option<&str>, seq: Option<u64>) -> VersionSpan {
    VersionSpan {
        start,
        version: version.map(str::to_string),
        seq,
    }
}

#[tokio::test]
async fn version_spans_read_back_as_stored() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let mut calls = branching("t");
        // One version; a seam after the second of five tokens; a label the
        // fleet never numbered; none (unknown) on the rest.
        calls[0].versions = vec![span(0, Some("v1"), Some(1))];
        calls[3].versions = vec![span(0, Some("v1"), Some(1)), span(2, Some("v2"), Some(2))];
        calls[4].versions = vec![span(0, None, None), span(1, Some("v3"), None)];
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let t = store.get_trajectory("t").await.expect("get").expect("kept");
        assert_eq!(t.calls, calls, "{name}");
        let latest = store.latest_calls("t", 2).await.expect("latest");
        assert_eq!(latest[0].versions, calls[4].versions, "{name}");
        // The export scans read them too.
        let scanned: Vec<_> = store
            .scan_ids(vec!["t".into()])
            .expect("scan")
            .map(|t| t.expect("row"))
            .collect();
        let spans: Vec<_> = scanned[0]
            .calls
            .iter()
            .map(|c| c.versions.clone())
            .collect();
        let expected: Vec<_> = calls.iter().map(|c| c.versions.clone()).collect();
        assert_eq!(spans, expected, "{name}");
        assert_eq!(
            calls[3].version_at(1).and_then(|s| s.seq),
            Some(1),
            "{name}"
        );
        assert_eq!(calls[3].version_at(2).and_then(|s| s.seq), Some(2));
        assert_eq!(calls[3].version_at(4).and_then(|s| s.seq), Some(2));
        assert_eq!(calls[1].version_at(0), None);
    }
}

#[tokio::test]
async fn bad_span_lists_are_refused_and_store_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let bad: [(Vec<VersionSpan>, &str); 6] = [
            (vec![span(1, Some("v1"), Some(1))], "not 0"),
            (
                vec![span(0, Some("v1"), Some(1)), span(0, Some("v2"), Some(2))],
                "increase",
            ),
            (
                vec![
                    span(0, Some("v1"), Some(1)),
                    span(2, Some("v2"), Some(2)),
                    span(1, Some("v3"), Some(3)),
                ],
                "increase",
            ),
            // Three sampled ids: a span at 3 covers none of them.
            (
                vec![span(0, Some("v1"), Some(1)), span(3, Some("v2"), Some(2))],
                "3 of 3",
            ),
            (vec![span(5, None, None)], "not 0"),
            (vec![span(0, Some("v0"), Some(0))], "seq 0"),
        ];
        for (versions, says) in bad {
            let mut c = call("bad", 0, 0, None, ids(1, 2), ids(10, 3));
            c.versions = versions.clone();
            match store.append_call(c).await {
                Err(StoreError::Invalid(m)) => {
                    assert!(m.contains("versions") && m.contains(says), "{name}: {m}")
                }
                other => panic!("{name}: {versions:?} gave {other:?}"),
            }
        }
        // A call without sampled ids has no span to give.
        let mut empty = call("bad", 0, 0, None, ids(1, 2), vec![]);
        empty.versions = vec![span(0, Some("v1"), Some(1))];
        assert!(
            matches!(store.append_call(empty).await, Err(StoreError::Invalid(_))),
            "{name}"
        );
        assert!(
            store.get_meta("bad").await.expect("meta").is_none(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn labels_are_numbered_once_each_from_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        assert_eq!(store.versions().await.expect("none yet"), [], "{name}");
        let before = tito::store::now_ms();
        assert_eq!(store.register_version("step-10").await.expect("a"), 1);
        assert_eq!(store.register_version("step-2").await.expect("b"), 2);
        // An existing label keeps its number.
        assert_eq!(store.register_version("step-10").await.expect("a"), 1);
        assert_eq!(store.register_version("step-3").await.expect("c"), 3);
        assert_eq!(store.register_version("step-2").await.expect("b"), 2);
        let after = tito::store::now_ms();
        let got = store.versions().await.expect("versions");
        let labels: Vec<(u64, &str)> = got.iter().map(|v| (v.seq, v.label.as_str())).collect();
        assert_eq!(
            labels,
            [(1, "step-10"), (2, "step-2"), (3, "step-3")],
            "{name}"
        );
        assert!(
            got.iter()
                .all(|v| (before..=after).contains(&v.registered_at)),
            "{name}: {got:?}"
        );
        // Registering is independent of the fleet's current version.
        assert_eq!(store.weight_version().await.expect("wv"), None, "{name}");
    }
}

#[tokio::test]
async fn sqlite_versions_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let mut c = call("t", 0, 0, None, ids(1, 2), ids(10, 4));
    c.versions = vec![span(0, Some("a"), Some(1)), span(3, Some("b"), Some(2))];
    {
        let store = tito::store::open(&url).expect("open");
        assert_eq!(store.register_version("a").await.expect("a"), 1);
        assert_eq!(store.register_version("b").await.expect("b"), 2);
        store.append_call(c.clone()).await.expect("append");
    }
    let store = tito::store::open(&url).expect("reopen");
    assert_eq!(store.register_version("b").await.expect("b"), 2);
    assert_eq!(store.register_version("c").await.expect("c"), 3);
    let t = store.get_trajectory("t").await.expect("get").expect("kept");
    assert_eq!(t.calls, [c]);
}

/// Two replicas on one PostgreSQL database register labels at once, each in
/// its own order: every label gets one number, both replicas agree on it,
/// and the numbers are 1..=n without gaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_agree_on_version_numbers() {
    let url = store_support::postgres_url();
    let a: DynStore = Arc::new(PgStore::open(&url).expect("replica a"));
    let b: DynStore = Arc::new(PgStore::open(&url).expect("replica b"));
    let labels: Vec<String> = (0..12).map(|i| format!("v{i}")).collect();
    let register = |store: DynStore, order: Vec<String>| {
        tokio::spawn(async move {
            let each = order.iter().map(|l| {
                let store = store.clone();
                async move {
                    (
                        l.clone(),
                        store.register_version(l).await.expect("register"),
                    )
                }
            });
            futures::future::join_all(each).await
        })
    };
    let mut reversed = labels.clone();
    reversed.reverse();
    let (got_a, got_b) = tokio::join!(
        register(a.clone(), labels.clone()),
        register(b.clone(), reversed)
    );
    let mut got_a = got_a.expect("a");
    let mut got_b = got_b.expect("b");
    got_a.sort();
    got_b.sort();
    assert_eq!(got_a, got_b);
    let mut seqs: Vec<u64> = got_a.iter().map(|(_, s)| *s).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=12).collect::<Vec<u64>>());
    let listed = b.versions().await.expect("versions");
    let mut by_label: Vec<(String, u64)> =
        listed.iter().map(|v| (v.label.clone(), v.seq)).collect();
    by_label.sort();
    assert_eq!(by_label, got_a);
    assert!(listed.windows(2).all(|w| w[0].seq < w[1].seq), "{listed:?}");
}

/// A database written before the store kept versions (schema version 13):
/// its calls read back with no version spans, and new calls keep theirs.
#[tokio::test]
async fn sqlite_upgrade_keeps_old_calls_with_no_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v13.db");
    {
        let mut conn = rusqlite::Connection::open(&path).expect("open raw");
        assert_eq!(schema::migrate_to(&mut conn, 13).expect("v13"), 13);
        conn.execute_batch(
            "INSERT INTO trajectories (seq, id, status, created_at, updated_at, num_calls, \
             next_call_index, next_sample_index) VALUES (1, 'old', 0, 1, 1, 1, 1, 1);
             INSERT INTO calls (call_key, traj, call_index, sample_index, backend, started_at, \
             finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
             response, weight_version, tokenizer_sha256, template_sha256, truncated) VALUES \
             (4294967296, 1, 0, 0, 'b', 1, 2, X'01000000', X'0200000003000000', \
              X'000000bf00000000', 'stop', '{}', '{}', 'w1', 't', 'p', 0);",
        )
        .expect("v13 rows");
    }
    let url = format!("sqlite://{}", path.display());
    let store = tito::store::open(&url).expect("migrates");
    {
        let conn = rusqlite::Connection::open(&path).expect("open raw");
        assert_eq!(
            schema::user_version(&conn).expect("version"),
            SCHEMA_VERSION
        );
    }
    let t = store
        .get_trajectory("old")
        .await
        .expect("get")
        .expect("kept");
    let old = &t.calls[0];
    assert_eq!(old.versions, []);
    assert_eq!(old.sampled_ids, [2, 3]);
    assert_eq!(old.logprobs, [Some(-0.5), Some(0.0)]);
    assert_eq!(old.weight_version.as_deref(), Some("w1"));
    assert_eq!(store.versions().await.expect("versions"), []);

    let mut new = call("old", 1, 0, Some(0), ids(4, 1), ids(5, 2));
    new.versions = vec![span(0, Some("w1"), Some(1)), span(1, Some("w2"), Some(2))];
    store.append_call(new.clone()).await.expect("append");
    let t = store
        .get_trajectory("old")
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(t.calls[1], new);
    assert_eq!(store.register_version("w1").await.expect("w1"), 1);
}
