//! PostgreSQL specifics: several stores (one per gateway replica) writing one
//! database never both store one call slot, share consumer leases without
//! overlap, and a database from a newer tito is refused.

mod store_support;

use std::collections::BTreeSet;

use store_support::{call, ids, postgres_url};
use tito::store::{DynStore, StoreError, TrajectoryFilter};

fn replicas(n: usize) -> (String, Vec<DynStore>) {
    let url = postgres_url();
    let stores = (0..n)
        .map(|_| tito::store::open(&url).expect("open postgres"))
        .collect();
    (url, stores)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_racing_for_one_call_slot_store_it_once() {
    let (_, stores) = replicas(2);
    let mut tasks = Vec::new();
    for t in 0..40u32 {
        for (r, store) in stores.iter().enumerate() {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                // Both replicas write call 0 and 1 of the same trajectory,
                // with different sampled ids, so the stored row names its
                // writer.
                let id = format!("race-{t}");
                let base = 1000 * (r as u32 + 1);
                let first = store
                    .append_call(call(&id, 0, 0, None, ids(1, 4), ids(base, 3)))
                    .await;
                let second = store
                    .append_call(call(&id, 1, 0, Some(0), ids(9, 2), ids(base + 10, 2)))
                    .await;
                (id, r, first, second)
            }));
        }
    }
    let mut winners = std::collections::HashMap::new();
    for task in tasks {
        let (id, r, first, second) = task.await.expect("task");
        for (slot, result) in [(0u32, first), (1, second)] {
            match result {
                Ok(()) => {
                    let before = winners.insert((id.clone(), slot), r);
                    assert!(before.is_none(), "{id} call {slot} stored twice");
                }
                Err(StoreError::Duplicate { call, .. }) => assert_eq!(call, slot),
                Err(e) => panic!("{id} call {slot}: {e}"),
            }
        }
    }
    assert_eq!(winners.len(), 80, "every slot stored exactly once");
    for t in 0..40u32 {
        let id = format!("race-{t}");
        let traj = stores[1]
            .get_trajectory(&id)
            .await
            .expect("read")
            .expect("exists");
        assert_eq!(traj.calls.len(), 2);
        assert_eq!(traj.meta.num_calls, 2);
        assert_eq!(traj.meta.next_call_index, 2);
        for c in &traj.calls {
            let r = winners[&(id.clone(), c.call_index)] as u32;
            let base = 1000 * (r + 1) + 10 * c.call_index;
            assert_eq!(c.sampled_ids[0], base, "{id} call {}", c.call_index);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_of_one_consumer_on_two_replicas_lease_disjoint_pages() {
    let (_, stores) = replicas(2);
    let mut all = BTreeSet::new();
    for i in 0..60u32 {
        let id = format!("t-{i:03}");
        stores[0]
            .append_call(call(&id, 0, 0, None, ids(1, 2), ids(3, 2)))
            .await
            .expect("append");
        stores[0].finish(&id).await.expect("finish");
        all.insert(id);
    }
    let mut tasks = Vec::new();
    for store in stores.iter().cycle().take(4) {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let lease = store
                    .lease("trainer", &TrajectoryFilter::default(), 7, 60_000)
                    .await
                    .expect("lease");
                let Some(cursor) = lease.cursor else { break };
                got.extend(lease.ids);
                store.ack("trainer", &cursor).await.expect("ack");
            }
            got
        }));
    }
    let mut seen = BTreeSet::new();
    for task in tasks {
        for id in task.await.expect("worker") {
            assert!(seen.insert(id.clone()), "{id} leased twice");
        }
    }
    assert_eq!(seen, all);
}

/// One replica finishes trajectories, in an order unlike their creation,
/// while workers on both replicas lease and ack: every finished trajectory
/// is leased exactly once. An ack moves the consumer's mark; a finish
/// numbers itself so that leases look below the mark for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishes_on_one_replica_racing_acks_on_another_lose_nothing() {
    let (_, stores) = replicas(2);
    let n = 300u32;
    for i in 0..n {
        stores[0]
            .append_call(call(&format!("t-{i:03}"), 0, 0, None, ids(1, 2), ids(3, 2)))
            .await
            .expect("append");
    }
    let finisher = {
        let store = stores[0].clone();
        tokio::spawn(async move {
            // Odd ones newest first, then even ones oldest first.
            let odd = (0..n).rev().filter(|i| i % 2 == 1);
            for i in odd.chain((0..n).filter(|i| i % 2 == 0)) {
                store.finish(&format!("t-{i:03}")).await.expect("finish");
                tokio::task::yield_now().await;
            }
        })
    };
    let worker = |store: DynStore| async move {
        let mut got = Vec::new();
        let f = TrajectoryFilter::default();
        let lease = store.lease("trainer", &f, 5, 60_000).await.expect("lease");
        if let Some(cursor) = lease.cursor {
            got.extend(lease.ids);
            store.ack("trainer", &cursor).await.expect("ack");
        }
        got
    };
    let mut seen = BTreeSet::new();
    let mut take = |got: Vec<String>| {
        for id in got {
            assert!(seen.insert(id.clone()), "{id} leased twice");
        }
    };
    // Rounds of one lease and ack on each replica, while finishes go on.
    while !finisher.is_finished() {
        let (a, b) = tokio::join!(worker(stores[0].clone()), worker(stores[1].clone()));
        take(a);
        take(b);
    }
    finisher.await.expect("finisher");
    // Everything is finished now: drain what is left.
    loop {
        let got = worker(stores[1].clone()).await;
        if got.is_empty() {
            break;
        }
        take(got);
    }
    assert_eq!(
        seen.len(),
        n as usize,
        "every finished trajectory leased once"
    );
}

/// Another replica's finish still in its transaction when an ack comes:
/// the ack cannot take the marks lock, so it leaves the mark where it was
/// (it never waits), and the trajectory is leased once its finish commits.
/// An ack that moved the mark would see a later finish's number committed
/// and take the earlier one as seen.
#[tokio::test]
async fn an_ack_leaves_the_mark_while_another_replica_finishes() {
    let url = postgres_url();
    let store = tito::store::open(&url).expect("open");
    for id in ["x", "y"] {
        store
            .append_call(call(id, 0, 0, None, ids(1, 2), ids(3, 2)))
            .await
            .expect("append");
    }
    // The other replica: `x`'s finish, as a store's writer runs it, not
    // yet committed.
    let replica = store_support::pg_session(&url).await;
    let lock = tito::store::postgres::MARKS_LOCK;
    replica.batch_execute("BEGIN").await.expect("begin");
    replica
        .execute("SELECT pg_advisory_xact_lock_shared($1)", &[&lock])
        .await
        .expect("shared lock");
    replica
        .batch_execute(
            "UPDATE trajectories SET status = 1, \
             fseq = nextval('trajectories_finish_order') WHERE id = 'x'",
        )
        .await
        .expect("finish x");
    store.finish("y").await.expect("finish y");
    let f = TrajectoryFilter::default();
    let page = store.lease("c", &f, 100, 60_000).await.expect("lease");
    assert_eq!(page.ids, ["y"]);
    let cursor = page.cursor.expect("cursor");
    store
        .ack("c", &cursor)
        .await
        .expect("the ack does not wait");
    replica.batch_execute("COMMIT").await.expect("commit x");
    let page = store.lease("c", &f, 100, 60_000).await.expect("lease");
    assert_eq!(page.ids, ["x"], "x finished before the ack committed");
    // With nothing in flight, the next ack moves the mark past both.
    store
        .ack("c", &page.cursor.expect("cursor"))
        .await
        .expect("ack");
    assert!(store
        .lease("c", &f, 100, 60_000)
        .await
        .expect("lease")
        .ids
        .is_empty());
}

/// A batch whose marks lock times out (the database's `lock_timeout`) fails
/// alone: its transaction is rolled back, so the replica's next batches
/// commit.
#[tokio::test]
async fn a_marks_lock_that_times_out_fails_only_its_batch() {
    let url = postgres_url();
    let admin = store_support::pg_session(&url).await;
    // Another session holds the marks lock; this replica waits 100 ms.
    let lock = tito::store::postgres::MARKS_LOCK;
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&lock])
        .await
        .expect("lock");
    let store = tito::store::open(&format!("{url}?options=-c%20lock_timeout%3D100")).expect("open");
    store
        .append_call(call("a", 0, 0, None, ids(1, 2), ids(3, 2)))
        .await
        .expect("an append takes no marks lock");
    assert!(store.finish("a").await.is_err(), "the lock timed out");
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&lock])
        .await
        .expect("unlock");
    store
        .append_call(call("b", 0, 0, None, ids(1, 2), ids(3, 2)))
        .await
        .expect("the next batch commits");
    store.finish("a").await.expect("finish after the lock");
}

#[tokio::test]
async fn reopening_keeps_everything_and_a_newer_schema_is_refused() {
    let (url, stores) = replicas(1);
    let store = stores.into_iter().next().expect("store");
    for c in store_support::branching("kept") {
        store.append_call(c).await.expect("append");
    }
    let before = store.get_trajectory("kept").await.expect("read");
    drop(store);
    let store = tito::store::open(&url).expect("reopen");
    assert_eq!(store.get_trajectory("kept").await.expect("read"), before);
    drop(store);

    let newer = i64::from(tito::store::postgres::SCHEMA_VERSION) + 1;
    let admin = url.clone();
    let indexes = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let client = store_support::pg_session(&admin).await;
            let indexes: Vec<(String, String)> = client
                .query(
                    "SELECT indexname, indexdef FROM pg_indexes \
                     WHERE tablename = 'trajectories' ORDER BY indexname",
                    &[],
                )
                .await
                .expect("indexes")
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            client
                .execute("UPDATE tito_schema SET version = $1", &[&newer])
                .await
                .expect("bump version");
            indexes
        })
    })
    .join()
    .expect("thread");
    // Migration 2 dropped the status index (no query needs it, and each
    // call's `updated_at` moved its entry), made the group index partial
    // and indexed the order of finishes (finished trajectories only).
    // Migration 3 indexed the listing key, and the rows not given one yet.
    let names: Vec<&str> = indexes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "trajectories_fseq",
            "trajectories_group",
            "trajectories_id_key",
            "trajectories_lseq",
            "trajectories_pkey",
            "trajectories_unlisted"
        ]
    );
    for (def, partial) in [
        (&indexes[0].1, "WHERE (fseq IS NOT NULL)"),
        (&indexes[1].1, "WHERE (group_id IS NOT NULL)"),
        (&indexes[5].1, "WHERE (lseq IS NULL)"),
    ] {
        assert!(def.ends_with(partial), "{def}");
    }
    match tito::store::open(&url) {
        Err(StoreError::Schema(e)) => assert!(e.contains("upgrade tito"), "{e}"),
        Err(e) => panic!("expected a schema error, got {e}"),
        Ok(_) => panic!("opened a database from a newer schema"),
    }
}

/// Two replicas put one trajectory in two different groups at the same
/// time: one wins and the other gets a conflict, as on one replica. Without
/// a row lock both read "no group" and both succeed, the second overwriting
/// the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_setting_a_group_at_once_cannot_both_win() {
    use tito::store::TrajectoryMetadata;
    let (_, stores) = replicas(2);
    for t in 0..50u32 {
        let id = format!("grouped-{t}");
        stores[0]
            .append_call(call(&id, 0, 0, None, ids(1, 4), ids(5, 3)))
            .await
            .expect("the trajectory exists before the race");
        let set = |r: usize| {
            let store = stores[r].clone();
            let id = id.clone();
            async move {
                let update = TrajectoryMetadata {
                    group: Some(format!("g{r}")),
                    ..Default::default()
                };
                store.set_metadata(&id, &update).await
            }
        };
        let (a, b) = tokio::join!(tokio::spawn(set(0)), tokio::spawn(set(1)));
        let results = [a.expect("task"), b.expect("task")];
        let won: Vec<usize> = (0..2).filter(|&r| results[r].is_ok()).collect();
        assert_eq!(won.len(), 1, "{id}: exactly one group is set: {results:?}");
        assert!(
            matches!(&results[1 - won[0]], Err(StoreError::Conflict(_))),
            "{id}: {results:?}"
        );
        let stored = stores[0]
            .get_trajectory(&id)
            .await
            .expect("read")
            .expect("exists");
        assert_eq!(
            stored.meta.metadata.group,
            Some(format!("g{}", won[0])),
            "{id}"
        );
    }
}
