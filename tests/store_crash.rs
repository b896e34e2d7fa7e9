//! Crash test: a child process (this test binary, re-invoked on the ignored
//! `crash_child` entry) appends calls from many concurrent tasks and prints
//! each call once `append_call` has returned; the parent SIGKILLs it mid-way,
//! reopens the store and checks that every acknowledged call is there, intact,
//! and that the database passes `PRAGMA integrity_check`. The
//! `crash_images_child` entry does the same with calls naming images it
//! stores as it goes: every acknowledged call's images survive, byte for
//! byte.

mod store_support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use store_support::{call, ids, image, image_ref, sha256_hex};
use tito::store::{Ack, StoredImage, TrajectoryFilter};

const DB_ENV: &str = "TITO_CRASH_CHILD_DB";
/// Set (to anything) for a child running as a gateway with `ack = "queued"`.
const QUEUED_ENV: &str = "TITO_CRASH_CHILD_QUEUED";
/// Set (to anything) for a child whose store `fsync`s every commit
/// (`?synchronous=full`).
const FULL_ENV: &str = "TITO_CRASH_CHILD_FULL";
const WORKERS: u32 = 16;

/// Deterministic content of call `i` of worker `w`, checked after the crash.
fn record(w: u32, i: u32) -> tito::store::CallRecord {
    call(
        &format!("w-{w}"),
        i,
        0,
        i.checked_sub(1),
        ids(w * 100_000 + i * 10, 8),
        ids(w * 100_000 + i * 10 + 5000, 16),
    )
}

/// The child: appends forever (until killed) and acknowledges on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "helper process of crash_kill9_keeps_every_acknowledged_call"]
async fn crash_child() {
    // An entry point, not a test: without the variable (e.g. under
    // `--include-ignored`) there is nothing to do.
    let Ok(path) = std::env::var(DB_ENV) else {
        return;
    };
    let queued = std::env::var(QUEUED_ENV).is_ok();
    let ack = if queued { Ack::Queued } else { Ack::Committed };
    let sync = if std::env::var(FULL_ENV).is_ok() {
        "?synchronous=full"
    } else {
        ""
    };
    let store =
        tito::store::open_with(&format!("sqlite://{path}{sync}"), ack).expect("child opens store");
    if queued {
        // As `tito serve` does before taking calls.
        store.begin_run(ack).await.expect("begin run");
    }
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1_000_000u32 {
                store.append_call(record(w, i)).await.expect("append");
                let mut out = std::io::stdout().lock();
                writeln!(out, "ACK {w} {i} END").expect("stdout");
                out.flush().expect("flush");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
}

/// Runs the child on `db` until it has acknowledged 600 calls, then
/// SIGKILLs it; returns every call it acknowledged.
fn run_and_kill_child(db: &std::path::Path, queued: bool) -> BTreeSet<(u32, u32)> {
    run_and_kill_child_at(db, queued, false)
}

/// [`run_and_kill_child`], with `full`: the child's store at
/// `synchronous=full`.
fn run_and_kill_child_at(db: &std::path::Path, queued: bool, full: bool) -> BTreeSet<(u32, u32)> {
    run_and_kill_entry(db, "crash_child", queued, full)
}

/// [`run_and_kill_child_at`] on the child entry `entry`.
fn run_and_kill_entry(
    db: &std::path::Path,
    entry: &str,
    queued: bool,
    full: bool,
) -> BTreeSet<(u32, u32)> {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    if queued {
        cmd.env(QUEUED_ENV, "1");
    }
    if full {
        cmd.env(FULL_ENV, "1");
    }
    let mut child = cmd
        .args([
            "--exact",
            entry,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DB_ENV, db)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut acked = BTreeSet::new();
    // Read acknowledgements until enough calls are in, then kill -9.
    while acked.len() < 600 {
        let line = lines
            .next()
            .expect("child ended before being killed")
            .expect("read line");
        if let Some((w, i)) = parse_ack(&line) {
            acked.insert((w, i));
        }
    }
    child.kill().expect("SIGKILL child");
    // Lines already in the pipe were printed after their commit: they count.
    for line in lines.map_while(Result::ok) {
        if let Some((w, i)) = parse_ack(&line) {
            acked.insert((w, i));
        }
    }
    let status = child.wait().expect("reap child");
    assert!(!status.success(), "child was killed, not finished");
    acked
}

#[tokio::test]
async fn crash_kill9_keeps_every_acknowledged_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("spans.db");
    let acked = run_and_kill_child(&db, false);
    every_acknowledged_call_is_stored(&db, &acked).await;
}

/// The same at `synchronous=full`, where each commit also `fsync`s the WAL.
#[tokio::test]
async fn crash_kill9_keeps_every_acknowledged_call_at_synchronous_full() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("spans.db");
    let acked = run_and_kill_child_at(&db, false, true);
    every_acknowledged_call_is_stored(&db, &acked).await;
}

/// The database at `db` is intact and holds every call in `acked`, each
/// with its content, each worker's calls a prefix of its chain.
async fn every_acknowledged_call_is_stored(db: &std::path::Path, acked: &BTreeSet<(u32, u32)>) {
    let conn = rusqlite::Connection::open(db).expect("raw open");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
    drop(conn);

    let store = tito::store::open(&format!("sqlite://{}", db.display())).expect("reopen");
    let mut stored = BTreeSet::new();
    for t in stored_whole(&store).await {
        let w: u32 = t
            .meta
            .id
            .trim_start_matches("w-")
            .parse()
            .expect("worker id");
        for c in &t.calls {
            assert_eq!(c, &record(w, c.call_index), "call content intact");
            stored.insert((w, c.call_index));
        }
        // Per worker, calls are appended in order: stored calls are a prefix.
        let n = t.calls.len() as u32;
        assert_eq!(t.calls.last().map(|c| c.call_index + 1), Some(n));
        assert!(t.samples().is_ok());
    }
    let missing: Vec<_> = acked.difference(&stored).collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    assert!(stored.len() >= acked.len());
}

/// Every stored trajectory, bodies included (the export scan that lists
/// them leaves bodies out).
async fn stored_whole(store: &tito::store::DynStore) -> Vec<tito::store::Trajectory> {
    let mut out = Vec::new();
    for t in store.scan(&TrajectoryFilter::default()).expect("scan") {
        let id = t.expect("trajectory reads").meta.id;
        let t = store.get_trajectory(&id).await.expect("get");
        out.push(t.expect("stored"));
    }
    out
}

fn parse_ack(line: &str) -> Option<(u32, u32)> {
    let mut parts = line.split(' ');
    if parts.next()? != "ACK" {
        return None;
    }
    let w = parts.next()?.parse().ok()?;
    let i = parts.next()?.parse().ok()?;
    (parts.next()? == "END").then_some((w, i))
}

#[tokio::test]
async fn crash_of_a_queued_run_marks_its_active_trajectories_incomplete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("spans.db");
    let url = format!("sqlite://{}", db.display());
    // An earlier, clean queued run: w-99 finished, w-98 still active.
    {
        let store = tito::store::open_with(&url, Ack::Queued).expect("open");
        assert_eq!(store.begin_run(Ack::Queued).await.expect("begin"), 0);
        store.append_call(record(99, 0)).await.expect("append");
        store.finish("w-99").await.expect("finish");
        store.append_call(record(98, 0)).await.expect("append");
    }
    let acked = run_and_kill_child(&db, true);
    assert!(acked.len() >= 600);

    // Queued appends may all have been lost with the child; whatever is in
    // the store and active is marked, the finished trajectory is not.
    let active: i64 = rusqlite::Connection::open(&db)
        .expect("raw open")
        .query_row(
            "SELECT count(*) FROM trajectories WHERE status = 0",
            [],
            |r| r.get(0),
        )
        .expect("count");
    let store = tito::store::open(&url).expect("reopen");
    let marked = store.begin_run(Ack::Committed).await.expect("begin");
    assert!(active >= 1);
    assert_eq!(marked as i64, active, "every active trajectory is marked");
    for t in stored_whole(&store).await {
        assert_eq!(t.meta.incomplete, t.meta.id != "w-99", "{}", t.meta.id);
        for c in &t.calls {
            let w: u32 = t
                .meta
                .id
                .trim_start_matches("w-")
                .parse()
                .expect("worker id");
            assert_eq!(c, &record(w, c.call_index), "what was committed is intact");
        }
    }
    drop(store);
    // This run was committed-mode: a crash of it marks nothing more, and a
    // clean end of a queued run marks nothing either.
    let store = tito::store::open(&url).expect("reopen");
    assert_eq!(store.begin_run(Ack::Queued).await.expect("begin"), 0);
    drop(store);
    let store = tito::store::open(&url).expect("reopen");
    assert_eq!(store.begin_run(Ack::Committed).await.expect("begin"), 0);
}

/// With queued acks (SQLite only) a call whose write fails after its client
/// was answered cannot be reported to anyone: its trajectory is marked
/// incomplete, as after a crash.
#[tokio::test]
async fn a_queued_call_that_fails_to_be_stored_marks_its_trajectory_incomplete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    {
        let store = tito::store::open_with(&url, Ack::Queued).expect("open");
        store.append_call(record(1, 0)).await.expect("queued");
        store.append_call(record(2, 0)).await.expect("queued");
        // Call 1 was never stored: call 2 names a parent the store lacks.
        store.append_call(record(1, 2)).await.expect("queued");
        // A committed write after them: the writer has handled the queue.
        store.set_weight_version("v1").await.expect("committed");
        let meta = |id: &'static str| {
            let store = store.clone();
            async move { store.get_meta(id).await.expect("meta").expect("stored") }
        };
        assert!(meta("w-1").await.incomplete, "{url}");
        assert!(!meta("w-2").await.incomplete, "{url}");
        assert_eq!(
            store
                .get_trajectory("w-1")
                .await
                .expect("get")
                .expect("w-1")
                .calls
                .len(),
            1
        );
    }
}

/// The image worker `w` stores before its call `i` (one per two calls,
/// each named by two calls), 2 to 34 KB, so its bytes span overflow pages.
fn worker_image(w: u32, i: u32) -> StoredImage {
    let k = u64::from(w) << 32 | u64::from(i / 2);
    image(k, 2_000 + (k as usize * 7919) % 32_000)
}

/// The image every worker stores and names.
fn shared_image() -> StoredImage {
    image(u64::MAX, 12_000)
}

/// [`record`], naming [`worker_image`] and [`shared_image`].
fn record_with_images(w: u32, i: u32) -> tito::store::CallRecord {
    let mut c = record(w, i);
    c.images = vec![image_ref(&worker_image(w, i)), image_ref(&shared_image())];
    c
}

/// The image child: each worker stores its images as it goes (all of them
/// the shared one too, at once) and appends calls naming them, printing
/// each call once `append_call` returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "helper process of crash_kill9_keeps_the_images_of_every_acknowledged_call"]
async fn crash_images_child() {
    let Ok(path) = std::env::var(DB_ENV) else {
        return;
    };
    let store = tito::store::open(&format!("sqlite://{path}")).expect("child opens store");
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1_000_000u32 {
                if i % 2 == 0 {
                    let images = [worker_image(w, i), shared_image()];
                    store.put_images(&images).await.expect("put images");
                }
                store
                    .append_call(record_with_images(w, i))
                    .await
                    .expect("append");
                let mut out = std::io::stdout().lock();
                writeln!(out, "ACK {w} {i} END").expect("stdout");
                out.flush().expect("flush");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
}

#[tokio::test]
async fn crash_kill9_keeps_the_images_of_every_acknowledged_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("spans.db");
    let acked = run_and_kill_entry(&db, "crash_images_child", false, false);

    let conn = rusqlite::Connection::open(&db).expect("raw open");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
    drop(conn);
    let store = tito::store::open(&format!("sqlite://{}", db.display())).expect("reopen");
    let mut stored = BTreeSet::new();
    for t in stored_whole(&store).await {
        let w: u32 = t
            .meta
            .id
            .trim_start_matches("w-")
            .parse()
            .expect("worker id");
        for c in &t.calls {
            assert_eq!(
                c,
                &record_with_images(w, c.call_index),
                "call content intact"
            );
            stored.insert((w, c.call_index));
        }
    }
    let missing: Vec<_> = acked.difference(&stored).collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    // Every stored call's images (the acknowledged ones among them) are
    // there, and their bytes hash to their keys.
    for (w, i) in &stored {
        for want in record_with_images(*w, *i).images {
            let got = store
                .image(&want.sha256)
                .await
                .expect("read image")
                .unwrap_or_else(|| panic!("call {i} of w-{w}: image {} lost", want.sha256));
            assert_eq!(sha256_hex(&got.bytes), want.sha256, "bytes hash to the key");
            assert_eq!((got.width, got.height), (want.width, want.height));
        }
    }
}
