//! WAL checkpoints on a connection and a thread of their own, so that
//! commits seldom wait for one.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its
//! limit, on the writing connection: it `fsync`s the WAL, copies its pages
//! into the database file and `fsync`s that (with `synchronous = NORMAL`
//! the only `fsync`s the store makes), and that commit, with every job
//! queued behind it, waits meanwhile. A passive checkpoint on another
//! connection runs beside the writer instead: it copies only frames that
//! are already committed, and the writer goes on appending to the WAL.
//!
//! After each commit the writer tells the [`Checkpointer`] how many frames
//! the WAL holds ([`Checkpointer::after_commit`]), which asks its thread for
//! a passive checkpoint as often as SQLite's automatic one would have run:
//! every `wal_autocheckpoint` frames of the writing connection (1,000 in
//! SQLite's default build). A checkpoint that ends that many frames or more
//! behind (the commits outran it) runs again at once.
//!
//! The WAL starts over from its beginning only at a commit that finds all
//! of it copied, and a checkpoint leaves behind what was committed while it
//! ran: under commits back to back the WAL would grow without end. So past
//! a limit (`[store] wal_max_bytes`) the commit that crossed it waits for
//! one more checkpoint, which runs with nothing committed meanwhile
//! ([`Checkpointer::run_now`]): it copies what the ones before left behind,
//! and the next commit starts the WAL over. When commits pause, a passive
//! checkpoint copies the whole WAL by itself and nothing waits.

use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use crate::store::StoreError;

/// Bytes a WAL frame adds to the file beside its page: its header.
const FRAME_HEADER_BYTES: i64 = 24;

pub(crate) struct Checkpointer {
    /// One slot: a request made while one waits is the same request.
    ask: Option<SyncSender<Ask>>,
    thread: Option<JoinHandle<()>>,
    /// WAL frames between two asked checkpoints (none asked when not
    /// positive).
    every: i32,
    /// WAL frames past which a commit waits for a checkpoint.
    limit: i32,
    /// The WAL's frames after the last commit seen.
    frames: i32,
    /// The WAL's frame count at which the next checkpoint is asked.
    next_ask: i32,
}

enum Ask {
    Checkpoint,
    /// A checkpoint, answered once it ran.
    Answer(std::sync::mpsc::Sender<()>),
}

impl Checkpointer {
    /// The checkpointer of `writer`, the writing connection of the database
    /// at `path`, read before the writer's WAL hook replaces its automatic
    /// checkpoint: checkpoints as often as that one would have run, and a
    /// WAL of at most `wal_max_bytes` (in frames of its page size).
    pub(crate) fn for_writer(
        writer: &Connection,
        path: &Path,
        synchronous: &str,
        wal_max_bytes: u64,
    ) -> Result<Self, StoreError> {
        let every: i32 = writer.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))?;
        let page: i64 = writer.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        let bytes = i64::try_from(wal_max_bytes).unwrap_or(i64::MAX);
        let frames = bytes / (page.max(1) + FRAME_HEADER_BYTES);
        let limit = i32::try_from(frames).unwrap_or(i32::MAX).max(1);
        Self::start(path, synchronous, every, limit)
    }

    /// Opens a connection to the WAL-mode database at `path` with the
    /// store's `synchronous` level (it decides the checkpoint's `fsync`s) and
    /// starts the thread that checkpoints when asked: every `every` frames,
    /// and with commits waiting past `limit` frames.
    pub(crate) fn start(
        path: &Path,
        synchronous: &str,
        every: i32,
        limit: i32,
    ) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "synchronous", synchronous)?;
        let (ask, asked) = sync_channel::<Ask>(1);
        let thread = std::thread::Builder::new()
            .name("tito-store-checkpoint".into())
            .spawn(move || {
                while let Ok(ask) = asked.recv() {
                    // Each pass copies what was committed when it began; a
                    // pass that ends a cadence or more behind the WAL goes
                    // again at once, so the copy keeps up with the commits
                    // as fast as the disk allows instead of once an ask. A
                    // pass that copied nothing (a reader holds the frames)
                    // waits for the next ask.
                    let mut copied_before = -1;
                    while let Some((behind, copied)) = checkpoint(&conn) {
                        if behind < every.max(1) || copied == copied_before {
                            break;
                        }
                        copied_before = copied;
                    }
                    if let Ask::Answer(done) = ask {
                        let _ = done.send(());
                    }
                }
            })?;
        Ok(Checkpointer {
            ask: Some(ask),
            thread: Some(thread),
            every,
            limit,
            frames: 0,
            next_ask: every,
        })
    }

    /// After a commit that left `frames` frames in the WAL (0: none was
    /// made): asks for a checkpoint every `every` frames, and says whether
    /// the WAL is past its limit (the caller, the writer, then waits for
    /// [`Checkpointer::run_now`] before it commits again).
    pub(crate) fn after_commit(&mut self, frames: i32) -> bool {
        if frames <= 0 {
            return false;
        }
        if frames < std::mem::replace(&mut self.frames, frames) {
            // The WAL started over.
            self.next_ask = self.every;
        }
        if frames >= self.limit {
            return true;
        }
        if self.every > 0 && frames >= self.next_ask {
            self.next_ask = frames + self.every;
            self.ask();
        }
        false
    }

    /// Runs a checkpoint after the one running (if any) and returns when it
    /// ran. With the writer waiting meanwhile, it copies the whole WAL
    /// (unless a reader still needs a part), and the next commit starts the
    /// WAL over.
    pub(crate) fn run_now(&self) {
        let (done, ran) = std::sync::mpsc::channel();
        let sent = self.ask.as_ref().map(|ask| ask.send(Ask::Answer(done)));
        if sent.is_some_and(|s| s.is_ok()) && ran.recv().is_ok() {
            return;
        }
        tracing::error!("the WAL checkpoint thread is gone; the WAL grows unchecked");
    }

    /// Asks for a checkpoint; returns at once.
    fn ask(&self) {
        if let Some(ask) = &self.ask {
            match ask.try_send(Ask::Checkpoint) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => {
                    tracing::error!("the WAL checkpoint thread is gone; the WAL grows unchecked");
                }
            }
        }
    }
}

impl Drop for Checkpointer {
    /// Runs a checkpoint still asked for, then ends the thread.
    fn drop(&mut self) {
        drop(self.ask.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A passive checkpoint: copies what no reader still needs from the WAL into
/// the database, waiting for nobody (as SQLite's automatic one). Returns how
/// many frames of the WAL it left uncopied and how many the WAL has had
/// copied; `None` after an error, which is logged (the next checkpoint
/// tries again).
fn checkpoint(conn: &Connection) -> Option<(i32, i32)> {
    // (busy, frames in the WAL, frames copied), as SQLite reports them.
    let counts = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i32>(1)?, r.get::<_, i32>(2)?))
    });
    match counts {
        Ok((frames, copied)) => Some((frames.saturating_sub(copied), copied)),
        Err(e) => {
            tracing::warn!(error = %e, "WAL checkpoint failed; the next one tries again");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn wal_mode(path: &Path) -> Connection {
        let conn = Connection::open(path).expect("open");
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .expect("wal");
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .expect("no automatic checkpoint");
        conn
    }

    /// A checkpoint is asked every 1,000 frames, counted again from the start
    /// once the WAL starts over; past 16,000 the caller must hold.
    #[test]
    fn checkpoints_are_asked_every_thousand_frames_and_held_past_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.db");
        let _writer = wal_mode(&path);
        let mut c = Checkpointer::start(&path, "NORMAL", 1000, 16_000).expect("start");
        for (frames, held, next_ask) in [
            (500, false, 1000),
            (999, false, 1000),
            (1000, false, 2000),
            (1500, false, 2000),
            (2100, false, 3100),
            // No commit seen: nothing changes.
            (0, false, 3100),
            (15999, false, 16999),
            (16000, true, 16999),
            // The WAL started over.
            (12, false, 1000),
            (1012, false, 2012),
        ] {
            assert_eq!(c.after_commit(frames), held, "{frames} frames");
            assert_eq!(c.next_ask, next_ask, "after {frames} frames");
        }
    }

    /// The writer's own settings decide: checkpoints as often as SQLite's
    /// automatic checkpoint would run (1,000 frames in its default build),
    /// and `wal_max_bytes` counted in frames of a page and its header.
    #[test]
    fn the_cadence_is_sqlites_own_and_the_limit_is_counted_in_frames() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.db");
        let writer = Connection::open(&path).expect("open");
        let mode: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .expect("wal");
        assert_eq!(mode, "wal");
        let c = Checkpointer::for_writer(&writer, &path, "NORMAL", 64 << 20).expect("start");
        assert_eq!(c.every, 1000);
        assert_eq!(c.limit, (64 << 20) / (4096 + 24));
        let c = Checkpointer::for_writer(&writer, &path, "NORMAL", 1).expect("start");
        assert_eq!(
            c.limit, 1,
            "a limit below one frame holds after every commit"
        );
    }

    /// A checkpoint that a reader holds back (the frames after the reader's
    /// snapshot cannot be copied) ends instead of going round again, and
    /// the copy resumes at the next ask once the reader is gone.
    #[test]
    fn a_checkpoint_a_reader_holds_back_ends_and_resumes_later() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.db");
        let writer = wal_mode(&path);
        writer
            .execute_batch("CREATE TABLE t (x BLOB); INSERT INTO t VALUES (zeroblob(10))")
            .expect("create");
        let reader = Connection::open(&path).expect("reader");
        reader.execute_batch("BEGIN").expect("begin");
        let n: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("snapshot");
        assert_eq!(n, 1);
        for _ in 0..100 {
            writer
                .execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .expect("insert");
        }
        // A cadence of one frame: every pass ends behind it.
        let checkpointer = Checkpointer::start(&path, "NORMAL", 1, 1 << 30).expect("start");
        let (done, ran) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn(move || {
            checkpointer.run_now();
            let _ = done.send(());
            checkpointer
        });
        ran.recv_timeout(Duration::from_secs(30))
            .expect("the checkpoint ended while the reader held it back");
        let checkpointer = waiting.join().expect("thread");
        reader.execute_batch("COMMIT").expect("end the read");
        checkpointer.run_now();
        let (frames, copied): (i32, i32) = writer
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(1)?, r.get(2)?))
            })
            .expect("counts");
        assert_eq!(frames, copied, "everything copied once the reader left");
    }

    /// The writer's pages reach the database file through the checkpoint
    /// thread alone (the writing connection never checkpoints here).
    #[test]
    fn asked_checkpoints_copy_the_wal_into_the_database() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.db");
        let writer = wal_mode(&path);
        writer
            .execute_batch("CREATE TABLE t (x BLOB)")
            .expect("create");
        let checkpointer = Checkpointer::start(&path, "NORMAL", 1000, 16_000).expect("start");
        let db_size = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let before = db_size();
        for _ in 0..200 {
            writer
                .execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .expect("insert");
        }
        assert_eq!(db_size(), before, "nothing checkpointed unasked");
        // Asked twice while (probably) pending: one or two checkpoints run,
        // never an error.
        checkpointer.ask();
        checkpointer.ask();
        checkpointer.run_now();
        let after = db_size();
        assert!(
            after > 200 * 4000,
            "a database file of {after} bytes after 200 rows of 4,000 bytes: no checkpoint ran"
        );
        let rows: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(rows, 200);
    }
}
