//! In-memory [`SpanStore`] for unit tests and `memory://`. Same semantics as
//! the SQLite store (validation, errors, ordering, cursors), nothing durable.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::types::{clamp_limit, now_ms, parse_cursor};
use super::{
    validate_call, CallRecord, ListQuery, Page, SpanStore, StoreError, Trajectory,
    TrajectoryFilter, TrajectoryIter, TrajectoryMeta, TrajectoryStatus,
};

#[derive(Default)]
struct Inner {
    /// Creation-order key -> trajectory (calls sorted by index).
    by_seq: BTreeMap<u64, Trajectory>,
    seq_of: HashMap<String, u64>,
    next_seq: u64,
}

#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (each update
        // is applied in one step), so recover from poisoning.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn matches(meta: &TrajectoryMeta, filter: &TrajectoryFilter) -> bool {
    filter.status.is_none_or(|s| meta.status == s)
        && filter.since.is_none_or(|t| meta.updated_at >= t)
}

impl Inner {
    fn get_mut(&mut self, id: &str) -> Result<&mut Trajectory, StoreError> {
        let seq = *self
            .seq_of
            .get(id)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        self.by_seq
            .get_mut(&seq)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    fn get(&self, id: &str) -> Option<&Trajectory> {
        self.seq_of.get(id).and_then(|s| self.by_seq.get(s))
    }
}

#[async_trait]
impl SpanStore for MemoryStore {
    async fn append_call(&self, mut call: CallRecord) -> Result<(), StoreError> {
        validate_call(&call)?;
        // As SQLite stores a missing logprob as NaN and reads NaN back as
        // `None`: a NaN logprob is no logprob.
        for x in &mut call.logprobs {
            if x.is_some_and(f32::is_nan) {
                *x = None;
            }
        }
        let now = now_ms();
        let mut inner = self.lock();
        let seq = match inner.seq_of.get(&call.trajectory_id) {
            Some(s) => *s,
            None => {
                if call.parent_call.is_some() {
                    return Err(missing_parent(&call));
                }
                inner.next_seq += 1;
                let seq = inner.next_seq;
                inner.seq_of.insert(call.trajectory_id.clone(), seq);
                inner.by_seq.insert(
                    seq,
                    Trajectory {
                        meta: TrajectoryMeta {
                            id: call.trajectory_id.clone(),
                            status: TrajectoryStatus::Active,
                            created_at: now,
                            updated_at: now,
                            reward: None,
                            num_calls: 0,
                            next_call_index: 0,
                            next_sample_index: 0,
                            incomplete: false,
                        },
                        calls: Vec::new(),
                    },
                );
                seq
            }
        };
        let traj = inner
            .by_seq
            .get_mut(&seq)
            .ok_or_else(|| StoreError::NotFound(call.trajectory_id.clone()))?;
        if traj.meta.status == TrajectoryStatus::Finished {
            return Err(StoreError::Finished(call.trajectory_id.clone()));
        }
        if let Some(p) = call.parent_call {
            if traj.call(p).is_none() {
                return Err(missing_parent(&call));
            }
        }
        let pos = match traj
            .calls
            .binary_search_by_key(&call.call_index, |c| c.call_index)
        {
            Ok(_) => {
                return Err(StoreError::Duplicate {
                    trajectory: call.trajectory_id.clone(),
                    call: call.call_index,
                })
            }
            Err(pos) => pos,
        };
        let m = &mut traj.meta;
        m.updated_at = m.updated_at.max(now);
        m.num_calls += 1;
        m.next_call_index = m.next_call_index.max(call.call_index + 1);
        m.next_sample_index = m.next_sample_index.max(call.sample_index + 1);
        traj.calls.insert(pos, call);
        Ok(())
    }

    async fn set_reward(
        &self,
        trajectory_id: &str,
        call: Option<u32>,
        reward: f64,
    ) -> Result<TrajectoryMeta, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let traj = inner.get_mut(trajectory_id)?;
        match call {
            None => traj.meta.reward = Some(reward),
            Some(idx) => {
                let pos = traj
                    .calls
                    .binary_search_by_key(&idx, |c| c.call_index)
                    .map_err(|_| StoreError::CallNotFound {
                        trajectory: trajectory_id.to_string(),
                        call: idx,
                    })?;
                if let Some(c) = traj.calls.get_mut(pos) {
                    c.reward = Some(reward);
                }
            }
        }
        traj.meta.updated_at = traj.meta.updated_at.max(now);
        Ok(traj.meta.clone())
    }

    async fn finish(&self, trajectory_id: &str) -> Result<TrajectoryMeta, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let traj = inner.get_mut(trajectory_id)?;
        if traj.meta.status != TrajectoryStatus::Finished {
            traj.meta.status = TrajectoryStatus::Finished;
            traj.meta.updated_at = traj.meta.updated_at.max(now);
        }
        Ok(traj.meta.clone())
    }

    async fn get_meta(&self, trajectory_id: &str) -> Result<Option<TrajectoryMeta>, StoreError> {
        Ok(self.lock().get(trajectory_id).map(|t| t.meta.clone()))
    }

    async fn get_trajectory(&self, trajectory_id: &str) -> Result<Option<Trajectory>, StoreError> {
        Ok(self.lock().get(trajectory_id).cloned())
    }

    async fn latest_calls(
        &self,
        trajectory_id: &str,
        n: usize,
    ) -> Result<Vec<CallRecord>, StoreError> {
        let inner = self.lock();
        let traj = inner
            .get(trajectory_id)
            .ok_or_else(|| StoreError::NotFound(trajectory_id.to_string()))?;
        let start = traj.calls.len().saturating_sub(n);
        Ok(traj
            .calls
            .get(start..)
            .map(<[_]>::to_vec)
            .unwrap_or_default())
    }

    async fn list_trajectories(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let after = parse_cursor(query.cursor.as_deref())?;
        let limit = clamp_limit(query.limit);
        let inner = self.lock();
        let mut items = Vec::new();
        let mut last_seq = None;
        let mut more = false;
        for (seq, t) in inner.by_seq.range(after + 1..) {
            if !matches(&t.meta, &query.filter) {
                continue;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(t.meta.clone());
            last_seq = Some(*seq);
        }
        Ok(Page {
            items,
            next_cursor: if more {
                last_seq.map(|s| s.to_string())
            } else {
                None
            },
        })
    }

    fn count(&self, filter: &TrajectoryFilter) -> Result<u64, StoreError> {
        let inner = self.lock();
        Ok(inner
            .by_seq
            .values()
            .filter(|t| matches(&t.meta, filter))
            .count() as u64)
    }

    fn scan(&self, filter: &TrajectoryFilter) -> Result<TrajectoryIter, StoreError> {
        let store = self.clone();
        let filter = filter.clone();
        let mut after = 0u64;
        Ok(Box::new(std::iter::from_fn(move || {
            let inner = store.lock();
            let (seq, t) = inner
                .by_seq
                .range(after + 1..)
                .find(|(_, t)| matches(&t.meta, &filter))?;
            after = *seq;
            Some(Ok(t.clone()))
        })))
    }
}

fn missing_parent(call: &CallRecord) -> StoreError {
    StoreError::Invalid(format!(
        "call {} of `{}`: parent {:?} is not stored",
        call.call_index, call.trajectory_id, call.parent_call
    ))
}
