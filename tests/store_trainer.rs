//! What a trainer reads from the store, on every store (memory, SQLite,
//! PostgreSQL): consumer-group
//! export pages (disjoint between workers of one consumer, served again
//! after an unacknowledged lease, independent between consumers), groups and
//! their completeness, task metadata, reward parts and replay checks.

mod store_support;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;
use store_support::{call, ids};
use tito::store::{
    DynStore, MemoryStore, SampleReplay, StoreError, TrajectoryFilter, TrajectoryMetadata,
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

/// `n` finished one-call trajectories `t-0000`...
async fn finished(store: &DynStore, n: u32) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for i in 0..n {
        let id = format!("t-{i:04}");
        store
            .append_call(call(&id, 0, 0, None, ids(1, 3), ids(10, 2)))
            .await
            .expect("append");
        store.finish(&id).await.expect("finish");
        all.insert(id);
    }
    all
}

/// Leases and acks pages of `limit` until the consumer's queue is empty.
async fn drain(store: DynStore, consumer: &str, limit: usize) -> Vec<String> {
    drain_beside(store, consumer, limit, None).await
}

/// [`drain`] by one of several workers: each takes its first page before
/// any goes on (`together`, one party per worker), so every worker gets a
/// page however the runtime schedules them.
async fn drain_beside(
    store: DynStore,
    consumer: &str,
    limit: usize,
    mut together: Option<Arc<tokio::sync::Barrier>>,
) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let lease = store
            .lease(consumer, &TrajectoryFilter::default(), limit, 60_000)
            .await
            .expect("lease");
        let Some(cursor) = lease.cursor else {
            assert!(lease.ids.is_empty());
            return seen;
        };
        assert!(!lease.ids.is_empty() && lease.ids.len() <= limit);
        seen.extend(lease.ids.iter().cloned());
        let acked = store.ack(consumer, &cursor).await.expect("ack");
        assert_eq!(acked.trajectories, lease.ids.len() as u64);
        assert!(!acked.already);
        if let Some(barrier) = together.take() {
            barrier.wait().await;
        }
        // Let the other worker's lease land between ours.
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_lease_says_how_long_its_oldest_trajectory_waited() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let all = finished(&store, 12).await;
        let lease = store
            .lease("lag", &TrajectoryFilter::default(), 5, 60_000)
            .await
            .expect("lease");
        let mut finished_at = Vec::new();
        for id in &lease.ids {
            let meta = store.get_meta(id).await.expect("meta").expect("exists");
            finished_at.push(meta.updated_at);
        }
        assert_eq!(lease.ids.len(), 5, "{name}");
        assert_eq!(
            lease.oldest_updated_at,
            finished_at.into_iter().min(),
            "{name}"
        );
        // A consumer that has caught up leases nothing, and nothing waited.
        let rest = drain(store.clone(), "lag", 100).await;
        assert_eq!(rest.len(), all.len() - 5, "{name}");
        let empty = store
            .lease("lag", &TrajectoryFilter::default(), 5, 60_000)
            .await
            .expect("lease");
        assert_eq!(
            (empty.cursor, empty.oldest_updated_at),
            (None, None),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_of_one_consumer_read_disjoint_pages_covering_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let all = finished(&store, 1000).await;
        // An active trajectory is never leased: its samples are not final.
        store
            .append_call(call("active", 0, 0, None, ids(1, 3), ids(10, 2)))
            .await
            .expect("append");
        let both = Some(Arc::new(tokio::sync::Barrier::new(2)));
        let a = tokio::spawn(drain_beside(store.clone(), "trainer", 37, both.clone()));
        let b = tokio::spawn(drain_beside(store.clone(), "trainer", 37, both));
        let (a, b) = (a.await.expect("worker a"), b.await.expect("worker b"));
        let sa: BTreeSet<String> = a.iter().cloned().collect();
        let sb: BTreeSet<String> = b.iter().cloned().collect();
        assert_eq!(sa.len(), a.len(), "{name}: worker a saw a sample twice");
        assert_eq!(sb.len(), b.len(), "{name}: worker b saw a sample twice");
        assert!(sa.is_disjoint(&sb), "{name}: workers overlap");
        let union: BTreeSet<String> = sa.union(&sb).cloned().collect();
        assert_eq!(union, all, "{name}: the union is every finished trajectory");
        assert!(
            !a.is_empty() && !b.is_empty(),
            "{name}: both workers got pages"
        );

        // Another consumer group reads everything again, independently.
        let other = drain(store.clone(), "evaluator", 400).await;
        assert_eq!(other.into_iter().collect::<BTreeSet<_>>(), all, "{name}");
        // Drained consumers get nothing more.
        assert!(drain(store.clone(), "trainer", 10).await.is_empty());
    }
}

#[tokio::test]
async fn an_unacknowledged_page_is_served_again_after_its_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let all = finished(&store, 5).await;
        let f = TrajectoryFilter::default();
        // A crashed worker: leased, never acked. A lease ending now is over.
        let lost = store.lease("c", &f, 3, 0).await.expect("lease");
        assert_eq!(lost.ids.len(), 3, "{name}");
        let old_cursor = lost.cursor.clone().expect("cursor");
        // While a page is leased, nobody else of the consumer gets it.
        let held = store.lease("c", &f, 100, 60_000).await.expect("lease");
        assert_eq!(
            held.ids.len(),
            5,
            "{name}: the expired page is served again"
        );
        assert_eq!(held.ids.iter().cloned().collect::<BTreeSet<_>>(), all);
        let none = store.lease("c", &f, 100, 60_000).await.expect("lease");
        assert!(none.cursor.is_none() && none.ids.is_empty(), "{name}");
        // The old cursor's trajectories were leased again: its ack is refused,
        // so its worker knows its page may be trained on twice.
        assert!(
            matches!(
                store.ack("c", &old_cursor).await,
                Err(StoreError::CursorNotFound(_))
            ),
            "{name}"
        );
        let cursor = held.cursor.expect("cursor");
        let acked = store.ack("c", &cursor).await.expect("ack");
        assert_eq!((acked.trajectories, acked.already), (5, false), "{name}");
        // A retried ack is not an error.
        let again = store.ack("c", &cursor).await.expect("ack again");
        assert_eq!((again.trajectories, again.already), (0, true), "{name}");
        assert!(matches!(
            store.ack("other", &cursor).await,
            Err(StoreError::CursorNotFound(_))
        ));
        let after = store.lease("c", &f, 100, 60_000).await.expect("lease");
        assert!(after.ids.is_empty(), "{name}: everything acknowledged");
    }
}

/// An expired page of which only a part is leased again is released whole:
/// its worker's late ack is refused (it may have trained on a trajectory
/// someone else now holds), and the rest of it is served again.
#[tokio::test]
async fn an_ack_of_a_page_partly_leased_again_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let all = finished(&store, 3).await;
        let f = TrajectoryFilter::default();
        let lost = store.lease("c", &f, 3, 0).await.expect("lease");
        assert_eq!(lost.ids.len(), 3, "{name}");
        let old_cursor = lost.cursor.clone().expect("cursor");
        let one = store.lease("c", &f, 1, 60_000).await.expect("lease");
        assert_eq!(one.ids.len(), 1, "{name}");
        assert!(
            matches!(
                store.ack("c", &old_cursor).await,
                Err(StoreError::CursorNotFound(_))
            ),
            "{name}: a late ack of a page partly leased again"
        );
        let rest = store.lease("c", &f, 100, 60_000).await.expect("lease");
        let served: BTreeSet<String> = one.ids.iter().chain(&rest.ids).cloned().collect();
        assert_eq!(served, all, "{name}");
        for page in [&one, &rest] {
            let cursor = page.cursor.clone().expect("cursor");
            store.ack("c", &cursor).await.expect("ack");
        }
    }
}

fn in_group(g: &str) -> TrajectoryMetadata {
    TrajectoryMetadata {
        group: Some(g.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn groups_filter_by_completeness_and_keep_their_metadata() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        for i in 0..4 {
            let id = format!("g1-{i}");
            // Registered before its first call, as a trainer may do.
            let meta = TrajectoryMetadata {
                group: Some("g1".into()),
                data_source: Some("gsm8k".into()),
                index: Some(i),
                extra_info: Some(json!({"split": "train"})),
            };
            let m = store.set_metadata(&id, &meta).await.expect("metadata");
            assert_eq!((m.num_calls, &m.metadata), (0, &meta), "{name}");
            store
                .append_call(call(&id, 0, 0, None, ids(1, 3), ids(10, 2)))
                .await
                .expect("append");
            store
                .set_reward(&id, None, i as f64, Some(json!({"acc": i % 2})))
                .await
                .expect("reward");
        }
        store
            .append_call(call("lone", 0, 0, None, ids(1, 3), ids(10, 2)))
            .await
            .expect("append");
        store.finish("lone").await.expect("finish");
        for i in 0..3 {
            store.finish(&format!("g1-{i}")).await.expect("finish");
        }
        let complete = TrajectoryFilter {
            complete_groups: true,
            ..Default::default()
        };
        assert_eq!(
            store.count(&complete).expect("count"),
            0,
            "{name}: 1 active"
        );
        store.finish("g1-3").await.expect("finish");
        assert_eq!(store.count(&complete).expect("count"), 4, "{name}");
        let at_least_5 = TrajectoryFilter {
            group_size: Some(5),
            ..complete.clone()
        };
        assert_eq!(store.count(&at_least_5).expect("count"), 0, "{name}");
        let by_group = TrajectoryFilter {
            group: Some("g1".into()),
            ..Default::default()
        };
        let scanned: Vec<_> = store
            .scan(&by_group)
            .expect("scan")
            .map(|t| t.expect("trajectory"))
            .collect();
        assert_eq!(scanned.len(), 4, "{name}");
        for (i, t) in scanned.iter().enumerate() {
            assert_eq!(t.meta.metadata.index, Some(i as i64));
            assert_eq!(t.meta.metadata.extra_info, Some(json!({"split": "train"})));
            assert_eq!(t.meta.reward_extra, Some(json!({"acc": i % 2})));
        }
        let members = store.group("g1").await.expect("group");
        assert_eq!(
            members.iter().map(|m| m.reward).collect::<Vec<_>>(),
            [Some(0.0), Some(1.0), Some(2.0), Some(3.0)]
        );
        assert!(store.group("nope").await.expect("group").is_empty());

        // A group never changes; other fields merge.
        assert!(matches!(
            store.set_metadata("g1-0", &in_group("g2")).await,
            Err(StoreError::Conflict(_))
        ));
        let m = store
            .set_metadata("g1-0", &in_group("g1"))
            .await
            .expect("same group again");
        assert_eq!(m.metadata.data_source.as_deref(), Some("gsm8k"), "{name}");
    }
}

#[tokio::test]
async fn replay_checks_are_kept_per_sample_and_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let report = |sample: u32, max: f64| SampleReplay {
        sample,
        backend: "b".into(),
        checked_at: 1,
        compared: 4,
        max_abs_diff: Some(max),
        mean_abs_diff: Some(max / 2.0),
        threshold: 0.1,
        positions: Vec::new(),
        argmax_mismatch_share: None,
        by_version: vec![tito::store::VersionReplay {
            seq: Some(2),
            version: Some("step-2".into()),
            compared: 4,
            max_abs_diff: Some(max),
            mean_abs_diff: Some(max / 2.0),
            argmax_mismatch_share: None,
        }],
        model: None,
        adapter: None,
    };
    {
        let store = tito::store::open(&url).expect("open");
        for c in store_support::branching("t") {
            store.append_call(c).await.expect("append");
        }
        store
            .set_replays("t", vec![report(0, 0.5), report(1, 0.25)])
            .await
            .expect("replays");
        store
            .set_replays("t", vec![report(1, 0.125)])
            .await
            .expect("replace");
        assert!(matches!(
            store.set_replays("nope", vec![report(0, 0.0)]).await,
            Err(StoreError::NotFound(_))
        ));
    }
    let store = tito::store::open(&url).expect("reopen");
    let t = store.get_trajectory("t").await.expect("get").expect("t");
    assert_eq!(t.replays, vec![report(0, 0.5), report(1, 0.125)]);
}

/// With complete groups, a page holds whole groups even when their members
/// were created interleaved: workers sharing a consumer each get whole GRPO
/// groups.
#[tokio::test]
async fn complete_group_pages_never_split_a_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        for i in 0..4 {
            for g in 0..3 {
                let id = format!("g{g}-{i}");
                store
                    .set_metadata(&id, &in_group(&format!("g{g}")))
                    .await
                    .expect("metadata");
                store
                    .append_call(call(&id, 0, 0, None, ids(1, 3), ids(10, 2)))
                    .await
                    .expect("append");
                store.finish(&id).await.expect("finish");
            }
        }
        let f = TrajectoryFilter {
            complete_groups: true,
            ..Default::default()
        };
        let mut seen = BTreeSet::new();
        for _ in 0..3 {
            let page = store.lease("w", &f, 1, 60_000).await.expect("lease");
            assert_eq!(page.ids.len(), 4, "{name}: one whole group per page");
            let group = &page.ids[0][..2];
            assert!(
                page.ids.iter().all(|id| id.starts_with(group)),
                "{name}: {page:?}"
            );
            assert!(
                seen.insert(group.to_string()),
                "{name}: {group} served twice"
            );
        }
        let page = store.lease("w", &f, 1, 60_000).await.expect("lease");
        assert!(page.ids.is_empty(), "{name}");
        // Without the group filter the limit counts trajectories.
        let plain = store
            .lease("v", &TrajectoryFilter::default(), 5, 60_000)
            .await
            .expect("lease");
        assert_eq!(plain.ids.len(), 5, "{name}");
    }
}

/// Leases one page of everything the consumer can lease now, and acks it.
async fn lease_and_ack(store: &DynStore, consumer: &str) -> BTreeSet<String> {
    let f = TrajectoryFilter::default();
    let page = store
        .lease(consumer, &f, 1000, 60_000)
        .await
        .expect("lease");
    if let Some(cursor) = &page.cursor {
        store.ack(consumer, cursor).await.expect("ack");
    }
    page.ids.into_iter().collect()
}

/// A consumer that has acknowledged everything finished still gets the
/// trajectories that finish later, however old: ones created before
/// everything it acknowledged, and ones below a page a crashed worker never
/// acknowledged. (The SQL stores keep a mark per consumer that a lease
/// starts above; see `store::sqlite::consumers`.)
#[tokio::test]
async fn trajectories_finished_late_are_leased_after_newer_ones_were_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store) in stores(&dir) {
        let active = |id: &'static str| call(id, 0, 0, None, ids(1, 3), ids(10, 2));
        // Oldest first: two that stay active for now, then five finished.
        store.append_call(active("late-a")).await.expect("append");
        store.append_call(active("late-b")).await.expect("append");
        let all = finished(&store, 5).await;
        assert_eq!(lease_and_ack(&store, "c").await, all, "{name}");
        assert!(lease_and_ack(&store, "c").await.is_empty(), "{name}");

        store.finish("late-b").await.expect("finish");
        assert_eq!(
            lease_and_ack(&store, "c").await,
            BTreeSet::from(["late-b".to_string()]),
            "{name}"
        );
        // A page leased and never acknowledged (its lease over at once),
        // then a newer trajectory leased (through a group filter that leaves
        // the old page out) and acknowledged: the old page is served again.
        store.finish("late-a").await.expect("finish");
        let f = TrajectoryFilter::default();
        let lost = store.lease("c", &f, 1000, 0).await.expect("lease");
        assert_eq!(lost.ids, vec!["late-a".to_string()], "{name}");
        store
            .set_metadata("newest", &in_group("g"))
            .await
            .expect("metadata");
        store.append_call(active("newest")).await.expect("append");
        store.finish("newest").await.expect("finish");
        let in_g = TrajectoryFilter {
            group: Some("g".into()),
            ..Default::default()
        };
        let newest = store.lease("c", &in_g, 1000, 60_000).await.expect("lease");
        assert_eq!(newest.ids, vec!["newest".to_string()], "{name}");
        let cursor = newest.cursor.expect("cursor");
        store.ack("c", &cursor).await.expect("ack");
        assert_eq!(
            lease_and_ack(&store, "c").await,
            BTreeSet::from(["late-a".to_string()]),
            "{name}"
        );
        assert!(lease_and_ack(&store, "c").await.is_empty(), "{name}");
        // Another consumer still reads everything.
        assert_eq!(lease_and_ack(&store, "d").await.len(), 8, "{name}");
    }
}
