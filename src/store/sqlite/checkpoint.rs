//! WAL checkpoints on a connection and a thread of their own, so that
//! commits seldom wait for one.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its
//! limit, on the writing connection: it copies the WAL's pages into the
//! database file and `fsync`s, milliseconds during which that connection
//! commits nothing. At 1 concurrent call, checkpoints run after the commit
//! on that connection made about one commit in 210 take 1 to 10 ms
//! (docs/benchmarks-history-mid.md, "Checkpoints beside the commits"). A
//! passive checkpoint on another connection runs beside the writer instead:
//! it copies only frames that are already committed, and the writer goes on
//! appending to the WAL meanwhile.
//!
//! The WAL starts over from its beginning only at a commit that finds all
//! of it copied, and a checkpoint leaves behind what was committed while it
//! ran: its first `fsync` (of the WAL, before copying) took 9 to 17 ms for
//! a thousand frames on the machine of docs/benchmarks-history.md ("The
//! WAL's checkpoints catch up"), time for twenty or more commits at 1
//! concurrent call. Commits back to back thus keep the WAL from starting
//! over by itself.
//!
//! After each commit the writer tells the [`Checkpointer`] how many frames
//! the WAL holds ([`Checkpointer::after_commit`]). Every
//! [`CHECKPOINT_FRAMES`] frames it asks for a checkpoint: one pass, which
//! copies the WAL whole when the commits pause for it. Past [`HOLD_FRAMES`]
//! a pass that left frames behind is followed by a catch-up ([`catch_up`]):
//! passes each copying what came during the one before, fewer frames each
//! time and so a shorter `fsync`. If the last one left frames behind too,
//! the database file is synced and the next commit holds the writing
//! connection through one more pass ([`Checkpointer::run_now`]): a short
//! one, with little left to copy and nothing committed meanwhile, after
//! which the next commit starts the WAL over. Past [`WAL_LIMIT_FRAMES`] a
//! commit holds whatever the checkpoints did.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use crate::store::StoreError;

/// WAL frames between two asked checkpoints: SQLite's own default for its
/// automatic one.
const CHECKPOINT_FRAMES: i32 = 1000;

/// Passes of one catch-up at most. Each pass copies what was committed
/// during the one before; with commits coming faster than a pass copies
/// them the passes would never end.
const MAX_PASSES: usize = 3;

/// WAL frames past which a pass that left frames behind is followed by a
/// catch-up, and a catch-up that left frames behind by a held pass. Each
/// hold makes the commits wait (up to 3 ms on the machine of
/// docs/benchmarks-history.md, "The WAL's checkpoints catch up"), so below
/// this size the WAL is left to grow while the commits come back to back.
const HOLD_FRAMES: i32 = 12 * CHECKPOINT_FRAMES;

/// WAL frames past which a commit holds the writing connection through a
/// checkpoint whatever the checkpoints did (their thread fell behind the
/// commits): a bound on the WAL's size, 16,000 pages (about 64 MB).
pub(crate) const WAL_LIMIT_FRAMES: i32 = 16 * CHECKPOINT_FRAMES;

pub(crate) struct Checkpointer {
    /// One slot: a request made while one waits is the same request.
    ask: Option<SyncSender<Ask>>,
    thread: Option<JoinHandle<()>>,
    /// The WAL's frames after the last commit seen.
    frames: AtomicI32,
    /// The WAL's frame count at which the next checkpoint is asked.
    next_ask: AtomicI32,
    /// Set by a catch-up that fell behind: the next commit holds the
    /// writing connection through a last pass.
    hold: Arc<AtomicBool>,
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
        // The database file, synced before a hold so that the held pass's
        // own sync finds little left to write.
        let db = std::fs::File::open(path)?;
        let (ask, asked) = sync_channel::<Ask>(1);
        let hold = Arc::new(AtomicBool::new(false));
        let behind = hold.clone();
        let thread = std::thread::Builder::new()
            .name("tito-store-checkpoint".into())
            .spawn(move || {
                while let Ok(ask) = asked.recv() {
                    match ask {
                        Ask::Answer(done) => {
                            catch_up(&conn, MAX_PASSES, || {});
                            let _ = done.send(());
                        }
                        // One pass; past `HOLD_FRAMES` a catch-up, and if it
                        // falls behind too, a held pass at the next commit.
                        Ask::Checkpoint => {
                            if catch_up(&conn, 1, || {}).1.wants_a_hold()
                                && catch_up(&conn, MAX_PASSES, || {}).1.wants_a_hold()
                            {
                                if let Err(e) = db.sync_data() {
                                    tracing::warn!(error = %e, "could not sync the database file");
                                }
                                behind.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
            })?;
        Ok(Checkpointer {
            ask: Some(ask),
            thread: Some(thread),
            frames: AtomicI32::new(0),
            next_ask: AtomicI32::new(CHECKPOINT_FRAMES),
            hold,
        })
    }

    /// After a commit that left `frames` frames in the WAL (0: none was
    /// made): asks for a checkpoint every [`CHECKPOINT_FRAMES`] frames, and
    /// says whether the WAL is past [`WAL_LIMIT_FRAMES`] or the last
    /// catch-up fell behind (the caller then holds the writing connection
    /// through [`Checkpointer::run_now`]).
    pub(crate) fn after_commit(&self, frames: i32) -> bool {
        if frames <= 0 {
            return false;
        }
        if frames < self.frames.swap(frames, Ordering::Relaxed) {
            // The WAL started over.
            self.next_ask.store(CHECKPOINT_FRAMES, Ordering::Relaxed);
        }
        if self.hold.swap(false, Ordering::Relaxed) || frames >= WAL_LIMIT_FRAMES {
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

/// How a catch-up ended.
#[derive(Debug, PartialEq)]
enum Caught {
    /// Its last pass ran with nothing committed meanwhile and copied the
    /// WAL whole (the database file synced), or the WAL was empty: the next
    /// commit starts the WAL over.
    Whole,
    /// A reader still needs frames it could not copy (or an error, logged).
    Stopped,
    /// Commits came during every one of its passes; the WAL held this many
    /// frames when the last one began.
    Behind(i64),
}

impl Caught {
    /// Whether the checkpoint fell behind with the WAL past
    /// [`HOLD_FRAMES`].
    fn wants_a_hold(&self) -> bool {
        matches!(self, Caught::Behind(wal) if *wal >= i64::from(HOLD_FRAMES))
    }
}

/// Passive checkpoints until one ran with nothing committed meanwhile, a
/// reader keeps frames from being copied, or `max_passes` ran. `during`
/// runs after each pass has begun, before the check for commits made while
/// it ran (tests commit there). Returns the passes run and how it ended.
fn catch_up(conn: &Connection, max_passes: usize, mut during: impl FnMut()) -> (usize, Caught) {
    let Some(mut version) = data_version(conn) else {
        return (0, Caught::Stopped);
    };
    let mut wal = 0;
    for pass in 1..=max_passes {
        let Some((frames, copied)) = checkpoint(conn) else {
            return (pass, Caught::Stopped);
        };
        wal = frames;
        during();
        if copied < wal {
            return (pass, Caught::Stopped);
        }
        match data_version(conn) {
            Some(now) if now != version => version = now,
            Some(_) => return (pass, Caught::Whole),
            None => return (pass, Caught::Stopped),
        }
    }
    (max_passes, Caught::Behind(wal))
}

/// A number that changes whenever another connection commits (SQLite's
/// `data_version`); none on an error, logged.
fn data_version(conn: &Connection) -> Option<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
        .map_err(|e| tracing::warn!(error = %e, "could not read the database's data_version"))
        .ok()
}

/// A passive checkpoint: copies what no reader still needs from the WAL into
/// the database, waiting for nobody (as SQLite's automatic one). Returns the
/// frames the WAL held when it began and how many of them are copied (none
/// on an error, logged).
fn checkpoint(conn: &Connection) -> Option<(i64, i64)> {
    let done = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
    });
    done.map_err(|e| tracing::warn!(error = %e, "WAL checkpoint failed; the next one tries again"))
        .ok()
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
    /// once the WAL starts over; past 16,000, or once after a catch-up fell
    /// behind past 12,000, the caller must hold.
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
            (15999, false, 16999),
            (16000, true, 16999),
            // The WAL started over.
            (12, false, 1000),
            (1012, false, 2012),
        ] {
            assert_eq!(c.after_commit(frames), held, "{frames} frames");
            assert_eq!(next(&c), next_ask, "after {frames} frames");
        }
        // A catch-up that fell behind past 12,000 frames: the next commit
        // holds, once.
        assert!(!Caught::Whole.wants_a_hold());
        assert!(!Caught::Stopped.wants_a_hold());
        assert!(!Caught::Behind(11_999).wants_a_hold());
        assert!(Caught::Behind(12_000).wants_a_hold());
        c.hold.store(true, Ordering::Relaxed);
        assert!(!c.after_commit(0), "no commit seen: nothing changes");
        assert!(c.after_commit(1013));
        assert!(!c.after_commit(1014));
    }

    /// Frames after the last commit of a connection given [`count_frames`].
    static FRAMES: AtomicI32 = AtomicI32::new(0);

    fn count_frames(_: &rusqlite::hooks::Wal, frames: i32) -> rusqlite::Result<()> {
        FRAMES.store(frames, Ordering::Relaxed);
        Ok(())
    }

    /// While commits come during its passes, a catch-up goes on: it ends
    /// with the WAL copied whole, so the next commit starts the WAL over
    /// (one pass, as checkpoints ran before, would leave the frames
    /// committed during it, and the WAL would keep growing).
    #[test]
    fn a_catch_up_copies_what_came_during_its_passes_and_the_wal_starts_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.db");
        let writer = wal_mode(&path);
        writer.wal_hook(Some(count_frames));
        writer
            .execute_batch("CREATE TABLE t (x BLOB)")
            .expect("create");
        let insert = || {
            writer
                .execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .expect("insert");
        };
        for _ in 0..50 {
            insert();
        }
        let ckpt = Connection::open(&path).expect("open");
        let mut commits_during = MAX_PASSES - 1;
        let caught = catch_up(&ckpt, MAX_PASSES, || {
            if commits_during > 0 {
                commits_during -= 1;
                insert();
            }
        });
        // A commit during each pass but the last.
        assert_eq!(caught, (MAX_PASSES, Caught::Whole));
        // Started over, the WAL holds only the next commit's frames, no
        // more than it held after the last commit (the same insert); else
        // it holds both.
        let before = FRAMES.load(Ordering::Relaxed);
        insert();
        let after = FRAMES.load(Ordering::Relaxed);
        assert!(
            after <= before,
            "the WAL held {before} frames and {after} after one more commit: it did not start over"
        );

        // A commit during every pass: the catch-up gives up after its last.
        let caught = catch_up(&ckpt, MAX_PASSES, insert);
        assert!(
            matches!(caught, (MAX_PASSES, Caught::Behind(wal)) if wal > 0),
            "{caught:?}"
        );
        let rows: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(rows, 50 + 2 * MAX_PASSES as i64);
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
