//! Images in the span store, on every implementation (memory, SQLite,
//! PostgreSQL): stored once by SHA-256, read back byte for byte, named by
//! calls that read back equal, and a call naming an image not stored is
//! refused; plus reopening and migrating a SQLite file, and replicas of one
//! PostgreSQL database storing the same images at once.

mod store_support;

use std::sync::Arc;

use store_support::{call, ids, image, image_ref, pg_session, postgres_url, sha256_hex};
use tito::store::sqlite::schema;
use tito::store::{CallRecord, DynStore, MemoryStore, StoreError, StoredImage, TrajectoryFilter};

/// Where a store keeps its rows, for counting them behind its back.
enum Backing {
    Memory,
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

fn stores(dir: &tempfile::TempDir) -> Vec<(&'static str, DynStore, Backing)> {
    let path = dir.path().join("spans.db");
    let pg = postgres_url();
    vec![
        (
            "memory",
            Arc::new(MemoryStore::new()) as DynStore,
            Backing::Memory,
        ),
        (
            "sqlite",
            tito::store::open(&format!("sqlite://{}", path.display())).expect("open sqlite"),
            Backing::Sqlite(path),
        ),
        (
            "postgres",
            tito::store::open(&pg).expect("open postgres"),
            Backing::Postgres(pg),
        ),
    ]
}

/// Rows in the store's `images` table; `None` for the memory store.
async fn image_rows(backing: &Backing) -> Option<i64> {
    match backing {
        Backing::Memory => None,
        Backing::Sqlite(path) => {
            let conn = rusqlite::Connection::open(path).expect("raw open");
            Some(
                conn.query_row("SELECT count(*) FROM images", [], |r| r.get(0))
                    .expect("count"),
            )
        }
        Backing::Postgres(url) => {
            let client = pg_session(url).await;
            let row = client
                .query_one("SELECT count(*) FROM images", &[])
                .await
                .expect("count");
            Some(row.get(0))
        }
    }
}

/// A chain of three calls of `traj`, each naming `images` (call 2 names
/// the first one twice, as a prompt showing one image twice does).
fn calls_naming(traj: &str, images: &[&StoredImage]) -> Vec<CallRecord> {
    (0..3u32)
        .map(|i| {
            let mut c = call(
                traj,
                i,
                0,
                i.checked_sub(1),
                ids(10 * i, 4),
                ids(500 + i, 3),
            );
            c.images = images.iter().map(|img| image_ref(img)).collect();
            if i == 2 {
                c.images.push(image_ref(images[0]));
            }
            c
        })
        .collect()
}

/// `got` is `want`, and its bytes hash to its key.
fn assert_intact(name: &str, got: Option<StoredImage>, want: &StoredImage) {
    let got = got.unwrap_or_else(|| panic!("{name}: image {} not found", want.sha256));
    assert_eq!(&got, want, "{name}");
    assert_eq!(
        sha256_hex(&got.bytes),
        got.sha256,
        "{name}: bytes hash to the key"
    );
}

#[tokio::test]
async fn an_image_is_stored_once_and_calls_naming_it_read_back_equal() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store, backing) in stores(&dir) {
        let a = image(1, 20_000);
        let b = image(2, 300);
        store
            .put_images(std::slice::from_ref(&a))
            .await
            .expect("put");
        // Again, and twice in one call: each is stored once.
        store
            .put_images(&[a.clone(), b.clone(), a.clone()])
            .await
            .expect("put again");
        store.put_images(&[]).await.expect("put nothing");
        if let Some(rows) = image_rows(&backing).await {
            assert_eq!(rows, 2, "{name}: one row per image");
        }
        assert_intact(name, store.image(&a.sha256).await.expect("image"), &a);
        assert_intact(name, store.image(&b.sha256).await.expect("image"), &b);
        let unknown = sha256_hex(b"never stored");
        assert_eq!(store.image(&unknown).await.expect("image"), None, "{name}");

        let calls = calls_naming("t-img", &[&a, &b]);
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
        let t = store
            .get_trajectory("t-img")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(t.calls, calls, "{name}");
        let latest = store.latest_calls("t-img", 2).await.expect("latest");
        assert_eq!(latest, calls[1..].to_vec(), "{name}");
        // The export scan keeps image references (only bodies are left out).
        let scanned: Vec<_> = store
            .scan(&TrajectoryFilter::default())
            .expect("scan")
            .map(|t| t.expect("scan reads"))
            .collect();
        let scanned_images: Vec<_> = scanned[0].calls.iter().map(|c| c.images.clone()).collect();
        let want: Vec<_> = calls.iter().map(|c| c.images.clone()).collect();
        assert_eq!(scanned_images, want, "{name}");
        // A text call keeps no images.
        store
            .append_call(call("t-text", 0, 0, None, ids(1, 2), ids(3, 2)))
            .await
            .expect("text call");
        let text = store.get_trajectory("t-text").await.expect("get");
        assert_eq!(text.expect("stored").calls[0].images, [], "{name}");
    }
}

#[tokio::test]
async fn a_call_naming_an_image_not_stored_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, store, _) in stores(&dir) {
        let stored = image(3, 1000);
        let missing = image(4, 1000);
        store
            .put_images(std::slice::from_ref(&stored))
            .await
            .expect("put");

        // A new trajectory's first call: refused, and no trajectory made.
        let mut first = call("t-new", 0, 0, None, ids(1, 2), ids(3, 2));
        first.images = vec![image_ref(&stored), image_ref(&missing)];
        match store.append_call(first).await {
            Err(StoreError::Invalid(msg)) => {
                assert!(msg.contains(&missing.sha256), "{name}: {msg}");
                assert!(!msg.contains(&stored.sha256), "{name}: {msg}");
            }
            other => panic!("{name}: {other:?}"),
        }
        assert!(
            store.get_meta("t-new").await.expect("meta").is_none(),
            "{name}"
        );

        // A later call of a stored trajectory: refused, the first kept.
        let mut root = call("t-old", 0, 0, None, ids(1, 2), ids(3, 2));
        root.images = vec![image_ref(&stored)];
        store.append_call(root.clone()).await.expect("root");
        let mut next = call("t-old", 1, 0, Some(0), ids(5, 2), ids(7, 2));
        next.images = vec![image_ref(&missing)];
        let refused = store.append_call(next.clone()).await;
        assert!(
            matches!(&refused, Err(StoreError::Invalid(m)) if m.contains(&missing.sha256)),
            "{name}: {refused:?}"
        );
        let t = store.get_trajectory("t-old").await.expect("get");
        assert_eq!(t.expect("stored").calls, [root], "{name}");

        // Once the image is stored, the same call goes in.
        store
            .put_images(std::slice::from_ref(&missing))
            .await
            .expect("put");
        store.append_call(next).await.expect("now stored");

        // An image whose key is not the hash of its bytes is refused.
        let mut forged = image(5, 100);
        forged.sha256 = stored.sha256.clone();
        let bad = store.put_images(&[forged]).await;
        assert!(
            matches!(bad, Err(StoreError::Invalid(_))),
            "{name}: {bad:?}"
        );
        assert_intact(
            name,
            store.image(&stored.sha256).await.expect("image"),
            &stored,
        );
    }
}

#[tokio::test]
async fn a_reopened_sqlite_file_keeps_images_and_the_calls_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("spans.db");
    let url = format!("sqlite://{}", path.display());
    let a = image(6, 70_000);
    let calls = calls_naming("t-reopen", &[&a]);
    {
        let store = tito::store::open(&url).expect("open");
        store
            .put_images(std::slice::from_ref(&a))
            .await
            .expect("put");
        for c in &calls {
            store.append_call(c.clone()).await.expect("append");
        }
    }
    let store = tito::store::open(&url).expect("reopen");
    store
        .put_images(std::slice::from_ref(&a))
        .await
        .expect("put after reopen");
    assert_eq!(
        image_rows(&Backing::Sqlite(path)).await,
        Some(1),
        "still stored once"
    );
    assert_intact("sqlite", store.image(&a.sha256).await.expect("image"), &a);
    let t = store.get_trajectory("t-reopen").await.expect("get");
    assert_eq!(t.expect("stored").calls, calls);
}

/// A SQLite file from before images (schema 14) gains the table and the
/// column on open: its calls read back without images, new calls keep
/// theirs.
#[tokio::test]
async fn a_sqlite_file_from_before_images_gains_them_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    let url = format!("sqlite://{}", path.display());
    let old = call("t-old", 0, 0, None, ids(1, 3), ids(4, 2));
    {
        let mut conn = rusqlite::Connection::open(&path).expect("raw open");
        assert_eq!(schema::migrate_to(&mut conn, 14).expect("v14"), 14);
        let has_images: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'images'",
                [],
                |r| r.get(0),
            )
            .expect("query");
        assert_eq!(has_images, 0, "schema 14 has no images table");
    }
    {
        // Written by a store, then the version set back (the columns of
        // later migrations dropped too): a file a tito of schema 14 wrote
        // holds exactly these rows.
        let store = tito::store::open(&url).expect("open");
        store.append_call(old.clone()).await.expect("append");
    }
    {
        let conn = rusqlite::Connection::open(&path).expect("raw open");
        conn.execute_batch(
            "ALTER TABLE calls DROP COLUMN model; ALTER TABLE calls DROP COLUMN adapter; \
             DROP TABLE images; ALTER TABLE calls DROP COLUMN images; PRAGMA user_version = 14;",
        )
        .expect("back to schema 14");
    }
    let store = tito::store::open(&url).expect("open migrates");
    let t = store.get_trajectory("t-old").await.expect("get");
    assert_eq!(t.expect("stored").calls, [old]);
    let a = image(7, 500);
    store
        .put_images(std::slice::from_ref(&a))
        .await
        .expect("put");
    let mut next = call("t-old", 1, 0, Some(0), ids(9, 2), ids(11, 2));
    next.images = vec![image_ref(&a)];
    store.append_call(next.clone()).await.expect("append");
    let t = store.get_trajectory("t-old").await.expect("get");
    assert_eq!(t.expect("stored").calls[1], next);
    assert_intact("sqlite", store.image(&a.sha256).await.expect("image"), &a);
}

/// Two replicas of one database store the same images at once, in opposite
/// orders, and append calls naming them: every put and append succeeds,
/// each image is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_storing_the_same_images_at_once_store_each_once() {
    let url = postgres_url();
    let replicas: Vec<DynStore> = (0..2)
        .map(|_| tito::store::open(&url).expect("open postgres"))
        .collect();
    let images: Vec<StoredImage> = (0..12).map(|i| image(100 + i, 2000)).collect();
    let mut tasks = Vec::new();
    for (r, store) in replicas.iter().enumerate() {
        for k in 0..images.len() {
            let store = store.clone();
            let mut mine = images.clone();
            if r == 1 {
                mine.reverse();
            }
            let one = mine[k].clone();
            let pair = [one.clone(), mine[(k + 1) % mine.len()].clone()];
            tasks.push(tokio::spawn(async move {
                store.put_images(&pair).await.expect("put");
                let mut c = call(&format!("r{r}-{k}"), 0, 0, None, ids(1, 2), ids(3, 2));
                c.images = pair.iter().map(image_ref).collect();
                store.append_call(c.clone()).await.expect("append");
                c
            }));
        }
    }
    let mut calls = Vec::new();
    for t in tasks {
        calls.push(t.await.expect("task"));
    }
    assert_eq!(
        image_rows(&Backing::Postgres(url.clone())).await,
        Some(images.len() as i64)
    );
    for c in &calls {
        let t = replicas[0]
            .get_trajectory(&c.trajectory_id)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(&t.calls[0], c);
    }
    for want in &images {
        let got = replicas[1].image(&want.sha256).await.expect("image");
        assert_intact("postgres", got, want);
    }
}

/// With `ack = "queued"` (SQLite) a put returns once queued, as an append
/// does, and the writer applies it before the calls queued after it.
#[tokio::test]
async fn queued_images_are_applied_before_the_calls_queued_after_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let store = tito::store::open_with(&url, tito::store::Ack::Queued).expect("open");
    let a = image(8, 5000);
    let calls = calls_naming("t-queued", &[&a]);
    store
        .put_images(std::slice::from_ref(&a))
        .await
        .expect("queued");
    for c in &calls {
        store.append_call(c.clone()).await.expect("queued");
    }
    // A committed write after them: the writer has handled the queue.
    store.set_weight_version("v1").await.expect("committed");
    let t = store.get_trajectory("t-queued").await.expect("get");
    let t = t.expect("stored");
    assert!(!t.meta.incomplete);
    assert_eq!(t.calls, calls);
    assert_intact("sqlite", store.image(&a.sha256).await.expect("image"), &a);
}
