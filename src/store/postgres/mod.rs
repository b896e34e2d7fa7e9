//! The PostgreSQL [`SpanStore`] (`postgres://user:pass@host:port/db`): one
//! database shared by any number of gateway replicas.
//!
//! Each store owns a small private tokio runtime that drives its
//! connections and its writer task, so the store works the same from the
//! gateway's runtime, from `spawn_blocking`, and from the plain threads of
//! `tito export` (the blocking [`SpanStore::scan`] and
//! [`SpanStore::count`] wait on the driver with `futures`' `block_on`).
//! Writes go through one writer task per process doing group commit
//! ([`writer`]); reads use a small pool of connections.
//!
//! # Durability
//!
//! An append is acknowledged after `COMMIT` returned. With PostgreSQL's
//! default `synchronous_commit = on`, the commit record is flushed to the
//! server's WAL before that, so an acknowledged call survives a crash of the
//! gateway, of the server, and of the machine. A commit whose answer was
//! lost with the connection is settled by asking the server ([`settle`]),
//! so a call that did commit is not reported failed. Connections are plain TCP or
//! Unix sockets without TLS: keep the database on loopback or a private
//! network.

mod append;
mod bulk;
mod consumers;
mod images;
mod lock_order;
mod rows;
pub mod schema;
mod settle;
mod versions;
mod writer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_postgres::{NoTls, Statement};

use super::group_commit::{Writer, QUEUE};
use super::scan::{self, listing_page};
use super::types::{clamp_limit, cursor_key};
use super::{
    Ack, Acked, Bodies, CallRecord, Lease, ListQuery, Page, ResponseRef, SampleReplay, SpanStore,
    StoreError, StoredImage, Trajectory, TrajectoryFilter, TrajectoryIter, TrajectoryMeta,
    TrajectoryMetadata, VersionRecord,
};
use rows::Key;

pub use consumers::MARKS_LOCK;
pub use schema::SCHEMA_VERSION;

/// Most read connections a store opens.
const READERS: usize = 16;

impl From<tokio_postgres::Error> for StoreError {
    /// The server's own message and SQLSTATE when it sent one (the driver's
    /// `Display` says only "db error").
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => {
                StoreError::Postgres(format!("{} (SQLSTATE {})", db.message(), db.code().code()))
            }
            None => StoreError::Postgres(e.to_string()),
        }
    }
}

/// A fresh, empty database on the test cluster (`TITO_TEST_POSTGRES`,
/// started by scripts/test.sh): its URL and a connection to it.
#[cfg(test)]
pub(crate) async fn test_database() -> (String, Conn) {
    let base = std::env::var("TITO_TEST_POSTGRES")
        .unwrap_or_else(|_| panic!("TITO_TEST_POSTGRES is unset: run scripts/test.sh"));
    let admin = Conn::connect(&format!("{base}/postgres"))
        .await
        .expect("connect");
    let name = format!("tito_unit_{:016x}", rand::random::<u64>());
    admin
        .client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let url = format!("{base}/{name}");
    let conn = Conn::connect(&url).await.expect("connect");
    (url, conn)
}

/// One connection and its prepared statements.
pub(crate) struct Conn {
    client: tokio_postgres::Client,
    stmts: HashMap<String, Statement>,
    /// Transactions this connection ran again after a deadlock or a
    /// serialization failure (see `writer::commit_batch`).
    transient_retries: u64,
    /// Trajectories the open transaction created: its commit gives them
    /// their listing keys (see `writer::COMMIT_SQL`).
    created: u64,
    /// The URL this connection was opened with: a commit whose answer was
    /// lost opens another connection to learn its outcome
    /// ([`settle`]).
    url: String,
    /// The open write transaction, as `writer::begin` started it.
    xact: Option<settle::Xact>,
}

impl Conn {
    /// Connects on the current runtime and drives the connection there. A
    /// server that stops answering without closing the connection (its host
    /// gone) fails the calls waiting on it within about half a minute,
    /// instead of hanging them: a connect timeout (unless the URL sets one),
    /// TCP keepalives and a TCP user timeout.
    async fn connect(url: &str) -> Result<Conn, StoreError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|_| StoreError::BadUrl(crate::config::redact_store_url(url)))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(Duration::from_secs(30));
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "span store: postgres connection ended");
            }
        });
        Ok(Conn {
            client,
            stmts: HashMap::new(),
            transient_retries: 0,
            created: 0,
            url: url.to_string(),
            xact: None,
        })
    }

    /// The prepared statement of `sql`, prepared once per connection.
    async fn prep(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await?;
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

/// Read connections: at most [`READERS`] open, opened on the store's runtime
/// when none is idle; a read waits for a free one rather than opening more
/// (a PostgreSQL connection is a server process: opening one per read costs
/// milliseconds).
struct Readers {
    url: String,
    rt: tokio::runtime::Handle,
    idle: Mutex<Vec<Conn>>,
    permits: Arc<tokio::sync::Semaphore>,
}

impl Readers {
    /// A connection of its own, outside the pool and its limit: an export
    /// scan holds one for as long as its client reads, and must not starve
    /// the calls' reads.
    async fn open(&self) -> Result<Conn, StoreError> {
        let url = self.url.clone();
        self.rt
            .spawn(async move { Conn::connect(&url).await })
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }

    async fn take(self: &Arc<Self>) -> Result<Pooled, StoreError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Closed)?;
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match pooled {
            Some(c) if !c.client.is_closed() => c,
            _ => self.open().await?,
        };
        Ok(Pooled {
            conn,
            readers: self.clone(),
            _permit: permit,
        })
    }
}

/// A connection taken from [`Readers`], with its permit. Dropped without
/// [`Pooled::done`], the connection is closed.
struct Pooled {
    conn: Conn,
    readers: Arc<Readers>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Pooled {
    /// Gives the connection back when its work succeeded; one whose work
    /// failed is closed (it may be mid-transaction).
    fn done<T>(self, out: Result<T, StoreError>) -> Result<T, StoreError> {
        if out.is_ok() {
            self.readers
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.conn);
        }
        out
    }
}

pub struct PgStore {
    jobs: Writer,
    writer: Option<tokio::task::JoinHandle<()>>,
    readers: Arc<Readers>,
    rt: Option<tokio::runtime::Runtime>,
}

impl PgStore {
    /// Connects, migrates the schema and starts the writer task.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, Ack::Committed)
    }

    /// [`PgStore::open`] with an acknowledgement mode; only
    /// [`Ack::Committed`] is accepted (see [`writer`]).
    pub fn open_with(url: &str, ack: Ack) -> Result<Self, StoreError> {
        if ack == Ack::Queued {
            return Err(StoreError::Invalid(
                "store.ack = \"queued\" needs a sqlite:// store: replicas sharing a postgres \
                 store cannot tell which trajectories a crashed replica left behind"
                    .into(),
            ));
        }
        url.parse::<tokio_postgres::Config>()
            .map_err(|_| StoreError::BadUrl(crate::config::redact_store_url(url)))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tito-postgres")
            .enable_all()
            .build()?;
        let owned = url.to_string();
        let opened = futures::executor::block_on(rt.spawn(async move {
            let conn = Conn::connect(&owned).await?;
            schema::migrate(&conn).await?;
            Ok::<_, StoreError>(conn)
        }));
        // Dropping a runtime blocks, which panics on an async caller: a
        // failed open shuts it down in the background.
        let conn = match opened {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                rt.shutdown_background();
                return Err(e);
            }
            Err(e) => {
                rt.shutdown_background();
                return Err(StoreError::Task(e.to_string()));
            }
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = rt.spawn(writer::run(url.to_string(), conn, rx));
        Ok(PgStore {
            jobs: Writer::new(tx, ack),
            writer: Some(writer),
            readers: Arc::new(Readers {
                url: url.to_string(),
                rt: rt.handle().clone(),
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(tokio::sync::Semaphore::new(READERS)),
            }),
            rt: Some(rt),
        })
    }
}

impl Drop for PgStore {
    /// Closes the queue and waits for the writer to commit what is queued.
    fn drop(&mut self) {
        self.jobs.close();
        if let Some(handle) = self.writer.take() {
            let _ = futures::executor::block_on(handle);
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[async_trait]
impl SpanStore for PgStore {
    async fn append_call(&self, call: CallRecord) -> Result<(), StoreError> {
        self.jobs.append(call).await
    }

    async fn put_images(&self, images: &[StoredImage]) -> Result<(), StoreError> {
        self.jobs.put_images(images).await
    }

    async fn image(&self, sha256: &str) -> Result<Option<StoredImage>, StoreError> {
        let mut c = self.readers.take().await?;
        let out = images::get(&mut c.conn, sha256).await;
        c.done(out)
    }

    async fn writable(&self) -> Result<(), StoreError> {
        self.jobs.ping().await
    }

    async fn set_weight_version(&self, version: &str) -> Result<(), StoreError> {
        self.jobs.weight_version(version).await
    }

    async fn weight_version(&self) -> Result<Option<String>, StoreError> {
        let mut c = self.readers.take().await?;
        let out = rows::state(&mut c.conn, super::group_commit::WEIGHT_VERSION).await;
        c.done(out)
    }

    async fn register_version(&self, label: &str) -> Result<u64, StoreError> {
        self.jobs.register_version(label).await
    }

    async fn versions(&self) -> Result<Vec<VersionRecord>, StoreError> {
        let mut c = self.readers.take().await?;
        let out = versions::all(&mut c.conn).await;
        c.done(out)
    }

    async fn begin_run(&self, ack: Ack) -> Result<u64, StoreError> {
        self.jobs.begin_run(ack).await
    }

    fn shared(&self) -> bool {
        true
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
        let mut c = self.readers.take().await?;
        let out = rows::group(&mut c.conn, group).await;
        c.done(out)
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
        let mut c = self.readers.take().await?;
        let out = rows::meta_by_id(&mut c.conn, trajectory_id).await;
        c.done(out).map(|found| found.map(|(_, m)| m))
    }

    async fn get_trajectory(&self, trajectory_id: &str) -> Result<Option<Trajectory>, StoreError> {
        let mut c = self.readers.take().await?;
        let out = rows::load(&mut c.conn, Key::Id(trajectory_id), Bodies::Read).await;
        c.done(out)
    }

    async fn latest_calls(
        &self,
        trajectory_id: &str,
        n: usize,
    ) -> Result<Vec<CallRecord>, StoreError> {
        let mut c = self.readers.take().await?;
        let out = match rows::meta_by_id(&mut c.conn, trajectory_id).await {
            Ok(Some((seq, _))) => {
                rows::calls_of(&mut c.conn, seq, trajectory_id, Some(n), Bodies::Read).await
            }
            Ok(None) => Err(StoreError::NotFound(trajectory_id.to_string())),
            Err(e) => Err(e),
        };
        c.done(out)
    }

    async fn list_trajectories(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let after = cursor_key(query.cursor.as_deref())?;
        let limit = clamp_limit(query.limit);
        let mut c = self.readers.take().await?;
        let out = rows::page(&mut c.conn, &query.filter, after, limit + 1).await;
        Ok(listing_page(c.done(out)?, limit))
    }

    async fn find_response(&self, response_id: &str) -> Result<Option<ResponseRef>, StoreError> {
        let mut c = self.readers.take().await?;
        let out = rows::find_response(&mut c.conn, response_id).await;
        c.done(out)
    }

    async fn forget_response(&self, response_id: &str) -> Result<bool, StoreError> {
        // Found first: the writer sorts the job by its trajectory (the lock
        // order, `lock_order`), and clears the id only if a call still
        // holds it.
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
        futures::executor::block_on(async {
            let mut c = self.readers.take().await?;
            let out = rows::count(&mut c.conn, filter).await;
            c.done(out)
        })
    }

    fn scan(&self, filter: &TrajectoryFilter) -> Result<TrajectoryIter, StoreError> {
        let conn = futures::executor::block_on(self.readers.open())?;
        Ok(scan::by_filter(conn, filter))
    }

    fn scan_ids(&self, ids: Vec<String>) -> Result<TrajectoryIter, StoreError> {
        let conn = futures::executor::block_on(self.readers.open())?;
        Ok(scan::by_ids(conn, ids))
    }
}

/// The blocking scans wait on the driver, which runs on the store's runtime.
impl super::scan::Reader for Conn {
    fn keys(
        &mut self,
        filter: &TrajectoryFilter,
        after: i64,
        limit: usize,
    ) -> Result<Vec<i64>, StoreError> {
        let page = futures::executor::block_on(rows::page(self, filter, after, limit))?;
        Ok(page.into_iter().map(|(seq, _)| seq).collect())
    }

    fn by_key(&mut self, key: i64) -> Result<Option<Trajectory>, StoreError> {
        futures::executor::block_on(rows::load(self, Key::Listed(key), Bodies::Skip))
    }

    fn by_id(&mut self, id: &str) -> Result<Option<Trajectory>, StoreError> {
        futures::executor::block_on(rows::load(self, Key::Id(id), Bodies::Skip))
    }
}
