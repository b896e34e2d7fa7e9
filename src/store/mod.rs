//! The span store: durable record of every LLM call of every trajectory.
//!
//! Owns the [`SpanStore`] trait, its implementations ([`MemoryStore`] for
//! tests and `memory://`, [`SqliteStore`] for `sqlite://PATH`, [`PgStore`]
//! for `postgres://`, shared by gateway replicas), the record
//! types, and sample reconstruction (`sample`). It must not know about HTTP,
//! templates or tokenizers: it keeps ids and JSON, and rebuilds sequences.
//!
//! # Sync or async
//!
//! The request path methods are `async`: an append is a message to the one
//! writer (`group_commit`: a thread for SQLite, a task for PostgreSQL) plus an
//! await on its acknowledgement, so a waiting request holds no thread while
//! its batch commits (a blocking API would park one blocking-pool thread per
//! in-flight call under load). SQLite reads run on `spawn_blocking` with a
//! small pool of read connections; PostgreSQL reads are async on a bounded
//! pool. The export scan
//! ([`SpanStore::scan`]) is a plain blocking iterator, because its consumers
//! (Parquet encoding, the offline `tito export`) are blocking code anyway: call
//! it from `spawn_blocking` or a plain thread.
//!
//! # Durability
//!
//! `append_call`, `set_reward` and `finish` return only after the transaction
//! holding them has committed. See [`sqlite`] for why that survives `kill -9`,
//! and [`postgres`] for the PostgreSQL commit.

mod codec;
mod group_commit;
mod memory;
pub mod postgres;
mod sample;
mod scan;
pub mod sqlite;
mod types;

use std::sync::Arc;

use async_trait::async_trait;
use axum::http::StatusCode;

pub use memory::MemoryStore;
pub use postgres::PgStore;
pub use sample::{
    build_sample, build_sample_for, find_call, full_prompt_ids, path_to, request_of, sample_leaves,
    samples, samples_for, segments, Policy, Sample, Segment, SegmentKind,
};
pub use sqlite::SqliteStore;
pub(crate) use types::Bodies;
pub use types::{
    now_ms, Acked, CallImage, CallRecord, Drift, Lease, ListQuery, Page, ReplayPosition,
    ResponseRef, SampleReplay, StoredImage, Trajectory, TrajectoryFilter, TrajectoryMeta,
    TrajectoryMetadata, TrajectoryStatus, VersionRecord, VersionReplay, VersionSpan,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("trajectory `{0}` not found")]
    NotFound(String),
    #[error("call {call} of trajectory `{trajectory}` not found")]
    CallNotFound { trajectory: String, call: u32 },
    #[error("call {call} of trajectory `{trajectory}` already exists")]
    Duplicate { trajectory: String, call: u32 },
    /// A call's `response_id` is held by another call, or was held by one
    /// and forgotten: an id names one response, once.
    #[error("response id `{0}` is already taken")]
    ResponseIdTaken(String),
    #[error("trajectory `{0}` is finished and takes no more calls")]
    Finished(String),
    #[error("trajectory `{trajectory}`: parent chain of call {call} is broken")]
    BrokenChain { trajectory: String, call: u32 },
    #[error("{0}")]
    Conflict(String),
    #[error("export cursor `{0}` is unknown to this consumer (never leased, or its lease expired and its trajectories were leased again)")]
    CursorNotFound(String),
    #[error("invalid record: {0}")]
    Invalid(String),
    #[error("bad store url `{0}`: expected sqlite://PATH, postgres://USER:PASS@HOST:PORT/DB or memory://")]
    BadUrl(String),
    #[error("store schema: {0}")]
    Schema(String),
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres: {0}")]
    Postgres(String),
    #[error("store i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("commit failed: {0}")]
    Commit(String),
    #[error("store writer is gone")]
    Closed,
    #[error("store task failed: {0}")]
    Task(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match &e {
            StoreError::NotFound(_) | StoreError::CallNotFound { .. } => {
                ApiError::not_found(e.to_string())
            }
            StoreError::Duplicate { .. }
            | StoreError::ResponseIdTaken(_)
            | StoreError::Finished(_)
            | StoreError::Conflict(_) => {
                ApiError::new(StatusCode::CONFLICT, "invalid_request_error", e.to_string())
                    .with_code("conflict")
            }
            StoreError::CursorNotFound(_) => {
                ApiError::new(StatusCode::CONFLICT, "invalid_request_error", e.to_string())
                    .with_param("cursor")
                    .with_code("cursor_expired")
            }
            StoreError::Invalid(_) => ApiError::bad_request(e.to_string()),
            _ => ApiError::internal(format!("span store: {e}")),
        }
    }
}

pub use crate::config::Ack;

/// How a store is opened beside its URL: the other `[store]` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// When [`SpanStore::append_call`] returns (`[store] ack`).
    pub ack: Ack,
    /// SQLite: the size of the write-ahead log past which a commit waits
    /// for a checkpoint that copies it whole, so that it starts over
    /// (`[store] wal_max_bytes`). Other stores ignore it.
    pub wal_max_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            ack: Ack::Committed,
            wal_max_bytes: crate::config::DEFAULT_WAL_MAX_BYTES,
        }
    }
}

impl From<&crate::config::StoreConfig> for StoreOptions {
    fn from(c: &crate::config::StoreConfig) -> Self {
        StoreOptions {
            ack: c.ack,
            wal_max_bytes: c.wal_max_bytes,
        }
    }
}

use crate::error::ApiError;

/// Iterator over whole trajectories, one at a time (constant memory in the
/// number of trajectories).
pub type TrajectoryIter = Box<dyn Iterator<Item = Result<Trajectory, StoreError>> + Send>;

pub type DynStore = Arc<dyn SpanStore>;

#[async_trait]
pub trait SpanStore: Send + Sync + 'static {
    /// Appends one call; creates the trajectory on its first call. Durable on
    /// return. Errors: [`StoreError::Duplicate`], [`StoreError::Finished`],
    /// [`StoreError::Invalid`] (logprobs length, parent not before the call or
    /// not stored).
    async fn append_call(&self, call: CallRecord) -> Result<(), StoreError>;

    /// Stores images once each, content-addressed by SHA-256 (one already
    /// stored is left as it is). Durable on return, like [`Self::append_call`]:
    /// a call appended after it finds its images.
    /// Errors: [`StoreError::Invalid`] for an image whose key is not the
    /// lowercase hex SHA-256 of its bytes.
    async fn put_images(&self, images: &[StoredImage]) -> Result<(), StoreError>;

    /// A stored image by its SHA-256 (lowercase hex).
    async fn image(&self, sha256: &str) -> Result<Option<StoredImage>, StoreError>;

    /// [`Self::image`] for a blocking caller (an export's writer thread),
    /// as [`Self::scan`] is: never call it on an async worker.
    fn image_blocking(&self, sha256: &str) -> Result<Option<StoredImage>, StoreError> {
        futures::executor::block_on(self.image(sha256))
    }

    /// Sets the trajectory reward (`call: None`) or one call's reward, and
    /// the trajectory's named reward parts when `extra` is given.
    async fn set_reward(
        &self,
        trajectory_id: &str,
        call: Option<u32>,
        reward: f64,
        extra: Option<serde_json::Value>,
    ) -> Result<TrajectoryMeta, StoreError>;

    /// Merges `update` into the trajectory's metadata, creating the
    /// trajectory (with no calls) when it does not exist yet. A group other
    /// than the one set is a [`StoreError::Conflict`].
    async fn set_metadata(
        &self,
        trajectory_id: &str,
        update: &TrajectoryMetadata,
    ) -> Result<TrajectoryMeta, StoreError>;

    /// Stores replay checks, replacing earlier ones of the same samples.
    async fn set_replays(
        &self,
        trajectory_id: &str,
        replays: Vec<SampleReplay>,
    ) -> Result<(), StoreError>;

    /// Every trajectory of a group, in creation order.
    async fn group(&self, group: &str) -> Result<Vec<TrajectoryMeta>, StoreError>;

    /// Leases up to `limit` finished trajectories matching `filter` that
    /// `consumer` has not acknowledged and that no unexpired lease of
    /// `consumer` holds, until `now + lease_ms`. Leases of one consumer never
    /// overlap, so workers sharing a consumer name read disjoint pages. With
    /// `filter.complete_groups` a page holds whole groups: the groups its
    /// first `limit` trajectories start, with all their eligible members.
    async fn lease(
        &self,
        consumer: &str,
        filter: &TrajectoryFilter,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Lease, StoreError>;

    /// Marks the trajectories of a lease consumed by `consumer`. Acking a
    /// cursor twice is not an error (`already`); a cursor whose lease expired
    /// and was leased again is [`StoreError::CursorNotFound`].
    async fn ack(&self, consumer: &str, cursor: &str) -> Result<Acked, StoreError>;

    /// Marks the trajectory finished (idempotent).
    async fn finish(&self, trajectory_id: &str) -> Result<TrajectoryMeta, StoreError>;

    async fn get_meta(&self, trajectory_id: &str) -> Result<Option<TrajectoryMeta>, StoreError>;

    /// The trajectory with all its calls.
    async fn get_trajectory(&self, trajectory_id: &str) -> Result<Option<Trajectory>, StoreError>;

    /// The `n` calls with the highest call indices, ascending. For warming a
    /// cache after a restart without loading a long history twice.
    async fn latest_calls(
        &self,
        trajectory_id: &str,
        n: usize,
    ) -> Result<Vec<CallRecord>, StoreError>;

    async fn list_trajectories(&self, query: &ListQuery) -> Result<Page, StoreError>;

    /// The call whose [`CallRecord::response_id`] is `response_id`; `None`
    /// for an id never stored or forgotten.
    async fn find_response(&self, response_id: &str) -> Result<Option<ResponseRef>, StoreError>;

    /// Forgets a response id: the call keeps everything else (ids,
    /// logprobs, bodies) and only its retrieval by id goes. `true` when an
    /// id was forgotten, `false` when no call held it (idempotent). A
    /// forgotten id stays taken: no later call may record it.
    async fn forget_response(&self, response_id: &str) -> Result<bool, StoreError>;

    /// Blocking. Number of trajectories matching `filter` (for progress bars).
    fn count(&self, filter: &TrajectoryFilter) -> Result<u64, StoreError>;

    /// Blocking, for the export. Streams matching trajectories in creation
    /// order; each one is read consistently (its meta and calls in one read
    /// transaction). Calls come without their bodies: `request` and
    /// `response` are `null`; `get_trajectory` reads them.
    fn scan(&self, filter: &TrajectoryFilter) -> Result<TrajectoryIter, StoreError>;

    /// Blocking, for the export. Streams the named trajectories in the order
    /// given, skipping ids that do not exist; calls without their bodies, as
    /// [`SpanStore::scan`].
    fn scan_ids(&self, ids: Vec<String>) -> Result<TrajectoryIter, StoreError>;

    /// Whether the store takes writes now (`GET /ready`): for SQLite, a job
    /// through the writer thread and its commit.
    async fn writable(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Records the fleet's weight version (set after a weight update that
    /// every backend took). Durable on return.
    async fn set_weight_version(&self, version: &str) -> Result<(), StoreError>;

    /// The last weight version recorded with [`SpanStore::set_weight_version`].
    async fn weight_version(&self) -> Result<Option<String>, StoreError>;

    /// The fleet sequence number of the weight version `label`: the one it
    /// was given when first registered, or else (largest so far) + 1, the
    /// first being 1. Durable on return; replicas sharing a store agree.
    async fn register_version(&self, label: &str) -> Result<u64, StoreError>;

    /// Every registered weight version, ascending by `seq`.
    async fn versions(&self) -> Result<Vec<VersionRecord>, StoreError>;

    /// Whether other processes (gateway replicas) may write this store. The
    /// hot view then checks a trajectory's stored call count before each
    /// call and reloads what another replica appended.
    fn shared(&self) -> bool {
        false
    }

    /// Called once by a serving gateway before it takes calls: records the
    /// run's [`Ack`] mode, and when the previous run used `Queued` and did not
    /// end cleanly, marks every trajectory that was still active `incomplete`.
    /// Returns how many were marked. Stores without durability have nothing
    /// to do.
    async fn begin_run(&self, _ack: Ack) -> Result<u64, StoreError> {
        Ok(0)
    }
}

/// Opens the store named by `[store] url`: `memory://` or `sqlite://PATH`
/// (parent directories are created), acknowledging committed writes. See
/// [`SqliteStore::open`] for URL options.
pub fn open(url: &str) -> Result<DynStore, StoreError> {
    open_with(url, Ack::Committed)
}

/// [`open`] with an acknowledgement mode (`[store] ack`).
pub fn open_with(url: &str, ack: Ack) -> Result<DynStore, StoreError> {
    open_with_options(
        url,
        &StoreOptions {
            ack,
            ..StoreOptions::default()
        },
    )
}

/// [`open`] with the `[store]` keys beside the URL. Blocking (a SQLite
/// store is created and migrated here): from async code, call it on
/// `spawn_blocking`.
pub fn open_with_options(url: &str, options: &StoreOptions) -> Result<DynStore, StoreError> {
    if url == "memory://" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if url.starts_with("sqlite://") {
        return Ok(Arc::new(SqliteStore::open_with_options(url, options)?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(PgStore::open_with(url, options.ack)?));
    }
    Err(StoreError::BadUrl(crate::config::redact_store_url(url)))
}

/// Checks a call before it is queued: cheap structural invariants.
pub(crate) fn validate_call(call: &CallRecord) -> Result<(), StoreError> {
    if call.trajectory_id.is_empty() {
        return Err(StoreError::Invalid("empty trajectory id".into()));
    }
    if call.logprobs.len() != call.sampled_ids.len() {
        return Err(StoreError::Invalid(format!(
            "call {}: {} logprobs for {} sampled ids",
            call.call_index,
            call.logprobs.len(),
            call.sampled_ids.len()
        )));
    }
    if call.request_of.is_some_and(|r| r >= call.call_index) {
        return Err(StoreError::Invalid(format!(
            "call {}: request_of {:?} must come before it",
            call.call_index, call.request_of
        )));
    }
    if let Some(api) = &call.api {
        if !CallRecord::APIS.contains(&api.as_str()) {
            return Err(StoreError::Invalid(format!(
                "call {}: api `{api}` is not one of {}",
                call.call_index,
                CallRecord::APIS.join(", ")
            )));
        }
    }
    if let Some(id) = &call.response_id {
        validate_response_id(id)
            .map_err(|e| StoreError::Invalid(format!("call {}: {e}", call.call_index)))?;
    }
    validate_policy(call)?;
    if let Some(p) = call.parent_call {
        if p >= call.call_index {
            return Err(StoreError::Invalid(format!(
                "call {}: parent {p} must come before it",
                call.call_index
            )));
        }
    }
    validate_versions(call)
}

/// Checks images before they are queued: each has a mime type and is keyed
/// by the lowercase hex SHA-256 of its bytes (recomputed here, so a store
/// never keeps bytes under another image's key).
pub(crate) fn validate_images(images: &[StoredImage]) -> Result<(), StoreError> {
    for image in images {
        if image.mime.is_empty() {
            return Err(StoreError::Invalid(format!(
                "image `{}`: empty mime type",
                image.sha256.escape_debug()
            )));
        }
        let actual = types::sha256_hex(&image.bytes);
        if image.sha256 != actual {
            return Err(StoreError::Invalid(format!(
                "image `{}`: its bytes hash to {actual}",
                image.sha256.escape_debug()
            )));
        }
    }
    Ok(())
}

/// The error of a call naming an image the store does not hold.
pub(crate) fn missing_image(call: &CallRecord, sha256: &str) -> StoreError {
    StoreError::Invalid(format!(
        "call {} of `{}`: image {} is not stored (put_images first)",
        call.call_index,
        call.trajectory_id,
        sha256.escape_debug()
    ))
}

/// [`CallRecord::versions`] is empty, or spans that start at 0, strictly
/// increasing, each below the number of sampled ids, none numbered 0.
fn validate_versions(call: &CallRecord) -> Result<(), StoreError> {
    let bad = |why: String| {
        Err(StoreError::Invalid(format!(
            "call {}: versions: {why}",
            call.call_index
        )))
    };
    let n = call.sampled_ids.len();
    let mut previous: Option<u32> = None;
    for span in &call.versions {
        match previous {
            None if span.start != 0 => {
                return bad(format!("the first span starts at {}, not 0", span.start))
            }
            Some(p) if span.start <= p => {
                return bad(format!(
                    "span starts must increase, and {} follows {p}",
                    span.start
                ))
            }
            _ => {}
        }
        if span.seq == Some(0) {
            return bad("sequence numbers start at 1, and a span has seq 0".into());
        }
        if span.start as usize >= n {
            return bad(format!(
                "a span starts at {} of {n} sampled ids",
                span.start
            ));
        }
        previous = Some(span.start);
    }
    Ok(())
}

/// [`CallRecord::model`] and [`CallRecord::adapter`]: each, when set, 1 to
/// [`CallRecord::MAX_POLICY_NAME`] bytes without control characters; an
/// adapter only with the model it adapts.
fn validate_policy(call: &CallRecord) -> Result<(), StoreError> {
    let fields = [("model", &call.model), ("adapter", &call.adapter)];
    for (field, value) in fields {
        let Some(name) = value else { continue };
        if name.is_empty() || name.len() > CallRecord::MAX_POLICY_NAME {
            return Err(StoreError::Invalid(format!(
                "call {}: {field} has 1 to {} bytes, not {}",
                call.call_index,
                CallRecord::MAX_POLICY_NAME,
                name.len()
            )));
        }
        if name.chars().any(char::is_control) {
            return Err(StoreError::Invalid(format!(
                "call {}: {field} `{}` has a control character",
                call.call_index,
                name.escape_debug()
            )));
        }
    }
    if call.adapter.is_some() && call.model.is_none() {
        return Err(StoreError::Invalid(format!(
            "call {}: adapter set without model",
            call.call_index
        )));
    }
    Ok(())
}

/// A response id is 1 to [`CallRecord::MAX_RESPONSE_ID`] characters of
/// `[A-Za-z0-9_-]`.
fn validate_response_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > CallRecord::MAX_RESPONSE_ID {
        return Err(format!(
            "a response id has 1 to {} characters, not {}",
            CallRecord::MAX_RESPONSE_ID,
            id.chars().count()
        ));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "response id `{}` has characters other than A-Z, a-z, 0-9, `_` and `-`",
            id.escape_debug()
        ));
    }
    Ok(())
}

/// A fresh export cursor: 128 random bits, hex.
pub(crate) fn new_cursor() -> String {
    format!("{:032x}", rand::random::<u128>())
}
