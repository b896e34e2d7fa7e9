//! The one order in which every writer's transaction takes its locks, so
//! that replicas writing the same trajectories never deadlock each other.
//!
//! A batch's transaction waits on another replica's in three places, all
//! keyed by one trajectory: creating a trajectory row another transaction
//! has just created (`ON CONFLICT` waits for it to end), locking a
//! trajectory row another holds (`FOR NO KEY UPDATE`, or an `UPDATE`), and
//! the call and message rows, which are only written under that row lock.
//! A consumer's lease or acknowledgement first takes its consumer's advisory
//! lock. Applied in arrival order, two replicas whose batches hold the same
//! trajectories in different orders each locked one and waited for the
//! other's: PostgreSQL broke the cycle after `deadlock_timeout` (1 s by
//! default) by failing one of them, and the writer ran the batch again,
//! into the same cycle (`tests/store_postgres.rs`'s race of two replicas
//! failed on it once in `scripts/test.sh`; without the sort, the tests
//! beside this module count 23 reruns in 20 rounds of six trajectories).
//!
//! So the writer applies a batch sorted by [`key`]: the jobs that take no
//! lock of this kind, then images (all of the batch's in one insert, in
//! key order), then the weight versions' numbering (one advisory
//! lock), then consumers by name, then trajectories by id
//! (bytewise), each trajectory's own jobs in their arrival order (the sort
//! is stable). Every transaction then creates or locks each trajectory as
//! one step, in that one order (the bulk path too: `bulk::LOCK_MANY`), so a
//! transaction only ever waits for one that holds a key below every key it
//! is still to take itself: no cycle can form. (The marks lock comes first,
//! in `BEGIN`, and the listing lock last, in the commit; neither is waited
//! for while holding a lock a waiter needs.)
//!
//! What the order costs: the trajectories one commit creates are created,
//! and so listed and exported, in id order rather than in the order their
//! first calls arrived. Those calls were in flight together (none was
//! acknowledged before the batch committed), so no client saw an order
//! between them.

use crate::store::group_commit::{Job, Op};

/// What a job locks, in the order jobs take their locks.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Key<'a> {
    /// No consumer or trajectory lock: a run's start, a ping, the weight
    /// version (`gateway_state`'s own row).
    Other,
    /// Image rows, inserted in key order (another replica's uncommitted
    /// insert of the same key is waited for): a batch's images go in as one
    /// insert (`images::put`), so each transaction takes them in one order.
    Images,
    /// The advisory lock under which weight versions are numbered
    /// (`versions::VERSIONS_LOCK`).
    Versions,
    /// A consumer's advisory lock (a lease, an acknowledgement).
    Consumer(&'a str),
    /// A trajectory's row, created or locked.
    Trajectory(&'a str),
}

pub(super) fn key(op: &Op) -> Key<'_> {
    match op {
        Op::Append(call) => Key::Trajectory(&call.trajectory_id),
        Op::Reward { trajectory, .. }
        | Op::Metadata { trajectory, .. }
        | Op::Replays { trajectory, .. }
        | Op::Finish { trajectory }
        | Op::ForgetResponse { trajectory, .. } => Key::Trajectory(trajectory),
        Op::Lease { consumer, .. } | Op::Ack { consumer, .. } => Key::Consumer(consumer),
        Op::BeginRun { .. } | Op::Ping | Op::WeightVersion(_) => Key::Other,
        Op::PutImages(_) => Key::Images,
        Op::RegisterVersion { .. } => Key::Versions,
    }
}

/// Sorts `batch` into lock order (stable: a trajectory's jobs keep their
/// order). Outcomes are then produced, and acknowledged, in this order.
pub(super) fn sort(batch: &mut [Job]) {
    batch.sort_by(|a, b| key(&a.op).cmp(&key(&b.op)));
}

#[cfg(test)]
#[path = "lock_order_tests.rs"]
mod tests;
