//! The WAL-joining VFS: what `COMMIT` returned is in the files, whatever
//! SQLite wrote on the way, and a small transaction is one write.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OpenFlags};

use super::{register, WRITES};

/// Opens `name` (a path, or a `file:` URI) through the VFS.
fn open(name: impl AsRef<Path>, synchronous: &str) -> Connection {
    let vfs = register().expect("the VFS registers");
    let conn = Connection::open_with_flags_and_vfs(name, OpenFlags::default(), vfs).expect("open");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .expect("wal");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "synchronous", synchronous)
        .expect("synchronous");
    conn.execute_batch("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        .expect("table");
    conn
}

/// What a process killed now would leave: the database and its WAL, copied
/// aside, opened with SQLite's default VFS (which recovers the WAL).
fn as_if_killed(db: &Path, scratch: &Path, n: usize) -> Connection {
    let dir = scratch.join(format!("copy-{n}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let copy = dir.join("c.db");
    std::fs::copy(db, &copy).expect("copy db");
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    if wal.exists() {
        std::fs::copy(&wal, dir.join("c.db-wal")).expect("copy wal");
    }
    Connection::open(&copy).expect("open copy")
}

fn rows(conn: &Connection) -> Vec<(i64, Vec<u8>)> {
    let mut stmt = conn
        .prepare("SELECT k, v FROM t ORDER BY k")
        .expect("select");
    let out = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<Vec<_>, _>>()
        .expect("rows");
    out
}

fn value(k: i64, round: u8) -> Vec<u8> {
    let len = 100 + (k as usize * 37) % 3000;
    (0..len).map(|i| (i as u8) ^ (k as u8) ^ round).collect()
}

fn check(conn: &Connection, expected: &[(i64, Vec<u8>)]) {
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity");
    assert_eq!(ok, "ok");
    assert_eq!(rows(conn), expected);
}

/// After each `COMMIT`, a copy of the files holds every committed row, for
/// the writing connection's whole life, across a reopen with frames left in
/// the WAL, and across the WAL starting over after a checkpoint; a reader
/// on the default VFS sees the same. `query`: the URI parameters the
/// database is opened with.
fn commits_survive(synchronous: &str, query: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("s.db");
    let name = format!("file:{}{query}", db.display());
    let mut conn = open(&name, synchronous);
    let reader = Connection::open(&db).expect("reader");
    let mut expected = Vec::new();
    for k in 0..120i64 {
        if k == 40 {
            drop(conn);
            conn = open(&name, synchronous);
        }
        if k == 80 {
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .expect("checkpoint");
        }
        let tx = conn.transaction().expect("begin");
        // One to three rows a transaction: one to a few frames each.
        for j in 0..=(k % 3) {
            let key = k * 3 + j;
            tx.execute(
                "INSERT INTO t (k, v) VALUES (?1, ?2)",
                params![key, value(key, 0)],
            )
            .expect("insert");
            expected.push((key, value(key, 0)));
        }
        tx.commit().expect("commit");
        check(&as_if_killed(&db, dir.path(), k as usize), &expected);
        check(&reader, &expected);
    }
}

#[test]
fn every_commit_is_in_the_files_when_it_returns() {
    commits_survive("NORMAL", "");
}

#[test]
fn every_commit_is_in_the_files_when_it_returns_with_full_sync() {
    commits_survive("FULL", "");
}

/// Without power-safe overwrite (`psow=0`) `synchronous=FULL` pads each
/// commit with copies of its commit frame up to a sector's end, syncing
/// before the copy that crosses it and writing that copy's rest after the
/// sync. SQLite publishes the copies too: a live reader reads them.
#[test]
fn commits_padded_to_a_sector_are_whole_for_a_live_reader() {
    commits_survive("FULL", "?psow=0");
}

/// A transaction larger than the page cache spills frames to the WAL
/// before its commit, then changes those pages again: SQLite overwrites the
/// spilled frames and, after the commit frame, rewrites the checksums of
/// the frames from the first overwritten one on. Those rewrites must be in
/// the file when `COMMIT` returns, or recovery stops at the first frame
/// whose checksum does not match and loses the transaction.
#[test]
fn overwritten_frames_and_rewritten_checksums_are_in_the_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("s.db");
    let mut conn = open(&db, "NORMAL");
    conn.pragma_update(None, "cache_size", 8).expect("cache");
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    let mut expected: Vec<(i64, Vec<u8>)> = Vec::new();
    for round in 0..3u8 {
        let before = std::fs::metadata(&wal).map_or(0, |m| m.len());
        let tx = conn.transaction().expect("begin");
        for k in 0..800i64 {
            tx.execute(
                "INSERT INTO t (k, v) VALUES (?1, ?2) ON CONFLICT(k) DO UPDATE SET v = ?2",
                params![k, value(k, round)],
            )
            .expect("upsert");
        }
        for k in (0..800i64).step_by(3) {
            tx.execute(
                "UPDATE t SET v = ?2 WHERE k = ?1",
                params![k, value(k, round ^ 0x55)],
            )
            .expect("update");
        }
        let spilled = std::fs::metadata(&wal).map_or(0, |m| m.len());
        tx.commit().expect("commit");
        // The WAL grew before the commit: the transaction spilled.
        assert!(
            spilled > before,
            "round {round}: no spill ({before} → {spilled} bytes)"
        );
        expected = (0..800i64)
            .map(|k| {
                let r = if k % 3 == 0 { round ^ 0x55 } else { round };
                (k, value(k, r))
            })
            .collect();
        check(
            &as_if_killed(&db, dir.path(), usize::from(round)),
            &expected,
        );
    }
    drop(conn);
    check(&Connection::open(&db).expect("reopen"), &expected);
}

/// A transaction's frames reach the file in one write (without the VFS:
/// two a frame), unless the database does not report power-safe overwrite
/// (`psow=0`), whose WAL this VFS leaves to the default one (none of its
/// writes pass here).
#[test]
fn a_transaction_is_one_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (query, writes_of_three, writes_of_one) in [("", 1, 1), ("?psow=0", 0, 0)] {
        let db = dir.path().join(format!("s{}.db", query.len()));
        let mut conn = open(format!("file:{}{query}", db.display()), "NORMAL");
        conn.execute_batch("CREATE TABLE u (k INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)")
            .expect("table u");
        let writes = |f: &mut dyn FnMut()| {
            let before = WRITES.with(std::cell::Cell::get);
            f();
            WRITES.with(std::cell::Cell::get) - before
        };
        for k in 1..20i64 {
            // `t`'s leaf, `u`'s leaf and its index's: three frames.
            let three = writes(&mut || {
                let tx = conn.transaction().expect("begin");
                tx.execute(
                    "INSERT INTO t (k, v) VALUES (?1, ?2)",
                    params![k, value(k, 0)],
                )
                .expect("insert t");
                tx.execute(
                    "INSERT INTO u (k, name) VALUES (?1, ?2)",
                    params![k, format!("n{k}")],
                )
                .expect("insert u");
                tx.commit().expect("commit");
            });
            assert_eq!(three, writes_of_three, "three frames of round {k}{query}");
            // `t`'s leaf alone.
            let one = writes(&mut || {
                conn.execute("UPDATE t SET v = x'01' WHERE k = ?1", params![k])
                    .expect("update");
            });
            assert_eq!(one, writes_of_one, "one frame of round {k}{query}");
        }
        // After a truncating checkpoint the WAL starts over: SQLite writes
        // its header and syncs it, then the frame, so two writes.
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .expect("checkpoint");
        let restarted = writes(&mut || {
            conn.execute("UPDATE t SET v = x'02' WHERE k = 1", [])
                .expect("update after restart");
        });
        assert_eq!(restarted, 2 * writes_of_one, "header, frame{query}");
    }
}
