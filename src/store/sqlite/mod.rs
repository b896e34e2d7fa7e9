//! The SQLite [`SpanStore`] (`sqlite://PATH[?synchronous=full|normal]`).
//!
//! One writing connection, owned by a writer thread that does group commit
//! with it (see [`writer`]); a second connection checkpoints on a thread of
//! its own (see [`checkpoint`]); reads use a small pool of `query_only`
//! connections on `spawn_blocking`. No SQLite call runs on the async
//! runtime's worker threads. The database runs in WAL mode, so readers (and
//! an offline `tito export` in another process) never block the writer.
//! Every connection uses SQLite's default VFS.
//!
//! # Why an acknowledged call survives `kill -9`
//!
//! An append is acknowledged after `COMMIT` returned. In WAL mode, `COMMIT`
//! has appended the transaction's pages and a commit frame to the `-wal` file
//! with `write(2)` before it returns; a killed process loses nothing that the
//! kernel already holds, and on the next open SQLite recovers the WAL and
//! replays every frame up to the last commit frame. So
//! `synchronous=NORMAL`, the default, survives `kill -9` (the crash test
//! kills a writer with SIGKILL and finds every acknowledged call).
//! `?synchronous=full` also `fsync`s the WAL at every commit, so
//! acknowledged calls survive power loss and kernel crashes as well; group
//! commit pays that `fsync` once per batch, but a lone call waits for a
//! whole `fsync` (milliseconds on most disks), which is why it is opt-in.

mod checkpoint;
mod consumers;
mod images;
mod requests;
mod rows;
pub mod schema;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::mpsc;

use super::group_commit::{Writer, QUEUE};
use super::scan::{self, listing_page};
use super::types::{clamp_limit, cursor_key};
use super::{
    Ack, Acked, Bodies, CallRecord, Lease, ListQuery, Page, ResponseRef, SampleReplay, SpanStore,
    StoreError, StoreOptions, StoredImage, Trajectory, TrajectoryFilter, TrajectoryIter,
    TrajectoryMeta, TrajectoryMetadata, VersionRecord,
};

pub use schema::SCHEMA_VERSION;

/// Idle read connections kept for reuse.
const MAX_IDLE_READERS: usize = 8;

/// `synchronous` pragma of the writing connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// fsync the WAL at every commit: durable against power loss.
    Full,
    /// no fsync at commit: durable against process crashes only.
    Normal,
}

/// A parsed `sqlite://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteUrl {
    pub path: PathBuf,
    pub synchronous: Synchronous,
}

impl SqliteUrl {
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let bad = || StoreError::BadUrl(url.to_string());
        let rest = url.strip_prefix("sqlite://").ok_or_else(bad)?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        if path.is_empty() {
            return Err(bad());
        }
        let mut synchronous = Synchronous::Normal;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            synchronous = match pair {
                "synchronous=full" => Synchronous::Full,
                "synchronous=normal" => Synchronous::Normal,
                _ => return Err(bad()),
            };
        }
        Ok(SqliteUrl {
            path: PathBuf::from(path),
            synchronous,
        })
    }
}

struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    fn open_one(&self) -> Result<Connection, StoreError> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "query_only", true)?;
        Ok(conn)
    }

    fn take(&self) -> Result<Connection, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(c) => Ok(c),
            None => self.open_one(),
        }
    }

    fn give(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.take()?;
        let out = f(&conn);
        // A connection that failed mid-transaction is not reused.
        if out.is_ok() {
            self.give(conn);
        }
        out
    }
}

pub struct SqliteStore {
    jobs: Writer,
    writer: Option<JoinHandle<writer::Writing>>,
    readers: Arc<Readers>,
}

/// Called on the writer thread inside each commit that writes (see
/// [`SqliteStore::open_with_commit_hook`]).
type CommitHook = Box<dyn FnMut() + Send>;

impl SqliteStore {
    /// Opens (creating it and its parent directories if needed) and migrates
    /// the database, then starts the writer thread.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, Ack::Committed)
    }

    /// [`SqliteStore::open`], acknowledging appends as `ack` says.
    pub fn open_with(url: &str, ack: Ack) -> Result<Self, StoreError> {
        Self::open_with_options(
            url,
            &StoreOptions {
                ack,
                ..StoreOptions::default()
            },
        )
    }

    /// [`SqliteStore::open`] with the `[store]` keys beside the URL.
    pub fn open_with_options(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let url = SqliteUrl::parse(url)?;
        Self::open_path_with(&url.path, url.synchronous, options, None)
    }

    /// For tests: [`SqliteStore::open_with_options`], with `hook` called on
    /// the writer thread inside every commit that writes, before the commit
    /// is durable, as the time a slow disk takes there would be spent
    /// (`tests/store_slow_disk.rs`).
    #[doc(hidden)]
    pub fn open_with_commit_hook(
        url: &str,
        options: &StoreOptions,
        hook: impl FnMut() + Send + 'static,
    ) -> Result<Self, StoreError> {
        let url = SqliteUrl::parse(url)?;
        Self::open_path_with(&url.path, url.synchronous, options, Some(Box::new(hook)))
    }

    pub fn open_path(path: &Path, synchronous: Synchronous) -> Result<Self, StoreError> {
        Self::open_path_with(path, synchronous, &StoreOptions::default(), None)
    }

    fn open_path_with(
        path: &Path,
        synchronous: Synchronous,
        options: &StoreOptions,
        hook: Option<CommitHook>,
    ) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Schema(format!(
                "could not switch to WAL mode (got `{mode}`)"
            )));
        }
        let sync = match synchronous {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        schema::migrate(&mut conn)?;
        if let Some(mut hook) = hook {
            conn.commit_hook(Some(move || {
                hook();
                // Go on with the commit.
                false
            }))?;
        }

        let checkpointer =
            checkpoint::Checkpointer::for_writer(&conn, path, sync, options.wal_max_bytes)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let writing = writer::Writing::new(conn, checkpointer);
        let writer = std::thread::Builder::new()
            .name("tito-store-writer".into())
            .spawn(move || writer::run(writing, rx))?;
        Ok(SqliteStore {
            jobs: Writer::new(tx, options.ack),
            writer: Some(writer),
            readers: Arc::new(Readers {
                path: path.to_path_buf(),
                idle: Mutex::new(Vec::new()),
            }),
        })
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || readers.with(f))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

impl Drop for SqliteStore {
    /// Closes the queue and waits for the writer to commit what is queued
    /// (its connection and checkpointer close with it).
    fn drop(&mut self) {
        self.jobs.close();
        if let Some(handle) = self.writer.take() {
            let _ = handle.join();
        }
    }
}

#[async_trait]
impl SpanStore for SqliteStore {
    async fn append_call(&self, call: CallRecord) -> Result<(), StoreError> {
        self.jobs.append(call).await
    }

    async fn put_images(&self, images: &[StoredImage]) -> Result<(), StoreError> {
        self.jobs.put_images(images).await
    }

    async fn image(&self, sha256: &str) -> Result<Option<StoredImage>, StoreError> {
        let key = sha256.to_string();
        self.read(move |c| images::get(c, &key)).await
    }

    async fn writable(&self) -> Result<(), StoreError> {
        self.jobs.ping().await
    }

    async fn set_weight_version(&self, version: &str) -> Result<(), StoreError> {
        self.jobs.weight_version(version).await
    }

    async fn weight_version(&self) -> Result<Option<String>, StoreError> {
        self.read(|c| {
            let v = c.query_row(
                "SELECT value FROM gateway_state WHERE key = ?1",
                [super::group_commit::WEIGHT_VERSION],
                |r| r.get::<_, String>(0),
            );
            match v {
                Ok(v) => Ok(Some(v)),
                Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    async fn register_version(&self, label: &str) -> Result<u64, StoreError> {
        self.jobs.register_version(label).await
    }

    async fn versions(&self) -> Result<Vec<VersionRecord>, StoreError> {
        self.read(rows::versions).await
    }

    async fn begin_run(&self, ack: Ack) -> Result<u64, StoreError> {
        self.jobs.begin_run(ack).await
    }

    async fn set_reward(
        &self,
        trajectory_id: &str,
        call: Option<u32>,
        reward: f64,
        extra: Option<serde_json::Value>,
    ) -> Result<TrajectoryMeta, StoreError> {
        self.jobs.reward(trajectory_id, call, reward, extra).await
    }

    async fn set_metadata(
        &self,
        trajectory_id: &str,
        update: &TrajectoryMetadata,
    ) -> Result<TrajectoryMeta, StoreError> {
        self.jobs.metadata(trajectory_id, update).await
    }

    async fn set_replays(
        &self,
        trajectory_id: &str,
        replays: Vec<SampleReplay>,
    ) -> Result<(), StoreError> {
        self.jobs.replays(trajectory_id, replays).await
    }

    async fn group(&self, group: &str) -> Result<Vec<TrajectoryMeta>, StoreError> {
        let group = group.to_string();
        self.read(move |c| rows::group(c, &group)).await
    }

    async fn lease(
        &self,
        consumer: &str,
        filter: &TrajectoryFilter,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Lease, StoreError> {
        self.jobs.lease(consumer, filter, limit, lease_ms).await
    }

    async fn ack(&self, consumer: &str, cursor: &str) -> Result<Acked, StoreError> {
        self.jobs.ack(consumer, cursor).await
    }

    async fn finish(&self, trajectory_id: &str) -> Result<TrajectoryMeta, StoreError> {
        self.jobs.finish(trajectory_id).await
    }

    async fn get_meta(&self, trajectory_id: &str) -> Result<Option<TrajectoryMeta>, StoreError> {
        let id = trajectory_id.to_string();
        self.read(move |c| Ok(rows::meta_by_id(c, &id)?.map(|(_, m)| m)))
            .await
    }

    async fn get_trajectory(&self, trajectory_id: &str) -> Result<Option<Trajectory>, StoreError> {
        let id = trajectory_id.to_string();
        self.read(move |c| rows::load_by_id(c, &id, Bodies::Read))
            .await
    }

    async fn latest_calls(
        &self,
        trajectory_id: &str,
        n: usize,
    ) -> Result<Vec<CallRecord>, StoreError> {
        let id = trajectory_id.to_string();
        self.read(move |c| {
            let (seq, _) =
                rows::meta_by_id(c, &id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
            rows::calls_of(c, seq, &id, Some(n), Bodies::Read)
        })
        .await
    }

    async fn list_trajectories(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let after = cursor_key(query.cursor.as_deref())?;
        let limit = clamp_limit(query.limit);
        let filter = query.filter.clone();
        self.read(move |c| {
            Ok(listing_page(
                rows::page(c, &filter, after, limit + 1)?,
                limit,
            ))
        })
        .await
    }

    async fn find_response(&self, response_id: &str) -> Result<Option<ResponseRef>, StoreError> {
        let id = response_id.to_string();
        self.read(move |c| rows::find_response(c, &id)).await
    }

    async fn forget_response(&self, response_id: &str) -> Result<bool, StoreError> {
        // Found first, as on PostgreSQL, whose writer sorts the job by its
        // trajectory; the writer clears it only if a call still holds it.
        match self.find_response(response_id).await? {
            Some(at) => {
                self.jobs
                    .forget_response(&at.trajectory_id, response_id)
                    .await
            }
            None => Ok(false),
        }
    }

    fn count(&self, filter: &TrajectoryFilter) -> Result<u64, StoreError> {
        self.readers.with(|c| rows::count(c, filter))
    }

    fn scan(&self, filter: &TrajectoryFilter) -> Result<TrajectoryIter, StoreError> {
        Ok(scan::by_filter(self.readers.take()?, filter))
    }

    fn scan_ids(&self, ids: Vec<String>) -> Result<TrajectoryIter, StoreError> {
        Ok(scan::by_ids(self.readers.take()?, ids))
    }
}

impl super::scan::Reader for Connection {
    fn keys(
        &mut self,
        filter: &TrajectoryFilter,
        after: i64,
        limit: usize,
    ) -> Result<Vec<i64>, StoreError> {
        Ok(rows::page(self, filter, after, limit)?
            .into_iter()
            .map(|(seq, _)| seq)
            .collect())
    }

    fn by_key(&mut self, key: i64) -> Result<Option<Trajectory>, StoreError> {
        rows::load_by_seq(self, key, Bodies::Skip)
    }

    fn by_id(&mut self, id: &str) -> Result<Option<Trajectory>, StoreError> {
        rows::load_by_id(self, id, Bodies::Skip)
    }
}
