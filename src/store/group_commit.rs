//! What the durable stores share: writes are jobs queued to one writer, which
//! commits whatever is queued as one transaction and only then acknowledges
//! each job (group commit). [`Writer`] is the request side of that queue:
//! typed methods that queue a job and await its outcome. Each store runs its
//! own writer loop (a thread for SQLite, a task for PostgreSQL). A store may
//! also let a submitter commit its own job on its own thread while the writer
//! is idle ([`Direct`]).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::store::{
    Ack, Acked, CallRecord, Lease, SampleReplay, StoreError, TrajectoryFilter, TrajectoryMeta,
    TrajectoryMetadata,
};

/// Most jobs committed in one transaction.
pub(crate) const MAX_BATCH: usize = 1024;
/// Jobs that may wait for the writer before `append_call` awaits capacity.
pub(crate) const QUEUE: usize = 16 * 1024;

pub(crate) enum Op {
    Append(Box<CallRecord>),
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
    /// A serving gateway starts: see [`crate::store::SpanStore::begin_run`].
    BeginRun {
        queued: bool,
    },
    /// Nothing to write: proves the writer commits (readiness).
    Ping,
    WeightVersion(String),
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

/// A writer whose commit is short blocking work (SQLite on the page cache:
/// tens of µs) can take a job on the submitter's thread while nothing else is
/// queued or committing and the writer is calm (see [`Pending`]). A lone
/// call then skips the hand-off to the writer and back: two thread
/// wake-ups, about 50 µs of a call's latency and CPU on the 2-core bench
/// machine (docs/benchmarks-history-mid.md, "A lone call commits on its own
/// thread"). With concurrent callers jobs queue as
/// before and share the writer's transactions.
pub(crate) trait Direct: Send + Sync {
    /// Commits `job` (a batch of one) on this thread and sends its outcome;
    /// called only with the writer claimed through [`Pending::claim`], and
    /// releases that claim with [`Pending::done`] once the connection is
    /// free again.
    fn commit_here(self: Arc<Self>, job: Job);

    /// The count that says whether the writer is idle; the writer loop
    /// counts its batches down on it.
    fn pending(&self) -> &Pending;
}

/// Submissions in a row that must find the writer idle, after one found it
/// busy, before a job may commit directly again.
const CALM_SUBMISSIONS: u32 = 16;

/// Jobs handed to the writer and not yet committed, a direct commit in
/// progress included (zero: the writer is idle and its connection free), and
/// how far the writer is from calm. A submission that finds the writer busy
/// is a sign of concurrent callers; then jobs queue even when the writer is
/// briefly idle, until [`CALM_SUBMISSIONS`] in a row find it idle. With
/// concurrent callers a direct commit takes a runtime thread from the other
/// requests and splits the writer's batches (measured in the same section).
#[derive(Debug, Default)]
pub(crate) struct Pending {
    jobs: AtomicUsize,
    unrest: AtomicU32,
}

impl Pending {
    /// Claims the idle writer for one direct commit: false when anything is
    /// queued or committing (the job must then queue behind it, in order) or
    /// the writer is not calm.
    fn claim(&self) -> bool {
        if self.jobs.load(Ordering::Acquire) != 0 {
            self.unrest.store(CALM_SUBMISSIONS, Ordering::Release);
            return false;
        }
        let calming = self
            .unrest
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_sub(1))
            .is_ok();
        if calming {
            return false;
        }
        let claimed = self
            .jobs
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !claimed {
            self.unrest.store(CALM_SUBMISSIONS, Ordering::Release);
        }
        claimed
    }

    fn add(&self) {
        self.jobs.fetch_add(1, Ordering::AcqRel);
    }

    /// `n` jobs are committed, failed or given up, and the connection is
    /// free.
    pub(crate) fn done(&self, n: usize) {
        self.jobs.fetch_sub(n, Ordering::AcqRel);
    }

    /// Nothing queued or committing.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> bool {
        self.jobs.load(Ordering::Acquire) == 0
    }
}

/// Counts a job as pending until it is in the writer's queue or given up
/// (a cancelled send must not leave the writer looking busy for good).
struct Queuing<'a> {
    pending: Option<&'a Pending>,
}

impl Drop for Queuing<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.pending {
            p.done(1);
        }
    }
}

/// The request side of a store's writer queue.
pub(crate) struct Writer {
    ack: Ack,
    jobs: Option<mpsc::Sender<Job>>,
    direct: Option<Arc<dyn Direct>>,
}

impl Writer {
    pub(crate) fn new(jobs: mpsc::Sender<Job>, ack: Ack) -> Self {
        Writer {
            ack,
            jobs: Some(jobs),
            direct: None,
        }
    }

    /// A writer whose jobs may also be committed by `direct` while its
    /// [`Direct::pending`] says the writer is idle and calm.
    pub(crate) fn with_direct(jobs: mpsc::Sender<Job>, ack: Ack, direct: Arc<dyn Direct>) -> Self {
        Writer {
            ack,
            jobs: Some(jobs),
            direct: Some(direct),
        }
    }

    /// Closes the queue: the writer commits what is queued, then ends.
    pub(crate) fn close(&mut self) {
        self.jobs.take();
    }

    /// Commits `op` and returns its outcome: directly when the writer is
    /// idle and the store allows it, else through the queue.
    async fn submit(&self, op: Op) -> Outcome {
        let done = match &self.direct {
            // A run begins once; the writer loop must see it to record its
            // clean end.
            Some(direct)
                if !matches!(op, Op::BeginRun { .. })
                    && self.jobs.is_some()
                    && direct.pending().claim() =>
            {
                let (ack, done) = oneshot::channel();
                direct.clone().commit_here(Job { op, ack: Some(ack) });
                done
            }
            _ => self.queue(op).await?,
        };
        done.await.map_err(|_| StoreError::Closed)?
    }

    /// Queues a job for the writer; the receiver gets its outcome.
    async fn queue(&self, op: Op) -> Result<oneshot::Receiver<Outcome>, StoreError> {
        let (ack, done) = oneshot::channel();
        self.enqueue(Job { op, ack: Some(ack) }).await?;
        Ok(done)
    }

    /// Hands `job` to the writer.
    async fn enqueue(&self, job: Job) -> Result<(), StoreError> {
        let jobs = self.jobs.as_ref().ok_or(StoreError::Closed)?;
        let pending = self.direct.as_deref().map(|d| d.pending());
        if let Some(p) = pending {
            p.add();
        }
        let mut queuing = Queuing { pending };
        jobs.send(job).await.map_err(|_| StoreError::Closed)?;
        // In the queue: the writer loop counts it down once committed.
        queuing.pending = None;
        Ok(())
    }

    pub(crate) async fn append(&self, call: CallRecord) -> Result<(), StoreError> {
        crate::store::validate_call(&call)?;
        let op = Op::Append(Box::new(call));
        match self.ack {
            Ack::Committed => self.submit(op).await.map(|_| ()),
            // Nobody waits: the writer logs a failure and marks the
            // trajectory incomplete.
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

#[cfg(test)]
mod tests {
    use super::{Pending, CALM_SUBMISSIONS};

    /// A direct commit needs the writer idle and calm: a submission that
    /// finds it busy sends the following ones to the queue until
    /// `CALM_SUBMISSIONS` in a row find it idle.
    #[test]
    fn the_writer_is_claimed_only_idle_and_calm() {
        let p = Pending::default();
        assert!(p.claim());
        p.done(1);
        assert!(p.claim(), "idle again after a lone direct commit");
        assert!(!p.claim(), "claimed twice");
        p.done(1);
        for _ in 0..CALM_SUBMISSIONS {
            assert!(!p.claim(), "claimed before the writer is calm");
        }
        assert!(p.claim(), "idle and calm");
        p.done(1);
        p.add(); // a queued job: the writer is busy
        assert!(!p.claim(), "claimed while a job is queued");
        p.done(1);
        assert!(!p.claim(), "claimed right after finding the writer busy");
    }
}
