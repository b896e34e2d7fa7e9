//! WAL checkpoints on a connection and a thread of their own, so that no
//! commit waits for one.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its
//! limit, on the writing connection: it copies the WAL's pages into the
//! database file and `fsync`s, milliseconds during which that connection
//! commits nothing. At 1 concurrent call, checkpoints run after the commit
//! on that connection made about one commit in 210 take 1 to 10 ms
//! (docs/benchmarks.md). A passive checkpoint on another
//! connection runs beside the writer instead: it copies only frames that
//! are already committed, and the writer goes on appending to the WAL
//! meanwhile (it starts the WAL over from its beginning at a later commit,
//! once a checkpoint has copied all of it).
//!
//! The writer asks for a checkpoint after a commit that left the WAL past
//! [`super::writer::CHECKPOINT_FRAMES`]; asks made while one is pending
//! count as one. Past [`super::writer::WAL_LIMIT_FRAMES`] it holds its
//! connection while one runs ([`Checkpointer::run_now`]).

use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use crate::store::StoreError;

pub(crate) struct Checkpointer {
    /// One slot: a request made while one waits is the same request.
    ask: Option<SyncSender<Ask>>,
    thread: Option<JoinHandle<()>>,
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
                    checkpoint(&conn);
                    if let Ask::Answer(done) = ask {
                        let _ = done.send(());
                    }
                }
            })?;
        Ok(Checkpointer {
            ask: Some(ask),
            thread: Some(thread),
        })
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
    pub(crate) fn ask(&self) {
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
/// the database, waiting for nobody (as SQLite's automatic one).
fn checkpoint(conn: &Connection) {
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "WAL checkpoint failed; the next one tries again");
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
