//! What the durable stores share: writes are jobs queued to one writer, which
//! commits whatever is queued as one transaction and only then acknowledges
//! each job (group commit). [`Writer`] is the request side of that queue:
//! typed methods that queue a job and await its outcome. Each store runs its
//! own writer loop (a thread for SQLite, a task for PostgreSQL), and every
//! job goes through it: a request's task only awaits a channel, never runs
//! the database's I/O itself.

use tokio::sync::{mpsc, oneshot};

use crate::store::{
    Ack, Acked, CallRecord, Lease, SampleReplay, StoreError, StoredImage, TrajectoryFilter,
    TrajectoryMeta, TrajectoryMetadata,
};

/// Most jobs committed in one transaction.
pub(crate) const MAX_BATCH: usize = 1024;
/// Jobs that may wait for the writer before `append_call` awaits capacity.
pub(crate) const QUEUE: usize = 16 * 1024;

pub(crate) enum Op {
    Append(Box<CallRecord>),
    /// Images to store once each (one already stored is left alone),
    /// sorted by key; see [`crate::store::SpanStore::put_images`].
    PutImages(Vec<StoredImage>),
    Reward {
        trajectory: String,
        call: Option<u32>,
        reward: f64,
        extra: Option<serde_json::Value>,
    },
    Metadata {
        trajectory: String,
        update: TrajectoryMetadata,
    },
    Replays {
        trajectory: String,
        replays: Vec<SampleReplay>,
    },
    Lease {
        consumer: String,
        filter: TrajectoryFilter,
        limit: usize,
        lease_ms: i64,
    },
    Ack {
        consumer: String,
        cursor: String,
    },
    Finish {
        trajectory: String,
    },
    /// Clears a call's response id, which stays taken. `trajectory`: the
    /// trajectory a read found it in, the key PostgreSQL's lock order
    /// sorts the job by (a call row is locked as part of its trajectory).
    ForgetResponse {
        trajectory: String,
        response_id: String,
    },
    /// A serving gateway starts: see [`crate::store::SpanStore::begin_run`].
    BeginRun {
        queued: bool,
    },
    /// Nothing to write: proves the writer commits (readiness).
    Ping,
    WeightVersion(String),
    /// See [`crate::store::SpanStore::register_version`].
    RegisterVersion {
        label: String,
    },
}

/// What a job returns.
#[derive(Debug)]
pub(crate) enum Done {
    Appended,
    Meta(Box<TrajectoryMeta>),
    /// Trajectories marked incomplete when a run began.
    Marked(u64),
    Leased(Lease),
    Acked(Acked),
    /// Whether a response id was forgotten.
    Forgot(bool),
    /// A weight version's sequence number.
    Version(u64),
}

pub(crate) type Outcome = Result<Done, StoreError>;

pub(crate) struct Job {
    pub op: Op,
    /// Where the outcome goes; `None` when nobody waits for it (a queued
    /// append, whose client was answered before the commit).
    pub ack: Option<oneshot::Sender<Outcome>>,
}

/// The `gateway_state` key of the fleet's weight version.
pub(crate) const WEIGHT_VERSION: &str = "weight_version";

/// Sends each job of a committed (or failed) batch its outcome. Nobody waits
/// for a queued append (or its request was cancelled): a failure can then
/// only be logged.
pub(crate) fn acknowledge(batch: &mut Vec<Job>, outcomes: Vec<Outcome>) {
    for (job, outcome) in batch.drain(..).zip(outcomes) {
        let unheard = match job.ack {
            Some(ack) => ack.send(outcome).err(),
            None => Some(outcome),
        };
        if let Some(Err(e)) = unheard {
            tracing::error!(error = %e, "span store write failed with nobody waiting for it");
        }
    }
}

/// The trajectories of the batch's appends that failed with nobody waiting
/// for them (`ack = "queued"`: the client was answered before the commit).
/// The writer marks them incomplete, so an export says a call may be
/// missing, as after a crash of a queued run.
pub(crate) fn lost_appends(batch: &[Job], outcomes: &[Outcome]) -> Vec<String> {
    batch
        .iter()
        .zip(outcomes)
        .filter_map(|(job, outcome)| match (&job.op, outcome) {
            (Op::Append(call), Err(e)) if job.ack.as_ref().is_none_or(|a| a.is_closed()) => {
                tracing::error!(trajectory = %call.trajectory_id, call = call.call_index,
                    error = %e, "a queued call could not be stored; its trajectory is marked incomplete");
                Some(call.trajectory_id.clone())
            }
            _ => None,
        })
        .collect()
}

/// The request side of a store's writer queue.
pub(crate) struct Writer {
    ack: Ack,
    jobs: Option<mpsc::Sender<Job>>,
}

impl Writer {
    pub(crate) fn new(jobs: mpsc::Sender<Job>, ack: Ack) -> Self {
        Writer {
            ack,
            jobs: Some(jobs),
        }
    }

    /// Closes the queue: the writer commits what is queued, then ends.
    pub(crate) fn close(&mut self) {
        self.jobs.take();
    }

    /// Queues `op` for the writer and returns its outcome once the batch
    /// holding it has committed (or failed).
    async fn submit(&self, op: Op) -> Outcome {
        let (ack, done) = oneshot::channel();
        self.enqueue(Job { op, ack: Some(ack) }).await?;
        done.await.map_err(|_| StoreError::Closed)?
    }

    /// Hands `job` to the writer; waits only while the queue is full.
    async fn enqueue(&self, job: Job) -> Result<(), StoreError> {
        let jobs = self.jobs.as_ref().ok_or(StoreError::Closed)?;
        jobs.send(job).await.map_err(|_| StoreError::Closed)
    }

    pub(crate) async fn append(&self, call: CallRecord) -> Result<(), StoreError> {
        crate::store::validate_call(&call)?;
        // Nobody waits for a queued append: the writer logs a failure and
        // marks the trajectory incomplete.
        self.acked(Op::Append(Box::new(call))).await
    }

    /// Queues images to store, acknowledged as appends are (`[store] ack`):
    /// an append queued after them is applied after them, so it finds them.
    pub(crate) async fn put_images(&self, images: &[StoredImage]) -> Result<(), StoreError> {
        crate::store::validate_images(images)?;
        let mut images = images.to_vec();
        images.sort_by(|a, b| a.sha256.cmp(&b.sha256));
        images.dedup_by(|a, b| a.sha256 == b.sha256);
        if images.is_empty() {
            return Ok(());
        }
        self.acked(Op::PutImages(images)).await
    }

    /// Queues `op` and returns when `[store] ack` says: once committed, or
    /// (`queued`) once queued.
    async fn acked(&self, op: Op) -> Result<(), StoreError> {
        match self.ack {
            Ack::Committed => self.submit(op).await.map(|_| ()),
            Ack::Queued => self.enqueue(Job { op, ack: None }).await,
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        self.submit(Op::Ping).await.map(|_| ())
    }

    pub(crate) async fn weight_version(&self, version: &str) -> Result<(), StoreError> {
        self.submit(Op::WeightVersion(version.to_string()))
            .await
            .map(|_| ())
    }

    pub(crate) async fn register_version(&self, label: &str) -> Result<u64, StoreError> {
        let op = Op::RegisterVersion {
            label: label.to_string(),
        };
        match self.submit(op).await? {
            Done::Version(seq) => Ok(seq),
            _ => Err(StoreError::Task("writer returned no version".into())),
        }
    }

    pub(crate) async fn begin_run(&self, ack: Ack) -> Result<u64, StoreError> {
        let op = Op::BeginRun {
            queued: ack == Ack::Queued,
        };
        match self.submit(op).await? {
            Done::Marked(n) => Ok(n),
            _ => Err(StoreError::Task("writer returned no run".into())),
        }
    }

    pub(crate) async fn reward(
        &self,
        trajectory: &str,
        call: Option<u32>,
        reward: f64,
        extra: Option<serde_json::Value>,
    ) -> Result<TrajectoryMeta, StoreError> {
        let op = Op::Reward {
            trajectory: trajectory.to_string(),
            call,
            reward,
            extra,
        };
        need_meta(self.submit(op).await?)
    }

    pub(crate) async fn metadata(
        &self,
        trajectory: &str,
        update: &TrajectoryMetadata,
    ) -> Result<TrajectoryMeta, StoreError> {
        let op = Op::Metadata {
            trajectory: trajectory.to_string(),
            update: update.clone(),
        };
        need_meta(self.submit(op).await?)
    }

    pub(crate) async fn replays(
        &self,
        trajectory: &str,
        replays: Vec<SampleReplay>,
    ) -> Result<(), StoreError> {
        let op = Op::Replays {
            trajectory: trajectory.to_string(),
            replays,
        };
        self.submit(op).await.map(|_| ())
    }

    pub(crate) async fn lease(
        &self,
        consumer: &str,
        filter: &TrajectoryFilter,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Lease, StoreError> {
        let op = Op::Lease {
            consumer: consumer.to_string(),
            filter: filter.clone(),
            limit,
            lease_ms,
        };
        match self.submit(op).await? {
            Done::Leased(l) => Ok(l),
            _ => Err(StoreError::Task("writer returned no lease".into())),
        }
    }

    pub(crate) async fn ack(&self, consumer: &str, cursor: &str) -> Result<Acked, StoreError> {
        let op = Op::Ack {
            consumer: consumer.to_string(),
            cursor: cursor.to_string(),
        };
        match self.submit(op).await? {
            Done::Acked(a) => Ok(a),
            _ => Err(StoreError::Task("writer returned no ack".into())),
        }
    }

    /// Forgets `response_id`, which a read found in `trajectory`.
    pub(crate) async fn forget_response(
        &self,
        trajectory: &str,
        response_id: &str,
    ) -> Result<bool, StoreError> {
        let op = Op::ForgetResponse {
            trajectory: trajectory.to_string(),
            response_id: response_id.to_string(),
        };
        match self.submit(op).await? {
            Done::Forgot(f) => Ok(f),
            _ => Err(StoreError::Task("writer returned no forget".into())),
        }
    }

    pub(crate) async fn finish(&self, trajectory: &str) -> Result<TrajectoryMeta, StoreError> {
        let op = Op::Finish {
            trajectory: trajectory.to_string(),
        };
        need_meta(self.submit(op).await?)
    }
}

fn need_meta(outcome: Done) -> Result<TrajectoryMeta, StoreError> {
    match outcome {
        Done::Meta(m) => Ok(*m),
        _ => Err(StoreError::Task("writer returned no trajectory".into())),
    }
}
