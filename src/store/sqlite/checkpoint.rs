//! WAL checkpoints on a connection and a thread of their own, so that
//! commits wait for one only when the WAL is past its limit.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its
//! limit, on the writing connection: it copies the WAL's pages into the
//! database file and `fsync`s, milliseconds during which that connection
//! commits nothing. At 1 concurrent call, checkpoints run after the commit
//! on that connection made about one commit in 210 take 1 to 10 ms
//! (docs/benchmarks-history-mid.md, "Checkpoints beside the commits"). A
//! passive checkpoint on another
//! connection runs beside the writer instead: it copies only frames that
//! are already committed, and the writer goes on appending to the WAL
//! meanwhile (it starts the WAL over from its beginning at a later commit,
//! once a checkpoint has copied all of it).
//!
//! After each commit the writer tells the [`Checkpointer`] how many frames
//! the WAL holds ([`Checkpointer::after_commit`]). Every
//! [`CHECKPOINT_FRAMES`] frames it asks for a checkpoint, and the thread
//! runs it and, if commits came meanwhile, one more for those (a short one:
//! finished between two commits, it lets the next commit start the WAL
//! over). Past [`WAL_LIMIT_FRAMES`] the writer holds its connection while
//! one runs ([`Checkpointer::run_now`]).

use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use crate::store::StoreError;

/// WAL frames between two asked checkpoints: SQLite's own default for its
/// automatic one.
const CHECKPOINT_FRAMES: i32 = 1000;

/// WAL frames past which commits wait for a checkpoint, as they did for
/// SQLite's automatic one. A checkpoint copies the WAL into the database,
/// but the WAL starts over from its beginning only at a commit that finds
/// all of it copied, which commits arriving back to back can keep from
/// happening; a checkpoint with the writing connection held, so that
/// nothing is committed meanwhile, lets the next commit start the WAL over.
pub(crate) const WAL_LIMIT_FRAMES: i32 = 4 * CHECKPOINT_FRAMES;

pub(crate) struct Checkpointer {
    /// One slot: a request made while one waits is the same request.
    ask: Option<SyncSender<Ask>>,
    thread: Option<JoinHandle<()>>,
    /// The WAL's frames after the last commit seen.
    frames: AtomicI32,
    /// The WAL's frame count at which the next checkpoint is asked.
    next_ask: AtomicI32,
}

enum Ask {
    Checkpoint,
    /// A checkpoint, answered once it ran.
    Answer(std::sync::mpsc::Sender<()>),
}

impl Checkpointer {
    /// Opens a connection to the WAL-mode database at `path` with the
    /// store's `synchronous` level (it decides the checkpoint's `fsync`s) and
    /// starts the thread that checkpoints when asked.
    pub(crate) fn start(path: &Path, synchronous: &str) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "synchronous", synchronous)?;
        let (ask, asked) = sync_channel::<Ask>(1);
        let thread = std::thread::Builder::new()
            .name("tito-store-checkpoint".into())
            .spawn(move || {
                while let Ok(ask) = asked.recv() {
                    let left = checkpoint(&conn);
                    match ask {
                        Ask::Answer(done) => drop(done.send(())),
                        // Frames committed while it ran: copy them too.
                        Ask::Checkpoint if left > 0 => {
                            checkpoint(&conn);
                        }
                        Ask::Checkpoint => {}
                    }
                }
            })?;
        Ok(Checkpointer {
            ask: Some(ask),
            thread: Some(thread),
            frames: AtomicI32::new(0),
            next_ask: AtomicI32::new(CHECKPOINT_FRAMES),
        })
    }

    /// After a commit that left `frames` frames in the WAL (0: none was
    /// made): asks for a checkpoint every [`CHECKPOINT_FRAMES`] frames, and
    /// says whether the WAL is past [`WAL_LIMIT_FRAMES`] (the caller then
    /// holds the writing connection through [`Checkpointer::run_now`]).
    pub(crate) fn after_commit(&self, frames: i32) -> bool {
        if frames <= 0 {
            return false;
        }
        if frames < self.frames.swap(frames, Ordering::Relaxed) {
            // The WAL started over.
            self.next_ask.store(CHECKPOINT_FRAMES, Ordering::Relaxed);
        }
        if frames >= WAL_LIMIT_FRAMES {
            return true;
        }
        let next = self.next_ask.load(Ordering::Relaxed);
        if frames >= next
            && self
                .next_ask
                .compare_exchange(
                    next,
                    frames + CHECKPOINT_FRAMES,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.ask();
        }
        false
    }

    /// Runs a checkpoint after the one running (if any) and returns when it
    /// ran. With the writing connection held meanwhile, it copies the whole
    /// WAL (unless a reader still needs a part), and the next commit starts
    /// the WAL over.
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
/// the database, waiting for nobody (as SQLite's automatic one). Returns the
/// frames it left uncopied (0 on an error, logged).
fn checkpoint(conn: &Connection) -> i64 {
    let done = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
    });
    match done {
        Ok((wal, copied)) => wal - copied,
        Err(e) => {
            tracing::warn!(error = %e, "WAL checkpoint failed; the next one tries again");
            0
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
    /// once the WAL starts over; past 4,000 the caller must hold.
    #[test]
    fn checkpoints_are_asked_every_thousand_frames_and_held_past_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.db");
        let _writer = wal_mode(&path);
        let c = Checkpointer::start(&path, "NORMAL").expect("start");
        let next = |c: &Checkpointer| c.next_ask.load(Ordering::Relaxed);
        for (frames, held, next_ask) in [
            (500, false, 1000),
            (999, false, 1000),
            (1000, false, 2000),
            (1500, false, 2000),
            (2100, false, 3100),
            // No commit seen: nothing changes.
            (0, false, 3100),
            (3999, false, 4999),
            (4000, true, 4999),
            // The WAL started over.
            (12, false, 1000),
            (1012, false, 2012),
        ] {
            assert_eq!(c.after_commit(frames), held, "{frames} frames");
            assert_eq!(next(&c), next_ask, "after {frames} frames");
        }
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
        let checkpointer = Checkpointer::start(&path, "NORMAL").expect("start");
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
